//! A second failure while a write-back runs: `kill -9` in every phase of `down` and
//! `sync`, and a full disk, with the application creating, rewriting, deleting and
//! renaming files all along. At the end, what the application completed is counted
//! against what is on disk: lost = 0, resurrected = 0.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::{App, LoopFs, Sandbox};

fn spec(sb: &Sandbox, cache: &Path) -> PathBuf {
    sb.one_mount_spec("c", cache, "64MiB", "    persist: on-stop\n")
}

/// `n` files the disk directory holds before the offload.
fn seed(dir: &Path, n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let name = format!("s-{i}");
            let content = format!("{name} seeded\n").into_bytes();
            fs::write(dir.join(&name), &content).unwrap();
            (name, content)
        })
        .collect()
}

/// The deletion keepers running with the state directory `state`.
fn keepers(state: &Path) -> Vec<u32> {
    let state = state.as_os_str().as_encoded_bytes();
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            args.contains(&&b"keep-deletions"[..]) && args.contains(&state)
        })
        .collect()
}

/// A cache directory on a small loop ext4 that also holds the state directory (its
/// `run` records go to a tmpfs of their own), for a disk that fills.
struct SmallDisk {
    disk: LoopFs,
    sb: Sandbox,
    cache: PathBuf,
    state: PathBuf,
    spec: PathBuf,
}

impl SmallDisk {
    fn new() -> SmallDisk {
        let sb = Sandbox::new();
        let disk = LoopFs::new(&sb.path("disk"), 24, "defaults");
        let cache = disk.mount_point.join("cache");
        fs::create_dir(&cache).unwrap();
        let state = disk.mount_point.join("state");
        let spec = spec(&sb, &cache);
        SmallDisk {
            disk,
            sb,
            cache,
            state,
            spec,
        }
    }

    /// `tmpfsctl CMD SPEC`.
    fn run(&self, cmd: &str) -> crate::common::Run {
        let mut c = self.sb.cmd();
        c.env("TMPFSCTL_STATE_DIR", &self.state);
        self.sb.run_with(c, [cmd.as_ref(), self.spec.as_os_str()])
    }

    /// Fills the disk but for `left` bytes; the filler's path.
    fn fill_but(&self, left: u64) -> PathBuf {
        let free = nix::sys::statvfs::statvfs(&self.disk.mount_point).unwrap();
        let avail = free.blocks_available() * free.fragment_size();
        let filler = self.disk.mount_point.join("filler");
        fs::write(&filler, vec![7u8; avail.saturating_sub(left) as usize]).unwrap();
        filler
    }
}

/// Runs tmpfsctl with `args`, SIGKILLed at the failpoint `point` or, for `None`,
/// after `after`; returns whether it was killed.
fn killed_run(sb: &Sandbox, args: &[&std::ffi::OsStr], point: Option<&str>, after: Duration) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let mut c = sb.cmd();
    c.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    if let Some(p) = point {
        c.env("TMPFSCTL_FAILPOINT", p);
    }
    let mut child = c.spawn().unwrap();
    if point.is_none() {
        std::thread::sleep(after);
        let _ = child.kill();
    }
    child.wait().unwrap().signal() == Some(9)
}

enum Cmd {
    Down,
    Sync,
    /// `down` killed, then a `sync` before the `down` that finishes.
    DownThenSync,
}

/// Offloads, lets the application work in RAM, kills `cmd` at `point` (or after
/// `after`), lets the application go on, then finishes with `down` and counts.
fn kill_then_finish(cmd: Cmd, point: Option<&str>, after: Duration, seed_no: u64) {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    let seeded = seed(&cache, 500);
    let spec = spec(&sb, &cache);
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let app = App::start(cache.clone(), seeded, seed_no);
    std::thread::sleep(Duration::from_millis(400));
    let verb = match cmd {
        Cmd::Down | Cmd::DownThenSync => "down",
        Cmd::Sync => "sync",
    };
    let what = format!("{verb} killed at {}", point.unwrap_or(&format!("{after:?}")));
    app.event(&format!("{verb} started"));
    let was_killed = killed_run(&sb, &[verb.as_ref(), spec.as_os_str()], point, after);
    app.event(&format!("{verb} killed"));
    std::thread::sleep(Duration::from_millis(200));
    if matches!(cmd, Cmd::Sync | Cmd::DownThenSync) {
        // The application goes on in RAM; the next pass merges against what the
        // killed one left.
        app.event("sync started");
        sb.run(["sync".as_ref(), spec.as_os_str()]).code(0);
        app.event("sync done");
        std::thread::sleep(Duration::from_millis(150));
    }
    app.event("down started");
    let down = sb.run(["down".as_ref(), spec.as_os_str()]);
    app.event("down done");
    std::thread::sleep(Duration::from_millis(100));
    let exp = app.stop();
    down.code(0);
    assert!(
        sb.mounts().iter().all(|e| !e.source.starts_with("tmpfsctl-")),
        "{what}: a tmpfs is left\n{down}"
    );
    if point.is_some() {
        assert!(was_killed, "{what}: the failpoint was not reached");
    }
    exp.assert_nothing_lost(&cache, &what);
}

#[test]
fn kill_9_in_every_phase_of_down() {
    for (i, point) in [
        "after-hold",
        "after-switch",
        "after-merge",
        "after-baseline",
        "after-release",
    ]
    .into_iter()
    .enumerate()
    {
        kill_then_finish(
            Cmd::Down,
            Some(&format!("{point}:c")),
            Duration::ZERO,
            i as u64 + 1,
        );
    }
}

/// A `sync` after a killed `down`: killed before its switch (`after-hold`), the
/// tmpfs is still the application's, and written back as such (the `sync` wrote it
/// back as held, dropped its baseline and side bind, and the names the application
/// deleted in RAM after that came back at the final `down`).
#[test]
fn a_sync_after_down_was_killed_in_any_phase() {
    for (i, point) in ["after-hold", "after-switch", "after-merge", "after-baseline"]
        .into_iter()
        .enumerate()
    {
        kill_then_finish(
            Cmd::DownThenSync,
            Some(&format!("{point}:c")),
            Duration::ZERO,
            400 + i as u64,
        );
    }
}

#[test]
fn kill_9_during_the_merge_of_down() {
    for (i, ms) in [5u64, 30, 80, 150].into_iter().enumerate() {
        kill_then_finish(Cmd::Down, None, Duration::from_millis(ms), 100 + i as u64);
    }
}

#[test]
fn kill_9_in_every_phase_of_sync() {
    for (i, point) in ["after-merge", "after-baseline"].into_iter().enumerate() {
        kill_then_finish(
            Cmd::Sync,
            Some(&format!("{point}:c")),
            Duration::ZERO,
            200 + i as u64,
        );
    }
    for (i, ms) in [10u64, 60, 150].into_iter().enumerate() {
        kill_then_finish(Cmd::Sync, None, Duration::from_millis(ms), 300 + i as u64);
    }
}

/// The disk directory (and the state directory) on a small filesystem that the RAM
/// copy does not fit into: `down` switches, the write-back fails with ENOSPC and the
/// RAM copy waits; once space is freed the retry (itself killed once) completes.
#[test]
fn a_full_disk_keeps_the_ram_copy_until_space_is_freed() {
    let sb = Sandbox::new();
    let disk = LoopFs::new(&sb.path("disk"), 24, "defaults");
    let cache = disk.mount_point.join("cache");
    fs::create_dir(&cache).unwrap();
    let state = disk.mount_point.join("state");
    let seeded = seed(&cache, 200);
    let spec = spec(&sb, &cache);
    let mut cmd = sb.cmd();
    cmd.env("TMPFSCTL_STATE_DIR", &state);
    sb.run_with(cmd, ["apply".as_ref(), spec.as_os_str()]).code(0);
    // Leaves about 3 MiB free on disk; the application writes more into RAM.
    let free = nix::sys::statvfs::statvfs(&disk.mount_point).unwrap();
    let avail = free.blocks_available() * free.fragment_size();
    let filler = disk.mount_point.join("filler");
    fs::write(&filler, vec![7u8; (avail.saturating_sub(3 << 20)) as usize]).unwrap();
    let app = App::start(cache.clone(), seeded, 7);
    let big: Vec<PathBuf> = (0..6).map(|i| cache.join(format!("big-{i}"))).collect();
    for b in &big {
        fs::write(b, vec![1u8; 1 << 20]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let run = |args: &[&std::ffi::OsStr]| {
        let mut c = sb.cmd();
        c.env("TMPFSCTL_STATE_DIR", &state);
        sb.run_with(c, args)
    };
    app.event("down started");
    let down = run(&["down".as_ref(), spec.as_os_str()]);
    app.event("down done");
    down.code(1).stdout_has("PENDING");
    // `status` without a spec lists every managed tmpfs, the held one too.
    run(&["status".as_ref()]).code(0).stdout_has("writeback-pending");
    // The application is on the (full) disk now; its RAM copy waits.
    std::thread::sleep(Duration::from_millis(200));
    app.event("down started");
    let again = run(&["down".as_ref(), spec.as_os_str()]);
    app.event("down done");
    again.code(1);
    fs::remove_file(&filler).unwrap();
    app.event("space freed");
    let mut c = sb.cmd();
    c.env("TMPFSCTL_STATE_DIR", &state);
    c.args(["down".as_ref(), spec.as_os_str()]);
    app.event("down started");
    let mut child = c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let _ = child.kill();
    let _ = child.wait();
    app.event("down killed");
    std::thread::sleep(Duration::from_millis(100));
    app.event("down started");
    let last = run(&["down".as_ref(), spec.as_os_str()]);
    app.event("down done");
    std::thread::sleep(Duration::from_millis(100));
    let mut exp = app.stop();
    last.code(0);
    for b in &big {
        let name = b.file_name().unwrap().to_string_lossy().into_owned();
        exp.names.insert(name, Some(vec![1u8; 1 << 20]));
    }
    exp.assert_nothing_lost(&cache, "disk full, then freed");
}

/// A `down` killed after it started its deletion keeper and before it stopped the
/// earlier one leaves two keepers running (the new one outlives its starter). The
/// next attempt stops both, and reads the record only once each has written what it
/// saw; the last attempt's success stops its own.
#[test]
fn every_earlier_deletion_keeper_is_stopped_before_its_record_is_read() {
    let d = SmallDisk::new();
    let (sb, cache, state) = (&d.sb, &d.cache, &d.state);
    seed(cache, 20);
    d.run("apply").code(0);
    let filler = d.fill_but(1 << 20);
    fs::write(cache.join("big"), vec![1u8; 4 << 20]).unwrap();
    d.run("down").code(1).stdout_has("PENDING");
    let first = keepers(state);
    assert_eq!(first.len(), 1, "the failed attempt's keeper: {first:?}");
    // The keeper of an attempt killed right after it started its keeper: the attempt
    // never stopped the first one. The next attempt runs as soon as the orphan's
    // process shows, ready or not: it must find and stop it either way (a file the
    // keeper wrote once ready missed one started a moment before).
    let mut c = sb.cmd();
    c.arg("--state-dir")
        .arg(state)
        .args(["keep-deletions", "c", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut orphan = c.spawn().unwrap();
    // Its command line shows a moment after the spawn returns: the kernel lets the
    // parent go on during the exec, before the new program's arguments are in place.
    let start = std::time::Instant::now();
    while keepers(state).len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the second keeper never showed beside the first"
        );
        std::thread::yield_now();
    }
    d.run("down").code(1).stdout_has("PENDING");
    let start = std::time::Instant::now();
    while orphan.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the orphan keeper was not stopped by the next attempt"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = keepers(state);
    assert_eq!(left.len(), 1, "keepers after the second attempt: {left:?}");
    assert!(
        !first.contains(&left[0]),
        "the first attempt's keeper was left running: {left:?}"
    );
    fs::remove_file(&filler).unwrap();
    d.run("down").code(0);
    let start = std::time::Instant::now();
    while !keepers(state).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "a keeper outlived the write-back"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fs::read(cache.join("big")).unwrap().len(), 4 << 20);
}

/// A keeper that comes up after the write-back it was started for succeeded (and
/// removed the record) ends at once and does not make the record again: the next
/// write-back would take what it recorded meanwhile for deletions of its own.
#[test]
fn a_keeper_whose_record_is_gone_ends_without_making_it_again() {
    let d = SmallDisk::new();
    seed(&d.cache, 5);
    d.run("apply").code(0);
    let mut c = d.sb.cmd();
    c.arg("--state-dir")
        .arg(&d.state)
        .args(["keep-deletions", "c", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"", "it said it was ready");
    let record = d.state.join("run/c.gone");
    assert!(!record.exists(), "{} was made again", record.display());
    assert!(keepers(&d.state).is_empty());
    d.run("down").code(0);
}

/// A state directory given relative to the working directory is the absolute path it
/// names (it was refused, its ancestors' owners checked from an empty path): the
/// deletion keeper a failed `down` leaves, which leaves the working directory, goes
/// on watching, and the next attempt finds and stops it.
#[test]
fn a_relative_state_directory_keeps_its_deletion_keeper() {
    let d = SmallDisk::new();
    seed(&d.cache, 5);
    d.run("apply").code(0);
    let filler = d.fill_but(1 << 20);
    fs::write(d.cache.join("big"), vec![1u8; 4 << 20]).unwrap();
    let relative = |cmd: &str| {
        let mut c = d.sb.cmd();
        c.env("TMPFSCTL_STATE_DIR", "state")
            .current_dir(&d.disk.mount_point);
        d.sb.run_with(c, [cmd.as_ref(), d.spec.as_os_str()])
    };
    relative("down").code(1).stdout_has("PENDING");
    // Past the keeper's first look (it polls once a second).
    std::thread::sleep(Duration::from_millis(1500));
    let first = keepers(&d.state);
    assert_eq!(first.len(), 1, "the failed attempt's keeper: {first:?}");
    fs::remove_file(&filler).unwrap();
    relative("down").code(0);
    let start = std::time::Instant::now();
    while !keepers(&d.state).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "a keeper outlived the write-back"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fs::read(d.cache.join("big")).unwrap().len(), 4 << 20);
}

/// The application removes a directory on disk between two attempts of `down` (the
/// first failed on a full disk), after emptying it there. The RAM's file in it,
/// which the disk never had, is written back by the next attempt; the file the
/// application deleted there stays deleted. Only the earlier attempt's keeper saw
/// the directory go, so its record carries the directory's own handle.
#[test]
fn a_directory_removed_between_attempts_keeps_what_the_ram_wrote_in_it() {
    let d = SmallDisk::new();
    let cache = &d.cache;
    fs::create_dir_all(cache.join("z")).unwrap();
    fs::write(cache.join("z/old"), "on disk before").unwrap();
    d.run("apply").code(0);
    fs::write(cache.join("z/new"), "written in RAM").unwrap();
    let filler = d.fill_but(1 << 20);
    // Walked before `z`: the first attempt fails before it gets there. Hard-linked,
    // so that the walk writes it itself (the workers write singly-linked files while
    // the walk goes on, and it would reach `z` before their failure stops it).
    fs::write(cache.join("big"), vec![1u8; 4 << 20]).unwrap();
    fs::hard_link(cache.join("big"), cache.join("big.link")).unwrap();
    d.run("down").code(1).stdout_has("PENDING");
    assert!(
        !cache.join("z/new").exists(),
        "the failed attempt wrote z/new back already: the test shows nothing"
    );
    // On its disk directory now, the application empties `z` and removes it.
    fs::remove_file(cache.join("z/old")).unwrap();
    fs::remove_dir(cache.join("z")).unwrap();
    fs::remove_file(&filler).unwrap();
    d.run("down").code(0);
    assert_eq!(
        fs::read_to_string(cache.join("z/new")).ok().as_deref(),
        Some("written in RAM"),
        "the RAM's file in the removed directory was lost"
    );
    assert!(
        !cache.join("z/old").exists(),
        "the file the application deleted came back"
    );
    assert_eq!(fs::read(cache.join("big")).unwrap().len(), 4 << 20);
}

/// A disk that fails writes: the cache's ext4 is on a loop device whose image lies on
/// a small tmpfs, filled up once the cache is seeded, so the data the write-back
/// sends to the device is refused (the loop device reports an I/O error), while
/// ext4's metadata, written by `mkfs`, still lands. Each written file is made
/// durable by a batch's `syncfs` or its own `fsync` before it is renamed into place,
/// so the error is seen there: `sync` fails, `down` keeps the RAM copy; once the
/// image has room again the next `down` writes everything, and the device, read
/// afresh, holds all the application wrote. A file put in place without its data
/// on the device would be read back as zeros.
#[test]
fn a_disk_that_fails_its_writes_keeps_the_ram_copy_and_loses_nothing() {
    let sb = Sandbox::new();
    let backing = sb.path("backing");
    fs::create_dir(&backing).unwrap();
    // Unmounted after the loop device over its image is gone (dropped after `disk`).
    let _backing = crate::common_copy::mount_tmpfs(&backing, "size=80m");
    let disk = LoopFs::on_image(&backing.join("disk.img"), 64, &sb.path("disk"));
    let cache = disk.mount_point.join("cache");
    fs::create_dir(&cache).unwrap();
    // The directory's blocks are allocated while the image has room: a failed write
    // of metadata would break the filesystem, which is not what is tested here.
    for i in 0..4000 {
        fs::write(cache.join(format!("room-{i:04}-{}", "x".repeat(40))), "").unwrap();
    }
    for i in 0..4000 {
        fs::remove_file(cache.join(format!("room-{i:04}-{}", "x".repeat(40)))).unwrap();
    }
    let seeded = seed(&cache, 200);
    nix::unistd::syncfs(fs::File::open(&cache).unwrap()).unwrap();
    disk.trim();
    let spec = spec(&sb, &cache);
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let filler = backing.join("filler");
    let err = std::io::copy(
        &mut std::io::Read::take(std::io::repeat(7), 1 << 30),
        &mut fs::File::create(&filler).unwrap(),
    )
    .unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOSPC),
        "filling the image's tmpfs"
    );

    let app = App::start(cache.clone(), seeded, 11);
    // Large files, and enough small ones that the workers take them in batches,
    // each made durable by one `syncfs`.
    let big: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| (format!("big-{i}"), vec![b'a' + i as u8; 1 << 20]))
        .chain((0..1000).map(|i| {
            (
                format!("small-{i}"),
                format!("small {i}\n").repeat(900).into_bytes(),
            )
        }))
        .collect();
    for (name, data) in &big {
        fs::write(cache.join(name), data).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    // What the build and other tests left dirty is written out first: with little
    // waiting, the workers make their batches durable by one `syncfs` each (a build
    // that just wrote the test binary leaves hundreds of MiB for 30 s). Not a
    // `sync` of every filesystem: it would hold up the unmounting of other tests'
    // filesystems while it runs (a zram device then stayed open after its fallback).
    for dir in [Path::new(env!("CARGO_TARGET_TMPDIR")), &sb.root] {
        nix::unistd::syncfs(fs::File::open(dir).unwrap()).unwrap();
    }
    app.event("sync started");
    let sync = sb.run(["sync".as_ref(), spec.as_os_str()]);
    app.event("sync done");
    sync.code(1)
        .stdout_has("sync FAILED")
        .stdout_has("No space left on device")
        .stdout_has("is out of space or inodes (`df -h`, `df -i`): free some there");
    std::thread::sleep(Duration::from_millis(200));
    // The application stops before the switch: its own writes to this disk would
    // fail as well.
    let mut exp = app.stop();
    sb.run(["down".as_ref(), spec.as_os_str()])
        .code(1)
        .stdout_has("PENDING");
    assert!(sb.mounts_at(&cache).is_empty(), "down switched to the disk");
    fs::remove_file(&filler).unwrap();
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    disk.remount();
    for (name, data) in big {
        exp.names.insert(name, Some(data));
    }
    exp.assert_nothing_lost(&cache, "writes failed, then the disk had room again");
}

/// The RAM deleted a file and wrote one as large, on a disk with room for only one
/// of them beside the other: the write-back, which removes what the RAM deleted
/// last, runs out of space, removes it, and starts again in the space it freed.
/// `sync` succeeds at once, as it did while names went as the walk met them.
#[test]
fn a_write_back_out_of_space_frees_what_the_ram_deleted_and_goes_on() {
    let d = SmallDisk::new();
    fs::write(d.cache.join("a_old"), vec![1u8; 8 << 20]).unwrap();
    d.run("apply").code(0);
    d.run("sync").code(0);
    fs::remove_file(d.cache.join("a_old")).unwrap();
    fs::write(d.cache.join("b_new"), vec![2u8; 8 << 20]).unwrap();
    let filler = d.fill_but(2 << 20);
    let sync = d.run("sync");
    sync.code(0)
        .stdout_has("1 deleted")
        .stdout_has("a pass that ran out of space starts again");
    d.run("down").code(0);
    fs::remove_file(filler).unwrap();
    assert!(!d.cache.join("a_old").exists(), "{sync}");
    assert_eq!(fs::read(d.cache.join("b_new")).unwrap(), vec![2u8; 8 << 20]);
}
