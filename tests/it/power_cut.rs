//! Durability, not only ordering: a power cut during a write-back, simulated on a real
//! device. The disk directory and the state directory live on an ext4 image attached
//! to a loop device. While `sync` or `down` writes back, tmpfsctl is stopped at random
//! moments (SIGSTOP, every thread out of its system call) and the image file is
//! copied: that is what the device had received. Each copy is mounted (its journal
//! replays, as after a power cut) and checked: every file holds its old or its new
//! content, never a torn one; a new baseline only comes with the new contents. A copy
//! taken right after the command returned must hold everything it reported written.
//!
//! ext4 is mounted with `noauto_da_alloc` (no flush on rename-over) and `commit=60`
//! (no periodic journal commit within the test), so data reaches the device only
//! when tmpfsctl asks for it: a state record without its `fsync` fails this test.
//! The write-back starts each file's writeback before its `fsync` (src/copy/durable.rs),
//! and ext4 (`data=ordered`) commits a rename only with the data of the blocks the
//! same transaction allocated, so here a file's own `fsync` missing would go unseen;
//! it is kept for filesystems that do not order data before metadata.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{run_tool, LoopFs, Sandbox};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// name → content, for the cache's regular files (paths relative to it).
type Tree = BTreeMap<String, Vec<u8>>;

fn body(name: &str, generation: &str) -> Vec<u8> {
    // Long enough to span blocks; the tail tells a torn file from a whole one.
    let mut b = format!("{generation} {name}\n").into_bytes();
    b.resize(6000, b'.');
    b.extend_from_slice(b"end\n");
    b
}

fn read_tree(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn write_tree(root: &Path, tree: &Tree) {
    for (rel, data) in tree {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, data).unwrap();
    }
}

/// Stops `pid` and waits until every thread is stopped, so none is inside a system
/// call that has sent only part of its writes.
fn stop(pid: Pid) -> bool {
    if kill(pid, Signal::SIGSTOP).is_err() {
        return false;
    }
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        let all = tasks.filter_map(Result::ok).all(|t| {
            fs::read_to_string(t.path().join("stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(") ")
                        .map(|(_, rest)| rest.starts_with(['T', 't', 'Z', 'X']))
                })
                .unwrap_or(true)
        });
        if all {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    panic!("tmpfsctl did not stop");
}

/// Runs tmpfsctl `args` with the state on the image, copying the image at random
/// moments while it runs and once after it returned. Returns the copies, the last
/// being the one after.
fn run_with_snapshots(
    sb: &Sandbox,
    disk: &LoopFs,
    state: &Path,
    args: &[&std::ffi::OsStr],
    seed: u64,
) -> Vec<PathBuf> {
    let mut c = sb.cmd();
    c.env("TMPFSCTL_STATE_DIR", state).args(args);
    c.stdout(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    let mut rng = seed | 1;
    let mut snaps = Vec::new();
    let copy = |n: usize| {
        let to = disk.image.with_extension(format!("snap{n}"));
        fs::copy(&disk.image, &to).unwrap();
        to
    };
    loop {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_micros(500 + rng % 8000));
        if child.try_wait().unwrap().is_some() || snaps.len() >= 12 {
            break;
        }
        if stop(pid) {
            snaps.push(copy(snaps.len()));
        }
        let _ = kill(pid, Signal::SIGCONT);
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "tmpfsctl {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    snaps.push(copy(snaps.len()));
    snaps
}

/// A temporary of the write-back's or of an overlay's merge: reserved, removed by the
/// next pass.
fn temporary(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap();
    name.starts_with(tmpfsctl::copy::TEMP_PREFIX) || name.starts_with(tmpfsctl::copy::overlay::TEMP_PREFIX)
}

/// Mounts each copy and checks it against the trees before and after.
///
/// `old_taken`: the baseline's time before the command, `None` where there is no
/// baseline (`seed: overlay`: only the copy after it returned must be whole).
/// `forgets`: the command ends by forgetting the mount (`down`), baseline and all.
fn check_snapshots(
    sb: &Sandbox,
    snaps: &[PathBuf],
    old: &Tree,
    new: &Tree,
    old_taken: Option<Option<(i64, i64)>>,
    forgets: bool,
) {
    let at = sb.path("snapshot");
    let last = snaps.len() - 1;
    for (i, snap) in snaps.iter().enumerate() {
        let mounted = LoopFs::mount_copy(snap, &at);
        let what = if i == last {
            "after it returned".to_string()
        } else {
            format!("copy {i}")
        };
        let tree = read_tree(&at.join("cache"));
        for (rel, data) in tree.iter().filter(|(rel, _)| !temporary(rel)) {
            assert!(
                old.get(rel) == Some(data) || new.get(rel) == Some(data),
                "{what}: {rel} is neither its old nor its new content ({} bytes: {:?}…)",
                data.len(),
                String::from_utf8_lossy(&data[..data.len().min(24)])
            );
        }
        let clean: Tree = tree.into_iter().filter(|(rel, _)| !temporary(rel)).collect();
        // The data of a file the RAM kept, at its name or moved to another, is on
        // the device at one name or the other at every moment (not only in a
        // temporary): the disk's old name goes only once the new one is durable.
        let on_device: std::collections::HashSet<&[u8]> = clean.values().map(Vec::as_slice).collect();
        let kept: std::collections::HashSet<&[u8]> = new.values().map(Vec::as_slice).collect();
        let lost: Vec<_> = old
            .iter()
            .filter(|(_, data)| kept.contains(data.as_slice()) && !on_device.contains(data.as_slice()))
            .map(|(rel, _)| rel)
            .take(5)
            .collect();
        assert!(
            lost.is_empty(),
            "{what}: the data of {lost:?}, which the RAM kept (some moved to another directory), is on no name on the device"
        );
        let (new_baseline, forgotten) = match old_taken {
            Some(old_taken) => {
                let base = tmpfsctl::copy::Baseline::load(&at.join("state/baseline/c"))
                    .unwrap_or_else(|e| panic!("{what}: the baseline does not load: {e}"));
                (
                    base.as_ref().map(|b| b.taken) != Some(old_taken) && base.is_some(),
                    forgets && base.is_none(),
                )
            }
            None => (false, false),
        };
        if new_baseline || forgotten || i == last {
            assert!(
                new_baseline || forgotten || old_taken.is_none(),
                "{what}: the new baseline is not on the device"
            );
            let missing: Vec<_> = new.keys().filter(|k| !clean.contains_key(*k)).take(5).collect();
            let extra: Vec<_> = clean.keys().filter(|k| !new.contains_key(*k)).take(5).collect();
            let stale: Vec<_> = new
                .iter()
                .filter(|(k, v)| clean.get(*k).is_some_and(|h| h != *v))
                .map(|(k, _)| k)
                .take(5)
                .collect();
            assert!(
                missing.is_empty() && extra.is_empty() && stale.is_empty(),
                "{what}: a new baseline, but the write-back is not all on the device: missing {missing:?}, not deleted {extra:?}, old content {stale:?}"
            );
        }
        for f in ["state/mounts/c.json", "state/mounts/c.sync.json"] {
            if let Ok(text) = fs::read_to_string(at.join(f)) {
                assert!(
                    serde_json::from_str::<serde_json::Value>(&text).is_ok(),
                    "{what}: {f} is damaged: {text:?}"
                );
            }
        }
        drop(mounted);
        fs::remove_file(snap).unwrap();
    }
}

/// The application's changes of a round: files rewritten, deleted, moved to other
/// directories (their data as it was, under a new name) and created.
fn changed(tree: &Tree, generation: &str, round: usize) -> Tree {
    let mut t = tree.clone();
    let names: Vec<String> = t.keys().cloned().collect();
    for (i, rel) in names.iter().enumerate() {
        match (i + round) % 6 {
            0 | 1 => {
                t.insert(rel.clone(), body(rel, generation));
            }
            2 => {
                t.remove(rel);
            }
            3 => {
                // Across directories, both ways in the walk's order: into another
                // existing one, and into one this round makes.
                let data = t.remove(rel).expect("listed above");
                let to = if i % 2 == 0 {
                    format!("d{}/moved-{generation}-{i}", (i + 2) % 5)
                } else {
                    format!("m{round}/moved-{generation}-{i}")
                };
                t.insert(to, data);
            }
            _ => {}
        }
    }
    for i in 0..150 {
        let rel = format!("n{round}/sub{}/{generation}-{i}", i % 4);
        let data = body(&rel, generation);
        t.insert(rel, data);
    }
    t
}

#[test]
fn a_power_cut_during_sync_or_down_leaves_old_or_new_files_and_a_matching_baseline() {
    power_cuts("");
}

/// The same with `seed: overlay`: the upper layer merged into the disk directory,
/// whiteouts for what the application deleted, and for a move (a copy-up under the
/// new name) the whiteout at the old. It has no baseline.
#[test]
fn a_power_cut_during_an_overlays_sync_or_down_leaves_old_or_new_files() {
    power_cuts("    seed: overlay\n");
}

fn power_cuts(extra: &str) {
    let sb = Sandbox::new();
    let disk = LoopFs::new(&sb.path("disk"), 96, "noauto_da_alloc,commit=60");
    let cache = disk.mount_point.join("cache");
    let state = disk.mount_point.join("state");
    let mut old = Tree::new();
    for i in 0..400 {
        let rel = format!("d{}/f-{i}", i % 5);
        let data = body(&rel, "seeded");
        old.insert(rel, data);
    }
    write_tree(&cache, &old);
    let spec = sb.one_mount_spec("c", &cache, "64MiB", &format!("    persist: on-stop\n{extra}"));
    let mut c = sb.cmd();
    c.env("TMPFSCTL_STATE_DIR", &state);
    sb.run_with(c, ["apply".as_ref(), spec.as_os_str()]).code(0);
    run_tool("sync", &["-f".as_ref(), disk.mount_point.as_os_str()]);
    let overlay = extra.contains("overlay");
    let taken = |s: &Path| {
        (!overlay).then(|| {
            tmpfsctl::copy::Baseline::load(&s.join("baseline/c"))
                .unwrap()
                .unwrap()
                .taken
        })
    };

    for (round, verb) in ["sync", "sync", "down"].into_iter().enumerate() {
        let new = changed(&old, &format!("gen{round}"), round);
        // The application's changes, in RAM: the moves as renames.
        let by_data: BTreeMap<&[u8], &String> = new.iter().map(|(k, v)| (v.as_slice(), k)).collect();
        for (rel, data) in old.iter().filter(|(k, _)| !new.contains_key(*k)) {
            match by_data.get(data.as_slice()) {
                Some(to) => {
                    fs::create_dir_all(cache.join(to).parent().unwrap()).unwrap();
                    fs::rename(cache.join(rel), cache.join(to)).unwrap();
                }
                None => fs::remove_file(cache.join(rel)).unwrap(),
            }
        }
        write_tree(
            &cache,
            &new.iter()
                .filter(|(_, v)| !old.values().any(|o| o == *v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        );
        let before = taken(&state);
        let snaps = run_with_snapshots(
            &sb,
            &disk,
            &state,
            &[verb.as_ref(), spec.as_os_str()],
            77 + round as u64,
        );
        assert!(snaps.len() >= 2, "{verb}: no copy was taken while it ran");
        check_snapshots(&sb, &snaps, &old, &new, before, verb == "down");
        old = new;
    }
}
