//! What the application does on disk in the last moments of `apply`'s seed (after
//! the seed's last look for deletions, stopped at `before-switch`; or before any
//! look, at `after-seed`) and in RAM right after the switch (`seed-switched`):
//! once the tmpfs is in place it shows nothing the disk no longer had, and after
//! `down` the disk holds what the application left, no more, no less.

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::common::Sandbox;
use crate::no_write_lost::{apply_stopped_at, contents};

pub(crate) fn spec(sb: &Sandbox, cache: &Path) -> PathBuf {
    sb.write_spec(
        "cache.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: cache\n    path: {}\n    size: 256MiB\n    persist: on-stop\n",
            cache.display()
        ),
    )
}

/// The names in `seen` that `then` lacks.
fn extra(seen: &BTreeMap<String, String>, then: &BTreeMap<String, String>) -> Vec<String> {
    seen.keys().filter(|k| !then.contains_key(*k)).cloned().collect()
}

/// A directory the disk deleted right before the switch, one of whose
/// subdirectories the application writes in right after it: the copies go but
/// the ones in that subdirectory, which is the application's now (it may have
/// moved it there: a moved directory keeps its files' ctimes); those stay in RAM
/// (docs/writeback.md, "What is not covered") and `down` does not write them
/// back: they keep their records (all the directory's records were forgotten once
/// any of it went, and `down` wrote the copies back as new).
#[test]
fn a_directory_partly_dropped_after_the_switch_keeps_no_copy_for_down() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    fs::create_dir_all(cache.join("d/sub")).unwrap();
    fs::write(cache.join("d/f"), "d/f").unwrap();
    fs::write(cache.join("d/sub/g"), "d/sub/g").unwrap();
    fs::create_dir(cache.join("k")).unwrap();
    fs::write(cache.join("k/f"), "k/f").unwrap();
    let spec = spec(&sb, &cache);
    let (code, log) = apply_stopped_at(&sb, &spec, &["before-switch", "seed-switched"], |i| {
        if i == 0 {
            fs::remove_dir_all(cache.join("d")).unwrap();
            return;
        }
        fs::write(cache.join("d/sub/new"), "d/sub/new").unwrap();
    });
    assert_eq!(code, 0, "{log}");
    let mut want = contents(&cache);
    assert_eq!(want.get("d/sub/new").map(String::as_str), Some("d/sub/new"));
    assert!(!want.contains_key("d/f"), "{want:?}\n{log}");
    want.remove("d/sub/g");
    let down = sb.run(["down".as_ref(), spec.as_os_str()]);
    down.code(0);
    assert_eq!(contents(&cache), want, "on disk after down\n{log}\n{down}");
}

/// A file the disk deleted and made again before the seed's first look, and a
/// directory moved away and back then, each deleted once more after its last
/// look: a second deletion of a name is not reported anew, so the names the look
/// found there again are looked at after the switch as well.
#[test]
fn a_name_deleted_twice_during_the_seed_is_not_in_ram_once_in_place() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    for d in ["d", "e", "k"] {
        fs::create_dir(cache.join(d)).unwrap();
        for f in ["f", "g"] {
            fs::write(cache.join(d).join(f), format!("{d}/{f} v1")).unwrap();
        }
    }
    let spec = spec(&sb, &cache);
    let (mut at_switch, mut once_in_place) = Default::default();
    let (code, log) = apply_stopped_at(
        &sb,
        &spec,
        &["after-seed", "before-switch", "after-move-into-place"],
        |i| match i {
            0 => {
                fs::remove_file(cache.join("d/f")).unwrap();
                fs::write(cache.join("d/f"), "d/f v2").unwrap();
                fs::rename(cache.join("e"), cache.join("k/e")).unwrap();
                fs::rename(cache.join("k/e"), cache.join("e")).unwrap();
            }
            1 => {
                fs::remove_file(cache.join("d/f")).unwrap();
                fs::remove_dir_all(cache.join("e")).unwrap();
                at_switch = contents(&cache);
            }
            _ => once_in_place = contents(&cache),
        },
    );
    assert_eq!(code, 0, "{log}");
    let early = extra(&once_in_place, &at_switch);
    assert!(
        early.is_empty(),
        "deleted before the switch, in RAM once in place: {early:?}\n{log}"
    );
    as_at_the_switch(&sb, &spec, &cache, &at_switch, ("", &log));
}

/// The tmpfs at `cache` holds `want` once `apply` is done (its output `log`), and
/// so does the disk directory after `down`; `case` names the case in a failure.
pub(crate) fn as_at_the_switch(
    sb: &Sandbox,
    spec: &Path,
    cache: &Path,
    want: &BTreeMap<String, String>,
    (case, log): (&str, &str),
) {
    assert_eq!(&contents(cache), want, "{case}: in RAM\n{log}");
    let down = sb.run(["down".as_ref(), spec.as_os_str()]);
    down.code(0);
    assert_eq!(&contents(cache), want, "{case}: on disk after down\n{down}");
}

/// A file the disk made a directory, and a directory it made a file, before any
/// look for deletions and after the last one: once in place the tmpfs shows
/// neither old entry.
#[test]
fn a_name_whose_type_changed_during_the_seed_is_seen_as_it_is() {
    for point in ["after-seed", "before-switch"] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fs::create_dir(cache.join("d")).unwrap();
        fs::write(cache.join("d/g"), "d/g").unwrap();
        fs::write(cache.join("f"), "f").unwrap();
        fs::write(cache.join("k"), "k").unwrap();
        let spec = spec(&sb, &cache);
        let (mut at_switch, mut once_in_place) = Default::default();
        let (code, log) = apply_stopped_at(&sb, &spec, &[point, "after-move-into-place"], |i| {
            if i == 1 {
                once_in_place = contents(&cache);
                return;
            }
            fs::remove_file(cache.join("f")).unwrap();
            fs::create_dir(cache.join("f")).unwrap();
            fs::write(cache.join("f/x"), "f/x").unwrap();
            fs::remove_dir_all(cache.join("d")).unwrap();
            fs::write(cache.join("d"), "d as a file").unwrap();
            at_switch = contents(&cache);
        });
        assert_eq!(code, 0, "{point}: {log}");
        let early = extra(&once_in_place, &at_switch);
        assert!(
            early.is_empty(),
            "{point}: gone at the switch, in RAM once in place: {early:?}\n{log}"
        );
        as_at_the_switch(&sb, &spec, &cache, &at_switch, (point, &log));
    }
}

/// What the application does in RAM right after the switch in a directory the
/// disk deleted, or deleted and made again (with a new file), right before it: a
/// new file, a new directory, an old copy rewritten, a file written in an old
/// subdirectory all stay, in RAM and on disk after `down`; the other old copies
/// go, but from a directory the application changed (made or removed a name in):
/// it is the application's, and they stay visible in RAM until `down`, which does
/// not write them back (docs/writeback.md, "What is not covered").
#[test]
fn the_applications_changes_in_a_directory_made_again_stay() {
    for (variant, again) in (0..4).flat_map(|v| [(v, true), (v, false)]) {
        let case = format!("v{variant}, made again {again}");
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fs::create_dir_all(cache.join("d/sub")).unwrap();
        let copies: Vec<String> = (0..4)
            .flat_map(|f| [format!("d/f{f}"), format!("d/sub/g{f}")])
            .collect();
        for c in &copies {
            fs::write(cache.join(c), format!("{c} old")).unwrap();
        }
        let spec = spec(&sb, &cache);
        let mut want: BTreeMap<String, Option<String>> = copies.iter().map(|c| (c.clone(), None)).collect();
        if again {
            want.insert("d/new".into(), Some("d/new".into()));
        }
        let mut want_in_ram = BTreeMap::new();
        let mut stay_visible = |prefix: &str| {
            for c in copies.iter().filter(|c| c.starts_with(prefix)) {
                want_in_ram.insert(c.clone(), Some(format!("{c} old")));
            }
        };
        let (code, log) = apply_stopped_at(&sb, &spec, &["before-switch", "seed-switched"], |i| {
            if i == 0 {
                fs::remove_dir_all(cache.join("d")).unwrap();
                if again {
                    fs::create_dir(cache.join("d")).unwrap();
                    fs::write(cache.join("d/new"), "d/new").unwrap();
                }
                return;
            }
            let (name, body) = match variant {
                0 => ("d/app", "d/app"),
                1 => {
                    fs::create_dir(cache.join("d/appdir")).unwrap();
                    ("d/appdir/x", "d/appdir/x")
                }
                2 => ("d/f1", "d/f1 rewritten"),
                _ => ("d/sub/app", "d/sub/app"),
            };
            fs::write(cache.join(name), body).unwrap();
            want.insert(name.into(), Some(body.into()));
        });
        match (variant, again) {
            (0 | 1, false) => stay_visible("d/"),
            (3, _) => stay_visible("d/sub/"),
            _ => {}
        }
        assert_eq!(code, 0, "{case}: {log}");
        let in_ram = contents(&cache);
        let down = sb.run(["down".as_ref(), spec.as_os_str()]);
        down.code(0);
        let on_disk = contents(&cache);
        for (k, w) in &want {
            let in_ram_wanted = want_in_ram.get(k).unwrap_or(w);
            assert_eq!(in_ram.get(k), in_ram_wanted.as_ref(), "{case}: {k} in RAM\n{log}");
            assert_eq!(
                on_disk.get(k),
                w.as_ref(),
                "{case}: {k} on disk after down\n{log}\n{down}"
            );
        }
    }
}

/// Writes `files` (path, contents) below `dir`, making the directories on the way.
/// A tree's contents as [`contents`] gives them, from (path, content) pairs.
fn tree<K: AsRef<str>>(pairs: &[(K, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.as_ref().to_string(), v.to_string()))
        .collect()
}

/// Checks that the tmpfs at `cache` holds `want` and, after `down`, the disk too.
fn in_ram_and_after_down(
    sb: &Sandbox,
    spec: &Path,
    cache: &Path,
    want: &BTreeMap<String, String>,
    what: &str,
) {
    let in_ram = contents(cache);
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    let after = contents(cache);
    assert!(
        &in_ram == want && &after == want,
        "{what}:\nwant  {want:?}\nRAM   {in_ram:?}\nafter {after:?}"
    );
}

pub(crate) fn fill(dir: &Path, files: &[(&str, &str)]) {
    for (p, c) in files {
        let p = dir.join(p);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, c).unwrap();
    }
}

/// A directory removed and made again right before the switch on an ext4 that
/// gives the new one the old one's inode number (once the journal committed the
/// removal): told apart by its birth time, its old copies are not in RAM once in
/// place.
#[test]
fn a_directory_made_again_with_the_old_inode_number_is_told_apart() {
    use std::os::unix::fs::MetadataExt;
    let sb = Sandbox::new();
    let _disk = crate::common::LoopFs::new(&sb.path("disk"), 64, "defaults");
    let cache = sb.path("disk/cache");
    fs::create_dir(&cache).unwrap();
    fill(
        &cache,
        &[("d1/f0", "d1/f0"), ("d1/sub/g0", "d1/sub/g0"), ("d2/x", "d2/x")],
    );
    let spec = spec(&sb, &cache);
    let (mut at_switch, mut once_in_place, mut inos) = (BTreeMap::new(), BTreeMap::new(), (0, 0));
    let (code, log) = apply_stopped_at(&sb, &spec, &["before-switch", "after-move-into-place"], |i| {
        if i == 1 {
            once_in_place = contents(&cache);
            return;
        }
        let before = fs::metadata(cache.join("d1")).unwrap().ino();
        fs::remove_dir_all(cache.join("d1")).unwrap();
        nix::unistd::sync();
        fs::create_dir(cache.join("d1")).unwrap();
        fs::write(cache.join("d1/new"), "d1/new").unwrap();
        inos = (before, fs::metadata(cache.join("d1")).unwrap().ino());
        at_switch = contents(&cache);
    });
    assert_eq!(code, 0, "{log}");
    let early = extra(&once_in_place, &at_switch);
    assert!(
        early.is_empty(),
        "inodes {inos:?}: in RAM once in place: {early:?}\n{log}"
    );
    as_at_the_switch(&sb, &spec, &cache, &at_switch, ("", &log));
}

/// The disk replaces `p/d1` right before the switch; right after it the application
/// moves `q` to `p` in RAM. `p/d1` is then `q`'s, whose files keep their older
/// ctimes: it is not taken for the seed's copy of the directory the disk replaced,
/// and nothing in it goes.
#[test]
fn a_directory_the_application_moves_over_a_replaced_one_keeps_what_it_holds() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    fill(&cache, &[("p/d1/x", "p/d1/x"), ("q/d1/y", "q/d1/y")]);
    let spec = spec(&sb, &cache);
    let (code, log) = apply_stopped_at(&sb, &spec, &["before-switch", "seed-switched"], |i| {
        if i == 1 {
            fs::rename(cache.join("p"), cache.join("p.old")).unwrap();
            fs::rename(cache.join("q"), cache.join("p")).unwrap();
            return;
        }
        fs::create_dir(cache.join("p/d1.n")).unwrap();
        fs::remove_dir_all(cache.join("p/d1")).unwrap();
        fs::rename(cache.join("p/d1.n"), cache.join("p/d1")).unwrap();
    });
    assert_eq!(code, 0, "{log}");
    let in_ram = contents(&cache);
    assert_eq!(
        in_ram.get("p/d1/y").map(String::as_str),
        Some("q/d1/y"),
        "{in_ram:?}\n{log}"
    );
    let down = sb.run(["down".as_ref(), spec.as_os_str()]);
    down.code(0);
    let on_disk = contents(&cache);
    assert_eq!(
        on_disk.get("p/d1/y").map(String::as_str),
        Some("q/d1/y"),
        "{on_disk:?}\n{down}"
    );
}

/// `d1/f0` and `e/g` are one file with two names. Right before the switch the disk
/// rewrites `e/g` (a new file renamed over it) and deletes `d1/f0`, or replaces
/// `d1` whole. Removing the copy of `d1/f0` from RAM changed the ctime of the copy
/// at `e/g`, which then passed for a change of the application's and won over the
/// disk's rewrite: lost, in RAM and on disk after `down`. The same with two files
/// held.
#[test]
fn the_disk_rewrite_of_a_hard_linked_file_is_not_lost() {
    for (replaced, linked) in [(false, true), (true, true), (false, false), (true, false)] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fill(&cache, &[("e/g", "old"), ("d1/f1", "d1/f1")]);
        if linked {
            fs::hard_link(cache.join("e/g"), cache.join("d1/f0")).unwrap();
        } else {
            fs::write(cache.join("d1/f0"), "old").unwrap();
        }
        let spec = spec(&sb, &cache);
        let mut at_switch = BTreeMap::new();
        let (code, log) = apply_stopped_at(&sb, &spec, &["before-switch"], |_| {
            fs::write(cache.join("e/g.tmp"), "new, written on disk").unwrap();
            fs::rename(cache.join("e/g.tmp"), cache.join("e/g")).unwrap();
            if replaced {
                fs::create_dir(cache.join("d1.n")).unwrap();
                fs::remove_dir_all(cache.join("d1")).unwrap();
                fs::rename(cache.join("d1.n"), cache.join("d1")).unwrap();
            } else {
                fs::remove_file(cache.join("d1/f0")).unwrap();
            }
            at_switch = contents(&cache);
        });
        let case = format!("replaced {replaced}, linked {linked}");
        assert_eq!(code, 0, "{case}: {log}");
        as_at_the_switch(&sb, &spec, &cache, &at_switch, (&case, &log));
    }
}

/// The application removes, in the tmpfs, each directory that `apply`'s merge of what
/// it wrote on disk during the seed opens (htcacheclean removes each directory it
/// emptied). The merge stopped at the first: the rest of what the disk got during
/// the seed stayed hidden under the tmpfs, and what it had brought in was recorded
/// nowhere, so that the names the application then deleted in RAM came back at
/// `down` (a flake-hunting helper's probe: 8 of 9 runs).
#[test]
fn a_directory_removed_in_ram_during_the_seed_window_merge_stops_nothing() {
    const N: usize = 300;
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    fs::create_dir(cache.join("big")).unwrap();
    let dirs = cleaned_dirs(&cache, "d", N);
    let spec = spec(&sb, &cache);
    let mut cleaner = None;
    let (code, out) = apply_stopped_at(&sb, &spec, &["before-switch", "seed-switched"], |at| {
        if at == 0 {
            keep_the_merge_busy(&cache, 40, &dirs);
            return;
        }
        // The tmpfs is in place, its merge not begun.
        cleaner = Some(Cleaner::start(&dirs));
    });
    let removed = cleaner.map_or(0, Cleaner::stop);
    assert_eq!(code, 0, "{out}");
    // What the application sees in RAM: each directory it still has holds the file
    // it wrote on disk during the seed. It deletes those it sees.
    let (mut seen, mut hidden) = (Vec::new(), Vec::new());
    for d in dirs.iter().filter(|d| d.exists()) {
        let new = d.join("new");
        if new.exists() {
            fs::remove_file(&new).unwrap();
            seen.push(new);
        } else {
            hidden.push(new);
        }
    }
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    let back: Vec<_> = seen.iter().filter(|f| f.exists()).collect();
    assert!(
        hidden.is_empty() && back.is_empty(),
        "{removed} directories removed in RAM during the merge; {} files written on disk during the seed hidden in RAM; \
         {} of {} deleted in RAM back after down: {back:?}\n{out}",
        hidden.len(),
        back.len(),
        seen.len()
    );
}

/// A file the application writes on disk during the seed, in a directory the seed
/// copied, which the application empties of what it sees and removes in RAM right
/// after the switch, before the merge reaches it (htcacheclean). The file is brought
/// in (the directory made again for it), and is on disk after `down`. Before, the
/// merge took the directory's removal for one of everything below it, recorded the
/// file as agreed, and `down` deleted it on disk: Apache's entries lost in 1 of 20
/// `apache_persist` runs (a flake-hunting helper's find).
#[test]
fn a_file_written_on_disk_in_a_directory_removed_in_ram_right_after_the_switch_is_kept() {
    for stop in ["after-seed", "before-switch"] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fill(&cache, &[("M/N/old.data", "old"), ("keep", "k")]);
        let spec = spec(&sb, &cache);
        let (code, out) = apply_stopped_at(&sb, &spec, &[stop, "seed-switched"], |at| {
            if at == 0 {
                fill(&cache, &[("M/N/x.data", "written on disk during the seed")]);
                return;
            }
            fs::remove_file(cache.join("M/N/old.data")).unwrap();
            fs::remove_dir(cache.join("M/N")).unwrap();
        });
        assert_eq!(code, 0, "{out}");
        let want = tree(&[
            ("M/", ""),
            ("M/N/", ""),
            ("M/N/x.data", "written on disk during the seed"),
            ("keep", "k"),
        ]);
        in_ram_and_after_down(&sb, &spec, &cache, &want, &format!("{stop}\n{out}"));
    }
}

/// The application moves a directory the seed copied into another one and removes
/// its old parent, in RAM right after the switch, while the disk got a file during
/// the seed elsewhere, in the old parent, or in the moved directory itself. Nothing
/// of the seed's comes back at the old path, and the file written on disk is kept
/// (the last one at the old path: a move out of a directory then removed is not
/// followed). Before, the moved directory's copies came back at the old path (a
/// review helper's probe of the fix above).
#[test]
fn a_directory_moved_out_of_one_removed_in_ram_right_after_the_switch_does_not_come_back() {
    for stop in ["after-seed", "before-switch"] {
        for (written, extra) in [
            ("z.data", vec![("z.data", "disk")]),
            ("M/w", vec![("M/", ""), ("M/w", "disk")]),
            (
                "M/N/x.data",
                vec![("M/", ""), ("M/N/", ""), ("M/N/x.data", "disk")],
            ),
        ] {
            let sb = Sandbox::new();
            let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
            fill(&cache, &[("M/N/old.data", "old"), ("P/p", "p"), ("keep", "k")]);
            let spec = spec(&sb, &cache);
            let (code, out) = apply_stopped_at(&sb, &spec, &[stop, "seed-switched"], |at| {
                if at == 0 {
                    fill(&cache, &[(written, "disk")]);
                    return;
                }
                fs::rename(cache.join("M/N"), cache.join("P/N")).unwrap();
                fs::remove_dir_all(cache.join("M")).unwrap();
            });
            assert_eq!(code, 0, "{out}");
            let mut want = tree(&[
                ("P/", ""),
                ("P/N/", ""),
                ("P/N/old.data", "old"),
                ("P/p", "p"),
                ("keep", "k"),
            ]);
            want.extend(tree(&extra));
            in_ram_and_after_down(&sb, &spec, &cache, &want, &format!("{stop}, {written}\n{out}"));
        }
    }
}

/// An application's cleaner: empties (of its file `old`) and removes each of a set
/// of directories as soon as something opens it, as htcacheclean removes each
/// directory it emptied, from a thread of its own.
pub(crate) struct Cleaner {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl Cleaner {
    pub(crate) fn start(dirs: &[PathBuf]) -> Cleaner {
        let ino = Inotify::init(InitFlags::IN_CLOEXEC).unwrap();
        let mut watched = std::collections::HashMap::new();
        for d in dirs {
            watched.insert(ino.add_watch(d, AddWatchFlags::IN_OPEN).unwrap(), d.clone());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut removed = 0;
            while !stopped.load(Ordering::Relaxed) {
                let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
                if poll(&mut fds, PollTimeout::from(100u16)).unwrap() == 0 {
                    continue;
                }
                for ev in ino.read_events().unwrap() {
                    if let Some(d) = watched.remove(&ev.wd) {
                        let _ = fs::remove_file(d.join("old"));
                        removed += usize::from(fs::remove_dir(&d).is_ok());
                    }
                }
            }
            removed
        });
        Cleaner { stop, thread }
    }

    /// Stops it; returns how many directories it removed.
    pub(crate) fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// The disk deletes a directory right before the switch; right after it the tmpfs's
/// copy is emptied and removed, and the application makes the directory again at
/// once and writes in it (as Apache does, caching into a directory htcacheclean
/// removed): it is the application's. Taken for what was left of the copy, the new
/// directory kept the old one's record, and the disk's deletion of that could win
/// over what the application wrote there (where the two fell in one clock tick:
/// this test passes on that code too). The likely cause of 2 of 8 runs of the
/// Apache test under load losing 2 and 4 files: each lost file was renamed in right
/// after a rename into its missing directory failed.
#[test]
fn a_directory_the_application_makes_again_as_its_copy_goes_is_its_own() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    fill(&cache, &[("d/f0", "d/f0"), ("d/f1", "d/f1"), ("k/f", "k/f")]);
    let spec = spec(&sb, &cache);
    let (code, log) = crate::no_write_lost::stopped_at(
        &sb,
        "apply",
        &spec,
        "stop=before-switch,seed-dir-dropped",
        &["before-switch", "seed-dir-dropped"],
        |i| {
            if i == 0 {
                fs::remove_dir_all(cache.join("d")).unwrap();
                return;
            }
            assert!(!cache.join("d").exists(), "the copy of d is gone\n");
            fs::create_dir(cache.join("d")).unwrap();
            fs::write(cache.join("d/x"), "d/x").unwrap();
        },
    );
    assert_eq!(code, 0, "{log}");
    let want = contents(&cache);
    assert_eq!(
        want.get("d/x").map(String::as_str),
        Some("d/x"),
        "{want:?}\n{log}"
    );
    assert!(!want.contains_key("d/f0"), "{want:?}");
    as_at_the_switch(&sb, &spec, &cache, &want, ("", &log));
}

/// `n` directories `{prefix}NNN` below `cache`, each with a file `old`, for a
/// [`Cleaner`] to remove.
pub(crate) fn cleaned_dirs(cache: &Path, prefix: &str, n: usize) -> Vec<PathBuf> {
    let dirs: Vec<PathBuf> = (0..n).map(|i| cache.join(format!("{prefix}{i:03}"))).collect();
    for d in &dirs {
        fs::create_dir(d).unwrap();
        fs::write(d.join("old"), "old").unwrap();
    }
    dirs
}

/// On disk, after the seed copied everything: `big` large files first in the walk
/// of the merge that follows (its workers are busy with them), then a file `new` in
/// each of `dirs`.
pub(crate) fn keep_the_merge_busy(cache: &Path, big: u8, dirs: &[PathBuf]) {
    fs::create_dir_all(cache.join("big")).unwrap();
    for j in 0..big {
        fs::write(cache.join(format!("big/f{j:02}")), vec![j; 4 << 20]).unwrap();
    }
    for d in dirs {
        fs::write(d.join("new"), "new").unwrap();
    }
}

/// The merge after the switch stopped by a full tmpfs (the application wrote a file
/// on disk during the seed that does not fit): what it brought in before is
/// recorded all the same, so the names of it the application deletes in RAM stay
/// deleted after `down` (they came back: unrecorded, they were the disk's own). What
/// it did not bring in stays on disk.
#[test]
fn what_the_merge_brought_in_before_the_tmpfs_filled_is_recorded() {
    const N: usize = 40;
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    fill(&cache, &[("old/a", "a"), ("old/b", "b")]);
    let spec = sb.write_spec(
        "cache.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: cache\n    path: {}\n    size: 8MiB\n    persist: on-stop\n",
            cache.display()
        ),
    );
    let (code, out) = apply_stopped_at(&sb, &spec, &["before-switch"], |_| {
        for i in 0..N {
            fill(
                &cache,
                &[
                    (&format!("d{i:02}/new"), "new"),
                    (&format!("d{i:02}/new2"), "new2"),
                ],
            );
        }
        // Last in the merge's walk, and larger than the whole tmpfs.
        fill(&cache, &[("zz/huge", &"x".repeat(16 << 20))]);
    });
    assert_eq!(code, 0, "{out}");
    let in_ram = contents(&cache);
    assert!(!in_ram.contains_key("zz/huge"), "{out}");
    let deleted: Vec<String> = in_ram.keys().filter(|k| k.ends_with("/new")).cloned().collect();
    assert!(
        deleted.len() > N / 2,
        "the merge brought in only {deleted:?}\n{out}"
    );
    for name in &deleted {
        fs::remove_file(cache.join(name)).unwrap();
    }
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    let after = contents(&cache);
    let back: Vec<_> = deleted.iter().filter(|n| after.contains_key(*n)).collect();
    let lost: Vec<_> = (0..N)
        .map(|i| format!("d{i:02}/new2"))
        .chain(["old/a".into(), "old/b".into(), "zz/huge".into()])
        .filter(|n| !after.contains_key(n))
        .collect();
    assert!(
        back.is_empty() && lost.is_empty(),
        "{} of {} deleted in RAM back after down: {back:?}; lost: {lost:?}\n{out}",
        back.len(),
        deleted.len()
    );
}

/// A directory of the seed's copies the application moves in RAM right after the
/// switch (alone; then making a new one at its name, which it moves too; moved twice;
/// after moving its subdirectory out), after writing
/// in it on disk during the seed (a new file and a rewrite; before the seed's last
/// look, or after): what it wrote is in the moved directory, in RAM and after
/// `down`, and nothing comes back at the old path. Before, the move counted as the
/// directory's deletion: what it wrote before the last look was lost (the rewrite
/// too), and after it the whole directory came back at its old path.
#[test]
fn a_directory_moved_in_ram_right_after_the_switch_takes_what_was_written_in_it_on_disk() {
    for stop in ["after-seed", "before-switch"] {
        for variant in [
            "moved",
            "moved and made again",
            "moved twice",
            "moved and changed",
            "moved, made again and that moved too",
            "its subdirectory moved out first",
        ] {
            let sb = Sandbox::new();
            let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
            fill(
                &cache,
                &[
                    ("d/old", "old"),
                    ("d/changed", "v1"),
                    ("d/kept", "kept"),
                    ("d/sub/seeded", "s"),
                    ("e/old", "old"),
                ],
            );
            let spec = spec(&sb, &cache);
            let (code, out) = apply_stopped_at(&sb, &spec, &[stop, "seed-switched"], |at| {
                if at == 0 {
                    fill(
                        &cache,
                        &[("d/x", "x"), ("d/changed", "v2"), ("d/sub/y", "y"), ("e/z", "z")],
                    );
                    return;
                }
                if variant == "its subdirectory moved out first" {
                    fs::rename(cache.join("d/sub"), cache.join("e/sub2")).unwrap();
                }
                fs::rename(cache.join("d"), cache.join("d2")).unwrap();
                match variant {
                    "moved, made again and that moved too" => {
                        fill(&cache, &[("d/mine", "mine")]);
                        fs::rename(cache.join("d"), cache.join("d3")).unwrap();
                    }
                    "moved and made again" => fs::create_dir(cache.join("d")).unwrap(),
                    "moved twice" => fs::rename(cache.join("d2"), cache.join("e/d3")).unwrap(),
                    "moved and changed" => {
                        fs::remove_file(cache.join("d2/old")).unwrap();
                        fs::write(cache.join("d2/kept"), "mine").unwrap();
                    }
                    _ => {}
                }
            });
            assert_eq!(code, 0, "{out}");
            let at = if variant == "moved twice" { "e/d3" } else { "d2" };
            let mut want = tree(&[
                (format!("{at}/"), ""),
                (format!("{at}/old"), "old"),
                (format!("{at}/changed"), "v2"),
                (format!("{at}/kept"), "kept"),
                (format!("{at}/x"), "x"),
                (format!("{at}/sub/"), ""),
                (format!("{at}/sub/y"), "y"),
                (format!("{at}/sub/seeded"), "s"),
                ("e/".into(), ""),
                ("e/old".into(), "old"),
                ("e/z".into(), "z"),
            ]);
            match variant {
                "moved and made again" => {
                    want.insert("d/".into(), String::new());
                }
                "moved and changed" => {
                    want.remove("d2/old");
                    want.insert("d2/kept".into(), "mine".into());
                }
                "moved, made again and that moved too" => {
                    want.insert("d3/".into(), String::new());
                    want.insert("d3/mine".into(), "mine".into());
                }
                "its subdirectory moved out first" => {
                    for k in ["d2/sub/", "d2/sub/y", "d2/sub/seeded"] {
                        want.remove(k);
                    }
                    want.insert("e/sub2/".into(), String::new());
                    want.insert("e/sub2/y".into(), "y".into());
                    want.insert("e/sub2/seeded".into(), "s".into());
                }
                _ => {}
            }
            in_ram_and_after_down(
                &sb,
                &spec,
                &cache,
                &want,
                &format!("{variant}, written on disk at {stop}\n{out}"),
            );
        }
    }
}

/// A process still working in the disk directory through a descriptor it opened
/// before `apply` (its working directory) rewrites a file there after the merge
/// after the switch compared it: after `down` the disk has its rewrite. Before, the
/// records taken after the merge took the rewrite for what the tmpfs had, and
/// `down` wrote the tmpfs's older copy over it.
#[test]
fn a_rewrite_through_an_old_descriptor_after_the_merge_is_not_taken_for_the_copy() {
    use std::os::unix::fs::OpenOptionsExt;
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    fill(&cache, &[("old", "v1"), ("d/keep", "k")]);
    let spec = spec(&sb, &cache);
    // Its working directory: the disk directory, whatever is mounted over it later.
    let disk = fs::File::open(&cache).unwrap();
    let at = |name: &str| {
        PathBuf::from(format!(
            "/proc/self/fd/{}/{name}",
            std::os::fd::AsRawFd::as_raw_fd(&disk)
        ))
    };
    let (code, out) = apply_stopped_at(&sb, &spec, &["before-switch", "seed-merged"], |i| {
        if i == 0 {
            // Something for the merge to bring in.
            fill(&cache, &[("new", "n")]);
            return;
        }
        let tmp = at(".old.tmp");
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)
            .unwrap();
        std::io::Write::write_all(&mut f, b"v2, written on disk after the merge").unwrap();
        drop(f);
        fs::rename(&tmp, at("old")).unwrap();
    });
    assert_eq!(code, 0, "{out}");
    assert_eq!(fs::read_to_string(cache.join("new")).unwrap(), "n", "{out}");
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    let after = contents(&cache);
    assert_eq!(
        after.get("old").map(String::as_str),
        Some("v2, written on disk after the merge"),
        "{after:?}\n{out}"
    );
}

/// A file of the seed's copies the application moves in RAM right after the switch,
/// after rewriting it on disk during the seed (replaced, or appended to in place;
/// before the seed's last look, or after): the moved file has the rewrite, in RAM
/// and after `down`, and the old name is gone. Moved on, it has it too; changed by
/// the application after the move, its change stands; one not rewritten on disk is
/// moved as it is. Before, the move counted as the name's deletion: the rewrite was
/// lost, or came back at the old name.
#[test]
fn a_file_moved_in_ram_right_after_the_switch_takes_its_rewrite_on_disk() {
    use std::io::Write;
    for stop in ["after-seed", "before-switch"] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fill(
            &cache,
            &[
                ("g", "v1"),
                ("a/log", "line 1\n"),
                ("twice", "v1"),
                ("mine", "v1"),
                ("same", "s"),
            ],
        );
        let spec = spec(&sb, &cache);
        let (code, out) = apply_stopped_at(&sb, &spec, &[stop, "seed-switched"], |at| {
            if at == 0 {
                fill(
                    &cache,
                    &[("g", "v2 of g"), ("twice", "v2 of twice"), ("mine", "v2 of mine")],
                );
                let mut log = fs::OpenOptions::new()
                    .append(true)
                    .open(cache.join("a/log"))
                    .unwrap();
                log.write_all(b"line 2\n").unwrap();
                return;
            }
            fs::rename(cache.join("g"), cache.join("h")).unwrap();
            fs::rename(cache.join("a/log"), cache.join("log.1")).unwrap();
            fs::rename(cache.join("twice"), cache.join("a/twice")).unwrap();
            fs::rename(cache.join("a/twice"), cache.join("twice.2")).unwrap();
            fs::rename(cache.join("mine"), cache.join("mine.2")).unwrap();
            fs::write(cache.join("mine.2"), "the application's").unwrap();
            fs::rename(cache.join("same"), cache.join("same.2")).unwrap();
        });
        assert_eq!(code, 0, "{out}");
        let want = tree(&[
            ("h", "v2 of g"),
            ("a/", ""),
            ("log.1", "line 1\nline 2\n"),
            ("twice.2", "v2 of twice"),
            ("mine.2", "the application's"),
            ("same.2", "s"),
        ]);
        in_ram_and_after_down(
            &sb,
            &spec,
            &cache,
            &want,
            &format!("written on disk at {stop}\n{out}"),
        );
    }
}

/// A directory moved right after the switch whose parent stayed but whose parent's
/// parent moved too (before it, or after): it is found where the seed copied it, and
/// gets what was written in it on disk. Before, its path then was taken for its
/// path now, and the new file was lost.
#[test]
fn a_directory_moved_below_a_moved_one_is_followed() {
    for first in ["the directory", "its grandparent"] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fill(&cache, &[("a/b/c/old", "old"), ("a/b/c/changed", "v1")]);
        let spec = spec(&sb, &cache);
        let (code, out) = apply_stopped_at(&sb, &spec, &["after-seed", "seed-switched"], |at| {
            if at == 0 {
                fill(&cache, &[("a/b/c/x", "x"), ("a/b/c/changed", "v2")]);
                return;
            }
            let (c, a) = (
                || fs::rename(cache.join("a/b/c"), cache.join("a/b/c2")).unwrap(),
                || fs::rename(cache.join("a"), cache.join("a.old")).unwrap(),
            );
            if first == "the directory" {
                c();
                a();
            } else {
                a();
                fs::rename(cache.join("a.old/b/c"), cache.join("a.old/b/c2")).unwrap();
            }
        });
        assert_eq!(code, 0, "{out}");
        let want = tree(&[
            ("a.old/", ""),
            ("a.old/b/", ""),
            ("a.old/b/c2/", ""),
            ("a.old/b/c2/old", "old"),
            ("a.old/b/c2/changed", "v2"),
            ("a.old/b/c2/x", "x"),
        ]);
        in_ram_and_after_down(&sb, &spec, &cache, &want, &format!("{first} moved first\n{out}"));
    }
}

/// A file the application makes on disk during the seed (the copy misses it), writes
/// again in RAM right after the switch (before the merge reaches it: its version
/// wins), then deletes or moves away in RAM: after `down` it is gone from its old
/// name. Before, the disk's version was recorded only where the tmpfs had it, so it
/// stayed the disk's own and came back (a hunting helper's probe).
#[test]
fn a_file_made_on_disk_during_the_seed_and_written_again_in_ram_stays_deleted() {
    for then in ["deleted", "moved"] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fill(&cache, &[("d/old", "old")]);
        let spec = spec(&sb, &cache);
        let (code, out) = apply_stopped_at(&sb, &spec, &["after-seed", "seed-switched"], |at| {
            if at == 0 {
                fill(&cache, &[("d/new", "v1, on disk during the seed")]);
                return;
            }
            fs::write(cache.join("d/.tmp"), "v2, in RAM").unwrap();
            fs::rename(cache.join("d/.tmp"), cache.join("d/new")).unwrap();
        });
        assert_eq!(code, 0, "{out}");
        assert_eq!(
            fs::read_to_string(cache.join("d/new")).unwrap(),
            "v2, in RAM",
            "{out}"
        );
        if then == "deleted" {
            fs::remove_file(cache.join("d/new")).unwrap();
        } else {
            fs::rename(cache.join("d/new"), cache.join("d/moved")).unwrap();
        }
        sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
        let mut want = tree(&[("d/", ""), ("d/old", "old")]);
        if then == "moved" {
            want.insert("d/moved".into(), "v2, in RAM".into());
        }
        assert_eq!(contents(&cache), want, "{then}\n{out}");
    }
}

/// `apply` killed after its merge after the switch brought in what the application
/// wrote on disk during the seed, before it recorded that; then `apply` again (it
/// finds nothing to do) or `sync`. A name the merge brought in that the application
/// then deletes in RAM stays deleted after `down`. Before, the retried `apply` found
/// the mount converged, nothing recorded what the merge brought in, and `down` kept
/// the disk's copy (a hunting helper's probe).
#[test]
fn an_apply_killed_before_recording_its_merge_leaves_nothing_to_come_back() {
    for then in ["apply", "sync"] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fill(&cache, &[("d/old", "old")]);
        let spec = spec(&sb, &cache);
        crate::no_write_lost::killed_at_last(&sb, "apply", &spec, &["after-seed", "seed-merged"], |at| {
            if at == 0 {
                fill(&cache, &[("d/new", "on disk during the seed"), ("d/kept", "k")]);
            }
        });
        assert_eq!(
            fs::read_to_string(cache.join("d/new")).ok().as_deref(),
            Some("on disk during the seed"),
            "{then}: the merge did not bring it in"
        );
        sb.run([then.as_ref(), spec.as_os_str()]).code(0);
        fs::remove_file(cache.join("d/new")).unwrap();
        sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
        let want = tree(&[("d/", ""), ("d/old", "old"), ("d/kept", "k")]);
        assert_eq!(contents(&cache), want, "then {then}");
    }
}

/// A user owning the directory above the managed path moves it away right after the
/// switch and puts a symlink to a root-owned directory at the managed path: the
/// merge of what was written on disk during the seed writes nothing there (it goes
/// through the tmpfs's root, opened before the switch). Before, the merge opened
/// the managed path, followed the symlink, and wrote the disk's files into the
/// root-owned directory, over its own (a review helper's probe).
#[test]
fn the_merge_after_the_switch_never_follows_a_symlink_at_the_managed_path() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    let parent = sb.cache_dir("home/u/.cache", 1000, 1000, 0o755);
    let cache = sb.cache_dir("home/u/.cache/app", 1000, 1000, 0o755);
    fill(&cache, &[("keep", "k")]);
    let victim = sb.cache_dir("etc", 0, 0, 0o755);
    fill(&victim, &[("passwd", "root's passwd")]);
    fs::set_permissions(victim.join("passwd"), fs::Permissions::from_mode(0o644)).unwrap();
    let spec = spec(&sb, &cache);
    let moved = sb.path("home/u/.cache.old");
    let (code, out) = apply_stopped_at(&sb, &spec, &["after-seed", "seed-switched"], |at| {
        if at == 0 {
            fill(&cache, &[("passwd", "user's passwd"), ("planted", "x")]);
            return;
        }
        fs::rename(&parent, &moved).unwrap();
        fs::create_dir(&parent).unwrap();
        std::os::unix::fs::symlink(&victim, &cache).unwrap();
    });
    let got = contents(&victim);
    fs::remove_file(&cache).unwrap();
    assert_eq!(
        got,
        tree(&[("passwd", "root's passwd")]),
        "apply exit {code}\n{out}"
    );
    // The tmpfs went with the directory moved; it got the disk's files.
    let in_ram = contents(&moved.join("app"));
    assert_eq!(
        in_ram,
        tree(&[("keep", "k"), ("passwd", "user's passwd"), ("planted", "x")]),
        "{out}"
    );
}

/// A copy the seed made of a file the disk then rewrote (before the seed's last
/// look, or after) whose ctime the application changes in RAM right after the
/// switch without writing it: `chmod` to the same mode, a hard link made and removed
/// (a lock), a rename away and back. The rewrite is in RAM and after `down`. Before,
/// the copy's new ctime made it the later change, and the rewrite was lost (a review
/// helper's probe).
#[test]
fn a_copy_whose_ctime_the_application_changed_keeps_the_disk_rewrite() {
    use std::os::unix::fs::PermissionsExt;
    for stop in ["after-seed", "before-switch"] {
        for how in ["chmod", "link", "rename"] {
            let sb = Sandbox::new();
            let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
            fill(&cache, &[("g", "v1")]);
            let spec = spec(&sb, &cache);
            let (code, out) = apply_stopped_at(&sb, &spec, &[stop, "seed-switched"], |at| {
                if at == 0 {
                    fill(&cache, &[("g", "v2 of g")]);
                    return;
                }
                let g = cache.join("g");
                match how {
                    "chmod" => {
                        let mode = fs::metadata(&g).unwrap().permissions().mode();
                        fs::set_permissions(&g, fs::Permissions::from_mode(mode)).unwrap();
                    }
                    "link" => {
                        fs::hard_link(&g, cache.join("g.lock")).unwrap();
                        fs::remove_file(cache.join("g.lock")).unwrap();
                    }
                    _ => {
                        fs::rename(&g, cache.join("g.tmp")).unwrap();
                        fs::rename(cache.join("g.tmp"), &g).unwrap();
                    }
                }
            });
            assert_eq!(code, 0, "{out}");
            let want = tree(&[("g", "v2 of g")]);
            in_ram_and_after_down(
                &sb,
                &spec,
                &cache,
                &want,
                &format!("{how}, written on disk at {stop}\n{out}"),
            );
        }
    }
}
