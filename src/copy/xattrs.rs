//! Extended attributes (and with them POSIX ACLs): which are copied, copying them,
//! comparing two entries' and making one entry's equal to another's.

use std::ffi::CStr;
use std::io::{self, Write as _};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use super::error::{dst_err, src_err, Failed};

/// `/proc/self/fd/<dir>/<name>`: resolving it enters exactly the directory `dir` is open
/// on and then only looks up `name`, which the l*xattr calls do not follow.
pub(super) fn proc_path<'b>(buf: &'b mut Vec<u8>, dir: BorrowedFd<'_>, name: &CStr) -> &'b CStr {
    buf.clear();
    write!(buf, "/proc/self/fd/{}/", dir.as_raw_fd()).expect("writing to a Vec cannot fail");
    buf.extend_from_slice(name.to_bytes_with_nul());
    CStr::from_bytes_with_nul(buf).expect("a readdir name contains no NUL")
}

/// `/proc/self/fd/<fd>`: following it leads to the entry `fd` is open on, whatever its
/// name is now.
pub(super) fn fd_path<'b>(buf: &'b mut Vec<u8>, fd: BorrowedFd<'_>) -> &'b CStr {
    buf.clear();
    write!(buf, "/proc/self/fd/{}\0", fd.as_raw_fd()).expect("writing to a Vec cannot fail");
    CStr::from_bytes_with_nul(buf).expect("one NUL, at the end")
}

/// Sets the attribute `name` of the open file `fd` to `value`.
pub fn set_attr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> io::Result<()> {
    XattrTarget::Fd(fd).set(name, value)
}

/// The value of the attribute `name` of the open file `fd`.
pub fn get_attr(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let len = XattrTarget::Fd(fd).get(name, &mut buf)?;
    buf.truncate(len);
    Ok(buf)
}

/// Where extended attributes are read or written: an open file, or an entry by name in
/// an open directory, never following a symlink there. Symlinks and nodes cannot be
/// opened for that, and a comparison should not open every file.
#[derive(Clone, Copy)]
pub(super) enum XattrTarget<'a> {
    Fd(BorrowedFd<'a>),
    At(BorrowedFd<'a>, &'a CStr),
    /// A symlink or node open with `O_PATH`, which the f*xattr calls refuse: reached
    /// through `/proc/self/fd/N`, which leads to the entry itself (a symlink is not
    /// followed from there).
    Opath(BorrowedFd<'a>),
}

/// Where an xattr call goes: a descriptor, or a path the call follows (`true`) or not.
#[derive(Clone, Copy)]
enum Via<'p> {
    Fd(libc::c_int),
    Path(&'p CStr, bool),
}

/// `listxattrat(2)` (Linux 6.13) has the same number on every architecture with the
/// unified syscall table.
const SYS_LISTXATTRAT: Option<libc::c_long> = if cfg!(all(
    target_pointer_width = "64",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64",
        target_arch = "loongarch64",
        target_arch = "powerpc64",
        target_arch = "s390x"
    )
)) {
    Some(465)
} else {
    None
};

/// Set once the kernel turned `listxattrat` down.
static NO_LISTXATTRAT: AtomicBool = AtomicBool::new(false);

/// Lists the attributes of `name` in `dir` without following it: `listxattrat`, or
/// `llistxattr` on `/proc/self/fd/<dir>/<name>` (which enters exactly `dir` and then
/// only looks `name` up) on kernels before 6.13.
fn list_at(dir: BorrowedFd<'_>, name: &CStr, ptr: *mut u8, len: usize) -> isize {
    if let Some(nr) = SYS_LISTXATTRAT.filter(|_| !NO_LISTXATTRAT.load(Ordering::Relaxed)) {
        // SAFETY: `ptr`/`len` describe writable memory (or are null/0), `name` is
        // NUL-terminated and `dir` is open for the call.
        let got = unsafe {
            libc::syscall(
                nr,
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
                ptr,
                len,
            )
        };
        if got >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
            return got as isize;
        }
        NO_LISTXATTRAT.store(true, Ordering::Relaxed);
    }
    let mut buf = Vec::new();
    let path = proc_path(&mut buf, dir, name);
    // SAFETY: as above; `path` is NUL-terminated.
    unsafe { libc::llistxattr(path.as_ptr(), ptr.cast(), len) }
}

/// Reused across entries so the common case (no attributes) allocates nothing and
/// costs one syscall per side.
#[derive(Default)]
pub(super) struct XattrBufs {
    names: Vec<u8>,
    value: Vec<u8>,
    /// The other side's, for comparisons.
    other_names: Vec<u8>,
    other_value: Vec<u8>,
}

impl XattrTarget<'_> {
    fn list(self, buf: &mut Vec<u8>) -> io::Result<usize> {
        fill(buf, |ptr, len| match self {
            // SAFETY: `ptr`/`len` describe writable memory (or are null/0 to query the
            // size), and the descriptor is valid for the call.
            XattrTarget::Fd(fd) => unsafe { libc::flistxattr(fd.as_raw_fd(), ptr.cast(), len) },
            XattrTarget::At(dir, entry) => list_at(dir, entry, ptr, len),
            XattrTarget::Opath(fd) => {
                let mut buf = Vec::new();
                // SAFETY: as above; the path is NUL-terminated.
                unsafe { libc::listxattr(fd_path(&mut buf, fd).as_ptr(), ptr.cast(), len) }
            }
        })
    }

    fn with<R>(self, call: impl FnOnce(Via<'_>) -> R) -> R {
        let mut buf = Vec::new();
        match self {
            XattrTarget::Fd(fd) => call(Via::Fd(fd.as_raw_fd())),
            XattrTarget::At(dir, entry) => call(Via::Path(proc_path(&mut buf, dir, entry), false)),
            XattrTarget::Opath(fd) => call(Via::Path(fd_path(&mut buf, fd), true)),
        }
    }

    fn get(self, name: &CStr, buf: &mut Vec<u8>) -> io::Result<usize> {
        self.with(|target| {
            fill(buf, |ptr, len| match target {
                // SAFETY: as in `list`; `name` and `path` are NUL-terminated.
                Via::Fd(fd) => unsafe { libc::fgetxattr(fd, name.as_ptr(), ptr.cast(), len) },
                Via::Path(path, false) => unsafe {
                    libc::lgetxattr(path.as_ptr(), name.as_ptr(), ptr.cast(), len)
                },
                Via::Path(path, true) => unsafe {
                    libc::getxattr(path.as_ptr(), name.as_ptr(), ptr.cast(), len)
                },
            })
        })
    }

    fn set(self, name: &CStr, value: &[u8]) -> io::Result<()> {
        let (ptr, len) = (value.as_ptr().cast(), value.len());
        self.with(|target| {
            check(match target {
                // SAFETY: `value` is readable for `len` bytes; `name` and `path` are
                // NUL-terminated.
                Via::Fd(fd) => unsafe { libc::fsetxattr(fd, name.as_ptr(), ptr, len, 0) },
                Via::Path(path, false) => unsafe {
                    libc::lsetxattr(path.as_ptr(), name.as_ptr(), ptr, len, 0)
                },
                Via::Path(path, true) => unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), ptr, len, 0) },
            })
        })
    }

    fn remove(self, name: &CStr) -> io::Result<()> {
        self.with(|target| {
            check(match target {
                // SAFETY: `name` and `path` are NUL-terminated; the descriptor is open.
                Via::Fd(fd) => unsafe { libc::fremovexattr(fd, name.as_ptr()) },
                Via::Path(path, false) => unsafe { libc::lremovexattr(path.as_ptr(), name.as_ptr()) },
                Via::Path(path, true) => unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) },
            })
        })
    }

    /// The names of the copied attributes; empty where the filesystem has none.
    /// The attribute list; empty where the filesystem has none.
    fn raw_list(self, buf: &mut Vec<u8>, on_source: bool) -> Result<&[u8], Failed> {
        let len = match self.list(buf) {
            Ok(len) => len,
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => 0,
            Err(e) if on_source => return Err(src_err("list extended attributes of")(e)),
            Err(e) => return Err(dst_err("list extended attributes of")(e)),
        };
        Ok(&buf[..len])
    }

    /// The names of the copied attributes.
    fn copied_names(self, buf: &mut Vec<u8>, on_source: bool) -> Result<Vec<&CStr>, Failed> {
        Ok(names(self.raw_list(buf, on_source)?).filter(is_copied).collect())
    }
}

fn check(done: libc::c_int) -> io::Result<()> {
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn names(list: &[u8]) -> impl Iterator<Item = &CStr> {
    list.split_inclusive(|&b| b == 0).map(|entry| {
        CStr::from_bytes_with_nul(entry).expect("the kernel NUL-terminates every attribute name")
    })
}

/// Runs a size-returning xattr call into `buf`, growing it when the value does not fit
/// (ERANGE), even if it grows again between the size query and the retry.
fn fill(buf: &mut Vec<u8>, mut call: impl FnMut(*mut u8, usize) -> isize) -> io::Result<usize> {
    if buf.is_empty() {
        buf.resize(4096, 0);
    }
    loop {
        if let Ok(len) = usize::try_from(call(buf.as_mut_ptr(), buf.len())) {
            return Ok(len);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ERANGE) {
            return Err(err);
        }
        let needed =
            usize::try_from(call(std::ptr::null_mut(), 0)).map_err(|_| io::Error::last_os_error())?;
        let grown = needed.max(buf.len() * 2);
        buf.resize(grown, 0);
    }
}

/// Which errors of an attribute namespace are tolerated; `None` means the attribute is
/// not copied at all.
///
/// `user.*` is the application's own data and must arrive. `security.*` and
/// `trusted.*` depend on privileges and on the LSM of the destination, so refusals are
/// tolerated like `cp -a` does. ACLs are skipped only where the tmpfs lacks ACL support.
/// Other namespaces (`system.*` besides ACLs, filesystem-specific ones such as
/// `btrfs.*`) describe the source filesystem, not the file, and are left behind, as
/// `rsync -X` does.
pub(super) fn tolerated_errors(name: &[u8]) -> Option<&'static [i32]> {
    if name.starts_with(b"user.") {
        Some(&[])
    } else if name.starts_with(b"security.") || name.starts_with(b"trusted.") {
        Some(&[libc::EPERM, libc::EOPNOTSUPP])
    } else if name == b"system.posix_acl_access" || name == b"system.posix_acl_default" {
        Some(&[libc::EOPNOTSUPP])
    } else {
        None
    }
}

/// overlayfs' own attributes (opaque, whiteout, origin) describe a layer, not the
/// file: never copied, so an overlay's upper layer written back leaves none on disk.
fn is_copied(name: &&CStr) -> bool {
    !name.to_bytes().starts_with(b"trusted.overlay.") && tolerated_errors(name.to_bytes()).is_some()
}

fn tolerated(name: &CStr, err: &io::Error) -> bool {
    let errno = err.raw_os_error().unwrap_or(0);
    tolerated_errors(name.to_bytes()).is_some_and(|t| t.contains(&errno))
}

/// Reads one copied attribute of the source; `None` when it vanished since the listing
/// or may not be read.
fn get_source(src: XattrTarget<'_>, name: &CStr, buf: &mut Vec<u8>) -> Result<Option<usize>, Failed> {
    match src.get(name, buf) {
        Ok(len) => Ok(Some(len)),
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) || tolerated(name, &e) => Ok(None),
        Err(e) => Err(src_err("read extended attributes of")(e)),
    }
}

/// Sets every copied attribute of `src` on `dst`.
pub(super) fn copy_xattrs(
    src: XattrTarget<'_>,
    dst: XattrTarget<'_>,
    bufs: &mut XattrBufs,
) -> Result<(), Failed> {
    for name in src.copied_names(&mut bufs.names, true)? {
        let Some(len) = get_source(src, name, &mut bufs.value)? else {
            continue;
        };
        match dst.set(name, &bufs.value[..len]) {
            Ok(()) => {}
            Err(e) if tolerated(name, &e) => {}
            Err(e) => return Err(dst_err("set extended attributes of")(e)),
        }
    }
    Ok(())
}

/// [`copy_xattrs`], then removes the copied attributes `dst` has and `src` lacks.
pub(super) fn sync_xattrs(
    src: XattrTarget<'_>,
    dst: XattrTarget<'_>,
    bufs: &mut XattrBufs,
) -> Result<(), Failed> {
    copy_xattrs(src, dst, bufs)?;
    let wanted = src.copied_names(&mut bufs.names, true)?;
    for name in dst.copied_names(&mut bufs.other_names, false)? {
        if wanted.contains(&name) {
            continue;
        }
        match dst.remove(name) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) || tolerated(name, &e) => {}
            Err(e) => return Err(dst_err("remove extended attributes of")(e)),
        }
    }
    Ok(())
}

/// The raw attribute list of `target` if it names any attribute that is copied:
/// `None` is the common case, and allocates nothing.
pub(super) fn copied_list(
    target: XattrTarget<'_>,
    bufs: &mut XattrBufs,
    on_source: bool,
) -> Result<Option<Box<[u8]>>, Failed> {
    let list = target.raw_list(&mut bufs.names, on_source)?;
    Ok(names(list).any(|name| is_copied(&name)).then(|| list.into()))
}

/// Whether `src` and `dst` have the same copied attributes with the same values. Costs
/// one listing per side when neither has any, the common case.
pub(super) fn same_xattrs(
    src: XattrTarget<'_>,
    dst: XattrTarget<'_>,
    bufs: &mut XattrBufs,
) -> Result<bool, Failed> {
    let mut ours = src.copied_names(&mut bufs.names, true)?;
    let mut theirs = dst.copied_names(&mut bufs.other_names, false)?;
    if ours.len() != theirs.len() {
        return Ok(false);
    }
    ours.sort_unstable();
    theirs.sort_unstable();
    if ours != theirs {
        return Ok(false);
    }
    for name in ours {
        let Some(len) = get_source(src, name, &mut bufs.value)? else {
            continue;
        };
        let other = match dst.get(name, &mut bufs.other_value) {
            Ok(len) => &bufs.other_value[..len],
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => return Ok(false),
            Err(e) => return Err(dst_err("read extended attributes of")(e)),
        };
        if bufs.value[..len] != *other {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::fs::{self, File};
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStringExt;
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::copy::ops::open_root;

    fn create_file(path: &Path) -> File {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .expect("create test file")
    }

    #[test]
    fn xattr_policy_by_namespace() {
        assert_eq!(tolerated_errors(b"user.mime_type"), Some(&[][..]));
        assert!(tolerated_errors(b"trusted.overlay.opaque").is_some_and(|t| t.contains(&libc::EPERM)));
        assert!(tolerated_errors(b"security.capability").is_some_and(|t| t.contains(&libc::EOPNOTSUPP)));
        assert_eq!(
            tolerated_errors(b"system.posix_acl_default"),
            Some(&[libc::EOPNOTSUPP][..])
        );
        assert_eq!(tolerated_errors(b"system.nfs4_acl"), None);
        assert_eq!(tolerated_errors(b"btrfs.compression"), None);
    }

    #[test]
    fn xattr_values_larger_than_the_buffer_are_copied() {
        // ext4 keeps all attributes of an inode in one block; tmpfs has room for
        // both a name list and a value over the 4 KiB first guess.
        let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir on tmpfs");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let (fa, fb) = (create_file(&a), create_file(&b));
        let big: Vec<u8> = (0..3000u32).flat_map(|i| i.to_le_bytes()).collect();
        let names: Vec<String> = (0..300)
            .map(|i| format!("user.attribute-number-{i:04}"))
            .collect();
        for name in &names {
            xattr::FileExt::set_xattr(&fa, name, &big[..100]).expect("set small xattr");
        }
        xattr::FileExt::set_xattr(&fa, "user.big", &big).expect("set big xattr");
        let mut bufs = XattrBufs::default();
        copy_xattrs(
            XattrTarget::Fd(fa.as_fd()),
            XattrTarget::Fd(fb.as_fd()),
            &mut bufs,
        )
        .map_err(|f| f.at(PathBuf::from("a")))
        .expect("copy xattrs");
        assert_eq!(
            xattr::FileExt::get_xattr(&fb, "user.big").expect("get"),
            Some(big.clone())
        );
        assert_eq!(
            xattr::FileExt::list_xattr(&fb).expect("list").count(),
            names.len() + 1
        );
    }

    #[test]
    fn proc_path_reaches_the_entry_without_following_it() {
        let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
        std::os::unix::fs::symlink("/nonexistent", dir.path().join("l")).expect("symlink");
        let fd = open_root(dir.path()).expect("open");
        let mut buf = Vec::new();
        let path = proc_path(&mut buf, fd.as_fd(), c"l");
        let meta =
            fs::symlink_metadata(OsString::from_vec(path.to_bytes().to_vec())).expect("lstat via proc");
        assert!(meta.file_type().is_symlink());
    }
}
