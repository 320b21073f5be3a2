//! Early wake-up on writes: one fanotify group with a `FAN_MARK_FILESYSTEM`
//! mark per watched tmpfs. The agent does not read what happened, only that
//! something was written: it drains the queue and re-checks usage.
//!
//! Preferred mode reports file ids (`FAN_REPORT_FID`, Linux ≥ 5.1): events
//! carry no open file descriptors, so draining is one read() per 4 KiB of
//! queue, and file creation (`FAN_CREATE`, inode usage) is seen too. Without
//! it, the classic mode reports `FAN_MODIFY | FAN_CLOSE_WRITE` with a
//! descriptor per event, closed as the queue is drained. Both need
//! CAP_SYS_ADMIN; without them the agent polls only.

use std::os::fd::{AsFd, BorrowedFd};

use nix::errno::Errno;
use nix::sys::fanotify::{EventFFlags, Fanotify, InitFlags, MarkFlags, MaskFlags};

pub struct Wake {
    group: Fanotify,
    mask: MaskFlags,
    /// Reports file ids (no descriptors in events).
    pub fid: bool,
}

impl Wake {
    /// A fanotify group, or why there is none.
    pub fn new() -> Result<Wake, Errno> {
        let base = InitFlags::FAN_CLASS_NOTIF | InitFlags::FAN_CLOEXEC | InitFlags::FAN_NONBLOCK;
        let fid = InitFlags::from_bits_retain(libc::FAN_REPORT_FID);
        let ev = EventFFlags::O_RDONLY | EventFFlags::O_CLOEXEC | EventFFlags::O_LARGEFILE;
        match Fanotify::init(base | fid, ev) {
            Ok(group) => Ok(Wake {
                group,
                mask: MaskFlags::FAN_MODIFY | MaskFlags::FAN_CLOSE_WRITE | MaskFlags::FAN_CREATE,
                fid: true,
            }),
            Err(Errno::EINVAL) => Ok(Wake {
                group: Fanotify::init(base, ev)?,
                mask: MaskFlags::FAN_MODIFY | MaskFlags::FAN_CLOSE_WRITE,
                fid: false,
            }),
            Err(e) => Err(e),
        }
    }

    fn mark(&self, flags: MarkFlags, root: BorrowedFd<'_>) -> Result<(), Errno> {
        self.group.mark(
            flags | MarkFlags::FAN_MARK_FILESYSTEM,
            self.mask,
            root,
            None::<&str>,
        )
    }

    /// Watches the whole filesystem `root` is on.
    pub fn add(&self, root: BorrowedFd<'_>) -> Result<(), Errno> {
        self.mark(MarkFlags::FAN_MARK_ADD, root)
    }

    /// Stops watching the filesystem of `root` (before it is unmounted).
    pub fn remove(&self, root: BorrowedFd<'_>) {
        let _ = self.mark(MarkFlags::FAN_MARK_REMOVE, root);
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.group.as_fd()
    }

    /// Reads and drops every queued event; returns how many there were.
    pub fn drain(&self) -> usize {
        let mut n = 0;
        loop {
            match self.group.read_events() {
                // Dropping an event closes its descriptor (classic mode).
                Ok(events) if !events.is_empty() => n += events.len(),
                _ => return n,
            }
        }
    }
}
