//! Removing what the RAM deleted, name by name as the rule says, and the write-back's
//! own leftovers.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{self, FileStat};
use nix::unistd::{self, UnlinkatFlags};

use crate::copy::baseline::{self, Disk, Ram, Time, Verdict};
use crate::copy::error::{dst_err, Failed};
use crate::copy::ops::{file_type, open_dst_dir};
use crate::copy::place::{remove_seen, Seen};
use crate::copy::scan::{read_names, Name};
use crate::copy::temp::is_temp;

use super::Syncer;

impl Syncer<'_, '_> {
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
        struct RemovalDir {
            dir: OwnedFd,
            names: std::vec::IntoIter<Name>,
            name: CString,
            path: Vec<u8>,
            kept: u64,
        }
        let open = |parent: BorrowedFd<'_>, name: &CStr, path: Vec<u8>| -> Result<RemovalDir, Failed> {
            let fd = open_dst_dir(parent, name).map_err(dst_err("open directory to remove"))?;
            let names = read_names(&fd).map_err(dst_err("read directory"))?;
            Ok(RemovalDir {
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
            let mark = self.base_mark(&child, disk);
            let verdict = if mark.is_none() && self.copy_deleted(&child, disk) {
                Verdict::Ram
            } else {
                baseline::decide(
                    mark.as_ref(),
                    self.base.taken,
                    Ram::Absent,
                    false,
                    disk,
                    ram_deleted_at,
                    ram_deleted_at,
                )
                .verdict
            };
            let is_dir = file_type(&d) == libc::S_IFDIR;
            if verdict != Verdict::Ram || (is_dir && d.st_dev != self.dst_dev) {
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

/// Removes the directory `name` below `parent` and everything in it. Each level is
/// opened with O_NOFOLLOW|O_DIRECTORY relative to its parent and listed completely
/// before its entries are unlinked; a level on another filesystem fails the removal.
fn remove_tree(parent: BorrowedFd<'_>, name: &CStr, dev: u64) -> Result<u64, Failed> {
    struct TreeDir {
        dir: OwnedFd,
        names: std::vec::IntoIter<Name>,
        name: CString,
    }
    let open = |parent: BorrowedFd<'_>, name: &CStr| -> Result<TreeDir, Failed> {
        let fd = open_dst_dir(parent, name).map_err(dst_err("open directory to remove"))?;
        if stat::fstat(&fd).map_err(dst_err("stat"))?.st_dev != dev {
            return Err(dst_err("remove a mount point")(Errno::EBUSY));
        }
        let names = read_names(&fd).map_err(dst_err("read directory"))?;
        Ok(TreeDir {
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

/// Removes from the directory `name` below `parent`, where an application works,
/// every non-directory last changed before `before` (each only while it is still the
/// entry looked at), then every directory left empty, `name` too; what changed since
/// stays, and with it the directories that hold it. A directory changed since (names
/// made or removed in it, or itself moved there) is the application's: neither
/// entered nor removed, as a directory moved in keeps the older ctimes of what it
/// holds. Nothing is followed and no other filesystem entered. Returns how many
/// entries went.
pub(super) fn remove_older(
    parent: BorrowedFd<'_>,
    name: &CStr,
    before: Time,
    dev: u64,
) -> Result<u64, Failed> {
    struct OlderDir {
        dir: OwnedFd,
        names: std::vec::IntoIter<Name>,
        name: CString,
        kept: bool,
    }
    let open = |parent: BorrowedFd<'_>, name: &CStr| -> Result<Option<OlderDir>, Failed> {
        let fd = match open_dst_dir(parent, name) {
            Ok(fd) => fd,
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(None),
            Err(e) => return Err(dst_err("open directory")(e)),
        };
        let st = stat::fstat(&fd).map_err(dst_err("stat"))?;
        if st.st_dev != dev || (st.st_ctime, st.st_ctime_nsec) >= before {
            return Ok(None);
        }
        let names = read_names(&fd).map_err(dst_err("read directory"))?;
        Ok(Some(OlderDir {
            dir: fd,
            names: names.into_iter(),
            name: name.to_owned(),
            kept: false,
        }))
    };
    let mut removed = 0;
    let Some(top) = open(parent, name)? else {
        return Ok(0);
    };
    let mut temps = crate::copy::temp::TempNames::new();
    let mut stack = vec![top];
    while let Some(level) = stack.last_mut() {
        let Some(entry) = level.names.next() else {
            let done = stack.pop().expect("the loop runs only while a level is stacked");
            let above = stack.last().map_or(parent, |l| l.dir.as_fd());
            // Still the directory emptied: not one the application put at its name.
            let same = |d: &FileStat| {
                stat::fstat(&done.dir).is_ok_and(|o| (o.st_dev, o.st_ino) == (d.st_dev, d.st_ino))
            };
            let kept = done.kept
                || !stat::fstatat(above, done.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|d| same(&d))
                || match unistd::unlinkat(above, done.name.as_c_str(), UnlinkatFlags::RemoveDir) {
                    Ok(()) => {
                        removed += 1;
                        false
                    }
                    Err(Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOENT) => true,
                    Err(e) => return Err(dst_err("remove directory")(e)),
                };
            if let Some(up) = stack.last_mut() {
                up.kept |= kept;
            }
            continue;
        };
        let dir = level.dir.as_fd();
        let d = match stat::fstatat(dir, entry.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(d) => d,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(dst_err("stat")(e)),
        };
        if file_type(&d) == libc::S_IFDIR {
            match open(dir, &entry.name)? {
                Some(next) => stack.push(next),
                None => level.kept = true,
            }
            continue;
        }
        let older = (d.st_ctime, d.st_ctime_nsec) < before;
        if older
            && remove_seen(dir, entry.name.as_c_str(), Seen::of(&d), &temps.next())
                .map_err(dst_err("remove"))?
        {
            removed += 1;
        } else {
            level.kept = true;
        }
    }
    Ok(removed)
}
