//! Write-back: a three-way merge of the live tmpfs into the on-disk directory (reached
//! through its private side bind) against the [`Baseline`] of the last seed or
//! write-back, writing only what changed: see [`sync_tree`].

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, FileStat, Mode, SFlag};
use nix::unistd::{self, UnlinkatFlags};

use super::baseline::{self, Baseline, Disk, Mark, Ram, Sig, Time, Verdict};
use super::durable::{DstDir, Durable, Job};
use super::error::{dst_err, src_err, CopyError, Failed};
use super::journal::Journal;
use super::ops::{
    file_type, link_to_first_copy, open_dst_dir, open_root_dir, open_src, open_src_typed, permissions,
    RelPath, Reporter, Transfer,
};
use super::place::{deleted, put_in_place, remove_seen, DiskDeletions, Place, Placed, Seen};
use super::scan::{self, read_names, Event, Name, SrcEntry};
use super::settle::{self, UNTRUSTED};
use super::temp::{create_temp, is_temp, Temp, TempNames};
use super::xattrs::{self, XattrTarget};

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
}

/// What [`sync_tree`] returns: what it did, and the baseline for the next pass.
#[derive(Debug, Clone)]
pub struct Synced {
    pub stats: SyncStats,
    pub baseline: Baseline,
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
/// their contents merged name by name; their own metadata follows the RAM's.
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
/// (`durable`) that `fsync` each and rename it into place; concurrent `fsync`s share
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
/// and times, `fsync`ed, and only then `renameat`ed over the final name, which
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
    merge: Merge<'_>,
    progress: Option<&mut dyn FnMut(&SyncStats)>,
) -> Result<Synced, CopyError> {
    let Merge {
        base,
        journal,
        deletions,
    } = merge;
    let (src_fd, src_st) = open_root_dir(src, true)?;
    let (dst_fd, dst_st) = open_root_dir(dst, false)?;
    let dst_root = dst_fd.try_clone().map_err(|e| {
        dst_err("open directory")(Errno::from_raw(e.raw_os_error().unwrap_or(0))).at(PathBuf::from("."))
    })?;
    // RAM changes from here on have a ctime at or after it: the next pass's baseline.
    let taken = baseline::now_after_tick();
    std::thread::scope(|scope| {
        let mut syncer = Syncer {
            base,
            journal,
            deletions,
            marks: baseline::Marks::with_capacity(base.marks.len(), 0),
            disk_names: if base.listed_after.is_some() {
                base.names_by_dir()
            } else {
                HashMap::new()
            },
            reporter: Reporter::new(progress),
            dst_dev: dst_st.st_dev,
            rel: RelPath::default(),
            links: HashMap::new(),
            claimed: HashSet::new(),
            touched: HashSet::new(),
            transfer: Transfer::default(),
            temps: TempNames::new(),
            scan: scan::start(scope, src_fd, src_st),
            durable: Durable::start(scope, journal, deletions),
            waiting: HashMap::new(),
        };
        let walked = syncer.run(dst_fd);
        let Syncer {
            mut reporter,
            durable,
            scan,
            mut marks,
            ..
        } = syncer;
        // A scan still running stops at its next event.
        drop(scan);
        let finished = durable.finish(walked.err())?;
        // Written, but the destination got the name first: the application's stays.
        reporter.stats.files_written -= finished.not_placed;
        reporter.stats.kept_disk += finished.not_placed;
        for (path, sig) in finished.placed {
            marks.insert(&path, Mark::Entry(sig));
        }
        for (path, mark) in finished.kept {
            marks.insert(&path, mark);
        }
        reporter.report();
        let mut baseline = Baseline {
            taken: Some(taken),
            marks,
            ..Baseline::none()
        };
        settle::settle(&mut baseline, dst_root.as_fd(), taken);
        Ok(Synced {
            stats: reporter.stats,
            baseline,
        })
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
}

/// What the walk does with one name of a directory pair.
#[derive(Debug)]
enum Step {
    /// Only the destination has it: removed. `temp`: a leftover temporary.
    Remove { name: Name, temp: bool },
    /// The source has it; `in_dst` whether the destination listed it too.
    Sync { entry: SrcEntry, in_dst: bool },
}

/// Merges the two listings of a directory pair: removals first (they free space for
/// what is written), then the source's names in byte order (the scan's order).
/// Reserved names are skipped in the source and removed from the destination.
fn pair_listings(mut src: Vec<SrcEntry>, mut dst: Vec<Name>) -> Vec<Step> {
    src.retain(|e| !is_temp(&e.name));
    src.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    dst.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let mut removals = Vec::new();
    let mut syncs = Vec::with_capacity(src.len());
    let mut theirs = dst.into_iter().peekable();
    for entry in src {
        while let Some(other) = theirs.next_if(|d| d.name < entry.name) {
            let temp = is_temp(&other.name);
            removals.push(Step::Remove { name: other, temp });
        }
        let in_dst = theirs.next_if(|d| d.name == entry.name).is_some();
        syncs.push(Step::Sync { entry, in_dst });
    }
    for other in theirs {
        let temp = is_temp(&other.name);
        removals.push(Step::Remove { name: other, temp });
    }
    removals.extend(syncs);
    removals
}

/// Outcome of the stat-only comparison of two non-directories; symlink targets and
/// attributes are compared afterwards where it matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Diff {
    Same,
    /// Owner, group, mode or times differ (or attributes, found later).
    Meta,
    /// Type, contents (size or mtime for files, target length for symlinks) or device
    /// number differ.
    Data,
}

/// Owner, group, permission bits (not for symlinks, whose are fixed) and mtime.
fn same_meta(s: &FileStat, d: &FileStat) -> bool {
    (s.st_uid, s.st_gid) == (d.st_uid, d.st_gid)
        && (file_type(s) == libc::S_IFLNK || permissions(s) == permissions(d))
        && (s.st_mtime, s.st_mtime_nsec) == (d.st_mtime, d.st_mtime_nsec)
}

fn compare_stats(s: &FileStat, d: &FileStat) -> Diff {
    let kind = file_type(s);
    let data_differs = kind != file_type(d)
        || match kind {
            libc::S_IFREG => {
                s.st_size != d.st_size || (s.st_mtime, s.st_mtime_nsec) != (d.st_mtime, d.st_mtime_nsec)
            }
            libc::S_IFLNK => s.st_size != d.st_size,
            libc::S_IFCHR | libc::S_IFBLK => s.st_rdev != d.st_rdev,
            _ => false,
        };
    if data_differs {
        Diff::Data
    } else if same_meta(s, d) {
        Diff::Same
    } else {
        Diff::Meta
    }
}

/// How far the destination inode of a name may be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reuse {
    /// Its only name is this one: it may be kept and changed in place.
    InPlace,
    /// Linked elsewhere too, but the source inode is multiply linked and the
    /// destination inode not yet taken by another group: kept only if equal, as the
    /// group's inode.
    AsIs,
    /// Replaced whatever it holds.
    No,
}

/// `claimed`: the destination inode already stands for another group of hard links.
fn reuse(src_nlink: libc::nlink_t, d: &FileStat, claimed: bool) -> Reuse {
    if claimed {
        Reuse::No
    } else if d.st_nlink == 1 {
        Reuse::InPlace
    } else if src_nlink > 1 {
        Reuse::AsIs
    } else {
        Reuse::No
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Keep,
    UpdateMetadata,
    Rewrite,
}

/// Only regular files are updated in place: symlinks and nodes have no data, so
/// writing them anew costs no more.
fn decide(kind: libc::mode_t, diff: Diff, reuse: Reuse) -> Action {
    match (diff, reuse) {
        (Diff::Data, _) | (_, Reuse::No) => Action::Rewrite,
        (Diff::Same, _) => Action::Keep,
        (Diff::Meta, Reuse::InPlace) if kind == libc::S_IFREG => Action::UpdateMetadata,
        (Diff::Meta, _) => Action::Rewrite,
    }
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
    steps: std::vec::IntoIter<Step>,
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
    /// Created only to hold what the RAM wrote after the disk deleted the directory
    /// (at this time): removed again from its parent, under its name, if that was
    /// nothing, and remembered as deleted.
    tentative: Option<(Time, Arc<DstDir>, CString)>,
    /// The RAM side's metadata wins (see [`Verdict`]).
    ram_meta: bool,
    /// The disk directory kept its names since the baseline, whose records stand for
    /// its listing ([`Baseline::unchanged_dir`]).
    trusted: bool,
    /// Neither this RAM directory nor any above it changed since the baseline, so its
    /// names hold what they held then: a directory renamed or exchanged in RAM gets a
    /// new ctime, its entries (and their subdirectories) do not.
    ram_kept: bool,
    rel_len: usize,
}

/// A directory the walk is done with, to be finished once every rename into it landed.
struct Left {
    src: OwnedFd,
    dst: Arc<DstDir>,
    meta: Option<FileStat>,
    before: Option<FileStat>,
    changed: bool,
    tentative: Option<(Time, Arc<DstDir>, CString)>,
    ram_meta: bool,
    rel: Vec<u8>,
}

struct Syncer<'p, 'b> {
    /// The last pass's baseline, and the next one being built.
    base: &'b Baseline,
    /// Where each name this pass creates on disk is recorded at once.
    journal: Option<&'b Journal>,
    deletions: Option<&'b Mutex<dyn DiskDeletions + Send>>,
    /// The next baseline's records, in the order made (the last of a path holds).
    marks: baseline::Marks,
    /// The names the baseline holds by disk directory, where it may be trusted.
    disk_names: HashMap<&'b [u8], Vec<&'b [u8]>>,
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
    transfer: Transfer,
    temps: TempNames,
    /// The source, read ahead on the scan's thread.
    scan: Receiver<Event>,
    durable: Durable,
    /// Directories left with renames still pending, by [`DstDir::key`].
    waiting: HashMap<usize, Left>,
}

/// What syncing one step did to the parent directory and where the walk goes next.
#[derive(Default)]
struct Outcome {
    enter: Option<Frame>,
    /// Names in the parent were created, replaced or removed.
    changed: bool,
}

impl Outcome {
    fn changed() -> Self {
        Outcome {
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
    /// The rule's verdict for one name of the directory `frame` (see [`baseline::decide`]);
    /// conflicts are counted.
    fn decide(&mut self, path: &[u8], ram: Ram, disk: Option<&FileStat>, frame: &Frame) -> Verdict {
        let disk = disk.map_or(Disk::Absent, |d| Disk::Present(self.disk_sig(path, d)));
        let mut mark = self.base_mark(path, disk);
        if let (None, Disk::Absent, Ram::Present(_)) = (mark, disk, ram) {
            // Not in the baseline, but gone from the disk: below a directory the disk
            // deleted, or seen deleted while the application worked there.
            mark = match (&frame.tentative, self.deletions) {
                (Some((at, ..)), _) => Some(Mark::Deleted(*at)),
                (None, Some(deletions)) => {
                    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
                    CString::new(name)
                        .ok()
                        .and_then(|name| deleted(deletions, frame.dst.fd.as_fd(), &name))
                        .map(Mark::Deleted)
                }
                (None, None) => None,
            };
        }
        let d = baseline::decide(
            mark.as_ref(),
            self.base.taken,
            ram,
            disk,
            frame.ram_deleted_at,
            frame.disk_deleted_at,
        );
        if d.conflict {
            self.reporter.stats.conflicts += 1;
        }
        d.verdict
    }

    /// The baseline's record of `path`, as the disk entry found there (`disk`) makes
    /// it: a name an interrupted pass was putting in place counts as agreed on if it
    /// is there, and as unknown if not.
    fn base_mark(&self, path: &[u8], disk: Disk) -> Option<Mark> {
        match self.base.get(path).copied() {
            Some(Mark::Placing(sig)) => match disk {
                Disk::Present(d) if sig.same_but_ctime(&d) => Some(Mark::Entry(d)),
                _ => self.base.placing_before.get(path).copied(),
            },
            other => other,
        }
    }

    /// How the disk entry at `path` compares with the baseline: a ctime this pass
    /// caused (by unlinking another name of the inode) is not the application's.
    fn disk_sig(&self, path: &[u8], d: &FileStat) -> Sig {
        let mut sig = Sig::of(d);
        if !self.touched.contains(&sig.ino) {
            return sig;
        }
        if let Some(Mark::Entry(base)) = self.base.get(path) {
            if base.ino == sig.ino {
                sig.ctime = base.ctime;
            }
        }
        sig
    }

    /// A name of the destination inode `d` goes (unlinked or replaced).
    fn touch(&mut self, d: &FileStat) {
        if d.st_nlink > 1 {
            self.touched.insert(d.st_ino);
        }
    }

    /// The disk side won: left as it is (`d`, if it has the name), and remembered, so
    /// the RAM's losing version does not come back later.
    fn keep_disk(&mut self, path: Vec<u8>, verdict: Verdict, d: Option<&FileStat>) -> Result<(), Failed> {
        self.reporter.stats.kept_disk += 1;
        let mark = match (verdict, d) {
            (Verdict::Disk(Some(at)), _) => Mark::Deleted(at),
            (Verdict::Disk(None), Some(d)) if file_type(d) != libc::S_IFDIR => Mark::DiskWon(Sig::of(d)),
            _ => return Ok(()),
        };
        if self.base.get(&path) == Some(&mark) {
            // Known already: carried, not journaled again.
            self.marks.insert(&path, mark);
            return Ok(());
        }
        self.remember(path, mark)
    }

    /// Puts `mark` in the next baseline, and at once in the journal: a retry after a
    /// crash must know it too.
    fn remember(&mut self, path: Vec<u8>, mark: Mark) -> Result<(), Failed> {
        self.journal_note(&path, &mark)?;
        self.marks.insert(&path, mark);
        Ok(())
    }

    /// The two sides agree on `path`; the disk entry now looks like `st`.
    fn record(&mut self, path: Vec<u8>, st: &FileStat) {
        self.marks.insert(&path, Mark::Entry(Sig::of(st)));
    }

    /// `path` was not looked at (it vanished from the RAM while the pass ran, or lies
    /// below another filesystem): what the baseline knew of it still holds.
    fn carry(&mut self, path: &[u8]) {
        let base = self.base;
        for (p, m) in base
            .get(path)
            .map(|m| (path, m))
            .into_iter()
            .chain(base.below(path))
        {
            let mark = match *m {
                // Not read in this pass: trusted as before, or not at all.
                Mark::Entry(sig) if sig.is_dir() && !base.unchanged_dir(p, &sig) => Mark::Entry(Sig {
                    ctime: UNTRUSTED,
                    ..sig
                }),
                other => other,
            };
            self.marks.insert(p, mark);
        }
    }

    /// In a directory whose names the disk kept: a RAM non-directory unchanged since
    /// the baseline, whose record says both sides agreed on it or the disk's version
    /// won, keeps that record without a look at the disk. Had the disk changed it in
    /// place, the disk's version would be kept all the same; whether the RAM then
    /// wins with a later change is decided by times, which the disk's entry shows
    /// whenever the RAM changes it. Hard links are left to the full comparison.
    fn carry_unchanged(&mut self, path: &[u8], s: &FileStat) -> bool {
        let ram = ctime(s);
        if file_type(s) == libc::S_IFDIR || s.st_nlink != 1 || self.base.taken.is_none_or(|t| ram >= t) {
            return false;
        }
        let mark = match self.base.get(path) {
            Some(&m @ Mark::Entry(sig)) if !sig.is_dir() => m,
            Some(&m @ Mark::DiskWon(sig)) if !sig.is_dir() && ram <= sig.ctime => m,
            _ => return false,
        };
        self.marks.insert(path, mark);
        self.reporter.stats.unchanged += 1;
        true
    }

    fn run(&mut self, dst: OwnedFd) -> Result<(), CopyError> {
        let at_root = |f: Failed| f.at(PathBuf::from("."));
        let root = match self.next_event()? {
            Event::Enter { fd, st, entries, .. } => {
                let dst_st = stat::fstat(&dst).map_err(dst_err("stat")).map_err(at_root)?;
                let mut frame = self.frame(fd, entries, dst, None, None, None).map_err(at_root)?;
                frame.ram_deleted_at = ctime(&st);
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
                    let (Step::Remove {
                        name: Name { name, .. },
                        ..
                    }
                    | Step::Sync {
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
            self.reporter.entry_done();
            self.finish_landed(false)?;
        }
        self.finish_landed(true)
    }

    /// The scan's next event; its errors end the walk.
    fn next_event(&mut self) -> Result<Event, CopyError> {
        match self.scan.recv() {
            Ok(Event::Failed(f, path)) => Err(f.at(path)),
            Ok(event) => Ok(event),
            Err(_) => Err(src_err("read")(Errno::EPIPE).at(self.rel.path(None))),
        }
    }

    fn expect_leave(&mut self) -> Result<(), CopyError> {
        match self.next_event()? {
            Event::Leave => Ok(()),
            _ => unreachable!("the scan walks the directories the walk walks"),
        }
    }

    /// Passes over the scan's events for a directory that is not walked after all,
    /// its `Enter` already taken.
    fn skip_scanned(&mut self) -> Result<(), CopyError> {
        let mut depth = 1;
        while depth > 0 {
            match self.next_event()? {
                Event::Enter { .. } => depth += 1,
                Event::Leave => depth -= 1,
                Event::Gone | Event::Failed(..) => {}
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

    /// Lists the destination side of a directory pair (a directory created just now is
    /// known to be empty, one whose names the disk kept since the baseline at `path`
    /// is listed there) and pairs it with the scanned source side. The deletion times
    /// are the caller's to set.
    fn frame(
        &mut self,
        src: OwnedFd,
        entries: Vec<SrcEntry>,
        dst: OwnedFd,
        meta: Option<FileStat>,
        before: Option<FileStat>,
        path: Option<&[u8]>,
    ) -> Result<Frame, Failed> {
        let created = before.is_none() && meta.is_some();
        let kept = match (path, &before) {
            (Some(path), Some(before)) if self.base.unchanged_dir(path, &Sig::of(before)) => {
                self.names_in_baseline(path)
            }
            _ => None,
        };
        let trusted = kept.is_some();
        self.reporter.stats.dirs_trusted += u64::from(trusted);
        let dst_names = if created {
            Vec::new()
        } else if let Some(names) = kept {
            names
        } else {
            read_names(&dst).map_err(dst_err("read directory"))?
        };
        Ok(Frame {
            src,
            dst: DstDir::new(dst),
            steps: pair_listings(entries, dst_names).into_iter(),
            meta,
            before,
            changed: false,
            ram_deleted_at: (0, 0),
            disk_deleted_at: (0, 0),
            tentative: None,
            ram_meta: true,
            trusted,
            ram_kept: false,
            rel_len: self.rel.len(),
        })
    }

    /// The disk directory at `path`'s names as the baseline holds them.
    fn names_in_baseline(&self, path: &[u8]) -> Option<Vec<Name>> {
        let names = self.disk_names.get(path).map_or(&[][..], Vec::as_slice);
        names
            .iter()
            .map(|n| CString::new(*n).ok().map(|name| Name { name, dtype: None }))
            .collect()
    }

    fn step(&mut self, stack: &[Frame], step: &Step) -> Result<Outcome, Stop> {
        let parent = stack.last().expect("the root frame stays until the walk ends");
        let (src_dir, dst_dir) = (parent.src.as_fd(), parent.dst.fd.as_fd());
        let (entry, in_dst) = match step {
            Step::Remove { name, temp: true } => {
                plain_remove(dst_dir, &name.name, name.dtype, self.dst_dev)?;
                self.reporter.stats.temp_removed += 1;
                return Ok(Outcome::changed());
            }
            Step::Remove { name, temp: false } => return Ok(self.disk_only(parent, &name.name)?),
            Step::Sync { entry, in_dst } => (entry, *in_dst),
        };
        let name = entry.name.as_c_str();
        let path = self.rel.joined(name);
        let Some(s) = entry.st else {
            // Vanished from the RAM since it was listed: the next pass sees.
            self.carry(&path);
            return Ok(Outcome::default());
        };
        if parent.trusted && parent.ram_kept && self.carry_unchanged(&path, &s) {
            return Ok(Outcome::default());
        }
        // A trusted listing holds the baseline's names only: the disk may have others.
        let d = if in_dst || parent.trusted {
            match stat::fstatat(dst_dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(d) => Some(d),
                Err(Errno::ENOENT) => None,
                Err(e) => return Err(dst_err("stat")(e).into()),
            }
        } else {
            None
        };
        let verdict = self.decide(&path, Ram::Present(ctime(&s)), d.as_ref(), parent);
        if file_type(&s) != libc::S_IFDIR {
            if verdict != Verdict::Ram {
                let regular = |st: &FileStat| file_type(st) == libc::S_IFREG;
                let agree = match &d {
                    // Attributes too: one the disk added is a change of the disk's,
                    // which a record of agreement would let the next pass undo.
                    // The application may delete it on disk meanwhile (after a switch):
                    // then nothing agrees, and the disk's side stays as it is.
                    Some(d) if regular(&s) && regular(d) => {
                        match self.same_details(src_dir, dst_dir, entry, &s, Some(d)) {
                            Ok(same) => same,
                            Err(f) if vanished(&f) => false,
                            Err(f) => return Err(f.into()),
                        }
                    }
                    _ => false,
                };
                if let Some(d) = d.as_ref().filter(|_| agree) {
                    // The disk's side is the same as the RAM's: they agree.
                    self.reporter.stats.unchanged += 1;
                    self.record(path, d);
                    return Ok(Outcome::default());
                }
                self.keep_disk(path, verdict, d.as_ref())?;
                return Ok(Outcome::default());
            }
            let same_details = self.same_details(src_dir, dst_dir, entry, &s, d.as_ref())?;
            return Ok(self.sync_leaf(stack, name, path, &s, d, same_details)?);
        }
        match self.next_event()? {
            Event::Enter {
                fd,
                st,
                entries,
                mount,
            } => {
                let disk_file = d.as_ref().is_some_and(|d| file_type(d) != libc::S_IFDIR);
                if disk_file && verdict != Verdict::Ram {
                    // The disk's non-directory wins over the RAM's directory.
                    self.skip_scanned()?;
                    self.keep_disk(path, verdict, d.as_ref())?;
                    return Ok(Outcome::default());
                }
                let tentative = match verdict {
                    Verdict::Disk(Some(at)) if d.is_none() => Some(at),
                    _ => None,
                };
                let ram_meta = verdict == Verdict::Ram || tentative.is_some();
                self.sync_dir(
                    parent,
                    name,
                    path,
                    (fd, st, entries, mount),
                    d,
                    ram_meta,
                    tentative,
                )
            }
            // Vanished or replaced since it was listed: the next sync sees.
            Event::Gone => {
                self.carry(&path);
                Ok(Outcome::default())
            }
            _ => unreachable!("the scan enters every directory it listed"),
        }
    }

    /// A name only the disk has: the RAM deleted it since the baseline (or never had
    /// it, and then it stays).
    fn disk_only(&mut self, parent: &Frame, name: &CStr) -> Result<Outcome, Failed> {
        let path = self.rel.joined(name);
        if self.base.get(&path).is_none() {
            // In no baseline: the disk's own.
            return Ok(Outcome::default());
        }
        let dst_dir = parent.dst.fd.as_fd();
        let d = match stat::fstatat(dst_dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(d) => d,
            Err(Errno::ENOENT) => return Ok(Outcome::default()),
            Err(e) => return Err(dst_err("stat")(e)),
        };
        if self
            .base_mark(&path, Disk::Present(self.disk_sig(&path, &d)))
            .is_none()
        {
            return Ok(Outcome::default());
        }
        match self.decide(&path, Ram::Absent, Some(&d), parent) {
            Verdict::Ram => {
                let (removed, kept) = if file_type(&d) == libc::S_IFDIR {
                    self.remove_merged(dst_dir, name, &path, parent.ram_deleted_at)?
                } else {
                    self.touch(&d);
                    let removed = self.remove_compared(dst_dir, name, &d)?;
                    (removed, 1 - removed)
                };
                self.reporter.stats.deleted += removed;
                self.reporter.stats.kept_disk += kept;
                Ok(Outcome {
                    enter: None,
                    changed: removed > 0,
                })
            }
            verdict => {
                self.keep_disk(path, verdict, Some(&d))?;
                Ok(Outcome::default())
            }
        }
    }

    /// For two non-directories equal by stat, whether symlink targets and copied
    /// attributes are equal too: one attribute listing of the destination entry in the
    /// common case, where neither has any.
    fn same_details(
        &mut self,
        src_dir: BorrowedFd<'_>,
        dst_dir: BorrowedFd<'_>,
        entry: &SrcEntry,
        s: &FileStat,
        d: Option<&FileStat>,
    ) -> Result<bool, Failed> {
        if d.is_none_or(|d| compare_stats(s, d) != Diff::Same) {
            return Ok(false);
        }
        let name = entry.name.as_c_str();
        if file_type(s) == libc::S_IFLNK {
            let theirs = fcntl::readlinkat(dst_dir, name).map_err(dst_err("read symlink"))?;
            if entry.target.as_ref() != Some(&theirs) {
                return Ok(false);
            }
        }
        let (src, dst) = (XattrTarget::At(src_dir, name), XattrTarget::At(dst_dir, name));
        let bufs = &mut self.transfer.xattr_bufs;
        match (&entry.xattrs, xattrs::copied_list(dst, bufs, false)?) {
            (None, None) => Ok(true),
            _ => xattrs::same_xattrs(src, dst, bufs),
        }
    }

    /// A RAM directory: entered, with the disk's directory of that name, or a new one
    /// (`tentative` when the disk deleted it: see [`Frame::tentative`]).
    #[allow(clippy::too_many_arguments)]
    fn sync_dir(
        &mut self,
        parent: &Frame,
        name: &CStr,
        path: Vec<u8>,
        (src, s, entries, mount): (OwnedFd, FileStat, Vec<SrcEntry>, bool),
        d: Option<FileStat>,
        ram_meta: bool,
        tentative: Option<Time>,
    ) -> Result<Outcome, Stop> {
        let dst_dir = parent.dst.fd.as_fd();
        let mut changed = false;
        let (dst, before) = match d {
            Some(d) if file_type(&d) == libc::S_IFDIR => {
                if d.st_dev != self.dst_dev {
                    // Another filesystem is mounted here: not ours to change.
                    self.skip_scanned()?;
                    self.carry(&path);
                    self.reporter.stats.unchanged += 1;
                    return Ok(Outcome::default());
                }
                (
                    open_dst_dir(dst_dir, name).map_err(dst_err("open directory"))?,
                    Some(d),
                )
            }
            other => {
                if let Some(d) = other {
                    // A non-directory the RAM side won over, unless the application
                    // changed it since.
                    self.touch(&d);
                    if self.remove_compared(dst_dir, name, &d)? == 0 {
                        self.skip_scanned()?;
                        self.keep_disk(path, Verdict::Disk(None), None)?;
                        return Ok(Outcome::default());
                    }
                    self.reporter.stats.deleted += 1;
                }
                // Owner-only until its metadata is applied.
                stat::mkdirat(dst_dir, name, Mode::S_IRWXU).map_err(dst_err("create directory"))?;
                changed = true;
                let fd = open_dst_dir(dst_dir, name).map_err(dst_err("open directory"))?;
                let st = stat::fstat(&fd).map_err(dst_err("stat"))?;
                self.journal_note(&path, &Mark::Entry(Sig::of(&st)))?;
                (fd, None)
            }
        };
        let disk_deleted_at = tentative
            .or_else(|| before.as_ref().map(ctime))
            .unwrap_or(parent.disk_deleted_at);
        let tentative = tentative.map(|at| (at, Arc::clone(&parent.dst), name.to_owned()));
        if mount {
            // A mount point in the tmpfs: the directory itself is synced, but neither
            // entered nor emptied on disk.
            self.expect_leave()?;
            let left = Left {
                src,
                dst: DstDir::new(dst),
                meta: Some(s),
                before,
                changed: false,
                tentative,
                ram_meta,
                rel: path,
            };
            self.finish_dir(&left)?;
            return Ok(Outcome { enter: None, changed });
        }
        let mut frame = self.frame(src, entries, dst, Some(s), before, Some(&path))?;
        frame.ram_deleted_at = ctime(&s);
        frame.disk_deleted_at = disk_deleted_at;
        frame.ram_kept = parent.ram_kept && self.base.taken.is_some_and(|t| ctime(&s) < t);
        frame.tentative = tentative;
        frame.ram_meta = ram_meta;
        self.rel.push(name);
        frame.rel_len = self.rel.len();
        Ok(Outcome {
            enter: Some(frame),
            changed,
        })
    }

    /// The walk is done with a directory: it is finished now, or once the renames
    /// into it landed.
    fn leave(&mut self, frame: Frame) -> Result<(), Failed> {
        let left = Left {
            src: frame.src,
            dst: frame.dst,
            meta: frame.meta,
            before: frame.before,
            changed: frame.changed,
            tentative: frame.tentative,
            ram_meta: frame.ram_meta,
            rel: self.rel.as_bytes().to_vec(),
        };
        if left.dst.leave() {
            self.finish_dir(&left)
        } else {
            self.waiting.insert(left.dst.key(), left);
            Ok(())
        }
    }

    /// Applies a directory's metadata after its contents, then has it fsynced if
    /// names in it changed. The root's metadata belongs to the caller. A tentative
    /// directory that received nothing is removed again.
    ///
    /// A directory whose mtime differs only because the sync changed names in it counts
    /// as unchanged: `before` is how it looked before (`None` if it was created).
    fn finish_dir(&mut self, left: &Left) -> Result<(), Failed> {
        if let Some((at, parent, name)) = &left.tentative {
            if read_names(&left.dst.fd)
                .map_err(dst_err("read directory"))?
                .is_empty()
            {
                match unistd::unlinkat(parent.fd.as_fd(), name.as_c_str(), UnlinkatFlags::RemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => {
                        self.keep_disk(left.rel.clone(), Verdict::Disk(Some(*at)), None)?;
                        return Ok(());
                    }
                    // The application put something there meanwhile.
                    Err(Errno::ENOTEMPTY | Errno::EEXIST) => {}
                    Err(e) => return Err(dst_err("remove directory")(e)),
                }
            }
        }
        let mut same = true;
        if let Some(s) = &left.meta {
            let (src, dst) = (left.src.as_fd(), left.dst.fd.as_fd());
            let mut now = stat::fstat(dst).map_err(dst_err("stat"))?;
            if left.ram_meta {
                let same_xattrs = left.before.is_some() && self.transfer.same_xattrs_fd(src, dst)?;
                same = same_xattrs && same_meta(s, &now);
                if !same {
                    self.transfer.set_metadata(src, dst, s, true)?;
                    now = stat::fstat(dst).map_err(dst_err("stat"))?;
                }
                let stats = &mut self.reporter.stats;
                match &left.before {
                    None => stats.dirs_created += 1,
                    Some(before) if same_xattrs && same_meta(s, before) => stats.unchanged += 1,
                    Some(_) => stats.metadata_updated += 1,
                }
            } else {
                // Replaced on disk since the baseline: its owner, mode and times stay.
                self.reporter.stats.kept_disk += 1;
            }
            self.record(left.rel.clone(), &now);
        }
        if left.changed || !same {
            self.durable.submit(Job::FsyncDir {
                dir: Arc::clone(&left.dst),
                rel: rel_path(&left.rel),
            });
        }
        Ok(())
    }

    /// A non-directory the RAM side won: written, updated or kept. `same_details`: for
    /// two non-directories equal by stat, whether symlink targets and attributes are
    /// equal too.
    fn sync_leaf(
        &mut self,
        stack: &[Frame],
        name: &CStr,
        path: Vec<u8>,
        s: &FileStat,
        mut d: Option<FileStat>,
        same_details: bool,
    ) -> Result<Outcome, Failed> {
        let parent = stack.last().expect("the root frame stays until the walk ends");
        let (src_dir, dst_dir) = (parent.src.as_fd(), parent.dst.fd.as_fd());
        let mut outcome = Outcome::default();
        if let Some(dir) = d.filter(|d| file_type(d) == libc::S_IFDIR) {
            if dir.st_dev != self.dst_dev {
                return Err(dst_err("replace the mount point")(Errno::EBUSY));
            }
            // Emptied by the rule first: what the disk changed below it stays, and so
            // does the directory then.
            let (removed, kept) = self.remove_merged(dst_dir, name, &path, ctime(s))?;
            self.reporter.stats.deleted += removed;
            if kept > 0 {
                self.reporter.stats.kept_disk += kept + 1;
                return Ok(Outcome {
                    enter: None,
                    changed: removed > 0,
                });
            }
            outcome.changed = true;
            d = None;
        }
        let key = (s.st_dev, s.st_ino);
        if s.st_nlink > 1 {
            if let Some(group) = self.links.get_mut(&key) {
                group.remaining -= 1;
                let (first, ino) = (group.path.clone(), group.ino);
                if group.remaining == 0 {
                    self.links.remove(&key);
                }
                if let Some(d) = d.filter(|d| d.st_ino == ino) {
                    self.reporter.stats.unchanged += 1;
                    self.record(path, &d);
                    return Ok(outcome);
                }
                if let Some(d) = &d {
                    self.touch(d);
                }
                if !self.write_hard_link(stack, name, &first, d.as_ref())? {
                    self.reporter.stats.kept_disk += 1;
                    return Ok(outcome);
                }
                self.reporter.stats.links_written += 1;
                self.record_placed(dst_dir, name, path)?;
                return Ok(Outcome::changed());
            }
        }
        let kind = file_type(s);
        let (mut diff, reuse) = match &d {
            Some(d) => (
                compare_stats(s, d),
                reuse(s.st_nlink, d, self.claimed.contains(&d.st_ino)),
            ),
            None => (Diff::Data, Reuse::No),
        };
        if diff == Diff::Same && !same_details {
            // A symlink target or attributes differ: written anew or updated.
            diff = Diff::Meta;
        }
        let mut action = decide(kind, diff, reuse);
        let mut ino = d.as_ref().map(|d| d.st_ino);
        if action == Action::UpdateMetadata {
            let d = d.as_ref().expect("decide updates existing entries only");
            match self.update_file_metadata(src_dir, dst_dir, name, d)? {
                Some(Some(now)) => {
                    self.reporter.stats.metadata_updated += 1;
                    self.record(path.clone(), &now);
                }
                Some(None) => action = Action::Rewrite,
                None => {
                    self.carry(&path);
                    return Ok(outcome);
                }
            }
        }
        match action {
            Action::Keep => {
                self.reporter.stats.unchanged += 1;
                let d = d.as_ref().expect("decide keeps existing entries only");
                self.record(path.clone(), d);
            }
            Action::UpdateMetadata => {}
            Action::Rewrite => match self.rewrite_touching(src_dir, &parent.dst, name, s, d.as_ref())? {
                Some(placed) => {
                    if let Some(new_ino) = placed {
                        ino = Some(new_ino);
                        self.record_placed(dst_dir, name, path.clone())?;
                    }
                    outcome.changed = true;
                }
                None => {
                    self.carry(&path);
                    return Ok(outcome);
                }
            },
        }
        if s.st_nlink > 1 {
            let ino = ino.expect("group members are put in place before the walk goes on");
            self.claimed.insert(ino);
            let remaining = s.st_nlink - 1;
            self.links.insert(
                key,
                Group {
                    path: path.into_boxed_slice(),
                    ino,
                    remaining,
                },
            );
        }
        Ok(outcome)
    }

    /// [`Self::rewrite`] of a name whose old inode goes: noted in `touched` first.
    fn rewrite_touching(
        &mut self,
        src_dir: BorrowedFd<'_>,
        dst: &Arc<DstDir>,
        name: &CStr,
        s: &FileStat,
        d: Option<&FileStat>,
    ) -> Result<Option<Option<u64>>, Failed> {
        if let Some(d) = d {
            self.touch(d);
        }
        self.rewrite(src_dir, dst, name, s, d)
    }

    /// Records the entry the walk itself just put in place under `name`.
    fn record_placed(&mut self, dst_dir: BorrowedFd<'_>, name: &CStr, path: Vec<u8>) -> Result<(), Failed> {
        let now = stat::fstatat(dst_dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(dst_err("stat"))?;
        self.remember(path, Mark::Entry(Sig::of(&now)))
    }

    fn journal_note(&self, path: &[u8], mark: &Mark) -> Result<(), Failed> {
        match self.journal {
            Some(j) => j
                .note(path, mark)
                .map_err(dst_err("record in the write-back journal")),
            None => Ok(()),
        }
    }

    /// Updates owner, attributes, mode and times of a regular file in place, through a
    /// descriptor checked to be the singly-linked file `d` that was compared; returns
    /// its stat afterwards. `Some(None)` when it is not (anymore), so it must be
    /// rewritten; `None` when the source vanished.
    fn update_file_metadata(
        &mut self,
        src_dir: BorrowedFd<'_>,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
        d: &FileStat,
    ) -> Result<Option<Option<FileStat>>, Failed> {
        let src = match open_src_typed(src_dir, name, libc::S_IFREG) {
            Ok(fd) => fd,
            Err(f) if vanished(&f) => return Ok(None),
            Err(f) => return Err(f),
        };
        let s = stat::fstat(&src).map_err(src_err("stat"))?;
        let path_fd = fcntl::openat(
            dst_dir,
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(dst_err("open"))?;
        let now = stat::fstat(&path_fd).map_err(dst_err("stat"))?;
        let same_inode = (now.st_dev, now.st_ino, now.st_nlink) == (d.st_dev, d.st_ino, 1);
        if file_type(&s) != libc::S_IFREG || file_type(&now) != libc::S_IFREG || !same_inode {
            return Ok(Some(None));
        }
        // Reopening the checked inode through /proc cannot land on another one.
        let proc = format!("/proc/self/fd/{}", path_fd.as_raw_fd());
        let dst = fcntl::open(proc.as_str(), OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(dst_err("open"))?;
        self.transfer.set_metadata(src.as_fd(), dst.as_fd(), &s, true)?;
        let after = stat::fstat(&dst).map_err(dst_err("stat"))?;
        self.durable.submit(Job::FsyncFile {
            file: File::from(dst),
            rel: self.rel.path(Some(name)),
        });
        Ok(Some(Some(after)))
    }

    /// Writes a non-directory anew under a temporary name and puts it in place of
    /// `name` (never a directory: the caller removed that). Returns `None` when the
    /// source vanished or changed type, or the disk got the name first; else the new
    /// inode if it is in place already: a singly-linked regular file is handed to the
    /// workers, which `fsync` it before renaming it and record it in the baseline.
    fn rewrite(
        &mut self,
        src_dir: BorrowedFd<'_>,
        dst: &Arc<DstDir>,
        name: &CStr,
        s: &FileStat,
        d: Option<&FileStat>,
    ) -> Result<Option<Option<u64>>, Failed> {
        let dst_dir = dst.fd.as_fd();
        let kind = file_type(s);
        let (temp, ino) = match kind {
            libc::S_IFREG => {
                let src = match open_src(src_dir, name, OFlag::empty()) {
                    Ok(fd) => File::from(fd),
                    Err(Errno::ENOENT | Errno::ELOOP) => return Ok(None),
                    Err(e) => return Err(src_err("open file")(e)),
                };
                // The data is copied with the stat of what was opened; whether it goes
                // in place now or through the workers follows the walk's stat, which
                // decided whether it is a hard-link group's first copy.
                let grouped = s.st_nlink > 1;
                let s = stat::fstat(&src).map_err(src_err("stat"))?;
                if file_type(&s) != libc::S_IFREG {
                    return Ok(None);
                }
                let (mut temp, fd) = create_temp(&mut self.temps, dst_dir, |dir, temp| {
                    fcntl::openat(
                        dir,
                        temp,
                        OFlag::O_WRONLY
                            | OFlag::O_CREAT
                            | OFlag::O_EXCL
                            | OFlag::O_NOFOLLOW
                            | OFlag::O_CLOEXEC,
                        Mode::S_IRUSR | Mode::S_IWUSR,
                    )
                    .map_err(dst_err("create file"))
                })?;
                let file = File::from(fd);
                let reporter = &mut self.reporter;
                self.transfer.copy_data(&src, &file, &s, &mut |n| {
                    reporter.stats.bytes_written += n;
                    reporter.report_if_due();
                })?;
                self.transfer.set_metadata(src.as_fd(), file.as_fd(), &s, true)?;
                self.reporter.stats.files_written += 1;
                if !grouped {
                    temp.live = false;
                    self.durable.submit(Job::Rename {
                        dir: Arc::clone(dst),
                        file,
                        temp: std::mem::take(&mut temp.name),
                        name: name.to_owned(),
                        place: d.map_or(Place::Free, |d| Place::Over(Seen::of(d))),
                        rel: self.rel.path(Some(name)),
                    });
                    return Ok(Some(None));
                }
                unistd::fsync(&file).map_err(dst_err("fsync"))?;
                let ino = stat::fstat(&file).map_err(dst_err("stat"))?.st_ino;
                (temp, ino)
            }
            libc::S_IFLNK => {
                let target = match fcntl::readlinkat(src_dir, name) {
                    Ok(target) => target,
                    Err(Errno::ENOENT | Errno::EINVAL) => return Ok(None),
                    Err(e) => return Err(src_err("read symlink")(e)),
                };
                let (temp, ()) = create_temp(&mut self.temps, dst_dir, |dir, temp| {
                    unistd::symlinkat(target.as_os_str(), dir, temp).map_err(dst_err("create symlink"))
                })?;
                let ino = self.finish_node(src_dir, name, &temp, s)?;
                self.reporter.stats.links_written += 1;
                (temp, ino)
            }
            _ => {
                let node = SFlag::from_bits_truncate(kind);
                let (temp, ()) = create_temp(&mut self.temps, dst_dir, |dir, temp| {
                    stat::mknodat(dir, temp, node, Mode::S_IRUSR | Mode::S_IWUSR, s.st_rdev)
                        .map_err(dst_err("create node"))
                })?;
                let ino = self.finish_node(src_dir, name, &temp, s)?;
                self.reporter.stats.specials_written += 1;
                (temp, ino)
            }
        };
        if !self.replace(temp, name, d)? {
            let stats = &mut self.reporter.stats;
            match kind {
                libc::S_IFREG => stats.files_written -= 1,
                libc::S_IFLNK => stats.links_written -= 1,
                _ => stats.specials_written -= 1,
            }
            stats.kept_disk += 1;
            return Ok(None);
        }
        Ok(Some(Some(ino)))
    }

    /// Metadata of a new symlink or node (which cannot be opened); returns its inode.
    /// Its data is part of the inode, made durable by the directory's fsync.
    fn finish_node(
        &mut self,
        src_dir: BorrowedFd<'_>,
        name: &CStr,
        temp: &Temp<'_>,
        s: &FileStat,
    ) -> Result<u64, Failed> {
        let temp_name = temp.name.as_c_str();
        self.transfer
            .set_metadata_at((src_dir, name), (temp.dir, temp_name), s, true)?;
        let st = stat::fstatat(temp.dir, temp_name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(dst_err("stat"))?;
        Ok(st.st_ino)
    }

    /// Links a temporary name to the first copy of a hard-linked inode and renames it
    /// over `name`; false if the disk got a missing name first.
    fn write_hard_link(
        &mut self,
        stack: &[Frame],
        name: &CStr,
        first: &[u8],
        d: Option<&FileStat>,
    ) -> Result<bool, Failed> {
        let dst_dir = stack.last().expect("the root frame stays").dst.fd.as_fd();
        let rel = self.rel.as_bytes();
        let (temp, ()) = create_temp(&mut self.temps, dst_dir, |dir, temp| {
            link_to_first_copy(|i| stack[i].dst.fd.as_fd(), rel, first, dir, temp)
        })?;
        self.replace(temp, name, d)
    }

    /// Puts a finished temporary in place of the non-directory `name`. A name that was
    /// missing (`d` is `None`) is only taken if still free: false (and the temporary
    /// dropped) when something took it meanwhile.
    fn replace(&mut self, mut temp: Temp<'_>, name: &CStr, d: Option<&FileStat>) -> Result<bool, Failed> {
        let place = d.map_or(Place::Free, |d| Place::Over(Seen::of(d)));
        if self.journal.is_some() {
            let st = stat::fstatat(temp.dir, temp.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(dst_err("stat"))?;
            self.journal_note(&self.rel.joined(name), &Mark::Placing(Sig::of(&st)))?;
        }
        let gone_meanwhile = matches!(place, Place::Free)
            && self
                .deletions
                .is_some_and(|dl| deleted(dl, temp.dir, name).is_some());
        let placed = if gone_meanwhile {
            Placed::Deleted
        } else {
            put_in_place(temp.dir, temp.name.as_c_str(), name, place).map_err(dst_err("rename into place"))?
        };
        temp.live = placed != Placed::Yes;
        if placed == Placed::Deleted {
            self.remember(self.rel.joined(name), Mark::Deleted(baseline::now_coarse()))?;
        }
        Ok(placed == Placed::Yes)
    }

    /// Removes the disk non-directory `name` the rule decided to remove, if the
    /// application did not change it since it was compared (`d`); returns how many
    /// entries went.
    fn remove_compared(&mut self, dir: BorrowedFd<'_>, name: &CStr, d: &FileStat) -> Result<u64, Failed> {
        let temp = self.temps.next();
        let gone = remove_seen(dir, name, Seen::of(d), &temp).map_err(dst_err("remove"))?;
        Ok(u64::from(gone))
    }

    /// Removes the disk directory `name` (at `path`) the way the rule removes names the
    /// RAM deleted at `ram_deleted_at`: an entry goes when the baseline has it and
    /// the disk did not change it later; a directory goes when it ended up empty.
    /// Nothing is followed and no other filesystem entered. Returns how many entries
    /// went and how many stayed.
    fn remove_merged(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &CStr,
        path: &[u8],
        ram_deleted_at: Time,
    ) -> Result<(u64, u64), Failed> {
        struct Level {
            dir: OwnedFd,
            names: std::vec::IntoIter<Name>,
            name: CString,
            path: Vec<u8>,
            kept: u64,
        }
        let open = |parent: BorrowedFd<'_>, name: &CStr, path: Vec<u8>| -> Result<Level, Failed> {
            let fd = open_dst_dir(parent, name).map_err(dst_err("open directory to remove"))?;
            let names = read_names(&fd).map_err(dst_err("read directory"))?;
            Ok(Level {
                dir: fd,
                names: names.into_iter(),
                name: name.to_owned(),
                path,
                kept: 0,
            })
        };
        let mut removed = 0;
        let mut stack = vec![open(parent, name, path.to_vec())?];
        while let Some(level) = stack.last_mut() {
            let Some(entry) = level.names.next() else {
                let done = stack.pop().expect("the loop runs only while a level is stacked");
                let mut kept = done.kept;
                if kept == 0 {
                    let above = stack.last().map_or(parent, |l| l.dir.as_fd());
                    match unistd::unlinkat(above, done.name.as_c_str(), UnlinkatFlags::RemoveDir) {
                        Ok(()) => removed += 1,
                        Err(Errno::ENOTEMPTY | Errno::EEXIST) => kept = 1,
                        Err(e) => return Err(dst_err("remove directory")(e)),
                    }
                }
                match stack.last_mut() {
                    Some(up) => up.kept += kept,
                    None => return Ok((removed, kept)),
                }
                continue;
            };
            let dir = level.dir.as_fd();
            if is_temp(&entry.name) {
                removed += plain_remove(dir, &entry.name, entry.dtype, self.dst_dev)?;
                continue;
            }
            let mut child = level.path.clone();
            child.push(b'/');
            child.extend_from_slice(entry.name.to_bytes());
            let d = match stat::fstatat(dir, entry.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(d) => d,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(dst_err("stat")(e)),
            };
            let disk = Disk::Present(self.disk_sig(&child, &d));
            let verdict = baseline::decide(
                self.base_mark(&child, disk).as_ref(),
                self.base.taken,
                Ram::Absent,
                disk,
                ram_deleted_at,
                ram_deleted_at,
            );
            let is_dir = file_type(&d) == libc::S_IFDIR;
            if verdict.verdict != Verdict::Ram || (is_dir && d.st_dev != self.dst_dev) {
                level.kept += 1;
                continue;
            }
            if is_dir {
                let next = open(dir, &entry.name, child)?;
                stack.push(next);
                continue;
            }
            if d.st_nlink > 1 {
                self.touched.insert(d.st_ino);
            }
            let temp = self.temps.next();
            if remove_seen(dir, entry.name.as_c_str(), Seen::of(&d), &temp).map_err(dst_err("remove"))? {
                removed += 1;
            } else {
                level.kept += 1;
            }
        }
        unreachable!("the last level returns")
    }
}

/// Removes a destination entry that is the write-back's own (a leftover temporary) or
/// that the rule already decided to remove, a directory with everything below it,
/// without following symlinks or entering another filesystem; returns how many
/// entries went.
fn plain_remove(dir: BorrowedFd<'_>, name: &CStr, dtype: Option<Type>, dev: u64) -> Result<u64, Failed> {
    if dtype != Some(Type::Directory) {
        match unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => return Ok(1),
            Err(Errno::ENOENT) => return Ok(0),
            Err(Errno::EISDIR) => {}
            Err(e) => return Err(dst_err("remove")(e)),
        }
    }
    remove_tree(dir, name, dev)
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

/// Removes the directory `name` below `parent` and everything in it. Each level is
/// opened with O_NOFOLLOW|O_DIRECTORY relative to its parent and listed completely
/// before its entries are unlinked; a level on another filesystem fails the removal.
fn remove_tree(parent: BorrowedFd<'_>, name: &CStr, dev: u64) -> Result<u64, Failed> {
    struct Level {
        dir: OwnedFd,
        names: std::vec::IntoIter<Name>,
        name: CString,
    }
    let open = |parent: BorrowedFd<'_>, name: &CStr| -> Result<Level, Failed> {
        let fd = open_dst_dir(parent, name).map_err(dst_err("open directory to remove"))?;
        if stat::fstat(&fd).map_err(dst_err("stat"))?.st_dev != dev {
            return Err(dst_err("remove a mount point")(Errno::EBUSY));
        }
        let names = read_names(&fd).map_err(dst_err("read directory"))?;
        Ok(Level {
            dir: fd,
            names: names.into_iter(),
            name: name.to_owned(),
        })
    };
    let mut removed = 0;
    let mut stack = vec![open(parent, name)?];
    while let Some(level) = stack.last_mut() {
        let Some(entry) = level.names.next() else {
            let done = stack.pop().expect("the loop runs only while a level is stacked");
            let above = stack.last().map_or(parent, |l| l.dir.as_fd());
            unistd::unlinkat(above, done.name.as_c_str(), UnlinkatFlags::RemoveDir)
                .map_err(dst_err("remove directory"))?;
            removed += 1;
            continue;
        };
        if entry.dtype != Some(Type::Directory) {
            match unistd::unlinkat(
                level.dir.as_fd(),
                entry.name.as_c_str(),
                UnlinkatFlags::NoRemoveDir,
            ) {
                Ok(()) => {
                    removed += 1;
                    continue;
                }
                Err(Errno::ENOENT) => continue,
                Err(Errno::EISDIR) => {}
                Err(e) => return Err(dst_err("remove")(e)),
            }
        }
        let next = open(level.dir.as_fd(), &entry.name)?;
        stack.push(next);
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &[u8], dtype: Option<Type>) -> Name {
        Name {
            name: CString::new(s).expect("no NUL"),
            dtype,
        }
    }

    fn stat_of(kind: libc::mode_t, perm: libc::mode_t) -> FileStat {
        // A real stat with every field the comparisons read set here.
        let mut st = stat::stat("/").expect("stat /");
        (st.st_uid, st.st_gid, st.st_rdev) = (0, 0, 0);
        (st.st_atime, st.st_atime_nsec) = (0, 0);
        st.st_mode = kind | perm;
        st.st_nlink = 1;
        st.st_size = 10;
        st.st_mtime = 1_700_000_000;
        st.st_mtime_nsec = 5;
        st
    }

    #[test]
    fn listings_merge_into_removals_then_source_names_in_byte_order() {
        let entry = |n: &[u8]| SrcEntry {
            name: CString::new(n).expect("no NUL"),
            st: None,
            xattrs: None,
            target: None,
        };
        let src = vec![
            entry(b"b"),
            entry(b"\xff"),
            entry(b"a"),
            entry(b".tmpfsctl-wb.app"),
            entry(b"d"),
        ];
        let dst = vec![
            name(b"c", Some(Type::Directory)),
            name(b"a", Some(Type::File)),
            name(b".tmpfsctl-wb.0011223344556677", Some(Type::File)),
            name(b"\xfe", None),
            name(b"d", Some(Type::Symlink)),
            name(b"z", Some(Type::File)),
        ];
        let shown: Vec<String> = pair_listings(src, dst)
            .iter()
            .map(|step| match step {
                Step::Remove { name, temp } => format!("remove {:?} {:?} {temp}", name.name, name.dtype),
                Step::Sync { entry, in_dst } => format!("sync {:?} {in_dst}", entry.name),
            })
            .collect();
        assert_eq!(
            shown,
            [
                r#"remove ".tmpfsctl-wb.0011223344556677" Some(File) true"#,
                r#"remove "c" Some(Directory) false"#,
                r#"remove "z" Some(File) false"#,
                r#"remove "\xfe" None false"#,
                r#"sync "a" true"#,
                r#"sync "b" false"#,
                r#"sync "d" true"#,
                r#"sync "\xff" false"#,
            ]
        );
        assert!(pair_listings(Vec::new(), Vec::new()).is_empty());
    }

    #[test]
    fn stat_comparison_separates_data_from_metadata() {
        let reg = stat_of(libc::S_IFREG, 0o644);
        assert_eq!(compare_stats(&reg, &reg), Diff::Same);
        let other = |f: &dyn Fn(&mut FileStat)| {
            let mut st = reg;
            f(&mut st);
            compare_stats(&reg, &st)
        };
        assert_eq!(other(&|st| st.st_mode = libc::S_IFLNK | 0o644), Diff::Data);
        assert_eq!(other(&|st| st.st_size = 11), Diff::Data);
        assert_eq!(other(&|st| st.st_mtime_nsec = 6), Diff::Data, "nanoseconds count");
        assert_eq!(other(&|st| st.st_mtime += 1), Diff::Data);
        assert_eq!(other(&|st| st.st_mode = libc::S_IFREG | 0o4644), Diff::Meta);
        assert_eq!(other(&|st| st.st_uid = 1), Diff::Meta);
        assert_eq!(other(&|st| st.st_gid = 1), Diff::Meta);
        assert_eq!(other(&|st| st.st_atime = 99), Diff::Same, "atimes are ignored");
        assert_eq!(other(&|st| st.st_nlink = 3), Diff::Same);

        let link = stat_of(libc::S_IFLNK, 0o777);
        let mut longer = link;
        longer.st_size = 12;
        assert_eq!(compare_stats(&link, &longer), Diff::Data);
        let mut moved = link;
        moved.st_mtime_nsec = 1;
        assert_eq!(
            compare_stats(&link, &moved),
            Diff::Meta,
            "a symlink's mtime is metadata"
        );
        let mut perm = link;
        perm.st_mode = libc::S_IFLNK | 0o755;
        assert_eq!(compare_stats(&link, &perm), Diff::Same, "symlink modes are fixed");

        let dev = stat_of(libc::S_IFCHR, 0o600);
        let mut redev = dev;
        redev.st_rdev = 0x0103;
        assert_eq!(compare_stats(&dev, &redev), Diff::Data);
        let mut blk = dev;
        blk.st_mode = libc::S_IFBLK | 0o600;
        assert_eq!(compare_stats(&dev, &blk), Diff::Data);
        let fifo = stat_of(libc::S_IFIFO, 0o600);
        let mut touched = fifo;
        touched.st_size = 0;
        touched.st_mtime = 5;
        assert_eq!(compare_stats(&fifo, &touched), Diff::Meta);
    }

    #[test]
    fn destination_inodes_are_changed_in_place_only_when_singly_linked() {
        let one = stat_of(libc::S_IFREG, 0o644);
        let mut two = one;
        two.st_nlink = 2;
        assert_eq!(reuse(1, &one, false), Reuse::InPlace);
        assert_eq!(reuse(3, &one, false), Reuse::InPlace);
        assert_eq!(reuse(1, &two, false), Reuse::No, "linked to something else");
        assert_eq!(reuse(2, &two, false), Reuse::AsIs);
        assert_eq!(reuse(2, &two, true), Reuse::No, "taken by another group");
        assert_eq!(reuse(1, &one, true), Reuse::No);
    }

    #[test]
    fn decisions() {
        use Action::*;
        let reg = libc::S_IFREG;
        let lnk = libc::S_IFLNK;
        assert_eq!(decide(reg, Diff::Same, Reuse::InPlace), Keep);
        assert_eq!(decide(reg, Diff::Same, Reuse::AsIs), Keep);
        assert_eq!(decide(reg, Diff::Same, Reuse::No), Rewrite);
        assert_eq!(decide(reg, Diff::Meta, Reuse::InPlace), UpdateMetadata);
        assert_eq!(decide(reg, Diff::Meta, Reuse::AsIs), Rewrite);
        assert_eq!(decide(reg, Diff::Data, Reuse::InPlace), Rewrite);
        assert_eq!(decide(lnk, Diff::Meta, Reuse::InPlace), Rewrite);
        assert_eq!(decide(lnk, Diff::Same, Reuse::InPlace), Keep);
        assert_eq!(decide(libc::S_IFIFO, Diff::Meta, Reuse::InPlace), Rewrite);
    }
}
