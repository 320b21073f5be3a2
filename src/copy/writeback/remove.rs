//! Removing what the RAM deleted, name by name as the rule says, and the write-back's
//! own leftovers. Every removal of a directory here is one walk ([`remove_walk`]):
//! each level opened relative to its parent without following symlinks and listed
//! whole before any of its entries goes; a [`Rule`] says, entry by entry, what goes,
//! and whether a level nothing stayed in goes too.
//!
//! A name the RAM deleted goes only after the walk, once every copy the pass queued
//! is durable ([`Syncer::remove_deferred`]): the RAM may have moved its data to a
//! name the walk reaches later, and a power cut in between would leave it on none.

use std::collections::HashSet;
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{self, FileStat};
use nix::unistd::{self, UnlinkatFlags};

use crate::copy::baseline::{self, Disk, Mark, Ram, Sig, Time, Verdict};
use crate::copy::durable::{DstDir, Job};
use crate::copy::error::{dst_err, src_err, CopyError, Failed};
use crate::copy::ops::{atime, file_type, mtime, open_below, open_dst_dir, split_parent};
use crate::copy::place::{remove_seen, Seen};
use crate::copy::placings::Placings;
use crate::copy::scan::{read_names, Name};
use crate::copy::temp::{is_temp, TempNames};

use super::{rel_path, Syncer};

fn size_and_mtime(st: &FileStat) -> (i64, Time) {
    (st.st_size, (st.st_mtime, st.st_mtime_nsec))
}

/// Calls `found` with the stat of each regular file below the directory `dir`,
/// walked by descriptors without following a symlink (an unreadable directory is
/// passed over), until it returns true; returns whether it did.
fn files_below(dir: OwnedFd, found: &mut dyn FnMut(&FileStat) -> bool) -> bool {
    let mut stack = vec![dir];
    while let Some(dir) = stack.pop() {
        let Ok(names) = read_names(&dir) else { continue };
        for n in names {
            let Ok(st) = stat::fstatat(&dir, n.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            match file_type(&st) {
                libc::S_IFREG if found(&st) => return true,
                libc::S_IFDIR => {
                    if let Ok(sub) = open_dst_dir(dir.as_fd(), &n.name) {
                        stack.push(sub);
                    }
                }
                _ => {}
            }
        }
    }
    false
}

/// A directory's owner and mode (the RAM's, `s`) held back until the removals below
/// it are made: the disk directory (inode `dst_ino` at `rel`) still holds what the
/// RAM deleted from it, which they would open (a directory the RAM made anew in
/// place of a root 0700 one, given to its user and mode 0777, exposed the old one's
/// files until the removals).
pub(super) struct DeferredMeta {
    rel: Vec<u8>,
    dst_ino: u64,
    /// The disk directory's owner and mode when the walk deferred them: changed
    /// since (the application closed it meanwhile), they stay.
    dst_meta: (u32, u32, u32),
    s: FileStat,
}

fn owner_and_mode(st: &FileStat) -> (u32, u32, u32) {
    (st.st_uid, st.st_gid, st.st_mode & 0o7777)
}

/// Whether giving `now` the owner and mode of `s` lets anyone more in: another owner
/// or group, or a permission bit `now` lacks.
pub(super) fn opens_up(s: &FileStat, now: &FileStat) -> bool {
    (s.st_uid, s.st_gid) != (now.st_uid, now.st_gid) || s.st_mode & !now.st_mode & 0o7777 != 0
}

/// A removal the walk decided of a name the RAM deleted, made after it.
pub(super) struct Deferred {
    /// The entry's relative path.
    path: Vec<u8>,
    /// Its disk directory's inode then: a directory the application moved or
    /// replaced since is not the one decided on.
    dir_ino: u64,
    what: Removal,
}

enum Removal {
    /// A non-directory, while it is still as compared.
    Entry(FileStat),
    /// A directory, while the name still holds it (its inode), by the rule for
    /// names the RAM deleted at this time.
    Dir(u64, Time),
}

impl Syncer<'_, '_> {
    /// Decides to remove the disk entry `d` at `path` in `dir`, which the RAM deleted
    /// at `ram_deleted_at`; [`Self::remove_deferred`] removes it.
    pub(super) fn defer_removal(
        &mut self,
        dir: BorrowedFd<'_>,
        path: Vec<u8>,
        d: &FileStat,
        ram_deleted_at: Time,
    ) -> Result<(), Failed> {
        let dir_ino = stat::fstat(dir).map_err(dst_err("stat"))?.st_ino;
        let what = if file_type(d) == libc::S_IFDIR {
            Removal::Dir(d.st_ino, ram_deleted_at)
        } else {
            self.touch(d)?;
            Removal::Entry(*d)
        };
        self.deferred.push(Deferred { path, dir_ino, what });
        Ok(())
    }

    /// Makes the removals the walk deferred; returns how many entries went. The
    /// caller has waited until every job queued is done
    /// ([`Durable::drain`](crate::copy::durable::Durable::drain)), so a file the RAM
    /// moved is durable at its new name before its old one goes.
    ///
    /// The application may have worked in the disk directory since the decision
    /// (after a switch to disk): an entry it removed, replaced or changed (its
    /// ctime, for a singly-linked one: the walk's own links change that of the
    /// others) stays as it is now, and so does a directory it removed, moved or
    /// replaced, and what is below. Directory by directory, each opened again from
    /// `root` without following a symlink. A directory whose names changed gets its
    /// times back as its finish left them (and its record then) and is `fsync`ed.
    pub(super) fn remove_deferred(&mut self, root: BorrowedFd<'_>) -> Result<u64, CopyError> {
        let deferred = std::mem::take(&mut self.deferred);
        let same_dir = |a: &Deferred, b: &Deferred| {
            a.dir_ino == b.dir_ino && split_parent(&a.path).0 == split_parent(&b.path).0
        };
        let mut removed = 0;
        for group in deferred.chunk_by(same_dir) {
            let parent = split_parent(&group[0].path).0;
            let dir = match open_below(root, parent) {
                Ok(fd) => fd,
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
                Err(e) => return Err(dst_err("open directory")(e).at(rel_path(parent))),
            };
            let at_parent = |f: Failed| f.at(rel_path(parent));
            let before = stat::fstat(&dir).map_err(dst_err("stat")).map_err(at_parent)?;
            if (before.st_dev, before.st_ino) != (self.dst_dev, group[0].dir_ino) {
                continue;
            }
            let mut acted = false;
            for item in group {
                let outcome = self
                    .remove_one(dir.as_fd(), item)
                    .map_err(|f| f.at(rel_path(&item.path)))?;
                if let Some((went, kept)) = outcome {
                    self.reporter.stats.deleted += went;
                    self.reporter.stats.kept_disk += kept;
                    removed += went;
                    acted |= went + kept > 0;
                } else {
                    self.reporter.stats.kept_disk += 1;
                }
            }
            // An entry renamed away and back gave the directory a new mtime too.
            if acted {
                self.removed_from(parent, dir, &before).map_err(at_parent)?;
            }
        }
        Ok(removed)
    }

    /// Out of space, the removals free room for the pass that follows, but this one
    /// may have stopped before it wrote the new name of a file the RAM moved, or
    /// failed to write it, and then a power cut before that pass would leave the
    /// data on no name. So a name the RAM deleted stays when a RAM file has its size
    /// and mtime (a move keeps both), and so does a directory holding one, until a
    /// pass succeeds. `src_root`: the RAM root; `None` (it cannot be read) keeps all.
    pub(super) fn spare_moved(&mut self, src_root: Option<OwnedFd>, dst_root: BorrowedFd<'_>) {
        let Some(src_root) = src_root else {
            self.deferred.clear();
            return;
        };
        let mut in_ram = HashSet::new();
        files_below(src_root, &mut |st| {
            in_ram.insert(size_and_mtime(st));
            false
        });
        self.deferred.retain(|item| match &item.what {
            Removal::Entry(d) => file_type(d) != libc::S_IFREG || !in_ram.contains(&size_and_mtime(d)),
            Removal::Dir(..) => match open_below(dst_root, &item.path) {
                Ok(dir) => !files_below(dir, &mut |st| in_ram.contains(&size_and_mtime(st))),
                Err(_) => false,
            },
        });
    }

    /// Holds back the directory's metadata `s` (the RAM's) for the disk directory
    /// `now` at `rel` when it may open it up (owner, mode, or its attributes, an
    /// access ACL among them: `attrs_differ`) while removals below it wait; true if
    /// it did.
    pub(super) fn defer_meta(
        &mut self,
        rel: &[u8],
        s: &FileStat,
        now: &FileStat,
        attrs_differ: bool,
    ) -> bool {
        let below = |p: &[u8]| rel.is_empty() || (p.starts_with(rel) && p.get(rel.len()) == Some(&b'/'));
        if !(opens_up(s, now) || attrs_differ) || !self.deferred.iter().any(|d| below(&d.path)) {
            return false;
        }
        self.deferred_meta.push(DeferredMeta {
            rel: rel.to_vec(),
            dst_ino: now.st_ino,
            dst_meta: owner_and_mode(now),
            s: *s,
        });
        true
    }

    /// Applies the metadata [`Self::defer_meta`] held back, once the removals are
    /// made: each directory reached again from the roots without following a
    /// symlink, on both sides the one compared (else it is left for the next pass).
    pub(super) fn apply_deferred_meta(
        &mut self,
        src_root: BorrowedFd<'_>,
        dst_root: BorrowedFd<'_>,
    ) -> Result<(), CopyError> {
        for item in std::mem::take(&mut self.deferred_meta) {
            let at = |f: Failed| f.at(rel_path(&item.rel));
            let (Ok(src), Ok(dst)) = (open_below(src_root, &item.rel), open_below(dst_root, &item.rel))
            else {
                continue;
            };
            let (s, d) = (
                stat::fstat(&src).map_err(src_err("stat")).map_err(at)?,
                stat::fstat(&dst).map_err(dst_err("stat")).map_err(at)?,
            );
            if (s.st_dev, s.st_ino) != (item.s.st_dev, item.s.st_ino)
                || d.st_ino != item.dst_ino
                || owner_and_mode(&d) != item.dst_meta
            {
                continue;
            }
            // The RAM directory as it is now: changed since the walk read it (closed
            // again), its later owner and mode (the walk's opened it for good: a
            // review helper's probe).
            self.transfer
                .set_metadata(src.as_fd(), dst.as_fd(), &s, true)
                .map_err(at)?;
            let now = stat::fstat(&dst).map_err(dst_err("stat")).map_err(at)?;
            if !item.rel.is_empty() {
                self.journal_own_meta(&item.rel, &now, dst.as_fd(), false)
                    .map_err(at)?;
                self.record(item.rel.clone(), &now);
            }
            self.durable.submit(Job::FsyncDir {
                dir: DstDir::new(dst, Vec::new()),
                rel: rel_path(&item.rel),
            });
        }
        Ok(())
    }

    /// One deferred removal in its directory `dir`: how many entries went and how
    /// many stayed, or `None` where the entry is not the one decided on any more
    /// (changed or replaced: it stays) and nothing was done.
    fn remove_one(&mut self, dir: BorrowedFd<'_>, item: &Deferred) -> Result<Option<(u64, u64)>, Failed> {
        let name = CString::new(split_parent(&item.path).1).expect("a name read from a directory has no NUL");
        let now = match stat::fstatat(dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(now) => now,
            Err(Errno::ENOENT) => return Ok(Some((0, 0))),
            Err(e) => return Err(dst_err("stat")(e)),
        };
        match &item.what {
            Removal::Entry(d) => {
                if now.st_ino != d.st_ino || (d.st_nlink == 1 && Sig::of(&now).ctime != Sig::of(d).ctime) {
                    return Ok(None);
                }
                let went = self.remove_compared(dir, &name, d)?;
                if went > 0 {
                    self.journal_gone(&item.path)?;
                }
                Ok(Some((went, 1 - went)))
            }
            Removal::Dir(ino, ram_deleted_at) => {
                if now.st_ino != *ino || file_type(&now) != libc::S_IFDIR {
                    return Ok(None);
                }
                let res = self.remove_merged(dir, &name, &item.path, *ram_deleted_at)?;
                if stat::fstatat(dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) == Err(Errno::ENOENT) {
                    self.journal_gone(&item.path)?;
                }
                Ok(Some(res))
            }
        }
    }

    /// The directory `dir` at `parent` lost names to the pass, after its finish left
    /// it as `before`.
    fn removed_from(&mut self, parent: &[u8], dir: OwnedFd, before: &FileStat) -> Result<(), Failed> {
        stat::futimens(&dir, &atime(before), &mtime(before)).map_err(dst_err("set times of"))?;
        if !parent.is_empty() && matches!(self.marks.get(parent), Some(Mark::Entry(_))) {
            let now = stat::fstat(&dir).map_err(dst_err("stat"))?;
            self.record(parent.to_vec(), &now);
        }
        self.durable.submit(Job::FsyncDir {
            dir: DstDir::new(dir, Vec::new()),
            rel: rel_path(parent),
        });
        Ok(())
    }

    /// Removes the disk non-directory `name` the rule decided to remove, if the
    /// application did not change it since it was compared (`d`); returns how many
    /// entries went.
    pub(super) fn remove_compared(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        d: &FileStat,
    ) -> Result<u64, Failed> {
        let temp = self.temps.next();
        let gone = remove_seen(dir, name, Seen::of(d), &temp).map_err(dst_err("remove"))?;
        Ok(u64::from(gone))
    }

    /// Removes the disk directory `name` (at `path`) the way the rule removes names the
    /// RAM deleted at `ram_deleted_at`: an entry goes when the baseline has it and
    /// the disk did not change it later; a directory goes when it ended up empty.
    /// Nothing is followed and no other filesystem entered. Returns how many entries
    /// went and how many stayed.
    pub(super) fn remove_merged(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &CStr,
        path: &[u8],
        ram_deleted_at: Time,
    ) -> Result<(u64, u64), Failed> {
        remove_walk(
            parent,
            name,
            path,
            &mut Merged {
                syncer: self,
                ram_deleted_at,
            },
        )
    }
}

/// What a removal walk does with an entry of a directory it entered.
enum Step {
    /// It stays, and so does every directory above it.
    Keep,
    /// A directory to enter ([`Rule::enter`]): its entries are decided in turn.
    Enter,
    /// Unlinked, whatever it is now: the write-back's own, or decided already. A
    /// directory found there instead is entered ([`Rule::enter`]).
    Unlink,
    /// Unlinked only while it is still the entry looked at, through the temporary
    /// name given (see [`remove_seen`]).
    RemoveSeen(FileStat, CString),
    /// The rule removed this many entries there itself (none if it was gone).
    Gone(u64),
}

/// How a removal walk decides.
trait Rule {
    /// Opens the directory `name` in `parent` for the walk, or `None` to keep it (and
    /// what it holds) as it is.
    fn enter(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> Result<Option<OwnedFd>, Failed>;
    /// What becomes of the entry `entry` (at `path`) of the entered directory `dir`.
    fn step(&mut self, dir: BorrowedFd<'_>, entry: &Name, path: &[u8]) -> Result<Step, Failed>;
    /// Removes the directory `name` in `above`, entered as `dir`, in which the walk
    /// kept nothing (the application may have put something there since): whether it
    /// went.
    fn remove_dir(&mut self, above: BorrowedFd<'_>, name: &CStr, dir: &OwnedFd) -> Result<bool, Failed>;
    /// The walk removed the entry at `path` (once it is gone).
    fn removed(&mut self, _path: &[u8]) -> Result<(), Failed> {
        Ok(())
    }
}

/// One directory of a removal walk, listed whole when entered.
struct Level {
    dir: OwnedFd,
    names: std::vec::IntoIter<Name>,
    name: CString,
    path: Vec<u8>,
    kept: u64,
}

impl Level {
    fn new(dir: OwnedFd, name: &CStr, path: Vec<u8>) -> Result<Level, Failed> {
        let names = read_names(&dir).map_err(dst_err("read directory"))?;
        Ok(Level {
            dir,
            names: names.into_iter(),
            name: name.to_owned(),
            path,
            kept: 0,
        })
    }
}

/// Removes the directory `name` below `parent` (at `path`) as `rule` says, depth
/// first; returns how many entries went and how many it kept: each entry a rule
/// kept, 1 for each level it kept nothing in that did not go, and 1 if the rule did
/// not enter `name` at all.
fn remove_walk(
    parent: BorrowedFd<'_>,
    name: &CStr,
    path: &[u8],
    rule: &mut impl Rule,
) -> Result<(u64, u64), Failed> {
    let Some(top) = rule.enter(parent, name)? else {
        return Ok((0, 1));
    };
    let mut removed = 0;
    let mut stack = vec![Level::new(top, name, path.to_vec())?];
    while let Some(level) = stack.last_mut() {
        let Some(entry) = level.names.next() else {
            let done = stack.pop().expect("the loop runs only while a level is stacked");
            let above = stack.last().map_or(parent, |l| l.dir.as_fd());
            let mut kept = done.kept;
            if kept == 0 {
                if rule.remove_dir(above, &done.name, &done.dir)? {
                    rule.removed(&done.path)?;
                    removed += 1;
                } else {
                    kept = 1;
                }
            }
            match stack.last_mut() {
                Some(up) => up.kept += kept,
                None => return Ok((removed, kept)),
            }
            continue;
        };
        let dir = level.dir.as_fd();
        let mut child = level.path.clone();
        child.push(b'/');
        child.extend_from_slice(entry.name.to_bytes());
        let opened = match rule.step(dir, &entry, &child)? {
            Step::Keep => {
                level.kept += 1;
                continue;
            }
            Step::Gone(n) => {
                removed += n;
                continue;
            }
            Step::RemoveSeen(d, temp) => {
                if remove_seen(dir, entry.name.as_c_str(), Seen::of(&d), &temp).map_err(dst_err("remove"))? {
                    rule.removed(&child)?;
                    removed += 1;
                } else {
                    level.kept += 1;
                }
                continue;
            }
            Step::Unlink => match unistd::unlinkat(dir, entry.name.as_c_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) => {
                    rule.removed(&child)?;
                    removed += 1;
                    continue;
                }
                Err(Errno::ENOENT) => continue,
                Err(Errno::EISDIR) => rule.enter(dir, &entry.name)?,
                Err(e) => return Err(dst_err("remove")(e)),
            },
            Step::Enter => rule.enter(dir, &entry.name)?,
        };
        match opened {
            Some(fd) => {
                let next = Level::new(fd, &entry.name, child)?;
                stack.push(next);
            }
            None => level.kept += 1,
        }
    }
    unreachable!("the last level returns")
}

/// The rule's removal of a directory the RAM deleted: each entry as
/// [`baseline::decide`] says of a name the RAM deleted then (or as the seed's copy
/// the disk deleted, [`Syncer::copy_deleted`]); the write-back's temporaries go
/// whatever it says, and a directory on another filesystem stays.
struct Merged<'s, 'a, 'b> {
    syncer: &'s mut Syncer<'a, 'b>,
    ram_deleted_at: Time,
}

impl Rule for Merged<'_, '_, '_> {
    fn enter(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> Result<Option<OwnedFd>, Failed> {
        open_dst_dir(parent, name)
            .map(Some)
            .map_err(dst_err("open directory to remove"))
    }

    fn step(&mut self, dir: BorrowedFd<'_>, entry: &Name, path: &[u8]) -> Result<Step, Failed> {
        let s = &mut *self.syncer;
        if is_temp(&entry.name) {
            return plain_remove(dir, &entry.name, entry.dtype, s.dst_dev).map(Step::Gone);
        }
        let d = match stat::fstatat(dir, entry.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(d) => d,
            Err(Errno::ENOENT) => return Ok(Step::Gone(0)),
            Err(e) => return Err(dst_err("stat")(e)),
        };
        let disk = Disk::Present(s.disk_sig(path, &d, None));
        let mark = s.base_mark(path, disk);
        let verdict = if mark.is_none() && s.copy_deleted(path, disk) {
            Verdict::Ram
        } else {
            baseline::decide(
                mark.as_ref(),
                s.base.taken,
                Ram::Absent,
                false,
                disk,
                self.ram_deleted_at,
                self.ram_deleted_at,
            )
            .verdict
        };
        let is_dir = file_type(&d) == libc::S_IFDIR;
        if verdict != Verdict::Ram || (is_dir && d.st_dev != s.dst_dev) {
            return Ok(Step::Keep);
        }
        if is_dir {
            return Ok(Step::Enter);
        }
        s.touch(&d)?;
        Ok(Step::RemoveSeen(d, s.temps.next()))
    }

    fn remove_dir(&mut self, above: BorrowedFd<'_>, name: &CStr, _: &OwnedFd) -> Result<bool, Failed> {
        match unistd::unlinkat(above, name, UnlinkatFlags::RemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOTEMPTY | Errno::EEXIST) => Ok(false),
            Err(e) => Err(dst_err("remove directory")(e)),
        }
    }

    /// Journaled one by one: a directory the walk empties only in part (the disk
    /// changed something in it) stays, and the records of what went from it must
    /// not (a review helper's probe lost a file the RAM wrote there again).
    fn removed(&mut self, path: &[u8]) -> Result<(), Failed> {
        self.syncer.journal_gone(path)
    }
}

/// Removes a destination entry that is the write-back's own (a leftover temporary) or
/// that the rule already decided to remove, a directory with everything below it,
/// without following symlinks or entering another filesystem; returns how many
/// entries went.
pub(super) fn plain_remove(
    dir: BorrowedFd<'_>,
    name: &CStr,
    dtype: Option<Type>,
    dev: u64,
) -> Result<u64, Failed> {
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

/// Removes the directory `name` below `parent` and everything in it; a directory on
/// another filesystem fails the removal.
fn remove_tree(parent: BorrowedFd<'_>, name: &CStr, dev: u64) -> Result<u64, Failed> {
    remove_walk(parent, name, b"", &mut Tree { dev }).map(|(removed, _)| removed)
}

/// The removal of everything, as [`remove_tree`] does.
struct Tree {
    dev: u64,
}

impl Rule for Tree {
    fn enter(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> Result<Option<OwnedFd>, Failed> {
        let fd = open_dst_dir(parent, name).map_err(dst_err("open directory to remove"))?;
        if stat::fstat(&fd).map_err(dst_err("stat"))?.st_dev != self.dev {
            return Err(dst_err("remove a mount point")(Errno::EBUSY));
        }
        Ok(Some(fd))
    }

    fn step(&mut self, _: BorrowedFd<'_>, entry: &Name, _: &[u8]) -> Result<Step, Failed> {
        Ok(if entry.dtype == Some(Type::Directory) {
            Step::Enter
        } else {
            Step::Unlink
        })
    }

    fn remove_dir(&mut self, above: BorrowedFd<'_>, name: &CStr, _: &OwnedFd) -> Result<bool, Failed> {
        unistd::unlinkat(above, name, UnlinkatFlags::RemoveDir).map_err(dst_err("remove directory"))?;
        Ok(true)
    }
}

/// Removes from the directory `name` below `parent`, where an application works,
/// every non-directory last changed before `before` (each only while it is still the
/// entry looked at), then every directory left empty, `name` too; what changed since
/// stays, and with it the directories that hold it. A directory changed since (names
/// made or removed in it, or itself moved there) is the application's: neither
/// entered nor removed, as a directory moved in keeps the older ctimes of what it
/// holds. Nothing is followed and no other filesystem entered. Returns how many
/// entries went.
///
/// `decided`: the inode of the directory `name` where the caller decided on it as
/// a whole (a deletion the application made before `before`): entered whatever its
/// own ctime, while it is that directory; what is in it is decided as above.
/// `linked`: where to note the inodes of removed files that have another name
/// (removing a name changes the inode's ctime, which the other name would then show
/// as a change of its own). `placed`: what an earlier attempt of the same write-back
/// put there itself since `before`, which counts as older (a file it placed,
/// unchanged since; a directory it made, entered).
pub(super) fn remove_older(
    parent: BorrowedFd<'_>,
    name: &CStr,
    before: Time,
    dev: u64,
    (decided, linked, placed): (Option<u64>, Option<&mut HashSet<u64>>, &Placings),
) -> Result<u64, Failed> {
    let mut rule = Older {
        before,
        dev,
        temps: TempNames::new(),
        decided,
        linked,
        placed,
    };
    remove_walk(parent, name, b"", &mut rule).map(|(removed, _)| removed)
}

/// The removal of what is older than `before`, as [`remove_older`] does.
struct Older<'l> {
    before: Time,
    dev: u64,
    temps: TempNames,
    /// The top directory's inode, if decided on (see [`remove_older`]); taken by its
    /// `enter`.
    decided: Option<u64>,
    linked: Option<&'l mut HashSet<u64>>,
    placed: &'l Placings,
}

impl Rule for Older<'_> {
    fn enter(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> Result<Option<OwnedFd>, Failed> {
        let fd = match open_dst_dir(parent, name) {
            Ok(fd) => fd,
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(None),
            Err(e) => return Err(dst_err("open directory")(e)),
        };
        let st = stat::fstat(&fd).map_err(dst_err("stat"))?;
        let decided = self.decided.take();
        if st.st_dev != self.dev
            || decided.is_some_and(|ino| ino != st.st_ino)
            || (decided.is_none()
                && (st.st_ctime, st.st_ctime_nsec) >= self.before
                && !self
                    .placed
                    .made_dir_fd(fd.as_fd(), parent, OsStr::from_bytes(name.to_bytes())))
        {
            return Ok(None);
        }
        Ok(Some(fd))
    }

    fn step(&mut self, dir: BorrowedFd<'_>, entry: &Name, _: &[u8]) -> Result<Step, Failed> {
        let d = match stat::fstatat(dir, entry.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(d) => d,
            Err(Errno::ENOENT) => return Ok(Step::Gone(0)),
            Err(e) => return Err(dst_err("stat")(e)),
        };
        if file_type(&d) == libc::S_IFDIR {
            return Ok(Step::Enter);
        }
        if (d.st_ctime, d.st_ctime_nsec) < self.before || self.placed.placed_file(&d) {
            if let Some(linked) = self.linked.as_mut().filter(|_| d.st_nlink > 1) {
                linked.insert(d.st_ino);
            }
            Ok(Step::RemoveSeen(d, self.temps.next()))
        } else {
            Ok(Step::Keep)
        }
    }

    fn remove_dir(&mut self, above: BorrowedFd<'_>, name: &CStr, dir: &OwnedFd) -> Result<bool, Failed> {
        // Still the directory emptied: not one the application put at its name.
        let same =
            |d: &FileStat| stat::fstat(dir).is_ok_and(|o| (o.st_dev, o.st_ino) == (d.st_dev, d.st_ino));
        if !stat::fstatat(above, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|d| same(&d)) {
            return Ok(false);
        }
        match unistd::unlinkat(above, name, UnlinkatFlags::RemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOENT) => Ok(false),
            Err(e) => Err(dst_err("remove directory")(e)),
        }
    }
}
