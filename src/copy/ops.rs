//! Primitives shared by the seeding copier and the write-back: the walk's relative
//! path, symlink-safe opens, sparse-aware data copies, metadata application, hard-link
//! resolution and progress reporting.

use std::ffi::{CStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::dir::{Dir, Entry, OwningIter, Type};
use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, FileStat, Mode};
use nix::sys::time::TimeSpec;
use nix::unistd::{self, Gid, Uid, Whence};

use super::baseline::Time;
use super::error::{dst_err, failed, src_err, CopyError, Failed};
use super::made::{self, Attrs};
use super::xattrs::{self, XattrBufs, XattrTarget};

/// Read/write fallback buffer: large enough to amortise syscalls on big files, small
/// enough to stay in cache.
pub(super) const COPY_BUF: usize = 256 * 1024;
/// Upper bound for one `copy_file_range` call, so progress is reported during big files.
const COPY_CHUNK: usize = 8 * 1024 * 1024;
const REPORT_EVERY_ENTRIES: u32 = 1000;
const REPORT_EVERY: Duration = Duration::from_millis(100);

/// The walk's position relative to the roots, as raw bytes: names need not be UTF-8,
/// and a `PathBuf` is only built for an error.
#[derive(Default)]
pub(super) struct RelPath(Vec<u8>);

impl RelPath {
    pub(super) fn push(&mut self, name: &CStr) {
        if !self.0.is_empty() {
            self.0.push(b'/');
        }
        self.0.extend_from_slice(name.to_bytes());
    }

    pub(super) fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub(super) fn joined(&self, name: &CStr) -> Vec<u8> {
        let mut path = Vec::with_capacity(self.0.len() + 1 + name.count_bytes());
        path.extend_from_slice(&self.0);
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(name.to_bytes());
        path
    }

    pub(super) fn path(&self, name: Option<&CStr>) -> PathBuf {
        let bytes = match name {
            Some(name) => self.joined(name),
            None => self.0.clone(),
        };
        if bytes.is_empty() {
            PathBuf::from(".")
        } else {
            PathBuf::from(OsString::from_vec(bytes))
        }
    }
}

/// A directory being read. It owns the descriptor its entries are looked up from, so
/// nothing below it is reached through a path string.
pub(super) struct Listing(OwningIter);

impl Listing {
    pub(super) fn new(fd: OwnedFd) -> nix::Result<Self> {
        Ok(Listing(Dir::from_fd(fd)?.into_iter()))
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor is owned by the iterator and stays open as long as
        // `self`, which the returned borrow cannot outlive.
        unsafe { BorrowedFd::borrow_raw(self.0.as_raw_fd()) }
    }

    /// The next entry other than `.` and `..`.
    pub(super) fn next(&mut self) -> Option<nix::Result<Entry>> {
        loop {
            match self.0.next()? {
                Ok(entry) if matches!(entry.file_name().to_bytes(), b"." | b"..") => {}
                next => return Some(next),
            }
        }
    }
}

pub(super) fn src_listing(fd: OwnedFd) -> Result<Listing, Failed> {
    Listing::new(fd).map_err(src_err("read directory"))
}

/// The caller chose these paths, so a symlink at the root itself is honoured.
pub(super) fn open_root(path: &Path) -> nix::Result<OwnedFd> {
    fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Opens one of the two roots and stats it; errors name the root as `.`.
pub(super) fn open_root_dir(path: &Path, on_source: bool) -> Result<(OwnedFd, FileStat), CopyError> {
    let at_root = |f: Failed| f.at(PathBuf::from("."));
    let fd = open_root(path)
        .map_err(failed(on_source, "open directory"))
        .map_err(at_root)?;
    let st = stat::fstat(&fd)
        .map_err(failed(on_source, "stat"))
        .map_err(at_root)?;
    Ok((fd, st))
}

/// Opens a source entry without following a symlink in its place. O_NONBLOCK keeps a
/// FIFO swapped in after readdir from blocking the copy. O_NOATIME keeps the copy from
/// dirtying every source inode, but is refused with EPERM for files the caller does not
/// own without CAP_FOWNER.
pub(super) fn open_src(dir: BorrowedFd<'_>, name: &CStr, extra: OFlag) -> nix::Result<OwnedFd> {
    let flags =
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | extra;
    match fcntl::openat(dir, name, flags | OFlag::O_NOATIME, Mode::empty()) {
        Err(Errno::EPERM) => fcntl::openat(dir, name, flags, Mode::empty()),
        opened => opened,
    }
}

/// Opens a destination directory below `dir`, never through a symlink: a symlink
/// planted in its place fails with ELOOP or ENOTDIR instead of being entered.
pub(super) fn open_dst_dir(dir: BorrowedFd<'_>, name: &CStr) -> nix::Result<OwnedFd> {
    fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Stats an entry, opening it when it is a regular file or a directory. Those are
/// stated through the opened descriptor, so what is copied is exactly what was stated
/// even if the entry is replaced concurrently; readdir's d_type saves a separate
/// stat for them.
pub(super) fn stat_entry(
    dir: BorrowedFd<'_>,
    name: &CStr,
    dtype: Option<Type>,
) -> Result<(FileStat, Option<OwnedFd>), Failed> {
    let kind = match dtype {
        Some(Type::File) => libc::S_IFREG,
        Some(Type::Directory) => libc::S_IFDIR,
        _ => {
            let st = stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(src_err("stat"))?;
            let kind = file_type(&st);
            if kind != libc::S_IFREG && kind != libc::S_IFDIR {
                return Ok((st, None));
            }
            kind
        }
    };
    let fd = open_src_typed(dir, name, kind)?;
    let st = stat::fstat(&fd).map_err(src_err("stat"))?;
    Ok((st, Some(fd)))
}

/// Opens a source regular file or directory (`kind` is `S_IFREG` or `S_IFDIR`).
pub(super) fn open_src_typed(
    dir: BorrowedFd<'_>,
    name: &CStr,
    kind: libc::mode_t,
) -> Result<OwnedFd, Failed> {
    if kind == libc::S_IFDIR {
        open_src(dir, name, OFlag::O_DIRECTORY).map_err(src_err("open directory"))
    } else {
        open_src(dir, name, OFlag::empty()).map_err(src_err("open file"))
    }
}

pub(super) fn file_type(st: &FileStat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

pub(super) fn permissions(st: &FileStat) -> Mode {
    Mode::from_bits_truncate(st.st_mode & 0o7777)
}

pub(super) fn atime(st: &FileStat) -> TimeSpec {
    TimeSpec::new(st.st_atime, st.st_atime_nsec)
}

pub(super) fn mtime(st: &FileStat) -> TimeSpec {
    TimeSpec::new(st.st_mtime, st.st_mtime_nsec)
}

/// The soft limit on open descriptors, first raised to the hard limit (at most
/// 65,536): the copiers keep hundreds of files and directories open at once and size
/// their queues by it ([`descriptors_roomy`]).
pub(super) fn descriptor_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
            return 1024;
        };
        let want = hard.min(65_536);
        if soft < want && setrlimit(Resource::RLIMIT_NOFILE, want, hard).is_ok() {
            want
        } else {
            soft
        }
    })
}

/// Room for the copiers' larger queues (about 1,100 descriptors at worst in the
/// write-back); below it they keep to about 450, as under the usual 1,024.
pub(super) fn descriptors_roomy() -> bool {
    descriptor_limit() >= 4096
}

/// Whether the seed may read cold files of `dir`'s filesystem with `O_DIRECT`: only
/// where reading past the page cache is known to give what a buffered read would.
/// Not on a stacking filesystem (overlayfs, ecryptfs), whose own page cache is
/// always empty while the lower one may hold the data, or on network and FUSE
/// filesystems.
pub(super) fn direct_reads_suit(dir: BorrowedFd<'_>) -> bool {
    use nix::sys::statfs::{fstatfs, BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, XFS_SUPER_MAGIC};
    fstatfs(dir).is_ok_and(|fs| {
        let t = fs.filesystem_type();
        t == EXT4_SUPER_MAGIC || t == XFS_SUPER_MAGIC || t == BTRFS_SUPER_MAGIC
    })
}

/// Whether the write-back may write large files to `dir`'s filesystem with `O_DIRECT`
/// from a mapping of the RAM file: ext4 and xfs. Not btrfs, whose checksums of data
/// written directly from pages the application may change meanwhile can come out
/// wrong (older kernels); not stacking, network or FUSE filesystems.
pub(super) fn direct_writes_suit(dir: BorrowedFd<'_>) -> bool {
    use nix::sys::statfs::{fstatfs, EXT4_SUPER_MAGIC, XFS_SUPER_MAGIC};
    fstatfs(dir).is_ok_and(|fs| {
        let t = fs.filesystem_type();
        t == EXT4_SUPER_MAGIC || t == XFS_SUPER_MAGIC
    })
}

/// When `name` in `dir` was born (`statx`'s `STATX_BTIME`), where the filesystem
/// records it.
pub fn born(dir: BorrowedFd<'_>, name: &CStr) -> Option<Time> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `name` is NUL-terminated and `stx` is a writable statx buffer that
    // outlives the call; the kernel writes at most its size.
    let r = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | if name.is_empty() { libc::AT_EMPTY_PATH } else { 0 },
            libc::STATX_BTIME,
            stx.as_mut_ptr(),
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: statx succeeded, so it filled the buffer (zeroed before, so every
    // field is initialised either way).
    let stx = unsafe { stx.assume_init() };
    (stx.stx_mask & libc::STATX_BTIME != 0)
        .then_some((stx.stx_btime.tv_sec, i64::from(stx.stx_btime.tv_nsec)))
}

/// Alignment of memory, offsets and lengths for `O_DIRECT`: the largest logical block
/// size in use.
const DIRECT_ALIGN: usize = 4096;
/// One `O_DIRECT` read: the disk gets many of these at once from the seed's workers,
/// so each can be smaller than [`COPY_BUF`], and so is the memory they hold.
const DIRECT_CHUNK: usize = 128 * 1024;
/// Files from this size up are written with `O_DIRECT` by the write-back
/// ([`Transfer::direct_writes`]); smaller ones cost more in the device's requests than
/// in the copy saved.
const DIRECT_WRITE_MIN: u64 = 64 * 1024;

/// Pages of `[0, len)` of `file` in the page cache; `None` when the kernel cannot tell
/// (`cachestat` is Linux 6.5).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn cached_pages(file: &File, len: u64) -> Option<u64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Cachestat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    // Not in the libc crate yet; the same number on both architectures.
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off: 0, len };
    let mut out = Cachestat::default();
    // SAFETY: cachestat(2) reads `range` and writes one `struct cachestat` to `out`,
    // both live and laid out as the kernel's (five and two u64s); the descriptor is
    // borrowed for the call.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut out as *mut Cachestat,
            0u32,
        )
    };
    (r == 0).then_some(out.nr_cache)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn cached_pages(_: &File, _: u64) -> Option<u64> {
    None
}

pub(super) fn allocated_bytes(st: &FileStat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0) * 512
}

pub(super) fn seek(file: &File, pos: u64, whence: Whence) -> nix::Result<u64> {
    let pos = i64::try_from(pos).map_err(|_| Errno::EOVERFLOW)?;
    let found = unistd::lseek(file, pos, whence)?;
    Ok(u64::try_from(found).expect("lseek succeeded, so the offset is not negative"))
}

fn copy_file_range(src: &File, dst: &File, pos: u64, len: usize) -> nix::Result<usize> {
    let mut off_in = i64::try_from(pos).map_err(|_| Errno::EOVERFLOW)?;
    let mut off_out = off_in;
    fcntl::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), len)
}

/// `sendfile` writes at the destination's file offset, so that is set first.
fn sendfile(src: &File, dst: &File, pos: u64, len: usize) -> nix::Result<usize> {
    let mut off_in = i64::try_from(pos).map_err(|_| Errno::EOVERFLOW)?;
    unistd::lseek(dst, off_in, Whence::SeekSet)?;
    nix::sys::sendfile::sendfile64(dst, src, Some(&mut off_in), len)
}

/// Opens the directory at `rel` below `root`, one component at a time, following
/// no symlink.
pub(super) fn open_below(root: BorrowedFd<'_>, rel: &[u8]) -> nix::Result<OwnedFd> {
    let mut dir = root
        .try_clone_to_owned()
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))?;
    for part in components(rel) {
        let name = std::ffi::CString::new(part).map_err(|_| Errno::EINVAL)?;
        dir = open_dst_dir(dir.as_fd(), &name)?;
    }
    Ok(dir)
}

/// `dir/leaf` → (`dir`, `leaf`); a name at the root has an empty directory part.
pub(super) fn split_parent(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(slash) => (&path[..slash], &path[slash + 1..]),
        None => (&[], path),
    }
}

pub(super) fn components(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

/// Number of leading components two relative paths have in common.
pub(super) fn shared_components(a: &[u8], b: &[u8]) -> usize {
    components(a)
        .zip(components(b))
        .take_while(|(x, y)| x == y)
        .count()
}

/// Hard-links `new_name` in `new_dir` to `first`, the destination path (relative to
/// the root) of an inode's first copy. `walked(i)` is the open destination directory
/// for the first `i` components of `current`, the walk's position, so the prefix both
/// paths share is not looked up again and the rest is walked one component at a time
/// without following symlinks. With `ino`, the entry there must still be that inode:
/// else `ENOENT`, as if it had gone (the application replaced it).
pub(super) fn link_to_first_copy<'a>(
    walked: impl Fn(usize) -> BorrowedFd<'a>,
    current: &[u8],
    (first, ino): (&[u8], Option<u64>),
    new_dir: BorrowedFd<'_>,
    new_name: &CStr,
) -> Result<(), Failed> {
    let (dir, leaf) = split_parent(first);
    let shared = shared_components(dir, current);
    let mut opened: Option<OwnedFd> = None;
    for component in components(dir).skip(shared) {
        let base = opened.as_ref().map_or(walked(shared), AsFd::as_fd);
        let next = fcntl::openat(
            base,
            component,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(dst_err("open the first copy's directory for hard link"))?;
        opened = Some(next);
    }
    let old_dir = opened.as_ref().map_or(walked(shared), AsFd::as_fd);
    link_checked(old_dir, leaf, ino, new_dir, new_name).map_err(dst_err("create hard link"))
}

/// Links the entry `leaf` in `dir` (with `ino`, only that inode) as `new_name` in
/// `new_dir`: through a descriptor of the entry checked, so that no rename between
/// the check and the link puts another one there. A symlink is linked itself
/// (`/proc/self/fd/N` leads to the entry, not its target).
pub(super) fn link_checked<P: ?Sized + nix::NixPath>(
    dir: BorrowedFd<'_>,
    leaf: &P,
    ino: Option<u64>,
    new_dir: BorrowedFd<'_>,
    new_name: &CStr,
) -> nix::Result<()> {
    let fd = fcntl::openat(
        dir,
        leaf,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let st = stat::fstat(&fd)?;
    if ino.is_some_and(|ino| ino != st.st_ino) {
        return Err(Errno::ENOENT);
    }
    let mut buf = Vec::new();
    // Linking the descriptor itself (`AT_EMPTY_PATH`) needs CAP_DAC_READ_SEARCH.
    unistd::linkat(
        fcntl::AT_FDCWD,
        xattrs::fd_path(&mut buf, fd.as_fd()),
        new_dir,
        new_name,
        AtFlags::AT_SYMLINK_FOLLOW,
    )
}

fn apply_xattrs(
    src: XattrTarget<'_>,
    dst: XattrTarget<'_>,
    bufs: &mut XattrBufs,
    exact: bool,
) -> Result<(), Failed> {
    if exact {
        xattrs::sync_xattrs(src, dst, bufs)
    } else {
        xattrs::copy_xattrs(src, dst, bufs)
    }
}

/// Running totals and the caller's progress callback: called every
/// [`REPORT_EVERY_ENTRIES`] entries or [`REPORT_EVERY`], whichever comes first.
pub(super) struct Reporter<'p, S> {
    pub(super) stats: S,
    progress: Option<&'p mut dyn FnMut(&S)>,
    last_report: Instant,
    unreported: u32,
}

impl<'p, S: Default> Reporter<'p, S> {
    pub(super) fn new(progress: Option<&'p mut dyn FnMut(&S)>) -> Self {
        Reporter {
            stats: S::default(),
            progress,
            last_report: Instant::now(),
            unreported: 0,
        }
    }

    pub(super) fn entry_done(&mut self) {
        self.unreported += 1;
        if self.unreported >= REPORT_EVERY_ENTRIES {
            self.report();
        } else {
            self.report_if_due();
        }
    }

    pub(super) fn report_if_due(&mut self) {
        if self.progress.is_some() && self.last_report.elapsed() >= REPORT_EVERY {
            self.report();
        }
    }

    pub(super) fn report(&mut self) {
        if let Some(progress) = self.progress.as_mut() {
            progress(&self.stats);
            self.last_report = Instant::now();
        }
        self.unreported = 0;
    }
}

/// Where a source entry's data and metadata go. Owns the reusable buffers and what was
/// learnt about the pair of filesystems, so both walks share one implementation.
#[derive(Default)]
pub(super) struct Transfer {
    /// `copy_file_range` keeps failing the same way between the same two filesystems
    /// (e.g. EXDEV from ext4 to tmpfs), so it is given up on after the first refusal.
    pub(super) no_copy_file_range: bool,
    buf: Vec<u8>,
    pub(super) xattr_bufs: XattrBufs,
    /// Read a file none of whose pages are cached with `O_DIRECT` (the seed).
    pub(super) direct_when_cold: bool,
    /// The source's filesystem refused `O_DIRECT`; not asked again.
    no_direct: bool,
    /// `sendfile` refused the pair of files, as `copy_file_range` did.
    no_sendfile: bool,
    /// Write large files with `O_DIRECT` from a mapping of the source (the
    /// write-back, to a filesystem where that suits: [`direct_writes_suit`]).
    pub(super) direct_writes: bool,
    /// The destination refused `O_DIRECT` writes; not asked again.
    no_direct_writes: bool,
}

impl Transfer {
    /// Copies only the data ranges of a file that may have holes, so a sparse file
    /// stays sparse instead of being filled with zeros. `copied` is told every chunk.
    pub(super) fn copy_data(
        &mut self,
        src: &File,
        dst: &File,
        st: &FileStat,
        copied: &mut dyn FnMut(u64),
    ) -> Result<(), Failed> {
        let size = u64::try_from(st.st_size).unwrap_or(0);
        // Fully allocated files have no holes; skipping the SEEK_DATA probe saves two
        // syscalls per file in the common case.
        if allocated_bytes(st) >= size {
            if self.direct_when_cold && !self.no_direct && size > 0 && cached_pages(src, size) == Some(0) {
                return self.copy_direct(src, dst, size, copied);
            }
            if self.direct_writes && !self.no_direct_writes && size >= DIRECT_WRITE_MIN {
                return self.write_direct(src, dst, size, copied);
            }
            return self.copy_range(src, dst, 0, size, copied);
        }
        let mut pos = 0;
        while pos < size {
            let start = match seek(src, pos, Whence::SeekData) {
                Ok(start) => start,
                Err(Errno::ENXIO) => break,
                Err(Errno::EINVAL | Errno::EOPNOTSUPP) if pos == 0 => {
                    return self.copy_range(src, dst, 0, size, copied);
                }
                Err(e) => return Err(src_err("find data in")(e)),
            };
            if start >= size {
                break;
            }
            let end = seek(src, start, Whence::SeekHole).map_err(src_err("find holes in"))?;
            let end = end.min(size);
            self.copy_range(src, dst, start, end, copied)?;
            pos = end;
        }
        let len = i64::try_from(size).expect("the size came from an off_t");
        unistd::ftruncate(dst, len).map_err(dst_err("set size of"))
    }

    /// Copies `[0, size)` reading with `O_DIRECT`: a cold file's data goes from the disk
    /// straight into the buffer, with no page-cache pages to allocate and fill and no
    /// copy out of them, and the disk's cache is not filled with what the tmpfs now
    /// holds. A filesystem or device that refuses it gets the buffered copy.
    fn copy_direct(
        &mut self,
        src: &File,
        dst: &File,
        size: u64,
        copied: &mut dyn FnMut(u64),
    ) -> Result<(), Failed> {
        let flags = fcntl::fcntl(src, fcntl::F_GETFL).map_err(src_err("read flags of"))?;
        let flags = OFlag::from_bits_retain(flags);
        if fcntl::fcntl(src, fcntl::F_SETFL(flags | OFlag::O_DIRECT)).is_err() {
            self.no_direct = true;
            return self.copy_range(src, dst, 0, size, copied);
        }
        if self.buf.len() < DIRECT_CHUNK + DIRECT_ALIGN {
            self.buf = vec![0; DIRECT_CHUNK + DIRECT_ALIGN];
        }
        let skip = self.buf.as_ptr().align_offset(DIRECT_ALIGN);
        let mut pos = 0;
        while pos < size {
            let want = usize::try_from(size - pos)
                .unwrap_or(usize::MAX)
                .min(DIRECT_CHUNK);
            let buf = &mut self.buf[skip..skip + want.next_multiple_of(DIRECT_ALIGN)];
            let n = match src.read_at(buf, pos) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && pos == 0 => {
                    self.no_direct = true;
                    fcntl::fcntl(src, fcntl::F_SETFL(flags)).map_err(src_err("set flags of"))?;
                    return self.copy_range(src, dst, 0, size, copied);
                }
                Err(e) => return Err(src_err("read")(e)),
            };
            let n = n.min(want);
            if n == 0 {
                break;
            }
            dst.write_all_at(&buf[..n], pos).map_err(dst_err("write"))?;
            pos += n as u64;
            copied(n as u64);
        }
        Ok(())
    }

    /// Copies `[0, size)` of a large file into a new one on the disk with `O_DIRECT`
    /// writes from a mapping of the source: the data goes from the RAM file's pages
    /// straight to the device, with no pages of the disk's page cache to allocate and
    /// fill, and no writeback of them to start and wait for later (docs/benchmarks.md:
    /// a full first write-back took about a third less CPU time). The last partial
    /// block goes through the page cache, as `O_DIRECT` writes whole blocks only. A
    /// filesystem or device that refuses it, or a source that shrank meanwhile (its
    /// pages past the new end cannot be read), gets the buffered copy from there.
    fn write_direct(
        &mut self,
        src: &File,
        dst: &File,
        size: u64,
        copied: &mut dyn FnMut(u64),
    ) -> Result<(), Failed> {
        use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
        let (Ok(len), Ok(flags)) = (usize::try_from(size), fcntl::fcntl(dst, fcntl::F_GETFL)) else {
            return self.copy_range(src, dst, 0, size, copied);
        };
        let flags = OFlag::from_bits_retain(flags);
        let Some(nonzero) = std::num::NonZeroUsize::new(len & !(DIRECT_ALIGN - 1)) else {
            return self.copy_range(src, dst, 0, size, copied);
        };
        // SAFETY: a read-only shared mapping of a file held open for the call. This
        // process never reads it itself: it is only the source of the kernel's writes,
        // which fail with EFAULT, not a signal, where a page is gone (the file shrank).
        let Ok(map) = (unsafe { mmap(None, nonzero, ProtFlags::PROT_READ, MapFlags::MAP_SHARED, src, 0) })
        else {
            return self.copy_range(src, dst, 0, size, copied);
        };
        let mut pos = 0;
        let mut failure = None;
        if fcntl::fcntl(dst, fcntl::F_SETFL(flags | OFlag::O_DIRECT)).is_ok() {
            let base = map.as_ptr().cast::<u8>().cast_const();
            while pos < nonzero.get() {
                let end = nonzero.get().min(pos + COPY_CHUNK);
                // SAFETY: `[pos, end)` lies in the mapping of `nonzero` bytes, which
                // lives until the munmap below; the slice is only handed to write(2).
                let chunk = unsafe { std::slice::from_raw_parts(base.add(pos), end - pos) };
                match dst.write_at(chunk, pos as u64) {
                    Ok(0) => break,
                    Ok(n) => {
                        pos += n;
                        copied(n as u64);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // Refused (an alignment this device does not take), or a page the
                    // source no longer has: the buffered copy goes on from here.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EFAULT)) => {
                        if pos == 0 && e.raw_os_error() == Some(libc::EINVAL) {
                            self.no_direct_writes = true;
                        }
                        break;
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
        } else {
            self.no_direct_writes = true;
        }
        // SAFETY: the mapping made above; the slices of it are gone.
        let unmapped = unsafe { munmap(map, nonzero.get()) };
        debug_assert!(unmapped.is_ok(), "a mapping of our own");
        if let Some(e) = failure {
            return Err(dst_err("write")(e));
        }
        fcntl::fcntl(dst, fcntl::F_SETFL(flags)).map_err(dst_err("set flags of"))?;
        // A direct write takes whole pages: of a source that shrank into the last
        // one written, it took the zeros past the new end too.
        let now = stat::fstat(src).map_err(src_err("stat"))?.st_size;
        let now = u64::try_from(now).unwrap_or(0);
        if now < pos as u64 {
            let len = i64::try_from(now).expect("the size came from an off_t");
            return unistd::ftruncate(dst, len).map_err(dst_err("set size of"));
        }
        self.copy_range(src, dst, pos as u64, size, copied)
    }

    /// Copies `[start, end)` to the same offsets. A source that shrank since it was
    /// stated ends the copy early rather than failing it.
    pub(super) fn copy_range(
        &mut self,
        src: &File,
        dst: &File,
        start: u64,
        end: u64,
        copied: &mut dyn FnMut(u64),
    ) -> Result<(), Failed> {
        let mut pos = start;
        let mut use_copy_file_range = !self.no_copy_file_range;
        let mut use_sendfile = !self.no_sendfile;
        while pos < end {
            let remaining = usize::try_from(end - pos).unwrap_or(usize::MAX);
            let n = if use_copy_file_range {
                match copy_file_range(src, dst, pos, remaining.min(COPY_CHUNK)) {
                    // Some filesystems report 0 for data they cannot copy this way;
                    // read() tells whether the source really ended.
                    Ok(0) => {
                        use_copy_file_range = false;
                        continue;
                    }
                    Ok(n) => n,
                    Err(Errno::EXDEV | Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => {
                        self.no_copy_file_range = true;
                        use_copy_file_range = false;
                        continue;
                    }
                    Err(Errno::EINTR) => continue,
                    Err(e) => return Err(dst_err("copy data into")(e)),
                }
            } else if use_sendfile {
                // Between filesystems (ext4 and tmpfs) copy_file_range is refused, but
                // sendfile still moves the pages in the kernel: one copy, not two.
                match sendfile(src, dst, pos, remaining.min(COPY_CHUNK)) {
                    Ok(0) => {
                        use_sendfile = false;
                        continue;
                    }
                    Ok(n) => n,
                    Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => {
                        self.no_sendfile = true;
                        use_sendfile = false;
                        continue;
                    }
                    Err(Errno::EINTR) => continue,
                    // Either side's failure: read and write tell which, and whether it
                    // lasts.
                    Err(_) => {
                        use_sendfile = false;
                        continue;
                    }
                }
            } else {
                // At least COPY_BUF: a direct read may have left a smaller one.
                if self.buf.len() < COPY_BUF {
                    self.buf = vec![0; COPY_BUF];
                }
                let buf = &mut self.buf[..remaining.min(COPY_BUF)];
                let n = match src.read_at(buf, pos) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(src_err("read")(e)),
                };
                dst.write_all_at(&buf[..n], pos).map_err(dst_err("write"))?;
                n
            };
            if n == 0 {
                break;
            }
            pos += n as u64;
            copied(n as u64);
        }
        Ok(())
    }

    /// Owner before mode, because chown clears setuid/setgid (and file capabilities,
    /// hence xattrs after it too); times last, because every other step may touch them.
    /// With `exact`, attributes `dst` has and `src` lacks are removed as well.
    pub(super) fn set_metadata(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        st: &FileStat,
        exact: bool,
    ) -> Result<(), Failed> {
        unistd::fchown(
            dst,
            Some(Uid::from_raw(st.st_uid)),
            Some(Gid::from_raw(st.st_gid)),
        )
        .map_err(dst_err("set owner of"))?;
        apply_xattrs(
            XattrTarget::Fd(src),
            XattrTarget::Fd(dst),
            &mut self.xattr_bufs,
            exact,
        )?;
        stat::fchmod(dst, permissions(st)).map_err(dst_err("set mode of"))?;
        stat::futimens(dst, &atime(st), &mtime(st)).map_err(dst_err("set times of"))
    }

    /// [`Self::set_metadata`] for the symlink or node just made as `dst_name` in
    /// `dst_dir`, through a descriptor of it (see [`made`]); returns its stat.
    pub(super) fn set_made_metadata(
        &mut self,
        (src_dir, src_name): (BorrowedFd<'_>, &CStr),
        (dst_dir, dst_name): (BorrowedFd<'_>, &CStr),
        st: &FileStat,
        exact: bool,
    ) -> Result<FileStat, Failed> {
        let (fd, made) = made::open_made(dst_dir, dst_name, file_type(st))?;
        made::set_made(
            fd.as_fd(),
            &Attrs::of(st),
            XattrTarget::At(src_dir, src_name),
            &mut self.xattr_bufs,
            exact,
        )?;
        Ok(made)
    }

    /// Whether two open entries have the same copied attributes.
    pub(super) fn same_xattrs_fd(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
    ) -> Result<bool, Failed> {
        xattrs::same_xattrs(XattrTarget::Fd(src), XattrTarget::Fd(dst), &mut self.xattr_bufs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_components_counts_whole_components() {
        assert_eq!(shared_components(b"", b"a/b"), 0);
        assert_eq!(shared_components(b"a/b", b""), 0);
        assert_eq!(shared_components(b"a/b/c", b"a/b"), 2);
        assert_eq!(shared_components(b"a/bc", b"a/b"), 1);
        assert_eq!(shared_components(b"x", b"a"), 0);
        assert_eq!(split_parent(b"a/b/leaf"), (&b"a/b"[..], &b"leaf"[..]));
        assert_eq!(split_parent(b"leaf"), (&b""[..], &b"leaf"[..]));
    }

    /// A worker's buffer serves both its direct reads and the buffered copy of a
    /// file that shrank after it was stated (`sendfile` then stops early and
    /// `read` tells where the file ends): the second must not assume the first's size.
    #[test]
    fn a_file_that_shrank_is_copied_after_a_direct_read() {
        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir on disk");
        let write = |name: &str, len: usize| {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            std::fs::write(dir.path().join(name), &data).unwrap();
            File::options()
                .read(true)
                .write(true)
                .open(dir.path().join(name))
                .unwrap()
        };
        let new = |name: &str| File::create(dir.path().join(name)).unwrap();
        let mut transfer = Transfer::default();
        let cold = write("cold", 200_000);
        let cold_dst = new("cold.copy");
        transfer
            .copy_direct(&cold, &cold_dst, 200_000, &mut |_| {})
            .unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("cold.copy")).unwrap(),
            std::fs::read(dir.path().join("cold")).unwrap()
        );
        let big = write("big", 1 << 20);
        let st = stat::fstat(&big).unwrap();
        big.set_len(4096).unwrap();
        let big_dst = new("big.copy");
        transfer.copy_data(&big, &big_dst, &st, &mut |_| {}).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("big.copy")).unwrap(),
            std::fs::read(dir.path().join("big")).unwrap()
        );
    }

    /// The write-back's direct writes from a RAM file (here on /dev/shm, a tmpfs) to
    /// the disk (/var/tmp): every byte of files around the block and threshold
    /// sizes, and of a file that shrank after it was stated, to its new end (also
    /// into the middle of a block: a direct write takes whole blocks).
    #[test]
    fn direct_writes_copy_every_byte_also_of_a_file_that_shrank() {
        let ram = tempfile::tempdir_in("/dev/shm").expect("tempdir on a tmpfs");
        let disk = tempfile::tempdir_in("/var/tmp").expect("tempdir on disk");
        assert!(
            direct_writes_suit(File::open(disk.path()).unwrap().as_fd()),
            "/var/tmp on ext4 or xfs"
        );
        let mut transfer = Transfer {
            direct_writes: true,
            ..Transfer::default()
        };
        let sizes = [65_536, 65_537, 69_632, 1 << 20, (1 << 20) + 4095, (9 << 20) + 1];
        for (i, size) in sizes.into_iter().chain([usize::MAX]).enumerate() {
            let shrinks = size == usize::MAX;
            let len = if shrinks { 1 << 20 } else { size };
            let data: Vec<u8> = (0..len).map(|j| ((j * 7 + i) % 253) as u8).collect();
            let src_path = ram.path().join(format!("f{i}"));
            std::fs::write(&src_path, &data).unwrap();
            let src = File::options().read(true).write(true).open(&src_path).unwrap();
            let st = stat::fstat(&src).unwrap();
            if shrinks {
                src.set_len(70_000).unwrap();
            }
            let dst_path = disk.path().join(format!("f{i}"));
            let dst = File::create(&dst_path).unwrap();
            let mut total = 0;
            transfer.copy_data(&src, &dst, &st, &mut |n| total += n).unwrap();
            let want = std::fs::read(&src_path).unwrap();
            assert_eq!(
                std::fs::read(&dst_path).unwrap(),
                want,
                "{len} bytes, shrank: {shrinks}"
            );
            assert_eq!(total, want.len() as u64);
            assert!(!transfer.no_direct_writes, "direct writes were refused");
        }
    }
}
