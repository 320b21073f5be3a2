//! Tree copies between the on-disk directory and its tmpfs: [`copy_tree`] seeds a fresh
//! tmpfs from the directory it is about to hide, [`sync_tree`] writes the tmpfs back.
//!
//! Both run as root over directories that unprivileged applications can write to, so
//! every lookup below the two roots is a single name relative to an open directory
//! descriptor and never follows a symlink. A symlink planted in the source or in the
//! destination, at any depth and at any moment, therefore cannot redirect a read or a
//! write outside the trees: at worst the copy fails.
//!
//! The result is meant to be indistinguishable from `cp -ax` / `rsync -aHAX`: types,
//! permission bits, owners, nanosecond times, symlink targets, hard links, extended
//! attributes and ACLs, device numbers and holes are kept, and other filesystems
//! mounted below the source are not entered.
//!
//! The seeding walk is sequential and depth-first with an explicit stack (deep trees
//! cannot overflow the thread's stack). It keeps two descriptors open per level being
//! walked and nothing per finished directory. Per-entry work (`Copier::copy_entry`)
//! only needs the parent's two descriptors, so directories could later be handed to
//! worker threads; the hard-link table and the "directory metadata after its contents"
//! rule are the two places that would then need coordination.
//!
//! The primitives both walks share (opens, data copies, metadata, hard-link lookups,
//! progress) live in `ops`, extended attributes in `xattrs`. The write-back (`writeback`)
//! reads its source ahead on a second thread (`scan`) and leaves `fsync` and rename to
//! workers (`durable`).

pub mod baseline;
mod durable;
mod error;
pub mod journal;
mod marks;
mod ops;
mod place;
mod scan;
mod settle;
mod temp;
mod writeback;
mod xattrs;

use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, FileStat, Mode, SFlag};
use nix::unistd;

pub use baseline::Baseline;
use baseline::{Mark, Sig};
pub use error::CopyError;
use error::{dst_err, src_err, Failed};
pub use journal::Journal;
use ops::{
    file_type, link_to_first_copy, open_dst_dir, open_root_dir, open_src, stat_entry, Listing, RelPath,
    Reporter, Transfer,
};
pub use place::DiskDeletions;
pub use temp::TEMP_PREFIX;
pub use writeback::{sync_tree, Merge, SyncStats, Synced};

/// Size of a tree as a tmpfs would have to hold it.
///
/// Hard-linked inodes are counted once, because the copy keeps them linked.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TreeSize {
    /// Sum of `st_blocks * 512`: what the data really occupies, holes excluded.
    pub allocated: u64,
    /// Sum of `st_size`.
    pub apparent: u64,
    pub inodes: u64,
}

/// Running totals of a copy. A hard link is counted in `hardlinks` only, not as a
/// second file; `bytes` counts data actually copied, so holes are not included.
#[derive(Debug, Default, Clone)]
pub struct CopyStats {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub specials: u64,
    pub hardlinks: u64,
    pub bytes: u64,
    /// Source entries that vanished, were replaced or changed while they were being
    /// copied: left out of the copy (they stay on disk and the write-back keeps them).
    pub skipped: u64,
}

/// Measures `dir` without following symlinks or entering other filesystems, so the
/// result matches what [`copy_tree`] would put into the tmpfs. The root itself is not
/// counted, as the tmpfs brings its own root.
pub fn measure(dir: &Path) -> Result<TreeSize, CopyError> {
    let mut rel = RelPath::default();
    let (root, root_st) = open_root_dir(dir, true)?;
    let root_dev = root_st.st_dev;
    let mut stack = vec![(src_listing(root).map_err(|f| f.at(rel.path(None)))?, 0)];
    let mut linked = HashSet::new();
    let mut size = TreeSize::default();
    while let Some((listing, _)) = stack.last_mut() {
        let Some(next) = listing.next() else {
            stack.pop();
            if let Some(&(_, rel_len)) = stack.last() {
                rel.truncate(rel_len);
            }
            continue;
        };
        let entry = next
            .map_err(src_err("read directory"))
            .map_err(|f| f.at(rel.path(None)))?;
        let name = entry.file_name();
        let st = stat::fstatat(listing.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(src_err("stat"))
            .map_err(|f| f.at(rel.path(Some(name))))?;
        let is_dir = file_type(&st) == libc::S_IFDIR;
        if is_dir || st.st_nlink <= 1 || linked.insert((st.st_dev, st.st_ino)) {
            size.allocated += ops::allocated_bytes(&st);
            size.apparent += u64::try_from(st.st_size).unwrap_or(0);
            size.inodes += 1;
        }
        if is_dir && st.st_dev == root_dev {
            let child = open_src(listing.fd(), name, OFlag::O_DIRECTORY)
                .map_err(src_err("open directory"))
                .and_then(src_listing)
                .map_err(|f| f.at(rel.path(Some(name))))?;
            rel.push(name);
            stack.push((child, rel.len()));
        }
    }
    Ok(size)
}

fn src_listing(fd: OwnedFd) -> Result<Listing, Failed> {
    Listing::new(fd).map_err(src_err("read directory"))
}

/// Copies the contents of `src` into the existing, empty directory `dst`, leaving the
/// metadata of `dst` itself to the caller.
///
/// Any error aborts the copy and leaves a partial tree behind; the caller discards it
/// with the tmpfs. `dst` must not lie inside `src` on the same filesystem. Owners can
/// only be preserved with `CAP_CHOWN`, i.e. as root.
///
/// `progress` gets the running totals every 1000 entries or 100 ms, whichever comes
/// first (also during a long file), and once more at the end.
pub fn copy_tree(
    src: &Path,
    dst: &Path,
    progress: Option<&mut dyn FnMut(&CopyStats)>,
) -> Result<CopyStats, CopyError> {
    seed_tree(src, dst, progress).map(|(stats, _)| stats)
}

/// [`copy_tree`] for a seed: also returns the write-back's baseline, the record of
/// every source entry as it was when copied (its `taken` is left to the caller,
/// who knows when the copy becomes visible). An entry that vanishes, is replaced or
/// changes while it is copied is left out (counted in [`CopyStats::skipped`]): the
/// application is still writing the source, and it stays there.
pub fn seed_tree(
    src: &Path,
    dst: &Path,
    progress: Option<&mut dyn FnMut(&CopyStats)>,
) -> Result<(CopyStats, Baseline), CopyError> {
    let (src_fd, src_st) = open_root_dir(src, true)?;
    let (dst_fd, _) = open_root_dir(dst, false)?;
    let mut copier = Copier::new(src_st.st_dev, progress);
    copier.run(src_fd, dst_fd)?;
    copier.reporter.report();
    let baseline = Baseline {
        marks: std::mem::take(&mut copier.marks),
        ..Baseline::none()
    };
    Ok((copier.reporter.stats, baseline))
}

/// A source entry gone or changed under the copy: `ENOENT` (vanished), `ELOOP` and
/// `ENOTDIR` (replaced by a symlink or another type since it was listed), `EINVAL`
/// (a symlink replaced before its target was read).
fn changed_under_us(f: &Failed) -> bool {
    f.on_source()
        && matches!(
            f.errno(),
            Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR | libc::EINVAL)
        )
}

/// The copy of the first name seen for a multiply-linked inode, for later names to
/// link to.
struct FirstCopy {
    /// Relative path of that copy, `/`-separated.
    path: Box<[u8]>,
    /// Names still expected; the record is dropped at zero to bound memory.
    remaining: libc::nlink_t,
}

/// One directory being copied: the source listing and the copy being filled.
struct Frame {
    src: Listing,
    dst: OwnedFd,
    /// Applied to `dst` once its contents are in place, so that creating them cannot
    /// bump the copied mtime and a read-only mode cannot get in the way. `None` for
    /// the root, whose metadata belongs to the caller.
    meta: Option<FileStat>,
    /// Length of the walk's relative path while this directory is current.
    rel_len: usize,
}

struct Copier<'p> {
    reporter: Reporter<'p, CopyStats>,
    /// Directories with another `st_dev` are mount points and are left empty.
    root_dev: u64,
    rel: RelPath,
    links: HashMap<(u64, u64), FirstCopy>,
    transfer: Transfer,
    /// Every entry copied, as its source was: the seed's baseline.
    marks: baseline::Marks,
}

impl<'p> Copier<'p> {
    fn new(root_dev: u64, progress: Option<&'p mut dyn FnMut(&CopyStats)>) -> Self {
        Copier {
            reporter: Reporter::new(progress),
            root_dev,
            rel: RelPath::default(),
            links: HashMap::new(),
            transfer: Transfer::default(),
            marks: baseline::Marks::default(),
        }
    }

    fn run(&mut self, src: OwnedFd, dst: OwnedFd) -> Result<(), CopyError> {
        let root = src_listing(src).map_err(|f| f.at(self.rel.path(None)))?;
        let mut stack = vec![Frame {
            src: root,
            dst,
            meta: None,
            rel_len: 0,
        }];
        while let Some(top) = stack.last_mut() {
            let Some(next) = top.src.next() else {
                let done = stack.pop().expect("the loop runs only while a frame is stacked");
                if let Some(st) = &done.meta {
                    self.transfer
                        .set_metadata(done.src.fd(), done.dst.as_fd(), st, false)
                        .map_err(|f| f.at(self.rel.path(None)))?;
                }
                if let Some(parent) = stack.last() {
                    self.rel.truncate(parent.rel_len);
                }
                continue;
            };
            let entry = next
                .map_err(src_err("read directory"))
                .map_err(|f| f.at(self.rel.path(None)))?;
            let name = entry.file_name();
            match self.copy_entry(&stack, name, entry.file_type()) {
                Ok(Some(child)) => stack.push(child),
                Ok(None) => {}
                Err(f) if changed_under_us(&f) => {
                    // Whatever was made of it in the copy goes too: a copy nobody
                    // recorded must not be written back as the application's.
                    let top = stack.last().expect("the root frame stays until the walk ends");
                    let _ = unistd::unlinkat(top.dst.as_fd(), name, unistd::UnlinkatFlags::NoRemoveDir);
                    self.reporter.stats.skipped += 1;
                    tracing::debug!(
                        "seed: {} vanished or changed while it was copied; it stays on disk",
                        self.rel.path(Some(name)).display()
                    );
                }
                Err(f) => return Err(f.at(self.rel.path(Some(name)))),
            }
            self.reporter.entry_done();
        }
        Ok(())
    }

    /// Copies one entry of the directory on top of `stack`; returns the frame to walk
    /// next when the entry is a directory to descend into.
    fn copy_entry(
        &mut self,
        stack: &[Frame],
        name: &CStr,
        dtype: Option<Type>,
    ) -> Result<Option<Frame>, Failed> {
        let parent = stack.last().expect("the root frame stays until the walk ends");
        let (src_dir, dst_dir) = (parent.src.fd(), parent.dst.as_fd());
        let (st, opened) = stat_entry(src_dir, name, dtype)?;
        let kind = file_type(&st);
        let path = self.rel.joined(name);
        if kind == libc::S_IFDIR {
            let fd = opened.expect("stat_entry opens every directory");
            let frame = self.enter_dir(dst_dir, name, fd, st)?;
            self.marks.insert(&path, Mark::Entry(Sig::of(&st)));
            return Ok(frame);
        }
        let key = (st.st_dev, st.st_ino);
        if st.st_nlink > 1 && self.link_to_first_copy(stack, key, name)? {
            self.reporter.stats.hardlinks += 1;
            self.marks.insert(&path, Mark::Entry(Sig::of(&st)));
            return Ok(None);
        }
        match kind {
            libc::S_IFREG => {
                let fd = opened.expect("stat_entry opens every regular file");
                self.copy_file(dst_dir, name, fd, &st)?;
            }
            libc::S_IFLNK => self.copy_symlink(src_dir, dst_dir, name, &st)?,
            _ => self.copy_node(src_dir, dst_dir, name, &st)?,
        }
        if st.st_nlink > 1 {
            let first = FirstCopy {
                path: self.rel.joined(name).into_boxed_slice(),
                remaining: st.st_nlink - 1,
            };
            self.links.insert(key, first);
        }
        self.marks.insert(&path, Mark::Entry(Sig::of(&st)));
        Ok(None)
    }

    fn enter_dir(
        &mut self,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
        src: OwnedFd,
        st: FileStat,
    ) -> Result<Option<Frame>, Failed> {
        // Owner-only until its metadata is applied: nobody else can look into or
        // plant anything in a half-copied directory.
        stat::mkdirat(dst_dir, name, Mode::S_IRWXU).map_err(dst_err("create directory"))?;
        let dst = open_dst_dir(dst_dir, name).map_err(dst_err("open directory"))?;
        self.reporter.stats.dirs += 1;
        if st.st_dev != self.root_dev {
            self.transfer.set_metadata(src.as_fd(), dst.as_fd(), &st, false)?;
            return Ok(None);
        }
        let src = src_listing(src)?;
        self.rel.push(name);
        Ok(Some(Frame {
            src,
            dst,
            meta: Some(st),
            rel_len: self.rel.len(),
        }))
    }

    /// Links `name` to the copy of an inode already seen under another name; false if
    /// this is the first name seen.
    fn link_to_first_copy(&mut self, stack: &[Frame], key: (u64, u64), name: &CStr) -> Result<bool, Failed> {
        let Some(first) = self.links.get_mut(&key) else {
            return Ok(false);
        };
        let new_dir = stack
            .last()
            .expect("the root frame stays until the walk ends")
            .dst
            .as_fd();
        // Frame i holds the copy of the first i components of the current path.
        link_to_first_copy(
            |i| stack[i].dst.as_fd(),
            self.rel.as_bytes(),
            &first.path,
            new_dir,
            name,
        )?;
        first.remaining -= 1;
        if first.remaining == 0 {
            self.links.remove(&key);
        }
        Ok(true)
    }

    fn copy_file(
        &mut self,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
        src: OwnedFd,
        st: &FileStat,
    ) -> Result<(), Failed> {
        // O_EXCL: an entry planted under this name, symlink or not, fails the copy
        // instead of being written through.
        let dst = fcntl::openat(
            dst_dir,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(dst_err("create file"))?;
        let (src, dst) = (File::from(src), File::from(dst));
        self.copy_data(&src, &dst, st)?;
        self.transfer.set_metadata(src.as_fd(), dst.as_fd(), st, false)?;
        let after = stat::fstat(&src).map_err(src_err("stat"))?;
        if Sig::of(&after) != Sig::of(st) {
            // Written while it was copied: the copy may be torn.
            return Err(src_err("copy a file being written")(Errno::ENOENT));
        }
        self.reporter.stats.files += 1;
        Ok(())
    }

    fn copy_data(&mut self, src: &File, dst: &File, st: &FileStat) -> Result<(), Failed> {
        let reporter = &mut self.reporter;
        self.transfer.copy_data(src, dst, st, &mut |n| {
            reporter.stats.bytes += n;
            reporter.report_if_due();
        })
    }

    fn copy_symlink(
        &mut self,
        src_dir: BorrowedFd<'_>,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
        st: &FileStat,
    ) -> Result<(), Failed> {
        let target = fcntl::readlinkat(src_dir, name).map_err(src_err("read symlink"))?;
        unistd::symlinkat(target.as_os_str(), dst_dir, name).map_err(dst_err("create symlink"))?;
        self.transfer
            .set_metadata_at((src_dir, name), (dst_dir, name), st, false)?;
        self.reporter.stats.symlinks += 1;
        Ok(())
    }

    /// FIFOs, sockets and device nodes: only the inode is copied, never opened.
    fn copy_node(
        &mut self,
        src_dir: BorrowedFd<'_>,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
        st: &FileStat,
    ) -> Result<(), Failed> {
        let kind = SFlag::from_bits_truncate(file_type(st));
        stat::mknodat(dst_dir, name, kind, Mode::S_IRUSR | Mode::S_IWUSR, st.st_rdev)
            .map_err(dst_err("create node"))?;
        self.transfer
            .set_metadata_at((src_dir, name), (dst_dir, name), st, false)?;
        self.reporter.stats.specials += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ops::*;
    use super::xattrs::*;
    use super::*;
    use nix::sys::stat::UtimensatFlags;
    use nix::sys::time::TimeSpec;
    use nix::unistd::Whence;
    use std::ffi::OsString;
    use std::fs;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::ffi::OsStringExt;
    use std::os::unix::fs::FileExt;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::PathBuf;

    fn cstr(s: &str) -> std::ffi::CString {
        std::ffi::CString::new(s).expect("test names have no NUL")
    }

    fn open_file(path: &Path) -> File {
        File::open(path).expect("open test file")
    }

    fn create_file(path: &Path) -> File {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .expect("create test file")
    }

    fn sparse_fixture(dir: &Path) -> (PathBuf, Vec<(u64, Vec<u8>)>, u64) {
        let path = dir.join("sparse");
        let file = create_file(&path);
        let size = 64 * 1024 * 1024 + 100;
        let chunks = vec![
            (0, vec![b'a'; 4096]),
            (8 * 1024 * 1024, vec![b'b'; 10_000]),
            (size - 100, vec![b'c'; 100]),
        ];
        for (offset, data) in &chunks {
            file.write_all_at(data, *offset).expect("write sparse chunk");
        }
        file.set_len(size).expect("extend sparse file");
        (path, chunks, size)
    }

    fn copy_one(src: &Path, dst: &Path, try_copy_file_range: bool) -> CopyStats {
        let (src_file, dst_file) = (open_file(src), create_file(dst));
        let st = stat::fstat(&src_file).expect("stat source");
        let mut copier = Copier::new(st.st_dev, None);
        copier.transfer.no_copy_file_range = !try_copy_file_range;
        copier
            .copy_data(&src_file, &dst_file, &st)
            .map_err(|f| f.at(PathBuf::from("sparse")))
            .expect("copy data");
        copier.reporter.stats
    }

    fn assert_sparse_copy(try_copy_file_range: bool) {
        let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
        let (src, chunks, size) = sparse_fixture(dir.path());
        let dst = dir.path().join("copy");
        let stats = copy_one(&src, &dst, try_copy_file_range);
        let data_len: usize = chunks.iter().map(|(_, d)| d.len()).sum();
        assert_eq!(fs::metadata(&dst).expect("stat copy").len(), size);
        let copied = open_file(&dst);
        for (offset, data) in &chunks {
            let mut back = vec![0; data.len()];
            copied.read_exact_at(&mut back, *offset).expect("read back chunk");
            assert_eq!(&back, data, "chunk at {offset}");
        }
        let mut hole = vec![1; 4096];
        copied
            .read_exact_at(&mut hole, 4 * 1024 * 1024)
            .expect("read hole");
        assert!(hole.iter().all(|&b| b == 0));
        // Only the data ranges (rounded to the filesystem's blocks) were copied.
        assert!(
            stats.bytes >= data_len as u64 && stats.bytes < 1024 * 1024,
            "{stats:?}"
        );
        let allocated = fs::metadata(&dst).expect("stat copy").blocks() * 512;
        assert!(allocated < 1024 * 1024, "copy allocates {allocated} bytes");
        let hole_at = seek(&copied, 4096 * 2, Whence::SeekHole).expect("SEEK_HOLE");
        assert!(hole_at < 8 * 1024 * 1024, "first hole at {hole_at}");
    }

    #[test]
    fn copy_sparse_file_with_copy_file_range_keeps_holes() {
        assert_sparse_copy(true);
    }

    #[test]
    fn copy_sparse_file_with_read_write_keeps_holes() {
        assert_sparse_copy(false);
    }

    #[test]
    fn copy_dense_file_both_ways_is_exact() {
        let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
        let src = dir.path().join("dense");
        // Not a multiple of the buffer, to cover the short final chunk.
        let data: Vec<u8> = (0..COPY_BUF * 3 + 12_345).map(|i| (i * 31 % 251) as u8).collect();
        fs::write(&src, &data).expect("write dense file");
        for (i, try_cfr) in [true, false].into_iter().enumerate() {
            let dst = dir.path().join(format!("copy{i}"));
            let stats = copy_one(&src, &dst, try_cfr);
            assert_eq!(fs::read(&dst).expect("read copy"), data);
            assert_eq!(stats.bytes, data.len() as u64);
        }
    }

    /// ext4 (/tmp) to tmpfs (/dev/shm) is refused with EXDEV; the copy must fall back
    /// and stop trying, while a real error (EBADF for an append-only destination) is
    /// reported against the copy.
    #[test]
    fn refused_copy_file_range_falls_back_and_real_errors_abort() {
        let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
        let shm = tempfile::tempdir_in("/dev/shm").expect("tempdir on tmpfs");
        let src = dir.path().join("src");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        fs::write(&src, &data).expect("write");
        let src_dev = fs::metadata(&src).expect("stat").dev();
        assert_ne!(
            src_dev,
            fs::metadata(shm.path()).expect("stat").dev(),
            "needs two filesystems"
        );
        let dst = shm.path().join("dst");
        let stats = copy_one(&src, &dst, true);
        assert_eq!(fs::read(&dst).expect("read copy"), data);
        assert_eq!(stats.bytes, data.len() as u64);

        let appending = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(dir.path().join("appending"))
            .expect("open");
        let mut transfer = Transfer::default();
        let err = transfer
            .copy_range(&open_file(&src), &appending, 0, 5, &mut |_| {})
            .map_err(|f| f.at(PathBuf::from("appending")))
            .expect_err("append-only destination is an error");
        assert!(
            matches!(
                err,
                CopyError::Destination {
                    op: "copy data into",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            !transfer.no_copy_file_range,
            "a real error must not disable copy_file_range"
        );
    }

    /// A file shorter than its stat said (it shrank meanwhile): the copy ends at its
    /// real end, and the short count does not turn copy_file_range off for good.
    #[test]
    fn a_source_that_shrank_ends_the_copy_early() {
        let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
        let src = dir.path().join("src");
        fs::write(&src, b"only eleven").expect("write");
        let dst = create_file(&dir.path().join("dst"));
        let mut transfer = Transfer::default();
        let mut bytes = 0;
        transfer
            .copy_range(&open_file(&src), &dst, 0, 4096, &mut |n| bytes += n)
            .map_err(|f| f.at(PathBuf::from("src")))
            .expect("copy");
        assert_eq!(bytes, 11);
        assert!(!transfer.no_copy_file_range);
        assert_eq!(fs::read(dir.path().join("dst")).expect("read"), b"only eleven");
    }

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

    /// Links whose first copy is in the same directory, an ancestor, a finished
    /// sibling subtree and a deeper directory all resolve, and records are dropped once
    /// every name was seen.
    #[test]
    fn hard_links_resolve_from_any_directory() {
        let src = tempfile::tempdir_in("/tmp").expect("tempdir");
        let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
        let s = src.path();
        for dir in ["a/deep/er", "b/c", "z"] {
            fs::create_dir_all(s.join(dir)).expect("mkdir");
        }
        fs::write(s.join("a/deep/er/f"), b"one").expect("write");
        for link in ["a/deep/er/g", "a/h", "b/c/i", "z/j", "k"] {
            fs::hard_link(s.join("a/deep/er/f"), s.join(link)).expect("link");
        }
        fs::write(s.join("b/pair1"), b"two").expect("write");
        fs::hard_link(s.join("b/pair1"), s.join("b/c/pair2")).expect("link");
        // One name outside the tree: its record must survive, without harm.
        fs::write(s.join("z/outside-linked"), b"three").expect("write");
        let outside = tempfile::tempdir_in("/tmp").expect("tempdir");
        fs::hard_link(s.join("z/outside-linked"), outside.path().join("o")).expect("link");

        let src_fd = open_root(s).expect("open src");
        let dst_fd = open_root(dst.path()).expect("open dst");
        let root_dev = stat::fstat(&src_fd).expect("stat").st_dev;
        let mut copier = Copier::new(root_dev, None);
        copier.run(src_fd, dst_fd).expect("copy");

        let d = dst.path();
        let ino = |p: &str| fs::symlink_metadata(d.join(p)).expect("stat copy").ino();
        let first = ino("a/deep/er/f");
        for link in ["a/deep/er/g", "a/h", "b/c/i", "z/j", "k"] {
            assert_eq!(ino(link), first, "{link}");
        }
        assert_eq!(fs::symlink_metadata(d.join("k")).expect("stat").nlink(), 6);
        assert_eq!(ino("b/pair1"), ino("b/c/pair2"));
        assert_ne!(ino("b/pair1"), first);
        assert_eq!(fs::read(d.join("z/j")).expect("read"), b"one");
        assert_eq!(copier.reporter.stats.hardlinks, 6);
        assert_eq!(copier.reporter.stats.files, 3);
        let left: Vec<_> = copier.links.values().map(|f| f.path.to_vec()).collect();
        assert_eq!(left, vec![b"z/outside-linked".to_vec()]);
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
    fn errors_name_the_relative_path_and_side() {
        let src = tempfile::tempdir_in("/tmp").expect("tempdir");
        let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
        let name = OsString::from_vec(b"d\xff/x y".to_vec());
        fs::create_dir(src.path().join(OsString::from_vec(b"d\xff".to_vec()))).expect("mkdir");
        fs::write(src.path().join(&name), b"data").expect("write");
        fs::create_dir(dst.path().join(OsString::from_vec(b"d\xff".to_vec()))).expect("mkdir");
        let err = copy_tree(src.path(), dst.path(), None).expect_err("existing directory");
        let CopyError::Destination { op, path, source } = &err else {
            panic!("expected a destination error, got {err:?}");
        };
        assert_eq!(
            (*op, source.raw_os_error()),
            ("create directory", Some(libc::EEXIST))
        );
        assert_eq!(path.as_os_str().as_bytes(), b"d\xff");
        assert_eq!(err.to_string(), "cannot create directory `d\u{fffd}` in the copy");
        assert!(!err.is_no_space());
        let missing = copy_tree(&src.path().join("nope"), dst.path(), None).expect_err("missing source");
        assert!(
            matches!(&missing, CopyError::Source { op: "open directory", path, .. } if path == Path::new("."))
        );
    }

    #[test]
    fn is_no_space_covers_enospc_and_edquot_only() {
        let err = |errno| CopyError::Destination {
            op: "write",
            path: PathBuf::from("f"),
            source: io::Error::from_raw_os_error(errno),
        };
        assert!(err(libc::ENOSPC).is_no_space());
        assert!(err(libc::EDQUOT).is_no_space());
        assert!(!err(libc::EIO).is_no_space());
    }

    #[test]
    fn directory_metadata_is_applied_after_contents() {
        let src = tempfile::tempdir_in("/tmp").expect("tempdir");
        let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
        let ro = src.path().join("ro");
        fs::create_dir(&ro).expect("mkdir");
        fs::write(ro.join("inside"), b"x").expect("write");
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).expect("chmod");
        let when = TimeSpec::new(1_234_567_890, 123_456_789);
        stat::utimensat(
            fcntl::AT_FDCWD,
            &ro,
            &when,
            &when,
            UtimensatFlags::NoFollowSymlink,
        )
        .expect("utimens");
        copy_tree(src.path(), dst.path(), None).expect("copy");
        let meta = fs::metadata(dst.path().join("ro")).expect("stat copy");
        assert_eq!(meta.mode() & 0o7777, 0o555);
        assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_234_567_890, 123_456_789));
        assert_eq!(fs::read(dst.path().join("ro/inside")).expect("read"), b"x");
    }

    #[test]
    fn proc_path_reaches_the_entry_without_following_it() {
        let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
        std::os::unix::fs::symlink("/nonexistent", dir.path().join("l")).expect("symlink");
        let fd = open_root(dir.path()).expect("open");
        let mut buf = Vec::new();
        let path = proc_path(&mut buf, fd.as_fd(), &cstr("l"));
        let meta =
            fs::symlink_metadata(OsString::from_vec(path.to_bytes().to_vec())).expect("lstat via proc");
        assert!(meta.file_type().is_symlink());
    }
}
