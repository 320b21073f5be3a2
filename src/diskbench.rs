//! `tmpfsctl bench --disk DIR`: evidence for the offload decision, measured
//! on the operator's own host — the disk directory against a temporary
//! private tmpfs, side by side, with the tmpfs/disk ratio for every row.
//!
//! Safety:
//! - everything happens in a dedicated thread that first enters a new mount
//!   namespace (`unshare(CLONE_NEWNS)`, `/` made `MS_REC|MS_PRIVATE`) and
//!   only then mounts the tmpfs: the host's mount table never sees it, and if
//!   the process dies the namespace, and the tmpfs with it, goes too;
//! - files live in one fresh subdirectory of DIR (`.tmpfsctl-bench-*`, mode
//!   0700) that is removed at the end, on errors and on SIGINT/SIGTERM/SIGHUP
//!   (the measurement in progress stops, cleanup runs, exit status 130);
//!   only SIGKILL or a power cut leaves that directory behind (never a mount);
//! - refused up front (exit status 2, nothing written) when DIR is on tmpfs
//!   or ramfs, when DIR's filesystem lacks 2 × --size + 64MiB (statvfs) or
//!   the inodes for the small-file test, or when MemAvailable lacks
//!   2 × --size + 256MiB for the tmpfs;
//! - every measurement stops at `--time-cap` seconds (default 3) and reports
//!   the rate over what it did; with the defaults a run takes well under a
//!   minute on an ordinary disk (the fdatasync that ends a "durable" write
//!   row is not capped: it flushes what was written within the cap).
//!
//! Figures: "buffered" = write(2) loop + close; "durable" = the same +
//! fdatasync. "Cold" reads come after fdatasync + POSIX_FADV_DONTNEED on that
//! one file (never the global drop_caches); on tmpfs cold is the same as
//! warm, since its pages are the cache.

use std::fs::{self, File};
use std::io::{self, IsTerminal, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::statfs::{statfs, TMPFS_MAGIC};
use nix::sys::statvfs::statvfs;
use serde::Serialize;

use crate::error::ExitCode;
use crate::host::Host;
use crate::out::{self, escape};
use crate::spec::size::{format_bytes, parse_size, SizeLit};

/// Request sizes of the sequential write sweep.
pub const REQUEST_SIZES: [u64; 4] = [512, 4096, 64 << 10, 1 << 20];
/// Small-file test: file size and the most files created without / with fsync.
pub const SMALL_FILE: usize = 4096;
pub const SMALL_FILES_NOSYNC: u64 = 20_000;
pub const SMALL_FILES_FSYNC: u64 = 2_000;
/// Free space DIR must have beyond 2 × --size.
pub const DISK_MARGIN: u64 = 64 << 20;
/// MemAvailable that must remain beyond 2 × --size.
pub const RAM_MARGIN: u64 = 256 << 20;

const READ_CHUNK: usize = 1 << 20;
/// statfs f_type of ramfs (linux/magic.h); nix has no constant for it.
const RAMFS_MAGIC: u64 = 0x8584_58f6;
const PAGE: u64 = 4096;

/// `tmpfsctl bench --disk DIR`
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Directory on the disk to measure (a temporary subdirectory is used and removed).
    #[arg(long, value_name = "DIR")]
    pub disk: PathBuf,
    /// Data per measurement: the sequential files' size (at least 1MiB; rounded down to whole MiB).
    #[arg(long, default_value = "256MiB", value_parser = parse_bench_size)]
    pub size: u64,
    /// Seconds after which each measurement stops and reports what it did.
    #[arg(long, default_value_t = 3.0, value_name = "SECONDS", value_parser = parse_cap)]
    pub time_cap: f64,
    /// Runs of every measurement (disk and tmpfs alternating); the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub runs: u32,
}

fn parse_bench_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        SizeLit::Percent(_) => Err("give the size in bytes (e.g. 256MiB), not a percentage".into()),
        SizeLit::Bytes(b) if b < 1 << 20 => Err("at least 1MiB".into()),
        SizeLit::Bytes(b) => Ok(b & !((1 << 20) - 1)),
    }
}

fn parse_cap(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 600.0 => Ok(v),
        _ => Err("a number of seconds above 0 and at most 600".into()),
    }
}

/// One side (disk or tmpfs) of a row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Side {
    /// The row's figure, in the row's unit: the median run's.
    pub value: f64,
    /// Every run's figure, in the order measured.
    pub runs: Vec<f64>,
    /// Operations timed in the median run (writes, files, reads).
    pub ops: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// Mean time per operation.
    pub latency_us: f64,
    /// Stopped at the time cap: the figure is over `ops`, not the full amount.
    pub capped: bool,
    /// Cold reads: how much of the file was still cached when they started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_before_pct: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub id: String,
    pub name: String,
    /// `MiB/s`, `files/s` or `reads/s`: higher is better in every row.
    pub unit: &'static str,
    pub disk: Side,
    pub tmpfs: Side,
    /// tmpfs / disk: the speedup the offload brings for this operation.
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FsInfo {
    pub fstype: String,
    pub source: String,
    pub mount_point: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostInfo {
    pub cpus: usize,
    pub mem_total: u64,
    pub mem_available: u64,
    pub kernel: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    pub disk_dir: String,
    pub filesystem: Option<FsInfo>,
    pub size: u64,
    pub time_cap_seconds: f64,
    pub runs: u32,
    pub small_files: u64,
    pub small_files_fsync: u64,
    pub host: HostInfo,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    pub seconds: f64,
}

// ---------------------------------------------------------------- signals

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

const SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// While alive, SIGINT/SIGTERM/SIGHUP only set a flag the loops check, so
/// cleanup runs; the previous dispositions come back on drop.
struct SignalGuard(Vec<(Signal, SigAction)>);

impl SignalGuard {
    fn install() -> Result<SignalGuard> {
        INTERRUPTED.store(false, Ordering::SeqCst);
        let act = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        let mut old = Vec::new();
        for s in SIGNALS {
            // SAFETY: the handler only stores to an atomic (async-signal-safe).
            let prev = unsafe { sigaction(s, &act) }.with_context(|| format!("installing a {s} handler"))?;
            old.push((s, prev));
        }
        Ok(SignalGuard(old))
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (s, prev) in &self.0 {
            // SAFETY: restores the disposition that was there before.
            let _ = unsafe { sigaction(*s, prev) };
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
struct Interrupted;

fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err(Interrupted.into());
    }
    Ok(())
}

// ---------------------------------------------------------------- preconditions

/// What the preconditions look at; gathered from the host, judged purely.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRoom {
    pub on_tmpfs: Option<&'static str>,
    pub disk_free: u64,
    /// Free inodes; `None` when the filesystem does not report them.
    pub disk_inodes_free: Option<u64>,
    pub mem_available: u64,
}

/// Every reason to refuse, each a full sentence; empty when the run may go.
pub fn refusals(dir: &Path, size: u64, room: &HostRoom) -> Vec<String> {
    let mut why = Vec::new();
    let d = dir.display();
    if let Some(fs) = room.on_tmpfs {
        why.push(format!(
            "{d} is on {fs}: that would compare tmpfs with tmpfs; give --disk a directory on the disk \
             the cache lives on now (e.g. /var/tmp or the cache's parent)"
        ));
    }
    let need_disk = 2 * size + DISK_MARGIN;
    if room.disk_free < need_disk {
        why.push(format!(
            "{d} has {} free; the benchmark needs {} there (2 × --size {} + {} margin); \
             use a smaller --size or another directory",
            format_bytes(room.disk_free),
            format_bytes(need_disk),
            format_bytes(size),
            format_bytes(DISK_MARGIN)
        ));
    }
    let need_inodes = small_counts(size).0 + 1000;
    if let Some(free) = room.disk_inodes_free {
        if free < need_inodes {
            why.push(format!(
                "{d} has {free} free inodes; the small-file test needs {need_inodes}"
            ));
        }
    }
    let need_ram = 2 * size + RAM_MARGIN;
    if room.mem_available < need_ram {
        why.push(format!(
            "MemAvailable is {}; the temporary tmpfs needs {} (2 × --size {} + {} margin); use a smaller --size",
            format_bytes(room.mem_available),
            format_bytes(need_ram),
            format_bytes(size),
            format_bytes(RAM_MARGIN)
        ));
    }
    why
}

/// Small files created (without fsync, with fsync): bounded by the counts
/// above and by --size, so their data never exceeds --size.
pub fn small_counts(size: u64) -> (u64, u64) {
    let by_size = size / SMALL_FILE as u64;
    (SMALL_FILES_NOSYNC.min(by_size), SMALL_FILES_FSYNC.min(by_size))
}

fn host_room(dir: &Path, host: &Host) -> Result<HostRoom> {
    let sf = statfs(dir).with_context(|| format!("statfs {}", dir.display()))?;
    let on_tmpfs = match sf.filesystem_type() {
        t if t == TMPFS_MAGIC => Some("tmpfs"),
        t if (t.0 as u64) & 0xffff_ffff == RAMFS_MAGIC => Some("ramfs"),
        _ => None,
    };
    let vfs = statvfs(dir).with_context(|| format!("statvfs {}", dir.display()))?;
    let files = vfs.files() as u64;
    Ok(HostRoom {
        on_tmpfs,
        disk_free: vfs.blocks_available() as u64 * vfs.fragment_size() as u64,
        disk_inodes_free: (files > 0).then_some(vfs.files_available() as u64),
        mem_available: host.meminfo()?.mem_available,
    })
}

/// The mount DIR lives on, for the report header.
fn filesystem_of(dir: &Path, host: &Host) -> Option<FsInfo> {
    let dev = fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let table = host.mounts().ok()?;
    table
        .entries
        .iter()
        .filter(|e| e.dev == (major, minor) && dir.starts_with(&e.mount_point))
        .max_by_key(|e| e.mount_point.components().count())
        .map(|e| FsInfo {
            fstype: e.fstype.clone(),
            source: e.source.clone(),
            mount_point: e.mount_point.display().to_string(),
        })
}

// ---------------------------------------------------------------- measurements

/// Deterministic filler so no filesystem can special-case zeros.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Visits every index below `n` once in a scattered order, then repeats.
pub struct Scatter {
    n: u64,
    step: u64,
    start: u64,
    i: u64,
}

impl Scatter {
    pub fn new(n: u64, seed: u64) -> Scatter {
        let gcd = |mut a: u64, mut b: u64| {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        };
        // Near n/φ, coprime with n: consecutive reads land far apart.
        let mut step = ((n as f64 * 0.618_033_988_7) as u64).max(1);
        while n > 1 && gcd(step, n) != 1 {
            step += 1;
        }
        Scatter {
            n,
            step,
            start: if n == 0 { 0 } else { seed % n },
            i: 0,
        }
    }
}

impl Iterator for Scatter {
    type Item = u64;
    fn next(&mut self) -> Option<u64> {
        if self.n == 0 {
            return None;
        }
        let v = ((self.start as u128 + self.i as u128 * self.step as u128) % self.n as u128) as u64;
        self.i += 1;
        Some(v)
    }
}

struct Timer {
    start: Instant,
    cap: Duration,
}

impl Timer {
    fn start(cap: Duration) -> Timer {
        Timer {
            start: Instant::now(),
            cap,
        }
    }
    fn over(&self) -> bool {
        self.start.elapsed() >= self.cap
    }
    fn secs(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

fn side(value_per_sec: impl Fn(f64) -> f64, ops: u64, bytes: u64, seconds: f64, capped: bool) -> Side {
    let seconds = seconds.max(1e-9);
    let value = value_per_sec(seconds);
    Side {
        value,
        runs: vec![value],
        ops,
        bytes,
        seconds,
        latency_us: seconds * 1e6 / ops.max(1) as f64,
        capped,
        cached_before_pct: None,
    }
}

fn mib_per_s(bytes: u64) -> impl Fn(f64) -> f64 {
    move |s| bytes as f64 / (1 << 20) as f64 / s
}

fn per_s(ops: u64) -> impl Fn(f64) -> f64 {
    move |s| ops as f64 / s
}

fn create(path: &Path) -> io::Result<File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Sequential write of up to `size` bytes in `req`-byte requests:
/// (buffered = writes + close, durable = that + fdatasync).
fn seq_write(dir: &Path, req: u64, size: u64, cap: Duration) -> Result<(Side, Side)> {
    let path = dir.join(format!("seq-write-{req}"));
    let buf = pattern(req as usize);
    let mut f = create(&path).with_context(|| format!("creating {}", path.display()))?;
    let t = Timer::start(cap);
    let (mut written, mut ops, mut capped) = (0u64, 0u64, false);
    while written < size {
        f.write_all(&buf)
            .with_context(|| format!("writing {}", path.display()))?;
        written += req;
        ops += 1;
        check_interrupt()?;
        if t.over() && written < size {
            capped = true;
            break;
        }
    }
    drop(f);
    let buffered_s = t.secs();
    // fdatasync flushes the inode's dirty pages whichever descriptor asks.
    let f = File::open(&path)?;
    f.sync_data()
        .with_context(|| format!("fdatasync {}", path.display()))?;
    drop(f);
    let durable_s = t.secs();
    fs::remove_file(&path)?;
    Ok((
        side(mib_per_s(written), ops, written, buffered_s, capped),
        side(mib_per_s(written), ops, written, durable_s, capped),
    ))
}

/// Creates up to `count` 4KiB files in a fresh directory, each
/// open(O_CREAT|O_EXCL) + write + [fsync] + close.
fn small_files(dir: &Path, count: u64, fsync: bool, cap: Duration) -> Result<Side> {
    let sub = dir.join(if fsync { "small-fsync" } else { "small" });
    fs::DirBuilder::new().mode(0o700).create(&sub)?;
    let buf = pattern(SMALL_FILE);
    let t = Timer::start(cap);
    let (mut ops, mut capped) = (0u64, false);
    while ops < count {
        let p = sub.join(format!("f{ops:05}"));
        let mut f = create(&p).with_context(|| format!("creating {}", p.display()))?;
        f.write_all(&buf)?;
        if fsync {
            f.sync_all()?;
        }
        drop(f);
        ops += 1;
        check_interrupt()?;
        if t.over() && ops < count {
            capped = true;
            break;
        }
    }
    let secs = t.secs();
    fs::remove_dir_all(&sub)?;
    Ok(side(per_s(ops), ops, ops * SMALL_FILE as u64, secs, capped))
}

/// Writes the file the read rows use (untimed; stops at 10 × the cap).
fn read_file(dir: &Path, size: u64, cap: Duration) -> Result<PathBuf> {
    let path = dir.join("read-data");
    let buf = pattern(READ_CHUNK);
    let mut f = create(&path).with_context(|| format!("creating {}", path.display()))?;
    let t = Timer::start(cap * 10);
    let mut written = 0u64;
    while written < size && (written == 0 || !t.over()) {
        f.write_all(&buf)?;
        written += READ_CHUNK as u64;
        check_interrupt()?;
    }
    f.sync_data()?;
    Ok(path)
}

fn fadvise(f: &File, advice: PosixFadviseAdvice) -> io::Result<()> {
    Ok(posix_fadvise(f, 0, 0, advice)?)
}

/// Drops this one file's clean pages (fdatasync first, so all are clean) and
/// returns how much is still cached. Never the global drop_caches.
fn make_cold(path: &Path, f: &File) -> Result<f64> {
    f.sync_data()?;
    fadvise(f, PosixFadviseAdvice::POSIX_FADV_DONTNEED)?;
    Ok(crate::residency::file_residency(path)?.percent())
}

/// Reads the whole file so every page is cached; returns the cached share.
fn make_warm(path: &Path, f: &File) -> Result<f64> {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut r = f;
    while r.read(&mut buf)? > 0 {
        check_interrupt()?;
    }
    Ok(crate::residency::file_residency(path)?.percent())
}

/// Random 4KiB preads, each page at most once when cold.
fn random_reads(path: &Path, cold: bool, cap: Duration) -> Result<Side> {
    let f = File::open(path)?;
    let pages = f.metadata()?.len() / PAGE;
    let before = if cold {
        make_cold(path, &f)?
    } else {
        make_warm(path, &f)?
    };
    fadvise(&f, PosixFadviseAdvice::POSIX_FADV_RANDOM)?;
    // Warm reads are cheap: go round the file until 200k reads or the cap.
    let count = if cold { pages } else { pages.max(200_000) };
    let mut buf = [0u8; PAGE as usize];
    let mut order = Scatter::new(pages, 0x5eed);
    let t = Timer::start(cap);
    let (mut ops, mut capped) = (0u64, false);
    while ops < count {
        let page = order.next().unwrap_or(0);
        f.read_exact_at(&mut buf, page * PAGE)?;
        ops += 1;
        check_interrupt()?;
        if t.over() && ops < count {
            capped = true;
            break;
        }
    }
    let mut s = side(per_s(ops), ops, ops * PAGE, t.secs(), capped);
    s.cached_before_pct = Some(before);
    Ok(s)
}

/// Sequential read of the whole file in 1MiB requests.
fn seq_read(path: &Path, cold: bool, cap: Duration) -> Result<Side> {
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    let before = if cold {
        make_cold(path, &f)?
    } else {
        make_warm(path, &f)?
    };
    let mut r = File::open(path)?;
    let mut buf = vec![0u8; READ_CHUNK];
    let t = Timer::start(cap);
    let (mut bytes, mut ops, mut capped) = (0u64, 0u64, false);
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
        ops += 1;
        check_interrupt()?;
        if t.over() {
            capped = bytes < len;
            break;
        }
    }
    let mut s = side(mib_per_s(bytes), ops, bytes, t.secs(), capped);
    s.cached_before_pct = Some(before);
    Ok(s)
}

// ---------------------------------------------------------------- the run

/// The temporary subdirectory and the tmpfs in it; removed on drop (also
/// when unwinding or after an interrupt). Lives in the private namespace.
struct Workdir {
    root: PathBuf,
    mounted: Option<PathBuf>,
}

impl Drop for Workdir {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            crate::mount::unmount_or_detach(&m);
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn make_workdir(dir: &Path) -> Result<Workdir> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    for attempt in 0..100u32 {
        let root = dir.join(format!(
            ".tmpfsctl-bench-{}-{:08x}",
            std::process::id(),
            nanos.wrapping_add(attempt)
        ));
        match fs::DirBuilder::new().mode(0o700).create(&root) {
            Ok(()) => return Ok(Workdir { root, mounted: None }),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating a directory in {}", dir.display())),
        }
    }
    bail!("could not create a fresh directory in {}", dir.display())
}

struct Plan {
    dir: PathBuf,
    size: u64,
    cap: Duration,
    runs: u32,
    tmpfs_size: u64,
    progress: bool,
}

/// Runs on the calling thread after moving it into a private mount namespace.
fn bench_private(p: &Plan) -> Result<(Vec<Row>, Vec<String>)> {
    crate::mount::enter_private_namespace()?;
    let mut work = make_workdir(&p.dir)?;
    let disk = work.root.join("disk");
    let tmpfs = work.root.join("tmpfs");
    fs::DirBuilder::new().mode(0o700).create(&disk)?;
    fs::DirBuilder::new().mode(0o700).create(&tmpfs)?;
    crate::mount::mount_scratch_tmpfs("tmpfsctl-bench", &tmpfs, p.tmpfs_size)?;
    work.mounted = Some(tmpfs.clone());
    if statfs(&tmpfs)?.filesystem_type() != TMPFS_MAGIC {
        bail!("{} is not the tmpfs just mounted", tmpfs.display());
    }
    let r = measure_all(p, &disk, &tmpfs);
    drop(work);
    r
}

/// The run with the median figure, carrying every run's figure.
fn median(mut runs: Vec<Side>) -> Side {
    let all: Vec<f64> = runs.iter().map(|s| s.value).collect();
    runs.sort_by(|a, b| a.value.total_cmp(&b.value));
    let mut m = runs.swap_remove(runs.len() / 2);
    m.runs = all;
    m
}

/// Runs `f` on the disk directory and on the tmpfs, alternating, `runs`
/// times; `f` yields one Side per row. Returns (disk, tmpfs) medians per row.
fn repeat(
    runs: u32,
    disk: &Path,
    tmpfs: &Path,
    mut f: impl FnMut(&Path) -> Result<Vec<Side>>,
) -> Result<Vec<(Side, Side)>> {
    let mut d: Vec<Vec<Side>> = Vec::new();
    let mut t: Vec<Vec<Side>> = Vec::new();
    for _ in 0..runs {
        for (dir, acc) in [(disk, &mut d), (tmpfs, &mut t)] {
            for (i, side) in f(dir)?.into_iter().enumerate() {
                if acc.len() <= i {
                    acc.push(Vec::new());
                }
                acc[i].push(side);
            }
        }
    }
    Ok(d.into_iter().map(median).zip(t.into_iter().map(median)).collect())
}

fn row(id: String, name: String, unit: &'static str, (disk, tmpfs): (Side, Side)) -> Row {
    Row {
        id,
        name,
        unit,
        ratio: if disk.value > 0.0 {
            tmpfs.value / disk.value
        } else {
            0.0
        },
        disk,
        tmpfs,
    }
}

fn measure_all(p: &Plan, disk: &Path, tmpfs: &Path) -> Result<(Vec<Row>, Vec<String>)> {
    let mut rows = Vec::new();
    let (cap, runs) = (p.cap, p.runs);
    let say = |what: &str| {
        if p.progress {
            out::eprint(&format!("measuring {what} …\n"));
        }
    };

    for req in REQUEST_SIZES {
        let r = format_bytes(req);
        say(&format!("sequential writes, {r} requests"));
        let mut m = repeat(runs, disk, tmpfs, |dir| {
            let (b, d) = seq_write(dir, req, p.size, cap)?;
            Ok(vec![b, d])
        })?
        .into_iter();
        let (b, d) = (m.next().expect("two rows"), m.next().expect("two rows"));
        rows.push(row(
            format!("seq_write_{req}_buffered"),
            format!("seq write {r} req, buffered"),
            "MiB/s",
            b,
        ));
        rows.push(row(
            format!("seq_write_{req}_durable"),
            format!("seq write {r} req, +fdatasync"),
            "MiB/s",
            d,
        ));
    }

    let (n_nosync, n_fsync) = small_counts(p.size);
    for (fsync, n, id, name) in [
        (false, n_nosync, "small_files", "4KiB files: create+write+close"),
        (true, n_fsync, "small_files_fsync", "4KiB files: ... +fsync each"),
    ] {
        say(name);
        let m = repeat(runs, disk, tmpfs, |dir| {
            Ok(vec![small_files(dir, n, fsync, cap)?])
        })?;
        rows.push(row(id.into(), name.into(), "files/s", m[0].clone()));
    }

    say("reads");
    let dfile = read_file(disk, p.size, cap)?;
    let tfile = read_file(tmpfs, p.size, cap)?;
    let file_in = |dir: &Path| if dir == disk { dfile.clone() } else { tfile.clone() };
    for cold in [true, false] {
        let temp = if cold { "cold" } else { "warm" };
        let m = repeat(runs, disk, tmpfs, |dir| {
            Ok(vec![random_reads(&file_in(dir), cold, cap)?])
        })?;
        rows.push(row(
            format!("rand_read_4k_{temp}"),
            format!("random 4KiB reads, {temp}"),
            "reads/s",
            m[0].clone(),
        ));
    }
    for cold in [true, false] {
        let temp = if cold { "cold" } else { "warm" };
        let m = repeat(runs, disk, tmpfs, |dir| {
            Ok(vec![seq_read(&file_in(dir), cold, cap)?])
        })?;
        rows.push(row(
            format!("seq_read_{temp}"),
            format!("seq read 1MiB req, {temp}"),
            "MiB/s",
            m[0].clone(),
        ));
    }
    fs::remove_file(&dfile)?;
    fs::remove_file(&tfile)?;

    let mut notes = vec![
        "ratio = tmpfs/disk: how many times faster the operation is on tmpfs (every figure: higher is better)"
            .to_string(),
        "buffered = write(2) loop + close; +fdatasync = that plus flushing to the device. On tmpfs \
         fdatasync/fsync return at once: the tmpfs figure is what the application's sync calls cost, \
         not durability (tmpfs contents are lost at reboot)"
            .to_string(),
        "cold = after fdatasync + POSIX_FADV_DONTNEED on that file (not the global drop_caches); on tmpfs \
         cold is the same as warm: its pages are the cache and DONTNEED drops nothing"
            .to_string(),
        format!("small files: {n_nosync} without fsync, {n_fsync} with fsync, in one directory"),
        format!(
            "each figure is the median of {}, disk and tmpfs alternating (all runs are in the JSON); \
             the tmpfs is mounted huge=never, as tmpfsctl mounts by default",
            crate::plural::count(runs, "run", "runs")
        ),
    ];
    for r in &rows {
        if let Some(pct) = r
            .disk
            .cached_before_pct
            .filter(|p| r.id.ends_with("cold") && *p > 5.0)
        {
            notes.push(format!(
                "{}: {pct:.0}% of the disk file was still cached after DONTNEED; the disk figure is optimistic",
                r.name
            ));
        }
    }
    if rows.iter().any(|r| r.disk.capped || r.tmpfs.capped) {
        notes.push(format!(
            "* stopped at the time cap ({:.1}s); the figure is over what was done by then",
            cap.as_secs_f64()
        ));
    }
    Ok((rows, notes))
}

/// Runs `tmpfsctl bench`; returns the exit status.
pub fn run(args: &BenchArgs, json: bool) -> Result<ExitCode> {
    let host = Host::from_env();
    let md = fs::metadata(&args.disk).with_context(|| format!("--disk {}", escape(&args.disk)))?;
    if !md.is_dir() {
        out::eprint(&format!(
            "error: --disk {} is not a directory\n",
            escape(&args.disk)
        ));
        return Ok(ExitCode::BadInput);
    }
    let dir = fs::canonicalize(&args.disk).with_context(|| format!("resolving {}", args.disk.display()))?;
    if !nix::unistd::geteuid().is_root() {
        bail!("`tmpfsctl bench` mounts a private temporary tmpfs and must run as root");
    }
    let room = host_room(&dir, &host)?;
    let why = refusals(&dir, args.size, &room);
    if !why.is_empty() {
        for w in &why {
            out::eprint(&format!("error: {}\n", escape(w)));
        }
        out::eprint("nothing was written; no tmpfs was mounted\n");
        return Ok(ExitCode::BadInput);
    }
    let mem = host.meminfo()?;
    let (n_nosync, n_fsync) = small_counts(args.size);
    let plan = Plan {
        dir: dir.clone(),
        size: args.size,
        cap: Duration::from_secs_f64(args.time_cap),
        runs: args.runs,
        tmpfs_size: 2 * args.size + DISK_MARGIN,
        progress: !json && io::stderr().is_terminal(),
    };

    let started = Instant::now();
    let signals = SignalGuard::install()?;
    let joined = std::thread::Builder::new()
        .name("tmpfsctl-bench".into())
        .spawn(move || bench_private(&plan))
        .context("starting the benchmark thread")?
        .join();
    drop(signals);
    let (rows, notes) = match joined {
        Ok(Ok(x)) => x,
        Ok(Err(e)) if e.is::<Interrupted>() => {
            out::eprint("interrupted; the temporary files and tmpfs were removed\n");
            return Ok(ExitCode::Interrupted);
        }
        Ok(Err(e)) => return Err(e.context("benchmark failed; the temporary files and tmpfs were removed")),
        Err(_) => bail!("the benchmark thread panicked; the temporary tmpfs went with its namespace"),
    };

    let report = BenchReport {
        disk_dir: dir.display().to_string(),
        filesystem: filesystem_of(&dir, &host),
        size: args.size,
        time_cap_seconds: args.time_cap,
        runs: args.runs,
        small_files: n_nosync,
        small_files_fsync: n_fsync,
        host: HostInfo {
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            mem_total: mem.mem_total,
            mem_available: mem.mem_available,
            kernel: nix::sys::utsname::uname()
                .map(|u| u.release().to_string_lossy().into_owned())
                .unwrap_or_default(),
        },
        rows,
        notes,
        seconds: started.elapsed().as_secs_f64(),
    };
    if json {
        let mut text = serde_json::to_string_pretty(&report).expect("reports serialise to JSON");
        text.push('\n');
        out::print(&text);
    } else {
        out::print(&human(&report));
    }
    Ok(ExitCode::Ok)
}

// ---------------------------------------------------------------- output

/// Three significant digits with k/M/G suffixes: `812`, `48.2k`, `1.23M`.
pub fn fmt_sig(v: f64) -> String {
    let (v, suffix) = match v.abs() {
        a if a >= 1e9 => (v / 1e9, "G"),
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e4 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let digits = match v.abs() {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        _ => 2,
    };
    format!("{v:.digits$}{suffix}")
}

fn fmt_side(s: &Side, unit: &str) -> String {
    let (v, unit) = match unit {
        "MiB/s" if s.value >= 1024.0 => (s.value / 1024.0, "GiB/s"),
        _ => (s.value, unit),
    };
    format!("{} {unit}{}", fmt_sig(v), if s.capped { "*" } else { "" })
}

/// The human report: header, aligned table, notes.
pub fn human(r: &BenchReport) -> String {
    let mut out = String::new();
    let fs = r
        .filesystem
        .as_ref()
        .map(|f| format!(" ({} on {})", escape(&f.fstype), escape(&f.source)))
        .unwrap_or_default();
    out.push_str(&format!(
        "disk: {}{fs}  vs  a private temporary tmpfs; --size {}, median of {}, at most {}s each\n",
        escape(&r.disk_dir),
        format_bytes(r.size),
        crate::plural::count(r.runs, "run", "runs"),
        r.time_cap_seconds
    ));
    out.push_str(&format!(
        "host: {} CPUs, {} RAM ({} available), Linux {}; took {:.0}s\n\n",
        r.host.cpus,
        format_bytes(r.host.mem_total),
        format_bytes(r.host.mem_available),
        r.host.kernel,
        r.seconds
    ));
    let cells: Vec<[String; 4]> = r
        .rows
        .iter()
        .map(|row| {
            [
                row.name.clone(),
                fmt_side(&row.disk, row.unit),
                fmt_side(&row.tmpfs, row.unit),
                format!("{}×", fmt_sig(row.ratio)),
            ]
        })
        .collect();
    let head = [
        "MEASUREMENT".to_string(),
        "DISK".into(),
        "TMPFS".into(),
        "TMPFS/DISK".into(),
    ];
    let width = |i: usize| {
        cells
            .iter()
            .chain(std::iter::once(&head))
            .map(|c| c[i].chars().count())
            .max()
            .unwrap_or(0)
    };
    let w = [width(0), width(1), width(2), width(3)];
    for c in std::iter::once(&head).chain(cells.iter()) {
        let pad = |s: &str, n: usize| " ".repeat(n.saturating_sub(s.chars().count()));
        out.push_str(&format!(
            "{}{}  {}{}  {}{}  {}{}\n",
            c[0],
            pad(&c[0], w[0]),
            pad(&c[1], w[1]),
            c[1],
            pad(&c[2], w[2]),
            c[2],
            pad(&c[3], w[3]),
            c[3]
        ));
    }
    if !r.notes.is_empty() {
        out.push('\n');
        for n in &r.notes {
            out.push_str(&format!("- {n}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room() -> HostRoom {
        HostRoom {
            on_tmpfs: None,
            disk_free: 100 << 30,
            disk_inodes_free: Some(1 << 20),
            mem_available: 20 << 30,
        }
    }

    #[test]
    fn sizes_are_whole_mib_and_at_least_one() {
        assert_eq!(parse_bench_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bench_size("1G"), Ok(1 << 30));
        assert_eq!(parse_bench_size("1536k"), Ok(1 << 20));
        assert!(parse_bench_size("512k").unwrap_err().contains("1MiB"));
        assert!(parse_bench_size("10%").unwrap_err().contains("percentage"));
        assert!(parse_bench_size("1GB").unwrap_err().contains("ambiguous"));
        assert!(parse_cap("0").is_err());
        assert_eq!(parse_cap("2.5"), Ok(2.5));
    }

    #[test]
    fn room_enough_means_no_refusal() {
        assert!(refusals(Path::new("/var/tmp"), 256 << 20, &room()).is_empty());
    }

    #[test]
    fn every_refusal_is_reported_at_once() {
        let r = HostRoom {
            on_tmpfs: Some("tmpfs"),
            disk_free: 16 << 20,
            disk_inodes_free: Some(10),
            mem_available: 100 << 20,
        };
        let why = refusals(Path::new("/dev/shm"), 64 << 20, &r);
        assert_eq!(why.len(), 4, "{why:#?}");
        assert!(why[0].contains("/dev/shm is on tmpfs"));
        assert!(why[1].contains("16MiB free") && why[1].contains("needs 192MiB"));
        assert!(why[2].contains("free inodes"));
        assert!(why[3].contains("MemAvailable is 100MiB") && why[3].contains("384MiB"));
    }

    #[test]
    fn inode_check_skipped_when_not_reported() {
        let r = HostRoom {
            disk_inodes_free: None,
            ..room()
        };
        assert!(refusals(Path::new("/x"), 1 << 20, &r).is_empty());
    }

    #[test]
    fn small_file_counts_are_bounded_by_size() {
        assert_eq!(small_counts(256 << 20), (20_000, 2_000));
        assert_eq!(small_counts(8 << 20), (2048, 2000));
        assert_eq!(small_counts(1 << 20), (256, 256));
    }

    #[test]
    fn scatter_visits_each_index_once() {
        for n in [1u64, 2, 7, 64, 2048, 65536, 1000] {
            let mut seen: Vec<u64> = Scatter::new(n, 0x5eed).take(n as usize).collect();
            seen.sort();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
        assert_eq!(Scatter::new(0, 1).next(), None);
        let first: Vec<u64> = Scatter::new(65536, 0).take(3).collect();
        assert!(first[1].abs_diff(first[0]) > 1000, "{first:?}");
    }

    #[test]
    fn median_run_carries_all_runs() {
        let run = |v: f64| side(|_| v, 1, 1, 1.0, false);
        let m = median(vec![run(5.0), run(1.0), run(3.0)]);
        assert_eq!(m.value, 3.0);
        assert_eq!(m.runs, vec![5.0, 1.0, 3.0]);
        assert_eq!(median(vec![run(2.0)]).runs, vec![2.0]);
    }

    #[test]
    fn significant_digits() {
        assert_eq!(fmt_sig(0.5), "0.50");
        assert_eq!(fmt_sig(5.25), "5.25");
        assert_eq!(fmt_sig(812.4), "812");
        assert_eq!(fmt_sig(4321.0), "4321");
        assert_eq!(fmt_sig(48_200.0), "48.2k");
        assert_eq!(fmt_sig(1_234_000.0), "1.23M");
    }

    #[test]
    fn human_table_is_aligned() {
        let s = Side {
            value: 100.0,
            runs: vec![100.0],
            ops: 1,
            bytes: 1,
            seconds: 1.0,
            latency_us: 1.0,
            capped: false,
            cached_before_pct: None,
        };
        let rep = BenchReport {
            disk_dir: "/var/tmp".into(),
            filesystem: None,
            size: 8 << 20,
            time_cap_seconds: 3.0,
            runs: 1,
            small_files: 1,
            small_files_fsync: 1,
            host: HostInfo {
                cpus: 2,
                mem_total: 1 << 30,
                mem_available: 1 << 30,
                kernel: "6.18".into(),
            },
            rows: vec![
                Row {
                    id: "a".into(),
                    name: "short".into(),
                    unit: "MiB/s",
                    disk: s.clone(),
                    tmpfs: Side {
                        value: 2500.0,
                        ..s.clone()
                    },
                    ratio: 25.0,
                },
                Row {
                    id: "b".into(),
                    name: "a longer name".into(),
                    unit: "files/s",
                    disk: Side {
                        capped: true,
                        ..s.clone()
                    },
                    tmpfs: s.clone(),
                    ratio: 1.0,
                },
            ],
            notes: vec![],
            seconds: 1.0,
        };
        let out = human(&rep);
        let table: Vec<&str> = out.lines().skip(3).collect();
        assert_eq!(table.len(), 3, "{out}");
        let widths: Vec<usize> = table.iter().map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|w| *w == widths[0]), "{out}");
        assert!(table[2].contains("100 files/s*"), "{out}");
        assert!(table[1].ends_with("25.0×"), "{out}");
        assert!(table[1].contains("2.44 GiB/s"), "{out}");
    }
}
