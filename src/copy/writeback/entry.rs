//! One step of the walk: a name of a directory pair, compared and sent on to the
//! directory, leaf or removal that carries out its verdict.

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd};

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags};
use nix::sys::stat::{self, FileStat};

use crate::copy::baseline::{Disk, Verdict};
use crate::copy::error::{dst_err, src_err, Failed};
use crate::copy::ops::file_type;
use crate::copy::scan::{ScanEvent, SrcEntry, Xattrs};
use crate::copy::xattrs::{self, XattrTarget};

use super::compare::{compare_stats, Diff, Pairing};
use super::remove::plain_remove;
use super::{ctime, vanished, Frame, Stepped, Stop, Syncer};

impl Syncer<'_, '_> {
    pub(super) fn step(&mut self, stack: &[Frame], step: &Pairing) -> Result<Stepped, Stop> {
        let parent = stack.last().expect("the root frame stays until the walk ends");
        let (src_dir, dst_dir) = (parent.src.as_fd(), parent.dst.fd.as_fd());
        let (entry, in_dst) = match step {
            Pairing::Remove { name, temp: true } => {
                plain_remove(dst_dir, &name.name, name.dtype, self.dst_dev)?;
                self.reporter.stats.temp_removed += 1;
                return Ok(Stepped::changed());
            }
            Pairing::Remove { name, temp: false } => return Ok(self.disk_only(parent, &name.name)?),
            Pairing::Sync { entry, in_dst } => (entry, *in_dst),
        };
        let name = entry.name.as_c_str();
        let path = self.rel.joined(name);
        let s = match entry.st {
            Some(s) => s,
            None if entry.untouched => {
                // What its ctime would tell `carry_unchanged`, the tracker told. A
                // hard-linked one is carried too: a change of its group through another
                // name comes with an event there, and the full pass that follows a
                // tracked pass meeting a changed hard-linked file.
                if parent.trusted && parent.ram_kept && self.carry_file_record(&path) {
                    return Ok(Stepped::default());
                }
                match stat::fstatat(src_dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                    // A directory now: made since the tracker answered (the scan does
                    // not read it), so the next pass sees it, as a vanished name.
                    Ok(s) if file_type(&s) != libc::S_IFDIR => s,
                    Ok(_) | Err(Errno::ENOENT) => {
                        self.carry(&path);
                        return Ok(Stepped::default());
                    }
                    Err(e) => return Err(src_err("stat")(e).into()),
                }
            }
            None => {
                // Vanished from the RAM since it was listed: the next pass sees.
                self.carry(&path);
                return Ok(Stepped::default());
            }
        };
        if entry.skipped {
            // Unchanged on both sides since the baseline (see `tracked`).
            self.skipped.insert(path.as_slice().into());
            self.reporter.stats.unchanged += self.carry(&path);
            self.reporter.stats.dirs_skipped += 1;
            return Ok(Stepped::default());
        }
        // A name new at its path through a directory moved in above it keeps its
        // ctime: new all the same, and possibly of a group with names in skipped
        // directories, to which the full pass would link it.
        if self.tracked
            && s.st_nlink > 1
            && file_type(&s) != libc::S_IFDIR
            && (parent.new || self.base.taken.is_none_or(|t| ctime(&s) >= t))
        {
            self.linked_changed = true;
        }
        if parent.trusted && parent.ram_kept && self.carry_unchanged(&path, &s) {
            return Ok(Stepped::default());
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
        let verdict = self.decide(&path, Some(&s), d.as_ref(), parent);
        if file_type(&s) != libc::S_IFDIR {
            if verdict != Verdict::Ram {
                let regular = |st: &FileStat| file_type(st) == libc::S_IFREG;
                let agree = match &d {
                    // Attributes too: one the disk added is a change of the disk's,
                    // which a record of agreement would let the next pass undo.
                    // The application may delete it on disk meanwhile (after a switch):
                    // then nothing agrees, and the disk's side stays as it is.
                    Some(d) if regular(&s) && regular(d) => {
                        self.same_details(src_dir, dst_dir, entry, &s, Some(d))?
                    }
                    _ => false,
                };
                if let Some(d) = d.as_ref().filter(|_| agree) {
                    // The disk's side is the same as the RAM's: they agree.
                    self.reporter.stats.unchanged += 1;
                    self.record(path, d);
                    return Ok(Stepped::default());
                }
                self.keep_disk(path, verdict, d.as_ref())?;
                return Ok(Stepped::default());
            }
            // Deleted on disk since the stat: putting the RAM's version in
            // place finds the deletion and lets it stand.
            let same_details = self.same_details(src_dir, dst_dir, entry, &s, d.as_ref())?;
            let ram_unchanged = self.base.taken.is_some_and(|t| ctime(&s) < t);
            if let Some(d) = d
                .as_ref()
                .filter(|_| same_details && ram_unchanged && s.st_nlink == 1)
            {
                // Neither side changed it, and they are equal. A disk inode with other
                // names got them on the disk's side (a link made there): replacing it
                // by an inode of its own would be a change neither side made.
                self.reporter.stats.unchanged += 1;
                self.record(path, d);
                return Ok(Stepped::default());
            }
            return Ok(self.sync_leaf(stack, name, path, &s, d, same_details)?);
        }
        match self.next_event()? {
            ScanEvent::Enter {
                fd,
                st,
                entries,
                mount,
                new,
            } => {
                let disk_file = d.as_ref().is_some_and(|d| file_type(d) != libc::S_IFDIR);
                if disk_file && verdict != Verdict::Ram {
                    // The disk's non-directory wins over the RAM's directory.
                    self.skip_scanned()?;
                    self.keep_disk(path, verdict, d.as_ref())?;
                    return Ok(Stepped::default());
                }
                let tentative = match verdict {
                    Verdict::Disk(Some(at)) if d.is_none() => Some(at),
                    _ => None,
                };
                // The RAM's metadata only where the RAM directory changed since the
                // baseline (or the disk lacks it): a disk directory whose own metadata
                // won before is recorded as agreed on, and "the disk did not change
                // since" must not hand it back to a RAM directory that did not either.
                let ram_changed = self.base.taken.is_none_or(|t| ctime(&s) >= t);
                let made = d
                    .as_ref()
                    .is_some_and(|d| self.made_unfinished(&path, dst_dir, name, (d, &s)));
                // Nor to a disk directory made again at the path, with the old one's
                // inode number (ext4 hands freed ones out again), after the RAM's last
                // change: the later change (the application's, as root, made it so
                // and put its files in; given the RAM's owner and mode, they became
                // readable to the user: a review helper's probe).
                let remade_later = d
                    .as_ref()
                    .is_some_and(|d| self.remade_dir(&path, dst_dir, name, d) && ctime(&s) < ctime(d));
                // Nor over a disk directory whose own mode changed since the baseline,
                // after the RAM's last change: the application closed (or opened) it
                // later, as root after `down`'s switch, say; the RAM's owner and mode
                // made its files readable again (a review helper's probe). A
                // directory counts as unchanged while it is the same inode (its times
                // move with every name), so the verdict alone does not tell.
                let disk_meta_later = d
                    .as_ref()
                    .is_some_and(|d| self.dir_mode_changed(&path, d) && ctime(&s) < ctime(d));
                let ram_meta = ((verdict == Verdict::Ram && (ram_changed || d.is_none()))
                    || tentative.is_some()
                    || made)
                    && !remade_later
                    && (made || !disk_meta_later);
                self.sync_dir(
                    parent,
                    name,
                    path,
                    (fd, st, entries, mount, new),
                    d,
                    ram_meta,
                    tentative,
                )
            }
            // Vanished or replaced since it was listed: the next sync sees.
            ScanEvent::Gone => {
                self.carry(&path);
                Ok(Stepped::default())
            }
            _ => unreachable!("the scan enters every directory it listed"),
        }
    }

    /// A name only the disk has: the RAM deleted it since the baseline (or never had
    /// it, and then it stays). Its removal is deferred ([`Self::remove_deferred`]).
    pub(super) fn disk_only(&mut self, parent: &Frame, name: &CStr) -> Result<Stepped, Failed> {
        let path = self.rel.joined(name);
        let copied = self.copied.is_some_and(|c| c.get(&path).is_some());
        if self.base.get(&path).is_none() && !copied {
            // In no baseline: the disk's own.
            return Ok(Stepped::default());
        }
        let dst_dir = parent.dst.fd.as_fd();
        let d = match stat::fstatat(dst_dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(d) => d,
            Err(Errno::ENOENT) => return Ok(Stepped::default()),
            Err(e) => return Err(dst_err("stat")(e)),
        };
        let disk = Disk::Present(self.disk_sig(&path, &d, None));
        if self.base_mark(&path, disk).is_none() && !self.copy_deleted(&path, disk) {
            return Ok(Stepped::default());
        }
        match self.decide(&path, None, Some(&d), parent) {
            Verdict::Ram => {
                // After the walk: the RAM may have moved its data to a name the walk
                // has not written yet.
                self.defer_removal(dst_dir, path, &d, parent.ram_deleted_at)?;
                Ok(Stepped::default())
            }
            _ => {
                // The disk's version stays where the RAM lacks the name: from now on
                // it is the disk's own, as if the RAM never had it. A record of the
                // disk's win would be judged against the time of the RAM's deletion,
                // which any later change of the RAM directory moves.
                self.reporter.stats.kept_disk += 1;
                Ok(Stepped::default())
            }
        }
    }

    /// For two non-directories equal by stat, whether symlink targets and copied
    /// attributes are equal too: one attribute listing of the destination entry in the
    /// common case, where neither has any. An entry the application deleted since
    /// the walk's stat is not the same (the caller then lets the deletion stand).
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
        let bufs = &mut self.transfer.xattr_bufs;
        let compared = (|| {
            if file_type(s) == libc::S_IFLNK {
                let theirs = fcntl::readlinkat(dst_dir, name).map_err(dst_err("read symlink"))?;
                if entry.target.as_ref() != Some(&theirs) {
                    return Ok(false);
                }
            }
            let (src, dst) = (XattrTarget::At(src_dir, name), XattrTarget::At(dst_dir, name));
            let ours = match &entry.xattrs {
                Xattrs::Listed(any) => *any,
                Xattrs::Unread => xattrs::copied_list(src, bufs, true)?.is_some(),
            };
            match (ours, xattrs::copied_list(dst, bufs, false)?) {
                (false, None) => Ok(true),
                _ => xattrs::same_xattrs(src, dst, bufs),
            }
        })();
        match compared {
            Err(f) if vanished(&f) => Ok(false),
            other => other,
        }
    }
}
