//! Write-back: a three-way merge of the live tmpfs into the on-disk directory (reached
//! through its private side bind) against the [`Baseline`] of the last seed or
//! write-back, writing only what changed: see [`sync_tree`].

mod compare;
mod dir;
mod entry;
mod leaf;
mod remove;
mod rule;
mod tracked;

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::sys::stat::{self, FileStat};

use super::baseline::{self, Baseline, Sig, Time};
use super::durable::{DstDir, Durable};
use super::error::{dst_err, src_err, CopyError, Failed, Freed};
use super::journal::Journal;
use super::ops::{open_root_dir, RelPath, Reporter, Transfer};
use super::place::DiskDeletions;
use super::scan::{self, Name, ScanEvent, SrcEntry};
use super::settle;
use super::temp::TempNames;
use compare::Pairing;
pub(super) use tracked::Filter;
pub use tracked::{Barriers, Dirty};

/// Removes `name` from `dir`, a directory with everything below it, without following
/// symlinks or entering another filesystem; returns how many entries went.
pub fn remove_entry(dir: std::os::fd::BorrowedFd<'_>, name: &std::ffi::CStr) -> std::io::Result<u64> {
    let dev = stat::fstat(dir)?.st_dev;
    remove::plain_remove(dir, name, None, dev).map_err(|f| f.err)
}

/// Removes from the directory `name` in `dir`, where an application works, what was
/// last changed before `before`, and the directories that end up empty (see
/// `remove::remove_older`); returns how many entries went. `linked`: where to note
/// the inodes of removed files with another name (see [`Merge::touched`]).
pub fn remove_older(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    before: baseline::Time,
    linked: Option<&mut HashSet<u64>>,
    placed: &super::Placings,
) -> std::io::Result<u64> {
    let dev = stat::fstat(dir)?.st_dev;
    remove::remove_older(dir, name, before, dev, (None, linked, placed)).map_err(|f| f.err)
}

/// [`remove_older`] of the directory `name` the application deleted as a whole before
/// `before` (an overlay's whiteout), while it is still the directory `ino`: entered
/// whatever its own ctime says, since a change the application made in it since only
/// keeps what it changed.
pub fn remove_older_deleted(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    ino: u64,
    before: baseline::Time,
    placed: &super::Placings,
) -> std::io::Result<u64> {
    let dev = stat::fstat(dir)?.st_dev;
    remove::remove_older(dir, name, before, dev, (Some(ino), None, placed)).map_err(|f| f.err)
}

/// Removes the non-directory `name` from `dir`, where an application works, if it is
/// still the entry `seen` (renamed away, checked, then unlinked or put back); returns
/// whether it went.
pub fn remove_unchanged(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    seen: &FileStat,
) -> nix::Result<bool> {
    super::place::remove_seen(dir, name, super::place::Seen::of(seen), &TempNames::new().next())
}

/// What a [`sync_tree`] did. Every source entry below the root counts once, in
/// `files_written`, `metadata_updated`, `dirs_created`, `links_written`,
/// `specials_written`, `unchanged` or `kept_disk`; every removed destination entry
/// (each entry of a removed tree) in `deleted`, or in `temp_removed` for the
/// temporaries an interrupted run left behind.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct SyncStats {
    /// Regular files written (new, or rewritten because type, size or mtime differed).
    pub files_written: u64,
    /// Data bytes copied into them (holes excluded).
    pub bytes_written: u64,
    /// Files and directories whose owner, mode, times or attributes were updated in
    /// place.
    pub metadata_updated: u64,
    pub deleted: u64,
    pub dirs_created: u64,
    /// Symlinks written, and hard links made to the inode of an earlier name.
    pub links_written: u64,
    /// FIFOs, sockets and device nodes written.
    pub specials_written: u64,
    pub unchanged: u64,
    pub temp_removed: u64,
    /// Names where the disk side won and was left exactly as it is: it changed (or
    /// was deleted) on disk since the baseline while the RAM did not, or it changed
    /// later than the RAM, or the RAM deleted a name no baseline has.
    pub kept_disk: u64,
    /// Names changed on both sides since the baseline: decided for the later change
    /// (also counted in `kept_disk` when that was the disk's).
    pub conflicts: u64,
    /// Disk directories whose names the baseline stood for: neither listed nor their
    /// unchanged entries stated (see [`Baseline::unchanged_dir`]).
    pub dirs_trusted: u64,
    /// The pass knew which RAM directories changed (see [`Dirty`]) and read only
    /// those; otherwise it read the whole tree.
    pub tracked: bool,
    /// Directories a tracked pass did not read, with everything below them.
    pub dirs_skipped: u64,
    /// Why a pass that was told what changed read the whole tree after all (the
    /// write-back's `whole_tree` says so).
    #[serde(skip)]
    pub whole_tree_after: Option<&'static str>,
}

impl SyncStats {
    /// Adds what an earlier pass of the same write-back did.
    fn add(&mut self, earlier: &SyncStats) {
        self.files_written += earlier.files_written;
        self.bytes_written += earlier.bytes_written;
        self.metadata_updated += earlier.metadata_updated;
        self.deleted += earlier.deleted;
        self.dirs_created += earlier.dirs_created;
        self.links_written += earlier.links_written;
        self.specials_written += earlier.specials_written;
        self.temp_removed += earlier.temp_removed;
        self.conflicts += earlier.conflicts;
    }

    /// Names the pass has dealt with so far, whatever it did with them.
    pub fn compared(&self) -> u64 {
        self.files_written
            + self.metadata_updated
            + self.deleted
            + self.dirs_created
            + self.links_written
            + self.specials_written
            + self.unchanged
            + self.kept_disk
    }
}

/// What [`sync_tree`] returns: what it did, and the baseline for the next pass.
#[derive(Debug, Clone)]
pub struct Synced {
    pub stats: SyncStats,
    pub baseline: Baseline,
    /// The pass found nothing changed on either side and read nothing: `baseline`
    /// is the one it was given, and need not be saved again (see [`unchanged`]).
    pub kept: bool,
}

/// Makes the disk directory `dst` (reached through a private side bind) hold what the
/// application wrote to the tmpfs `src`, without losing what it wrote to `dst` and
/// without bringing back what it deleted on either side: a three-way merge against
/// `base`, the baseline of the last seed or write-back, writing only what changed. The
/// metadata of the `dst` root directory itself is left alone.
///
/// # The rule for each name
///
/// See [`baseline::decide`] and docs/writeback.md: a side that did not change since
/// the baseline follows the side that did (the RAM's new version is written, its
/// deletion deleted; the disk's is left as it is); a name in no baseline is never
/// deleted; when both changed, the later change wins and it is counted as a conflict.
/// With [`Baseline::none`] (a mount of an older tmpfsctl, a lost state directory) the
/// pass deletes nothing. Directories present on both sides are always entered and
/// their contents merged name by name; their own metadata follows the RAM's where the
/// RAM directory changed since the baseline, and stays the disk's otherwise.
///
/// Source entries that vanish while the sync runs are skipped (left as they are on
/// disk, their baseline records kept), so a busy application cannot fail it; any other
/// error aborts the sync, leaving every destination name with its complete old or new
/// contents, and the old baseline stays valid for the next pass. Owners can only be
/// preserved as root.
///
/// `progress` gets the running totals every 1000 entries or 100 ms, whichever comes
/// first (also during a long file), and once more at the end.
///
/// # What is compared
///
/// Both directories of a level are listed with readdir, sorted by name and merged, so
/// a level costs one listing per side plus one `fstatat` per entry and side (none for
/// a name the destination lacks), and one attribute listing per side for entries that
/// are otherwise equal (`listxattrat(2)`, or `llistxattr` through `/proc` before Linux
/// 6.13). A pair of entries the RAM side wins is then:
///
/// - regular files: *rewritten* when type, size or mtime (to the nanosecond) differ;
///   otherwise, when mode, owner, group or copied extended attributes (and with them
///   ACLs) differ, their metadata is *updated in place*, without touching the data;
/// - symlinks: rewritten when their target bytes differ; FIFOs, sockets and devices:
///   recreated when type or device number differ. Both have no data, so a change of
///   their metadata (owner, times, attributes; mode for nodes) recreates them too,
///   which keeps every in-place change on an inode that could be opened and checked;
/// - directories: created when missing, entered, and their mode, owner, mtime and
///   attributes made equal after their contents (which bump the mtime);
/// - hard links: names of one source inode end up as names of one destination inode.
///   The first name seen is compared as above; the others are linked to it unless they
///   already are. A multiply-linked inode is never changed in place: another of its
///   names might lie outside the tree.
///
/// Atimes are not compared (reading a cached file would make it "changed"), but they
/// are copied with everything that is written. A disk directory that has to go (the
/// RAM deleted it, or has a non-directory there) is emptied by the same rule, name by
/// name: what the disk changed since the baseline stays, and so does the directory.
///
/// The one race left is the application changing a disk entry between its `fstatat`
/// and the rename or unlink that replaces it (no rename can compare and swap): that
/// window is the time one file takes to be written and `fsync`ed. A name the disk
/// lacked is put in place with `RENAME_NOREPLACE`, so one created meanwhile wins.
///
/// # Threads
///
/// The comparison is nothing but system calls, so it is split by side: the source is
/// read ahead on the scan's thread (`scan`: listings, stats, attribute lists, symlink
/// targets, in the walk's order), the destination by the walk, which decides and
/// writes. `fsync` waits for the disk, so finished temporaries go to a few workers
/// (`durable`) that make each durable and rename it into place; concurrent `fsync`s share
/// the device's cache flushes and overlap with the walk. A directory's metadata is
/// applied once the last rename into it landed, then the directory is `fsync`ed.
/// Hard-linked files and replaced directories are put in place by the walk itself, as
/// later names depend on them.
///
/// # Crash safety
///
/// Data is never written into an existing destination inode. A file, symlink or node
/// is created under a temporary name ([`TEMP_PREFIX`](super::TEMP_PREFIX) and random hex) in its final
/// directory with `O_CREAT|O_EXCL|O_NOFOLLOW`, filled, given owner, attributes, mode
/// and times, made durable (its `fsync`, or a `syncfs` for a worker's batch, see
/// `durable`), and only then `renameat`ed over the final name, which
/// atomically replaces the old entry. Whatever kills the process (or the machine), a
/// name refers either to the complete old or to the complete new inode. (Symlinks and
/// nodes cannot be opened to be `fsync`ed; a journaling filesystem commits their
/// creation no later than the rename that follows it.) Every directory that got names
/// created, replaced or removed is `fsync`ed when it is done, so the sync is durable
/// when `sync_tree` returns; the caller then saves the new baseline. Leftover
/// temporaries of an interrupted run are removed by the next one.
///
/// # Symlink safety
///
/// Every destination directory is opened relative to its parent with
/// `O_NOFOLLOW|O_DIRECTORY`, every other destination operation is relative to such a
/// descriptor and does not follow a symlink in the last component (`*at` calls with
/// `AT_SYMLINK_NOFOLLOW`, `O_NOFOLLOW`, `renameat`, `unlinkat`, `listxattrat`, `l*xattr`
/// through `/proc/self/fd/<dir>/<name>`). A symlink planted in the destination is therefore
/// just an entry of the wrong type: it is replaced (unlinked or renamed over), never
/// followed. In-place metadata updates go through a descriptor that was checked to be
/// the same, singly-linked regular file that was compared. Directories of another
/// filesystem are neither entered nor removed, on either side.
///
/// # Reserved names
///
/// Names starting with [`TEMP_PREFIX`](super::TEMP_PREFIX) are reserved for the write-back's temporaries:
/// they are skipped in the source and removed from the destination.
///
/// `dst` must not lie inside `src` or the other way round.
pub fn sync_tree(
    src: &Path,
    dst: &Path,
    mut merge: Merge<'_>,
    mut progress: Option<&mut dyn FnMut(&SyncStats)>,
) -> Result<Synced, CopyError> {
    let (journal, deletions, copied, barriers) =
        (merge.journal, merge.deletions, merge.copied, merge.barriers);
    let mut own = HashSet::new();
    let touched = merge.touched.take().unwrap_or(&mut own);
    // An earlier process's, from the journal.
    touched.extend(&merge.base.touched);
    let first = sync_pass(
        src,
        dst,
        merge,
        progress.as_mut().map(|p| &mut **p as &mut dyn FnMut(&SyncStats)),
        touched,
    )?;
    if !first.linked_changed {
        return Ok(first.synced);
    }
    tracing::info!("{LINKED_CHANGED}: reading the whole tree");
    let again = Merge {
        base: &first.synced.baseline,
        journal,
        deletions,
        dirty: None,
        barriers,
        copied,
        touched: None,
    };
    // The first pass's own unlinks changed the ctimes of inodes it left linked
    // elsewhere: no sign of the application's change for the second either.
    let mut full = sync_pass(src, dst, again, progress, touched)?.synced;
    full.stats.add(&first.synced.stats);
    full.stats.whole_tree_after = Some(LINKED_CHANGED);
    Ok(full)
}

/// Why a tracked pass reads the whole tree again after it met a changed
/// hard-linked file ([`SyncStats::whole_tree_after`]).
pub const LINKED_CHANGED: &str =
    "a hard-linked file changed, whose other names may lie in directories the tracked pass did not read";

/// A pass; whether it was tracked and met a changed hard-linked file.
struct Pass {
    synced: Synced,
    linked_changed: bool,
}

fn sync_pass(
    src: &Path,
    dst: &Path,
    merge: Merge<'_>,
    progress: Option<&mut dyn FnMut(&SyncStats)>,
    touched: &mut HashSet<u64>,
) -> Result<Pass, CopyError> {
    let Merge {
        base,
        journal,
        deletions,
        dirty,
        barriers,
        copied,
        ..
    } = merge;
    let (src_fd, src_st) = open_root_dir(src, true)?;
    let barriers = barriers.and_then(|b| b());
    let (dst_fd, dst_st) = open_root_dir(dst, false)?;
    let dst_root = dst_fd.try_clone().map_err(|e| {
        dst_err("open directory")(Errno::from_raw(e.raw_os_error().unwrap_or(0))).at(PathBuf::from("."))
    })?;
    // RAM changes from here on have a ctime at or after it: the next pass's baseline.
    let taken = baseline::now_after_tick();
    // Asked only now: it must hold every change before `taken`, which the next pass
    // will not look for.
    let filter = dirty
        .and_then(|ask| ask())
        .and_then(|d| Filter::new(base, &d, dst_fd.as_fd(), taken));
    if let Some(stats) = filter
        .as_ref()
        .filter(|_| copied.is_none() && touched.is_empty())
        .and_then(|f| unchanged(base, f, &dst_st))
    {
        return Ok(Pass {
            synced: Synced {
                stats,
                baseline: base.clone(),
                kept: true,
            },
            linked_changed: false,
        });
    }
    // One index for the trusted listings and the skipped subtrees.
    let by_dir = (base.listed_after.is_some() || filter.is_some()).then(|| base.marks.by_dir());
    std::thread::scope(|scope| {
        let mut syncer = Syncer {
            base,
            journal,
            deletions,
            copied,
            barriers,
            // Most records come back as they were: shared with the old baseline, not
            // copied.
            marks: baseline::Marks::next_of(&base.marks),
            by_dir,
            tracked: filter.is_some(),
            taken,
            reporter: Reporter::new(progress),
            dst_dev: dst_st.st_dev,
            rel: RelPath::default(),
            links: HashMap::new(),
            claimed: HashSet::new(),
            touched: std::mem::take(touched),
            linked: std::cell::OnceCell::new(),
            dst_root: dst_fd.try_clone().map_err(|e| {
                dst_err("open directory")(Errno::from_raw(e.raw_os_error().unwrap_or(0)))
                    .at(PathBuf::from("."))
            })?,
            transfer: Transfer::default(),
            temps: TempNames::new(),
            scan: scan::start(scope, src_fd, src_st, filter.as_ref(), base.taken),
            durable: Durable::start(scope, journal, deletions),
            waiting: HashMap::new(),
            linked_changed: false,
            deferred: Vec::new(),
            deferred_meta: Vec::new(),
            skipped: HashSet::new(),
        };
        syncer.reporter.stats.tracked = syncer.tracked;
        let walked = syncer.run(dst_fd);
        let complete = syncer.durable.drain();
        let worker = syncer.durable.failed();
        let space_only = walked
            .as_ref()
            .err()
            .into_iter()
            .chain(&worker)
            .all(CopyError::is_no_space);
        let walked = match walked.err().or(worker) {
            // A worker panicked (the scope passes it on): its copies may not be in
            // place, so no old name goes.
            failed if !complete => failed.map_or(Ok(()), Err),
            None => {
                crate::failpoint::hit("before-removals", "");
                open_root_dir(src, true).and_then(|(src_root, _)| {
                    // A file the RAM moved after the answer, from a name to remove
                    // or replace into a directory this pass did not read, is on no
                    // disk name once that name goes: nothing goes, and a whole pass
                    // follows. (A name replaced went already: the whole pass writes
                    // the moved file before the next removal.)
                    let s = &syncer.reporter.stats;
                    let destroyed = s.files_written + s.links_written + s.specials_written + s.deleted;
                    let unread = filter
                        .as_ref()
                        .filter(|_| !syncer.deferred.is_empty() || destroyed > 0)
                        .and_then(|f| f.changed_unread(&syncer.skipped, src_root.as_fd()));
                    if let Some(dir) = unread {
                        return Err(CopyError::ChangedUnread { dir: rel_path(&dir) });
                    }
                    syncer.remove_deferred(dst_root.as_fd())?;
                    syncer.apply_deferred_meta(src_root.as_fd(), dst_root.as_fd())
                })
            }
            // Out of space: the removals free some for another pass, but not of a
            // file the RAM may have moved ([`Syncer::spare_moved`]). Directories
            // the walk did not finish got no `fsync` for the renames into them: one
            // `syncfs` first.
            Some(e) if space_only => {
                let src_root = open_root_dir(src, true).ok().map(|(fd, _)| fd);
                syncer.spare_moved(src_root, dst_root.as_fd());
                let removed = nix::unistd::syncfs(dst_root.as_fd())
                    .map_err(|errno| dst_err("syncfs")(errno).at(PathBuf::from(".")))
                    .and_then(|()| syncer.remove_deferred(dst_root.as_fd()));
                match removed {
                    Ok(0) => Err(e),
                    Ok(removed) => Err(CopyError::SpaceFreed(Box::new(Freed { error: e, removed }))),
                    Err(also) => {
                        tracing::debug!(
                            "write-back: after running out of space, removing what the RAM deleted: {also}"
                        );
                        Err(e)
                    }
                }
            }
            Some(e) => Err(e),
        };
        let Syncer {
            mut reporter,
            durable,
            scan,
            marks,
            linked_changed,
            touched: changed,
            ..
        } = syncer;
        // Kept for a pass that starts again, whatever this one's end.
        *touched = changed;
        // A scan still running stops at its next event.
        drop(scan);
        let finished = durable.finish(walked.err())?;
        // Written, but the destination got the name first: the application's stays.
        reporter.stats.files_written -= finished.not_placed;
        reporter.stats.bytes_written += finished.bytes_written;
        reporter.stats.kept_disk += finished.not_placed;
        // The files put in place hold over the walk's records (a file is recorded
        // once there). A full first pass puts nearly every record there: the walk's
        // are then added to those, not copied.
        let mut marks = if finished.placed.len() > marks.len() {
            let mut placed = finished.placed;
            for (path, mark) in marks.iter() {
                if placed.get(path).is_none() {
                    placed.insert(path, mark);
                }
            }
            placed
        } else {
            let mut marks = marks;
            for (path, mark) in finished.placed.iter() {
                marks.insert(path, mark);
            }
            marks
        };
        for (path, mark) in finished.kept.iter() {
            marks.insert(path, mark);
        }
        reporter.report();
        let mut baseline = Baseline {
            taken: Some(taken),
            marks,
            ..Baseline::none()
        };
        settle::settle(&mut baseline, dst_root.as_fd(), taken);
        settle::relinked(&mut baseline, dst_root.as_fd(), touched);
        if linked_changed {
            // The pass did not look at every name such a file has: the next pass
            // must take every change since the old baseline as a change.
            baseline.taken = base.taken;
        }
        Ok(Pass {
            synced: Synced {
                stats: reporter.stats,
                baseline,
                kept: false,
            },
            linked_changed,
        })
    })
}

/// A tracked pass with nothing to do, when the tracker saw no change in RAM since
/// `base` was taken, no disk directory `base` records changed (`filter` enters only
/// the root), the disk root's own listing did not change since (its ctime), and
/// `base` holds nothing replayed from a journal (what that establishes must be
/// saved): a full pass would only confirm every record. Its stats, or `None`.
///
/// The disk root's ctime is compared by whole seconds: a filesystem that keeps
/// them so (ext4 with small inodes, FAT, a server's clock) stores a change in
/// the second of `taken` as earlier than `taken`.
///
/// `base` is then kept as it is, its time too: the tracker is asked again for every
/// change since it, which includes this moment's.
fn unchanged(base: &Baseline, filter: &Filter, dst_root: &nix::sys::stat::FileStat) -> Option<SyncStats> {
    let taken = base.taken?;
    if base.replayed || !filter.nothing_changed() || baseline::Sig::of(dst_root).ctime.0 >= taken.0 {
        return None;
    }
    Some(SyncStats {
        unchanged: base.marks.len() as u64,
        tracked: true,
        dirs_skipped: filter.known_dirs() as u64,
        ..SyncStats::default()
    })
}

/// What a write-back pass merges against, besides the two trees.
pub struct Merge<'a> {
    /// The last pass's baseline.
    pub base: &'a Baseline,
    /// Where names the pass creates are recorded (see [`super::journal`]).
    pub journal: Option<&'a Journal>,
    /// Deletions on the disk side since the RAM side last changed.
    pub deletions: Option<&'a Mutex<dyn DiskDeletions + Send>>,
    /// Asked once the pass has its time: the RAM directories changed since `base`
    /// was taken, if a tracker knows them. `None` (or an answer of `None`): the pass
    /// reads the whole tree.
    pub dirty: Option<&'a mut dyn FnMut() -> Option<Dirty>>,
    /// What the tracker's barriers did to the RAM root's ctime, asked once the pass
    /// opened the root (a pass's own barrier comes after).
    pub barriers: Option<&'a dyn Fn() -> Option<Barriers>>,
    /// The destination is a fresh copy of the source (a seed's), made before this
    /// baseline's time, which records the source entries as they were copied (see
    /// [`Syncer::copy_outdated`]).
    pub copied: Option<&'a Baseline>,
    /// Destination inodes whose ctime this process changed before the pass, by
    /// unlinking another of their names: not a change of the application's. The pass
    /// adds the ones it changes, also when it fails, for a pass that starts again.
    pub touched: Option<&'a mut HashSet<u64>>,
}

/// The destination inode standing for a multiply-linked source inode.
struct Group {
    /// Destination path (relative) of its first name, for the others to link to.
    path: Box<[u8]>,
    ino: u64,
    /// Names still expected; the record is dropped at zero to bound memory.
    remaining: libc::nlink_t,
}

/// One directory pair being synced.
struct Frame {
    src: OwnedFd,
    dst: Arc<DstDir>,
    steps: std::vec::IntoIter<Pairing>,
    /// The source directory's, applied after the contents; `None` for the root, whose
    /// metadata belongs to the caller.
    meta: Option<FileStat>,
    /// The destination directory's before the sync touched it; `None` if created.
    before: Option<FileStat>,
    /// Names in `dst` were created, replaced or removed: fsync it when done.
    changed: bool,
    /// When the RAM deleted a name this directory lacks: its ctime as scanned.
    ram_deleted_at: Time,
    /// When the disk deleted a name this directory lacks: its ctime before the pass,
    /// or, for a directory the disk deleted, when that happened.
    disk_deleted_at: Time,
    /// Created only to hold what the RAM wrote after the disk deleted the directory:
    /// removed again from its parent, under its name, if that was nothing, and
    /// remembered as deleted.
    tentative: Option<Tentative>,
    /// The RAM side's metadata wins (see [`Verdict`](baseline::Verdict)).
    ram_meta: bool,
    /// The disk directory kept its names since the baseline, whose records stand for
    /// its listing ([`Baseline::unchanged_dir`]).
    trusted: bool,
    /// Neither this RAM directory nor any above it was moved since the baseline, so
    /// its names that did not change hold what they held then: a directory renamed or
    /// exchanged in RAM gets a new ctime, its entries (and their subdirectories) do
    /// not. Without a tracker, any change of the directory's ctime counts as a move.
    ram_kept: bool,
    /// The tracker saw this directory, or one above it, created or moved in: its
    /// names are new at their paths whatever their ctimes say.
    new: bool,
    rel_len: usize,
}

/// A directory the walk is done with, to be finished once every rename into it landed.
struct Left {
    src: OwnedFd,
    dst: Arc<DstDir>,
    meta: Option<FileStat>,
    before: Option<FileStat>,
    changed: bool,
    tentative: Option<Tentative>,
    ram_meta: bool,
    rel: Vec<u8>,
}

/// A directory the disk deleted, made again for what the RAM wrote in it since.
struct Tentative {
    /// When the disk deleted it.
    at: Time,
    parent: Arc<DstDir>,
    name: CString,
    went: Went,
}

/// How a directory the disk deleted went.
enum Went {
    /// Before this pass: as a whole, at that time (what the RAM wrote in it earlier
    /// goes).
    Before,
    /// While this pass ran: the application deleted it (or one above it). It could
    /// only because it was empty on disk, so it never saw, and never deleted, what the
    /// RAM holds in it that the disk did not have: those names are the RAM's, but for
    /// the ones the application deleted there itself (it may have made a name again on
    /// disk, then deleted it), which the deletion watch knows by the deleted
    /// directory's handle ([`DstDir::gone`]). Without that handle (a kernel without
    /// `FAN_REPORT_TARGET_FID`) it counts as `Before`.
    Meanwhile,
    /// While this pass ran, moved away by the application (the directories it went
    /// to, `O_PATH`): as `Meanwhile`, but a name the moved directory holds is the
    /// application's later version there, and the RAM's older one goes (a retry
    /// after a failed `down` wrote it back at the old path: a hunting helper's
    /// probe, 5 of 5).
    Moved(Vec<std::os::fd::OwnedFd>),
}

struct Syncer<'p, 'b> {
    /// The last pass's baseline, and the next one being built.
    base: &'b Baseline,
    /// Where each name this pass creates on disk is recorded at once.
    journal: Option<&'b Journal>,
    deletions: Option<&'b Mutex<dyn DiskDeletions + Send>>,
    copied: Option<&'b Baseline>,
    barriers: Option<Barriers>,
    /// The next baseline's records, in the order made (the last of a path holds).
    marks: baseline::Marks,
    /// The baseline's records by directory: the names of each disk directory where
    /// they may be trusted, and in a tracked pass the skipped subtrees to carry over.
    by_dir: Option<baseline::ByDir<'b>>,
    /// The pass reads only the RAM directories that changed (see [`Dirty`]).
    tracked: bool,
    /// This pass's time: the tracker was asked after it, and knows every change
    /// before it.
    taken: Time,
    reporter: Reporter<'p, SyncStats>,
    dst_dev: u64,
    rel: RelPath,
    /// Source inode (dev, ino) → its destination inode, for multiply-linked inodes.
    links: HashMap<(u64, u64), Group>,
    /// Destination inodes that stand for a group: nothing else may keep them.
    claimed: HashSet<u64>,
    /// Multiply-linked destination inodes this pass unlinked or replaced a name of:
    /// that changed their ctime, which is then no sign of the application's change.
    touched: HashSet<u64>,
    /// Disk inodes the baseline records under two names or more, with those names
    /// (see [`Syncer::disk_sig`]): built at the first need.
    linked: std::cell::OnceCell<HashMap<u64, Vec<Box<[u8]>>>>,
    /// The disk directory's root, to look up other names of a linked inode.
    dst_root: OwnedFd,
    transfer: Transfer,
    temps: TempNames,
    /// The source, read ahead on the scan's thread.
    scan: Receiver<ScanEvent>,
    durable: Durable,
    /// Directories left with renames still pending, by [`DstDir::key`].
    waiting: HashMap<usize, Left>,
    /// A tracked pass met a multiply-linked file changed since the baseline.
    linked_changed: bool,
    /// Names the RAM deleted, removed once the walk's copies are durable.
    deferred: Vec<remove::Deferred>,
    /// Directories' owner and mode that would open what the removals take away,
    /// applied after them.
    deferred_meta: Vec<remove::DeferredMeta>,
    /// The RAM directories a tracked pass did not read (see `tracked`).
    skipped: HashSet<Box<[u8]>>,
}

/// What syncing one step did to the parent directory and where the walk goes next.
#[derive(Default)]
struct Stepped {
    enter: Option<Frame>,
    /// Names in the parent were created, replaced or removed.
    changed: bool,
}

impl Stepped {
    fn changed() -> Self {
        Stepped {
            enter: None,
            changed: true,
        }
    }
}

fn vanished(f: &Failed) -> bool {
    f.errno() == Some(libc::ENOENT)
}

fn rel_path(rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        PathBuf::from(".")
    } else {
        PathBuf::from(OsStr::from_bytes(rel))
    }
}

fn ctime(st: &FileStat) -> Time {
    Sig::of(st).ctime
}

impl Syncer<'_, '_> {
    fn run(&mut self, dst: OwnedFd) -> Result<(), CopyError> {
        let at_root = |f: Failed| f.at(PathBuf::from("."));
        let root = match self.next_event()? {
            ScanEvent::Enter { fd, st, entries, .. } => {
                let dst_st = stat::fstat(&dst).map_err(dst_err("stat")).map_err(at_root)?;
                let mut frame = self
                    .frame(fd, entries, DstDir::new(dst, Vec::new()), None, None, None)
                    .map_err(at_root)?;
                frame.ram_deleted_at = Barriers::undo(self.barriers, ctime(&st));
                frame.disk_deleted_at = ctime(&dst_st);
                // The tmpfs root itself is never renamed.
                frame.ram_kept = true;
                frame
            }
            _ => unreachable!("the scan starts with the root"),
        };
        let mut stack = vec![root];
        while let Some(top) = stack.last_mut() {
            let Some(step) = top.steps.next() else {
                let done = stack.pop().expect("the loop runs only while a frame is stacked");
                self.expect_leave()?;
                self.leave(done).map_err(|f| f.at(self.rel.path(None)))?;
                if let Some(parent) = stack.last() {
                    self.rel.truncate(parent.rel_len);
                }
                continue;
            };
            let outcome = match self.step(&stack, &step) {
                Ok(outcome) => outcome,
                Err(Stop::Failed(f)) => {
                    let (Pairing::Remove {
                        name: Name { name, .. },
                        ..
                    }
                    | Pairing::Sync {
                        entry: SrcEntry { name, .. },
                        ..
                    }) = &step;
                    return Err(f.at(self.rel.path(Some(name))));
                }
                Err(Stop::Error(e)) => return Err(e),
            };
            let top = stack.last_mut().expect("step leaves the stack as it was");
            top.changed |= outcome.changed;
            if let Some(child) = outcome.enter {
                stack.push(child);
            }
            self.reporter.stats.bytes_written += self.durable.take_bytes_written();
            self.reporter.entry_done();
            self.finish_landed(false)?;
        }
        self.finish_landed(true)
    }

    /// The scan's next event; its errors end the walk.
    fn next_event(&mut self) -> Result<ScanEvent, CopyError> {
        match self.scan.recv() {
            Ok(ScanEvent::Failed(f, path)) => Err(f.at(path)),
            Ok(event) => Ok(event),
            Err(_) => Err(src_err("read")(Errno::EPIPE).at(self.rel.path(None))),
        }
    }

    fn expect_leave(&mut self) -> Result<(), CopyError> {
        match self.next_event()? {
            ScanEvent::Leave => Ok(()),
            _ => unreachable!("the scan walks the directories the walk walks"),
        }
    }

    /// Passes over the scan's events for a directory that is not walked after all,
    /// its `Enter` already taken.
    fn skip_scanned(&mut self) -> Result<(), CopyError> {
        let mut depth = 1;
        while depth > 0 {
            match self.next_event()? {
                ScanEvent::Enter { .. } => depth += 1,
                ScanEvent::Leave => depth -= 1,
                ScanEvent::Gone | ScanEvent::Failed(..) => {}
            }
        }
        Ok(())
    }

    /// Finishes the directories whose renames all landed; with `all`, waits for every
    /// one still waiting.
    fn finish_landed(&mut self, all: bool) -> Result<(), CopyError> {
        loop {
            if let Some(error) = self.durable.failed() {
                return Err(error);
            }
            let key = if all && !self.waiting.is_empty() {
                self.durable.done.recv().ok()
            } else {
                self.durable.done.try_recv().ok()
            };
            let Some(key) = key else { return Ok(()) };
            let left = self
                .waiting
                .remove(&key)
                .expect("only left directories are announced");
            self.finish_dir(&left).map_err(|f| f.at(rel_path(&left.rel)))?;
        }
    }
}

/// Why a step stopped the walk: a failure at the step's path, or an error that
/// already has its path (from the scan).
enum Stop {
    Failed(Failed),
    Error(CopyError),
}

impl From<Failed> for Stop {
    fn from(f: Failed) -> Self {
        Stop::Failed(f)
    }
}

impl From<CopyError> for Stop {
    fn from(e: CopyError) -> Self {
        Stop::Error(e)
    }
}
