//! What the application did on disk while `apply` seeded, carried into the tmpfs.
//!
//! The seed copies the disk directory while the application still works in it.
//!
//! What it deletes (or renames away) on disk after the seed copied the name would stay
//! in the tmpfs: the application would see, and delete again, names it had deleted.
//! The disk's filesystem is watched for deletions from the seed's start
//! ([`Deletions`]), and just before the tmpfs goes in place, while nothing but the seed
//! has touched it, every copied name the disk no longer has is dropped from it
//! ([`drop_deleted`]); what is deleted between that last look and the switch, right
//! after it ([`SeedDeletions::drop_after_switch`]). What the watch misses, the merge
//! below takes out by the seed's records: an unchanged copy whose disk entry is gone.
//!
//! What it writes into a directory the seed has copied already misses the copy: hidden
//! under the tmpfs, the application does not see it, and the write-back keeps the
//! disk's version as the disk's own, even after the application wrote that name in
//! RAM and deleted it again (a deletion undone). So once the tmpfs is in place and
//! the disk directory is reached only through the side bind, the write-back's own
//! merge runs the other way, disk into tmpfs, with no record to go by: of a name
//! both sides have, the side that changed it later wins (the disk's change made
//! during the seed against the copy made before it; the application's change in RAM
//! since against both), and a name only the disk has is copied in, unless the
//! application deleted it in the tmpfs meanwhile (the deletion watch started before
//! the tmpfs became visible) ([`catch_up`]). Which side changed later is not
//! left to ctimes where the seed knows better: a copy unchanged since the switch of
//! a disk entry that no longer looks as the seed recorded it is outdated, however
//! late the copy's ctime (see `Merge::copied`).
//!
//! The write-back's baseline then records, as both sides agreed on them, the disk's
//! entries the merge saw that the seed did not record as they are: without that, a
//! name brought in and then deleted (or renamed away) by the application in RAM would
//! be the disk's own to the next write-back, which keeps it.

use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Context;
use nix::errno::Errno;
use nix::fcntl::{openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{self, FileStat};

use crate::copy::baseline::{Mark, Sig, Time};
use crate::copy::{self, Baseline, DiskDeletions, Merge, SyncStats};
use crate::host::deletions::Deletions;
use crate::host::fanotify::{fd_path, open_handle, Handle};
use crate::progress::Progress;
use crate::spec::MountSpec;
use crate::state::State;

mod moves;
use moves::{agree_followed, follow_moved, under, walked_in, Followed};

/// How often [`catch_up`] starts again after the application removed a directory
/// under it, each time another one.
const MAX_RACES: usize = 1000;

/// Merges what changed in the disk directory of `m` since `seed_started` into its
/// tmpfs, now at its path; `watch`: the application's deletions in the tmpfs since
/// it became visible; `touched`: the tmpfs inodes whose ctime this process changed
/// since (see [`copy::Merge::touched`]). Then records what it brought in (see
/// [`record_brought_in`]).
///
/// `began`: when the seed began, from which a long seed and this merge together report
/// their progress (`terminal`: as [`Progress::new`] takes it).
pub fn catch_up(
    m: &MountSpec,
    state: &State,
    (live, (seed_started, began)): (&Path, (Time, Instant)),
    terminal: bool,
    (watch, mut touched): (Option<Deletions>, HashSet<u64>),
) -> Result<SyncStats, String> {
    let mut base = Baseline {
        taken: Some(seed_started),
        ..Baseline::none()
    };
    // The seed's records (and the switch's time) tell its copies that the disk
    // changed after apart from the application's changes in RAM since.
    let copied = state
        .baseline(&m.name)
        .inspect_err(|e| {
            tracing::warn!(
                "{}: reading the seed's records ({e:#}); of a name both sides have, the newer wins by time alone",
                m.name
            )
        })
        .ok();
    let watch = watch.map(Mutex::new);
    let deletions = watch.as_ref().map(|w| w as &Mutex<dyn DiskDeletions + Send>);
    // Disk changes from here on may be after the merges looked: made by a process
    // still working in the disk directory through a descriptor opened before the
    // switch. Those are not recorded as agreed on (see [`record_brought_in`]).
    let merges_began = copy::baseline::now_after_tick();
    let followed = match (&watch, &copied) {
        (Some(w), Some(c)) => follow_moved(m, state, live, (w, c), seed_started, &mut touched),
        _ => Vec::new(),
    };
    if let Ok(disk) = std::fs::File::open(state.side(&m.name)) {
        agree_followed(disk.as_fd(), &followed, &mut base, b"");
    }
    let mut shown = Progress::new(state, &m.name, "seed", terminal, None, None).begun_at(began);
    let mut progress = |s: &SyncStats| shown.update(s.compared(), s.bytes_written);
    let merged = merge_in(
        (&state.side(&m.name), live),
        (&base, copied.as_ref(), deletions),
        &mut touched,
        Some(&mut progress),
    );
    let merged = match merged {
        Ok(merged) => merged,
        Err(e) => {
            let stopped = format!("bringing in what the application wrote on disk during the seed: {e}");
            // What it brought in before it stopped is in the tmpfs as on disk:
            // unrecorded, a name of it the application then deletes in RAM
            // would be the disk's own to the write-back, which keeps it.
            return Err(
                match record_agreed(m, state, live, (&followed, merges_began), copied) {
                    Ok(0) => stopped,
                    Ok(n) => format!(
                        "{stopped}; recorded the {} the tmpfs has as the disk has {}",
                        crate::plural::count(n, "entry", "entries"),
                        crate::plural::agree(n, "it", "them")
                    ),
                    Err(re) => format!("{stopped}; recording what it brought in: {re:#}"),
                },
            );
        }
    };
    drop(shown);
    let st = &merged.stats;
    let wrote =
        st.files_written + st.metadata_updated + st.dirs_created + st.links_written + st.specials_written;
    let deleted_in_ram = merged
        .baseline
        .marks
        .iter()
        .any(|(_, m)| matches!(m, Mark::Deleted(_)));
    // Otherwise the seed's records stand: the tmpfs holds what it copied and the
    // application's own changes since, which the write-back takes as such. Where
    // the tmpfs's version was kept over a disk entry the seed did not copy, that
    // entry is recorded: the disk's own, it came back once the application deleted
    // the name in RAM (a hunting helper's probe, 4 of 4).
    crate::failpoint::hit("seed-merged", &m.name);
    if wrote > 0 || st.kept_disk > 0 || deleted_in_ram || !followed.is_empty() {
        record_brought_in(
            m,
            state,
            live,
            (&merged.baseline, &followed, merges_began),
            copied,
        )
        .map_err(|e| format!("recording what the seed missed: {e:#}"))?;
    }
    Ok(merged.stats)
}

/// One pass of the write-back's merge from the disk directory into the tmpfs (`src`,
/// `dst`), against no records but the seed's (`copied`); started again after a race
/// with the application removing a directory of the tmpfs under it.
fn merge_in(
    (src, dst): (&Path, &Path),
    (base, copied, deletions): (
        &Baseline,
        Option<&Baseline>,
        Option<&Mutex<dyn DiskDeletions + Send>>,
    ),
    touched: &mut HashSet<u64>,
    mut progress: Option<&mut dyn FnMut(&SyncStats)>,
) -> Result<copy::Synced, copy::CopyError> {
    // A pass that stopped where the application removed a directory of the tmpfs
    // (htcacheclean removes those it emptied) under it starts again: what it brought
    // in so far is recorded only at the end, and the rest would stay hidden. The next
    // pass sees that removal as the application's deletion. Each start must be at
    // another directory than the ones before, so it ends.
    let mut raced = HashSet::new();
    loop {
        let merged = copy::sync_tree(
            src,
            dst,
            Merge {
                base,
                journal: None,
                deletions,
                dirty: None,
                barriers: None,
                copied,
                touched: Some(&mut *touched),
            },
            progress.as_mut().map(|p| &mut **p as &mut dyn FnMut(&SyncStats)),
        );
        match merged {
            Err(e @ copy::CopyError::Destination { .. })
                if e.is_gone_in_copy() && raced.len() < MAX_RACES && raced.insert(e.to_string()) =>
            {
                tracing::info!(
                    "{} into {}: {e}: the application removed a directory of the tmpfs under the merge of what it wrote on disk during the seed, which starts again",
                    src.display(),
                    dst.display()
                );
            }
            done => return done,
        }
    }
}

/// Adds to the seed's baseline of `m` every disk entry among `seen` (the paths the
/// merge walked) that it lacks or records otherwise, as it is on disk now, where that
/// is the version the merge compared: a disk entry unchanged since `began`, when the
/// merges started, or one the tmpfs has in the same version (type, mode, size and
/// mtime; a directory: a directory). Where the application's version in RAM won, or
/// it deleted or moved the name there, the disk's entry is recorded all the same:
/// unrecorded, it would be the disk's own to the write-back, and come back once the
/// application deletes the name in RAM (a hunting helper's probe, after this rule
/// first asked for the same version in RAM).
///
/// The disk directory is hidden under the tmpfs, but a process that kept a
/// descriptor of it (its working directory) from before the switch still works
/// there. Recorded as agreed on, its change made after the merge looked was the
/// version the tmpfs had not got: `down` took the tmpfs's older copy for the later
/// change and wrote it over the disk's (a hunting helper's writer lost 2 to 12
/// rewrites per `apply` that way).
///
/// `followed`: the directories merged where the application moved them
/// ([`follow_moved`]); what was walked in each is recorded at its disk path, where
/// the tmpfs no longer has it (the write-back takes it as moved away). Of one whose
/// merge failed, nothing is: what the disk has there stays.
///
/// `seeded`: the seed's baseline of `m` as loaded for the merge (nothing saves
/// another meanwhile), or `None` to load it.
fn record_brought_in(
    m: &MountSpec,
    state: &State,
    live: &Path,
    (seen, followed, began): (&Baseline, &[Followed], Time),
    seeded: Option<Baseline>,
) -> anyhow::Result<()> {
    let side = state.side(&m.name);
    let root = std::fs::File::open(&side).with_context(|| format!("opening {}", side.display()))?;
    let ram = std::fs::File::open(live).with_context(|| format!("opening {}", m.path.display()))?;
    let mut base = match seeded {
        Some(b) => b,
        None => state.baseline(&m.name)?,
    };
    let failed: Vec<&[u8]> = followed
        .iter()
        .filter(|f| f.seen.is_none())
        .map(|f| &f.from[..])
        .collect();
    let paths = seen
        .marks
        .iter()
        .map(|(path, _)| path.to_vec())
        .filter(|p| !failed.iter().any(|f| under(f, p)))
        .chain(walked_in(followed));
    let mut added = 0u64;
    for path in paths {
        let path = &path[..];
        let Ok(st) = stat_beneath(root.as_fd(), path) else {
            continue;
        };
        let sig = Sig::of(&st);
        let compared = sig.ctime < began
            || stat_beneath(ram.as_fd(), path).is_ok_and(|in_ram| {
                let in_ram = Sig::of(&in_ram);
                if sig.is_dir() {
                    in_ram.is_dir()
                } else {
                    sig.same_version(&in_ram)
                }
            });
        if compared && base.get(path) != Some(Mark::Entry(sig)) {
            base.marks.insert(path, Mark::Entry(sig));
            added += 1;
        }
    }
    if added > 0 {
        state.save_baseline(&m.name, &base)?;
    }
    Ok(())
}

/// After an `apply` killed between its switch and the records of its merge of what
/// the application wrote on disk during the seed (marked in the state, see
/// [`State::mark_seed_merge`]): records what the tmpfs, at `ram`, has alike with
/// the disk ([`record_agreed`]), so that a name the merge brought in and the
/// application then deleted in RAM does not come back at the write-back. What the
/// merge did not bring in stays on disk, hidden until `down`, the disk's own: the
/// deletion watch that would tell what the application deleted since died with
/// that `apply`, so no merge brings it in now. Logged; once.
pub fn finish_interrupted(m: &MountSpec, state: &State, ram: &Path) {
    if !state.seed_merge_pending(&m.name) {
        return;
    }
    match record_agreed(m, state, ram, (&[], copy::baseline::now_after_tick()), None) {
        Ok(n) => {
            tracing::warn!(
                "{}: an apply stopped before it recorded its merge of what the application wrote on disk during the seed: recorded the {} the tmpfs has as the disk has {}; what it did not bring in stays on disk, hidden under the tmpfs until `down`",
                m.name,
                crate::plural::count(n, "entry", "entries"),
                crate::plural::agree(n, "it", "them")
            );
            if let Err(e) = state.clear_seed_merge(&m.name) {
                tracing::warn!("{}: {e:#}", m.name);
            }
        }
        Err(e) => tracing::warn!(
            "{}: recording what an interrupted apply brought in during the seed: {e:#}",
            m.name
        ),
    }
}

/// Adds to the seed's baseline of `m` every disk entry that the tmpfs has in the same
/// version (type, mode, size and mtime; a directory: a directory there) and the
/// baseline lacks or records otherwise, as it is on disk now; returns how many.
///
/// For a merge that stopped: what it brought in before is not known, but it is what
/// both sides have alike; and what the merges into moved directories (`followed`)
/// walked, unchanged on disk since they `began`. A directory the baseline records keeps its record (what
/// the merge did not bring into it stays the disk's own); copies the application
/// changed since, and the disk's changes the merge did not reach, differ and keep
/// theirs. A name brought in that the application deleted in RAM before this look
/// is missed: the write-back keeps it on disk.
fn record_agreed(
    m: &MountSpec,
    state: &State,
    ram: &Path,
    (followed, began): (&[Followed], Time),
    seeded: Option<Baseline>,
) -> anyhow::Result<u64> {
    let side = state.side(&m.name);
    let open_root = |p: &Path| {
        std::fs::File::open(p)
            .map(OwnedFd::from)
            .with_context(|| format!("opening {}", p.display()))
    };
    let (disk, ram) = (open_root(&side)?, open_root(ram)?);
    let mut base = match seeded {
        Some(b) => b,
        None => state.baseline(&m.name)?,
    };
    let mut added = 0u64;
    // What the merges into moved directories walked, where the tmpfs no longer has
    // it (see [`record_brought_in`]).
    for path in walked_in(followed) {
        if let Ok(st) = stat_beneath(disk.as_fd(), &path) {
            let sig = Sig::of(&st);
            if sig.ctime < began && base.get(&path) != Some(Mark::Entry(sig)) {
                base.marks.insert(&path, Mark::Entry(sig));
                added += 1;
            }
        }
    }
    let mut dirs: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(dir) = dirs.pop() {
        // A directory either side no longer has (or has as a symlink now) is skipped:
        // what is below it is not alike.
        let (Ok(d), Ok(r)) = (
            open_dir_beneath(disk.as_fd(), &dir),
            open_dir_beneath(ram.as_fd(), &dir),
        ) else {
            continue;
        };
        let names = crate::copy::read_names(&d)
            .with_context(|| format!("reading {}", side.join(OsStr::from_bytes(&dir)).display()))?;
        for name in names {
            let flags = AtFlags::AT_SYMLINK_NOFOLLOW;
            let (Ok(on_disk), Ok(in_ram)) = (
                stat::fstatat(&d, name.as_c_str(), flags),
                stat::fstatat(&r, name.as_c_str(), flags),
            ) else {
                continue;
            };
            let (disk_sig, ram_sig) = (Sig::of(&on_disk), Sig::of(&in_ram));
            let path = join(&dir, name.to_bytes());
            let record = if disk_sig.is_dir() && ram_sig.is_dir() {
                let lacking = base.get(&path).is_none();
                dirs.push(path.clone());
                lacking
            } else {
                disk_sig.same_version(&ram_sig) && base.get(&path) != Some(Mark::Entry(disk_sig))
            };
            if record {
                base.marks.insert(&path, Mark::Entry(disk_sig));
                added += 1;
            }
        }
    }
    if added > 0 {
        state.save_baseline(&m.name, &base)?;
    }
    Ok(added)
}

/// The file `path` below `root`, open for reading, not through a symlink.
fn open_beneath(root: BorrowedFd<'_>, path: &[u8]) -> nix::Result<OwnedFd> {
    openat2(
        root,
        Path::new(OsStr::from_bytes(path)),
        OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS),
    )
}

/// `path` below `root`, not through a symlink: the application may have made one.
fn stat_beneath(root: BorrowedFd<'_>, path: &[u8]) -> nix::Result<FileStat> {
    let fd = openat2(
        root,
        Path::new(OsStr::from_bytes(path)),
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS),
    )?;
    stat::fstat(&fd)
}

/// The deletions on the disk's filesystem since the seed began, to drop from the
/// stage tmpfs what the seed copied of them.
pub struct SeedDeletions {
    watch: Deletions,
    disk: PathBuf,
    /// Deleted names the disk had again when last looked at: looked at again.
    again: Vec<(Handle, Vec<u8>)>,
    /// What was dropped since [`Self::take_dropped`]: the seed's records of it no
    /// longer hold.
    dropped: Dropped,
    /// The tmpfs inodes of the files dropped after the switch that have another
    /// name: the ctime their removal gave them is not the application's change.
    unlinked: HashSet<u64>,
}

impl SeedDeletions {
    /// Starts watching the filesystem of the disk directory `disk` (the seed's source).
    pub fn watch(disk: &Path) -> Option<SeedDeletions> {
        match Deletions::watch(disk) {
            Ok(watch) => Some(SeedDeletions {
                watch,
                disk: disk.to_path_buf(),
                again: Vec::new(),
                dropped: Dropped::default(),
                unlinked: HashSet::new(),
            }),
            Err(e) => {
                tracing::info!(
                    "cannot watch {} for deletions during the seed ({e}); names deleted there meanwhile stay in RAM until the merge after the switch takes them out",
                    disk.display()
                );
                None
            }
        }
    }

    /// Drops from the stage tmpfs at `stage` (not yet in place: only the seed has
    /// touched it) every name deleted below the disk directory since the seed began
    /// that the disk does not have now: the copy of something deleted after it was
    /// copied. A name the disk has again stays (the merge after the switch takes the
    /// newer one), unless it is another directory than the one copied, and is looked
    /// at again by the next call. `seeded`: what the seed recorded. Called once for the
    /// seed's whole run, then right before the switch for the few deletions since.
    /// Returns how many entries went.
    pub fn drop_deleted(&mut self, stage: &Path, seeded: &Baseline) -> anyhow::Result<u64> {
        let (disk_root, root_path) = self.disk_root()?;
        let stage_root =
            std::fs::File::open(stage).with_context(|| format!("opening {}", stage.display()))?;
        let mut gone = std::mem::take(&mut self.again);
        let mut dropped = 0;
        // Until a look finds nothing new: deletions keep coming while these are dropped.
        loop {
            let new = self.watch.drain();
            let last = new.is_empty();
            gone.extend(new.into_iter().map(|g| (g.dir, g.name)));
            for (handle, name) in gone.drain(..) {
                dropped += self.drop_one(
                    (disk_root.as_fd(), &root_path),
                    stage_root.as_fd(),
                    seeded,
                    handle,
                    name,
                )?;
            }
            if last {
                if self.watch.overflowed() {
                    tracing::warn!(
                        "the watch for deletions during the seed overflowed; names deleted on disk meanwhile may stay in RAM until the merge after the switch takes them out"
                    );
                }
                return Ok(dropped);
            }
        }
    }

    /// After the switch: drops from the tmpfs, now at `path` where the application
    /// works, what was deleted on disk between the last [`Self::drop_deleted`] and
    /// the switch, each file only while it is still the seed's copy (changed before
    /// `taken`, a time before the application could see the tmpfs); of a directory,
    /// its copies, and the directory if that empties it. A name the disk has again as
    /// another directory than the one the seed copied, or as another type of entry
    /// (`seeded`: what the seed recorded copying), counts as deleted: the application
    /// sees what the disk holds there once the merge brings it in, never the old
    /// copy again. So do the names the last look found there again, which a second
    /// deletion does not report anew. What this leaves (a deletion still running at
    /// the switch, a copy the application changed in the moment since, a file with
    /// another name, anything below a directory the application changed since: it
    /// may have moved it there) is taken out by the merge that follows
    /// ([`catch_up`]), by the seed's records.
    pub fn drop_after_switch(&mut self, path: &Path, taken: Time, seeded: &Baseline) -> anyhow::Result<u64> {
        let again = std::mem::take(&mut self.again);
        let gone: Vec<(Handle, Vec<u8>)> = again
            .into_iter()
            .chain(self.watch.drain().into_iter().map(|g| (g.dir, g.name)))
            .collect();
        if gone.is_empty() {
            return Ok(0);
        }
        let (disk_root, root_path) = self.disk_root()?;
        let live = openat2(
            nix::fcntl::AT_FDCWD,
            path,
            OpenHow::new()
                .flags(OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
                .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS),
        )
        .with_context(|| format!("opening {}", path.display()))?;
        let mut dropped = 0;
        // Directories the disk no longer has of which something is left in the tmpfs:
        // the copies left keep their records.
        let mut partly = Vec::new();
        // The directories these removals changed (inodes): their ctimes are not the
        // application's.
        let mut ours = std::collections::HashSet::new();
        for (dir, name) in gone {
            let (rel, name) = match self.lacking(disk_root.as_fd(), &root_path, dir, name) {
                Now::Gone(rel, name) => (rel, name),
                Now::Again(rel, name, st, born)
                    if replaced(seeded, &join(&rel, name.as_bytes()), &st, born) =>
                {
                    (rel, name)
                }
                Now::Again(..) | Now::Elsewhere => continue,
            };
            // A directory on the way changed since the switch may be one the
            // application moved there, with older files of its own at that path.
            if !unchanged_since(live.as_fd(), &rel, taken, &ours) {
                continue;
            }
            let Ok(dir) = open_dir_beneath(live.as_fd(), &rel) else {
                continue;
            };
            let dir_ino = stat::fstat(&dir).map(|st| st.st_ino).unwrap_or(0);
            let Ok(st) = stat::fstatat(dir.as_fd(), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            let here = join(&rel, name.as_bytes());
            let what = || format!("removing {}", path.join(OsStr::from_bytes(&here)).display());
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                // Its copies go; what the application made in it since keeps it.
                let went = copy::remove_older(
                    dir.as_fd(),
                    &name,
                    taken,
                    Some(&mut self.unlinked),
                    &copy::Placings::none(),
                )
                .with_context(what)?;
                tracing::debug!(
                    "seed: {} deleted on disk right before the switch: {went} of its copies dropped",
                    String::from_utf8_lossy(&here)
                );
                dropped += went;
                if went > 0 {
                    ours.insert(dir_ino);
                }
                crate::failpoint::hit("seed-dir-dropped", "");
                match stat::fstatat(dir.as_fd(), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                    // What is left of it (the application's, or what it changed in
                    // it): its own record goes (the disk's directory it stood for is
                    // gone, and a deletion the disk made before the application's
                    // change must not undo it), the copies left keep theirs.
                    Ok(now) if now.st_ino == st.st_ino => {
                        if went > 0 {
                            ours.insert(now.st_ino);
                        }
                        self.dropped.names.push(here.clone());
                        partly.push(here);
                    }
                    // Gone, or gone and made again by the application meanwhile
                    // (Apache makes a cache directory again as soon as it caches
                    // into it): nothing of the copy is left.
                    _ => self.dropped.trees.push(here),
                }
                continue;
            }
            if (st.st_ctime, st.st_ctime_nsec) >= taken {
                continue;
            }
            if copy::remove_unchanged(dir.as_fd(), &name, &st).with_context(what)? {
                if st.st_nlink > 1 {
                    self.unlinked.insert(st.st_ino);
                }
                dropped += 1;
                ours.insert(dir_ino);
                self.dropped.trees.push(here);
            }
        }
        if !partly.is_empty() {
            let went = no_copies_below(live.as_fd(), seeded, &partly, taken);
            self.dropped.names.extend(went);
        }
        Ok(dropped)
    }

    /// What was dropped since the last call.
    pub fn take_dropped(&mut self) -> Dropped {
        std::mem::take(&mut self.dropped)
    }

    /// The tmpfs inodes whose other names [`Self::drop_after_switch`] changed the
    /// ctime of (for [`catch_up`]).
    pub fn take_unlinked(&mut self) -> HashSet<u64> {
        std::mem::take(&mut self.unlinked)
    }

    /// The disk directory, open, and its path as this process sees it (what the
    /// watch's directories are found below).
    fn disk_root(&self) -> anyhow::Result<(std::fs::File, Vec<u8>)> {
        let root =
            std::fs::File::open(&self.disk).with_context(|| format!("opening {}", self.disk.display()))?;
        let path = fd_path(root.as_fd()).with_context(|| format!("{} has no path", self.disk.display()))?;
        Ok((root, path))
    }

    /// Where a deletion seen below the disk directory stands now (see [`Now`]).
    fn lacking(&mut self, disk_root: BorrowedFd<'_>, root_path: &[u8], handle: Handle, name: Vec<u8>) -> Now {
        // A directory deleted itself: its own deletion, in its parent, covers what was
        // in it.
        let Some((rel, dir)) = open_handle(disk_root, &handle)
            .ok()
            .filter(|dir| stat::fstat(dir).is_ok_and(|st| st.st_nlink > 0))
            .and_then(|dir| Some((below(root_path, &fd_path(dir.as_fd())?)?, dir)))
        else {
            tracing::debug!(
                "seed: {} deleted on disk in a directory gone or elsewhere",
                String::from_utf8_lossy(&name)
            );
            return Now::Elsewhere;
        };
        // Formatted only when logged: this runs once per deletion on the filesystem.
        let path = || String::from_utf8_lossy(&join(&rel, &name)).into_owned();
        // The same directory reached from the root without a symlink: the path names it
        // in the tmpfs too.
        let Ok(on_disk) = open_dir_beneath(disk_root, &rel) else {
            return Now::Elsewhere;
        };
        let Ok(c_name) = CString::new(name.clone()) else {
            return Now::Elsewhere;
        };
        if !same_inode(dir.as_fd(), on_disk.as_fd()) {
            tracing::debug!("seed: {} deleted on disk, its directory moved", path());
            return Now::Elsewhere;
        }
        match stat::fstatat(on_disk.as_fd(), c_name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Err(Errno::ENOENT) => {
                tracing::debug!(
                    "seed: {} deleted on disk during the seed: dropped from the tmpfs",
                    path()
                );
                Now::Gone(rel, c_name)
            }
            Ok(st) => {
                tracing::debug!("seed: {} deleted on disk during the seed, there again", path());
                self.again.push((handle, name));
                let born = copy::born(on_disk.as_fd(), &c_name);
                Now::Again(rel, c_name, st, born)
            }
            Err(_) => Now::Elsewhere,
        }
    }

    /// Drops `name` in the directory `handle` from the stage if the disk lacks it, or
    /// has another directory there now than the one the seed copied (`seeded`: what
    /// the seed recorded): everything in the copied one was deleted, or it could not
    /// have been, and what the new one holds is brought in after the switch.
    fn drop_one(
        &mut self,
        (disk_root, root_path): (BorrowedFd<'_>, &[u8]),
        stage_root: BorrowedFd<'_>,
        seeded: &Baseline,
        handle: Handle,
        name: Vec<u8>,
    ) -> anyhow::Result<u64> {
        let (rel, name) = match self.lacking(disk_root, root_path, handle, name) {
            Now::Gone(rel, name) => (rel, name),
            Now::Again(rel, name, st, born) if replaced(seeded, &join(&rel, name.as_bytes()), &st, born) => {
                (rel, name)
            }
            Now::Again(..) | Now::Elsewhere => return Ok(0),
        };
        let Ok(in_stage) = open_dir_beneath(stage_root, &rel) else {
            return Ok(0);
        };
        let path = join(&rel, name.as_bytes());
        let removed = copy::remove_entry(in_stage.as_fd(), &name).with_context(|| {
            format!(
                "removing {} from the tmpfs",
                Path::new(OsStr::from_bytes(&path)).display()
            )
        })?;
        if removed > 0 {
            self.dropped.trees.push(path);
        }
        Ok(removed)
    }
}

/// Whether the disk entry `now` at `path`, born at `born` (if known), is another
/// entry than the one the seed copied there (`seeded`: what it recorded): another
/// type, or another directory: another inode, or one born after the copied one's
/// last change (rmdir and mkdir often give the new one the old one's inode
/// number). Everything in a copied directory was deleted then, or moved away with
/// it. (A file made again is left to the merge: the newer of the two wins.)
fn replaced(seeded: &Baseline, path: &[u8], now: &FileStat, born: Option<Time>) -> bool {
    let Some(Mark::Entry(was)) = seeded.get(path) else {
        return false;
    };
    let now = Sig::of(now);
    if was.is_dir() != now.is_dir() {
        return true;
    }
    was.is_dir() && (was.ino != now.ino || born.is_some_and(|b| b > was.ctime))
}

/// Whether every directory from below `root` down to `rel` (a relative path, empty
/// for `root` itself) last changed before `taken`, or is one of `ours` (inodes this
/// process changed): none was moved there, or had a name made or removed in it by
/// the application, since.
fn unchanged_since(
    root: BorrowedFd<'_>,
    rel: &[u8],
    taken: Time,
    ours: &std::collections::HashSet<u64>,
) -> bool {
    let ends = rel
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b == b'/')
        .map(|(i, _)| i)
        .chain((!rel.is_empty()).then_some(rel.len()));
    ends.into_iter().all(|end| {
        stat_beneath(root, &rel[..end])
            .is_ok_and(|st| (st.st_ctime, st.st_ctime_nsec) < taken || ours.contains(&st.st_ino))
    })
}

/// The paths the seed recorded copying below the directories `partly` (relative
/// paths) that the tmpfs at `live` no longer has as the seed's copy: gone, or
/// changed since `taken` (by the application, in the moment after the switch).
/// Their records no longer hold: the disk's entry is gone, so a record would make
/// the application's change (a file it rewrote, a directory it wrote in) a
/// conflict with a deletion the disk made before it. The copies left keep theirs,
/// so that the write-back does not take them for the application's (each record
/// is forgotten alone: the copies below a directory the application wrote in keep
/// theirs).
fn no_copies_below(live: BorrowedFd<'_>, seeded: &Baseline, partly: &[Vec<u8>], taken: Time) -> Vec<Vec<u8>> {
    let partly: std::collections::HashSet<&[u8]> = partly.iter().map(Vec::as_slice).collect();
    let below = |path: &[u8]| {
        path.iter()
            .enumerate()
            .any(|(i, &b)| b == b'/' && partly.contains(&path[..i]))
    };
    let copy = |path: &[u8]| stat_beneath(live, path).is_ok_and(|st| (st.st_ctime, st.st_ctime_nsec) < taken);
    seeded
        .marks
        .iter()
        .filter(|(p, _)| below(p) && !copy(p))
        .map(|(p, _)| p.to_vec())
        .collect()
}

/// Records of the seed's baseline that no longer hold (relative paths).
#[derive(Debug, Default)]
pub struct Dropped {
    /// Each with everything below it.
    pub trees: Vec<Vec<u8>>,
    /// Each alone.
    pub names: Vec<Vec<u8>>,
}

impl Dropped {
    pub fn is_empty(&self) -> bool {
        self.trees.is_empty() && self.names.is_empty()
    }

    pub fn extend(&mut self, more: Dropped) {
        self.trees.extend(more.trees);
        self.names.extend(more.names);
    }
}

/// `base` without its records of `dropped`.
pub fn forget(base: &Baseline, dropped: &Dropped) -> Baseline {
    let names: std::collections::HashSet<&[u8]> = dropped.names.iter().map(Vec::as_slice).collect();
    let trees: std::collections::HashSet<&[u8]> = dropped.trees.iter().map(Vec::as_slice).collect();
    let gone = |path: &[u8]| {
        names.contains(path)
            || trees.contains(path)
            || path
                .iter()
                .enumerate()
                .any(|(i, &b)| b == b'/' && trees.contains(&path[..i]))
    };
    let mut marks = copy::baseline::Marks::with_capacity(base.marks.len(), base.marks.path_bytes());
    for (path, mark) in base.marks.iter().filter(|(p, _)| !gone(p)) {
        marks.insert(path, mark);
    }
    Baseline {
        marks,
        ..base.clone()
    }
}

/// Where a name deleted below the disk directory during the seed stands now.
enum Now {
    /// Not below the disk directory as it is now (or in a directory deleted too).
    Elsewhere,
    /// The disk lacks it (its directory relative to the disk directory, and the name).
    Gone(Vec<u8>, CString),
    /// The disk has it again, as this.
    /// The disk has it again, as this, born then (where the filesystem says).
    Again(Vec<u8>, CString, FileStat, Option<Time>),
}

/// `path` relative to `root` (both absolute), if it is `root` or below it.
fn below(root: &[u8], path: &[u8]) -> Option<Vec<u8>> {
    if path == root {
        return Some(Vec::new());
    }
    let prefix = if root == b"/" { &b""[..] } else { root };
    path.strip_prefix(prefix)?.strip_prefix(b"/").map(<[u8]>::to_vec)
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        return name.to_vec();
    }
    [dir, b"/", name].concat()
}

/// The directory `rel` below `root` (`root` itself when empty), not through a symlink.
fn open_dir_beneath(root: BorrowedFd<'_>, rel: &[u8]) -> nix::Result<OwnedFd> {
    let rel = if rel.is_empty() { &b"."[..] } else { rel };
    openat2(
        root,
        Path::new(OsStr::from_bytes(rel)),
        OpenHow::new()
            .flags(OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS),
    )
}

fn same_inode(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    match (stat::fstat(a), stat::fstat(b)) {
        (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{below, forget, Dropped};
    use crate::copy::baseline::{Mark, Sig};
    use crate::copy::Baseline;

    #[test]
    fn forget_takes_out_what_was_dropped_and_what_is_below_a_tree_only() {
        let sig = Sig {
            ino: 1,
            mode: 0o100644,
            size: 0,
            mtime: (1, 0),
            ctime: (1, 0),
        };
        let mut base = Baseline {
            taken: Some((5, 0)),
            ..Baseline::none()
        };
        for p in ["a", "a/b", "a/b/c", "a/bc", "ab", "x/a/b"] {
            base.marks.insert(p.as_bytes(), Mark::Entry(sig));
        }
        let paths = |dropped: Dropped| {
            let left = forget(&base, &dropped);
            assert_eq!(left.taken, Some((5, 0)));
            let mut paths: Vec<_> = left
                .marks
                .iter()
                .map(|(p, _)| String::from_utf8_lossy(p).into_owned())
                .collect();
            paths.sort();
            paths
        };
        let tree = |p: &str| Dropped {
            trees: vec![p.as_bytes().to_vec()],
            names: Vec::new(),
        };
        assert_eq!(paths(tree("a/b")), ["a", "a/bc", "ab", "x/a/b"]);
        // A name alone keeps what is below it.
        let alone = Dropped {
            trees: Vec::new(),
            names: vec![b"a".to_vec(), b"a/b/c".to_vec()],
        };
        assert_eq!(paths(alone), ["a/b", "a/bc", "ab", "x/a/b"]);
        assert_eq!(paths(Dropped::default()).len(), 6);
    }

    #[test]
    fn below_takes_the_root_and_what_is_under_it_only() {
        assert_eq!(below(b"/a/b", b"/a/b"), Some(vec![]));
        assert_eq!(below(b"/a/b", b"/a/b/c/d"), Some(b"c/d".to_vec()));
        assert_eq!(below(b"/a/b", b"/a/bc"), None);
        assert_eq!(below(b"/a/b", b"/a"), None);
        assert_eq!(below(b"/", b"/x"), Some(b"x".to_vec()));
        assert_eq!(below(b"/", b"/"), Some(vec![]));
    }
}
