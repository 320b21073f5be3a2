//! `tmpfsctl agent SPEC`: one long-running process that keeps the spec's
//! mounts in RAM safely.
//!
//! - Converges the host to the spec at start (observe → plan → execute, as
//!   `apply`), then watches every offloaded mount through a held descriptor
//!   of its root: `fstatvfs` every `interval`, and early on fanotify write
//!   events (`wake`).
//! - Per mount, the pure decisions of `decide` pick warn / evict / grow /
//!   fallback; the memory-pressure guard picks evict / shrink / fallback
//!   across mounts. `check` measures and asks; `actions` carries the
//!   decisions out: eviction in `evict`, remounts through `backend` with
//!   every option, fallback through `down::down_one` (the same decision,
//!   write-back, detach and clean-up as `tmpfsctl down`); `worker` runs the
//!   write-backs on a thread of their own, so the checks go on meanwhile.
//! - `mounts` follows the mount table and the spec; `publish` writes what
//!   the agent shows (status line, `metrics`, what `tmpfsctl status` reads);
//!   the loop itself is here.
//! - Writes persisted mounts back every `persist: every <d>` and on SIGTERM.
//! - Reloads the spec on SIGHUP and when the file changes; an invalid spec is
//!   logged and the old one stays in force.
//! - Speaks sd_notify (READY, STATUS, WATCHDOG, STOPPING), logs to the
//!   journal under systemd, and writes Prometheus metrics.
//!
//! Actions that change mounts or the disk copy (grow, shrink, fallback,
//! re-offload, write-back, apply) take the state lock like the commands do;
//! eviction (volatile caches only) does not, so it is never held up.

mod actions;
mod check;
pub mod decide;
mod evict;
pub mod metrics;
mod mounts;
mod publish;
mod quiet;
mod specwatch;
mod wake;
mod worker;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use tracing::{debug, error, info, warn};

use crate::backend;
use crate::down::{self, DownOutcome};
use crate::error::ExitCode;
use crate::execute;
use crate::execute::takedown::Handoff;
use crate::host::usage::Usage;
use crate::host::Host;
use crate::mount;
use crate::observe::{self, AtPath, MountState, StateFacts};
use crate::plan::{self, Plan};
use crate::spec::size::format_bytes;
use crate::spec::{self, Action, MetricsTarget, MountSpec, Persist, PressureAction, Spec};
use crate::state::{unix_now, AgentAction, AgentMount, AgentStatus, FallbackRecord, State};
use crate::sync::{self, SyncOutcome, SyncResult};
use decide::{Act, Budget, Guard, Level, Limits, MemView, PressureView, Tracker};
use metrics::{MountMetrics, Snapshot};
use worker::{Finished, Job, Outcome, Task, Worker};

pub use evict::{fdinfo_flags, open_for_write, Evicted};

/// Command-line settings; `None` leaves the spec's `agent:` value.
#[derive(Debug, Clone)]
pub struct AgentOptions {
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

/// How soon devices a take-out left open are tried again, at first and at most
/// (see [`Agent::release_devices`]).
const RELEASE_RETRY: Duration = Duration::from_secs(2);
const RELEASE_RETRY_MAX: Duration = Duration::from_secs(60);

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
    /// Which mount the held root is: mountinfo's id and device.
    mount: (u32, (u32, u32)),
    /// N of the /dev/zramN under a zram mount.
    zram: Option<u32>,
    usage: Option<Usage>,
    /// The RAM a zram device takes, measured with `usage` when the watchdog
    /// has `memory` thresholds (see [`Agent::measure_memory`]).
    memory: Option<u64>,
    /// Bytes used right after the agent last wrote the zram mount's dirty
    /// pages to its device (syncfs): what was written since may still be
    /// uncompressed in the page cache, not yet in the device's RAM figure.
    synced_used: Option<u64>,
    tracker: Tracker,
    /// What changed in a persisted tmpfs, for its write-backs (see [`crate::dirty`]).
    changes: Option<crate::dirty::Running>,
    state: MountState,
    metrics: MountMetrics,
    fallback: Option<FallbackRecord>,
    next_sync: Option<Instant>,
    /// Files the last eviction deleted.
    last_evicted: u64,
    /// The last eviction's scan of the tree, kept for the next ones.
    scanned: Option<evict::Scanned>,
    quiet: quiet::Quiet,
    /// Its writes wake the agent (a fanotify mark; an overlay takes none): else it
    /// is measured every round.
    marked: bool,
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
            mount: (0, (0, 0)),
            zram: None,
            usage: None,
            memory: None,
            synced_used: None,
            tracker: Tracker::default(),
            changes: None,
            state: MountState::Absent,
            metrics,
            next_sync: None,
            last_evicted: 0,
            scanned: None,
            quiet: quiet::Quiet::default(),
            marked: false,
        }
    }

    fn name(&self) -> &str {
        &self.spec.name
    }

    /// Watched without a fanotify mark: measured every round.
    fn polled(&self) -> bool {
        self.root.is_some() && !self.marked
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
    opts: AgentOptions,
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
    /// When to try again to free the devices of mounts taken out (see
    /// [`Agent::release_devices`]); none while none is left.
    release_at: Option<Instant>,
    /// The wait before the next try while a device stays open.
    release_every: Duration,
    /// When to look next for write-backs left pending by a take-out that did not
    /// finish (see [`Agent::pending_writebacks`]).
    pending_at: Option<Instant>,
    /// Set when an action found the state lock held by another process (see
    /// [`Agent::lock_now`]); taken by the check that ran it.
    lock_busy: bool,
    /// Runs the write-backs (see [`worker`]).
    worker: Worker,
    /// Mounts whose `apply` (a reload's) waits for the worker to be idle.
    apply_waiting: Vec<String>,
}

/// The state lock for an action of the loop: its own, or the one the agent holds
/// for its worker.
enum Lock {
    Own(nix::fcntl::Flock<File>),
    Worker,
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

pub fn run(spec_path: &Path, host: Host, state: State, opts: AgentOptions) -> Result<ExitCode> {
    let psi_trigger = psi_trigger(&host);
    crate::logging::init("info", true);
    raise_priority();
    spec::only_root_can_change(spec_path)?;
    let spec_text = spec::read_text(spec_path)?;
    let mem_total = host.meminfo()?.mem_total;
    let spec = spec::parse(spec_path, &spec_text, mem_total).map_err(spec::SpecLoadError::Invalid)?;
    let Some(_one_agent) = state.agent_lock()? else {
        let running = state
            .agent_status()
            .map_or(String::new(), |st| format!(" (pid {})", st.pid));
        error!(
            "another agent runs on the state directory {}{running}; two would act on the same mounts. Stop it first, or give this one its own --state-dir",
            state.dir().display()
        );
        return Ok(ExitCode::Busy);
    };

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

    let spec_watch = specwatch::SpecWatch::new(spec_path);
    let mountinfo = File::open(host.proc_path("self/mountinfo")).ok();

    let wake = open_wake(&opts, &spec);
    let page_size = crate::host::page_size();
    let mounts = spec
        .mounts
        .iter()
        .map(|m| Watched::new(state.as_mounted(m), &state))
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
        // Devices an earlier agent's take-out left open may be free by now.
        release_at: Some(Instant::now()),
        release_every: RELEASE_RETRY,
        // A take-out an earlier agent (or `down`) was killed in may have left one.
        pending_at: Some(Instant::now()),
        lock_busy: false,
        worker: Worker::new()?,
        apply_waiting: Vec::new(),
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

    let names = agent.to_offload_at_start();
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
    Ok(agent.main_loop(&signals, spec_watch, mountinfo.as_ref(), watchdog_period))
}

/// fanotify write events wake the usage checks, unless disabled or unavailable.
fn open_wake(opts: &AgentOptions, spec: &Spec) -> Option<wake::Wake> {
    if !opts.fanotify {
        info!("fanotify disabled (--no-fanotify); polling usage only");
        return None;
    }
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
}

impl Agent {
    /// The mounts the start applies: all but those that fell back earlier
    /// and are not due to be offloaded again (logged).
    fn to_offload_at_start(&self) -> Vec<String> {
        let names: Vec<String> = self
            .mounts
            .iter()
            .filter(|w| {
                w.fallback
                    .as_ref()
                    .is_none_or(|f| f.reoffload_at.is_some_and(|t| t <= unix_now()))
            })
            .map(|w| w.spec.name.clone())
            .collect();
        for w in self.mounts.iter().filter(|w| w.fallback.is_some()) {
            if !names.contains(&w.spec.name) {
                info!(
                    mount = w.name(),
                    "{}: stays on its disk directory (fell back earlier: {})",
                    w.name(),
                    w.fallback.as_ref().map(|f| f.reason.as_str()).unwrap_or("")
                );
            }
        }
        names
    }
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
        mut spec_watch: Option<specwatch::SpecWatch>,
        mountinfo: Option<&File>,
        watchdog_period: Option<Duration>,
    ) -> ExitCode {
        let mut next_check = Instant::now() + self.interval;
        let mut wake_armed_at = Instant::now();
        let mut reload_at: Option<Instant> = None;
        loop {
            self.alive.beat();
            let now = Instant::now();
            let wake_open = self.wake.is_some() && now >= wake_armed_at;
            let deadline = self.deadline(
                now,
                next_check,
                reload_at,
                watchdog_period,
                (!wake_open).then_some(wake_armed_at),
            );
            let timeout = deadline.saturating_duration_since(now);
            let timeout = PollTimeout::try_from(timeout.as_millis().min(i32::MAX as u128) as i32)
                .unwrap_or(PollTimeout::MAX);

            let mut fds = vec![PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
            let spec_at = spec_watch.as_ref().map(|w| {
                fds.push(PollFd::new(w.fd(), PollFlags::POLLIN));
                fds.len() - 1
            });
            let mi_at = mountinfo.map(|f| {
                fds.push(PollFd::new(f.as_fd(), PollFlags::POLLPRI));
                fds.len() - 1
            });
            let psi_at = self.psi_trigger.as_ref().map(|f| {
                fds.push(PollFd::new(f.as_fd(), PollFlags::POLLPRI));
                fds.len() - 1
            });
            let worker_at = {
                fds.push(PollFd::new(self.worker.fd(), PollFlags::POLLIN));
                fds.len() - 1
            };
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
            let reload_wake = spec_at.is_some_and(ready);
            let mi = mi_at.is_some_and(ready);
            let woke = wake_at.is_some_and(ready);
            let psi = psi_at.is_some_and(ready);
            let worker_ended = ready(worker_at);
            drop(fds);
            if worker_ended {
                self.reap_writebacks();
            }

            // Watched again after each reload and timed rescan: the directories the spec's
            // path leads through change (a symlink swapped, as for a Kubernetes
            // ConfigMap, or a directory renamed away and made again), and a watch of
            // the old one saw no later change (a hunting helper's probes).
            let mut watch_again = false;
            if sig {
                while let Ok(Some(si)) = signals.read_signal() {
                    match Signal::try_from(si.ssi_signo as i32) {
                        Ok(Signal::SIGHUP) => {
                            self.reload("SIGHUP", true);
                            watch_again = true;
                        }
                        Ok(s) => return self.stop(s),
                        Err(_) => {}
                    }
                }
            }
            if reload_wake && spec_watch.as_ref().is_some_and(|w| w.changed()) {
                reload_at = Some(Instant::now() + RELOAD_SETTLE);
            }
            if reload_at.is_some_and(|t| Instant::now() >= t) {
                reload_at = None;
                self.reload("spec file changed", false);
                watch_again = true;
            }
            let timed = self.last_rescan.elapsed() >= RESCAN_EVERY;
            if mi || timed {
                self.rescan();
                // Not at every change of the mount table: a host starting
                // containers changes it many times a second.
                watch_again |= timed;
            }
            if watch_again {
                if let Some(w) = specwatch::SpecWatch::new(&self.path) {
                    spec_watch = Some(w);
                }
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
            self.pending_writebacks();
            self.reoffloads();
            self.release_devices();
            self.publish();
        }
    }

    /// When the loop must wake at the latest: the next check, write-back,
    /// reload, re-offload, device release, watchdog ping, metrics refresh, or the end of the
    /// fanotify gap (`wake_gap_end`, while fanotify is closed).
    fn deadline(
        &self,
        now: Instant,
        next_check: Instant,
        reload_at: Option<Instant>,
        watchdog_period: Option<Duration>,
        wake_gap_end: Option<Instant>,
    ) -> Instant {
        let mut deadline = next_check.min(now + METRICS_REFRESH);
        let syncs = self.mounts.iter().filter_map(|w| w.next_sync);
        for t in syncs
            .chain(reload_at)
            .chain(self.next_reoffload())
            .chain(self.release_at)
            .chain(self.pending_at)
        {
            deadline = deadline.min(t);
        }
        if let Some(p) = watchdog_period {
            deadline = deadline.min(now + p / 3);
        }
        if let (Some(t), Some(_)) = (wake_gap_end, &self.wake) {
            deadline = deadline.min(t);
        }
        deadline
    }

    /// SIGTERM/SIGINT: write persisted mounts back, then exit.
    fn stop(&mut self, sig: Signal) -> ExitCode {
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
        self.state.clear_agent_status(std::process::id());
        info!("{sig}: stopping");
        let _busy = self.alive.busy();
        // The write-backs under way, and those queued, end first; one that failed
        // is left held for `down` (the apply unit's stop) and the next agent.
        let mut failed = false;
        for f in self.worker.finish_all() {
            failed |= !f.succeeded();
            self.writeback_done(f);
        }
        let persisted: Vec<String> = self
            .mounts
            .iter()
            .filter(|w| w.root.is_some() && w.spec.persist != Persist::None)
            .map(|w| w.spec.name.clone())
            .collect();
        // The change trackers answer the last write-backs, then stop.
        let _changes: Vec<_> = self.mounts.iter_mut().map(|w| w.changes.take()).collect();
        for i in 0..self.mounts.len() {
            self.unwatch(i);
        }
        let mut code = if failed { ExitCode::Failed } else { ExitCode::Ok };
        if !persisted.is_empty() {
            match self.state.lock(self.opts.wait) {
                Ok(_lock) => match sync::sync(&self.spec, &persisted, &self.host, &self.state, "stop", false)
                {
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

fn target_usage(t: &decide::EvictTarget) -> Usage {
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
mod tests;
