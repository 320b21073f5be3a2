//! Non-directories the RAM side won: kept, updated in place, or written anew under a
//! temporary name and put in place; hard links made to their group's first copy.

use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, FileStat, Mode, SFlag};
use nix::unistd;

use crate::copy::baseline::{self, Mark, Sig};
use crate::copy::durable::{DstDir, Job, Rename};
use crate::copy::error::{dst_err, src_err, Failed};
use crate::copy::ops::{file_type, link_to_first_copy, open_src, open_src_typed};
use crate::copy::place::{put_in_place, Place, Placed, Seen};
use crate::copy::temp::{create_temp, create_temp_file, Temp};

use super::compare::{compare_stats, decide, reuse, Diff, FileAction, Reuse};
use super::remove::opens_up;
use super::{ctime, vanished, Frame, Group, Stepped, Syncer};
use crate::copy::xattrs::get_attr;

impl Syncer<'_, '_> {
    /// A non-directory the RAM side won: written, updated or kept. `same_details`: for
    /// two non-directories equal by stat, whether symlink targets and attributes are
    /// equal too.
    pub(super) fn sync_leaf(
        &mut self,
        stack: &[Frame],
        name: &CStr,
        path: Vec<u8>,
        s: &FileStat,
        mut d: Option<FileStat>,
        same_details: bool,
    ) -> Result<Stepped, Failed> {
        let parent = stack.last().expect("the root frame stays until the walk ends");
        let (src_dir, dst_dir) = (parent.src.as_fd(), parent.dst.fd.as_fd());
        let mut outcome = Stepped::default();
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
                return Ok(Stepped {
                    enter: None,
                    changed: removed > 0,
                });
            }
            outcome.changed = true;
            d = None;
        }
        let key = (s.st_dev, s.st_ino);
        if s.st_nlink > 1 && self.links.contains_key(&key) {
            return self.sync_later_link(stack, name, path, key, d, outcome);
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
        if action == FileAction::UpdateMetadata {
            let d = d.as_ref().expect("decide updates existing entries only");
            match self.update_file_metadata(src_dir, dst_dir, name, s, d)? {
                Some(Some(now)) => {
                    self.reporter.stats.metadata_updated += 1;
                    self.record(path.clone(), &now);
                }
                Some(None) => action = FileAction::Rewrite,
                None => {
                    self.carry(&path);
                    return Ok(outcome);
                }
            }
        }
        match action {
            FileAction::Keep => {
                self.reporter.stats.unchanged += 1;
                let d = d.as_ref().expect("decide keeps existing entries only");
                self.record(path.clone(), d);
            }
            FileAction::UpdateMetadata => {}
            FileAction::Rewrite => match self.rewrite_touching(src_dir, &parent.dst, name, s, d.as_ref())? {
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

    /// A later name of a multiply-linked source inode whose group has its destination
    /// inode already: linked to it, unless the disk's name is that inode already.
    fn sync_later_link(
        &mut self,
        stack: &[Frame],
        name: &CStr,
        path: Vec<u8>,
        key: (u64, u64),
        d: Option<FileStat>,
        outcome: Stepped,
    ) -> Result<Stepped, Failed> {
        let group = self.links.get_mut(&key).expect("the caller found the group");
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
            self.touch(d)?;
        }
        // The new link gives the group's inode a new ctime: no sign of the
        // application's change on its other names either.
        self.touch_ino(ino)?;
        if !self.write_hard_link(stack, name, (&first, ino), d.as_ref())? {
            self.reporter.stats.kept_disk += 1;
            return Ok(outcome);
        }
        self.reporter.stats.links_written += 1;
        let dst_dir = stack.last().expect("the root frame stays").dst.fd.as_fd();
        self.record_placed(dst_dir, name, path)?;
        Ok(Stepped::changed())
    }

    /// [`Self::rewrite`] of a name whose old inode goes: noted in `touched` first.
    pub(super) fn rewrite_touching(
        &mut self,
        src_dir: BorrowedFd<'_>,
        dst: &Arc<DstDir>,
        name: &CStr,
        s: &FileStat,
        d: Option<&FileStat>,
    ) -> Result<Option<Option<u64>>, Failed> {
        if let Some(d) = d {
            self.touch(d)?;
        }
        self.rewrite(src_dir, dst, name, s, d)
    }

    /// Updates owner, attributes, mode and times of a regular file in place, through a
    /// descriptor checked to be the singly-linked file `d` that was compared, from a
    /// source checked to be the file `compared` with the same data; returns its stat
    /// afterwards. `Some(None)` when either is not (anymore), so it must be
    /// rewritten; `None` when the source vanished or the application deleted the
    /// disk entry (its deletion stands).
    pub(super) fn update_file_metadata(
        &mut self,
        src_dir: BorrowedFd<'_>,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
        compared: &FileStat,
        d: &FileStat,
    ) -> Result<Option<Option<FileStat>>, Failed> {
        let src = match open_src_typed(src_dir, name, libc::S_IFREG) {
            Ok(fd) => fd,
            Err(f) if vanished(&f) => return Ok(None),
            Err(f) => return Err(f),
        };
        let s = stat::fstat(&src).map_err(src_err("stat"))?;
        // Replaced or written in RAM since the walk compared it: only a rewrite
        // keeps data and metadata of one version together.
        let data = |st: &FileStat| (st.st_dev, st.st_ino, st.st_size, st.st_mtime, st.st_mtime_nsec);
        if data(&s) != data(compared) {
            return Ok(Some(None));
        }
        let path_fd = match fcntl::openat(
            dst_dir,
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            // The application deleted it since the walk compared it: the newer
            // change, which stays (as when a rewrite finds the name gone).
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(dst_err("open")(e)),
        };
        let now = stat::fstat(&path_fd).map_err(dst_err("stat"))?;
        let same_inode = (now.st_dev, now.st_ino, now.st_nlink) == (d.st_dev, d.st_ino, 1);
        if file_type(&s) != libc::S_IFREG || file_type(&now) != libc::S_IFREG || !same_inode {
            return Ok(Some(None));
        }
        // Nothing tells that the RAM file is the one copied from this disk inode: a
        // user may have put their own there, of the same size and mtime. Another
        // owner, group or permission bit on the disk's data is a rewrite, the RAM
        // file's data with it (in place, a root 0600 file was given to the user).
        if opens_up(&s, &now) {
            return Ok(Some(None));
        }
        // Reopening the checked inode through /proc cannot land on another one.
        let proc = format!("/proc/self/fd/{}", path_fd.as_raw_fd());
        let dst = fcntl::open(proc.as_str(), OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(dst_err("open"))?;
        // An access ACL is permission bits too: another one is a rewrite as well.
        let acl = |fd| get_attr(fd, c"system.posix_acl_access").ok();
        if acl(src.as_fd()) != acl(dst.as_fd()) {
            return Ok(Some(None));
        }
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
    pub(super) fn rewrite(
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
                // in place through the workers or now follows the walk's stat, which
                // decided whether it is a hard-link group's first copy.
                let grouped = s.st_nlink > 1;
                let s = stat::fstat(&src).map_err(src_err("stat"))?;
                if file_type(&s) != libc::S_IFREG {
                    return Ok(None);
                }
                self.reporter.stats.files_written += 1;
                if !grouped {
                    // Created, written and fsynced by a worker: the walk goes on
                    // comparing meanwhile.
                    self.durable.submit(Job::Rename(Box::new(Rename {
                        dir: Arc::clone(dst),
                        src: Some(src),
                        stat: s,
                        name: name.to_owned(),
                        place: d.map_or(Place::Free, |d| Place::Over(Seen::of(d))),
                        rel: self.rel.path(Some(name)),
                    })));
                    return Ok(Some(None));
                }
                let (temp, file) = create_temp_file(&mut self.temps, dst_dir)?;
                let reporter = &mut self.reporter;
                self.transfer.copy_data(&src, &file, &s, &mut |n| {
                    reporter.stats.bytes_written += n;
                    reporter.report_if_due();
                })?;
                self.transfer.set_metadata(src.as_fd(), file.as_fd(), &s, true)?;
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
        if !self.replace(dst, temp, name, d)? {
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
    pub(super) fn finish_node(
        &mut self,
        src_dir: BorrowedFd<'_>,
        name: &CStr,
        temp: &Temp<'_>,
        s: &FileStat,
    ) -> Result<u64, Failed> {
        let made =
            self.transfer
                .set_made_metadata((src_dir, name), (temp.dir, temp.name.as_c_str()), s, true)?;
        Ok(made.st_ino)
    }

    /// Links a temporary name to the first copy of a hard-linked inode (its path and
    /// disk inode) and renames it over `name`; false if the disk got a missing name
    /// first.
    pub(super) fn write_hard_link(
        &mut self,
        stack: &[Frame],
        name: &CStr,
        (first, ino): (&[u8], u64),
        d: Option<&FileStat>,
    ) -> Result<bool, Failed> {
        let dst_dir = stack.last().expect("the root frame stays").dst.fd.as_fd();
        let rel = self.rel.as_bytes();
        let (temp, ()) = create_temp(&mut self.temps, dst_dir, |dir, temp| {
            link_to_first_copy(|i| stack[i].dst.fd.as_fd(), rel, (first, Some(ino)), dir, temp)
        })?;
        self.replace(&stack.last().expect("the root frame stays").dst, temp, name, d)
    }

    /// Puts a finished temporary in place of the non-directory `name`. A name that was
    /// missing (`d` is `None`) is only taken if still free: false (and the temporary
    /// dropped) when something took it meanwhile.
    pub(super) fn replace(
        &mut self,
        dir: &DstDir,
        mut temp: Temp<'_>,
        name: &CStr,
        d: Option<&FileStat>,
    ) -> Result<bool, Failed> {
        let place = d.map_or(Place::Free, |d| Place::Over(Seen::of(d)));
        if self.journal.is_some() {
            let st = stat::fstatat(temp.dir, temp.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(dst_err("stat"))?;
            self.journal_note(&self.rel.joined(name), &Mark::Placing(Sig::of(&st)))?;
        }
        let gone_meanwhile =
            matches!(place, Place::Free) && self.deletions.is_some_and(|dl| dir.deleted(dl, name).is_some());
        let placed = if gone_meanwhile {
            Placed::Deleted
        } else {
            put_in_place(temp.dir, temp.name.as_c_str(), name, place).map_err(dst_err("rename into place"))?
        };
        temp.live = placed != Placed::Yes;
        if placed != Placed::Yes {
            tracing::debug!(
                "write-back: {}: not put in place: {placed:?}",
                String::from_utf8_lossy(&self.rel.joined(name))
            );
        }
        if placed == Placed::Deleted {
            self.remember(self.rel.joined(name), Mark::Deleted(baseline::now_coarse()))?;
        }
        Ok(placed == Placed::Yes)
    }
}
