//! The write-back's source side, read on a thread of its own ahead of the walk: the
//! comparison is nothing but system calls, half of them on the source, so a second core
//! takes that half. The scan only reads the source tree; everything on the destination
//! is left to the walk.
//!
//! The scan goes depth-first through the same directories in the same order as the
//! walk (names sorted by bytes, reserved names left out, other filesystems not
//! entered) and streams one [`ScanEvent`] per directory entered and left, through a
//! bounded queue that also bounds the descriptors in flight.

use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, SyncSender};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, FileStat};

use super::baseline::{Sig, Time};
use super::error::{src_err, Failed};
use super::ops::{file_type, open_src, RelPath};
use super::temp::is_temp;
use super::writeback::Filter;
use super::xattrs::{self, XattrBufs, XattrTarget};

/// Events queued at most: each holds a directory descriptor and its listing.
const QUEUE: usize = 64;

/// One name of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Name {
    pub(super) name: CString,
    pub(super) dtype: Option<Type>,
}

/// Lists a directory through a second descriptor, keeping `fd` for the `*at` calls:
/// its names in byte order, each once.
///
/// A directory read while it changes is no snapshot, and may list a name twice: tmpfs
/// (seen on Linux 6.18) lists hundreds of names a second time, unchanged ones among
/// them, when the application renames an entry during the read. A merge
/// that took a repeat for a name of its own would pair it with nothing on the other
/// side, and record the name as deleted there: the write-back then keeps that side's
/// copy after the application deletes the name on its own side.
pub(super) fn read_names(fd: &OwnedFd) -> nix::Result<Vec<Name>> {
    let clone = fd
        .try_clone()
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))?;
    let mut dir = Dir::from_fd(clone)?;
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
    // A name is in a directory once at any moment; callers look each up by name, so
    // which of its listings stays does not matter.
    names.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    names.dedup_by(|a, b| a.name == b.name);
    Ok(names)
}

/// A source name as the scan found it.
#[derive(Debug)]
pub(super) struct SrcEntry {
    pub(super) name: CString,
    /// A directory a tracked pass does not read (see [`super::writeback`]'s
    /// `tracked`): no events follow for it.
    pub(super) skipped: bool,
    /// `None`: vanished since the listing, or `untouched`. A directory's is replaced
    /// by the stat of its descriptor in its [`ScanEvent::Enter`].
    pub(super) st: Option<FileStat>,
    /// A regular file a tracked pass's tracker saw no change of since the baseline
    /// (see [`Filter::touched`]), in a directory whose every change it saw by name:
    /// not stated, its record is carried over unless the walk must compare it.
    pub(super) untouched: bool,
    /// Whether it has any attribute that is copied; not read ([`Xattrs::Unread`]) for
    /// a non-directory unchanged since the baseline (its ctime is before it), which
    /// is mostly carried over as it is.
    pub(super) xattrs: Xattrs,
    /// A symlink's target.
    pub(super) target: Option<OsString>,
}

impl SrcEntry {
    /// A name not looked at (yet): `untouched`, see the field.
    pub(super) fn unread(name: CString, untouched: bool) -> SrcEntry {
        SrcEntry {
            name,
            skipped: false,
            st: None,
            untouched,
            xattrs: Xattrs::Unread,
            target: None,
        }
    }
}

/// A source entry's copied attributes, as far as the scan read them.
#[derive(Debug)]
pub(super) enum Xattrs {
    /// Listed: whether any of them is copied.
    Listed(bool),
    Unread,
}

pub(super) enum ScanEvent {
    /// A source directory, opened without following a symlink and stated through the
    /// descriptor, with its names sorted. `mount`: on another filesystem, so not
    /// entered (`entries` is empty). Every directory among the entries of an `Enter`
    /// gets its own `Enter` … `Leave` (or `Gone`) in turn, in the entries' order.
    /// `new`: a tracked scan's filter says the directory, or one above it, was created
    /// or moved in since the baseline, so its names are new at their paths.
    Enter {
        fd: OwnedFd,
        st: FileStat,
        entries: Vec<SrcEntry>,
        mount: bool,
        new: bool,
    },
    Leave,
    /// The directory vanished or was replaced before it could be opened.
    Gone,
    /// Reading the source failed at this path; nothing follows.
    Failed(Failed, PathBuf),
}

/// Starts the scan of `root` in `scope`. It ends at the end of the tree, at its first
/// error, or as soon as the receiver is dropped.
/// Reads the tree at `root` on a thread of `scope`, in the walk's order; with
/// `filter`, only the directories it lets in.
pub(super) fn start<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    root: OwnedFd,
    root_st: FileStat,
    filter: Option<&'s Filter>,
    taken: Option<Time>,
) -> Receiver<ScanEvent> {
    let (events, receiver) = mpsc::sync_channel(QUEUE);
    scope.spawn(move || {
        let mut scan = Scan {
            mount: crate::host::procs::mount_id(root.as_fd()),
            events,
            dev: root_st.st_dev,
            rel: RelPath::default(),
            bufs: XattrBufs::default(),
            filter,
            taken,
        };
        if let Err((failed, path)) = scan.walk(root, root_st) {
            let _ = scan.events.send(ScanEvent::Failed(failed, path));
        }
    });
    receiver
}

struct Scan<'f> {
    events: SyncSender<ScanEvent>,
    dev: u64,
    /// The id of the root's mount: a directory with another `dev` on the same
    /// mount is no mount point but a btrfs subvolume.
    mount: Option<u32>,
    rel: RelPath,
    bufs: XattrBufs,
    filter: Option<&'f Filter>,
    /// The baseline's time.
    taken: Option<Time>,
}

/// The walk stopped listening (it failed or finished early).
struct Hangup;

/// A scan level: the directory's own descriptor and its subdirectories still to enter.
struct ScanDir {
    fd: OwnedFd,
    /// With whether each is in or below a directory new at its path.
    subdirs: std::vec::IntoIter<(CString, bool)>,
    rel_len: usize,
}

impl Scan<'_> {
    fn send(&self, event: ScanEvent) -> Result<(), Hangup> {
        self.events.send(event).map_err(|_| Hangup)
    }

    fn walk(&mut self, root: OwnedFd, root_st: FileStat) -> Result<(), (Failed, PathBuf)> {
        let Some(first) = self
            .enter(root, root_st, false)
            .map_err(|f| (f, self.rel.path(None)))?
        else {
            return Ok(());
        };
        let mut stack = vec![first];
        while let Some(level) = stack.last_mut() {
            let Some((name, in_new)) = level.subdirs.next() else {
                stack.pop();
                if self.send(ScanEvent::Leave).is_err() {
                    return Ok(());
                }
                if let Some(parent) = stack.last() {
                    self.rel.truncate(parent.rel_len);
                }
                continue;
            };
            let opened = match open_src(level.fd.as_fd(), &name, OFlag::O_DIRECTORY) {
                Ok(fd) => fd,
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => {
                    if self.send(ScanEvent::Gone).is_err() {
                        return Ok(());
                    }
                    continue;
                }
                Err(e) => return Err((src_err("open directory")(e), self.rel.path(Some(&name)))),
            };
            let st = stat::fstat(&opened)
                .map_err(src_err("stat"))
                .map_err(|f| (f, self.rel.path(Some(&name))))?;
            self.rel.push(&name);
            // Moved or renamed after the tracker answered (or changed in it): what
            // the answer says of the paths below may be of another directory, so
            // all of it is read, as in one moved in. (The root's ctime is never
            // asked: the question's barrier moves it.)
            let in_new = in_new || self.filter.is_some_and(|f| f.changed_since_asked(&st));
            match self.enter(opened, st, in_new) {
                Ok(Some(child)) => stack.push(child),
                Ok(None) => return Ok(()),
                Err(f) => return Err((f, self.rel.path(None))),
            }
        }
        Ok(())
    }

    /// Reads a directory and sends its `Enter`; returns the level to walk, or `None`
    /// when the walk hung up. A directory on another filesystem is sent empty and left
    /// at once.
    fn enter(&mut self, fd: OwnedFd, st: FileStat, in_new: bool) -> Result<Option<ScanDir>, Failed> {
        let rel_len = self.rel.len();
        if st.st_dev != self.dev
            && self.mount.is_some()
            && crate::host::procs::mount_id(fd.as_fd()) == self.mount
        {
            // Its contents are the tree's, and go with the device at `down`;
            // left empty like a mount point, they would be lost.
            return Err(super::error::failed(
                true,
                "write back the btrfs subvolume (no mount point: its files would go with the device; move them into a plain directory, then `btrfs subvolume delete` it)",
            )(std::io::Error::from_raw_os_error(libc::EXDEV)));
        }
        if st.st_dev != self.dev {
            let empty = ScanDir {
                fd: fd.try_clone().map_err(src_err("open directory"))?,
                subdirs: Vec::new().into_iter(),
                rel_len,
            };
            let mount = ScanEvent::Enter {
                fd,
                st,
                entries: Vec::new(),
                mount: true,
                new: in_new,
            };
            return Ok(self.send(mount).ok().map(|()| empty));
        }
        let mut names = read_names(&fd).map_err(src_err("read directory"))?;
        names.retain(|n| !is_temp(&n.name));
        let mut entries = Vec::with_capacity(names.len());
        let mut subdirs = Vec::new();
        let touched = self
            .filter
            .and_then(|f| f.touched(self.rel.as_bytes(), &st, in_new));
        for Name { name, dtype } in names {
            if dtype == Some(Type::File) && touched.is_some_and(|t| !t.contains(name.to_bytes())) {
                entries.push(SrcEntry::unread(name, true));
                continue;
            }
            let mut entry = self.scan_entry(fd.as_fd(), name)?;
            if let Some(st) = entry.st.filter(|st| file_type(st) == libc::S_IFDIR) {
                let (read, new) = match self.filter {
                    Some(f) if st.st_dev == self.dev => f.enter(&self.rel.joined(&entry.name), &st, in_new),
                    _ => (true, false),
                };
                if read {
                    subdirs.push((entry.name.clone(), new));
                } else {
                    entry.skipped = true;
                }
            }
            entries.push(entry);
        }
        let own = fd.try_clone().map_err(src_err("open directory"))?;
        let level = ScanDir {
            fd: own,
            subdirs: subdirs.into_iter(),
            rel_len,
        };
        let event = ScanEvent::Enter {
            fd,
            st,
            entries,
            mount: false,
            new: in_new,
        };
        Ok(self.send(event).ok().map(|()| level))
    }

    /// One `fstatat`, the attribute list and a symlink's target.
    fn scan_entry(&mut self, dir: BorrowedFd<'_>, name: CString) -> Result<SrcEntry, Failed> {
        let mut entry = SrcEntry::unread(name, false);
        let name = entry.name.as_c_str();
        let st = match stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Ok(entry),
            Err(e) => return Err(src_err("stat")(e)),
        };
        let kind = file_type(&st);
        if kind == libc::S_IFLNK {
            match fcntl::readlinkat(dir, name) {
                Ok(target) => entry.target = Some(target),
                Err(Errno::ENOENT | Errno::EINVAL) => return Ok(entry),
                Err(e) => return Err(src_err("read symlink")(e)),
            }
        }
        let changed = self.taken.is_none_or(|t| Sig::of(&st).ctime >= t);
        if kind != libc::S_IFDIR && changed {
            match xattrs::copied_list(XattrTarget::At(dir, name), &mut self.bufs, true) {
                Ok(list) => entry.xattrs = Xattrs::Listed(list.is_some()),
                Err(f) if f.errno() == Some(libc::ENOENT) => return Ok(entry),
                Err(f) => return Err(f),
            }
        }
        entry.st = Some(st);
        Ok(entry)
    }
}
