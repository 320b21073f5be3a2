//! The seed: copies the on-disk directory into the fresh tmpfs that is about to hide
//! it, recording every entry as the write-back's first baseline.
//!
//! The walk is sequential and depth-first with an explicit stack (deep trees cannot
//! overflow the thread's stack). It keeps two descriptors open per level being walked
//! and nothing per finished directory but while its files are out. The data of
//! singly-linked regular files is copied by a pool of [`WORKERS`] threads, at most
//! [`Sizes::in_flight`] files at a time, so reads from a cold disk overlap. Two rules keep the
//! walk's guarantees: a directory's metadata is applied only once its own files are
//! done (creating them would bump its mtime, and a read-only mode would get in the
//! way), and a multiply-linked file is copied by the walk itself, so its later names
//! can link to the copy at once. The walk does not wait for a directory's files: it
//! goes on, and whoever takes in the last of them applies the metadata, so the pool
//! stays full across directory boundaries.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};

use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::{self, OFlag};
use nix::sys::stat::{self, FileStat, Mode, SFlag};
use nix::unistd;

use super::baseline::{self, Baseline, Mark, Sig};
use super::error::{dst_err, src_err, CopyError, Failed};
use super::ops::{
    descriptors_roomy, direct_reads_suit, file_type, link_to_first_copy, open_dst_dir, open_root_dir,
    src_listing, stat_entry, Listing, RelPath, Reporter, Transfer,
};

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
    let direct = direct_reads_suit(src_fd.as_fd());
    let mut copier = Copier::new(src_st.st_dev, direct, progress);
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
struct CopyDir {
    src: Listing,
    /// Its entries, in inode order: a cold disk reads neighbouring inodes together.
    entries: std::vec::IntoIter<(CString, Option<Type>)>,
    /// Shared with the file jobs that write into it.
    dst: Arc<OwnedFd>,
    /// Applied to `dst` once its contents are in place, so that creating them cannot
    /// bump the copied mtime and a read-only mode cannot get in the way. `None` for
    /// the root, whose metadata belongs to the caller.
    meta: Option<FileStat>,
    /// Length of the walk's relative path while this directory is current.
    rel_len: usize,
    /// Tells its files apart from other directories' in the pool.
    id: DirId,
}

type DirId = u64;

/// A directory the walk has left while some of its files were still being copied.
struct Finishing {
    frame: CopyDir,
    /// Its relative path, for an error applying its metadata.
    path: std::path::PathBuf,
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
    /// The first file the pool failed to copy.
    job_failed: Option<CopyError>,
    /// The last directory id given out.
    last_dir: DirId,
    /// Files out in the pool, by directory; a directory with none has no entry.
    files_out: HashMap<DirId, usize>,
    /// Left by the walk, waiting for [`Self::files_out`] to reach zero.
    finishing: HashMap<DirId, Finishing>,
    sizes: Sizes,
    /// The workers read cold files with `O_DIRECT` ([`direct_reads_suit`]).
    direct: bool,
}

impl<'p> Copier<'p> {
    fn new(root_dev: u64, direct: bool, progress: Option<&'p mut dyn FnMut(&CopyStats)>) -> Self {
        Copier {
            reporter: Reporter::new(progress),
            root_dev,
            rel: RelPath::default(),
            links: HashMap::new(),
            transfer: Transfer::default(),
            marks: baseline::Marks::default(),
            job_failed: None,
            last_dir: 0,
            files_out: HashMap::new(),
            finishing: HashMap::new(),
            sizes: Sizes::for_limit(),
            direct,
        }
    }

    fn run(&mut self, src: OwnedFd, dst: OwnedFd) -> Result<(), CopyError> {
        let (jobs, job_rx) = mpsc::sync_channel::<FileJob>(self.sizes.in_flight);
        let direct = self.direct;
        let (done_tx, done) = mpsc::channel::<FileDone>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        std::thread::scope(|scope| {
            for _ in 0..WORKERS {
                let (job_rx, done_tx) = (Arc::clone(&job_rx), done_tx.clone());
                scope.spawn(move || worker(&job_rx, &done_tx, direct));
            }
            drop(done_tx);
            let mut pool = Pool {
                jobs: Some(jobs),
                done,
                in_flight: 0,
            };
            let walked = self.walk(src, dst, &mut pool);
            // Closing the queue ends the workers once the jobs handed out are done.
            pool.jobs = None;
            let drained = self.drain(&mut pool);
            walked.and(drained)
        })
    }

    fn walk(&mut self, src: OwnedFd, dst: OwnedFd, pool: &mut Pool) -> Result<(), CopyError> {
        let mut root = src_listing(src).map_err(|f| f.at(self.rel.path(None)))?;
        let entries = by_inode(&mut root).map_err(|f| f.at(self.rel.path(None)))?;
        let mut stack = vec![CopyDir {
            src: root,
            entries,
            dst: Arc::new(dst),
            meta: None,
            rel_len: 0,
            id: 0,
        }];
        while let Some(top) = stack.last_mut() {
            let Some((name, dtype)) = top.entries.next() else {
                let done = stack.pop().expect("the loop runs only while a frame is stacked");
                if self.files_out.contains_key(&done.id) {
                    // Its files first: only then can its metadata stay as copied.
                    let path = self.rel.path(None);
                    self.finishing.insert(done.id, Finishing { frame: done, path });
                    while self.finishing.len() > self.sizes.finishing {
                        self.take_in_one(pool);
                    }
                } else if let Some(st) = &done.meta {
                    self.transfer
                        .set_metadata(done.src.fd(), done.dst.as_fd(), st, false)
                        .map_err(|f| f.at(self.rel.path(None)))?;
                }
                if let Some(parent) = stack.last() {
                    self.rel.truncate(parent.rel_len);
                }
                continue;
            };
            let name = name.as_c_str();
            match self.copy_entry(&stack, name, dtype, pool) {
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
            if let Some(e) = self.job_failed.take() {
                return Err(e);
            }
            self.reporter.entry_done();
        }
        Ok(())
    }

    /// Copies one entry of the directory on top of `stack`; returns the frame to walk
    /// next when the entry is a directory to descend into.
    fn copy_entry(
        &mut self,
        stack: &[CopyDir],
        name: &CStr,
        dtype: Option<Type>,
        pool: &mut Pool,
    ) -> Result<Option<CopyDir>, Failed> {
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
            libc::S_IFREG if st.st_nlink == 1 => {
                let src = opened.expect("stat_entry opens every regular file");
                let job = FileJob {
                    dir: parent.id,
                    dst_dir: Arc::clone(&parent.dst),
                    name: name.to_owned(),
                    src,
                    st,
                    path,
                };
                self.hand_out(pool, job);
                return Ok(None);
            }
            libc::S_IFREG => {
                let fd = opened.expect("stat_entry opens every regular file");
                let reporter = &mut self.reporter;
                copy_file(&mut self.transfer, dst_dir, name, fd, &st, &mut |n| {
                    reporter.stats.bytes += n;
                    reporter.report_if_due();
                })?;
                self.reporter.stats.files += 1;
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
    ) -> Result<Option<CopyDir>, Failed> {
        // Owner-only until its metadata is applied: nobody else can look into or
        // plant anything in a half-copied directory.
        stat::mkdirat(dst_dir, name, Mode::S_IRWXU).map_err(dst_err("create directory"))?;
        let dst = open_dst_dir(dst_dir, name).map_err(dst_err("open directory"))?;
        self.reporter.stats.dirs += 1;
        if st.st_dev != self.root_dev {
            self.transfer.set_metadata(src.as_fd(), dst.as_fd(), &st, false)?;
            return Ok(None);
        }
        let mut src = src_listing(src)?;
        let entries = by_inode(&mut src)?;
        self.rel.push(name);
        self.last_dir += 1;
        Ok(Some(CopyDir {
            src,
            entries,
            dst: Arc::new(dst),
            meta: Some(st),
            rel_len: self.rel.len(),
            id: self.last_dir,
        }))
    }

    /// Links `name` to the copy of an inode already seen under another name; false if
    /// this is the first name seen.
    fn link_to_first_copy(
        &mut self,
        stack: &[CopyDir],
        key: (u64, u64),
        name: &CStr,
    ) -> Result<bool, Failed> {
        let Some(first) = self.links.get_mut(&key) else {
            return Ok(false);
        };
        let new_dir = stack
            .last()
            .expect("the root frame stays until the walk ends")
            .dst
            .as_fd();
        // CopyDir i holds the copy of the first i components of the current path.
        link_to_first_copy(
            |i| stack[i].dst.as_fd(),
            self.rel.as_bytes(),
            (&first.path, None),
            new_dir,
            name,
        )?;
        first.remaining -= 1;
        if first.remaining == 0 {
            self.links.remove(&key);
        }
        Ok(true)
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
            .set_made_metadata((src_dir, name), (dst_dir, name), st, false)?;
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
            .set_made_metadata((src_dir, name), (dst_dir, name), st, false)?;
        self.reporter.stats.specials += 1;
        Ok(())
    }
}

impl Copier<'_> {
    /// Queues a file for the pool, first taking in a finished one when
    /// [`Sizes::in_flight`] are out already.
    fn hand_out(&mut self, pool: &mut Pool, job: FileJob) {
        if pool.in_flight >= self.sizes.in_flight {
            self.take_in_one(pool);
        }
        let jobs = pool
            .jobs
            .as_ref()
            .expect("the queue stays open while the walk runs");
        *self.files_out.entry(job.dir).or_default() += 1;
        jobs.send(job).expect("the workers live as long as the queue");
        pool.in_flight += 1;
    }

    /// Waits for every file handed out; the first that failed fails the copy.
    fn drain(&mut self, pool: &mut Pool) -> Result<(), CopyError> {
        while pool.in_flight > 0 {
            self.take_in_one(pool);
        }
        self.job_failed.take().map_or(Ok(()), Err)
    }

    /// Waits for the next file the pool finishes.
    fn take_in_one(&mut self, pool: &mut Pool) {
        let done = pool.done.recv().expect("a worker answers every job handed out");
        pool.in_flight -= 1;
        self.take_in(done);
    }

    /// Records a finished file, or leaves out one that changed under the copy; a
    /// failure is kept for the walk, which stops at its next entry. The last file of a
    /// directory the walk has left finishes that directory.
    fn take_in(&mut self, done: FileDone) {
        let dir = done.dir;
        self.take_in_file(done);
        let out = self
            .files_out
            .get_mut(&dir)
            .expect("a directory is counted while its files are out");
        *out -= 1;
        if *out > 0 {
            return;
        }
        self.files_out.remove(&dir);
        let Some(Finishing { frame, path }) = self.finishing.remove(&dir) else {
            return;
        };
        if let Some(st) = &frame.meta {
            if let Err(f) = self
                .transfer
                .set_metadata(frame.src.fd(), frame.dst.as_fd(), st, false)
            {
                self.job_failed.get_or_insert(f.at(path));
            }
        }
    }

    fn take_in_file(&mut self, done: FileDone) {
        match done.result {
            Ok(bytes) => {
                self.reporter.stats.files += 1;
                self.reporter.stats.bytes += bytes;
                self.marks.insert(&done.path, Mark::Entry(Sig::of(&done.st)));
                self.reporter.report_if_due();
            }
            Err(f) if changed_under_us(&f) => {
                // As in the walk: a copy nobody recorded must not be written back.
                let _ = unistd::unlinkat(
                    done.dst_dir.as_fd(),
                    done.name.as_c_str(),
                    unistd::UnlinkatFlags::NoRemoveDir,
                );
                self.reporter.stats.skipped += 1;
                tracing::debug!(
                    "seed: {} vanished or changed while it was copied; it stays on disk",
                    String::from_utf8_lossy(&done.path)
                );
            }
            Err(failed) => {
                let path = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&done.path);
                self.job_failed.get_or_insert(failed.at(path.into()));
            }
        }
    }
}

/// The whole listing, each name once, sorted by inode number. A directory being
/// renamed in can list a name twice (tmpfs does, see `scan::read_names`): the copy
/// would then fail on its own first copy.
fn by_inode(listing: &mut Listing) -> Result<std::vec::IntoIter<(CString, Option<Type>)>, Failed> {
    let mut entries = Vec::new();
    while let Some(e) = listing.next() {
        let e = e.map_err(src_err("read directory"))?;
        entries.push((e.ino(), e.file_name().to_owned(), e.file_type()));
    }
    entries.sort_unstable_by(|a, b| a.1.cmp(&b.1));
    entries.dedup_by(|a, b| a.1 == b.1);
    entries.sort_unstable_by_key(|(ino, _, _)| *ino);
    Ok(entries
        .into_iter()
        .map(|(_, name, dtype)| (name, dtype))
        .collect::<Vec<_>>()
        .into_iter())
}

/// Threads copying file data. Cold reads are the seed's cost, and a disk serves
/// several at once far faster than one after another; reads of neighbouring files
/// (handed out in inode order) that are queued together are merged into one request,
/// which is what an IOPS-limited disk needs (docs/benchmarks.md: 16 threads read
/// 20,000 files in about 21,500 requests, 64 in 11,000–14,000).
const WORKERS: usize = 64;

/// What bounds the descriptors the seed holds: files handed out and not yet taken in
/// (one each, and the worker copying it a second), and directories left by the walk
/// with files still out (two each); the walk's own two per level come on top.
struct Sizes {
    in_flight: usize,
    finishing: usize,
}

impl Sizes {
    /// About 640 at most with room to spare ([`descriptors_roomy`]), else about 260, so
    /// a tree some hundreds deep still fits under the usual 1,024.
    fn for_limit() -> Sizes {
        if descriptors_roomy() {
            Sizes {
                in_flight: 256,
                finishing: 128,
            }
        } else {
            Sizes {
                in_flight: 128,
                finishing: 32,
            }
        }
    }
}

struct Pool {
    /// `None` once the walk is over: the workers then stop.
    jobs: Option<SyncSender<FileJob>>,
    done: Receiver<FileDone>,
    in_flight: usize,
}

/// A singly-linked regular file to copy: its open source, and where it goes.
struct FileJob {
    dir: DirId,
    dst_dir: Arc<OwnedFd>,
    name: CString,
    src: OwnedFd,
    /// The source as the walk saw it: its record in the baseline.
    st: FileStat,
    /// Relative path, `/`-separated.
    path: Vec<u8>,
}

struct FileDone {
    dir: DirId,
    dst_dir: Arc<OwnedFd>,
    name: CString,
    st: FileStat,
    path: Vec<u8>,
    /// Data bytes copied.
    result: Result<u64, Failed>,
}

fn worker(jobs: &Mutex<Receiver<FileJob>>, done: &Sender<FileDone>, direct: bool) {
    let mut transfer = Transfer::default();
    transfer.direct_when_cold = direct;
    loop {
        let job = match jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .recv()
        {
            Ok(job) => job,
            Err(_) => return,
        };
        let mut bytes = 0;
        let result = copy_file(
            &mut transfer,
            job.dst_dir.as_fd(),
            &job.name,
            job.src,
            &job.st,
            &mut |n| bytes += n,
        )
        .map(|()| bytes);
        let reply = FileDone {
            dir: job.dir,
            dst_dir: job.dst_dir,
            name: job.name,
            st: job.st,
            path: job.path,
            result,
        };
        if done.send(reply).is_err() {
            return;
        }
    }
}

/// Puts a copy of the regular file `src` (`st`: its stat), data and metadata, in
/// place of the entry `name` of `dir`, if that is still the file `expect`: the same
/// inode in the same version (type, mode, size, mtime). The two are exchanged
/// atomically and the one that came out is checked; one the application changed or
/// replaced meanwhile is put back. Whether the copy took its place.
pub fn replace_with_copy(
    dir: BorrowedFd<'_>,
    name: &CStr,
    src: OwnedFd,
    st: &FileStat,
    expect: &Sig,
) -> Result<bool, CopyError> {
    use nix::fcntl::{renameat2, RenameFlags};
    let at = |f: Failed| {
        f.at(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(
            name.to_bytes(),
        )))
    };
    let mut transfer = Transfer::default();
    let (mut temp, ()) = super::temp::create_temp(&mut super::temp::TempNames::new(), dir, |d, n| {
        copy_file(
            &mut transfer,
            d,
            n,
            src.try_clone().map_err(src_err("duplicate"))?,
            st,
            &mut |_| {},
        )
    })
    .map_err(at)?;
    let exchange = || renameat2(dir, temp.name.as_c_str(), dir, name, RenameFlags::RENAME_EXCHANGE);
    exchange().map_err(dst_err("exchange")).map_err(at)?;
    let out = stat::fstatat(
        dir,
        temp.name.as_c_str(),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    );
    let was = out.is_ok_and(|o| {
        let o = Sig::of(&o);
        o.ino == expect.ino && o.same_version(expect)
    });
    if !was {
        if let Err(e) = renameat2(dir, temp.name.as_c_str(), dir, name, RenameFlags::RENAME_EXCHANGE) {
            // Both stay: the copy at the name, what came out at the temporary name.
            temp.live = false;
            return Err(at(dst_err("exchange back")(e)));
        }
    }
    // The temporary name now holds what is not kept; its guard removes it.
    drop(temp);
    Ok(was)
}

/// Copies one regular file, data and metadata, into a new entry `name` of
/// `dst_dir`; fails as changed under the copy when it was written meanwhile.
fn copy_file(
    transfer: &mut Transfer,
    dst_dir: BorrowedFd<'_>,
    name: &CStr,
    src: OwnedFd,
    st: &FileStat,
    copied: &mut dyn FnMut(u64),
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
    transfer.copy_data(&src, &dst, st, copied)?;
    transfer.set_metadata(src.as_fd(), dst.as_fd(), st, false)?;
    let after = stat::fstat(&src).map_err(src_err("stat"))?;
    if Sig::of(&after) != Sig::of(st) {
        // Written while it was copied: the copy may be torn.
        return Err(src_err("copy a file being written")(Errno::ENOENT));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
