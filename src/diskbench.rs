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
//!
//! With `--backend zram` DIR's own files are the data instead, copied into a
//! tmpfs and into a zram device (diskbench/backends.rs; DIR is only read).
//!
//! Here: the command line, its checks and the run; diskbench/room.rs: the
//! preconditions; diskbench/private.rs: the namespace, work directory and
//! tmpfs; diskbench/rows.rs: the rows, each run on both sides;
//! diskbench/measure.rs: one measurement; diskbench/report.rs: the report
//! and its human form; src/signals.rs: interrupts.

mod backends;
mod measure;
mod private;
mod report;
mod room;
mod rows;
#[cfg(test)]
mod tests;

use std::fs;
use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::error::ExitCode;
use crate::host::Host;
use crate::out::{self, escape};
use crate::spec::size::{parse_size, SizeLit};

use crate::signals::{Interrupted, SignalGuard};
use crate::state::State;
pub use measure::Scatter;
pub use report::{filesystem_of, fmt_sig, human, BenchReport, FsInfo, HostInfo, Row, Side};
pub use room::{refusals, small_counts, HostRoom};

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
    /// tmpfs: DIR's disk against a tmpfs. zram: DIR's own files (up to --size,
    /// only read) in a tmpfs against a zram device: data per byte of RAM, write
    /// and read throughput.
    #[arg(long, default_value = "tmpfs", value_parser = ["tmpfs", "zram"])]
    pub backend: String,
    /// The zram device's algorithm (--backend zram; unset: the kernel's default).
    #[arg(long, value_parser = crate::spec::ZRAM_COMPRESSIONS)]
    pub compression: Option<String>,
    /// The filesystem on the zram device (--backend zram), as `fs:` in a spec.
    #[arg(long, value_parser = crate::spec::ZramFs::ALL.map(|(n, _)| n))]
    pub fs: Option<String>,
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

/// What the benchmark thread measures and how: the arguments resolved (DIR
/// canonical, the cap a duration), the tmpfs's size and whether to show
/// progress.
struct BenchSettings {
    dir: PathBuf,
    size: u64,
    cap: Duration,
    runs: u32,
    tmpfs_size: u64,
    progress: bool,
}

impl BenchSettings {
    /// A progress line on a terminal, as each measurement starts.
    fn say(&self, what: &str) {
        if self.progress {
            out::eprint(&format!("measuring {what} …\n"));
        }
    }
}

/// Runs `tmpfsctl bench`; returns the exit status. `state` records the zram
/// device of `--backend zram` while it exists.
pub fn run(args: &BenchArgs, json: bool, state: &State) -> Result<ExitCode> {
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
    if args.backend == "zram" {
        return run_backends(args, json, dir, &host, state);
    }
    if let Some(flag) = [
        ("--compression", args.compression.is_some()),
        ("--fs", args.fs.is_some()),
    ]
    .iter()
    .find_map(|(f, set)| set.then_some(f))
    {
        out::eprint(&format!("error: {flag} is for --backend zram\n"));
        return Ok(ExitCode::BadInput);
    }
    let room = room::host_room(&dir, &host)?;
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
    let settings = BenchSettings {
        dir: dir.clone(),
        size: args.size,
        cap: Duration::from_secs_f64(args.time_cap),
        runs: args.runs,
        tmpfs_size: 2 * args.size + DISK_MARGIN,
        progress: !json && io::stderr().is_terminal(),
    };

    let started = Instant::now();
    let (rows, notes) = match guarded(
        move || private::bench(&settings),
        "the temporary files and tmpfs were removed",
        "the temporary tmpfs went with its namespace",
    )? {
        Some(x) => x,
        None => return Ok(ExitCode::Interrupted),
    };

    let report = BenchReport {
        disk_dir: dir.display().to_string(),
        filesystem: report::filesystem_of(&dir, &host),
        size: args.size,
        time_cap_seconds: args.time_cap,
        runs: args.runs,
        small_files: n_nosync,
        small_files_fsync: n_fsync,
        host: HostInfo::now(&mem),
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

/// `--backend zram`: DIR's own files in a tmpfs and in a zram device.
fn run_backends(args: &BenchArgs, json: bool, dir: PathBuf, host: &Host, state: &State) -> Result<ExitCode> {
    let sample = backends::sample(&dir, args.size)?;
    let mem = host.meminfo()?;
    let why = backends::refusals(
        &dir,
        &sample,
        mem.mem_available,
        std::path::Path::new("/sys/class/zram-control").exists(),
    );
    if !why.is_empty() {
        for w in &why {
            out::eprint(&format!("error: {}\n", escape(w)));
        }
        out::eprint("nothing was copied; no tmpfs was mounted and no zram device made\n");
        return Ok(ExitCode::BadInput);
    }
    let settings = backends::Settings {
        dir: dir.clone(),
        sample: sample.clone(),
        runs: args.runs,
        compression: args.compression.clone(),
        fs: crate::spec::ZramFs::ALL
            .into_iter()
            .find(|(n, _)| Some(*n) == args.fs.as_deref())
            .map_or_else(Default::default, |(_, fs)| fs),
        state: state.clone(),
        progress: !json && io::stderr().is_terminal(),
    };
    let started = Instant::now();
    let (rows, zram) = match guarded(
        move || backends::bench(&settings),
        "the copies, the tmpfs and the zram device were removed",
        "the mounts went with its namespace, and the zram device is removed by the next `apply` or `down`",
    )? {
        Some(x) => x,
        None => return Ok(ExitCode::Interrupted),
    };
    let mut report = backends::BackendReport {
        data_dir: dir.display().to_string(),
        backend: "zram",
        files: sample.files.len() as u64,
        bytes: sample.bytes,
        runs: args.runs,
        zram,
        host: HostInfo::now(&mem),
        rows,
        notes: Vec::new(),
        seconds: started.elapsed().as_secs_f64(),
    };
    report.notes = backends::notes(&report);
    if json {
        let mut text = serde_json::to_string_pretty(&report).expect("reports serialise to JSON");
        text.push('\n');
        out::print(&text);
    } else {
        out::print(&backends::human(&report));
    }
    Ok(ExitCode::Ok)
}

/// Runs `bench` on a thread of its own while SIGINT, SIGTERM and SIGHUP only ask it
/// to stop, so that it removes what it made first: `None` when it was interrupted.
/// `removed` and `left` say what became of what it made, after a failure and after
/// a panic.
fn guarded<T: Send + 'static>(
    bench: impl FnOnce() -> Result<T> + Send + 'static,
    removed: &str,
    left: &str,
) -> Result<Option<T>> {
    let signals = SignalGuard::install()?;
    let joined = std::thread::Builder::new()
        .name("tmpfsctl-bench".into())
        .spawn(bench)
        .context("starting the benchmark thread")?
        .join();
    drop(signals);
    match joined {
        Ok(Ok(x)) => Ok(Some(x)),
        Ok(Err(e)) if e.is::<Interrupted>() => {
            out::eprint(&format!("interrupted; {removed}\n"));
            Ok(None)
        }
        Ok(Err(e)) => Err(e.context(format!("benchmark failed; {removed}"))),
        Err(_) => bail!("the benchmark thread panicked; {left}"),
    }
}
