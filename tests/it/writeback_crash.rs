//! Crash safety of the write-back: a child process runs `sync_tree` and is SIGKILLed
//! at random moments spread over the sync's duration. After every kill each
//! destination file must hold exactly its complete old or its complete new contents
//! (never a mix, never truncated), and the next sync must converge and leave no
//! temporaries behind. Needs root (the source is a tmpfs in a private namespace).
//!
//! The child is this test binary itself, re-run with
//! `--exact writeback_crash::crash_child` and the paths in environment variables;
//! run normally, `crash_child` does nothing.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common_copy::*;
use tmpfsctl::copy::TEMP_PREFIX;

const CHILD_SRC: &str = "TMPFSCTL_CRASH_CHILD_SRC";
const CHILD_DST: &str = "TMPFSCTL_CRASH_CHILD_DST";
const MARKER: &str = "crash-child: syncing";
const FILES: usize = 300;
const TRIALS: usize = 24;

/// The child's side: one sync, announced on stdout so the parent can time the kill
/// from its start rather than from process startup.
#[test]
fn crash_child() {
    let (Some(src), Some(dst)) = (std::env::var_os(CHILD_SRC), std::env::var_os(CHILD_DST)) else {
        return;
    };
    println!("{MARKER}");
    mirror(Path::new(&src), Path::new(&dst), None).expect("sync in the child");
    println!("crash-child: done");
}

/// What a file may hold: its length and a hash of its bytes.
type Digest = (usize, u64);

fn digest(data: &[u8]) -> Digest {
    let mut h = DefaultHasher::new();
    data.hash(&mut h);
    (data.len(), h.finish())
}

fn rel(i: usize) -> String {
    format!("d{}/f{i:03}", i % 10)
}

/// Old contents: mostly small files, every 25th several MiB so that kills land in the
/// middle of writing one.
fn old_contents(i: usize) -> Option<Vec<u8>> {
    if i >= FILES - 10 {
        return None; // created by the change
    }
    let len = if i % 25 == 0 {
        (3 << 20) + i * 4099
    } else {
        100 + i * 211 % 30_000
    };
    Some(noise(len, i as u64 * 2 + 1))
}

/// New contents of about half the files, of another size (larger and smaller); the
/// last ten are new files, ten others are deleted.
fn new_contents(i: usize) -> Option<Vec<u8>> {
    if (FILES - 20..FILES - 10).contains(&i) {
        return None; // deleted by the change
    }
    let old = old_contents(i);
    if i % 2 == 1 && old.is_some() {
        return old;
    }
    let len = match &old {
        Some(old) if i % 4 == 0 => old.len() * 3 / 2 + 7,
        Some(old) => old.len() / 2 + 1,
        None => 5000 + i,
    };
    Some(noise(len, i as u64 * 2 + 2))
}

/// Writes the files whose `contents` differ from what `root` holds (all of them in a
/// new tree), removing those without contents.
fn write_tree(root: &Path, contents: impl Fn(usize) -> Option<Vec<u8>>) {
    for d in 0..10 {
        fs::create_dir_all(root.join(format!("d{d}"))).expect("mkdir");
    }
    for i in 0..FILES {
        let path = root.join(rel(i));
        let now = fs::read(&path).ok();
        match contents(i) {
            Some(data) if now.as_ref() != Some(&data) => {
                fs::write(&path, data).expect("write");
                set_future_atime(&path);
            }
            Some(_) => {}
            None if now.is_some() => fs::remove_file(&path).expect("rm"),
            None => {}
        }
    }
    for d in 0..10 {
        set_future_atime(&root.join(format!("d{d}")));
    }
}

/// Runs one child sync of `src` into `dst`; kills it `kill_after` after it announced
/// the sync, if given. Returns how long it ran after the announcement and whether the
/// kill interrupted it.
fn run_child(src: &Path, dst: &Path, kill_after: Option<Duration>) -> (Duration, bool) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "writeback_crash::crash_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_SRC, src)
        .env(CHILD_DST, dst)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let mut lines = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    loop {
        line.clear();
        let n = lines.read_line(&mut line).expect("read the child's stdout");
        assert!(n > 0, "the child ended before syncing");
        if line.trim_end().ends_with(MARKER) {
            break;
        }
    }
    let started = Instant::now();
    if let Some(delay) = kill_after {
        std::thread::sleep(delay);
        // SIGKILL by pid: the child is ours and still unreaped, so the pid is its own.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let status = child.wait().expect("wait for the child");
    let ran = started.elapsed();
    let killed = std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGKILL);
    if !killed {
        assert!(status.success(), "the child failed: {status:?}");
    }
    (ran, killed)
}

#[derive(Debug, Default)]
struct Seen {
    old: usize,
    new: usize,
    absent: usize,
    temps: usize,
}

/// Every file must be complete old or complete new (or absent, where that is one of
/// the two states); the only other names allowed are temporaries.
fn check_old_or_new(
    dst: &Path,
    old: &BTreeMap<String, Option<Digest>>,
    new: &BTreeMap<String, Option<Digest>>,
) -> Seen {
    let mut seen = Seen::default();
    for (name, was) in old {
        let now = match fs::read(dst.join(name)) {
            Ok(data) => Some(digest(&data)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("cannot read {name}: {e}"),
        };
        let will = &new[name];
        assert!(
            now == *was || now == *will,
            "{name} holds neither its old nor its new contents: {now:?} (old {was:?}, new {will:?})"
        );
        match now {
            None => seen.absent += 1,
            Some(_) if now == *was && now != *will => seen.old += 1,
            Some(_) if now == *will && now != *was => seen.new += 1,
            Some(_) => {}
        }
    }
    for d in 0..10 {
        for entry in fs::read_dir(dst.join(format!("d{d}"))).expect("read_dir") {
            let file_name = entry.expect("entry").file_name();
            let file_name = file_name.to_string_lossy();
            if file_name.starts_with(TEMP_PREFIX) {
                seen.temps += 1;
            } else {
                assert!(
                    old.contains_key(&format!("d{d}/{file_name}")),
                    "unexpected d{d}/{file_name}"
                );
            }
        }
    }
    seen
}

fn no_temporaries(root: &Path) -> bool {
    inodes(root).keys().all(|rel| {
        !rel.split(|&b| b == b'/')
            .any(|c| c.starts_with(TEMP_PREFIX.as_bytes()))
    })
}

#[test]
fn a_killed_sync_leaves_every_file_old_or_new_and_the_next_one_converges() {
    let mnt = tempfile::tempdir_in("/tmp").expect("tempdir");
    let old_tree = tempfile::tempdir_in("/tmp").expect("tempdir");
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    let (old_dir, dst_dir): (PathBuf, PathBuf) = (old_tree.path().into(), dst.path().into());
    in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(mnt.path(), "size=512m,mode=0755");
        let new_dir = mnt.path();
        write_tree(&old_dir, old_contents);
        // The same tree, times included, before about half of it changes.
        mirror(&old_dir, new_dir, None).expect("copy the old tree");
        write_tree(new_dir, new_contents);
        let names = |f: fn(usize) -> Option<Vec<u8>>| -> BTreeMap<String, Option<Digest>> {
            (0..FILES).map(|i| (rel(i), f(i).map(|d| digest(&d)))).collect()
        };
        let (old, new) = (names(old_contents), names(new_contents));
        let changed = (0..FILES).filter(|&i| old[&rel(i)] != new[&rel(i)]).count();
        assert!(changed > FILES * 2 / 5, "{changed} files change");

        let reset = || {
            mirror(&old_dir, &dst_dir, None).expect("reset to the old contents");
            assert_in_sync(&old_dir, &dst_dir);
        };
        // How long a sync takes: the fastest of three (disk timings vary), lowered
        // whenever a child finishes before its kill.
        let mut full = Duration::MAX;
        for _ in 0..3 {
            reset();
            let (ran, killed) = run_child(new_dir, &dst_dir, None);
            assert!(!killed);
            let seen = check_old_or_new(&dst_dir, &old, &new);
            assert_eq!((seen.old, seen.temps), (0, 0), "a complete sync: {seen:?}");
            assert_in_sync(new_dir, &dst_dir);
            full = full.min(ran);
        }
        eprintln!("an uninterrupted child sync takes {full:?}");

        let mut seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .subsec_nanos() as u64
            | 1;
        let (mut mid_sync, mut mixed) = (0, 0);
        for trial in 0..TRIALS {
            reset();
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let jitter = (seed % 1000) as f64 / 1000.0;
            // Spread over the whole sync, a little past its end too.
            let at = full.mul_f64((trial as f64 + jitter) / TRIALS as f64 * 1.1);
            let (ran, killed) = run_child(new_dir, &dst_dir, Some(at));
            if !killed {
                full = full.min(ran);
            }
            let seen = check_old_or_new(&dst_dir, &old, &new);
            eprintln!("trial {trial:2}: kill after {at:?}: killed {killed}, {seen:?}");
            mid_sync += usize::from(killed);
            mixed += usize::from(seen.old > 0 && seen.new > 0);

            let stats = mirror(new_dir, &dst_dir, None).expect("the next sync");
            assert_eq!(stats.temp_removed as usize, seen.temps, "{stats:?}");
            assert_in_sync(new_dir, &dst_dir);
            assert!(no_temporaries(&dst_dir), "temporaries left after a full sync");
        }
        eprintln!("{mid_sync} of {TRIALS} kills landed mid-sync; {mixed} left a mix of old and new files");
        assert!(
            mid_sync >= TRIALS / 3,
            "too few kills landed mid-sync: {mid_sync}"
        );
        assert!(mixed >= 3, "too few kills caught the sync halfway: {mixed}");
    });
}
