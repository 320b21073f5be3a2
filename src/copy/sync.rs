//! Write-back: makes the on-disk directory (reached through its private side bind)
//! equal to the live tmpfs, writing only what changed.
//!
//! # What is compared
//!
//! Both directories of a level are listed with readdir, sorted by name and merged, so
//! a level costs one listing per side plus one `fstatat` per entry and side (readdir's
//! `d_type` saves a stat for names only one side has). A pair of entries is then:
//!
//! - regular files: *rewritten* when type, size or mtime (to the nanosecond) differ;
//!   otherwise, when mode, owner, group or copied extended attributes (and with them
//!   ACLs) differ, their metadata is *updated in place*, without touching the data;
//! - symlinks: rewritten when their target bytes differ; FIFOs, sockets and devices:
//!   recreated when type or device number differ. Both have no data, so a change of
//!   their metadata (owner, times, attributes; mode for nodes) recreates them too,
//!   which keeps every in-place change on an inode that could be opened and checked;
//! - directories: created when missing, entered, and their mode, owner, mtime and
//!   attributes made equal after their contents (which bump the mtime);
//! - hard links: names of one source inode end up as names of one destination inode.
//!   The first name seen is compared as above; the others are linked to it unless they
//!   already are. A multiply-linked inode is never changed in place: another of its
//!   names might lie outside the tree.
//!
//! Atimes are not compared (reading a cached file would make it "changed"), but they
//! are copied with everything that is written. Names only the destination has are
//! removed, directories recursively; a type change removes the old entry and writes
//! the new one.
//!
//! # Crash safety
//!
//! Data is never written into an existing destination inode. A file, symlink or node
//! is created under a temporary name ([`TEMP_PREFIX`] and random hex) in its final
//! directory with `O_CREAT|O_EXCL|O_NOFOLLOW`, filled, given owner, attributes, mode
//! and times, `fsync`ed, and only then `renameat`ed over the final name, which
//! atomically replaces the old entry. Whatever kills the process (or the machine), a
//! name refers either to the complete old or to the complete new inode. Every
//! directory that got names created, replaced or removed is `fsync`ed when it is done,
//! so the sync is durable when `sync_tree` returns. Leftover temporaries of an
//! interrupted run are removed by the next one.
//!
//! # Symlink safety
//!
//! Every destination directory is opened relative to its parent with
//! `O_NOFOLLOW|O_DIRECTORY`, every other destination operation is relative to such a
//! descriptor and does not follow a symlink in the last component (`*at` calls with
//! `AT_SYMLINK_NOFOLLOW`, `O_NOFOLLOW`, `renameat`, `unlinkat`, `l*xattr` through
//! `/proc/self/fd/<dir>/<name>`). A symlink planted in the destination is therefore
//! just an entry of the wrong type: it is replaced (unlinked or renamed over), never
//! followed. In-place metadata updates go through a descriptor that was checked to be
//! the same, singly-linked regular file that was compared. Directories of another
//! filesystem are neither entered nor removed, on either side.
//!
//! # Reserved names
//!
//! Names starting with [`TEMP_PREFIX`] are reserved for the write-back's temporaries:
//! they are skipped in the source and removed from the destination.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag, RenameFlags};
use nix::sys::stat::{self, FileStat, Mode, SFlag};
use nix::unistd::{self, UnlinkatFlags};

use super::ops::{
    dst_err, file_type, link_to_first_copy, open_dst_dir, open_src, open_src_typed, permissions, src_err,
    Failed, RelPath, Reporter, Transfer,
};
use super::{open_root_dir, CopyError};

/// Names starting with this are the write-back's temporaries: skipped in the source,
/// removed from the destination.
pub const TEMP_PREFIX: &str = ".tmpfsctl-wb.";

/// What a [`sync_tree`] did. Every source entry below the root counts once, in
/// `files_written`, `metadata_updated`, `dirs_created`, `links_written`,
/// `specials_written` or `unchanged`; every removed destination entry (each entry of
/// a removed tree) in `deleted`, or in `temp_removed` for the temporaries an
/// interrupted run left behind.
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
}

/// Makes the tree under `dst` (the on-disk directory, reached through a private side
/// bind) equal to the tree under `src` (the live tmpfs), writing only what changed.
/// The metadata of the `dst` root directory itself is left alone.
///
/// See the [module documentation](self) for what is compared, the crash-safety and the
/// symlink-safety guarantees. Source entries that vanish while the sync runs are
/// skipped (left as they are on disk), so a busy application cannot fail it; any other
/// error aborts the sync, leaving every destination name with its complete old or new
/// contents. Owners can only be preserved as root.
///
/// `progress` gets the running totals every 1000 entries or 100 ms, whichever comes
/// first (also during a long file), and once more at the end.
pub fn sync_tree(
    src: &Path,
    dst: &Path,
    progress: Option<&mut dyn FnMut(&SyncStats)>,
) -> Result<SyncStats, CopyError> {
    let (src_fd, src_st) = open_root_dir(src, true)?;
    let (dst_fd, dst_st) = open_root_dir(dst, false)?;
    let mut syncer = Syncer {
        reporter: Reporter::new(progress),
        src_dev: src_st.st_dev,
        dst_dev: dst_st.st_dev,
        rel: RelPath::default(),
        links: HashMap::new(),
        claimed: HashSet::new(),
        transfer: Transfer::default(),
        temps: TempNames::new(),
    };
    syncer.run(src_fd, dst_fd)?;
    syncer.reporter.report();
    Ok(syncer.reporter.stats)
}

/// One name of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Name {
    name: CString,
    dtype: Option<Type>,
}

/// What the walk does with one name of a directory pair.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// Only the destination has it: removed. `temp`: a leftover temporary.
    Remove { name: Name, temp: bool },
    /// The source has it; `in_dst` whether the destination listed it too.
    Sync { name: Name, in_dst: bool },
}

fn is_temp(name: &CStr) -> bool {
    name.to_bytes().starts_with(TEMP_PREFIX.as_bytes())
}

/// Merges the two listings of a directory pair: removals first (they free space for
/// what is written), then the source's names in byte order. Reserved names are
/// skipped in the source and removed from the destination.
fn pair_listings(mut src: Vec<Name>, mut dst: Vec<Name>) -> Vec<Step> {
    src.retain(|n| !is_temp(&n.name));
    src.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    dst.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let mut removals = Vec::new();
    let mut syncs = Vec::with_capacity(src.len());
    let mut theirs = dst.into_iter().peekable();
    for name in src {
        while let Some(other) = theirs.next_if(|d| d.name < name.name) {
            let temp = is_temp(&other.name);
            removals.push(Step::Remove { name: other, temp });
        }
        let in_dst = theirs.next_if(|d| d.name == name.name).is_some();
        syncs.push(Step::Sync { name, in_dst });
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
    src: Dir,
    dst: Dir,
    steps: std::vec::IntoIter<Step>,
    /// The source directory's, applied after the contents; `None` for the root, whose
    /// metadata belongs to the caller.
    meta: Option<FileStat>,
    /// The destination directory's before the sync touched it; `None` if created.
    before: Option<FileStat>,
    /// Names in `dst` were created, replaced or removed: fsync it when done.
    changed: bool,
    rel_len: usize,
}

struct Syncer<'p> {
    reporter: Reporter<'p, SyncStats>,
    src_dev: u64,
    dst_dev: u64,
    rel: RelPath,
    /// Source inode (dev, ino) → its destination inode, for multiply-linked inodes.
    links: HashMap<(u64, u64), Group>,
    /// Destination inodes that stand for a group: nothing else may keep them.
    claimed: HashSet<u64>,
    transfer: Transfer,
    temps: TempNames,
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

fn read_names(dir: &mut Dir) -> nix::Result<Vec<Name>> {
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry?;
        let name = entry.file_name();
        if !matches!(name.to_bytes(), b"." | b"..") {
            names.push(Name {
                name: name.to_owned(),
                dtype: entry.file_type(),
            });
        }
    }
    Ok(names)
}

fn vanished(f: &Failed) -> bool {
    f.errno() == Some(libc::ENOENT)
}

impl Syncer<'_> {
    fn run(&mut self, src: OwnedFd, dst: OwnedFd) -> Result<(), CopyError> {
        let root = self
            .frame(src, dst, None, None)
            .map_err(|f| f.at(PathBuf::from(".")))?;
        let mut stack = vec![root];
        while let Some(top) = stack.last_mut() {
            let Some(step) = top.steps.next() else {
                let done = stack.pop().expect("the loop runs only while a frame is stacked");
                self.leave(&done).map_err(|f| f.at(self.rel.path(None)))?;
                if let Some(parent) = stack.last() {
                    self.rel.truncate(parent.rel_len);
                }
                continue;
            };
            let (Step::Remove { name, .. } | Step::Sync { name, .. }) = &step;
            let outcome = self
                .step(&stack, &step)
                .map_err(|f| f.at(self.rel.path(Some(&name.name))))?;
            let top = stack.last_mut().expect("step leaves the stack as it was");
            top.changed |= outcome.changed;
            if let Some(child) = outcome.enter {
                stack.push(child);
            }
            self.reporter.entry_done();
        }
        Ok(())
    }

    /// Lists a directory pair (a directory created just now is known to be empty).
    fn frame(
        &self,
        src: OwnedFd,
        dst: OwnedFd,
        meta: Option<FileStat>,
        before: Option<FileStat>,
    ) -> Result<Frame, Failed> {
        let mut src = Dir::from_fd(src).map_err(src_err("read directory"))?;
        let mut dst = Dir::from_fd(dst).map_err(dst_err("read directory"))?;
        let src_names = read_names(&mut src).map_err(src_err("read directory"))?;
        let dst_names = if before.is_none() && meta.is_some() {
            Vec::new()
        } else {
            read_names(&mut dst).map_err(dst_err("read directory"))?
        };
        Ok(Frame {
            src,
            dst,
            steps: pair_listings(src_names, dst_names).into_iter(),
            meta,
            before,
            changed: false,
            rel_len: self.rel.len(),
        })
    }

    fn step(&mut self, stack: &[Frame], step: &Step) -> Result<Outcome, Failed> {
        let parent = stack.last().expect("the root frame stays until the walk ends");
        match step {
            Step::Remove { name, temp } => {
                let removed = self.remove(parent.dst.as_fd(), &name.name, name.dtype)?;
                if *temp {
                    self.reporter.stats.temp_removed += 1;
                } else {
                    self.reporter.stats.deleted += removed;
                }
                Ok(Outcome::changed())
            }
            Step::Sync { name, in_dst } => {
                let (src_dir, dst_dir) = (parent.src.as_fd(), parent.dst.as_fd());
                let Some((s, src_fd)) = self.stat_source(src_dir, name)? else {
                    return Ok(Outcome::default());
                };
                let d = if *in_dst {
                    match stat::fstatat(dst_dir, name.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                        Ok(d) => Some(d),
                        Err(Errno::ENOENT) => None,
                        Err(e) => return Err(dst_err("stat")(e)),
                    }
                } else {
                    None
                };
                match src_fd {
                    Some(src_fd) => self.sync_dir(dst_dir, &name.name, src_fd, s, d),
                    None => self.sync_leaf(stack, &name.name, &s, d),
                }
            }
        }
    }

    /// Stats a source entry; directories are opened (and stated through the
    /// descriptor). `None` when it vanished since the listing.
    fn stat_source(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &Name,
    ) -> Result<Option<(FileStat, Option<OwnedFd>)>, Failed> {
        let name_c = name.name.as_c_str();
        let mut is_dir = name.dtype == Some(Type::Directory);
        if !is_dir {
            let s = match stat::fstatat(dir, name_c, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(s) => s,
                Err(Errno::ENOENT) => return Ok(None),
                Err(e) => return Err(src_err("stat")(e)),
            };
            if file_type(&s) != libc::S_IFDIR {
                return Ok(Some((s, None)));
            }
            is_dir = true;
        }
        debug_assert!(is_dir);
        let fd = match open_src_typed(dir, name_c, libc::S_IFDIR) {
            Ok(fd) => fd,
            Err(f) if vanished(&f) => return Ok(None),
            // Replaced by a non-directory since the listing: the next sync sees it.
            Err(f) if matches!(f.errno(), Some(libc::ENOTDIR | libc::ELOOP)) => return Ok(None),
            Err(f) => return Err(f),
        };
        let s = stat::fstat(&fd).map_err(src_err("stat"))?;
        Ok(Some((s, Some(fd))))
    }

    fn sync_dir(
        &mut self,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
        src: OwnedFd,
        s: FileStat,
        d: Option<FileStat>,
    ) -> Result<Outcome, Failed> {
        let mut changed = false;
        let (dst, before) = match d {
            Some(d) if file_type(&d) == libc::S_IFDIR => {
                if d.st_dev != self.dst_dev {
                    // Another filesystem is mounted here: not ours to change.
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
                    self.reporter.stats.deleted += self.remove(dst_dir, name, dtype_of(&d))?;
                }
                // Owner-only until its metadata is applied.
                stat::mkdirat(dst_dir, name, Mode::S_IRWXU).map_err(dst_err("create directory"))?;
                changed = true;
                (
                    open_dst_dir(dst_dir, name).map_err(dst_err("open directory"))?,
                    None,
                )
            }
        };
        if s.st_dev != self.src_dev {
            // A mount point in the tmpfs: the directory itself is synced, but neither
            // entered nor emptied on disk.
            self.finish_dir(src.as_fd(), dst.as_fd(), &s, before.as_ref(), false)?;
            return Ok(Outcome { enter: None, changed });
        }
        let mut frame = self.frame(src, dst, Some(s), before)?;
        self.rel.push(name);
        frame.rel_len = self.rel.len();
        Ok(Outcome {
            enter: Some(frame),
            changed,
        })
    }

    /// Applies a directory's metadata after its contents and makes the changes to its
    /// names durable.
    ///
    /// A directory whose mtime differs only because the sync changed names in it counts
    /// as unchanged: `before` is how it looked before (`None` if it was created).
    fn leave(&mut self, frame: &Frame) -> Result<(), Failed> {
        match &frame.meta {
            Some(s) => self.finish_dir(
                frame.src.as_fd(),
                frame.dst.as_fd(),
                s,
                frame.before.as_ref(),
                frame.changed,
            ),
            None if frame.changed => unistd::fsync(frame.dst.as_fd()).map_err(dst_err("fsync directory")),
            None => Ok(()),
        }
    }

    fn finish_dir(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        s: &FileStat,
        before: Option<&FileStat>,
        changed: bool,
    ) -> Result<(), Failed> {
        let now = stat::fstat(dst).map_err(dst_err("stat"))?;
        let same_xattrs = before.is_some() && self.transfer.same_xattrs_fd(src, dst)?;
        let same = same_xattrs && same_meta(s, &now);
        if !same {
            self.transfer.set_metadata(src, dst, s, true)?;
        }
        let stats = &mut self.reporter.stats;
        match before {
            None => stats.dirs_created += 1,
            Some(before) if same_xattrs && same_meta(s, before) => stats.unchanged += 1,
            Some(_) => stats.metadata_updated += 1,
        }
        if changed || !same {
            unistd::fsync(dst).map_err(dst_err("fsync directory"))?;
        }
        Ok(())
    }

    fn sync_leaf(
        &mut self,
        stack: &[Frame],
        name: &CStr,
        s: &FileStat,
        d: Option<FileStat>,
    ) -> Result<Outcome, Failed> {
        let parent = stack.last().expect("the root frame stays until the walk ends");
        let (src_dir, dst_dir) = (parent.src.as_fd(), parent.dst.as_fd());
        if let Some(d) = &d {
            if file_type(d) == libc::S_IFDIR && d.st_dev != self.dst_dev {
                return Err(dst_err("replace the mount point")(Errno::EBUSY));
            }
        }
        let key = (s.st_dev, s.st_ino);
        if s.st_nlink > 1 {
            if let Some(group) = self.links.get_mut(&key) {
                group.remaining -= 1;
                let (path, ino) = (group.path.clone(), group.ino);
                if group.remaining == 0 {
                    self.links.remove(&key);
                }
                if d.is_some_and(|d| d.st_ino == ino && file_type(&d) != libc::S_IFDIR) {
                    self.reporter.stats.unchanged += 1;
                    return Ok(Outcome::default());
                }
                self.write_hard_link(stack, name, &path, d.as_ref())?;
                self.reporter.stats.links_written += 1;
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
        if diff != Diff::Data && reuse != Reuse::No {
            if kind == libc::S_IFLNK && !self.same_target(src_dir, dst_dir, name)? {
                diff = Diff::Data;
            } else if diff == Diff::Same && !self.transfer.same_xattrs_at((src_dir, name), (dst_dir, name))? {
                diff = Diff::Meta;
            }
        }
        let mut action = decide(kind, diff, reuse);
        let mut outcome = Outcome::default();
        let mut ino = d.as_ref().map(|d| d.st_ino);
        if action == Action::UpdateMetadata {
            let d = d.as_ref().expect("decide updates existing entries only");
            match self.update_file_metadata(src_dir, dst_dir, name, d)? {
                Some(true) => self.reporter.stats.metadata_updated += 1,
                Some(false) => action = Action::Rewrite,
                None => return Ok(outcome),
            }
        }
        match action {
            Action::Keep => self.reporter.stats.unchanged += 1,
            Action::UpdateMetadata => {}
            Action::Rewrite => match self.rewrite(src_dir, dst_dir, name, s, d.as_ref())? {
                Some(new_ino) => {
                    ino = Some(new_ino);
                    outcome.changed = true;
                }
                None => return Ok(outcome),
            },
        }
        if s.st_nlink > 1 {
            let ino = ino.expect("the entry exists now");
            self.claimed.insert(ino);
            let path = self.rel.joined(name).into_boxed_slice();
            let remaining = s.st_nlink - 1;
            self.links.insert(key, Group { path, ino, remaining });
        }
        Ok(outcome)
    }

    fn same_target(
        &mut self,
        src_dir: BorrowedFd<'_>,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
    ) -> Result<bool, Failed> {
        let ours = match fcntl::readlinkat(src_dir, name) {
            Ok(target) => target,
            // Vanished or replaced: treated as changed, the rewrite sorts it out.
            Err(Errno::ENOENT | Errno::EINVAL) => return Ok(false),
            Err(e) => return Err(src_err("read symlink")(e)),
        };
        let theirs = fcntl::readlinkat(dst_dir, name).map_err(dst_err("read symlink"))?;
        Ok(ours == theirs)
    }

    /// Updates owner, attributes, mode and times of a regular file in place, through a
    /// descriptor checked to be the singly-linked file `d` that was compared. `Some(false)`
    /// when it is not (anymore), so it must be rewritten; `None` when the source
    /// vanished.
    fn update_file_metadata(
        &mut self,
        src_dir: BorrowedFd<'_>,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
        d: &FileStat,
    ) -> Result<Option<bool>, Failed> {
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
            return Ok(Some(false));
        }
        // Reopening the checked inode through /proc cannot land on another one.
        let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&path_fd));
        let dst = fcntl::open(proc.as_str(), OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(dst_err("open"))?;
        self.transfer.set_metadata(src.as_fd(), dst.as_fd(), &s, true)?;
        unistd::fsync(&dst).map_err(dst_err("fsync"))?;
        Ok(Some(true))
    }

    /// Writes a non-directory anew under a temporary name and renames it over `name`.
    /// Returns the new inode, or `None` when the source vanished or changed type.
    fn rewrite(
        &mut self,
        src_dir: BorrowedFd<'_>,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
        s: &FileStat,
        d: Option<&FileStat>,
    ) -> Result<Option<u64>, Failed> {
        let kind = file_type(s);
        let (temp, ino) = match kind {
            libc::S_IFREG => {
                let src = match open_src(src_dir, name, OFlag::empty()) {
                    Ok(fd) => File::from(fd),
                    Err(Errno::ENOENT | Errno::ELOOP) => return Ok(None),
                    Err(e) => return Err(src_err("open file")(e)),
                };
                let s = stat::fstat(&src).map_err(src_err("stat"))?;
                if file_type(&s) != libc::S_IFREG {
                    return Ok(None);
                }
                let (temp, fd) = create_temp(&mut self.temps, dst_dir, |dir, temp| {
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
                let dst = File::from(fd);
                let reporter = &mut self.reporter;
                self.transfer.copy_data(&src, &dst, &s, &mut |n| {
                    reporter.stats.bytes_written += n;
                    reporter.report_if_due();
                })?;
                self.transfer.set_metadata(src.as_fd(), dst.as_fd(), &s, true)?;
                unistd::fsync(&dst).map_err(dst_err("fsync"))?;
                let ino = stat::fstat(&dst).map_err(dst_err("stat"))?.st_ino;
                self.reporter.stats.files_written += 1;
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
        self.replace(temp, name, d)?;
        Ok(Some(ino))
    }

    /// Metadata of a new symlink or node (which cannot be opened); returns it with its
    /// inode. Its data is part of the inode, made durable by the directory's fsync.
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
    /// over `name`.
    fn write_hard_link(
        &mut self,
        stack: &[Frame],
        name: &CStr,
        first: &[u8],
        d: Option<&FileStat>,
    ) -> Result<(), Failed> {
        let dst_dir = stack.last().expect("the root frame stays").dst.as_fd();
        let rel = self.rel.as_bytes();
        let (temp, ()) = create_temp(&mut self.temps, dst_dir, |dir, temp| {
            link_to_first_copy(|i| stack[i].dst.as_fd(), rel, first, dir, temp)
        })?;
        self.replace(temp, name, d)
    }

    /// Puts a finished temporary in place of `name`. A directory in the way is swapped
    /// out atomically (RENAME_EXCHANGE) and then removed under the temporary name.
    fn replace(&mut self, mut temp: Temp<'_>, name: &CStr, d: Option<&FileStat>) -> Result<(), Failed> {
        let dir = temp.dir;
        if d.is_some_and(|d| file_type(d) == libc::S_IFDIR) {
            match fcntl::renameat2(dir, temp.name.as_c_str(), dir, name, RenameFlags::RENAME_EXCHANGE) {
                Ok(()) => {
                    temp.live = false;
                    self.reporter.stats.deleted +=
                        self.remove(dir, temp.name.as_c_str(), Some(Type::Directory))?;
                    return Ok(());
                }
                Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => {
                    self.reporter.stats.deleted += self.remove(dir, name, Some(Type::Directory))?;
                }
                Err(e) => return Err(dst_err("replace")(e)),
            }
        }
        fcntl::renameat(dir, temp.name.as_c_str(), dir, name).map_err(dst_err("rename into place"))?;
        temp.live = false;
        Ok(())
    }

    /// Removes a destination entry, a directory with everything below it, without
    /// following symlinks or entering another filesystem; returns how many entries
    /// went.
    fn remove(&mut self, dir: BorrowedFd<'_>, name: &CStr, dtype: Option<Type>) -> Result<u64, Failed> {
        if dtype != Some(Type::Directory) {
            match unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) => return Ok(1),
                Err(Errno::ENOENT) => return Ok(0),
                Err(Errno::EISDIR) => {}
                Err(e) => return Err(dst_err("remove")(e)),
            }
        }
        remove_tree(dir, name, self.dst_dev)
    }
}

fn dtype_of(st: &FileStat) -> Option<Type> {
    match file_type(st) {
        libc::S_IFDIR => Some(Type::Directory),
        libc::S_IFREG => Some(Type::File),
        libc::S_IFLNK => Some(Type::Symlink),
        _ => None,
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
        let mut listing = Dir::from_fd(fd.try_clone().map_err(dst_err("open directory to remove"))?)
            .map_err(dst_err("read directory"))?;
        let names = read_names(&mut listing).map_err(dst_err("read directory"))?;
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

/// Creates an entry under a fresh temporary name, trying another name if one is taken
/// (by a planted entry, say).
fn create_temp<'d, T>(
    temps: &mut TempNames,
    dir: BorrowedFd<'d>,
    mut create: impl FnMut(BorrowedFd<'d>, &CStr) -> Result<T, Failed>,
) -> Result<(Temp<'d>, T), Failed> {
    let mut attempts = 0;
    loop {
        let name = temps.next();
        match create(dir, &name) {
            Ok(made) => {
                return Ok((
                    Temp {
                        dir,
                        name,
                        live: true,
                    },
                    made,
                ))
            }
            Err(f) if f.errno() == Some(libc::EEXIST) && attempts < 8 => attempts += 1,
            Err(f) => return Err(f),
        }
    }
}

/// A temporary entry in a destination directory, unlinked on drop unless it was put
/// in place.
struct Temp<'d> {
    dir: BorrowedFd<'d>,
    name: CString,
    live: bool,
}

impl Drop for Temp<'_> {
    fn drop(&mut self) {
        if self.live {
            // Best effort: the next sync removes what is left.
            let _ = unistd::unlinkat(self.dir, self.name.as_c_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

/// `TEMP_PREFIX` + 16 hex digits, from a random seed and a counter through a bijective
/// mixer, so names neither repeat within a run nor are predictable across runs.
struct TempNames {
    seed: u64,
    counter: u64,
}

impl TempNames {
    fn new() -> Self {
        let mut seed = [0u8; 8];
        // SAFETY: the buffer is valid for 8 bytes.
        let got = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), libc::GRND_NONBLOCK) };
        let seed = if got == 8 {
            u64::from_ne_bytes(seed)
        } else {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            now ^ u64::from(std::process::id()).rotate_left(32)
        };
        TempNames { seed, counter: 0 }
    }

    fn next(&mut self) -> CString {
        self.counter += 1;
        let mut z = self
            .seed
            .wrapping_add(self.counter.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        CString::new(format!("{TEMP_PREFIX}{z:016x}")).expect("no NUL in a hex name")
    }
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
        // SAFETY: `stat` is plain old data; all-zero is a valid value.
        let mut st: FileStat = unsafe { std::mem::zeroed() };
        st.st_mode = kind | perm;
        st.st_nlink = 1;
        st.st_size = 10;
        st.st_mtime = 1_700_000_000;
        st.st_mtime_nsec = 5;
        st
    }

    #[test]
    fn listings_merge_into_removals_then_source_names_in_byte_order() {
        let file = Some(Type::File);
        let dir = Some(Type::Directory);
        let src = vec![
            name(b"b", file),
            name(b"\xff", file),
            name(b"a", dir),
            name(b".tmpfsctl-wb.app", file),
            name(b"d", None),
        ];
        let dst = vec![
            name(b"c", dir),
            name(b"a", file),
            name(b".tmpfsctl-wb.0011223344556677", file),
            name(b"\xfe", None),
            name(b"d", Some(Type::Symlink)),
            name(b"z", file),
        ];
        let steps = pair_listings(src, dst);
        let remove = |n: &[u8], dtype, temp| Step::Remove {
            name: name(n, dtype),
            temp,
        };
        let sync = |n: &[u8], dtype, in_dst| Step::Sync {
            name: name(n, dtype),
            in_dst,
        };
        assert_eq!(
            steps,
            vec![
                remove(b".tmpfsctl-wb.0011223344556677", file, true),
                remove(b"c", dir, false),
                remove(b"z", file, false),
                remove(b"\xfe", None, false),
                sync(b"a", dir, true),
                sync(b"b", file, false),
                sync(b"d", None, true),
                sync(b"\xff", file, false),
            ]
        );
        assert!(pair_listings(Vec::new(), Vec::new()).is_empty());
    }

    #[test]
    fn reserved_names_are_recognised_by_prefix_only() {
        assert!(is_temp(c".tmpfsctl-wb.x"));
        assert!(is_temp(c".tmpfsctl-wb."));
        assert!(!is_temp(c".tmpfsctl-wb"));
        assert!(!is_temp(c"x.tmpfsctl-wb.y"));
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

    #[test]
    fn temporary_names_are_reserved_unique_and_unpredictable() {
        let mut names = TempNames::new();
        let mut seen = HashSet::new();
        for _ in 0..10_000 {
            let n = names.next();
            let bytes = n.to_bytes();
            assert!(is_temp(&n));
            let hex = &bytes[TEMP_PREFIX.len()..];
            assert_eq!(hex.len(), 16);
            assert!(hex.iter().all(u8::is_ascii_hexdigit));
            assert!(seen.insert(n));
        }
        assert_ne!(TempNames::new().next(), TempNames::new().next());
    }
}
