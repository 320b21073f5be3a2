//! `tmpfsctl advise DIR`: sizes an offload from the application's own I/O.
//! It watches DIR for `--for` (10 minutes by default) while the application
//! runs, then reports what it measured and a mount entry with a reason for each
//! value. It changes nothing on the host: a fanotify mark (gone with the
//! process), reads of the tree, /proc/diskstats and the page cache (mincore).
//!
//! Here: the command line and the run; advise/watch.rs: the fanotify counts;
//! advise/tree.rs: the tree's size, inodes, file sizes and residency;
//! advise/disk.rs: the block device's writes; advise/recommend.rs: figures to
//! a mount entry (pure); advise/report.rs: the report, its table and its spec.
//!
//! SIGINT, SIGTERM or SIGHUP end the watch early: the report covers what was
//! seen until then, says so (`interrupted`), and the exit status is 0.

mod disk;
mod recommend;
mod report;
mod tree;
mod watch;

use std::fs::{self, File};
use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::error::ExitCode;
use crate::host::Host;
use crate::out::{self, escape};
use crate::signals::{interrupted, SignalGuard};
use crate::spec::size::format_bytes;

pub use recommend::{recommend, Advice, Entry, Figures};
pub use report::{human, spec_yaml, AdviseReport, TreeReport};

const MIN_FOR_MS: u64 = 1_000;
const MAX_FOR_MS: u64 = 86_400_000;
const TICK: Duration = Duration::from_millis(100);
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// `tmpfsctl advise DIR`
#[derive(Debug, Clone, clap::Args)]
pub struct AdviseArgs {
    /// The application's directory, where it is now (on its disk).
    pub dir: PathBuf,
    /// How long to watch, from 1s to 24h, such as 10m or 90s; Ctrl-C ends the
    /// watch early and reports what was seen.
    #[arg(long = "for", default_value = "10m", value_parser = parse_for, value_name = "DURATION")]
    pub watch_for: Duration,
    /// Print the recommended mount entry as a spec that `tmpfsctl validate`
    /// accepts (the reasons as comments), instead of the report.
    #[arg(long, conflicts_with = "format")]
    pub spec: bool,
}

fn parse_for(text: &str) -> Result<Duration, String> {
    match crate::spec::parse_duration_ms(text)? {
        ms @ MIN_FOR_MS..=MAX_FOR_MS => Ok(Duration::from_millis(ms)),
        _ => Err("the watch must last from 1s to 24h".into()),
    }
}

/// Runs `tmpfsctl advise`; returns the exit status.
pub fn run(args: &AdviseArgs, json: bool) -> Result<ExitCode> {
    let host = Host::from_env();
    let md = fs::metadata(&args.dir).with_context(|| format!("reading {}", escape(&args.dir)))?;
    if !md.is_dir() {
        out::eprint(&format!("error: {} is not a directory\n", escape(&args.dir)));
        return Ok(ExitCode::BadInput);
    }
    let dir = fs::canonicalize(&args.dir).with_context(|| format!("resolving {}", args.dir.display()))?;
    let plain = dir.to_str().filter(|t| !t.chars().any(char::is_control));
    if args.spec && plain.is_none() {
        out::eprint(&format!(
            "error: {}: a spec's path is plain UTF-8 text without control characters, and cannot name this directory; rename it, or run without --spec for the report\n",
            escape(&dir)
        ));
        return Ok(ExitCode::BadInput);
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("`tmpfsctl advise` watches a whole filesystem with fanotify and must run as root");
    }
    let mem = host.meminfo()?;
    let filesystem = crate::diskbench::filesystem_of(&dir, &host);
    let diskstats = host.proc_path("diskstats");
    let progress = !json && std::io::stderr().is_terminal();

    let start = tree::scan(&dir, true)?;
    let signals = SignalGuard::install()?;
    let root = File::open(&dir).with_context(|| format!("opening {}", dir.display()))?;
    let mut w = watch::Watch::start(root)?;
    let disk_start = disk::read(&diskstats, md.dev())?;
    let sampler = Sampler::spawn(
        &dir,
        (args.watch_for / 10).clamp(Duration::from_secs(1), Duration::from_secs(10)),
    )?;
    let mut shown: Option<Instant> = None;
    while w.elapsed() < args.watch_for && !interrupted() {
        w.step(TICK.min(args.watch_for.saturating_sub(w.elapsed())));
        if progress && shown.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
            shown = Some(Instant::now());
            out::eprint(&format!("\r{}   ", progress_line(&dir, &w, args.watch_for)));
        }
    }
    let seconds = w.elapsed().as_secs_f64();
    let was_interrupted = interrupted();
    let disk_end = disk::read(&diskstats, md.dev())?;
    let activity = w.activity();
    drop(w);
    drop(signals);
    let samples = sampler.stop()?;
    if shown.is_some() {
        out::eprint("\r\x1b[K");
    }
    let end = tree::scan(&dir, true)?;

    let peak_bytes = samples
        .iter()
        .map(|s| s.0)
        .chain([start.bytes, end.bytes])
        .max()
        .unwrap_or(0);
    let peak_inodes = samples
        .iter()
        .map(|s| s.1)
        .chain([start.inodes, end.inodes])
        .max()
        .unwrap_or(0);
    let device = disk_start
        .zip(disk_end)
        .map(|(a, b)| disk::Written::between(&a, &b));
    let figures = Figures {
        seconds,
        bytes_start: start.bytes,
        bytes_end: end.bytes,
        bytes_peak: peak_bytes,
        inodes_start: start.inodes,
        inodes_end: end.inodes,
        inodes_peak: peak_inodes,
        median_file: end.sizes.median,
        creates: activity.total.creates,
        writes: activity.total.writes,
        deletes: activity.total.deletes,
        renames: activity.total.renames,
        bytes_written: activity.total.bytes_written,
        peak_bytes_per_sec: activity.peak_1s.bytes_written,
        resident_end: end.resident_percent,
        device: device.as_ref().map(|d| (d.write_ops, d.write_bytes)),
        mem_total: mem.mem_total,
        in_ram: filesystem
            .as_ref()
            .is_some_and(|f| f.fstype == "tmpfs" || f.fstype == "ramfs"),
        overflows: activity.overflows,
        interrupted: was_interrupted,
    };
    let path = dir.to_string_lossy().into_owned();
    let report = AdviseReport {
        dir: path.clone(),
        filesystem,
        requested_seconds: args.watch_for.as_secs_f64(),
        seconds,
        interrupted: was_interrupted,
        per_second: report::Rates::of(&activity.total, seconds),
        activity,
        tree: TreeReport {
            growth_bytes_per_second: (end.bytes as f64 - start.bytes as f64) / seconds.max(1e-3),
            peak_bytes,
            peak_inodes,
            samples: samples.len() as u64 + 2,
            start,
            end,
        },
        device,
        advice: recommend(&path, &figures),
    };
    if args.spec {
        out::print(&spec_yaml(report.seconds, &report.advice));
    } else if json {
        let mut text = serde_json::to_string_pretty(&report).context("writing the JSON report")?;
        text.push('\n');
        out::print(&text);
    } else {
        out::print(&human(&report));
    }
    Ok(ExitCode::Ok)
}

/// `watching /var/cache/nginx: 12s of 10m, 340 creates, 12MiB written, 5 deletes`.
fn progress_line(dir: &Path, w: &watch::Watch, total: Duration) -> String {
    let a = w.activity();
    format!(
        "watching {}: {}s of {}s, {} creates, {} written, {} deletes",
        escape(dir),
        w.elapsed().as_secs(),
        total.as_secs(),
        a.total.creates,
        format_bytes(a.total.bytes_written),
        a.total.deletes
    )
}

/// Walks the tree every `every` on a thread of its own, so that a long walk
/// never delays the reading of events: the peak size and inode count lie between
/// the walks at the start and the end.
struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(u64, u64)>>>,
    thread: std::thread::JoinHandle<Result<()>>,
}

impl Sampler {
    fn spawn(dir: &Path, every: Duration) -> Result<Sampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (stopping, into, dir) = (Arc::clone(&stop), Arc::clone(&samples), dir.to_path_buf());
        let thread = std::thread::Builder::new()
            .name("advise-tree".into())
            .spawn(move || -> Result<()> {
                let mut next = Instant::now() + every;
                while !stopping.load(Ordering::Relaxed) {
                    if Instant::now() < next {
                        std::thread::sleep(TICK);
                        continue;
                    }
                    let t = tree::scan(&dir, false)?;
                    into.lock()
                        .expect("no panic holds the samples")
                        .push((t.bytes, t.inodes));
                    next = Instant::now() + every;
                }
                Ok(())
            })
            .context("starting the tree sampler's thread")?;
        Ok(Sampler {
            stop,
            samples,
            thread,
        })
    }

    /// (bytes, inodes) of every walk made.
    fn stop(self) -> Result<Vec<(u64, u64)>> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(r) => r?,
            Err(_) => bail!("the tree sampler's thread panicked"),
        }
        let samples = self.samples.lock().expect("no panic holds the samples");
        Ok(samples.clone())
    }
}
