//! Names deleted or renamed away on a disk filesystem since a moment: a fanotify
//! group reporting directory file handles and names (`FAN_REPORT_DFID_NAME`, Linux
//! ≥ 5.9) with a filesystem mark for `FAN_DELETE | FAN_MOVED_FROM`.
//!
//! The write-back needs it for one case the directory alone cannot tell. Once a held
//! tmpfs is switched away, the application works in the disk directory while the
//! merge runs. A name the RAM created that the disk lacks was either never on disk
//! (write it back) or created there again by the application and deleted (leave it
//! gone). Only the event of the deletion tells the two apart.
//!
//! Events of this process (the merge's own renames and removals) are ignored. If the
//! queue overflows, nothing can be told any more: every such name is written back
//! (a deleted name may come back; no write is lost), and that is logged.

use std::collections::HashSet;
use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::fanotify::{EventFFlags, Fanotify, InitFlags, MarkFlags, MaskFlags};

use crate::copy::baseline::Time;
use crate::copy::DiskDeletions;

/// `MAX_HANDLE_SZ` of the kernel.
const MAX_HANDLE: usize = 128;

/// A directory's file handle: its type and bytes.
pub type Handle = (i32, Vec<u8>);

pub struct Deletions {
    group: Fanotify,
    /// When the watched changes began to matter: every name seen deleted is taken to
    /// have gone at (or after) it.
    since: Option<Time>,
    gone: HashSet<(Handle, Vec<u8>)>,
    /// The part of `gone` another watch saw.
    added: HashSet<(Handle, Vec<u8>)>,
    own_pid: i32,
    ignored: Option<i32>,
    overflowed: bool,
}

impl Deletions {
    /// Starts watching the filesystem `dir` is on.
    pub fn watch(dir: &Path) -> Result<Deletions, Errno> {
        // The queue holds the whole filesystem's deletions (the merge's own too) until
        // drained: unlimited, so that an overflow does not blind it.
        let flags = InitFlags::FAN_CLASS_NOTIF
            | InitFlags::FAN_CLOEXEC
            | InitFlags::FAN_NONBLOCK
            | InitFlags::FAN_UNLIMITED_QUEUE
            | InitFlags::from_bits_retain(libc::FAN_REPORT_DFID_NAME);
        let group = Fanotify::init(flags, EventFFlags::O_RDONLY | EventFFlags::O_CLOEXEC)?;
        let at =
            std::fs::File::open(dir).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
        group.mark(
            MarkFlags::FAN_MARK_ADD | MarkFlags::FAN_MARK_FILESYSTEM,
            MaskFlags::FAN_DELETE | MaskFlags::FAN_MOVED_FROM | MaskFlags::FAN_ONDIR,
            at.as_fd(),
            None::<&str>,
        )?;
        Ok(Deletions {
            group,
            since: None,
            gone: HashSet::new(),
            added: HashSet::new(),
            own_pid: std::process::id() as i32,
            ignored: None,
            overflowed: false,
        })
    }

    /// Deletions count from `t` on (a time after the last change the RAM side got).
    pub fn since(&mut self, t: Time) {
        self.since = Some(t);
    }

    /// Ignores the events of `pid` as well (the tmpfsctl a keeper works for).
    pub fn ignore(&mut self, pid: i32) {
        self.ignored = Some(pid);
    }

    /// What this watch saw deleted itself (not what [`Self::add`] added).
    pub fn seen(&mut self) -> Vec<(Handle, Vec<u8>)> {
        self.drain();
        self.gone
            .iter()
            .filter(|k| !self.added.contains(*k))
            .cloned()
            .collect()
    }

    /// Adds deletions seen by another watch (a keeper's); `None`: that watch overflowed.
    pub fn add(&mut self, seen: Option<Vec<(Handle, Vec<u8>)>>) {
        match seen {
            Some(seen) => {
                for k in seen {
                    if self.gone.insert(k.clone()) {
                        self.added.insert(k);
                    }
                }
            }
            None => self.overflowed = true,
        }
    }

    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The group's descriptor, to wait on.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.group.as_fd()
    }

    /// Reads every queued event; returns the deletions not seen before.
    pub fn drain(&mut self) -> Vec<(Handle, Vec<u8>)> {
        let mut new = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match nix::unistd::read(self.group.as_fd(), &mut buf) {
                Ok(0) | Err(_) => return new,
                Ok(n) => {
                    for ev in parse(&buf[..n]) {
                        match ev {
                            Event::Overflow => {
                                if !self.overflowed {
                                    tracing::warn!("the watch for deletions in the disk directory overflowed; names the RAM created are written back even if the application deleted them on disk meanwhile");
                                }
                                self.overflowed = true;
                            }
                            Event::Gone { pid, dir, name }
                                if pid != self.own_pid && Some(pid) != self.ignored =>
                            {
                                let key = (dir, name);
                                if self.gone.insert(key.clone()) {
                                    new.push(key);
                                }
                            }
                            Event::Gone { .. } => {}
                        }
                    }
                }
            }
        }
    }
}

impl DiskDeletions for Deletions {
    fn deleted(&mut self, dir: BorrowedFd<'_>, name: &CStr) -> Option<Time> {
        let since = self.since?;
        self.drain();
        if self.overflowed {
            return None;
        }
        let handle = handle_of(dir).ok()?;
        self.gone
            .contains(&(handle, name.to_bytes().to_vec()))
            .then_some(since)
    }
}

/// The file handle of the directory open at `dir`.
fn handle_of(dir: BorrowedFd<'_>) -> Result<Handle, Errno> {
    // `struct file_handle`: handle_bytes (u32), handle_type (i32), then the bytes;
    // u32 storage keeps it aligned.
    let mut buf = [0u32; 2 + MAX_HANDLE / 4];
    buf[0] = MAX_HANDLE as u32;
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `buf` is a writable, 4-byte aligned `struct file_handle` with room for
    // `handle_bytes` (MAX_HANDLE) bytes of handle, the path is a NUL-terminated empty
    // string (with AT_EMPTY_PATH: the descriptor itself), and `mount_id` is writable.
    let r = unsafe {
        libc::name_to_handle_at(
            dir.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast::<libc::file_handle>(),
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    Errno::result(r)?;
    let len = (buf[0] as usize).min(MAX_HANDLE);
    let bytes: Vec<u8> = buf[2..].iter().flat_map(|w| w.to_ne_bytes()).take(len).collect();
    Ok((buf[1] as i32, bytes))
}

#[derive(Debug, PartialEq, Eq)]
enum Event {
    Overflow,
    Gone { pid: i32, dir: Handle, name: Vec<u8> },
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The events of one `read` of the group: `struct fanotify_event_metadata` (24 bytes),
/// each followed by info records; a `FAN_EVENT_INFO_TYPE_DFID_NAME` record holds the
/// fsid (8 bytes), a `struct file_handle` and the NUL-terminated name.
fn parse(buf: &[u8]) -> Vec<Event> {
    let mut out = Vec::new();
    let mut at = 0;
    while let (Some(len), Some(meta_len), Some(mask)) =
        (u32_at(buf, at), u16_at(buf, at + 6), u64_at(buf, at + 8))
    {
        let len = len as usize;
        let Some(event) = buf.get(at..at + len).filter(|_| len >= 24) else {
            break;
        };
        let pid = u32_at(event, 20).unwrap_or(0) as i32;
        if mask & libc::FAN_Q_OVERFLOW != 0 {
            out.push(Event::Overflow);
        }
        let mut info = meta_len as usize;
        while let (Some(&kind), Some(info_len)) = (event.get(info), u16_at(event, info + 2)) {
            let record = event.get(info..info + info_len as usize).unwrap_or_default();
            if kind == libc::FAN_EVENT_INFO_TYPE_DFID_NAME {
                if let Some(e) = dfid_name(record, pid) {
                    out.push(e);
                }
            }
            if info_len == 0 {
                break;
            }
            info += info_len as usize;
        }
        at += len;
    }
    out
}

fn dfid_name(record: &[u8], pid: i32) -> Option<Event> {
    // Header (4), fsid (8), then the handle.
    let bytes = u32_at(record, 12)? as usize;
    let kind = u32_at(record, 16)? as i32;
    let handle = record.get(20..20 + bytes)?.to_vec();
    let name = CStr::from_bytes_until_nul(record.get(20 + bytes..)?).ok()?;
    Some(Event::Gone {
        pid,
        dir: (kind, handle),
        name: name.to_bytes().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(mask: u64, pid: i32, handle: &[u8], name: &[u8]) -> Vec<u8> {
        let mut info = vec![libc::FAN_EVENT_INFO_TYPE_DFID_NAME, 0, 0, 0];
        info.extend_from_slice(&[9; 8]);
        info.extend_from_slice(&(handle.len() as u32).to_ne_bytes());
        info.extend_from_slice(&1i32.to_ne_bytes());
        info.extend_from_slice(handle);
        info.extend_from_slice(name);
        info.push(0);
        while info.len() % 4 != 0 {
            info.push(0);
        }
        let info_len = info.len() as u16;
        info[2..4].copy_from_slice(&info_len.to_ne_bytes());
        let mut ev = Vec::new();
        ev.extend_from_slice(&((24 + info.len()) as u32).to_ne_bytes());
        ev.extend_from_slice(&[3, 0]);
        ev.extend_from_slice(&24u16.to_ne_bytes());
        ev.extend_from_slice(&mask.to_ne_bytes());
        ev.extend_from_slice(&(-1i32).to_ne_bytes());
        ev.extend_from_slice(&pid.to_ne_bytes());
        ev.extend_from_slice(&info);
        ev
    }

    #[test]
    fn events_are_parsed_with_their_directory_and_name() {
        let mut buf = event(libc::FAN_DELETE, 42, &[1, 2, 3, 4, 5, 6, 7, 8], b"w-1");
        buf.extend(event(libc::FAN_MOVED_FROM, 43, &[8; 12], b"odd\nname"));
        assert_eq!(
            parse(&buf),
            vec![
                Event::Gone {
                    pid: 42,
                    dir: (1, vec![1, 2, 3, 4, 5, 6, 7, 8]),
                    name: b"w-1".to_vec()
                },
                Event::Gone {
                    pid: 43,
                    dir: (1, vec![8; 12]),
                    name: b"odd\nname".to_vec()
                },
            ]
        );
    }

    #[test]
    fn overflow_and_truncated_input_are_handled() {
        let mut ov = Vec::new();
        ov.extend_from_slice(&24u32.to_ne_bytes());
        ov.extend_from_slice(&[3, 0]);
        ov.extend_from_slice(&24u16.to_ne_bytes());
        ov.extend_from_slice(&libc::FAN_Q_OVERFLOW.to_ne_bytes());
        ov.extend_from_slice(&[0; 8]);
        assert_eq!(parse(&ov), vec![Event::Overflow]);
        let full = event(libc::FAN_DELETE, 1, &[1; 8], b"x");
        for cut in 0..full.len() {
            assert!(parse(&full[..cut]).is_empty(), "cut at {cut}");
        }
    }

    /// The real kernel: a deletion by another process is seen, in the right directory.
    #[test]
    fn a_deletion_by_another_process_is_seen() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("a"), "a").unwrap();
        std::fs::write(sub.join("b"), "b").unwrap();
        let Ok(mut d) = Deletions::watch(dir.path()) else {
            eprintln!("fanotify with FAN_REPORT_DFID_NAME is not available here");
            return;
        };
        d.since((1, 0));
        let st = std::process::Command::new("rm")
            .arg(sub.join("a"))
            .status()
            .unwrap();
        assert!(st.success());
        std::fs::remove_file(sub.join("b")).unwrap();
        let fd = std::fs::File::open(&sub).unwrap();
        assert_eq!(d.deleted(fd.as_fd(), c"a"), Some((1, 0)));
        assert_eq!(d.deleted(fd.as_fd(), c"b"), None, "our own deletion");
        let top = std::fs::File::open(dir.path()).unwrap();
        assert_eq!(d.deleted(top.as_fd(), c"a"), None, "another directory");
    }
}
