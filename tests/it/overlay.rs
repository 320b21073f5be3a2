//! `seed: overlay`: the built binary against real overlay mounts, each test in a
//! private mount namespace. The disk directory is the lower layer (through the
//! side bind), the upper layer is on a tmpfs at `STATE/stage/NAME`; a write-back
//! merges the upper layer into the disk directory (docs/overlay.md).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{App, Sandbox};

fn overlay_spec(sb: &Sandbox, cache: &Path, extra: &str) -> PathBuf {
    sb.one_mount_spec(
        "cache",
        cache,
        "64MiB",
        &format!("    seed: overlay\n    persist: on-stop\n{extra}"),
    )
}

/// Every entry below `dir` by relative path: a file's contents, a symlink's
/// target, `fifo`, and directories (with a trailing slash).
fn tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(format!("{rel}/"), String::new());
                walk(root, &p, out);
            } else if ft.is_symlink() {
                out.insert(rel, format!("-> {}", fs::read_link(&p).unwrap().display()));
            } else if ft.is_fifo() {
                out.insert(rel, "fifo".into());
            } else {
                out.insert(rel, fs::read_to_string(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The mounts of tmpfsctl-NAME sources left in the sandbox (the state
/// directory's own private binds are not counted).
fn ours_left(sb: &Sandbox) -> Vec<tmpfsctl::host::mountinfo::MountEntry> {
    sb.mounts()
        .into_iter()
        .filter(|e| e.source.starts_with("tmpfsctl-"))
        .collect()
}

fn xattr(p: &Path, name: &std::ffi::CStr) -> Option<Vec<u8>> {
    let mut buf = [0u8; 64];
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid path and name, and a buffer of its length.
    let n = unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

fn opaque(dir: &Path) -> bool {
    xattr(dir, c"trusted.overlay.opaque").as_deref() == Some(b"y".as_slice())
}

/// The questions of the merge about the application on disk, answered by `f` for
/// deletions; it moved no directory.
struct Asks<F>(F);

impl<F: FnMut(&Path, &std::ffi::OsStr) -> bool> tmpfsctl::copy::overlay::AppOnDisk for Asks<F> {
    fn deleted(&mut self, dir: &Path, name: &std::ffi::OsStr) -> bool {
        (self.0)(dir, name)
    }
    fn moved_here(&mut self, _: std::os::fd::BorrowedFd<'_>) -> bool {
        false
    }
}

fn asks<F: FnMut(&Path, &std::ffi::OsStr) -> bool + Send>(f: F) -> Asks<F> {
    Asks(f)
}

/// apply copies nothing and mounts the overlay; sync and down write back every
/// change (new, rewritten, deleted, renamed, a replaced directory, a new
/// directory) and bring back nothing deleted; afterwards nothing of tmpfsctl's
/// is mounted.
#[test]
fn apply_sync_down_write_back_every_change() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o750);
    fs::create_dir(cache.join("d")).unwrap();
    for i in 0..20 {
        fs::write(cache.join(format!("d/f{i}")), format!("seeded {i}")).unwrap();
    }
    fs::create_dir(cache.join("replaced")).unwrap();
    fs::write(cache.join("replaced/old"), "old").unwrap();
    let spec = overlay_spec(&sb, &cache, "");

    let plan = sb.run(["plan", "--format", "json", spec.to_str().unwrap()]);
    plan.code(0);
    let actions: Vec<String> = plan.json()["plan"]["mounts"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["action"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(actions, ["bind-side", "mount-stage", "mount-overlay"], "{plan}");

    sb.run(["apply", spec.to_str().unwrap()])
        .code(0)
        .stdout_has("changed: yes");
    let top = sb.top(&cache).expect("a mount at the path");
    assert_eq!(
        (top.fstype.as_str(), top.source.as_str()),
        ("overlay", "tmpfsctl-cache")
    );
    assert!(top.has_mount_option("nosuid") && top.has_mount_option("nodev"));
    let stage = sb.state.join("stage/cache");
    let upper = stage.join("upper");
    assert_eq!(sb.top(&stage).map(|e| e.fstype), Some("tmpfs".to_string()));
    assert_eq!(fs::read_dir(&upper).unwrap().count(), 0, "nothing copied");
    assert_eq!(crate::common::mode_of(&cache), 0o750, "the disk directory's root");
    let st = sb.run(["status", "--format", "json", spec.to_str().unwrap()]);
    st.code(0);
    assert_eq!(st.json()["mounts"][0]["state"], "offloaded", "{st}");
    assert_eq!(
        st.json()["mounts"][0]["overlay"]["upper"],
        upper.to_str().unwrap(),
        "{st}"
    );
    sb.run(["apply", spec.to_str().unwrap()])
        .code(0)
        .stdout_has("changed: no");

    fs::write(cache.join("d/f0"), "rewritten").unwrap();
    fs::remove_file(cache.join("d/f1")).unwrap();
    fs::rename(cache.join("d/f2"), cache.join("d/f2-renamed")).unwrap();
    fs::remove_dir_all(cache.join("replaced")).unwrap();
    fs::create_dir(cache.join("replaced")).unwrap();
    fs::write(cache.join("replaced/new"), "new").unwrap();
    fs::create_dir_all(cache.join("fresh/sub")).unwrap();
    fs::write(cache.join("fresh/sub/a"), "a").unwrap();
    fs::write(cache.join("fresh/sub/b"), "b").unwrap();
    fs::hard_link(cache.join("fresh/sub/b"), cache.join("d/b-link")).unwrap();
    std::os::unix::fs::symlink("../d/f0", cache.join("fresh/to-f0")).unwrap();
    nix::unistd::mkfifo(
        &cache.join("fresh/fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o640),
    )
    .unwrap();
    // redirect_dir=off: a directory the disk has cannot be renamed, only copied.
    let renamed = fs::rename(cache.join("d"), cache.join("d-renamed"));
    assert_eq!(renamed.unwrap_err().raw_os_error(), Some(libc::EXDEV));
    let c = std::ffi::CString::new(cache.join("fresh/sub/b").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid path, name and value.
    let set = unsafe { libc::setxattr(c.as_ptr(), c"user.origin".as_ptr(), b"ram".as_ptr().cast(), 3, 0) };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
    let want = tree(&cache);

    let sync = sb.run(["sync", "--format", "json", spec.to_str().unwrap()]);
    sync.code(0);
    assert_eq!(sync.json()[0]["result"], "synced", "{sync}");
    let lower = sb.state.join("lower/cache");
    assert_eq!(tree(&lower), want, "the disk directory after sync");
    assert!(
        fs::symlink_metadata(upper.join("d/f1"))
            .unwrap()
            .file_type()
            .is_char_device(),
        "the whiteout stays in the upper layer"
    );
    assert!(
        opaque(&upper.join("fresh")),
        "a directory made in RAM is marked opaque before its copy reaches the disk"
    );
    assert!(
        !opaque(&lower.join("fresh")),
        "overlayfs' own attributes stay in RAM"
    );
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
    assert_eq!(
        ino(&lower.join("fresh/sub/b")),
        ino(&lower.join("d/b-link")),
        "hard links stay linked"
    );
    assert_eq!(
        fs::read_link(lower.join("fresh/to-f0")).unwrap(),
        Path::new("../d/f0")
    );
    assert!(fs::symlink_metadata(lower.join("fresh/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(
        xattr(&lower.join("fresh/sub/b"), c"user.origin").as_deref(),
        Some(b"ram".as_slice()),
        "extended attributes are written back"
    );

    // A deletion in a directory that only RAM had when it was made: the overlay
    // leaves no whiteout there; the write-back still deletes it on disk.
    fs::remove_file(cache.join("fresh/sub/a")).unwrap();
    fs::write(cache.join("late"), "late").unwrap();
    let want = tree(&cache);
    let down = sb.run(["down", "--format", "json", spec.to_str().unwrap()]);
    down.code(0);
    assert_eq!(down.json()[0]["result"], "unmounted", "{down}");
    assert_eq!(ours_left(&sb), [], "nothing of tmpfsctl's is mounted");
    assert_eq!(tree(&cache), want, "the disk directory after down");
    assert!(!cache.join("fresh/sub/a").exists());
    assert_eq!(fs::read_to_string(cache.join("d/f0")).unwrap(), "rewritten");
}

/// An overlay unmounted by hand leaves its upper layer's writes only in RAM:
/// `apply` refuses to replace it, `sync` (or `down`) writes them back and
/// releases it, and a disk change made after the upper layer's last one is kept.
#[test]
fn an_upper_layer_left_without_its_overlay_is_written_back_by_sync_or_down() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    fs::write(cache.join("kept"), "seeded").unwrap();
    fs::write(cache.join("gone"), "seeded").unwrap();
    let spec = overlay_spec(&sb, &cache, "");
    sb.run(["apply", spec.to_str().unwrap()]).code(0);
    fs::write(cache.join("new"), "ram").unwrap();
    fs::write(cache.join("later-on-disk"), "ram, earlier").unwrap();
    fs::remove_file(cache.join("gone")).unwrap();
    nix::mount::umount(&cache).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    fs::write(cache.join("later-on-disk"), "disk, later").unwrap();

    let r = sb.run(["apply", spec.to_str().unwrap()]);
    r.code(3)
        .stdout_has("run `tmpfsctl sync cache` to write them back");
    assert_eq!(sb.top(&cache), None, "nothing mounted over the disk directory");
    sb.run(["sync", spec.to_str().unwrap()]).code(0);
    assert_eq!(fs::read_to_string(cache.join("new")).unwrap(), "ram");
    assert_eq!(
        fs::read_to_string(cache.join("later-on-disk")).unwrap(),
        "disk, later"
    );
    assert!(!cache.join("gone").exists());
    assert_eq!(fs::read_to_string(cache.join("kept")).unwrap(), "seeded");
    assert_eq!(ours_left(&sb), [], "released");
    // `down` rescues it the same way.
    sb.run(["apply", spec.to_str().unwrap()]).code(0);
    assert_eq!(sb.top(&cache).map(|e| e.fstype), Some("overlay".to_string()));
    fs::write(cache.join("before-down"), "ram").unwrap();
    nix::mount::umount(&cache).unwrap();
    sb.run(["down", spec.to_str().unwrap()]).code(0);
    assert_eq!(fs::read_to_string(cache.join("before-down")).unwrap(), "ram");
    assert_eq!(ours_left(&sb), [], "released");
}

/// An application writing, rewriting, deleting and renaming all along, through
/// apply, two syncs and down: nothing it wrote is lost and nothing it deleted
/// comes back, across the switch back to the disk directory.
#[test]
fn a_busy_application_loses_nothing() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    let seeded: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("s-{i}"), format!("seeded {i}").into_bytes()))
        .collect();
    for (n, c) in &seeded {
        fs::write(cache.join(n), c).unwrap();
    }
    let spec = overlay_spec(&sb, &cache, "");
    let app = App::start(cache.clone(), seeded, 15);
    std::thread::sleep(Duration::from_millis(50));
    for cmd in ["apply", "sync", "sync", "down"] {
        app.event(cmd);
        sb.run([cmd, spec.to_str().unwrap()]).code(0);
        std::thread::sleep(Duration::from_millis(150));
    }
    let exp = app.stop();
    assert!(exp.ops > 300, "the application did only {} operations", exp.ops);
    exp.assert_nothing_lost(&cache, "seed: overlay");
}

/// `apply` killed after each of its steps is finished by the next `apply`:
/// one overlay at the path over the disk directory, one tmpfs at the staging
/// point, nothing stacked.
#[test]
fn a_killed_apply_is_finished_by_the_next() {
    for point in ["after-bind-side", "after-mount-stage", "after-mount-overlay"] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fs::write(cache.join("seeded"), "seeded").unwrap();
        let spec = overlay_spec(&sb, &cache, "");
        let mut c = sb.cmd();
        c.env("TMPFSCTL_FAILPOINT", format!("{point}:cache"));
        let killed = sb.run_with(c, ["apply", spec.to_str().unwrap()]);
        assert_eq!(killed.signal, Some(9), "{point}: {killed}");
        sb.run(["apply", spec.to_str().unwrap()]).code(0);
        sb.run(["apply", spec.to_str().unwrap()])
            .code(0)
            .stdout_has("changed: no");
        let ours: Vec<(String, PathBuf)> = ours_left(&sb)
            .into_iter()
            .map(|e| (e.fstype, e.mount_point))
            .collect();
        assert_eq!(
            ours,
            [
                ("tmpfs".to_string(), sb.state.join("stage/cache")),
                ("overlay".to_string(), cache.clone())
            ],
            "{point}"
        );
        assert_eq!(
            fs::read_to_string(cache.join("seeded")).unwrap(),
            "seeded",
            "{point}"
        );
    }
}

/// `down` killed at each point of its takedown (after the overlay is held,
/// after the switch, after the held overlay is released) is finished by the
/// next `down`, with the application writing on disk in between: nothing
/// lost, nothing back, nothing of tmpfsctl's left mounted.
#[test]
fn a_killed_down_is_finished_by_the_next() {
    for point in ["after-hold", "after-switch", "after-release"] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fs::write(cache.join("seeded"), "seeded").unwrap();
        let spec = overlay_spec(&sb, &cache, "");
        sb.run(["apply", spec.to_str().unwrap()]).code(0);
        fs::write(cache.join("ram"), "ram").unwrap();
        fs::remove_file(cache.join("seeded")).unwrap();
        let mut c = sb.cmd();
        c.env("TMPFSCTL_FAILPOINT", format!("{point}:cache"));
        let killed = sb.run_with(c, ["down", spec.to_str().unwrap()]);
        assert_eq!(killed.signal, Some(9), "{point}: {killed}");
        if point != "after-hold" {
            assert_ne!(
                sb.top(&cache).map(|e| e.fstype),
                Some("overlay".to_string()),
                "{point}: switched"
            );
            fs::write(cache.join("disk"), "written on disk after the switch").unwrap();
        }
        let again = sb.run(["down", spec.to_str().unwrap()]);
        again.code(0);
        assert_eq!(fs::read_to_string(cache.join("ram")).unwrap(), "ram", "{point}");
        assert!(!cache.join("seeded").exists(), "{point}: a deletion came back");
        if point != "after-hold" {
            assert!(cache.join("disk").exists(), "{point}: {again}");
        }
        assert_eq!(ours_left(&sb), [], "{point}: left mounted");
    }
}

/// `down`'s pass after the switch stops after it wrote a file back (the disk is
/// full, or it is killed), and a process that kept that file open in the overlay
/// appends to it before the retry: the retry writes the append back, and writes
/// the big file too once there is room. Before, the retry took its own earlier copy
/// (changed after the switch) for the application's later change, and the append
/// was lost (a hunting helper's probe, 5 of 5).
#[test]
fn a_retry_after_the_switch_writes_back_what_changed_since_the_first_attempt() {
    use std::io::Write;
    for how in ["disk full", "killed"] {
        let sb = Sandbox::new();
        let disk = sb.path("disk");
        fs::create_dir(&disk).unwrap();
        let _small = crate::common_copy::mount_tmpfs(&disk, "size=8m");
        let cache = sb.cache_dir("disk/cache", 0, 0, 0o755);
        let spec = overlay_spec(&sb, &cache, "");
        sb.run(["apply", spec.to_str().unwrap()]).code(0);
        let mut kept = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(cache.join("a_f"))
            .unwrap();
        kept.write_all(b"one\n").unwrap();
        let filler = disk.join("filler");
        let (code, log) = crate::no_write_lost::run_stopped(
            &sb,
            "down",
            &spec,
            (
                "stop=after-switch,overlay-placed",
                &["after-switch", "overlay-placed"],
            ),
            |i| {
                if i == 0 {
                    // Through the file kept open, after the first pass.
                    kept.write_all(b"two\n").unwrap();
                    if how == "disk full" {
                        let big = sb.state.join("held/cache/z_big");
                        fs::write(big, vec![7u8; 6 << 20]).unwrap();
                        let free = nix::sys::statvfs::statvfs(&disk).unwrap();
                        let avail = free.blocks_available() * free.fragment_size();
                        fs::write(&filler, vec![0u8; (avail - (1 << 20)) as usize]).unwrap();
                    }
                }
            },
            how == "killed",
        );
        if how == "disk full" {
            assert_eq!(code, 1, "{how}: the write-back waits for room: {log}");
            fs::remove_file(&filler).unwrap();
        }
        assert_eq!(
            fs::read_to_string(cache.join("a_f")).unwrap(),
            "one\ntwo\n",
            "{how}: {log}"
        );
        kept.write_all(b"three\n").unwrap();
        let again = sb.run(["down", spec.to_str().unwrap()]);
        again.code(0);
        drop(kept);
        assert_eq!(
            fs::read_to_string(cache.join("a_f")).unwrap(),
            "one\ntwo\nthree\n",
            "{how}: the append while the write-back waited: {again}"
        );
        if how == "disk full" {
            assert_eq!(fs::read(cache.join("z_big")).unwrap().len(), 6 << 20, "{how}");
        }
        assert_eq!(ours_left(&sb), [], "{how}: left mounted");
    }
}

/// A directory the application made in RAM, and one it had written back, moved
/// through the overlay after `down`'s first pass began: moving a directory changes
/// no ctime below it, so the pass after the switch compares the whole tree of a
/// directory changed since, and the files arrive at their new names (they were
/// on no name: the first pass had written none of them, or under the old name
/// the whiteout removes).
#[test]
fn a_directory_moved_while_down_writes_back_keeps_its_files() {
    for synced in [false, true] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        let spec = overlay_spec(&sb, &cache, "");
        sb.run(["apply", spec.to_str().unwrap()]).code(0);
        fs::create_dir_all(cache.join("a/deep")).unwrap();
        fs::write(cache.join("a/f"), "precious").unwrap();
        fs::write(cache.join("a/deep/g"), "deep").unwrap();
        if synced {
            sb.run(["sync", spec.to_str().unwrap()]).code(0);
        }
        let (code, log) = crate::no_write_lost::stopped_at(
            &sb,
            "down",
            &spec,
            "stop=after-hold:cache",
            &["after-hold"],
            |_| {
                // Still on the overlay, held, its first pass done.
                fs::rename(cache.join("a"), cache.join("z")).unwrap();
            },
        );
        assert_eq!(code, 0, "synced first: {synced}: {log}");
        let want: BTreeMap<String, String> = [
            ("z/".into(), String::new()),
            ("z/deep/".into(), String::new()),
            ("z/deep/g".into(), "deep".into()),
            ("z/f".into(), "precious".into()),
        ]
        .into();
        assert_eq!(tree(&cache), want, "synced first: {synced}");
    }
}

/// A directory the first pass of `down` wrote (the application changed a file in
/// it before and during that pass) that the application deletes, or moves, on its
/// disk directory after the switch: the pass after the switch makes neither it nor
/// anything in it again, whatever the directory's own ctime.
#[test]
fn a_directory_deleted_on_disk_after_the_switch_stays_deleted() {
    for moved in [false, true] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fs::create_dir_all(cache.join("d/e")).unwrap();
        fs::write(cache.join("d/e/f"), "disk").unwrap();
        let spec = overlay_spec(&sb, &cache, "");
        sb.run(["apply", spec.to_str().unwrap()]).code(0);
        fs::write(cache.join("d/e/f"), "ram1").unwrap();
        let (code, log) = crate::no_write_lost::stopped_at(
            &sb,
            "down",
            &spec,
            "stop=after-hold,after-switch:cache",
            &["after-hold", "after-switch"],
            |i| {
                if i == 0 {
                    fs::write(cache.join("d/e/f"), "ram2").unwrap();
                } else if moved {
                    fs::rename(cache.join("d"), cache.join("moved")).unwrap();
                } else {
                    fs::remove_dir_all(cache.join("d")).unwrap();
                }
            },
        );
        assert_eq!(code, 0, "moved: {moved}: {log}");
        let names: Vec<_> = tree(&cache).into_keys().collect();
        let want: &[&str] = if moved {
            &["moved/", "moved/e/", "moved/e/f"]
        } else {
            &[]
        };
        assert_eq!(names, want, "moved: {moved}");
    }
}

/// `down` killed once the held overlay is released (its write-back done), after
/// the application wrote a file in RAM during the first pass and deleted it on
/// disk after the switch: the next `down` or `sync` finds the tmpfs with the upper
/// layer, writes nothing more (it was all merged, and no watch follows the disk
/// any more), and the deleted file stays deleted.
#[test]
fn a_down_killed_after_its_write_back_brings_nothing_back() {
    for retry in ["down", "sync"] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        let spec = overlay_spec(&sb, &cache, "");
        sb.run(["apply", spec.to_str().unwrap()]).code(0);
        fs::write(cache.join("kept"), "kept").unwrap();
        let points = ["after-hold", "after-release"];
        crate::no_write_lost::killed_at_last(&sb, "down", &spec, &points, |i| {
            if i == 0 {
                fs::write(cache.join("late"), "late").unwrap();
            } else {
                assert_eq!(fs::read_to_string(cache.join("late")).unwrap(), "late");
            }
        });
        fs::remove_file(cache.join("late")).unwrap();
        sb.run([retry, spec.to_str().unwrap()]).code(0);
        assert!(!cache.join("late").exists(), "{retry}: a deletion came back");
        assert_eq!(fs::read_to_string(cache.join("kept")).unwrap(), "kept", "{retry}");
        assert_eq!(ours_left(&sb), [], "{retry}: left mounted");
    }
}

/// What seed: overlay does not do yet is refused before anything is touched,
/// each with its reason; so is fstab, which cannot express it.
#[test]
fn what_an_overlay_cannot_do_is_refused() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    let refused = |spec: &str, why: &str| {
        let p = sb.write_spec("bad.yaml", spec);
        let r = sb.run(["validate", p.to_str().unwrap()]);
        assert_eq!(r.code, Some(2), "{r}");
        r.stderr_has(why);
    };
    let mount = |extra: &str| {
        format!(
            "version: 1\nmounts:\n  - name: cache\n    path: {}\n    size: 64MiB\n    seed: overlay\n{extra}",
            cache.display()
        )
    };
    refused(&mount(""), "with persist: none `down` would drop them all");
    refused(
        &mount(
            "    persist: on-stop\n    watchdog: { high: 90%, action: [grow, evict], max_size: 128MiB }\n",
        ),
        "`grow` acts on a tmpfs at the path",
    );
    refused(
        &mount("    persist: on-stop\n    watchdog: { high: 90%, action: evict, pressure: [fallback] }\n"),
        "the memory-pressure guard leaves seed: overlay mounts alone",
    );
    let p = sb.write_spec(
        "good.yaml",
        &mount("    persist: on-stop\n    watchdog: { high: 90%, low: 20%, action: evict }\n"),
    );
    sb.run(["validate", p.to_str().unwrap()]).code(0);
    assert!(sb.mounts().is_empty(), "validation touches nothing");

    let root = sb.path("root");
    crate::common::root_only_users(&root);
    fs::create_dir_all(root.join("var/cache/app")).unwrap();
    let spec = overlay_spec(&sb, Path::new("/var/cache/app"), "");
    let install = |mode: &str| {
        sb.run([
            "boot",
            "install",
            spec.to_str().unwrap(),
            "--mode",
            mode,
            "--root",
            root.to_str().unwrap(),
        ])
    };
    let r = install("fstab");
    assert_ne!(r.code, Some(0), "{r}");
    r.stderr_has("`cache` is a seed: overlay mount, which fstab cannot express");
    assert!(!root.join("etc/fstab").exists(), "nothing written");
    install("systemd").code(0).stdout_has("changed: yes");
}

/// A sandbox whose cache directory (`var/cache/app`, root's 0755, made as
/// `setup` says) is offloaded as `seed: overlay` mount `c`, persisted on stop:
/// the sandbox, the cache directory and the spec.
fn overlay_applied(setup: impl FnOnce(&Path)) -> (Sandbox, PathBuf, PathBuf) {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    setup(&cache);
    let spec = sb.one_mount_spec("c", &cache, "16MiB", "    seed: overlay\n    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    (sb, cache, spec)
}

/// A scratch directory under /tmp holding new directories of these names (an upper
/// layer, a disk directory, ...), and their paths.
fn scratch<const N: usize>(names: [&str; N]) -> (tempfile::TempDir, [PathBuf; N]) {
    let at = tempfile::tempdir_in("/tmp").unwrap();
    let dirs = names.map(|n| at.path().join(n));
    for d in &dirs {
        fs::create_dir(d).unwrap();
    }
    (at, dirs)
}

/// The merge of an upper layer with no record of earlier attempts' placings.
fn merge_upper(
    upper: &Path,
    disk: &Path,
    merged: Option<&Path>,
    window: tmpfsctl::copy::overlay::Window,
    app: &mut (dyn tmpfsctl::copy::overlay::AppOnDisk + Send),
) -> anyhow::Result<tmpfsctl::copy::overlay::OverlayStats> {
    let mut none = tmpfsctl::copy::Placings::none();
    tmpfsctl::copy::overlay::merge_upper(upper, disk, merged, window, app, &mut none)
}

/// The window of `down`'s second pass: the whole upper layer, and the disk
/// directory the application's since `switched`.
fn after_switch(switched: (i64, i64)) -> tmpfsctl::copy::overlay::Window {
    tmpfsctl::copy::overlay::Window {
        upper_since: None,
        disk_since: Some(switched),
    }
}

/// A whiteout in the upper layer, as overlayfs makes one.
fn whiteout(p: &Path) {
    nix::sys::stat::mknod(
        p,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::empty(),
        0,
    )
    .unwrap();
}

/// The application on its disk directory after `down`'s switch, when the merge
/// asks whether it deleted `hook` (a name the disk lacks): it moves the disk
/// directory `dir` to `moved` and plants a symlink to `outside` at its name.
fn symlink_in_place_on<'a>(
    hook: &'a str,
    dir: PathBuf,
    moved: PathBuf,
    outside: &'a Path,
) -> impl FnMut(&Path, &std::ffi::OsStr) -> bool + Send + 'a {
    move |_, name| {
        if name == hook && !moved.exists() {
            fs::rename(&dir, &moved).unwrap();
            std::os::unix::fs::symlink(outside, &dir).unwrap();
        }
        false
    }
}

/// A file with names in two upper directories, `a/f` first, and `b/0_hook`, which
/// the merge asks about before it writes `b/g`.
fn hard_linked_across(upper: &Path) {
    for d in ["a", "b"] {
        fs::create_dir(upper.join(d)).unwrap();
    }
    fs::write(upper.join("a/f"), "data").unwrap();
    fs::hard_link(upper.join("a/f"), upper.join("b/g")).unwrap();
    fs::write(upper.join("b/0_hook"), "hook").unwrap();
}

/// A directory the first attempt after the switch made on disk, which the
/// application then moves (to another name in an opaque directory, or over a file
/// the upper layer changed), is the application's to the retry, with the file the
/// attempt wrote in it. A first version of the record of placings took it for the
/// attempt's own wherever it was, and the retry removed it with its file (a review
/// helper's probes, 3 of 3 and 4 of 4).
#[test]
fn a_directory_the_first_attempt_made_and_the_application_moved_stays_whole() {
    for how in ["renamed", "over a file"] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        let spec = overlay_spec(&sb, &cache, "");
        sb.run(["apply", spec.to_str().unwrap()]).code(0);
        fs::create_dir(cache.join("P")).unwrap();
        fs::write(cache.join("P/p"), "p").unwrap();
        fs::write(cache.join("z_N"), "old").unwrap();
        crate::no_write_lost::run_stopped(
            &sb,
            "down",
            &spec,
            (
                "stop=after-hold,overlay-placed",
                &["after-hold", "overlay-placed"],
            ),
            |i| {
                if i == 0 {
                    // After the first pass: only the pass after the switch writes these.
                    fs::create_dir(cache.join("P/D")).unwrap();
                    fs::write(cache.join("P/D/f"), "precious").unwrap();
                    fs::write(cache.join("z_N"), "new in RAM").unwrap();
                }
            },
            true,
        );
        assert_eq!(
            fs::read_to_string(cache.join("P/D/f")).unwrap(),
            "precious",
            "{how}"
        );
        let moved = match how {
            "renamed" => cache.join("P/E"),
            _ => {
                fs::remove_file(cache.join("z_N")).ok();
                cache.join("z_N")
            }
        };
        fs::rename(cache.join("P/D"), &moved).unwrap();
        let again = sb.run(["down", spec.to_str().unwrap()]);
        again.code(0);
        assert_eq!(
            fs::read_to_string(moved.join("f")).ok().as_deref(),
            Some("precious"),
            "{how}: {again}\n{:?}",
            tree(&cache)
        );
        assert_eq!(ours_left(&sb), [], "{how}: left mounted");
    }
}

/// A retry of the merge after the switch knows what its earlier attempt put on
/// disk (a file, a directory it made) from what the application changed there
/// since: when the upper layer deleted them in between (a process working in it
/// through a directory it kept open), the retry removes its own copies, but keeps
/// the file the application rewrote on disk. Without the record both copies
/// stayed, their ctimes being after the switch.
#[test]
fn a_retry_removes_its_own_earlier_copies_that_the_upper_layer_deleted_since() {
    let (_at, [upper, disk, run]) = scratch(["upper", "disk", "run"]);
    fs::create_dir(upper.join("d")).unwrap();
    for (name, body) in [("d/g", "g"), ("f", "f"), ("h", "h")] {
        fs::write(upper.join(name), body).unwrap();
    }
    std::thread::sleep(Duration::from_millis(10));
    let switched = tmpfsctl::copy::baseline::now_after_tick();
    let record = run.join("cache.placed");
    let mut first = tmpfsctl::copy::Placings::open(&record, switched).unwrap();
    tmpfsctl::copy::overlay::merge_upper(
        &upper,
        &disk,
        None,
        after_switch(switched),
        &mut asks(|_, _| false),
        &mut first,
    )
    .unwrap();
    assert_eq!(fs::read_to_string(disk.join("d/g")).unwrap(), "g");
    drop(first);
    fs::remove_dir_all(upper.join("d")).unwrap();
    for name in ["d", "f", "h"] {
        let _ = fs::remove_file(upper.join(name));
        whiteout(&upper.join(name));
    }
    std::thread::sleep(Duration::from_millis(10));
    fs::write(disk.join("h"), "the application's").unwrap();
    let mut retry = tmpfsctl::copy::Placings::open(&record, switched).unwrap();
    tmpfsctl::copy::overlay::merge_upper(
        &upper,
        &disk,
        None,
        after_switch(switched),
        &mut asks(|_, _| false),
        &mut retry,
    )
    .unwrap();
    assert!(
        !disk.join("f").exists(),
        "the earlier copy of a deleted file stayed"
    );
    assert!(
        !disk.join("d").exists(),
        "the directory the earlier attempt made stayed"
    );
    assert_eq!(fs::read_to_string(disk.join("h")).unwrap(), "the application's");
}

/// The merge removes what the upper layer deleted after its copies. The application,
/// on its disk directory after `down`'s switch, acts during the walk on what is still
/// to be removed: it moves the directory holding a whited-out file away and plants a
/// symlink to a directory outside the tree at its name, and it replaces a whited-out
/// directory by a new one of its own. Nothing outside the tree is removed or changed,
/// and the application's directory stays.
#[test]
fn the_merge_removes_what_the_upper_layer_deleted_only_where_the_walk_saw_it() {
    use std::os::unix::fs::PermissionsExt;
    let (_at, [upper, disk, outside]) = scratch(["upper", "disk", "outside"]);
    for d in ["a_gone", "m_sub"] {
        fs::create_dir(disk.join(d)).unwrap();
    }
    fs::write(disk.join("a_gone/old"), "old").unwrap();
    fs::write(disk.join("m_sub/x"), "x").unwrap();
    fs::write(outside.join("x"), "not the tree's").unwrap();
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o755)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let switched = tmpfsctl::copy::baseline::now_after_tick();
    whiteout(&upper.join("a_gone"));
    fs::create_dir(upper.join("m_sub")).unwrap();
    fs::set_permissions(upper.join("m_sub"), fs::Permissions::from_mode(0o700)).unwrap();
    whiteout(&upper.join("m_sub/x"));
    // Walked after both: the merge asks whether the application deleted it.
    fs::write(upper.join("z_new"), "new").unwrap();
    let window = after_switch(switched);
    let mut acted = false;
    let mut act = |_: &Path, name: &std::ffi::OsStr| {
        if name == "z_new" && !acted {
            acted = true;
            fs::rename(disk.join("m_sub"), disk.join("m_sub.moved")).unwrap();
            std::os::unix::fs::symlink(&outside, disk.join("m_sub")).unwrap();
            fs::remove_dir_all(disk.join("a_gone")).unwrap();
            fs::create_dir(disk.join("a_gone")).unwrap();
        }
        false
    };
    let stats = merge_upper(&upper, &disk, None, window, &mut asks(&mut act)).unwrap();
    assert!(acted, "the walk did not ask about z_new");
    assert_eq!(fs::read_to_string(outside.join("x")).unwrap(), "not the tree's");
    assert_eq!(
        fs::metadata(&outside).unwrap().permissions().mode() & 0o777,
        0o755,
        "the upper directory's mode went to a directory outside the tree"
    );
    assert!(
        disk.join("a_gone").is_dir(),
        "the application's new directory was removed: {stats:?}"
    );
    assert_eq!(fs::read_to_string(disk.join("m_sub.moved/x")).unwrap(), "x");
    assert_eq!(fs::read_to_string(disk.join("z_new")).unwrap(), "new");
}

/// The upper layer deleted one large file and wrote another as large, on a disk with
/// room for one of them beside the other: the merge runs out of space, removes what
/// the upper layer deleted, and merges again.
#[test]
fn the_merge_out_of_space_frees_what_the_upper_layer_deleted_and_goes_on() {
    let (_at, [upper, disk]) = scratch(["upper", "disk"]);
    crate::common::in_private_mount_ns(|| {
        let _small = crate::common_copy::mount_tmpfs(&disk, "size=1m");
        fs::write(disk.join("a_old"), vec![1u8; 700 << 10]).unwrap();
        whiteout(&upper.join("a_old"));
        fs::write(upper.join("b_new"), vec![2u8; 700 << 10]).unwrap();
        let stats = merge_upper(&upper, &disk, None, Default::default(), &mut asks(|_, _| false))
            .expect("the merge after freeing space");
        assert!(!disk.join("a_old").exists());
        assert_eq!(fs::read(disk.join("b_new")).unwrap(), vec![2u8; 700 << 10]);
        assert!(stats.removed >= 1, "{stats:?}");
        let names: Vec<_> = fs::read_dir(&disk)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["b_new"], "a temporary was left");
    });
}

/// A directory the application deleted through the overlay (a whiteout) that it then
/// changed on disk after `down`'s switch (the stale view): what it changed there
/// stays, the rest of what it deleted goes, whatever the directory's own ctime says.
#[test]
fn the_merge_removes_a_deleted_directory_but_what_the_application_changed_in_it_since() {
    for variant in ["untouched", "one removed", "one added"] {
        let (_at, [upper, disk]) = scratch(["upper", "disk"]);
        fs::create_dir_all(disk.join("x/sub")).unwrap();
        for f in ["x/old1", "x/old2", "x/sub/old3"] {
            fs::write(disk.join(f), f).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        let switched = tmpfsctl::copy::baseline::now_after_tick();
        whiteout(&upper.join("x"));
        match variant {
            "one removed" => fs::remove_file(disk.join("x/old1")).unwrap(),
            "one added" => fs::write(disk.join("x/new"), "the application's").unwrap(),
            _ => {}
        }
        let window = after_switch(switched);
        merge_upper(&upper, &disk, None, window, &mut asks(|_, _| false)).unwrap();
        let want: BTreeMap<String, String> = match variant {
            "one added" => [
                ("x/".into(), String::new()),
                ("x/new".into(), "the application's".into()),
            ]
            .into(),
            _ => BTreeMap::new(),
        };
        assert_eq!(tree(&disk), want, "{variant}");
    }
}

/// After `down`'s switch the application works in the disk directory while the merge
/// walks it. One that moves a directory the walk is in away and plants a symlink to
/// a directory outside the tree at its name leads the walk nowhere: the rest of that
/// directory is written into the directory moved (the one the walk holds), and the
/// outside one gets no file and keeps its mode.
#[test]
fn the_merge_goes_on_in_the_directory_it_holds_whatever_is_planted_at_its_name() {
    use std::os::unix::fs::PermissionsExt;
    let (_at, [upper, disk, outside]) = scratch(["upper", "disk", "outside"]);
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(disk.join("m")).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let switched = tmpfsctl::copy::baseline::now_after_tick();
    fs::create_dir(upper.join("m")).unwrap();
    fs::set_permissions(upper.join("m"), fs::Permissions::from_mode(0o777)).unwrap();
    // The merge asks whether the application deleted a_hook (the disk lacks it),
    // then writes it and z_payload.
    fs::write(upper.join("m/a_hook"), "hook").unwrap();
    fs::write(upper.join("m/z_payload"), "payload").unwrap();
    let window = after_switch(switched);
    let mut act = symlink_in_place_on("a_hook", disk.join("m"), disk.join("m.moved"), &outside);
    let merged = merge_upper(&upper, &disk, None, window, &mut asks(&mut act));
    assert!(disk.join("m.moved").exists(), "the walk did not ask about a_hook");
    let outside_now: Vec<_> = fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        outside_now.is_empty(),
        "the merge wrote outside the tree: {outside_now:?} ({merged:?})"
    );
    assert_eq!(
        fs::metadata(&outside).unwrap().permissions().mode() & 0o777,
        0o755,
        "the merge changed the mode of a directory outside the tree"
    );
    merged.unwrap();
    assert_eq!(fs::read_to_string(disk.join("m.moved/a_hook")).unwrap(), "hook");
    assert_eq!(
        fs::read_to_string(disk.join("m.moved/z_payload")).unwrap(),
        "payload"
    );
}

/// The later names of a hard-linked file are linked to its first copy, reached
/// from the disk root without following a symlink: the application, on its disk
/// directory after `down`'s switch, moves the first copy's directory away and
/// plants a symlink to a directory outside the tree at its name. The file
/// outside is not linked into the tree; the later name gets a copy.
#[test]
fn the_merge_links_a_later_name_only_to_the_first_copy_it_wrote() {
    use std::os::unix::fs::MetadataExt;
    let (_at, [upper, disk, outside]) = scratch(["upper", "disk", "outside"]);
    fs::write(outside.join("f"), "not the tree's").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let switched = tmpfsctl::copy::baseline::now_after_tick();
    hard_linked_across(&upper);
    let window = after_switch(switched);
    let mut act = symlink_in_place_on("0_hook", disk.join("a"), disk.join("a.moved"), &outside);
    let merged = merge_upper(&upper, &disk, None, window, &mut asks(&mut act));
    assert!(disk.join("a.moved").exists(), "the walk did not ask about 0_hook");
    merged.unwrap();
    let theirs = fs::metadata(outside.join("f")).unwrap();
    assert_eq!(
        theirs.nlink(),
        1,
        "the merge linked a file outside the tree into it"
    );
    assert_eq!(fs::read_to_string(disk.join("b/g")).unwrap(), "data");
    assert_eq!(fs::read_to_string(disk.join("a.moved/f")).unwrap(), "data");
}

/// The same, with the application swapping the first copy's name with a hard
/// link of its own to a file outside the tree, over and over (`RENAME_EXCHANGE`),
/// while the merge links the later name: the link goes to the inode written or
/// the later name gets a copy, never the file outside.
#[test]
fn the_merge_links_a_later_name_to_the_first_copy_whatever_is_swapped_in_meanwhile() {
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    for round in 0..200 {
        let (_at, [upper, disk, outside]) = scratch(["upper", "disk", "outside"]);
        fs::write(outside.join("f"), "not the tree's").unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let switched = tmpfsctl::copy::baseline::now_after_tick();
        hard_linked_across(&upper);
        let stop = Arc::new(AtomicBool::new(false));
        let mut racer = None;
        let mut act = |_: &Path, name: &std::ffi::OsStr| {
            if name == "0_hook" && racer.is_none() {
                fs::hard_link(outside.join("f"), disk.join("a/theirs")).unwrap();
                let (a, b, stop) = (disk.join("a/f"), disk.join("a/theirs"), Arc::clone(&stop));
                racer = Some(std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = nix::fcntl::renameat2(
                            nix::fcntl::AT_FDCWD,
                            &a,
                            nix::fcntl::AT_FDCWD,
                            &b,
                            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                        );
                    }
                }));
            }
            false
        };
        let merged = merge_upper(&upper, &disk, None, after_switch(switched), &mut asks(&mut act));
        stop.store(true, Ordering::Relaxed);
        racer.expect("the walk asked about 0_hook").join().unwrap();
        merged.unwrap();
        let g = fs::metadata(disk.join("b/g")).unwrap();
        assert_ne!(
            g.ino(),
            fs::metadata(outside.join("f")).unwrap().ino(),
            "round {round}: the later name is a link to the file outside the tree"
        );
        assert_eq!(fs::read_to_string(disk.join("b/g")).unwrap(), "data");
    }
}

/// A directory the merge makes on disk is root's, mode 0700, until the walk
/// leaves it: a walk that fails below it (here the disk is full) still gives it
/// the upper one's owner and mode, for the application may be on its disk
/// directory already.
#[test]
fn a_failed_merge_still_gives_the_directories_it_made_their_owner_and_mode() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (_at, [upper, disk]) = scratch(["upper", "disk"]);
    crate::common::in_private_mount_ns(|| {
        let _small = crate::common_copy::mount_tmpfs(&disk, "size=1m");
        std::thread::sleep(Duration::from_millis(20));
        let switched = tmpfsctl::copy::baseline::now_after_tick();
        fs::create_dir(upper.join("new")).unwrap();
        fs::write(upper.join("new/x"), "data").unwrap();
        fs::write(upper.join("new/y"), vec![1u8; 2 << 20]).unwrap();
        std::os::unix::fs::chown(upper.join("new"), Some(65_534), Some(65_534)).unwrap();
        fs::set_permissions(upper.join("new"), fs::Permissions::from_mode(0o755)).unwrap();
        let err = merge_upper(
            &upper,
            &disk,
            None,
            after_switch(switched),
            &mut asks(|_, _| false),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("No space left on device"), "{err:#}");
        let md = fs::metadata(disk.join("new")).unwrap();
        assert_eq!((md.uid(), md.mode() & 0o7777), (65_534, 0o755));
        assert_eq!(fs::read_to_string(disk.join("new/x")).unwrap(), "data");
    });
}

/// The application changes the upper layer through the overlay while the merge
/// reads it: it moves the directory the walk is in away and plants a symlink to a
/// directory outside the tree at its name, renames a symlink to a file outside
/// over a file the walk stated, and a FIFO over another. The walk goes on in the
/// directory it holds, opens no symlink and waits on no FIFO: nothing of the
/// directory outside is copied or marked, and the merge ends.
#[test]
fn the_merge_reads_the_upper_layer_only_where_it_holds_it() {
    let (_at, [upper, disk, outside]) = scratch(["upper", "disk", "outside"]);
    fs::write(outside.join("secret"), "not the tree's").unwrap();
    fs::create_dir(outside.join("sub")).unwrap();
    nix::unistd::mkfifo(
        &outside.join("z_fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    fs::create_dir(disk.join("a")).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let switched = tmpfsctl::copy::baseline::now_after_tick();
    fs::create_dir_all(upper.join("a/sub")).unwrap();
    for f in ["a/a_hook", "a/secret", "a/z_fifo", "b_hook", "c_hook"] {
        fs::write(upper.join(f), "the tree's").unwrap();
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let (u, d, o) = (upper.clone(), disk.clone(), outside.clone());
    std::thread::spawn(move || {
        let mut parent = symlink_in_place_on("a_hook", u.join("a"), u.join("a.moved"), &o);
        let mut act = |dir: &Path, name: &std::ffi::OsStr| {
            if name == "b_hook" {
                std::os::unix::fs::symlink(o.join("secret"), u.join("link")).unwrap();
                fs::rename(u.join("link"), u.join("b_hook")).unwrap();
            } else if name == "c_hook" {
                nix::unistd::mkfifo(&u.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o600))
                    .unwrap();
                fs::rename(u.join("fifo"), u.join("c_hook")).unwrap();
            }
            parent(dir, name)
        };
        let merged = merge_upper(&u, &d, None, after_switch(switched), &mut asks(&mut act));
        tx.send(merged.map_err(|e| format!("{e:#}"))).unwrap();
    });
    let Ok(merged) = rx.recv_timeout(Duration::from_secs(20)) else {
        // Let a merge blocked on a FIFO go, so that the test ends.
        for fifo in [outside.join("z_fifo"), upper.join("c_hook")] {
            let _ = fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(fifo);
        }
        panic!("the merge hangs on a FIFO the application put in the upper layer");
    };
    assert!(
        upper.join("a.moved").exists(),
        "the walk did not ask about a_hook"
    );
    assert_eq!(fs::read_to_string(disk.join("a/secret")).unwrap(), "the tree's");
    assert!(xattr::get(outside.join("sub"), "trusted.overlay.opaque")
        .unwrap()
        .is_none());
    merged.unwrap();
    assert_eq!(fs::read_to_string(disk.join("a/z_fifo")).unwrap(), "the tree's");
    for leaf in ["b_hook", "c_hook"] {
        assert!(
            fs::read_to_string(disk.join(leaf)).is_err(),
            "{leaf}: a symlink or FIFO renamed over the file was followed"
        );
    }
}

/// A disk directory that lost names gets the metadata of the upper directory the
/// walk held, not of whatever is at that path when the removals come: a user who
/// may rename a root-owned 0700 directory of the upper layer (its parent is
/// theirs) puts their own 0777 one at its name after the walk passed it. Root's
/// disk directory, holding root's files, stays root's and 0700.
#[test]
fn the_removals_restore_a_directory_from_the_upper_one_the_walk_held() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mode = |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
    let (_at, [upper, disk]) = scratch(["upper", "disk"]);
    fs::create_dir(disk.join("a")).unwrap();
    fs::write(disk.join("a/old"), "old").unwrap();
    fs::write(disk.join("a/key"), "root's").unwrap();
    mode(&disk.join("a"), 0o700);
    std::thread::sleep(Duration::from_millis(20));
    let switched = tmpfsctl::copy::baseline::now_after_tick();
    fs::create_dir(upper.join("a")).unwrap();
    xattr::set(upper.join("a"), "trusted.overlay.opaque", b"y").unwrap();
    fs::write(upper.join("a/key"), "root's").unwrap();
    mode(&upper.join("a"), 0o700);
    fs::write(upper.join("z_new"), "new").unwrap();
    let mut act = |_: &Path, name: &std::ffi::OsStr| {
        if name == "z_new" && !upper.join("a.x").exists() {
            fs::rename(upper.join("a"), upper.join("a.x")).unwrap();
            fs::create_dir(upper.join("a")).unwrap();
            std::os::unix::fs::chown(upper.join("a"), Some(65_534), Some(65_534)).unwrap();
            mode(&upper.join("a"), 0o777);
        }
        false
    };
    merge_upper(&upper, &disk, None, after_switch(switched), &mut asks(&mut act)).unwrap();
    assert!(upper.join("a.x").exists(), "the walk did not ask about z_new");
    assert!(!disk.join("a/old").exists());
    let md = fs::metadata(disk.join("a")).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o700));
}

/// Root's 0700 directory holding a 0644 file, which the user replaced in the
/// overlay by its own 0777 one (opaque: the file is gone from it). Until the merge
/// has removed the file from the disk directory, that directory stays root's and
/// 0700 (looked at when the merge asks about a later name); then it is the
/// user's.
#[test]
fn a_directory_the_user_made_in_place_of_roots_is_its_only_once_emptied() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (_at, [upper, disk]) = scratch(["upper", "disk"]);
    fs::create_dir(disk.join("private")).unwrap();
    fs::write(disk.join("private/key"), "root's").unwrap();
    fs::set_permissions(disk.join("private"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::create_dir(upper.join("private")).unwrap();
    xattr::set(upper.join("private"), "trusted.overlay.opaque", b"y").unwrap();
    std::os::unix::fs::chown(upper.join("private"), Some(65_534), Some(65_534)).unwrap();
    fs::set_permissions(upper.join("private"), fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(upper.join("z_later"), "later").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let switched = tmpfsctl::copy::baseline::now_after_tick();
    let owner_mode = |p: &Path| {
        let md = fs::metadata(p).unwrap();
        (md.uid(), md.mode() & 0o7777)
    };
    let seen = std::sync::Mutex::new(None);
    let mut act = |_: &Path, name: &std::ffi::OsStr| {
        if name == "z_later" {
            *seen.lock().unwrap() = Some(owner_mode(&disk.join("private")));
        }
        false
    };
    merge_upper(&upper, &disk, None, after_switch(switched), &mut asks(&mut act)).unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        Some((0, 0o700)),
        "the user's before the removals"
    );
    assert!(!disk.join("private/key").exists());
    assert_eq!(owner_mode(&disk.join("private")), (65_534, 0o777));
}

/// Root's 0700 `private` on disk holding `key` and `sub/x`, and in the upper layer
/// the user's 0777 `private/sub` in its place: `private` opaque, and `sub` too if
/// `sub_opaque`.
fn users_private_over_roots(upper: &Path, disk: &Path, sub_opaque: bool) {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
    fs::create_dir_all(disk.join("private/sub")).unwrap();
    fs::write(disk.join("private/key"), "root's").unwrap();
    fs::write(disk.join("private/sub/x"), "root's").unwrap();
    mode(&disk.join("private"), 0o700);
    fs::create_dir_all(upper.join("private/sub")).unwrap();
    let marked: &[&str] = if sub_opaque {
        &["private", "private/sub"]
    } else {
        &["private"]
    };
    for p in marked {
        xattr::set(upper.join(p), "trusted.overlay.opaque", b"y").unwrap();
    }
    for p in ["private", "private/sub"] {
        std::os::unix::fs::chown(upper.join(p), Some(65_534), Some(65_534)).unwrap();
        mode(&upper.join(p), 0o777);
    }
}

/// Root's 0700 `private` holding `key` and `sub/x` on disk; in the overlay the user
/// made its own `private/sub` in place of it (`rm -rf private; mkdir -p
/// private/sub`): `private` is opaque, `sub` unmarked, and the overlay looks in no
/// lower layer below an opaque directory. So `sub/x` is gone from the user's view
/// and goes from the disk too, before `sub` is the user's.
#[test]
fn a_directory_below_an_opaque_one_is_the_whole_directory_too() {
    use std::os::unix::fs::MetadataExt;
    let (_at, [upper, disk]) = scratch(["upper", "disk"]);
    users_private_over_roots(&upper, &disk, false);
    merge_upper(&upper, &disk, None, Default::default(), &mut asks(|_, _| false)).unwrap();
    assert_eq!(
        tree(&disk).into_keys().collect::<Vec<_>>(),
        ["private/", "private/sub/"]
    );
    let md = fs::metadata(disk.join("private/sub")).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o7777), (65_534, 0o777));
}

/// The same with both marked opaque, and `sub/x` immutable, so that its removal
/// fails: `private`'s own removals were made, but it stays root's and 0700 while
/// root's `sub/x` is still below it.
#[test]
fn a_directory_is_opened_only_once_every_removal_below_it_is_made() {
    use std::os::unix::fs::MetadataExt;
    let (_at, [upper, disk]) = scratch(["upper", "disk"]);
    users_private_over_roots(&upper, &disk, true);
    let x = disk.join("private/sub/x");
    let chattr = |f: &str| {
        let done = std::process::Command::new("chattr")
            .arg(f)
            .arg(&x)
            .status()
            .unwrap();
        assert!(done.success(), "chattr {f}");
    };
    chattr("+i");
    let merged = merge_upper(&upper, &disk, None, Default::default(), &mut asks(|_, _| false));
    chattr("-i");
    assert!(merged.is_err(), "the immutable file was removed");
    assert!(
        !disk.join("private/key").exists(),
        "private's own removals were made"
    );
    let md = fs::metadata(disk.join("private")).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o700));
}

/// Whatever the application makes at a reserved name in the overlay (here a
/// directory, of the form of the merge's barrier) is removed, and stops no
/// write-back; a name that only starts like one is the application's.
#[test]
fn a_reserved_name_in_the_overlay_stops_no_write_back() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    let spec = overlay_spec(&sb, &cache, "");
    sb.run(["apply", spec.to_str().unwrap()]).code(0);
    let prefix = tmpfsctl::copy::overlay::TEMP_PREFIX;
    let planted = cache.join(format!("{prefix}barrier.0123456789abcdef"));
    fs::create_dir_all(planted.join("sub")).unwrap();
    let theirs = format!("{prefix}barrier.x");
    fs::create_dir_all(cache.join(&theirs).join("sub")).unwrap();
    fs::write(cache.join("new"), "new").unwrap();
    sb.run(["sync", spec.to_str().unwrap()]).code(0);
    assert!(!planted.exists());
    sb.run(["down", spec.to_str().unwrap()]).code(0);
    assert_eq!(
        tree(&cache).into_keys().collect::<Vec<_>>(),
        [format!("{theirs}/"), format!("{theirs}/sub/"), "new".into()]
    );
}

/// A directory the upper layer replaced by a file, in which the application made a
/// name on disk after `down`'s switch: what it made stays (and so the directory,
/// and the file is not put in its place), what the upper layer replaced goes.
#[test]
fn the_merge_replacing_a_directory_keeps_what_the_application_made_in_it_since() {
    let (_at, [upper, disk]) = scratch(["upper", "disk"]);
    fs::create_dir_all(disk.join("t")).unwrap();
    fs::write(disk.join("t/old"), "old").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let switched = tmpfsctl::copy::baseline::now_after_tick();
    fs::write(upper.join("t"), "a file now").unwrap();
    fs::write(disk.join("t/new"), "the application's").unwrap();
    let window = after_switch(switched);
    merge_upper(&upper, &disk, None, window, &mut asks(|_, _| false)).unwrap();
    let want: BTreeMap<String, String> = [
        ("t/".into(), String::new()),
        ("t/new".into(), "the application's".into()),
    ]
    .into();
    assert_eq!(tree(&disk), want);
}

/// The deep trees' walks hold thousands of descriptors each, of the one limit of
/// the test process: one at a time.
static DEEP: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The walk holds two descriptors and one stack frame per level, and makes its
/// system calls through the descriptors: a tree 1,500 levels deep (past the usual
/// 1,024 descriptors, and a stack overflow for a thread's usual 2 MiB), then one
/// 2,500 deep (past `PATH_MAX`), is merged.
#[test]
fn the_merge_goes_as_deep_as_the_tree_goes() {
    let _alone = DEEP.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::{mkdirat, Mode};
    let (_at, [upper, disk]) = scratch(["upper", "disk"]);
    let rel: PathBuf = std::iter::repeat_n("d", 1500).collect();
    fs::create_dir_all(upper.join(&rel)).unwrap();
    fs::write(upper.join(&rel).join("f"), "deep").unwrap();
    merge_upper(&upper, &disk, None, Default::default(), &mut asks(|_, _| false)).unwrap();
    assert_eq!(fs::read_to_string(disk.join(&rel).join("f")).unwrap(), "deep");

    let mut fd = std::os::fd::OwnedFd::from(fs::File::open(upper.join(&rel)).unwrap());
    for _ in 0..1000 {
        mkdirat(&fd, "d", Mode::from_bits_truncate(0o755)).unwrap();
        fd = openat(&fd, "d", OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty()).unwrap();
    }
    let stats = merge_upper(&upper, &disk, None, Default::default(), &mut asks(|_, _| false)).unwrap();
    assert_eq!(stats.dirs, 1000, "{stats:?}");
    // Too long a path for `remove_dir_all` of the scratch directory.
    let rm = std::process::Command::new("rm")
        .arg("-rf")
        .arg(&upper)
        .arg(&disk)
        .status()
        .unwrap();
    assert!(rm.success());
}

/// A tree nested deeper than the walk goes fails the merge with an error that says
/// so: 16,384 levels, or fewer where the limit on open files allows fewer (two a
/// level, an eighth kept for the rest: 8,750 under a hard limit of 20,000), not
/// `EMFILE` somewhere down the tree.
#[test]
fn a_tree_nested_deeper_than_the_merge_goes_fails_it_with_an_error_that_says_so() {
    let _alone = DEEP.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    use nix::fcntl::{openat, OFlag};
    use nix::sys::resource::{getrlimit, Resource};
    use nix::sys::stat::{mkdirat, Mode};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let fds = hard.min(65_536) as usize;
    let deepest = 16_384.min((fds - (fds / 8).max(1024)) / 2);
    let (_at, [upper, disk]) = scratch(["upper", "disk"]);
    let mut fd = std::os::fd::OwnedFd::from(fs::File::open(&upper).unwrap());
    for _ in 0..=deepest {
        mkdirat(&fd, "d", Mode::from_bits_truncate(0o755)).unwrap();
        fd = openat(&fd, "d", OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty()).unwrap();
    }
    drop(fd);
    let merged = merge_upper(&upper, &disk, None, Default::default(), &mut asks(|_, _| false));
    // Before any check: too deep for `remove_dir_all` of the scratch directory.
    let rm = std::process::Command::new("rm")
        .arg("-rf")
        .arg(&upper)
        .arg(&disk)
        .status()
        .unwrap();
    assert!(rm.success());
    let err = format!("{:#}", merged.unwrap_err());
    let said = format!("holds directories nested more than {deepest} deep: not merged");
    assert!(err.contains(&said), "{}", &err[err.len().saturating_sub(400)..]);
}

/// Directories made through the overlay are opaque in its upper layer. After
/// `down`'s switch the application moves a directory into one (`mv Z D/Z`),
/// renames one inside one (`mv D/A D/B`), or makes one there: each stays whole.
/// Before, the merge took it for a name the opaque directory lacks and removed
/// everything in it older than the switch, which a moved directory's files are (6
/// of 6 runs, a hunting helper's probe).
#[test]
fn a_directory_the_application_moves_or_makes_on_disk_after_the_switch_stays_whole() {
    for how in ["moved in", "renamed inside", "made"] {
        let (sb, cache, spec) = overlay_applied(|_| {});
        fs::create_dir_all(cache.join("D/A")).unwrap();
        fs::write(cache.join("D/f"), "f").unwrap();
        fs::write(cache.join("D/A/a1"), "a1").unwrap();
        fs::create_dir(cache.join("Z")).unwrap();
        fs::write(cache.join("Z/z1"), "z1").unwrap();
        sb.run(["sync".as_ref(), spec.as_os_str()]).code(0);
        let (code, out) = crate::no_write_lost::stopped_at(
            &sb,
            "down",
            &spec,
            "stop=after-switch:c",
            &["after-switch"],
            |_| match how {
                "moved in" => fs::rename(cache.join("Z"), cache.join("D/Z")).unwrap(),
                "renamed inside" => fs::rename(cache.join("D/A"), cache.join("D/B")).unwrap(),
                _ => {
                    fs::create_dir(cache.join("D/N")).unwrap();
                    fs::write(cache.join("D/N/n1"), "n1").unwrap();
                }
            },
        );
        assert_eq!(code, 0, "{how}: {out}");
        let (path, file) = match how {
            "moved in" => ("D/Z/z1", "z1"),
            "renamed inside" => ("D/B/a1", "a1"),
            _ => ("D/N/n1", "n1"),
        };
        assert_eq!(
            fs::read_to_string(cache.join(path)).ok().as_deref(),
            Some(file),
            "{how}: {out}"
        );
        assert_eq!(fs::read_to_string(cache.join("D/f")).unwrap(), "f", "{how}");
    }
}

/// After `down`'s switch a root application removes a directory the upper layer
/// also has and makes its own there, closed, with a private file: it stays root's
/// and 0700, and what the application deleted with the old one stays deleted.
/// Before, the merge gave it the upper directory's owner and mode (the private file
/// became readable to others) and wrote the deleted file into it (a review
/// helper's probe, 3 of 3).
#[test]
fn a_directory_the_application_makes_again_after_the_switch_keeps_its_owner_and_mode() {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let (sb, cache, spec) = overlay_applied(|cache| {
        fs::create_dir(cache.join("D")).unwrap();
        fs::write(cache.join("D/f"), "f").unwrap();
        std::os::unix::fs::chown(cache.join("D"), Some(1000), Some(1000)).unwrap();
        fs::set_permissions(cache.join("D"), fs::Permissions::from_mode(0o755)).unwrap();
    });
    fs::write(cache.join("D/g"), "g").unwrap();
    let (code, out) = crate::no_write_lost::stopped_at(
        &sb,
        "down",
        &spec,
        "stop=after-switch:c",
        &["after-switch"],
        |_| {
            fs::remove_dir_all(cache.join("D")).unwrap();
            fs::DirBuilder::new().mode(0o700).create(cache.join("D")).unwrap();
            fs::write(cache.join("D/private"), "private").unwrap();
        },
    );
    assert_eq!(code, 0, "{out}");
    let md = fs::metadata(cache.join("D")).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o700), "{out}");
    let names: Vec<_> = fs::read_dir(cache.join("D"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["private"], "{out}");
}

/// The application writes in RAM after `down`'s first pass, and after its switch
/// moves the directory (or its parent) away on disk and back: nothing of it is
/// new, and the file reaches the disk. A first version of the rule above took any
/// directory the application moved for its own, and dropped it (a review helper's
/// probe, 3 of 3).
#[test]
fn a_directory_the_application_moves_away_and_back_after_the_switch_gets_what_the_ram_wrote() {
    for how in ["the directory", "its parent"] {
        let (sb, cache, spec) = overlay_applied(|cache| {
            fs::create_dir_all(cache.join("P/D")).unwrap();
            fs::write(cache.join("P/D/old"), "old").unwrap();
        });
        fs::write(cache.join("P/D/f1"), "f1").unwrap();
        let (code, out) = crate::no_write_lost::stopped_at(
            &sb,
            "down",
            &spec,
            "stop=after-hold,after-switch:c",
            &["after-hold", "after-switch"],
            |i| match (i, how) {
                (0, _) => fs::write(cache.join("P/D/f2"), "after the first pass").unwrap(),
                (_, "the directory") => {
                    fs::rename(cache.join("P/D"), cache.join("P/E")).unwrap();
                    fs::rename(cache.join("P/E"), cache.join("P/D")).unwrap();
                }
                _ => {
                    fs::rename(cache.join("P"), cache.join("Q")).unwrap();
                    fs::rename(cache.join("Q"), cache.join("P")).unwrap();
                }
            },
        );
        assert_eq!(code, 0, "{how}: {out}");
        assert_eq!(
            fs::read_to_string(cache.join("P/D/f2")).ok().as_deref(),
            Some("after the first pass"),
            "{how}: {out}"
        );
        assert_eq!(fs::read_to_string(cache.join("P/D/f1")).unwrap(), "f1", "{how}");
    }
}

/// After `down`'s switch the application replaces a directory together with the
/// one above it (`rm -r P; mkdir -p P/D`), or moves it (or the one above it) away
/// and makes a new one: the file the first pass put there, which it deleted or
/// moved away with its directory (and changed there since), and a directory the
/// RAM made, do not come back in the new one (review helpers' probes, 3 of 3 and
/// 4 of 4 each).
#[test]
fn a_directory_replaced_with_the_one_above_it_after_the_switch_gets_nothing_back() {
    let hows = [
        "P removed",
        "D moved away",
        "P moved away",
        "D moved away and its file changed",
    ];
    for how in hows {
        let (sb, cache, spec) = overlay_applied(|cache| {
            fs::create_dir_all(cache.join("P/D")).unwrap();
            fs::write(cache.join("P/D/old"), "old").unwrap();
        });
        fs::write(cache.join("P/D/f1"), "f1").unwrap();
        // Made in RAM: the first pass marks its upper directory opaque.
        fs::create_dir(cache.join("P/D/sub")).unwrap();
        let (code, out) = crate::no_write_lost::stopped_at(
            &sb,
            "down",
            &spec,
            "stop=after-switch:c",
            &["after-switch"],
            |_| {
                match how {
                    "P removed" => fs::remove_dir_all(cache.join("P")).unwrap(),
                    "P moved away" => fs::rename(cache.join("P"), cache.join("P.old")).unwrap(),
                    _ => fs::rename(cache.join("P/D"), cache.join("P/D.old")).unwrap(),
                }
                if how == "D moved away and its file changed" {
                    fs::OpenOptions::new()
                        .append(true)
                        .open(cache.join("P/D.old/f1"))
                        .and_then(|mut f| std::io::Write::write_all(&mut f, b" more"))
                        .unwrap();
                }
                fs::create_dir_all(cache.join("P/D")).unwrap();
            },
        );
        assert_eq!(code, 0, "{how}: {out}");
        for name in ["f1", "old", "sub"] {
            assert!(
                !cache.join("P/D").join(name).exists(),
                "{how}: {name} came back: {out}"
            );
        }
    }
}

/// The RAM writes `P/D/n` after `down`'s first pass; after the switch the
/// application moves `P/D` away, makes a new one, and writes its own `n` into the
/// one it moved (or the pass itself writes another RAM file there, through the
/// path the application moved it to): the RAM's `P/D/n`, which the application
/// never saw, is written into the new `P/D`; so is its rewrite of a file the
/// disk had. A first version of the rule that a moved directory's names are gone
/// took any name it held for one it left with (also one linked or moved there
/// since, or an older version of a file the RAM rewrote), and lost the RAM's file
/// (review helpers' probes, 4 of 4 each).
#[test]
fn a_file_the_ram_wrote_reaches_a_directory_made_again_whatever_the_moved_one_holds_now() {
    let hows = [
        "the application writes there",
        "the pass writes there",
        "the application links an older file there",
        "the application moves an older file there",
        "the RAM rewrote a file the disk had",
    ];
    for how in hows {
        let (sb, cache, spec) = overlay_applied(|cache| {
            fs::create_dir_all(cache.join("P/D")).unwrap();
            fs::create_dir_all(cache.join("P/A")).unwrap();
            fs::write(cache.join("P/D/old"), "old").unwrap();
        });
        let (code, out) = crate::no_write_lost::stopped_at(
            &sb,
            "down",
            &spec,
            "stop=after-hold,after-switch:c",
            &["after-hold", "after-switch"],
            |i| match (i, how) {
                (0, "the application writes there") => fs::write(cache.join("P/D/n"), "ram-D").unwrap(),
                (0, "the RAM rewrote a file the disk had") => {
                    fs::write(cache.join("P/D/old"), "ram-D").unwrap()
                }
                (_, "the RAM rewrote a file the disk had") => {
                    fs::rename(cache.join("P/D"), cache.join("P/D.old")).unwrap();
                    fs::create_dir(cache.join("P/D")).unwrap();
                }
                (0, _) => {
                    fs::write(cache.join("P/D/n"), "ram-D").unwrap();
                    fs::write(cache.join("P/A/n"), "ram-A").unwrap();
                }
                (_, "the application writes there") => {
                    fs::rename(cache.join("P/D"), cache.join("P/D.old")).unwrap();
                    fs::create_dir(cache.join("P/D")).unwrap();
                    fs::write(cache.join("P/D.old/n"), "the application's").unwrap();
                }
                (_, "the application links an older file there") => {
                    fs::rename(cache.join("P/D"), cache.join("P/D.old")).unwrap();
                    fs::create_dir(cache.join("P/D")).unwrap();
                    fs::hard_link(cache.join("P/D.old/old"), cache.join("P/D.old/n")).unwrap();
                }
                (_, "the application moves an older file there") => {
                    fs::rename(cache.join("P/D"), cache.join("P/D.old")).unwrap();
                    fs::create_dir(cache.join("P/D")).unwrap();
                    fs::rename(cache.join("P/D.old/old"), cache.join("P/D.old/n")).unwrap();
                }
                _ => {
                    fs::remove_dir_all(cache.join("P/A")).unwrap();
                    fs::rename(cache.join("P/D"), cache.join("P/A")).unwrap();
                    fs::create_dir(cache.join("P/D")).unwrap();
                }
            },
        );
        assert_eq!(code, 0, "{how}: {out}");
        let name = if how == "the RAM rewrote a file the disk had" {
            "P/D/old"
        } else {
            "P/D/n"
        };
        assert_eq!(
            fs::read_to_string(cache.join(name)).ok().as_deref(),
            Some("ram-D"),
            "{how}: {out}"
        );
    }
}

/// After `down`'s switch the application closes a directory on disk while the
/// write-back is inside it (it has just put a file there): its owner and mode
/// stay. A first version judged only a look taken before the walk, and applied
/// the upper directory's over them (a review helper's probe, 3 of 3).
#[test]
fn a_directory_the_application_closes_while_the_merge_is_in_it_stays_closed() {
    use std::os::unix::fs::PermissionsExt;
    let (sb, cache, spec) = overlay_applied(|cache| {
        fs::create_dir_all(cache.join("P/D")).unwrap();
    });
    let (code, out) = crate::no_write_lost::stopped_at(
        &sb,
        "down",
        &spec,
        "stop=after-hold,overlay-placed",
        &["after-hold", "overlay-placed"],
        |i| {
            if i == 0 {
                fs::write(cache.join("P/D/n"), "n").unwrap();
            } else {
                fs::set_permissions(cache.join("P/D"), fs::Permissions::from_mode(0o700)).unwrap();
                fs::write(cache.join("P/D/private"), "root's").unwrap();
            }
        },
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(crate::common::mode_of(&cache.join("P/D")), 0o700, "{out}");
    assert_eq!(fs::read_to_string(cache.join("P/D/n")).unwrap(), "n");
}

/// The application writes in a directory and closes it (`chmod 0700`) in RAM
/// between `down`'s first pass and its switch: the disk directory gets the
/// mode. A first version of the rule below took the pass's own write into it for
/// the application's change on disk, and kept the old mode (a review helper's
/// probe, 3 of 3).
#[test]
fn a_directory_closed_in_ram_before_the_switch_is_closed_on_disk() {
    use std::os::unix::fs::PermissionsExt;
    let (sb, cache, spec) = overlay_applied(|cache| {
        fs::create_dir_all(cache.join("P/D")).unwrap();
    });
    let (code, out) =
        crate::no_write_lost::stopped_at(&sb, "down", &spec, "stop=after-hold:c", &["after-hold"], |_| {
            fs::write(cache.join("P/D/new"), "new").unwrap();
            fs::set_permissions(cache.join("P/D"), fs::Permissions::from_mode(0o700)).unwrap();
        });
    assert_eq!(code, 0, "{out}");
    assert_eq!(crate::common::mode_of(&cache.join("P/D")), 0o700, "{out}");
    assert_eq!(fs::read_to_string(cache.join("P/D/new")).unwrap(), "new");
}

/// After `down`'s switch a root application closes a directory on disk that the
/// upper layer holds, unchanged since the first pass: its owner and mode stay.
#[test]
fn a_directory_the_application_closes_after_the_switch_stays_closed() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (sb, cache, spec) = overlay_applied(|cache| {
        fs::create_dir(cache.join("D")).unwrap();
        std::os::unix::fs::chown(cache.join("D"), Some(1000), Some(1000)).unwrap();
    });
    fs::write(cache.join("D/g"), "g").unwrap();
    let (code, out) = crate::no_write_lost::stopped_at(
        &sb,
        "down",
        &spec,
        "stop=after-switch:c",
        &["after-switch"],
        |_| {
            std::os::unix::fs::chown(cache.join("D"), Some(0), Some(0)).unwrap();
            fs::set_permissions(cache.join("D"), fs::Permissions::from_mode(0o700)).unwrap();
            fs::write(cache.join("D/private"), "private").unwrap();
        },
    );
    assert_eq!(code, 0, "{out}");
    let md = fs::metadata(cache.join("D")).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o700), "{out}");
    assert_eq!(fs::read_to_string(cache.join("D/g")).unwrap(), "g");
}

/// After `down`'s switch the application replaces a file by a directory (`rm N;
/// mv X N`) while a process still writes into the RAM's `N`: the directory, the
/// later change, stays whole. Before, the merge removed what it held and put the
/// RAM's file back (6 of 6 runs, a hunting helper's probe).
#[test]
fn a_directory_the_application_moves_over_a_file_after_the_switch_stays_whole() {
    let (sb, cache, spec) = overlay_applied(|cache| {
        fs::create_dir(cache.join("X")).unwrap();
        fs::write(cache.join("X/x1"), "x1").unwrap();
        fs::write(cache.join("N"), "old").unwrap();
    });
    let mut open = fs::OpenOptions::new().append(true).open(cache.join("N")).unwrap();
    let (code, out) = crate::no_write_lost::stopped_at(
        &sb,
        "down",
        &spec,
        "stop=after-switch:c",
        &["after-switch"],
        |_| {
            std::io::Write::write_all(&mut open, b"late write").unwrap();
            fs::remove_file(cache.join("N")).unwrap();
            fs::rename(cache.join("X"), cache.join("N")).unwrap();
        },
    );
    drop(open);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        fs::read_to_string(cache.join("N/x1")).ok().as_deref(),
        Some("x1"),
        "{out}"
    );
}

/// A process that keeps a file of the overlay open while it is taken down is
/// named, and the overlay is detached, not said to be unmounted: an overlay's
/// files show the device of their layer, and before, no holder was found (a hunting
/// helper's probe).
#[test]
fn down_names_a_process_holding_a_file_of_the_overlay() {
    let (sb, cache, spec) = overlay_applied(|_| {});
    fs::write(cache.join("f"), "a").unwrap();
    let open = fs::OpenOptions::new().append(true).open(cache.join("f")).unwrap();
    let down = sb.run([
        "down".as_ref(),
        spec.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    down.code(0);
    drop(open);
    let v: serde_json::Value = serde_json::from_str(&down.stdout).unwrap();
    let r = &v[0];
    assert_eq!(r["result"], "detached", "{down}");
    let me = std::process::id();
    assert!(
        r["holders"]
            .as_array()
            .is_some_and(|h| h.iter().any(|h| h["pid"] == me)),
        "{down}"
    );
}

/// A directory the write-back makes after `down`'s switch, while the
/// application is on its disk directory, has the upper directory's owner and
/// mode from the moment it has its name: made root's 0700 there, it answered
/// the application with EACCES until the walk left it, and a kill before the
/// placings record of it left it so for good.
#[test]
fn a_directory_made_after_the_switch_is_never_seen_closed() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (sb, cache, spec) = overlay_applied(|_| {});
    let held = sb.state.join("held/c");
    let mut seen = Vec::new();
    let (code, out) = crate::no_write_lost::run_stopped(
        &sb,
        "down",
        &spec,
        (
            "stop=after-switch,overlay-placed",
            &["after-switch", "overlay-placed"],
        ),
        |i| {
            if i == 0 {
                fs::create_dir(held.join("N")).unwrap();
                fs::write(held.join("N/f"), "f").unwrap();
                std::os::unix::fs::chown(held.join("N"), Some(1000), Some(1000)).unwrap();
                fs::set_permissions(held.join("N"), fs::Permissions::from_mode(0o755)).unwrap();
            } else {
                let md = fs::metadata(cache.join("N")).unwrap();
                seen.push((md.uid(), md.gid(), md.mode() & 0o7777));
            }
        },
        true,
    );
    assert_eq!(seen, [(1000, 1000, 0o755)], "{code}: {out}");
    sb.run(["down", spec.to_str().unwrap()]).code(0);
    let md = fs::metadata(cache.join("N")).unwrap();
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o7777), (1000, 1000, 0o755));
    assert_eq!(fs::read_to_string(cache.join("N/f")).unwrap(), "f");
}
