//! What the application does in DIR, from fanotify: a filesystem mark on DIR's
//! filesystem reporting directory handles and names (`FAN_REPORT_DFID_NAME`) and
//! each object's own handle (`FAN_REPORT_FID`, and `FAN_REPORT_TARGET_FID` for
//! creations and renames: Linux 5.17), filtered to DIR's subtree by the path of
//! the directory each event names.
//!
//! What is counted, per event read (fanotify merges identical events on one file
//! that were not read yet, so these are lower bounds for a file changed many times
//! before its events were read; they are read as they come):
//! - creates: `FAN_CREATE` (files, directories, symlinks);
//! - writes: `FAN_CLOSE_WRITE`, a file closed after writing: one per file written,
//!   not per `write(2)`;
//! - deletes: `FAN_DELETE`;
//! - renames: `FAN_MOVED_TO`, a name moved into place in DIR (from DIR or elsewhere);
//! - bytes written: growth of each file's `st_size`, read through its own handle
//!   when an event about it is read, so a file renamed since is still found. A file
//!   created during the watch counts from 0, one that existed before from its size
//!   when first reported. Rewriting a file in place without making it larger, and a
//!   file deleted before its events were read, add no bytes: st_size is what stays
//!   in a tmpfs, which is what sizing needs, and fanotify does not say how much a
//!   `write(2)` wrote;
//! - files touched: distinct files (by handle) created, written or renamed into place.
//!
//! Whether a directory is below DIR is decided at its first event: one moved into
//! or out of DIR during the watch keeps that verdict (a lookup per event would cost
//! a path resolution for every event on a busy filesystem).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::fanotify::{Fanotify, MaskFlags};
use serde::Serialize;

use crate::host::fanotify::{fd_path, filesystem_group, open_handle, parse, Event, Handle};

/// Events of one kind, over the watch or over one window.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub creates: u64,
    pub writes: u64,
    pub deletes: u64,
    pub renames: u64,
    pub bytes_written: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.creates += o.creates;
        self.writes += o.writes;
        self.deletes += o.deletes;
        self.renames += o.renames;
        self.bytes_written += o.bytes_written;
    }

    /// Every operation that changes the tree.
    pub fn ops(&self) -> u64 {
        self.creates + self.writes + self.deletes + self.renames
    }
}

/// What the watch saw.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Activity {
    pub total: Counts,
    /// The busiest 1 s window of each figure (not necessarily the same window).
    pub peak_1s: Counts,
    pub files_touched: u64,
    /// Times the kernel's queue overflowed: events were lost.
    pub overflows: u64,
}

/// A running watch of DIR.
pub struct Watch {
    group: Fanotify,
    root: File,
    root_path: Vec<u8>,
    started: Instant,
    /// Directories by handle: below DIR (or DIR itself) or not, decided once.
    dirs: HashMap<Handle, bool>,
    /// Files by handle: their last known st_size.
    sizes: HashMap<Handle, u64>,
    touched: HashSet<Handle>,
    /// One entry per second since the start.
    windows: Vec<Counts>,
    overflows: u64,
    buf: Vec<u8>,
}

impl Watch {
    /// Marks the filesystem DIR (open at `root`) is on; the clock starts now.
    pub fn start(root: File) -> Result<Watch> {
        let mask = MaskFlags::FAN_MODIFY
            | MaskFlags::FAN_CLOSE_WRITE
            | MaskFlags::FAN_CREATE
            | MaskFlags::FAN_DELETE
            | MaskFlags::FAN_MOVED_TO
            | MaskFlags::FAN_ONDIR;
        let group = filesystem_group(
            libc::FAN_REPORT_DFID_NAME | libc::FAN_REPORT_FID | libc::FAN_REPORT_TARGET_FID,
            mask,
            root.as_fd(),
            "FAN_REPORT_DFID_NAME and FAN_REPORT_TARGET_FID (Linux 5.17 or later, CAP_SYS_ADMIN)",
        )?;
        let root_path = fd_path(root.as_fd()).context("the watched directory has no path")?;
        Ok(Watch {
            group,
            root,
            root_path,
            started: Instant::now(),
            dirs: HashMap::new(),
            sizes: HashMap::new(),
            touched: HashSet::new(),
            windows: Vec::new(),
            overflows: 0,
            buf: vec![0u8; 256 * 1024],
        })
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Waits up to `wait` for events and counts every one queued.
    pub fn step(&mut self, wait: Duration) {
        let ms = u16::try_from(wait.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.group.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(ms)).is_err() {
            return;
        }
        loop {
            let n = match nix::unistd::read(self.group.as_fd(), &mut self.buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let window = self.started.elapsed().as_secs() as usize;
            if self.windows.len() <= window {
                self.windows.resize(window + 1, Counts::default());
            }
            for ev in parse(&self.buf[..n]) {
                match ev {
                    Event::Overflow => self.overflows += 1,
                    Event::Named {
                        mask, dir, object, ..
                    } => {
                        if !self.below_root(&dir) {
                            continue;
                        }
                        let c = self.count(mask, object);
                        self.windows[window].add(&c);
                    }
                    // A link count changed through another name: no write of its own.
                    Event::Object { .. } => {}
                }
            }
        }
    }

    fn below_root(&mut self, dir: &Handle) -> bool {
        if let Some(&known) = self.dirs.get(dir) {
            return known;
        }
        let below = open_handle(self.root.as_fd(), dir)
            .ok()
            .and_then(|fd| fd_path(fd.as_fd()))
            .is_some_and(|p| under(&self.root_path, &p));
        self.dirs.insert(dir.clone(), below);
        below
    }

    fn count(&mut self, mask: u64, object: Option<Handle>) -> Counts {
        let file = mask & libc::FAN_ONDIR == 0;
        let bit = |b: u64| u64::from(mask & b != 0);
        let mut c = Counts {
            creates: bit(libc::FAN_CREATE),
            writes: bit(libc::FAN_CLOSE_WRITE) * u64::from(file),
            deletes: bit(libc::FAN_DELETE),
            renames: bit(libc::FAN_MOVED_TO),
            bytes_written: 0,
        };
        let Some(object) = object.filter(|_| file) else {
            return c;
        };
        if mask & libc::FAN_DELETE != 0 {
            self.sizes.remove(&object);
            return c;
        }
        if mask & (libc::FAN_CREATE | libc::FAN_MODIFY | libc::FAN_CLOSE_WRITE | libc::FAN_MOVED_TO) == 0 {
            return c;
        }
        let size = open_handle(self.root.as_fd(), &object)
            .ok()
            .and_then(|fd| nix::sys::stat::fstat(&fd).ok())
            .map(|st| st.st_size.max(0) as u64);
        if let Some(size) = size {
            let before = if mask & libc::FAN_CREATE != 0 {
                Some(0)
            } else {
                self.sizes.get(&object).copied()
            };
            c.bytes_written = size.saturating_sub(before.unwrap_or(size));
            self.sizes.insert(object.clone(), size);
        }
        self.touched.insert(object);
        c
    }

    /// The figures so far.
    pub fn activity(&self) -> Activity {
        let mut a = Activity {
            files_touched: self.touched.len() as u64,
            overflows: self.overflows,
            ..Activity::default()
        };
        for w in &self.windows {
            a.total.add(w);
            let p = &mut a.peak_1s;
            p.creates = p.creates.max(w.creates);
            p.writes = p.writes.max(w.writes);
            p.deletes = p.deletes.max(w.deletes);
            p.renames = p.renames.max(w.renames);
            p.bytes_written = p.bytes_written.max(w.bytes_written);
        }
        a
    }
}

/// `path` is `root` or below it.
fn under(root: &[u8], path: &[u8]) -> bool {
    if root == b"/" {
        return true;
    }
    path.strip_prefix(root)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subtree_is_the_root_and_what_is_below_it_only() {
        assert!(under(b"/var/cache/nginx", b"/var/cache/nginx"));
        assert!(under(b"/var/cache/nginx", b"/var/cache/nginx/a/b"));
        assert!(!under(b"/var/cache/nginx", b"/var/cache/nginx2"));
        assert!(!under(b"/var/cache/nginx", b"/var/cache"));
        assert!(under(b"/", b"/anything"));
    }
}
