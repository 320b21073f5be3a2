//! fanotify events that name a directory entry (`FAN_REPORT_DFID_NAME`, Linux ≥ 5.9):
//! the directory as a file handle, and the name; with `FAN_REPORT_FID` as well, the
//! object's own handle. Parsed here for all of their users: the deletion watch on a
//! disk directory ([`super::deletions`]), the tracker of changed RAM directories
//! ([`crate::dirty`]) and `advise`'s sampling ([`crate::advise`]).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

/// `MAX_HANDLE_SZ` of the kernel.
const MAX_HANDLE: usize = 128;

/// A directory's file handle: its type and bytes.
pub type Handle = (i32, Vec<u8>);

#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// The queue overflowed: events were lost.
    Overflow,
    /// `mask` happened to `name` in the directory `dir`, by `pid`.
    Named {
        mask: u64,
        pid: i32,
        dir: Handle,
        name: Vec<u8>,
        /// The object itself (a `FAN_EVENT_INFO_TYPE_FID` record), when the group
        /// asked for it with `FAN_REPORT_FID`: it names a file whatever it is called
        /// by the time the event is read.
        object: Option<Handle>,
    },
    /// `mask` happened to the object `fid` itself, with no name to report: for a
    /// group that also asked for `FAN_REPORT_FID`, the link count of a file changed
    /// through another of its names.
    Object { mask: u64, pid: i32, fid: Handle },
}

/// A non-blocking notification group reporting `report` (`FAN_REPORT_*` bits), with
/// a mark for the events of `mask` on the whole filesystem `root` is on. `needs`
/// says what the kernel must offer, for the error when it does not.
pub fn filesystem_group(
    report: libc::c_uint,
    mask: nix::sys::fanotify::MaskFlags,
    root: BorrowedFd<'_>,
    needs: &str,
) -> anyhow::Result<nix::sys::fanotify::Fanotify> {
    use anyhow::Context;
    use nix::sys::fanotify::{EventFFlags, Fanotify, InitFlags, MarkFlags};
    let flags = InitFlags::FAN_CLASS_NOTIF
        | InitFlags::FAN_CLOEXEC
        | InitFlags::FAN_NONBLOCK
        | InitFlags::from_bits_retain(report);
    let group = Fanotify::init(flags, EventFFlags::O_RDONLY | EventFFlags::O_CLOEXEC)
        .with_context(|| format!("fanotify with {needs}"))?;
    group
        .mark(
            MarkFlags::FAN_MARK_ADD | MarkFlags::FAN_MARK_FILESYSTEM,
            mask,
            root,
            None::<&str>,
        )
        .context("fanotify mark on the filesystem")?;
    Ok(group)
}

/// The file handle of the directory open at `dir`.
pub fn handle_of(dir: BorrowedFd<'_>) -> Result<Handle, Errno> {
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

/// Opens the directory (or file) `handle` names on the filesystem `mount` is on
/// (`O_PATH`): `ESTALE` when it was deleted since.
pub fn open_handle(mount: BorrowedFd<'_>, handle: &Handle) -> Result<OwnedFd, Errno> {
    let (kind, bytes) = handle;
    if bytes.len() > MAX_HANDLE {
        return Err(Errno::EINVAL);
    }
    let mut buf = [0u32; 2 + MAX_HANDLE / 4];
    buf[0] = bytes.len() as u32;
    buf[1] = *kind as u32;
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        buf[2 + i] = u32::from_ne_bytes(word);
    }
    // SAFETY: `buf` is a 4-byte aligned `struct file_handle` whose `handle_bytes`
    // (at most MAX_HANDLE) bytes follow the header within the buffer; the kernel
    // only reads it. On success the result is a new descriptor this process owns.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            buf.as_mut_ptr().cast::<libc::file_handle>(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    Errno::result(fd)?;
    // SAFETY: `fd` was just returned by open_by_handle_at and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Where the descriptor's directory is, as this process sees it (`/proc/self/fd`);
/// `None` when that is no absolute path (a directory outside this process's root).
/// A deleted directory's path ends in ` (deleted)`.
pub fn fd_path(fd: BorrowedFd<'_>) -> Option<Vec<u8>> {
    let p = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str());
    bytes.starts_with(b"/").then(|| bytes.to_vec())
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
/// fsid (8 bytes), a `struct file_handle` and the NUL-terminated name, a
/// `FAN_EVENT_INFO_TYPE_FID` record the fsid and the object's handle.
pub fn parse(buf: &[u8]) -> Vec<Event> {
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
        let mut named = None;
        let mut object = None;
        let mut info = meta_len as usize;
        while let (Some(&kind), Some(info_len)) = (event.get(info), u16_at(event, info + 2)) {
            let record = event.get(info..info + info_len as usize).unwrap_or_default();
            if kind == libc::FAN_EVENT_INFO_TYPE_DFID_NAME {
                named = named.or_else(|| dfid_name(record));
            } else if kind == libc::FAN_EVENT_INFO_TYPE_FID {
                object = object.or_else(|| handle_at(record).map(|(h, _)| h));
            }
            if info_len == 0 {
                break;
            }
            info += info_len as usize;
        }
        match (named, object) {
            (Some((dir, name)), object) => out.push(Event::Named {
                mask,
                pid,
                dir,
                name,
                object,
            }),
            (None, Some(fid)) => out.push(Event::Object { mask, pid, fid }),
            (None, None) => {}
        }
        at += len;
    }
    out
}

/// The handle of a FID or DFID_NAME record: header (4), fsid (8), then a
/// `struct file_handle`; with the offset just past it.
fn handle_at(record: &[u8]) -> Option<(Handle, usize)> {
    let bytes = u32_at(record, 12)? as usize;
    let kind = u32_at(record, 16)? as i32;
    let handle = record.get(20..20 + bytes)?.to_vec();
    Some(((kind, handle), 20 + bytes))
}

fn dfid_name(record: &[u8]) -> Option<(Handle, Vec<u8>)> {
    let (dir, end) = handle_at(record)?;
    let name = CStr::from_bytes_until_nul(record.get(end..)?).ok()?;
    Some((dir, name.to_bytes().to_vec()))
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
                Event::Named {
                    mask: libc::FAN_DELETE,
                    pid: 42,
                    dir: (1, vec![1, 2, 3, 4, 5, 6, 7, 8]),
                    name: b"w-1".to_vec(),
                    object: None,
                },
                Event::Named {
                    mask: libc::FAN_MOVED_FROM,
                    pid: 43,
                    dir: (1, vec![8; 12]),
                    name: b"odd\nname".to_vec(),
                    object: None,
                },
            ]
        );
    }

    /// With `FAN_REPORT_FID` the object's own handle follows (or precedes) the name.
    #[test]
    fn the_object_handle_is_kept_when_reported() {
        let mut ev = event(libc::FAN_MODIFY, 7, &[1; 8], b"f");
        let mut fid = vec![libc::FAN_EVENT_INFO_TYPE_FID, 0, 0, 0];
        fid.extend_from_slice(&[9; 8]);
        fid.extend_from_slice(&8u32.to_ne_bytes());
        fid.extend_from_slice(&1i32.to_ne_bytes());
        fid.extend_from_slice(&[5; 8]);
        let fid_len = fid.len() as u16;
        fid[2..4].copy_from_slice(&fid_len.to_ne_bytes());
        ev.extend_from_slice(&fid);
        let len = ev.len() as u32;
        ev[..4].copy_from_slice(&len.to_ne_bytes());
        assert_eq!(
            parse(&ev),
            vec![Event::Named {
                mask: libc::FAN_MODIFY,
                pid: 7,
                dir: (1, vec![1; 8]),
                name: b"f".to_vec(),
                object: Some((1, vec![5; 8])),
            }]
        );
    }

    #[test]
    fn an_event_without_a_name_reports_its_object() {
        let mut ev = event(libc::FAN_ATTRIB, 5, &[4; 8], b"x");
        // The same layout with the record type of a bare FID, and no name in use.
        ev[24] = libc::FAN_EVENT_INFO_TYPE_FID;
        assert_eq!(
            parse(&ev),
            vec![Event::Object {
                mask: libc::FAN_ATTRIB,
                pid: 5,
                fid: (1, vec![4; 8])
            }]
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

    /// A handle taken of a directory opens it again, and no more once it is gone.
    #[test]
    fn a_handle_opens_its_directory_until_it_is_deleted() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let root = std::fs::File::open(dir.path()).unwrap();
        let handle = handle_of(std::os::fd::AsFd::as_fd(&std::fs::File::open(&sub).unwrap())).unwrap();
        let fd = open_handle(std::os::fd::AsFd::as_fd(&root), &handle).unwrap();
        let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert_eq!(path, sub);
        drop(fd);
        std::fs::remove_dir(&sub).unwrap();
        assert_eq!(
            open_handle(std::os::fd::AsFd::as_fd(&root), &handle).err(),
            Some(Errno::ESTALE)
        );
    }
}
