//! Writes the files the write-back copies, makes them durable and puts them in place,
//! off the walk's thread: creating a file on the disk, copying its data and `fsync`ing
//! it cost more than comparing an entry, so a few workers do that for several files
//! at once (their writes and cache flushes overlap, and on a journaling filesystem
//! they share commits) while the walk goes on comparing.
//!
//! Order per file: a worker creates a temporary beside the final name, copies data and
//! metadata into it from the RAM file the walk opened, makes it durable and only then
//! renames it over its final name. A worker takes the files queued in batches and
//! writes a whole batch (starting each file's writeback) before making any durable:
//! one journal commit then covers most of the batch, instead of one per file or per
//! few files (docs/benchmarks.md: 20,000 files on a journaling ext4, 7.5 and 9.9 s
//! one by one, 4.5 and 5.7 s in batches). Where little else waits to be written, one
//! `syncfs` makes the whole batch durable on ext4, xfs and btrfs ([`sync_together`]),
//! else each file is `fsync`ed. A directory's metadata is applied (by the walk) after
//! the last rename into it finished, and its `fsync` is queued after that.
//! Hard-linked files stay with the walk: their later names are linked to the first
//! copy's inode, which must be in place by then.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

use nix::fcntl::AtFlags;
use nix::sys::stat::{self, FileStat};
use nix::sys::statvfs::fstatvfs;
use nix::unistd::{self, UnlinkatFlags};

use super::baseline::{now_coarse, Mark, Marks, Sig, Time};
use super::error::{dst_err, journal_err, CopyError, Failed};
use super::journal::Journal;
use super::ops::{descriptors_roomy, direct_writes_suit, Transfer};
use super::place::{put_in_place, remove_seen, DiskDeletions, Place, Placed, Seen};
use super::temp::{create_temp_file, TempNames};

/// Workers: enough `fsync`s in flight to keep the disk busy; they mostly sleep.
pub(super) const WORKERS: usize = 8;
/// Jobs queued at most, each holding the RAM file open, and jobs a worker takes at
/// once when that many are queued: written all, then made durable one by one. Each
/// job holds one descriptor (the RAM file, then the temporary) and keeps its
/// directory's two open in the walk, so batches are for where the descriptor limit
/// leaves room ([`descriptors_roomy`]: about 1,100 at most); under the usual 1,024,
/// one file at a time (about 450).
fn sizes() -> (usize, usize) {
    if descriptors_roomy() {
        (256, 32)
    } else {
        (128, 1)
    }
}

/// A destination directory shared with the workers renaming into it.
pub(super) struct DstDir {
    pub(super) fd: OwnedFd,
    /// Earlier directories at this path that the application deleted while the pass
    /// ran, as keys of the deletion watch: a name it deleted in one of them counts as
    /// deleted here (it may have made the directory, and the name in it, again).
    pub(super) gone: Vec<Vec<u8>>,
    renames: Mutex<Renames>,
}

#[derive(Default)]
struct Renames {
    pending: usize,
    /// The walk is done with the directory and waits for the renames.
    left: bool,
}

impl DstDir {
    pub(super) fn new(fd: OwnedFd, gone: Vec<Vec<u8>>) -> Arc<Self> {
        Arc::new(DstDir {
            fd,
            gone,
            renames: Mutex::default(),
        })
    }

    /// When the application deleted `name` here, or in an earlier directory at this
    /// path, while the pass ran, as far as `deletions` saw.
    pub(super) fn deleted(&self, deletions: &Mutex<dyn DiskDeletions + Send>, name: &CStr) -> Option<Time> {
        let mut d = deletions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        d.deleted(self.fd.as_fd(), name)
            .or_else(|| self.gone.iter().find_map(|key| d.deleted_in(key, name)))
    }

    /// The earlier directories at `name` here (or in an earlier directory at this
    /// path) that the application deleted while the pass ran.
    pub(super) fn gone_below(
        &self,
        deletions: &Mutex<dyn DiskDeletions + Send>,
        name: &CStr,
    ) -> Vec<Vec<u8>> {
        let mut d = deletions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut keys = d.gone_dirs(Ok(self.fd.as_fd()), name);
        for key in &self.gone {
            keys.extend(d.gone_dirs(Err(key), name));
        }
        keys
    }

    /// A key for the walk's table of directories waiting for their renames.
    pub(super) fn key(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as usize
    }

    /// The walk is done with the directory: true if no rename into it is still
    /// pending, else its key is sent on the completion channel after the last one.
    pub(super) fn leave(&self) -> bool {
        let mut renames = self.renames.lock().expect("no worker panics holding it");
        renames.left = true;
        renames.pending == 0
    }
}

pub(super) enum Job {
    Rename(Box<Rename>),
    /// `fsync` a directory whose names or metadata changed.
    FsyncDir {
        dir: Arc<DstDir>,
        rel: PathBuf,
    },
    /// `fsync` a file whose metadata was updated in place.
    FsyncFile {
        file: File,
        rel: PathBuf,
    },
}

/// Copy the RAM file `src` into a new temporary in `dir`, `fsync` it, then rename it
/// over `name`.
pub(super) struct Rename {
    pub(super) dir: Arc<DstDir>,
    /// The singly-linked regular file, open for reading, and its stat then: the
    /// metadata given to the copy. Closed once the copy is written, so that a batch
    /// waiting for its `fsync`s holds one descriptor per file.
    pub(super) src: Option<File>,
    pub(super) stat: FileStat,
    pub(super) name: CString,
    /// Only if `name` is still free, or still the entry the walk compared; if not, the
    /// temporary is dropped and counted by [`Durable::finish`].
    pub(super) place: Place,
    /// Relative path of `name`, for an error.
    pub(super) rel: PathBuf,
}

/// What the walk and the workers share.
#[derive(Default)]
struct Shared {
    error: Mutex<Option<CopyError>>,
    /// Set on the first error, by either side: the walk then stops at its next entry.
    aborted: AtomicBool,
    /// `noreplace` renames not done because the name existed by then.
    not_placed: AtomicU64,
    /// Data bytes copied and not yet taken into the walk's counts.
    bytes_written: AtomicU64,
    /// Files put in place, by relative path, as they are once there (a rename changes
    /// the ctime): the next baseline's records, packed as it packs them (a full first
    /// write-back puts every file of the tree here).
    placed: Mutex<Marks>,
    /// Files not put in place because the application replaced or deleted them
    /// meanwhile: what the next baseline remembers of them.
    kept: Mutex<Marks>,
    /// Jobs submitted and not yet done, and the signal that none is left.
    outstanding: Mutex<Outstanding>,
    idle: Condvar,
}

#[derive(Default)]
struct Outstanding {
    jobs: usize,
    /// A worker panicked: the jobs it held are never done.
    worker_died: bool,
}

/// Held by each worker: one that panics says so, so that [`Durable::drain`] does not
/// wait for its jobs (the scope passes the panic on).
struct Alive<'s>(&'s Shared);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut o = self.0.outstanding.lock().unwrap_or_else(PoisonError::into_inner);
            o.worker_died = true;
            self.0.idle.notify_all();
        }
    }
}

impl Shared {
    fn job_done(&self) {
        let mut o = self.outstanding.lock().expect("no thread panics holding it");
        o.jobs -= 1;
        if o.jobs == 0 {
            self.idle.notify_all();
        }
    }

    fn fail(&self, failure: CopyError) {
        self.aborted.store(true, Ordering::Relaxed);
        self.error
            .lock()
            .expect("no worker panics holding it")
            .get_or_insert(failure);
    }
}

/// The walk's end of the workers.
pub(super) struct Durable {
    jobs: Option<SyncSender<Job>>,
    /// Keys of directories whose last pending rename finished after the walk left them.
    pub(super) done: Receiver<usize>,
    shared: Arc<Shared>,
}

impl Durable {
    /// Starts the workers in `scope`; they end once the `Durable` is dropped and the
    /// queue is drained.
    pub(super) fn start<'s, 'e>(
        scope: &'s std::thread::Scope<'s, 'e>,
        journal: Option<&'e Journal>,
        deletions: Option<&'e Mutex<dyn DiskDeletions + Send>>,
    ) -> Self {
        let (queue_len, batch) = sizes();
        let (jobs, queue) = mpsc::sync_channel(queue_len);
        let (done_tx, done) = mpsc::channel();
        let queue = Arc::new(Mutex::new(queue));
        let shared = Arc::new(Shared::default());
        for _ in 0..WORKERS {
            let (queue, done_tx, shared) = (Arc::clone(&queue), done_tx.clone(), Arc::clone(&shared));
            scope.spawn(move || work(&queue, batch, &done_tx, &shared, journal, deletions));
        }
        Durable {
            jobs: Some(jobs),
            done,
            shared,
        }
    }

    pub(super) fn submit(&self, job: Job) {
        if let Job::Rename(r) = &job {
            r.dir.renames.lock().expect("no worker panics holding it").pending += 1;
        }
        let mut o = self
            .shared
            .outstanding
            .lock()
            .expect("no thread panics holding it");
        o.jobs += 1;
        drop(o);
        self.jobs
            .as_ref()
            .expect("jobs are submitted before the end")
            .send(job)
            .expect("the workers live as long as the queue");
    }

    /// Waits until every job submitted so far is done, failed or not: each file
    /// queued is durable in place (or was left), each directory queued `fsync`ed.
    /// False if a worker panicked: its jobs are never done, and it returns then.
    pub(super) fn drain(&self) -> bool {
        let mut o = self
            .shared
            .outstanding
            .lock()
            .expect("no thread panics holding it");
        while o.jobs > 0 && !o.worker_died {
            o = self.shared.idle.wait(o).expect("no thread panics holding it");
        }
        !o.worker_died
    }

    /// The data bytes the workers copied since the last call.
    pub(super) fn take_bytes_written(&self) -> u64 {
        self.shared.bytes_written.swap(0, Ordering::Relaxed)
    }

    /// The first error a worker ran into, if any: the walk stops with it. The workers
    /// go on only cleaning up.
    pub(super) fn failed(&self) -> Option<CopyError> {
        if !self.shared.aborted.load(Ordering::Relaxed) {
            return None;
        }
        self.shared
            .error
            .lock()
            .expect("no worker panics holding it")
            .take()
    }

    /// Lets the workers finish the queue and end; returns the first error, else what
    /// they put in place. After an error (the walk's, or one it got from
    /// [`Self::failed`]), the jobs queued are still done, each as it would have been.
    pub(super) fn finish(mut self, error: Option<CopyError>) -> Result<Finished, CopyError> {
        if let Some(error) = error {
            self.shared.fail(error);
        }
        self.jobs = None;
        // The workers hold the other ends of `done`: it disconnects when all ended.
        while self.done.recv().is_ok() {}
        match self.shared.error.lock().expect("the workers ended").take() {
            Some(error) => Err(error),
            None => Ok(Finished {
                not_placed: self.shared.not_placed.load(Ordering::Relaxed),
                bytes_written: self.take_bytes_written(),
                placed: std::mem::take(&mut *self.shared.placed.lock().expect("the workers ended")),
                kept: std::mem::take(&mut *self.shared.kept.lock().expect("the workers ended")),
            }),
        }
    }
}

/// What the workers did, once all ended without an error.
pub(super) struct Finished {
    /// `noreplace` renames that found their name taken: the temporary was dropped.
    pub(super) not_placed: u64,
    /// Data bytes copied since the walk last took them.
    pub(super) bytes_written: u64,
    /// Files put in place, by relative path, as they are there.
    pub(super) placed: Marks,
    /// Files the application replaced or deleted before they could be put in place.
    pub(super) kept: Marks,
}

fn work(
    queue: &Mutex<Receiver<Job>>,
    batch_max: usize,
    done: &Sender<usize>,
    shared: &Shared,
    journal: Option<&Journal>,
    deletions: Option<&Mutex<dyn DiskDeletions + Send>>,
) {
    let _alive = Alive(shared);
    // Each worker's own: temporary names never repeat across workers (each seeds
    // its own), and the copy buffers are not shared.
    let mut temps = TempNames::new();
    let mut transfer = Transfer::default();
    let mut batch = Vec::with_capacity(batch_max);
    // The destination's filesystem, and whether a syncfs and direct writes suit it:
    // one per pass.
    let mut suits: Option<(u64, (bool, bool))> = None;
    loop {
        {
            let queue = queue.lock().expect("no worker panics holding it");
            let Ok(job) = queue.recv() else { return };
            batch.push(job);
            while batch.len() < batch_max {
                let Ok(job) = queue.try_recv() else { break };
                batch.push(job);
            }
        }
        while !batch.is_empty() {
            // All the batch's files are written before the first is made durable:
            // their writeback (and, on a journaling filesystem, their block
            // allocations) is under way by then, so the first fsync commits them all
            // together and the others find their part already done. A copy that
            // replaces a file holds the disk space of both until it is put in place,
            // so a run holds at most its share of the room left (half of it, split
            // among the workers): on a nearly full disk the files go one at a time,
            // as a pass that rewrites them needs.
            let share = room_left(&batch) / (2 * WORKERS as u64);
            let errors_from_now = error_watch(&batch);
            let (syncfs_suit, direct_suit) = errors_from_now.as_ref().map_or((false, false), |fs| {
                let dev = stat::fstat(fs).map_or(0, |st| st.st_dev);
                match suits {
                    Some((d, yes)) if d == dev => yes,
                    _ => {
                        let yes = (syncfs_suits(fs.as_fd()), direct_writes_suit(fs.as_fd()));
                        suits.insert((dev, yes)).1
                    }
                }
            });
            transfer.direct_writes = direct_suit;
            let mut held = 0u64;
            let mut written = Vec::with_capacity(batch.len());
            for job in &mut batch {
                let w = match job {
                    Job::Rename(r) => {
                        let size = u64::try_from(r.stat.st_size).unwrap_or(u64::MAX);
                        if held > 0 && held.saturating_add(size) > share {
                            break;
                        }
                        held = held.saturating_add(size);
                        Some(write_temp(r, &mut temps, &mut transfer, shared))
                    }
                    _ => None,
                };
                written.push(w);
            }
            let n = written.len();
            let files = written.iter().filter(|w| matches!(w, Some(Ok(_)))).count();
            let synced =
                errors_from_now.is_some_and(|fs| syncfs_suit && sync_together(fs.as_fd(), files, held));
            // A job queued before another failed is still done: a failed pass still
            // makes the removals it decided once these are (see
            // `Syncer::remove_deferred`), and one may be of a disk name whose data the
            // RAM moved to this one (a file renamed across directories).
            for (job, written) in batch.drain(..n).zip(written) {
                let failure = match job {
                    Job::Rename(r) => place(
                        *r,
                        written.expect("written above"),
                        synced,
                        done,
                        shared,
                        journal,
                        deletions,
                    ),
                    Job::FsyncDir { dir, rel } => unistd::fsync(dir.fd.as_fd())
                        .map_err(dst_err("fsync directory"))
                        .err()
                        .map(|f| f.at(rel)),
                    Job::FsyncFile { file, rel } => unistd::fsync(&file)
                        .map_err(dst_err("fsync"))
                        .err()
                        .map(|f| f.at(rel)),
                };
                if let Some(failure) = failure {
                    shared.fail(failure);
                }
                shared.job_done();
            }
        }
    }
}

/// Makes a written temporary durable and puts it in place, or removes it; tells the
/// walk when the directory's last pending rename is done.
fn place(
    r: Rename,
    written: Result<Written, Failed>,
    synced: bool,
    done: &Sender<usize>,
    shared: &Shared,
    journal: Option<&Journal>,
    deletions: Option<&Mutex<dyn DiskDeletions + Send>>,
) -> Option<CopyError> {
    let (written, result) = match written {
        Ok(w) => {
            let result = durable_and_place(&r, &w, synced, journal, deletions);
            (Some(w), result)
        }
        Err(f) => (None, Err(f)),
    };
    let result = match (result, &written) {
        (Ok(placed @ (Placed::Taken | Placed::Deleted)), Some(_)) => keep_theirs(&r, placed, shared, journal),
        (other, _) => other,
    };
    let result = match (result, &written) {
        (Ok(Placed::Yes), Some(w)) => note_placed(&r, &w.file, shared, journal),
        (Ok(_), _) => Ok(false),
        (Err(f), _) => Err(f),
    };
    let Rename { dir, rel, .. } = r;
    if let Some(Written { file, temp }) = written {
        if !matches!(result, Ok(true)) {
            // Best effort: the next sync removes what is left.
            let _ = unistd::unlinkat(dir.fd.as_fd(), temp.as_c_str(), UnlinkatFlags::NoRemoveDir);
        }
        drop(file);
    }
    let mut renames = dir.renames.lock().expect("no worker panics holding it");
    renames.pending -= 1;
    if renames.pending == 0 && renames.left {
        // The walk may already be gone after an error; nobody to tell then.
        let _ = done.send(dir.key());
    }
    result.err().map(|f| f.at(rel))
}

/// Data waiting to be written on the whole host (`Dirty` plus `Writeback`), beyond
/// what the workers' own runs may hold, up to which a run of temporaries is made
/// durable by one `syncfs`: it writes out everything dirty on their filesystem, the
/// application's and other programs' too, and waits for it.
const SYNCFS_OTHERS_MAX: u64 = 64 << 20;

/// Makes a run of `files` written temporaries (`bytes` of data) on the filesystem of
/// `fs` (see [`error_watch`]; one [`syncfs_suits`]) durable together, by one
/// `syncfs(2)` (their data, their inodes, the device's cache), where that costs less
/// than an `fsync` each: a run of two or more, little else waiting to be written
/// ([`SYNCFS_OTHERS_MAX`], beyond every worker's run of this size), and a kernel whose
/// `syncfs` reports every error of the filesystem's writeback and of its own commit
/// (5.17 and later; from 5.8 it reported the writeback's only). False if it did not:
/// each is then `fsync`ed, which also tells which of them an error (the `syncfs`'s,
/// which may be another file's) is of.
///
/// Each `fsync` writes the file's inode and flushes the device's cache on its own;
/// one `syncfs` does both once for the run. Measured with 20,000 files written into
/// an empty directory and 1% of 100,000 rewritten (docs/benchmarks.md).
fn sync_together(fs: BorrowedFd<'_>, files: usize, bytes: u64) -> bool {
    let ours = bytes.saturating_mul(WORKERS as u64);
    files >= 2
        && syncfs_reports_errors()
        && crate::host::meminfo::unwritten_now().is_some_and(|u| u <= SYNCFS_OTHERS_MAX.saturating_add(ours))
        && unistd::syncfs(fs).is_ok()
}

/// Whether a `syncfs` of the filesystem of `fs` does what an `fsync` of each of its
/// files would (writes them, flushes the device's cache, reports what failed): on
/// ext4, xfs and btrfs, as their own drivers mount them. Not on overlayfs, whose
/// `syncfs` reports its own errors only, not those of the upper layer's files; nor on
/// FUSE, which may not pass it on, or on ext2, vfat and exfat, which flush no cache.
fn syncfs_suits(fs: BorrowedFd<'_>) -> bool {
    let Some(id) = crate::host::procs::mount_id(fs) else {
        return false;
    };
    crate::host::mountinfo::MountTable::read(std::path::Path::new("/proc/thread-self/mountinfo"))
        .ok()
        .and_then(|t| t.entries.into_iter().find(|e| e.id == id))
        .is_some_and(|e| matches!(e.fstype.as_str(), "ext4" | "xfs" | "btrfs"))
}

/// Linux 5.17 or later: `syncfs(2)` returns the writeback errors of the filesystem
/// since the descriptor was opened (5.8) and those of the filesystem's own sync,
/// such as a failed journal commit (5.17).
fn syncfs_reports_errors() -> bool {
    static AT_LEAST: OnceLock<bool> = OnceLock::new();
    *AT_LEAST.get_or_init(|| {
        nix::sys::utsname::uname()
            .ok()
            .and_then(|u| kernel_release(&u.release().to_string_lossy()))
            .is_some_and(|v| v >= (5, 17))
    })
}

/// The major and minor version in a kernel release string (`6.1.0-18-amd64`).
fn kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-']);
    let number = |part: &str| {
        let digits = part.find(|c: char| !c.is_ascii_digit()).unwrap_or(part.len());
        part[..digits].parse().ok()
    };
    Some((number(parts.next()?)?, number(parts.next()?)?))
}

/// A descriptor of its own for the filesystem the batch's first copy goes to, opened
/// before the batch is written: a `syncfs` through it reports every writeback error
/// on that filesystem since, and only to this worker (an error reported through a
/// descriptor is not reported through it again, and the walk's descriptors are
/// shared among the workers).
fn error_watch(batch: &[Job]) -> Option<OwnedFd> {
    let dir = batch.iter().find_map(|j| match j {
        Job::Rename(r) => Some(r.dir.fd.as_fd()),
        _ => None,
    })?;
    nix::fcntl::openat(
        dir,
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        stat::Mode::empty(),
    )
    .ok()
}

/// Bytes free on the disk the batch's first copy goes to; none if it cannot tell (the
/// files then go one at a time).
fn room_left(batch: &[Job]) -> u64 {
    let Some(Job::Rename(r)) = batch.first() else {
        return 0;
    };
    fstatvfs(r.dir.fd.as_fd()).map_or(0, |v| v.blocks_available().saturating_mul(v.fragment_size()))
}

/// A temporary with a file's data and metadata, not yet durable.
struct Written {
    file: File,
    temp: CString,
}

/// Copies the RAM file into a new temporary beside its final name.
fn write_temp(
    r: &mut Rename,
    temps: &mut TempNames,
    transfer: &mut Transfer,
    shared: &Shared,
) -> Result<Written, Failed> {
    let src = r.src.take().expect("each job is written once");
    let (mut temp, file) = create_temp_file(temps, r.dir.fd.as_fd())?;
    transfer.copy_data(&src, &file, &r.stat, &mut |n| {
        shared.bytes_written.fetch_add(n, Ordering::Relaxed);
    })?;
    transfer.set_metadata(src.as_fd(), file.as_fd(), &r.stat, true)?;
    start_writeback(&file);
    // The caller removes it from here on, unless it is put in place.
    temp.live = false;
    Ok(Written {
        file,
        temp: std::mem::take(&mut temp.name),
    })
}

/// Starts writing the file's data to the disk without waiting, so that its `fsync`,
/// later, finds it done or under way. Only a hint: a failure is left to the `fsync`.
fn start_writeback(file: &File) {
    // SAFETY: sync_file_range(2) takes a descriptor, borrowed for the call, and plain
    // integers; it touches no memory of ours.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// `fsync`s the temporary, unless its run was `synced` together, and puts it in place
/// as the walk asked.
fn durable_and_place(
    r: &Rename,
    w: &Written,
    synced: bool,
    journal: Option<&Journal>,
    deletions: Option<&Mutex<dyn DiskDeletions + Send>>,
) -> Result<Placed, Failed> {
    if !synced {
        unistd::fsync(&w.file).map_err(dst_err("fsync"))?;
    }
    // Noted before the rename: a crash right after it leaves a name the next pass
    // must know was ours.
    if let Some(j) = journal {
        let st = stat::fstat(&w.file).map_err(dst_err("stat"))?;
        let key = r.rel.as_os_str().as_bytes();
        j.note(key, &Mark::Placing(Sig::of(&st))).map_err(journal_err)?;
    }
    let (at, temp, name) = (r.dir.fd.as_fd(), w.temp.as_c_str(), r.name.as_c_str());
    // A free name the application created and deleted again since the walk looked:
    // its deletion is the newer change.
    if matches!(r.place, Place::Free) && deletions.is_some_and(|dl| r.dir.deleted(dl, name).is_some()) {
        tracing::debug!(
            "write-back: {}: deleted on disk meanwhile, not put in place",
            r.rel.display()
        );
        return Ok(Placed::Deleted);
    }
    let placed = put_in_place(at, temp, name, r.place).map_err(dst_err("rename into place"))?;
    if placed == Placed::Yes
        && matches!(r.place, Place::Free)
        && deletions.is_some_and(|dl| r.dir.deleted(dl, name).is_some())
    {
        // Deleted between the look above and the rename (the worker may be preempted
        // there): the name was free only through that deletion, the later change. The
        // copy goes again unless the application changed it since it appeared.
        let ours = stat::fstat(&w.file).map_err(dst_err("stat"))?;
        if remove_seen(at, name, Seen::of(&ours), temp).map_err(dst_err("take out again"))? {
            tracing::debug!(
                "write-back: {}: deleted on disk as it was put in place, taken out again",
                r.rel.display()
            );
            return Ok(Placed::Deleted);
        }
    }
    if placed != Placed::Yes {
        tracing::debug!("write-back: {}: not put in place: {placed:?}", r.rel.display());
    }
    Ok(placed)
}

/// The application's newer entry (or deletion) won over the temporary: remembered, so
/// the RAM's version does not come back later.
fn keep_theirs(
    r: &Rename,
    placed: Placed,
    shared: &Shared,
    journal: Option<&Journal>,
) -> Result<Placed, Failed> {
    shared.not_placed.fetch_add(1, Ordering::Relaxed);
    let mark = match placed {
        Placed::Deleted => Some(Mark::Deleted(now_coarse())),
        _ => stat::fstatat(r.dir.fd.as_fd(), r.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()
            .filter(|st| st.st_mode & libc::S_IFMT != libc::S_IFDIR)
            .map(|st| Mark::DiskWon(Sig::of(&st))),
    };
    let key = r.rel.as_os_str().as_bytes();
    let noted = match (&mark, journal) {
        (Some(m), Some(j)) => j.note(key, m).map_err(journal_err),
        _ => Ok(()),
    };
    if let Some(m) = mark {
        shared
            .kept
            .lock()
            .expect("no worker panics holding it")
            .insert(key, m);
    }
    noted.map(|()| placed)
}

/// Records a temporary put in place, as it is there (the rename changed its ctime).
fn note_placed(r: &Rename, file: &File, shared: &Shared, journal: Option<&Journal>) -> Result<bool, Failed> {
    let st = stat::fstat(file).map_err(dst_err("stat"))?;
    let (key, sig) = (r.rel.as_os_str().as_bytes(), Sig::of(&st));
    if let Some(j) = journal {
        j.note(key, &Mark::Entry(sig)).map_err(journal_err)?;
    }
    shared
        .placed
        .lock()
        .expect("no worker panics holding it")
        .insert(key, Mark::Entry(sig));
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::kernel_release;

    #[test]
    fn kernel_release_takes_major_and_minor() {
        assert_eq!(kernel_release("6.18.44-fc-v1045"), Some((6, 18)));
        assert_eq!(kernel_release("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(kernel_release("5.8"), Some((5, 8)));
        assert_eq!(kernel_release("5.7rc2"), Some((5, 7)));
        assert_eq!(kernel_release("4.19.0+"), Some((4, 19)));
        assert_eq!(kernel_release("x.y"), None);
        assert_eq!(kernel_release("6"), None);
    }
}
