//! A tracked write-back (told by the change tracker which RAM directories changed,
//! see `tmpfsctl::dirty`) must end exactly where a full one does. Two disk copies get
//! the same changes, round after round, while the application changes the tmpfs:
//! files and directories written, deleted, renamed (across directories too),
//! chmodded and hard-linked. One copy is written back with the tracker's answer,
//! the other reading everything. The two copies must stay identical, in which of
//! the names the RAM links share an inode too, and the tracked passes must actually
//! have skipped directories.
//!
//! Needs root: the tmpfs is mounted in a private mount namespace (fanotify needs
//! CAP_SYS_ADMIN); the disk copies are directories under /tmp.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use crate::common_copy::*;
use tmpfsctl::copy::{sync_tree, Baseline, Dirty, Merge, Synced};
use tmpfsctl::dirty::{Answer, ChangeTracker};

fn pass(src: &Path, dst: &Path, base: &Baseline, tracker: Option<&mut ChangeTracker>) -> Synced {
    pass_then(src, dst, base, tracker, || {})
}

/// [`pass`], with `meanwhile` done right after the tracker answered: between the
/// barrier and the scan's listings.
pub(crate) fn pass_then(
    src: &Path,
    dst: &Path,
    base: &Baseline,
    tracker: Option<&mut ChangeTracker>,
    meanwhile: impl FnOnce(),
) -> Synced {
    let taken = base.taken;
    let mut meanwhile = Some(meanwhile);
    let mut ask = tracker.map(|t| {
        move || -> Option<Dirty> {
            t.drain();
            let answer = match t.answer(taken?) {
                Answer::Changed(d) => Some(d),
                Answer::Untracked(_) => None,
            };
            if let Some(m) = meanwhile.take() {
                m();
            }
            answer
        }
    });
    // As `sync` does: a pass that found the RAM changed where it read nothing
    // starts again tracked, and after three such, whole.
    for _ in 0..3 {
        match merge(
            src,
            dst,
            base,
            ask.as_mut().map(|f| f as &mut dyn FnMut() -> Option<Dirty>),
        ) {
            Err(e) if e.is_changed_unread() => {}
            done => return done.expect("write-back"),
        }
    }
    merge(src, dst, base, None).expect("the whole pass after them")
}

fn merge<'a>(
    src: &Path,
    dst: &Path,
    base: &'a Baseline,
    dirty: Option<&'a mut dyn FnMut() -> Option<Dirty>>,
) -> Result<Synced, tmpfsctl::copy::CopyError> {
    sync_tree(
        src,
        dst,
        Merge {
            base,
            journal: None,
            deletions: None,
            dirty,
            barriers: None,
            copied: None,
            touched: None,
        },
        None,
    )
}

/// A change tracker on the tmpfs at `src`.
fn start(src: &Path) -> ChangeTracker {
    ChangeTracker::start(fs::File::open(src).unwrap()).expect("fanotify with FAN_REPORT_DFID_NAME")
}

/// A directory: `dN` or `dN/sM` or `dN/sM/tK`.
fn dir(rng: &mut Rng) -> PathBuf {
    let mut p = PathBuf::from(format!("d{}", rng.below(4)));
    for level in ["s", "t"] {
        if rng.below(3) == 0 {
            break;
        }
        p.push(format!("{level}{}", rng.below(3)));
    }
    p
}

/// A file in a directory, or now and then one in the root (`rN`): a pass that
/// reads nothing must not miss a name the disk root gained or lost.
fn file(rng: &mut Rng) -> PathBuf {
    if rng.below(8) == 0 {
        return PathBuf::from(format!("r{}", rng.below(3)));
    }
    let f = format!("f{}", rng.below(6));
    dir(rng).join(f)
}

/// One change by the application at `root`; the same `Rng` state makes the same
/// change. Many fail (a missing parent, a name that is not there): that is part of
/// the mix. With `exchanges`, some renames swap the two names (`RENAME_EXCHANGE`):
/// the RAM's only, since after a directory moved on the disk side a full pass goes
/// by the times where a tracked one knows the RAM directory stayed in place (see
/// `a_directory_moved_on_disk_keeps_its_files_against_older_ram_versions`).
fn change(root: &Path, rng: &mut Rng, round: usize, exchanges: bool) {
    let op = rng.below(10);
    let (a, b) = (file(rng), file(rng));
    let (da, db) = (dir(rng), dir(rng));
    let at = |p: &Path| root.join(p);
    // Every write gets an mtime of its own: both passes tell files apart by size and
    // mtime, and two writes within one clock tick would look alike to both.
    let stamp = UNIX_EPOCH + Duration::new(1_700_000_000 + round as u64, (rng.0 % 1_000_000_000) as u32);
    let _ = match op {
        0..=2 => fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(op == 0)
            .open(at(&a))
            .and_then(|mut f| {
                f.write_all(format!("{round}:{}", a.display()).as_bytes())?;
                f.set_modified(stamp)
            }),
        3 => fs::remove_file(at(&a)),
        4 if rng.below(3) == 0 && exchanges => exchange(&at(&a), &at(&b)),
        4 => fs::rename(at(&a), at(&b)),
        5 => fs::set_permissions(
            at(&a),
            fs::Permissions::from_mode(0o600 + 0o40 * (round as u32 % 2)),
        ),
        6 => fs::create_dir_all(at(&da)),
        7 if rng.below(2) == 0 && exchanges => exchange(&at(&da), &at(&db)),
        7 => fs::rename(at(&da), at(&db)),
        8 if rng.below(4) == 0 => fs::remove_dir_all(at(&da)),
        8 => fs::hard_link(at(&a), at(&b)),
        _ => fs::set_permissions(
            at(&da),
            fs::Permissions::from_mode(0o750 + 0o5 * (round as u32 % 2)),
        ),
    };
}

/// Swaps two names (`RENAME_EXCHANGE`): neither inode gets a new name of its own,
/// and a directory's entries keep their ctimes at their new paths.
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
    renameat2(AT_FDCWD, a, AT_FDCWD, b, RenameFlags::RENAME_EXCHANGE).map_err(std::io::Error::from)
}

#[test]
fn tracked_passes_end_where_full_passes_do() {
    match std::env::var("TRK_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => random_rounds(seed),
        // 11: a hard-linked file's name in a skipped directory kept the ctime it had
        // before the pass linked another name to its inode, and a RAM directory
        // moved over it later lost to that "change of the disk's".
        None => [0x2545_F491_4F6C_DD1D, 11].into_iter().for_each(random_rounds),
    }
}

/// 200 rounds of random changes from `seed`, written back tracked and in full.
fn random_rounds(seed: u64) {
    let ram = tempfile::tempdir_in("/tmp").expect("tempdir");
    let (tracked, full) = (
        tempfile::tempdir_in("/tmp").expect("tempdir"),
        tempfile::tempdir_in("/tmp").expect("tempdir"),
    );
    in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(ram.path(), "size=64m,mode=0755");
        let src = ram.path();
        for d in 0..4 {
            for s in 0..3 {
                fs::create_dir_all(src.join(format!("d{d}/s{s}/t0"))).unwrap();
                for f in 0..6 {
                    let p = src.join(format!("d{d}/s{s}/f{f}"));
                    fs::write(&p, format!("seed {d} {s} {f}")).unwrap();
                    let stamp = UNIX_EPOCH + Duration::new(1_600_000_000, d * 100 + s * 10 + f);
                    fs::File::options()
                        .write(true)
                        .open(&p)
                        .unwrap()
                        .set_modified(stamp)
                        .unwrap();
                }
            }
        }
        let mut tracker = start(src);
        let (a, b) = (tracked.path(), full.path());
        let mut base_a = pass(src, a, &Baseline::none(), None).baseline;
        let mut base_b = pass(src, b, &Baseline::none(), None).baseline;
        let mut rng = Rng(seed);
        let (mut skipped, mut tracked_passes, mut kept) = (0, 0, 0);
        for round in 0..200 {
            // Quiet rounds and rounds with few changes leave most directories
            // unchanged, which is what tracking is for.
            let (ram_changes, disk_changes) = (rng.below(5), u64::from(rng.below(5) == 0));
            for _ in 0..ram_changes {
                change(src, &mut rng, round, true);
            }
            tick();
            if rng.below(2) == 0 {
                // As the agent's thread does: the events stamped soon after they
                // happen, before the pass's time (else the pass's own drain stamps
                // them, after it).
                tracker.drain();
            }
            for _ in 0..disk_changes {
                let state = rng.0;
                change(a, &mut rng, round, false);
                rng.0 = state;
                change(b, &mut rng, round, false);
            }
            tick();
            let done = pass(src, a, &base_a, Some(&mut tracker));
            // A pass that read nothing skipped everything: not what this counts.
            if !done.kept {
                skipped += done.stats.dirs_skipped;
            }
            tracked_passes += u64::from(done.stats.tracked);
            kept += u64::from(done.kept);
            base_a = done.baseline;
            base_b = pass(src, b, &base_b, None).baseline;
            let (ca, cb) = (contents(a), contents(b));
            let differ: Vec<_> = ca
                .keys()
                .chain(cb.keys())
                .filter(|k| ca.get(*k) != cb.get(*k))
                .map(|k| (k, ca.get(k), cb.get(k)))
                .collect();
            assert!(
                differ.is_empty(),
                "seed {seed}, round {round}: tracked vs full: {differ:?}"
            );
            // Of the names the RAM links, which share an inode on disk. (A link the
            // disk's side made to a name nobody changed may be broken by a full pass
            // that reads that name, and kept by a tracked pass that does not: the
            // contents are the same either way.)
            let ram_links = links(src);
            assert_eq!(
                linked_as(a, &ram_links),
                linked_as(b, &ram_links),
                "round {round}: names linked in RAM ({ram_links:?}), tracked vs full"
            );
            tick();
        }
        assert!(tracked_passes > 100, "only {tracked_passes} passes were tracked");
        assert!(skipped > 500, "tracked passes skipped only {skipped} directories");
        // Quiet rounds: nothing read, the baseline kept as it was.
        assert!(kept >= 3, "only {kept} passes found nothing changed");
    });
}

/// The names under `root` of each multiply-linked file, by inode.
fn links(root: &Path) -> Vec<Vec<PathBuf>> {
    let mut by_inode: std::collections::BTreeMap<u64, Vec<PathBuf>> = Default::default();
    for (path, (dir, ..)) in contents(root) {
        let meta = fs::symlink_metadata(root.join(&path)).expect("stat");
        if !dir && meta.nlink() > 1 {
            by_inode.entry(meta.ino()).or_default().push(path);
        }
    }
    by_inode.into_values().collect()
}

/// For each group of `groups`, its names under `root` split by the inode they have
/// there.
fn linked_as(root: &Path, groups: &[Vec<PathBuf>]) -> Vec<Vec<Vec<PathBuf>>> {
    groups
        .iter()
        .map(|group| {
            let mut by_inode: std::collections::BTreeMap<u64, Vec<PathBuf>> = Default::default();
            for path in group {
                if let Ok(meta) = fs::symlink_metadata(root.join(path)) {
                    by_inode.entry(meta.ino()).or_default().push(path.clone());
                }
            }
            let mut split: Vec<_> = by_inode.into_values().collect();
            split.sort();
            split
        })
        .collect()
}

/// What the tracker answers: the directories with a changed entry (written in
/// place, chmodded, created, deleted, renamed, linked), a directory moved in as a
/// new subtree, nothing for a directory deleted since, and the names the changes
/// happened to where it saw all of them by name; and no answer for a time before it
/// started, or before what an earlier answer let it drop.
#[test]
fn the_tracker_answers_what_changed_and_refuses_what_it_cannot_know() {
    let ram = tempfile::tempdir_in("/tmp").expect("tempdir");
    in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(ram.path(), "size=16m,mode=0755");
        let root = ram.path();
        for d in ["a/x", "b", "c", "d", "e", "gone", "quiet/deep", "modes/m"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in ["a/x/f", "b/f", "c/f", "e/g", "quiet/deep/f"] {
            fs::write(root.join(f), "seed").unwrap();
        }
        let before = tmpfsctl::copy::baseline::now_after_tick();
        let mut tracker = ChangeTracker::start(fs::File::open(root).unwrap()).unwrap();
        let taken = tmpfsctl::copy::baseline::now_after_tick();
        fs::OpenOptions::new()
            .append(true)
            .open(root.join("a/x/f"))
            .unwrap()
            .write_all(b" more")
            .unwrap();
        fs::set_permissions(root.join("b/f"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::remove_file(root.join("c/f")).unwrap();
        fs::set_permissions(root.join("modes/m"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::hard_link(root.join("e/g"), root.join("b/g")).unwrap();
        fs::rename(root.join("gone"), root.join("d/moved")).unwrap();
        fs::create_dir(root.join("d/moved/inner")).unwrap();
        fs::create_dir(root.join("doomed")).unwrap();
        fs::write(root.join("doomed/f"), "x").unwrap();
        fs::remove_dir_all(root.join("doomed")).unwrap();
        tracker.drain();
        assert!(
            matches!(tracker.answer(before), Answer::Untracked(_)),
            "changes from before it started are unknown to it"
        );
        let Answer::Changed(dirty) = tracker.answer(taken) else {
            panic!("no answer for a time after it started");
        };
        let text = |v: &[Box<[u8]>]| {
            v.iter()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect::<Vec<_>>()
        };
        let dirs = text(&dirty.dirs);
        // The hard link's new link count is an event of the file, without a name: its
        // directory is either name's.
        assert!(
            [
                &["", "a/x", "b", "c", "d", "d/moved", "modes/m"][..],
                &["", "a/x", "b", "c", "d", "d/moved", "e", "modes/m"]
            ]
            .contains(&&dirs.iter().map(String::as_str).collect::<Vec<_>>()[..]),
            "{dirs:?}"
        );
        // The names each change happened to, where every change was told by name: not
        // in a directory whose own mode changed (an event without a name), nor in
        // the one the hard-linked file's event was resolved to.
        let named = text(&dirty.named);
        for d in ["", "a/x", "c", "d", "d/moved"] {
            assert!(named.contains(&d.to_string()), "{d} not named: {named:?}");
        }
        assert!(!named.contains(&"modes/m".to_string()), "{named:?}");
        assert!(
            !(named.contains(&"e".to_string()) || dirs.len() == 7 && named.contains(&"b".to_string())),
            "the re-linked file's directory is named: {named:?}"
        );
        let entries = text(&dirty.entries);
        for e in ["a/x/f", "c/f", "d/moved", "d/moved/inner", "doomed", "gone"] {
            assert!(entries.contains(&e.to_string()), "{e} not among {entries:?}");
        }
        // A directory made and removed again is still named (by its parent, which is
        // there): the pass finds nothing under that name.
        assert_eq!(text(&dirty.subtrees), ["d/moved", "d/moved/inner", "doomed"]);
        // An answer for a later time drops what came before it.
        let later = tmpfsctl::copy::baseline::now_after_tick();
        fs::write(root.join("quiet/deep/f"), "changed").unwrap();
        tracker.drain();
        let Answer::Changed(dirty) = tracker.answer(later) else {
            panic!("no answer for a later time");
        };
        assert_eq!(text(&dirty.dirs), ["quiet/deep"]);
        assert!(
            matches!(tracker.answer(taken), Answer::Untracked(_)),
            "what it dropped, it cannot answer for"
        );
    });
}

/// The tracker keeps at most `MAX_NAMES` changed names: a directory whose change
/// would need one more is changed as a whole (every entry of it is looked at),
/// never named with a name missing.
#[test]
fn a_directory_with_more_changed_names_than_the_tracker_keeps_is_changed_as_a_whole() {
    let ram = tempfile::tempdir_in("/tmp").expect("tempdir");
    in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(ram.path(), "size=64m,nr_inodes=200k,mode=0755");
        let root = ram.path();
        for d in ["many", "few"] {
            fs::create_dir(root.join(d)).unwrap();
        }
        let mut tracker = ChangeTracker::start(fs::File::open(root).unwrap()).unwrap();
        let taken = tmpfsctl::copy::baseline::now_after_tick();
        fs::write(root.join("few/f"), "x").unwrap();
        for i in 0..=tmpfsctl::dirty::MAX_NAMES {
            fs::File::create(root.join(format!("many/{i}"))).unwrap();
            // Read before the queue (16,384 events) overflows.
            if i % 2_000 == 0 {
                tracker.drain();
            }
        }
        tracker.drain();
        let Answer::Changed(dirty) = tracker.answer(taken) else {
            panic!("no answer");
        };
        let named: Vec<_> = dirty
            .named
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        assert_eq!(named, ["few"], "named directories");
        assert!(
            dirty.dirs.iter().any(|d| &d[..] == b"many"),
            "many is not changed"
        );
        assert!(
            dirty.entries.iter().all(|e| !e.starts_with(b"many/")),
            "entries of a whole directory were kept"
        );
        assert!(dirty.entries.iter().any(|e| &e[..] == b"few/f"));
    });
}

/// A pass that reads nothing must not stand in for one that would have seen the
/// disk root change: a name deleted there, unseen, would keep its old record, and
/// the RAM's later rewrite of it would then lose to any later change of the disk
/// root (taken for the deletion's time).
#[test]
fn a_disk_root_change_is_never_left_to_a_pass_that_reads_nothing() {
    with_trees(|src, dst| {
        fs::create_dir(src.join("d")).unwrap();
        fs::write(src.join("d/x"), "x").unwrap();
        fs::write(src.join("f"), "first").unwrap();
        let base = pass(src, dst, &Baseline::none(), None).baseline;
        let mut tracker = start(src);
        tick();
        let base = pass(src, dst, &base, Some(&mut tracker)).baseline;
        tick();
        fs::remove_file(dst.join("f")).unwrap();
        tick();
        // Nothing changed in RAM; the disk root did.
        let quiet = pass(src, dst, &base, Some(&mut tracker));
        assert!(!quiet.kept, "the disk root changed: the pass must read it");
        let base = quiet.baseline;
        tick();
        fs::write(src.join("f"), "second, written in RAM").unwrap();
        tick();
        fs::write(dst.join("g"), "a later change of the disk root").unwrap();
        tick();
        let base = pass(src, dst, &base, Some(&mut tracker)).baseline;
        assert_eq!(
            fs::read_to_string(dst.join("f")).ok().as_deref(),
            Some("second, written in RAM"),
            "the RAM's rewrite after the disk's deletion is written back"
        );
        // And with nothing changed anywhere since, the next pass reads nothing.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let base = pass(src, dst, &base, Some(&mut tracker)).baseline;
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(
            pass(src, dst, &base, Some(&mut tracker)).kept,
            "a quiet pass reads nothing"
        );
    });
}

/// A write-back's barrier (see `tmpfsctl::dirty::ask`) moves the RAM root's ctime,
/// which stands for when the RAM deleted a name there. Where the disk's later
/// version of a name won over the RAM's deletion (the disk is written while the
/// application works on it: `down`'s window, a retried write-back), the barrier of
/// that pass must not make the deletion the later change at the next: that would
/// delete the disk's version. A change the application makes in the root after the
/// barrier still dates the deletions there.
#[test]
fn a_barrier_never_dates_a_ram_deletion_in_the_root() {
    let state_dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    with_trees(|src, dst| {
        let state = tmpfsctl::state::State::new(state_dir.path());
        let _tracker = tmpfsctl::dirty::Running::spawn("c", fs::File::open(src).unwrap(), &state)
            .expect("fanotify with FAN_REPORT_DFID_NAME");
        let pass = |base: &Baseline| {
            let taken = base.taken;
            let mut ask = || tmpfsctl::dirty::ask(&state, "c", src, taken?).ok();
            let barriers = || tmpfsctl::dirty::barriers(&state, "c");
            sync_tree(
                src,
                dst,
                Merge {
                    base,
                    journal: None,
                    deletions: None,
                    dirty: Some(&mut ask),
                    barriers: Some(&barriers),
                    copied: None,
                    touched: None,
                },
                None,
            )
            .expect("write-back")
            .baseline
        };
        for f in ["f", "g"] {
            fs::write(src.join(f), "first").unwrap();
        }
        let mut base = pass(&Baseline::none());
        tick();
        fs::remove_file(src.join("f")).unwrap();
        tick();
        fs::write(dst.join("f"), "rewritten on disk after the RAM deleted it").unwrap();
        tick();
        // A record that cannot be written (a full /run) must not leave a barrier
        // behind it: planted in the way of its temporary for one round.
        let in_the_way = state_dir.path().join("mounts/c.barriers.tmp~");
        for round in 0..4 {
            if round == 2 {
                fs::create_dir(&in_the_way).unwrap();
            }
            base = pass(&base);
            let _ = fs::remove_dir(&in_the_way);
            assert_eq!(
                fs::read_to_string(dst.join("f")).ok().as_deref(),
                Some("rewritten on disk after the RAM deleted it"),
                "pass {round}: the disk's later version stays"
            );
            tick();
        }
        fs::write(dst.join("g"), "rewritten on disk").unwrap();
        tick();
        fs::remove_file(src.join("g")).unwrap();
        tick();
        pass(&base);
        assert!(
            !dst.join("g").exists(),
            "the RAM's deletion after the disk's rewrite, made after a barrier, wins"
        );
    });
}

/// A directory moved on the disk side (the application renames or exchanges it
/// while it works on the disk) brings files whose ctimes are older than the RAM's
/// versions at that path: the disk's side won all the same (the RAM did not change
/// since the baseline), and a later change of that RAM directory must not make
/// the RAM's old version the later one. A tracked pass knows the RAM directory was
/// not moved (a full pass cannot tell, and goes by the times).
#[test]
fn a_directory_moved_on_disk_keeps_its_files_against_older_ram_versions() {
    with_trees(|src, dst| {
        fs::create_dir(src.join("d")).unwrap();
        let mut tracker = start(src);
        tick();
        let base = pass(src, dst, &Baseline::none(), None).baseline;
        // The disk's own directory, older than the RAM's version of `d/f`.
        fs::create_dir(dst.join("old")).unwrap();
        fs::write(dst.join("old/f"), "moved in on disk").unwrap();
        tick();
        fs::write(src.join("d/f"), "the RAM's").unwrap();
        tick();
        let mut base = pass(src, dst, &base, Some(&mut tracker)).baseline;
        assert_eq!(fs::read_to_string(dst.join("d/f")).unwrap(), "the RAM's");
        tick();
        exchange(&dst.join("d"), &dst.join("old")).unwrap();
        tick();
        for round in 0..3 {
            let done = pass(src, dst, &base, Some(&mut tracker));
            assert!(done.stats.tracked, "pass {round} was tracked");
            base = done.baseline;
            assert_eq!(
                fs::read_to_string(dst.join("d/f")).unwrap(),
                "moved in on disk",
                "pass {round}: the disk's change since the baseline stays"
            );
            tick();
            fs::write(
                src.join(format!("d/new{round}")),
                "a later change of the RAM directory",
            )
            .unwrap();
            // And of the disk's: its listing is read again, and `d/f` decided again.
            fs::write(dst.join(format!("d/disk{round}")), "the disk's").unwrap();
            tick();
        }
    });
}

/// A RAM deletion the disk's later rewrite won over (the application wrote the
/// name on disk while the RAM copy was held) stays lost when the RAM directory
/// changes afterwards: that change dates the directory, not the deletion.
#[test]
fn a_disk_version_that_won_over_a_ram_deletion_stays() {
    with_trees(|src, dst| {
        fs::create_dir(src.join("d")).unwrap();
        fs::write(src.join("d/f"), "first").unwrap();
        let mut base = pass(src, dst, &Baseline::none(), None).baseline;
        tick();
        fs::remove_file(src.join("d/f")).unwrap();
        tick();
        fs::write(dst.join("d/f"), "rewritten on disk after the RAM deleted it").unwrap();
        tick();
        for round in 0..3 {
            base = pass(src, dst, &base, None).baseline;
            assert_eq!(
                fs::read_to_string(dst.join("d/f")).ok().as_deref(),
                Some("rewritten on disk after the RAM deleted it"),
                "pass {round}: the disk's later version stays"
            );
            tick();
            fs::write(
                src.join(format!("d/g{round}")),
                "a later change of the RAM directory",
            )
            .unwrap();
            tick();
        }
        // The RAM makes the name again: a change after the disk's, which wins.
        fs::write(src.join("d/f"), "made again in RAM").unwrap();
        tick();
        pass(src, dst, &base, None);
        assert_eq!(fs::read_to_string(dst.join("d/f")).unwrap(), "made again in RAM");
    });
}

/// The converse: a RAM directory moved after the disk's version of a name in it
/// won. The RAM's files keep their ctimes at their new paths, from before the
/// baseline: they are new there all the same, and the later change decides (in a
/// tracked pass and a full one alike).
#[test]
fn a_directory_moved_in_ram_after_the_disk_won_brings_its_files() {
    // In place, the disk's change is seen only once the RAM's changes (a
    // baseline record); renamed over, at once (the disk's version won).
    for (tracked, renamed) in [(false, false), (true, false), (false, true), (true, true)] {
        with_trees(|src, dst| {
            fs::create_dir(src.join("d")).unwrap();
            fs::create_dir(src.join("e")).unwrap();
            fs::write(src.join("d/f"), "the RAM's first").unwrap();
            let mut tracker = tracked.then(|| start(src));
            tick();
            let base = pass(src, dst, &Baseline::none(), None).baseline;
            tick();
            if renamed {
                fs::write(dst.join("d/f.new"), "the disk's, later").unwrap();
                fs::rename(dst.join("d/f.new"), dst.join("d/f")).unwrap();
            } else {
                fs::write(dst.join("d/f"), "the disk's, later").unwrap();
            }
            tick();
            fs::write(src.join("e/f"), "the RAM's, later still").unwrap();
            tick();
            let base = pass(src, dst, &base, tracker.as_mut()).baseline;
            assert_eq!(fs::read_to_string(dst.join("d/f")).unwrap(), "the disk's, later");
            tick();
            exchange(&src.join("d"), &src.join("e")).unwrap();
            tick();
            pass(src, dst, &base, tracker.as_mut());
            assert_eq!(
                fs::read_to_string(dst.join("d/f")).unwrap(),
                "the RAM's, later still",
                "tracked: {tracked}, renamed: {renamed}"
            );
        });
    }
}

/// Without a tracker, a RAM directory whose ctime changed could have been moved
/// in: its files count as changed unless they still look like the version both
/// sides agreed on there. An unchanged one then follows the disk's change, even
/// one whose ctime understates it (files a directory moved on disk brought).
#[test]
fn a_full_pass_keeps_what_a_disk_move_brought_over_agreed_ram_files() {
    with_trees(|src, dst| {
        fs::create_dir(src.join("d")).unwrap();
        fs::create_dir(dst.join("old")).unwrap();
        fs::write(dst.join("old/f"), "moved in on disk").unwrap();
        tick();
        fs::write(src.join("d/f"), "the RAM's").unwrap();
        tick();
        let base = pass(src, dst, &Baseline::none(), None).baseline;
        tick();
        exchange(&dst.join("d"), &dst.join("old")).unwrap();
        fs::write(src.join("d/g"), "a later change of the RAM directory").unwrap();
        tick();
        pass(src, dst, &base, None);
        assert_eq!(fs::read_to_string(dst.join("d/f")).unwrap(), "moved in on disk");
        assert_eq!(fs::read_to_string(dst.join("old/f")).unwrap(), "the RAM's");
    });
}

/// Two RAM directories swapped (by a third name): `b/x`, a directory of its own
/// owner and mode whose ctime the move of its parent leaves older than the
/// baseline, arrives at `a/x`, where the disk has a file. The directory the pass
/// makes there gets the RAM's owner and mode, tracked or not (before, it stayed
/// root's and 0700 for good: a hunting helper's probe, 4 of 4).
#[test]
fn a_directory_that_arrives_through_a_move_above_gets_the_rams_owner_and_mode() {
    use std::os::unix::fs::chown;
    for tracked in [false, true] {
        with_trees(|src, dst| {
            for d in ["a", "b", "b/x"] {
                fs::create_dir(src.join(d)).unwrap();
            }
            fs::write(src.join("a/x"), "a file").unwrap();
            fs::write(src.join("b/x/in"), "inside").unwrap();
            chown(src.join("b/x"), Some(1000), Some(1000)).unwrap();
            fs::set_permissions(src.join("b/x"), fs::Permissions::from_mode(0o755)).unwrap();
            let mut tracker = tracked.then(|| start(src));
            tick();
            let base = pass(src, dst, &Baseline::none(), None).baseline;
            tick();
            fs::rename(src.join("a"), src.join("t")).unwrap();
            fs::rename(src.join("b"), src.join("a")).unwrap();
            fs::rename(src.join("t"), src.join("b")).unwrap();
            tick();
            pass(src, dst, &base, tracker.as_mut());
            let (ram, disk) = (
                fs::metadata(src.join("a/x")).unwrap(),
                fs::metadata(dst.join("a/x")).unwrap(),
            );
            let case = format!("tracked: {tracked}");
            assert!(disk.is_dir(), "{case}");
            assert_eq!(
                (disk.uid(), disk.gid(), disk.mode() & 0o7777),
                (ram.uid(), ram.gid(), ram.mode() & 0o7777),
                "{case}"
            );
            assert_eq!(
                fs::read_to_string(dst.join("a/x/in")).unwrap(),
                "inside",
                "{case}"
            );
        });
    }
}
