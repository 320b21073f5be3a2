//! `tmpfsctl agent SPEC`: one long-running process that keeps the spec's
//! mounts in RAM safely.
//!
//! - Converges the host to the spec at start (observe → plan → execute, as
//!   `apply`), then watches every offloaded mount through a held descriptor
//!   of its root: `fstatvfs` every `interval`, and early on fanotify write
//!   events (`wake`).
//! - Per mount, the pure decisions of `watchdog` pick warn / evict / grow /
//!   fallback; the memory-pressure guard picks evict / shrink / fallback
//!   across mounts. This module carries them out: eviction in `evict`,
//!   remounts through `mount::remount_tmpfs` with every option, fallback
//!   through `down::down_one` (the same write-back, detach and clean-up as
//!   `tmpfsctl down`).
//! - Writes persisted mounts back every `persist: every <d>` and on SIGTERM.
//! - Reloads the spec on SIGHUP and when the file changes; an invalid spec is
//!   logged and the old one stays in force.
//! - Speaks sd_notify (READY, STATUS, WATCHDOG, STOPPING), logs to the
//!   journal under systemd, and writes Prometheus metrics.
//!
//! Actions that change mounts or the disk copy (grow, shrink, fallback,
//! re-offload, write-back, apply) take the state lock like the commands do;
//! eviction (volatile caches only) does not, so it is never held up.

mod evict;
mod quiet;
mod wake;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use tracing::{debug, error, info, warn};

use crate::backend;
use crate::down::{self, DownOutcome};
use crate::error::ExitCode;
use crate::execute;
use crate::host::usage::Usage;
use crate::host::Host;
use crate::metrics::{self, MountMetrics, Snapshot};
use crate::mount;
use crate::observe::{self, AtPath, MountState, Seen};
use crate::plan::{self, Plan};
use crate::spec::size::format_bytes;
use crate::spec::{self, Action, MetricsTarget, MountSpec, Persist, PressureAction, Spec};
use crate::state::{AgentAction, AgentMount, AgentStatus, FallbackRecord, State};
use crate::sync::{self, SyncOutcome, SyncResult};
use crate::watchdog::{self, Act, Budget, Guard, Level, Limits, MemView, PressureView, Tracker};

pub use evict::{fdinfo_flags, open_for_write, Evicted};

/// Command-line settings; `None` leaves the spec's `agent:` value.
#[derive(Debug, Clone)]
pub struct Options {
    pub interval: Option<Duration>,
    pub metrics: Option<MetricsTarget>,
    /// `false` with `--no-fanotify`: poll only.
    pub fanotify: bool,
    /// How long to wait for the state lock (`--wait`).
    pub wait: Duration,
}

/// After a fanotify wake-up, further events are left to queue (and merge)
/// this long before the next check, so a busy writer costs a bounded number
/// of checks per second.
const WAKE_GAP: Duration = Duration::from_millis(5);
/// A file-change notification is acted on after this quiet time, so an
/// editor's several writes make one reload.
const RELOAD_SETTLE: Duration = Duration::from_millis(200);
/// Usage and memory figures in the metrics file are refreshed this often
/// (states, levels and counters at once); it is also the file's heartbeat.
const METRICS_REFRESH: Duration = Duration::from_secs(5);
/// The mount table is re-read at least this often (besides on change).
const RESCAN_EVERY: Duration = Duration::from_secs(30);

/// With fanotify, how often quiet mounts are measured anyway.
const IDLE_MEASURE: Duration = Duration::from_secs(30);

/// The period of rounds while everything is quiet (see [`Agent::check_period`]).
const QUIET_PERIOD: Duration = Duration::from_secs(5);

/// The PSI trigger: memory stalls of 100 ms within 1 s wake the agent at once.
const PSI_TRIGGER: &str = "some 100000 1000000";
/// At most this many actions per mount per check (grow steps, evict, next).
const MAX_ROUNDS: usize = 32;
/// MemAvailable and PSI are re-read at most this often.
const MEM_READ_EVERY: Duration = Duration::from_millis(100);
/// A single operation (write-back, seeding) may keep the loop this long
/// before the systemd watchdog is no longer fed.
const BUSY_LIMIT: Duration = Duration::from_secs(30 * 60);

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// PSI `some avg10` from the text of /proc/pressure/memory.
pub fn parse_psi(text: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with("some "))?
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("avg10="))?
        .parse()
        .ok()
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "0%".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// Feeds the systemd watchdog from a thread while the loop is alive, or
/// busy in one long operation for less than [`BUSY_LIMIT`].
struct Alive {
    start: Instant,
    beat_ms: AtomicU64,
    /// 0 when idle, else ms since start (+1) when the operation began.
    busy_since_ms: AtomicU64,
}

impl Alive {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn beat(&self) {
        self.beat_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn busy(self: &Arc<Self>) -> Busy {
        self.busy_since_ms.store(self.now_ms() + 1, Ordering::Relaxed);
        Busy(self.clone())
    }

    fn spawn_watchdog(self: &Arc<Self>, period: Duration) {
        let me = self.clone();
        std::thread::Builder::new()
            .name("sd-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(period / 2);
                let now = me.now_ms();
                let fresh =
                    now.saturating_sub(me.beat_ms.load(Ordering::Relaxed)) < period.as_millis() as u64;
                let since = me.busy_since_ms.load(Ordering::Relaxed);
                let busy = since != 0 && now.saturating_sub(since) < BUSY_LIMIT.as_millis() as u64;
                if fresh || busy {
                    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
                }
            })
            .expect("spawning the watchdog thread");
    }
}

struct Busy(Arc<Alive>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy_since_ms.store(0, Ordering::Relaxed);
        self.0.beat();
    }
}

/// One mount of the spec as the agent follows it.
struct Watched {
    spec: MountSpec,
    /// The live tmpfs root, held while the mount is offloaded.
    root: Option<File>,
    /// `st_dev` of the held root.
    dev: u64,
    usage: Option<Usage>,
    tracker: Tracker,
    state: MountState,
    metrics: MountMetrics,
    fallback: Option<FallbackRecord>,
    next_sync: Option<Instant>,
    /// Files the last eviction deleted.
    last_evicted: u64,
    /// The last eviction's scan of the tree, kept for the next ones.
    scanned: Option<evict::Scanned>,
    quiet: quiet::Quiet,
}

impl Watched {
    fn new(spec: MountSpec, st: &State) -> Watched {
        let mut metrics = MountMetrics::new(&spec.name, &spec.path);
        metrics.last_sync = st.last_sync(&spec.name).map(|r| (r.at, r.seconds, r.ok));
        Watched {
            fallback: st.fallback(&spec.name),
            spec,
            root: None,
            dev: 0,
            usage: None,
            tracker: Tracker::default(),
            state: MountState::Absent,
            metrics,
            next_sync: None,
            last_evicted: 0,
            scanned: None,
            quiet: quiet::Quiet::default(),
        }
    }

    fn name(&self) -> &str {
        &self.spec.name
    }

    fn limits(&self) -> Limits {
        Limits {
            spec_size: self.spec.size,
            spec_inodes: self.spec.inodes,
        }
    }
}

/// Why an action is taken, for logs and metrics.
#[derive(Debug, Clone)]
enum Cause {
    Watchdog,
    /// Before `high`: a fast writer would reach it before an eviction could finish.
    Early,
    Pressure(PressureAction, String),
}

struct Agent {
    path: PathBuf,
    spec: Spec,
    spec_text: String,
    host: Host,
    state: State,
    opts: Options,
    interval: Duration,
    metrics_path: Option<PathBuf>,
    wake: Option<wake::Wake>,
    mounts: Vec<Watched>,
    page_size: u64,
    mem: Option<MemView>,
    mem_read_at: Option<Instant>,
    pressure: Option<String>,
    guard_last: Option<Instant>,
    guard_exhausted: bool,
    reloads: BTreeMap<&'static str, u64>,
    start_time: u64,
    metrics_last: Option<(Vec<u64>, Instant)>,
    /// What `STATE/agent.json` last said of the mounts.
    agent_status_last: Option<String>,
    /// When the mounts were last measured (see [`Agent::check`]).
    measured_at: Option<Instant>,
    /// What the status line and `agent.json` were last built from.
    published_sig: Option<Vec<u64>>,
    /// `/proc/pressure/memory` with a trigger: readable (POLLPRI) on memory stalls.
    psi_trigger: Option<File>,
    status_last: String,
    psi_warned: bool,
    alive: Arc<Alive>,
    last_rescan: Instant,
}

/// Logs to the journal under systemd (JOURNAL_STREAM set and journald's
/// socket present), else to stderr. `TMPFSCTL_LOG` filters (default info).
pub fn init_logging() {
    use std::io::IsTerminal;
    use tracing_subscriber::prelude::*;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("TMPFSCTL_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    let journal =
        std::env::var_os("JOURNAL_STREAM").is_some() && Path::new("/run/systemd/journal/socket").exists();
    if journal {
        if let Ok(layer) = tracing_journald::layer() {
            let _ = tracing_subscriber::registry()
                .with(filter())
                .with(
                    layer
                        .with_syslog_identifier("tmpfsctl-agent".into())
                        .with_field_prefix(Some("TMPFSCTL".into())),
                )
                .try_init();
            return;
        }
    }
    let _ = tracing_subscriber::registry()
        .with(filter())
        .with(
            tracing_subscriber::fmt::layer()
                .fmt_fields(EscapedFields)
                .with_writer(crate::out::stderr)
                .log_internal_errors(false)
                .with_target(false)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .try_init();
}

/// The fields of a log line as the default formatter writes them, with the
/// host strings in them (paths, process names, error messages) escaped like
/// all human output ([`crate::out::escape`]): a file name cannot forge a log
/// line or reach the terminal. (The journal stores fields as they are;
/// journalctl shows a field with control characters as blob data.)
struct EscapedFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for EscapedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut plain = String::new();
        tracing_subscriber::fmt::format::DefaultFields::new()
            .format_fields(tracing_subscriber::fmt::format::Writer::new(&mut plain), fields)?;
        writer.write_str(&crate::out::escape(&plain))
    }
}

/// Runs the agent until SIGTERM/SIGINT; returns the exit status.
/// The agent's CPU priority when it starts at the default, nice 0: it must react
/// within milliseconds while the applications it watches keep every CPU busy. With
/// Apache under load on two CPUs, an eviction took 266 ms at nice 0 and the cache
/// hit 100% in 11% of the samples; at -10, 1–3% (docs/agent.md).
const NICE: i32 = -10;

/// Raises the priority of the calling thread (on Linux a nice value is per thread;
/// threads started later inherit it) from the default to [`NICE`]. A value set by
/// the operator (`Nice=` in the unit, nice(1)) stands.
fn raise_priority() {
    nix::errno::Errno::clear();
    // SAFETY: getpriority takes two integers and touches no memory of ours.
    let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    if now != 0 || nix::errno::Errno::last_raw() != 0 {
        return;
    }
    // SAFETY: setpriority takes three integers and touches no memory of ours.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, NICE) } == 0 {
        info!("runs at nice {NICE}, to react while the applications load every CPU");
    } else {
        warn!(
            "cannot raise the priority to nice {NICE} ({}); reactions may be late while the CPUs are busy",
            nix::errno::Errno::last()
        );
    }
}

pub fn run(spec_path: &Path, host: Host, state: State, opts: Options) -> Result<ExitCode> {
    let psi_trigger = psi_trigger(&host);
    init_logging();
    raise_priority();
    spec::only_root_can_change(spec_path)?;
    let spec_text = spec::read_text(spec_path)?;
    let mem_total = host.meminfo()?.mem_total;
    let spec = spec::parse(spec_path, &spec_text, mem_total).map_err(spec::SpecLoadError::Invalid)?;

    // Signals arrive through a descriptor; blocked before any thread starts
    // so every thread inherits the mask.
    let mut mask = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        mask.add(s);
    }
    mask.thread_block().context("blocking signals")?;
    let signals =
        SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).context("signalfd")?;

    let alive = Arc::new(Alive {
        start: Instant::now(),
        beat_ms: AtomicU64::new(0),
        busy_since_ms: AtomicU64::new(0),
    });
    let mut watchdog_usec = 0u64;
    let watchdog_period =
        sd_notify::watchdog_enabled(false, &mut watchdog_usec).then(|| Duration::from_micros(watchdog_usec));
    if let Some(p) = watchdog_period {
        alive.spawn_watchdog(p);
    }

    let (reload_rx, reload_tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK).context("pipe")?;
    let _watcher = watch_spec_file(spec_path, reload_tx);
    let mountinfo = File::open(host.proc_path("self/mountinfo")).ok();

    let wake = if opts.fanotify {
        match wake::Wake::new() {
            Ok(w) => {
                info!(
                    "usage checks wake on fanotify write events ({} mode) and every {}",
                    if w.fid { "file-id" } else { "classic" },
                    describe_ms(
                        opts.interval
                            .map(|d| d.as_millis() as u64)
                            .unwrap_or(spec.agent.interval_ms)
                    )
                );
                Some(w)
            }
            Err(e) => {
                warn!("fanotify is not available ({e}); polling usage only");
                None
            }
        }
    } else {
        info!("fanotify disabled (--no-fanotify); polling usage only");
        None
    };

    let page_size = crate::host::page_size();
    let mounts = spec
        .mounts
        .iter()
        .map(|m| Watched::new(m.clone(), &state))
        .collect();
    let mut agent = Agent {
        path: spec_path.to_path_buf(),
        spec,
        spec_text,
        host,
        state,
        interval: Duration::from_secs(1),
        metrics_path: None,
        opts,
        wake,
        mounts,
        page_size,
        mem: None,
        mem_read_at: None,
        pressure: None,
        guard_last: None,
        guard_exhausted: false,
        reloads: BTreeMap::new(),
        start_time: unix_now(),
        agent_status_last: None,
        measured_at: None,
        published_sig: None,
        psi_trigger,
        metrics_last: None,
        status_last: String::new(),
        psi_warned: false,
        alive,
        last_rescan: Instant::now(),
    };
    agent.settings();
    info!(
        "watching {} of {} every {}; metrics: {}",
        crate::plural::count(agent.mounts.len(), "mount", "mounts"),
        agent.path.display(),
        describe_ms(agent.interval.as_millis() as u64),
        agent
            .metrics_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "off".into())
    );

    let names: Vec<String> = agent
        .mounts
        .iter()
        .filter(|w| {
            w.fallback
                .as_ref()
                .is_none_or(|f| f.reoffload_at.is_some_and(|t| t <= unix_now()))
        })
        .map(|w| w.spec.name.clone())
        .collect();
    for w in agent.mounts.iter().filter(|w| w.fallback.is_some()) {
        if !names.contains(&w.spec.name) {
            info!(
                mount = w.name(),
                "{}: stays on its disk directory (fell back earlier: {})",
                w.name(),
                w.fallback.as_ref().map(|f| f.reason.as_str()).unwrap_or("")
            );
        }
    }
    agent.apply(&names, "start");
    agent.check(true);
    let status = agent.status_line();
    let _ = sd_notify::notify(
        false,
        &[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(&status),
        ],
    );
    agent.status_last = status;
    Ok(agent.main_loop(&signals, &reload_rx, mountinfo.as_ref(), watchdog_period))
}

fn describe_ms(ms: u64) -> String {
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// A PSI trigger on memory stalls ([`PSI_TRIGGER`]); none without PSI or the
/// right to set one.
fn psi_trigger(host: &Host) -> Option<File> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(host.proc_path("pressure/memory"))
        .ok()?;
    f.write_all(PSI_TRIGGER.as_bytes()).ok()?;
    Some(f)
}

/// Watches the directory of the spec file (and of its target, when it is a
/// symlink), since editors replace files by renaming; wakes the loop
/// through `tx` when an entry with the spec's name changes.
fn watch_spec_file(path: &Path, tx: OwnedFd) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let abs = std::path::absolute(path).ok()?;
    let mut watch: Vec<(PathBuf, std::ffi::OsString)> = Vec::new();
    for p in [Some(abs.clone()), std::fs::canonicalize(&abs).ok()]
        .into_iter()
        .flatten()
    {
        if let (Some(dir), Some(name)) = (p.parent(), p.file_name()) {
            if !watch.iter().any(|(d, n)| d == dir && n == name) {
                watch.push((dir.to_path_buf(), name.to_os_string()));
            }
        }
    }
    let names: Vec<std::ffi::OsString> = watch.iter().map(|(_, n)| n.clone()).collect();
    let handler = move |res: notify::Result<notify::Event>| {
        if let Ok(ev) = res {
            if ev
                .paths
                .iter()
                .any(|p| p.file_name().is_some_and(|n| names.iter().any(|w| w == n)))
            {
                let _ = nix::unistd::write(&tx, b"x");
            }
        }
    };
    let mut w = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            warn!(
                "cannot watch {} for changes ({e}); reload with SIGHUP",
                path.display()
            );
            return None;
        }
    };
    let mut dirs: Vec<&PathBuf> = watch.iter().map(|(d, _)| d).collect();
    dirs.dedup();
    for d in dirs {
        if let Err(e) = w.watch(d, notify::RecursiveMode::NonRecursive) {
            warn!(
                "cannot watch {} for changes ({e}); reload with SIGHUP",
                d.display()
            );
        }
    }
    Some(w)
}

impl Agent {
    /// Effective settings: the spec's `agent:`, overridden by the command line.
    fn settings(&mut self) {
        self.interval = self
            .opts
            .interval
            .unwrap_or(Duration::from_millis(self.spec.agent.interval_ms));
        let target = self
            .opts
            .metrics
            .clone()
            .unwrap_or(self.spec.agent.metrics.clone());
        let new = match target {
            MetricsTarget::Off => None,
            MetricsTarget::File(p) => Some(p),
            MetricsTarget::Auto => {
                let p = PathBuf::from(spec::DEFAULT_METRICS);
                p.parent().is_some_and(Path::is_dir).then_some(p)
            }
        };
        if new != self.metrics_path {
            self.metrics_last = None;
        }
        self.metrics_path = new;
    }

    fn main_loop(
        &mut self,
        signals: &SignalFd,
        reload_rx: &OwnedFd,
        mountinfo: Option<&File>,
        watchdog_period: Option<Duration>,
    ) -> ExitCode {
        let mut next_check = Instant::now() + self.interval;
        let mut wake_armed_at = Instant::now();
        let mut reload_at: Option<Instant> = None;
        loop {
            self.alive.beat();
            let now = Instant::now();
            let mut deadline = next_check.min(now + METRICS_REFRESH);
            for w in &self.mounts {
                if let Some(t) = w.next_sync {
                    deadline = deadline.min(t);
                }
            }
            if let Some(t) = reload_at {
                deadline = deadline.min(t);
            }
            if let Some(t) = self.next_reoffload() {
                deadline = deadline.min(t);
            }
            if let Some(p) = watchdog_period {
                deadline = deadline.min(now + p / 3);
            }
            let wake_open = self.wake.is_some() && now >= wake_armed_at;
            if !wake_open && self.wake.is_some() {
                deadline = deadline.min(wake_armed_at);
            }
            let timeout = deadline.saturating_duration_since(now);
            let timeout = PollTimeout::try_from(timeout.as_millis().min(i32::MAX as u128) as i32)
                .unwrap_or(PollTimeout::MAX);

            let mut fds = vec![
                PollFd::new(signals.as_fd(), PollFlags::POLLIN),
                PollFd::new(reload_rx.as_fd(), PollFlags::POLLIN),
            ];
            let mi_at = mountinfo.map(|f| {
                fds.push(PollFd::new(f.as_fd(), PollFlags::POLLPRI));
                fds.len() - 1
            });
            let psi_at = self.psi_trigger.as_ref().map(|f| {
                fds.push(PollFd::new(f.as_fd(), PollFlags::POLLPRI));
                fds.len() - 1
            });
            let wake_at = match (&self.wake, wake_open) {
                (Some(w), true) => {
                    fds.push(PollFd::new(w.fd(), PollFlags::POLLIN));
                    Some(fds.len() - 1)
                }
                _ => None,
            };
            if let Err(e) = poll(&mut fds, timeout) {
                if e != nix::errno::Errno::EINTR {
                    error!("poll: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            let ready = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
            let sig = ready(0);
            let reload_wake = ready(1);
            let mi = mi_at.is_some_and(ready);
            let woke = wake_at.is_some_and(ready);
            let psi = psi_at.is_some_and(ready);
            drop(fds);

            if sig {
                while let Ok(Some(si)) = signals.read_signal() {
                    match Signal::try_from(si.ssi_signo as i32) {
                        Ok(Signal::SIGHUP) => self.reload("SIGHUP", true),
                        Ok(s) => return self.stop(s),
                        Err(_) => {}
                    }
                }
            }
            if reload_wake {
                let mut buf = [0u8; 64];
                while matches!(nix::unistd::read(reload_rx, &mut buf), Ok(n) if n > 0) {}
                reload_at = Some(Instant::now() + RELOAD_SETTLE);
            }
            if reload_at.is_some_and(|t| Instant::now() >= t) {
                reload_at = None;
                self.reload("spec file changed", false);
            }
            if mi || self.last_rescan.elapsed() >= RESCAN_EVERY {
                self.rescan();
            }
            let mut check = Instant::now() >= next_check || psi;
            if woke {
                let n = self.wake.as_ref().map(|w| w.drain()).unwrap_or(0);
                debug!("fanotify: {}", crate::plural::count(n, "event", "events"));
                check = true;
                wake_armed_at = Instant::now() + WAKE_GAP;
            }
            if check {
                self.check(woke);
                next_check = Instant::now() + self.check_period();
            }
            self.periodic_syncs();
            self.reoffloads();
            self.publish();
        }
    }

    /// Reads MemAvailable and PSI (at most every [`MEM_READ_EVERY`]: a busy
    /// writer's wake-ups do not re-read them each time).
    fn read_mem(&mut self) {
        if self.mem_read_at.is_some_and(|t| t.elapsed() < MEM_READ_EVERY) {
            return;
        }
        self.mem_read_at = Some(Instant::now());
        let mi = match self.host.meminfo() {
            Ok(m) => m,
            Err(e) => {
                warn!("{e:#}");
                return;
            }
        };
        let psi = match std::fs::read_to_string(self.host.proc_path("pressure/memory")) {
            Ok(t) => parse_psi(&t),
            Err(e) => {
                if !self.psi_warned {
                    self.psi_warned = true;
                    info!("no PSI ({e}); the memory guard watches MemAvailable only");
                }
                None
            }
        };
        self.mem = Some(MemView {
            mem_total: mi.mem_total,
            mem_available: mi.mem_available,
            psi_some_avg10: psi,
        });
    }

    fn measure(&mut self, i: usize) -> Option<Usage> {
        let w = &mut self.mounts[i];
        let root = w.root.as_ref()?;
        match Usage::of_fd(root) {
            Ok(u) => {
                w.usage = Some(u);
                Some(u)
            }
            Err(e) => {
                warn!(mount = w.name(), "{}: {e:#}", w.name());
                None
            }
        }
    }

    fn budget(&self) -> Budget {
        Budget {
            max_total: self.spec.max_total,
            total_size: self
                .mounts
                .iter()
                .filter(|w| w.root.is_some())
                .filter_map(|w| w.usage.map(|u| u.size))
                .sum(),
            grow_floor: self.spec.agent.grow_floor,
            under_pressure: self.pressure.is_some(),
            page_size: self.page_size,
        }
    }

    /// Until the next round: `interval`, or [`QUIET_PERIOD`] while every mount is
    /// quiet and fanotify reports writes: no tmpfs can grow unseen then, and memory
    /// is read that often (half the guard's default cooldown); a PSI trigger, where
    /// the kernel offers one, wakes the agent at once on memory stalls.
    fn check_period(&self) -> Duration {
        let quiet = self.wake.is_some()
            && self.pressure.is_none()
            && self
                .mounts
                .iter()
                .all(|w| w.tracker.level == Level::Ok && !w.tracker.exhausted);
        if quiet {
            self.interval.max(QUIET_PERIOD)
        } else {
            self.interval
        }
    }

    /// One round over every mount, then the memory guard. With fanotify, usage only
    /// changes when something is written, which wakes the loop: a quiet round
    /// (`woke` false) looks at memory only, unless a mount is above `warn`, out of
    /// actions, or [`IDLE_MEASURE`] passed since the mounts were last measured
    /// (writes fanotify does not report: shared mappings).
    fn check(&mut self, woke: bool) {
        self.read_mem();
        let active = self
            .mounts
            .iter()
            .any(|w| w.tracker.level != Level::Ok || w.tracker.exhausted);
        let measure = woke
            || self.wake.is_none()
            || active
            || self.pressure.is_some()
            || self.measured_at.is_none_or(|t| t.elapsed() >= IDLE_MEASURE);
        if measure {
            self.measured_at = Some(Instant::now());
            for i in 0..self.mounts.len() {
                self.measure(i);
            }
        }
        self.update_pressure();
        if measure {
            for i in 0..self.mounts.len() {
                self.check_mount(i);
            }
        }
        self.guard();
        self.summarise();
    }

    /// Logs what [`quiet::Quiet`] held back over a whole window, one line a kind.
    fn summarise(&mut self) {
        let now = Instant::now();
        for w in &mut self.mounts {
            let name = w.spec.name.clone();
            let usage = w.usage.map(|u| pct(u.used, u.size)).unwrap_or_default();
            let secs = quiet::WINDOW.as_secs();
            for s in w.quiet.due(now) {
                match s.kind.as_str() {
                    "evict" => info!(
                        mount = name.as_str(),
                        action = "evict",
                        "{name}: {} in the last {secs}s: {} ({}); usage now {usage}",
                        crate::plural::count(s.count, "more eviction", "more evictions"),
                        crate::plural::count(s.files, "file", "files"),
                        format_bytes(s.bytes)
                    ),
                    "evict-none" => warn!(
                        mount = name.as_str(),
                        action = "evict",
                        "{name}: {} more evictions in the last {secs}s found nothing to evict; usage now {usage}",
                        s.count
                    ),
                    transition => info!(
                        mount = name.as_str(),
                        level = w.tracker.level.name(),
                        "{name}: level {transition} {} more times in the last {secs}s; now {} at {usage}",
                        s.count,
                        w.tracker.level.name()
                    ),
                }
            }
        }
    }

    fn check_mount(&mut self, i: usize) {
        let Some(mem) = self.mem else { return };
        for _ in 0..MAX_ROUNDS {
            let Some(u) = self.measure(i) else { return };
            let b = self.budget();
            let w = &mut self.mounts[i];
            let wd = w.spec.watchdog.clone();
            let lim = w.limits();
            let now_ms = self.alive.now_ms();
            let w = &mut self.mounts[i];
            let v = watchdog::decide(&wd, &mut w.tracker, &u, lim, &mem, &b, now_ms);
            w.metrics.level = w.tracker.level;
            let name = w.spec.name.clone();
            let now = Instant::now();
            if let Some((from, to)) = v.transition.filter(|(from, to)| {
                w.quiet
                    .pass(&format!("{} -> {}", from.name(), to.name()), now, 0, 0)
            }) {
                let text = format!(
                    "{name}: usage {} of {} ({}), inodes {} of {} ({}): level {} -> {}",
                    format_bytes(u.used),
                    format_bytes(u.size),
                    pct(u.used, u.size),
                    u.inodes_used,
                    u.inodes,
                    pct(u.inodes_used, u.inodes),
                    from.name(),
                    to.name()
                );
                if to > from {
                    warn!(mount = name.as_str(), level = to.name(), "{text}");
                } else {
                    info!(mount = name.as_str(), level = to.name(), "{text}");
                }
            }
            for (a, why) in &v.skipped {
                info!(mount = name.as_str(), "{name}: {} skipped: {why}", a.name());
            }
            if let Some(retry_ms) = v.exhausted {
                warn!(
                    mount = name.as_str(),
                    "{name}: usage {} stays at or above high {}% and [{}] can free nothing now (files open for writing, or none left); tried again in {}, sooner when usage moves",
                    pct(u.used, u.size),
                    wd.bytes.high,
                    wd.actions.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "),
                    describe_ms(retry_ms)
                );
            }
            let Some(act) = v.act else { return };
            let cause = if v.early { Cause::Early } else { Cause::Watchdog };
            let done = self.perform(i, &act, &cause);
            match (&act, done) {
                (Act::Warn | Act::Fallback, _) | (_, false) => return,
                _ => {}
            }
            let Some(after) = self.measure(i) else { return };
            let w = &mut self.mounts[i];
            let freed = !matches!(act, Act::Evict { .. }) || w.last_evicted > 0;
            watchdog::after_action(&wd, &mut w.tracker, &act, &after, freed);
        }
    }

    fn update_pressure(&mut self) {
        let Some(mem) = self.mem else { return };
        let now = watchdog::pressure(&mem, &self.spec.agent);
        match (&self.pressure, &now) {
            (None, Some(why)) => warn!("memory pressure: {why}; the guard acts on the mounts"),
            (Some(_), None) => info!("memory pressure is over"),
            _ => {}
        }
        self.pressure = now;
    }

    /// The memory-pressure guard: at most one action per cooldown.
    fn guard(&mut self) {
        let Some(mem) = self.mem else { return };
        let views: Vec<PressureView<'_>> = self
            .mounts
            .iter()
            .enumerate()
            .filter(|(_, w)| w.root.is_some())
            .filter_map(|(index, w)| {
                Some(PressureView {
                    index,
                    watchdog: &w.spec.watchdog,
                    usage: w.usage?,
                    limits: w.limits(),
                })
            })
            .collect();
        let since = self.guard_last.map(|t| t.elapsed().as_millis() as u64);
        let g = watchdog::guard(&mem, &self.spec.agent, &views, since, self.page_size);
        drop(views);
        match g {
            Guard::Calm => self.guard_exhausted = false,
            Guard::Cooling => {}
            Guard::Exhausted => {
                if !self.guard_exhausted {
                    self.guard_exhausted = true;
                    error!(
                        "memory pressure persists and no mount has anything left to give (see each mount's `watchdog.pressure`)"
                    );
                }
            }
            Guard::Act { index, action, act } => {
                let why = self.pressure.clone().unwrap_or_default();
                self.guard_last = Some(Instant::now());
                self.perform(index, &act, &Cause::Pressure(action, why));
                self.measure(index);
            }
        }
    }

    /// Carries out an action; `false` when it failed (logged).
    fn perform(&mut self, i: usize, act: &Act, cause: &Cause) -> bool {
        let name = self.mounts[i].spec.name.clone();
        let by = match cause {
            Cause::Watchdog => "high".to_string(),
            Cause::Early => format!("filling fast: high within {} ms", watchdog::LEAD_MS),
            Cause::Pressure(a, why) => format!("memory pressure ({why}); guard action {}", a.name()),
        };
        match act {
            Act::Warn => {
                let w = &mut self.mounts[i];
                let u = w.usage.unwrap_or(Usage {
                    size: 0,
                    used: 0,
                    inodes: 0,
                    inodes_used: 0,
                });
                warn!(
                    mount = name.as_str(),
                    action = "warn",
                    "{name}: usage {} bytes, {} inodes reached high (bytes {}%, inodes {}%); action warn: nothing else is done",
                    pct(u.used, u.size),
                    pct(u.inodes_used, u.inodes),
                    w.spec.watchdog.bytes.high,
                    w.spec.watchdog.inodes.high
                );
                w.metrics.count("warn");
                true
            }
            Act::Evict { target } => self.evict(i, *target, &by),
            Act::Grow { size, nr_inodes } => self.resize(i, *size, *nr_inodes, &by),
            Act::Fallback => self.fallback(i, &by),
        }
    }

    fn evict(&mut self, i: usize, target: watchdog::EvictTarget, by: &str) -> bool {
        let started = Instant::now();
        let w = &mut self.mounts[i];
        let name = w.spec.name.clone();
        let Some(root) = w.root.as_ref() else { return false };
        let before = w.usage;
        let group = w.spec.watchdog.evict_group;
        let res = evict::evict(
            root.as_fd(),
            &self.host,
            target,
            group,
            &|| Usage::of_fd(root),
            &mut w.scanned,
        );
        let after = Usage::of_fd(root).ok();
        w.usage = after.or(w.usage);
        w.last_evicted = res.as_ref().map_or(0, |r| r.files);
        match res {
            Ok(r) => {
                w.metrics.count("evict");
                w.metrics.evicted_files += r.files;
                w.metrics.evicted_bytes += r.bytes;
                let u = w.usage.unwrap_or(target_usage(&target));
                let msg = format!(
                    "{name}: evicted {} ({}) in {} ms ({by}); usage {} -> {} bytes, inodes {}; target low {}{}",
                    crate::plural::count(r.files, "least-recently-used file", "least-recently-used files"),
                    format_bytes(r.bytes),
                    started.elapsed().as_millis(),
                    before.map(|b| pct(b.used, b.size)).unwrap_or_default(),
                    pct(u.used, u.size),
                    pct(u.inodes_used, u.inodes),
                    format_bytes(target.bytes),
                    if r.skipped_open > 0 {
                        format!(
                            "; {} open for writing {} kept",
                            crate::plural::count(r.skipped_open, "file", "files"),
                            crate::plural::agree(r.skipped_open, "was", "were")
                        )
                    } else {
                        String::new()
                    }
                );
                let now = Instant::now();
                if r.files == 0 {
                    if w.quiet.pass("evict-none", now, 0, 0) {
                        warn!(
                            mount = name.as_str(),
                            action = "evict",
                            "{msg}: nothing could be evicted"
                        );
                    }
                } else if w.quiet.pass("evict", now, r.files, r.bytes) {
                    info!(mount = name.as_str(), action = "evict", "{msg}");
                }
                true
            }
            Err(e) => {
                error!(
                    mount = name.as_str(),
                    action = "evict",
                    "{name}: eviction failed: {e:#}"
                );
                false
            }
        }
    }

    /// Online remount to `size` (grow, or shrink back), with every option.
    fn resize(&mut self, i: usize, size: u64, nr_inodes: Option<u64>, by: &str) -> bool {
        let _busy = self.alive.busy();
        let _lock = match self.state.lock(self.opts.wait) {
            Ok(l) => l,
            Err(e) => {
                warn!("{}: resize postponed: {e}", self.mounts[i].spec.name);
                return false;
            }
        };
        let w = &mut self.mounts[i];
        let name = w.spec.name.clone();
        let Some(root) = w.root.as_ref() else { return false };
        let Some(before) = w.usage else { return false };
        let kind: &'static str = if size >= before.size { "grow" } else { "shrink" };
        // The held root is the live tmpfs; its owner and mode stay as they
        // are (the kernel ignores them on remount anyway).
        let attrs = match nix::sys::stat::fstat(root.as_fd()) {
            Ok(st) => mount::RootAttrs {
                uid: st.st_uid,
                gid: st.st_gid,
                mode: st.st_mode & 0o7777,
            },
            Err(e) => {
                error!("{name}: {kind} failed: fstat: {e}");
                return false;
            }
        };
        if !still_there(&w.spec.path, w.dev) {
            warn!(
                "{name}: {kind} skipped: {} is no longer the watched tmpfs",
                w.spec.path.display()
            );
            return false;
        }
        let options = backend::Options::desired(&w.spec, attrs)
            .resized(size, nr_inodes.or(w.spec.inodes).or(Some(before.inodes)));
        match backend::remount(&w.spec.path, &options) {
            Ok(()) => {
                w.metrics.count(kind);
                let after = Usage::of_fd(root).ok();
                w.usage = after.or(w.usage);
                info!(
                    mount = name.as_str(),
                    action = kind,
                    "{name}: {kind} {} -> {} ({by}): {}",
                    format_bytes(before.size),
                    format_bytes(size),
                    options.describe()
                );
                true
            }
            Err(e) => {
                error!(
                    mount = name.as_str(),
                    action = kind,
                    "{name}: {kind} to {} failed: {e}",
                    format_bytes(size)
                );
                false
            }
        }
    }

    /// Takes the mount out of RAM (write-back first when persisted), the
    /// same way `tmpfsctl down` does; the application continues on its disk
    /// directory.
    fn fallback(&mut self, i: usize, by: &str) -> bool {
        let _busy = self.alive.busy();
        let _lock = match self.state.lock(self.opts.wait) {
            Ok(l) => l,
            Err(e) => {
                warn!("{}: fallback postponed: {e}", self.mounts[i].spec.name);
                return false;
            }
        };
        let name = self.mounts[i].spec.name.clone();
        let usage = self.mounts[i].usage;
        // Let go of the root first, so an idle mount unmounts cleanly.
        self.unwatch(i);
        let r = match down::down_one(&self.spec, &name, &self.host, &self.state, "fallback") {
            Ok(r) => r,
            Err(e) => {
                error!(
                    mount = name.as_str(),
                    action = "fallback",
                    "{name}: fallback failed: {e:#}"
                );
                drop(_lock);
                self.rescan();
                return false;
            }
        };
        for s in &r.syncs {
            self.record_sync(i, s);
        }
        if r.result == DownOutcome::Refused {
            error!(
                mount = name.as_str(),
                action = "fallback",
                "{name}: fallback refused, the tmpfs stays: {}",
                r.reason.clone().unwrap_or_default()
            );
            drop(_lock);
            self.rescan();
            return false;
        }
        let w = &mut self.mounts[i];
        let now = unix_now();
        let reoffload_at = w.spec.watchdog.reoffload_after.map(|s| now.saturating_add(s));
        let reason = format!(
            "{by} at {}",
            usage
                .map(|u| format!("{} used", pct(u.used, u.size)))
                .unwrap_or_default()
        );
        let rec = FallbackRecord {
            at: now,
            reason: reason.clone(),
            reoffload_at,
        };
        let when = match w.spec.watchdog.reoffload_after {
            Some(s) => format!("the agent offloads it again after {s}s"),
            None => "`tmpfsctl apply` (or a change of this mount in the spec) offloads it again".into(),
        };
        let marker = format!("fell back to the disk directory (agent): {reason}; {when}");
        if let Err(e) = self
            .state
            .set_degraded(&name, &marker)
            .and_then(|_| self.state.set_fallback(&name, &rec))
        {
            error!("{name}: recording the fallback: {e:#}");
        }
        w.fallback = Some(rec);
        w.state = MountState::Fallback;
        w.usage = None;
        w.tracker = Tracker::default();
        w.metrics.level = Level::Ok;
        w.metrics.count("fallback");
        let how = match r.result {
            DownOutcome::Detached => format!(
                "detached lazily; {} open files until they close them",
                holders_keep(&r.holders)
            ),
            DownOutcome::Pending => format!(
                "switched, but the write-back is pending: {}",
                r.reason.clone().unwrap_or_default()
            ),
            _ => "unmounted".into(),
        };
        warn!(
            mount = name.as_str(),
            action = "fallback",
            "{name}: fell back to the disk directory ({by}): {how}{}; {when}",
            if r.syncs.is_empty() {
                String::new()
            } else {
                format!(
                    "; written back {}",
                    crate::plural::count(r.syncs.len(), "time", "times")
                )
            }
        );
        true
    }

    fn record_sync(&mut self, i: usize, s: &SyncResult) {
        let w = &mut self.mounts[i];
        match s.result {
            SyncOutcome::Synced => {
                w.metrics.syncs_ok += 1;
                w.metrics.count("sync");
            }
            SyncOutcome::Failed => w.metrics.syncs_failed += 1,
            SyncOutcome::Skipped => return,
        }
        w.metrics.last_sync = Some((unix_now(), s.seconds, s.result == SyncOutcome::Synced));
        match s.result {
            SyncOutcome::Failed => error!(
                mount = s.name.as_str(),
                action = "sync",
                "{}: write-back failed after {:.3}s: {}",
                s.name,
                s.seconds,
                s.reason.clone().unwrap_or_default()
            ),
            _ => info!(
                mount = s.name.as_str(),
                action = "sync",
                "{}: written back in {:.3}s",
                s.name,
                s.seconds
            ),
        }
    }

    /// `persist: every <d>`: write back when due.
    fn periodic_syncs(&mut self) {
        let now = Instant::now();
        for i in 0..self.mounts.len() {
            let w = &self.mounts[i];
            if w.root.is_none() || w.next_sync.is_none_or(|t| t > now) {
                continue;
            }
            let Persist::Every(secs) = w.spec.persist else {
                continue;
            };
            let name = w.spec.name.clone();
            let _busy = self.alive.busy();
            let res = match self.state.lock(self.opts.wait) {
                Ok(_lock) => sync::sync(
                    &self.spec,
                    std::slice::from_ref(&name),
                    &self.host,
                    &self.state,
                    "schedule",
                ),
                Err(e) => {
                    warn!("{name}: periodic write-back postponed: {e}");
                    self.mounts[i].next_sync =
                        Some(Instant::now() + self.interval.max(Duration::from_secs(5)));
                    continue;
                }
            };
            match res {
                Ok(results) => {
                    for s in &results {
                        self.record_sync(i, s);
                    }
                }
                Err(e) => error!("{name}: periodic write-back failed: {e:#}"),
            }
            self.mounts[i].next_sync = Some(watchdog::deadline(Instant::now(), secs));
        }
    }

    fn next_reoffload(&self) -> Option<Instant> {
        let now = unix_now();
        self.mounts
            .iter()
            .filter(|w| w.root.is_none())
            .filter_map(|w| w.fallback.as_ref()?.reoffload_at)
            .map(|at| watchdog::deadline(Instant::now(), at.saturating_sub(now)))
            .min()
    }

    fn reoffloads(&mut self) {
        let now = unix_now();
        let due: Vec<String> = self
            .mounts
            .iter()
            .filter(|w| w.root.is_none())
            .filter(|w| {
                w.fallback
                    .as_ref()
                    .and_then(|f| f.reoffload_at)
                    .is_some_and(|t| t <= now)
            })
            .map(|w| w.spec.name.clone())
            .collect();
        for name in due {
            let Some(i) = self.mounts.iter().position(|w| w.spec.name == name) else {
                continue;
            };
            if let Some(why) = &self.pressure {
                // Not now; look again in one interval.
                debug!("{name}: re-offload postponed: {why}");
                if let Some(f) = self.mounts[i].fallback.as_mut() {
                    f.reoffload_at = Some(now.saturating_add(self.interval.as_secs().max(1)));
                }
                continue;
            }
            if let Some(why) = self.retry_pending_writeback(i) {
                warn!(
                    mount = name.as_str(),
                    "{name}: not re-offloaded: the write-back of its last tmpfs is still pending ({why}); next try in {}s",
                    self.interval.as_secs().max(1)
                );
                if let Some(f) = self.mounts[i].fallback.as_mut() {
                    f.reoffload_at = Some(now.saturating_add(self.interval.as_secs().max(1)));
                }
                continue;
            }
            if let Some(why) = self.too_full_to_reoffload(i) {
                let w = &mut self.mounts[i];
                let again = w.spec.watchdog.reoffload_after.unwrap_or(600);
                warn!(
                    mount = name.as_str(),
                    "{name}: not re-offloaded: {why}; it would fall back again at once. Next try in {again}s"
                );
                if let Some(f) = w.fallback.as_mut() {
                    f.reoffload_at = Some(now.saturating_add(again));
                    let rec = f.clone();
                    let _ = self.state.set_fallback(&name, &rec);
                }
                continue;
            }
            info!(
                mount = name.as_str(),
                "{name}: re-offloading (reoffload_after elapsed)"
            );
            self.apply(std::slice::from_ref(&name), "re-offload");
            let w = &mut self.mounts[i];
            if w.root.is_some() {
                w.metrics.count("reoffload");
                info!(mount = name.as_str(), action = "reoffload", "{name}: back in RAM");
            } else if let Some(f) = w.fallback.as_mut() {
                let again = w.spec.watchdog.reoffload_after.unwrap_or(600);
                f.reoffload_at = Some(unix_now().saturating_add(again));
                warn!(
                    mount = name.as_str(),
                    "{name}: re-offload did not succeed; next try in {again}s"
                );
                let rec = f.clone();
                let _ = self.state.set_fallback(&name, &rec);
            }
        }
    }

    /// Retries the write-back of a tmpfs the fallback switched away from, if one
    /// is still held: why it is still pending, or `None` when nothing is.
    fn retry_pending_writeback(&mut self, i: usize) -> Option<String> {
        let name = self.mounts[i].spec.name.clone();
        let table = self.host.mounts().ok()?;
        if !sync::held(&table, &name, &self.state) {
            return None;
        }
        let _lock = match self.state.lock(self.opts.wait) {
            Ok(l) => l,
            Err(e) => return Some(e.to_string()),
        };
        let spec = self.mounts[i].spec.clone();
        match sync::finish_writeback(&spec, &self.host, &self.state, None, "retry") {
            Ok((s, _)) if s.result == SyncOutcome::Synced => {
                self.record_sync(i, &s);
                info!(mount = name.as_str(), "{name}: pending write-back done");
                None
            }
            Ok((s, _)) => {
                self.record_sync(i, &s);
                Some(s.reason.unwrap_or_default())
            }
            Err(e) => Some(format!("{e:#}")),
        }
    }

    /// Seeding mount `i` again would put it at or above `high` (its disk
    /// directory grew while it was on disk): why, or `None` when it fits.
    fn too_full_to_reoffload(&self, i: usize) -> Option<String> {
        let m = &self.mounts[i].spec;
        if m.seed != crate::spec::Seed::Copy {
            return None;
        }
        let need = match crate::copy::measure(&m.path) {
            Ok(n) => n,
            Err(e) => return Some(format!("cannot measure {}: {e}", m.path.display())),
        };
        let room = (m.size as f64 * m.watchdog.bytes.high / 100.0) as u64;
        let inode_room = m
            .inodes
            .map(|n| (n as f64 * m.watchdog.inodes.high / 100.0) as u64);
        if need.allocated >= room || inode_room.is_some_and(|r| need.inodes >= r) {
            return Some(format!(
                "its disk directory holds {} in {}, at or above high ({}% of {})",
                format_bytes(need.allocated),
                crate::plural::count(need.inodes, "file", "files"),
                m.watchdog.bytes.high,
                format_bytes(m.size)
            ));
        }
        None
    }

    /// observe → plan → execute for `names` (a subset of the spec), like
    /// `apply`. Sizes the agent grew (within `max_size`) are kept.
    fn apply(&mut self, names: &[String], why: &str) {
        if names.is_empty() {
            self.rescan();
            return;
        }
        let res = (|| -> Result<execute::ApplyReport> {
            let _busy = self.alive.busy();
            let _lock = self.state.lock(self.opts.wait)?;
            let world = observe::observe(&self.spec, &self.host, &self.state)?;
            let mut spec = self.spec.clone();
            for (m, o) in spec.mounts.iter_mut().zip(&world.mounts) {
                keep_growth(m, &o.at_path, self.page_size);
            }
            let full = plan::plan(&spec, &world, &self.state);
            let pick: Vec<usize> = (0..spec.mounts.len())
                .filter(|&k| names.contains(&spec.mounts[k].name))
                .collect();
            let sub_spec = Spec {
                mounts: pick.iter().map(|&k| spec.mounts[k].clone()).collect(),
                ..spec.clone()
            };
            let sub_plan = Plan {
                prepare: full.prepare.clone(),
                mounts: pick.iter().map(|&k| full.mounts[k].clone()).collect(),
                cleanup: full.cleanup.clone(),
                orphans: full.orphans.clone(),
            };
            execute::apply(
                &sub_spec,
                &sub_plan,
                &self.state,
                &execute::Options { progress: false },
            )
        })();
        match res {
            Ok(r) => {
                for s in &r.host_steps {
                    info!("{why}: host: {s}");
                }
                for m in &r.mounts {
                    let steps = if m.steps.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", m.steps.join("; "))
                    };
                    let reason = m.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
                    match m.result {
                        execute::Outcome::Unchanged => debug!("{why}: {} unchanged", m.name),
                        execute::Outcome::Changed => {
                            info!(mount = m.name.as_str(), "{why}: {} changed{steps}", m.name)
                        }
                        other => warn!(
                            mount = m.name.as_str(),
                            "{why}: {} {}{reason}",
                            m.name,
                            serde_json::to_value(other)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_default()
                        ),
                    }
                }
                for (name, path) in &r.orphans {
                    warn!("managed tmpfs `{name}` at {} is not in the spec; the agent leaves it alone (`tmpfsctl down SPEC {name}` takes it down)", path.display());
                }
            }
            Err(e) => error!("{why}: apply failed: {e:#}"),
        }
        self.rescan();
    }

    /// Stops watching mount `i` (before it goes away).
    fn unwatch(&mut self, i: usize) {
        self.mounts[i].scanned = None;
        let w = &mut self.mounts[i];
        if let Some(root) = w.root.take() {
            if let Some(wake) = &self.wake {
                wake.remove(root.as_fd());
            }
        }
        w.next_sync = None;
    }

    /// Re-reads the mount table: starts watching mounts that appeared,
    /// stops watching those that went, and refreshes each mount's state.
    fn rescan(&mut self) {
        self.last_rescan = Instant::now();
        let table = match self.host.mounts() {
            Ok(t) => t,
            Err(e) => {
                warn!("{e:#}");
                return;
            }
        };
        for i in 0..self.mounts.len() {
            let source = self.mounts[i].spec.source();
            let path = self.mounts[i].spec.path.clone();
            let top = table.top_at(&path).cloned();
            let ours = top.as_ref().filter(|e| backend::is_ours(e, &source));
            let dev = ours.map(|e| nix::sys::stat::makedev(e.dev.0 as u64, e.dev.1 as u64));
            let held = self.mounts[i].root.is_some();
            if held && Some(self.mounts[i].dev) != dev {
                info!(
                    mount = self.mounts[i].name(),
                    "{}: {} is no longer the watched tmpfs; stopped watching it",
                    self.mounts[i].name(),
                    path.display()
                );
                self.unwatch(i);
            }
            if self.mounts[i].root.is_none() {
                if let Some(dev) = dev {
                    self.watch(i, dev);
                }
            }
            let w = &mut self.mounts[i];
            if w.root.is_some() {
                if w.fallback.take().is_some() {
                    self.state.clear_fallback(&w.spec.name);
                }
                w.state = observe::classify(&Seen {
                    offloaded: true,
                    ..Seen::default()
                });
                continue;
            }
            w.usage = None;
            w.metrics.level = Level::Ok;
            w.fallback = self.state.fallback(&w.spec.name);
            w.state = observe::classify(&Seen {
                fallback: w.fallback.is_some(),
                degraded: self.state.degraded(&w.spec.name).is_some(),
                covered: top.is_some(),
                ..Seen::default()
            });
        }
    }

    /// Starts watching mount `i`, whose tmpfs (device `dev`) is at its path.
    fn watch(&mut self, i: usize, dev: u64) {
        let path = self.mounts[i].spec.path.clone();
        let root = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                warn!("{}: cannot open {}: {e}", self.mounts[i].name(), path.display());
                return;
            }
        };
        if root.metadata().map(|m| m.dev()).ok() != Some(dev) {
            return;
        }
        if let Some(wake) = &self.wake {
            if let Err(e) = wake.add(root.as_fd()) {
                warn!(
                    "{}: fanotify mark failed ({e}); this mount is polled every {}",
                    self.mounts[i].name(),
                    describe_ms(self.interval.as_millis() as u64)
                );
            }
        }
        let w = &mut self.mounts[i];
        w.usage = Usage::of_fd(&root).ok();
        w.root = Some(root);
        w.dev = dev;
        w.tracker = Tracker::default();
        if let Persist::Every(secs) = w.spec.persist {
            let last = self.state.last_sync(&w.spec.name).map(|r| r.at);
            let due = watchdog::sync_due_in(secs, last, unix_now());
            w.next_sync = Some(watchdog::deadline(Instant::now(), due));
        }
        info!(
            mount = w.name(),
            "{}: watching {} ({} of {} used)",
            w.spec.name,
            w.spec.path.display(),
            w.usage.map(|u| pct(u.used, u.size)).unwrap_or_default(),
            w.usage.map(|u| format_bytes(u.size)).unwrap_or_default()
        );
    }

    /// Re-reads the spec. An invalid spec is logged in full and the one in
    /// force stays; a valid one replaces it and the mounts that changed (or
    /// are new) are applied.
    fn reload(&mut self, why: &str, force: bool) {
        if let Err(e) = spec::only_root_can_change(&self.path) {
            error!("reload ({why}): {e}; the spec in force stays");
            *self.reloads.entry("refused").or_insert(0) += 1;
            return;
        }
        let text = match spec::read_text(&self.path) {
            Ok(t) => t,
            Err(e) => {
                error!("reload ({why}): {e}; the spec in force stays");
                *self.reloads.entry("failed").or_insert(0) += 1;
                return;
            }
        };
        if !force && text == self.spec_text {
            return;
        }
        let mem_total = match self.host.meminfo() {
            Ok(m) => m.mem_total,
            Err(e) => {
                error!("reload ({why}): {e:#}; the spec in force stays");
                *self.reloads.entry("failed").or_insert(0) += 1;
                return;
            }
        };
        let new = match spec::parse(&self.path, &text, mem_total) {
            Ok(s) => s,
            Err(e) => {
                error!(
                    "reload ({why}): {} is invalid; the spec in force stays:\n{e}",
                    self.path.display()
                );
                *self.reloads.entry("invalid").or_insert(0) += 1;
                self.spec_text = text;
                return;
            }
        };
        let changed: Vec<String> = new
            .mounts
            .iter()
            .filter(|m| self.spec.mount(&m.name) != Some(*m))
            .map(|m| m.name.clone())
            .collect();
        let mut old: Vec<Watched> = std::mem::take(&mut self.mounts);
        for w in &old {
            if new.mount(w.name()).is_none() {
                warn!(
                    mount = w.name(),
                    "{}: removed from the spec; the agent stops watching it and leaves it as it is (`tmpfsctl down` with the old spec takes it down)",
                    w.name()
                );
            }
        }
        for w in old.iter_mut().filter(|w| new.mount(w.name()).is_none()) {
            if let (Some(wake), Some(root)) = (&self.wake, w.root.take()) {
                wake.remove(root.as_fd());
            }
        }
        for m in &new.mounts {
            let w = match old.iter().position(|w| w.spec.name == m.name) {
                Some(k) => {
                    let mut w = old.swap_remove(k);
                    if w.spec != *m {
                        w.tracker = Tracker::default();
                        if w.fallback.take().is_some() {
                            self.state.clear_fallback(&m.name);
                        }
                        w.metrics.path = m.path.clone();
                        w.spec = m.clone();
                    }
                    w
                }
                None => Watched::new(m.clone(), &self.state),
            };
            self.mounts.push(w);
        }
        self.spec = new;
        self.spec_text = text;
        self.settings();
        *self.reloads.entry("ok").or_insert(0) += 1;
        info!(
            "reloaded {} ({why}): {}, {} changed or new{}",
            self.path.display(),
            crate::plural::count(self.mounts.len(), "mount", "mounts"),
            changed.len(),
            if changed.is_empty() {
                String::new()
            } else {
                format!(" ({})", changed.join(", "))
            }
        );
        // A mount whose path changed is still mounted at the old path: plan
        // reports it as blocked (take it down with the old spec first).
        self.apply(&changed, "reload");
        self.check(true);
    }

    /// SIGTERM/SIGINT: write persisted mounts back, then exit.
    fn stop(&mut self, sig: Signal) -> ExitCode {
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
        self.state.clear_agent_status(std::process::id());
        info!("{sig}: stopping");
        let _busy = self.alive.busy();
        let persisted: Vec<String> = self
            .mounts
            .iter()
            .filter(|w| w.root.is_some() && w.spec.persist != Persist::None)
            .map(|w| w.spec.name.clone())
            .collect();
        for i in 0..self.mounts.len() {
            self.unwatch(i);
        }
        let mut code = ExitCode::Ok;
        if !persisted.is_empty() {
            match self.state.lock(self.opts.wait) {
                Ok(_lock) => match sync::sync(&self.spec, &persisted, &self.host, &self.state, "stop") {
                    Ok(results) => {
                        for s in &results {
                            if let Some(i) = self.mounts.iter().position(|w| w.spec.name == s.name) {
                                self.record_sync(i, s);
                            }
                            if s.result == SyncOutcome::Failed {
                                code = ExitCode::Failed;
                            }
                        }
                    }
                    Err(e) => {
                        error!("write-back at stop failed: {e:#}");
                        code = ExitCode::Failed;
                    }
                },
                // Another tmpfsctl (typically `down` at shutdown) holds the
                // lock and writes back itself; nothing is lost: the data stays
                // in the tmpfs.
                Err(e) => warn!("write-back at stop skipped: {e}"),
            }
        }
        self.publish();
        info!("stopped");
        code
    }

    fn status_line(&self) -> String {
        let count = |s: MountState| self.mounts.iter().filter(|w| w.state == s).count();
        let mut parts = vec![format!("{} offloaded", count(MountState::Offloaded))];
        for s in [
            MountState::Fallback,
            MountState::Degraded,
            MountState::Absent,
            MountState::Foreign,
        ] {
            let n = count(s);
            if n > 0 {
                parts.push(format!("{n} {}", s.name()));
            }
        }
        let fullest = self
            .mounts
            .iter()
            .filter(|w| w.root.is_some())
            .filter_map(|w| w.usage.map(|u| (u.used_pct().max(u.inodes_pct()), w.name())))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let mut s = format!(
            "{}: {}",
            crate::plural::count(self.mounts.len(), "mount", "mounts"),
            parts.join(", ")
        );
        if let Some((p, n)) = fullest {
            s.push_str(&format!("; fullest {n} {p:.0}%"));
        }
        s.push_str(match &self.pressure {
            Some(_) => "; memory pressure",
            None => "; memory ok",
        });
        s
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            mounts: self
                .mounts
                .iter()
                .map(|w| {
                    let mut m = w.metrics.clone();
                    m.state = w.state;
                    m.usage = w.root.as_ref().and(w.usage);
                    m.evict_exhausted = w.tracker.exhausted;
                    m.persist_every = match w.spec.persist {
                        Persist::Every(secs) => Some(secs),
                        _ => None,
                    };
                    if w.root.is_none() {
                        m.level = Level::Ok;
                    }
                    m
                })
                .collect(),
            mem: self.mem,
            under_pressure: self.pressure.is_some(),
            fanotify: self.wake.is_some(),
            reloads: self.reloads.clone(),
            start_time: self.start_time,
        }
    }

    /// What makes the metrics file worth rewriting at once: states, levels,
    /// sizes, counters, reloads, pressure. Usage and memory figures alone are
    /// refreshed every [`METRICS_REFRESH`].
    fn signature(&self) -> Vec<u64> {
        let mut sig = vec![u64::from(self.pressure.is_some()), u64::from(self.wake.is_some())];
        sig.extend(self.reloads.values());
        for w in &self.mounts {
            sig.push(w.state as u64);
            sig.push(w.tracker.level as u64);
            sig.push(u64::from(w.tracker.exhausted));
            sig.push(w.usage.map(|u| u.size ^ (u.inodes << 1)).unwrap_or(0));
            sig.extend(w.metrics.actions.values());
            sig.extend([
                w.metrics.syncs_ok,
                w.metrics.syncs_failed,
                w.metrics.evicted_files,
            ]);
        }
        sig
    }

    /// Writes metrics when something changed, and every [`METRICS_REFRESH`]
    /// for the usage and memory figures; updates the systemd status line.
    /// What `tmpfsctl status` shows of this agent.
    fn agent_status(&self) -> AgentStatus {
        let now_ms = self.alive.now_ms();
        let mounts = self
            .mounts
            .iter()
            .map(|w| {
                let t = &w.tracker;
                let exhausted = t.exhausted.then(|| {
                    format!(
                        "usage stays at or above high and [{}] can free nothing now (files open for writing, or none left); tried again in {}, sooner when usage moves",
                        w.spec.watchdog.actions.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "),
                        describe_ms(t.retry_at_ms.saturating_sub(now_ms).div_ceil(1000) * 1000)
                    )
                });
                let m = &w.metrics;
                (
                    w.spec.name.clone(),
                    AgentMount {
                        level: t.level.name().to_string(),
                        last_action: m.last_action.map(|(action, at)| AgentAction {
                            action: action.to_string(),
                            at,
                            detail: match action {
                                "evict" => format!(
                                    "{} evicted so far",
                                    crate::plural::count(m.evicted_files, "file", "files")
                                ),
                                _ => String::new(),
                            },
                        }),
                        evicted_files: m.evicted_files,
                        evicted_bytes: m.evicted_bytes,
                        exhausted,
                    },
                )
            })
            .collect();
        AgentStatus {
            pid: std::process::id(),
            since: self.start_time,
            updated: unix_now(),
            mounts,
        }
    }

    fn publish(&mut self) {
        // Rebuilt only when something it shows changed: an idle agent does not
        // format and compare them every second.
        let mut sig = self.signature();
        sig.extend(self.mounts.iter().map(|w| u64::from(w.tracker.exhausted)));
        sig.extend(self.mounts.iter().filter_map(|w| w.usage.map(|u| u.used >> 20)));
        if self.published_sig.as_ref() != Some(&sig) {
            self.published_sig = Some(sig);
            let status = self.status_line();
            if status != self.status_last {
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Status(&status)]);
                self.status_last = status;
            }
            let st = self.agent_status();
            let key = serde_json::to_string(&st.mounts).unwrap_or_default();
            if self.agent_status_last.as_ref() != Some(&key) {
                if let Err(e) = self.state.write_agent_status(&st) {
                    debug!("{e:#}");
                }
                self.agent_status_last = Some(key);
            }
        }
        let Some(path) = self.metrics_path.clone() else {
            return;
        };
        let sig = self.signature();
        let due = match &self.metrics_last {
            None => true,
            Some((last, at)) => *last != sig || at.elapsed() >= METRICS_REFRESH,
        };
        if !due {
            return;
        }
        let text = metrics::render(&self.snapshot(), Some(unix_now()));
        if let Err(e) = metrics::write(&path, &text) {
            if self.metrics_last.as_ref().is_none_or(|(b, _)| !b.is_empty()) {
                warn!("cannot write metrics to {}: {e}", path.display());
            }
            // Remember the failure (empty signature) so it is logged once,
            // and retried at the next refresh.
            self.metrics_last = Some((Vec::new(), Instant::now()));
            return;
        }
        self.metrics_last = Some((sig, Instant::now()));
    }
}

/// The tmpfs at `path` is still the one whose root is on `dev`.
fn still_there(path: &Path, dev: u64) -> bool {
    std::fs::metadata(path).map(|m| m.dev() == dev).unwrap_or(false)
}

/// A mount the agent grew keeps its size across the agent's own applies:
/// within `max_size`, the live size counts as the spec's.
fn keep_growth(m: &mut MountSpec, at: &AtPath, page: u64) {
    let AtPath::Ours(live) = at else { return };
    let Some(max) = m.watchdog.max_size else { return };
    if !m.watchdog.actions.contains(&Action::Grow) {
        return;
    }
    let max = max.div_ceil(page) * page;
    let live = live.usage();
    if live.size > m.size && live.size <= max {
        m.size = live.size;
        if let Some(n) = m.inodes {
            m.inodes = Some(live.inodes.max(n));
        }
    }
}

fn target_usage(t: &watchdog::EvictTarget) -> Usage {
    Usage {
        size: 0,
        used: t.bytes,
        inodes: 0,
        inodes_used: t.inodes,
    }
}

/// Who keeps the files of a lazily detached tmpfs open, with the verb:
/// `squid (768) keeps its`, `a (1), b (2) keep their`.
fn holders_keep(holders: &[crate::host::procs::Holder]) -> String {
    let names: Vec<String> = holders
        .iter()
        .map(|h| format!("{} ({})", h.command.to_string_lossy(), h.pid))
        .collect();
    match names.as_slice() {
        [] => "processes keep their".into(),
        [one] => format!("{one} keeps its"),
        many => format!("{} keep their", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_of_a_detached_mount_read_right() {
        use crate::host::procs::Holder;
        let h = |command: &str, pid| Holder {
            pid,
            command: command.into(),
            uses: 1,
        };
        assert_eq!(holders_keep(&[]), "processes keep their");
        assert_eq!(holders_keep(&[h("squid", 768)]), "squid (768) keeps its");
        assert_eq!(holders_keep(&[h("a", 1), h("b", 2)]), "a (1), b (2) keep their");
    }

    #[test]
    fn psi_some_avg10() {
        let t = "some avg10=12.34 avg60=1.00 avg300=0.00 total=123\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=1\n";
        assert_eq!(parse_psi(t), Some(12.34));
        assert_eq!(parse_psi("full avg10=1.00\n"), None);
        assert_eq!(parse_psi(""), None);
    }

    #[test]
    fn fallback_records_count_only_with_the_degraded_marker() {
        let d = tempfile::tempdir().unwrap();
        let st = State::new(d.path());
        st.ensure_dirs().unwrap();
        let rec = FallbackRecord {
            at: 1,
            reason: "high".into(),
            reoffload_at: Some(61),
        };
        st.set_fallback("a", &rec).unwrap();
        assert_eq!(st.fallback("a"), None, "apply or down cleared the marker");
        st.set_degraded("a", "fell back").unwrap();
        assert_eq!(st.fallback("a"), Some(rec));
        st.clear_fallback("a");
        assert_eq!(st.fallback("a"), None);
    }

    #[test]
    fn growth_within_max_size_is_kept_by_the_agents_apply() {
        use crate::backend::{tmpfs, Live};
        let mut m = crate::spec::MountSpec {
            name: "c".into(),
            path: "/x".into(),
            size: 100 << 20,
            inodes: Some(1000),
            owner: None,
            group: None,
            mode: None,
            create: false,
            takeover: false,
            flags: Default::default(),
            huge: crate::spec::Huge::Never,
            noswap: false,
            seed: crate::spec::Seed::Copy,
            persist: Persist::None,
            on_failure: crate::spec::OnFailure::KeepDisk,
            before: vec![],
            watchdog: crate::spec::Watchdog {
                actions: vec![Action::Grow],
                max_size: Some(200 << 20),
                ..Default::default()
            },
        };
        let live = |size: u64| {
            AtPath::Ours(Live::Tmpfs(tmpfs::Live {
                dev: (0, 1),
                size,
                nr_inodes: 1500,
                huge: None,
                noswap: false,
                flags: Default::default(),
                root: mount::RootAttrs {
                    uid: 0,
                    gid: 0,
                    mode: 0o755,
                },
                usage: Usage {
                    size,
                    used: 0,
                    inodes: 1500,
                    inodes_used: 0,
                },
            }))
        };
        let mut grown = m.clone();
        keep_growth(&mut grown, &live(150 << 20), 4096);
        assert_eq!((grown.size, grown.inodes), (150 << 20, Some(1500)));
        let mut beyond = m.clone();
        keep_growth(&mut beyond, &live(300 << 20), 4096);
        assert_eq!(beyond.size, 100 << 20, "beyond max_size: back to the spec");
        m.watchdog.actions = vec![Action::Evict];
        let mut no_grow = m.clone();
        keep_growth(&mut no_grow, &live(150 << 20), 4096);
        assert_eq!(no_grow.size, 100 << 20);
    }
}
