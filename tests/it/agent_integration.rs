//! `tmpfsctl agent` against the real kernel: each test runs the agent as a
//! child process in the test thread's private mount namespace (see
//! common/mod.rs), drives usage with real writes, and waits (generous
//! deadlines, no timing assertions) until the metrics file shows the
//! expected state. Every metrics file is checked with `promtool check
//! metrics` when promtool is installed (required when CI is set).

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{self, Run, Sandbox};
use crate::common_copy::contents;
use tmpfsctl::host::usage::Usage;

const DEADLINE: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

/// Samples of a metrics file, keyed by the series as written
/// (`name{label="v",...}`).
#[derive(Debug, Default, Clone)]
pub(crate) struct Metrics(HashMap<String, f64>);

impl Metrics {
    fn parse(text: &str) -> Metrics {
        Metrics(
            text.lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .filter_map(|l| {
                    let (k, v) = l.rsplit_once(' ')?;
                    Some((k.to_string(), v.parse().ok()?))
                })
                .collect(),
        )
    }

    pub(crate) fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(f64::NAN)
    }

    pub(crate) fn state(&self, mount: &str) -> Option<&str> {
        ["offloaded", "fallback", "degraded", "absent", "foreign"]
            .into_iter()
            .find(|s| self.get(&format!("tmpfsctl_mount_state{{name=\"{mount}\",state=\"{s}\"}}")) == 1.0)
    }

    pub(crate) fn actions(&self, mount: &str, action: &str) -> f64 {
        self.get(&format!(
            "tmpfsctl_mount_actions_total{{name=\"{mount}\",action=\"{action}\"}}"
        ))
    }

    pub(crate) fn used(&self, mount: &str) -> f64 {
        self.get(&format!("tmpfsctl_mount_used_bytes{{name=\"{mount}\"}}"))
    }

    fn size(&self, mount: &str) -> f64 {
        self.get(&format!("tmpfsctl_mount_size_bytes{{name=\"{mount}\"}}"))
    }
}

/// A running agent; killed (and its log shown) if the test ends first.
pub(crate) struct Agent {
    child: Child,
    log: PathBuf,
    metrics: PathBuf,
}

impl Agent {
    pub(crate) fn start(sb: &Sandbox, spec: &Path, extra: &[&str], env: &[(&str, &Path)]) -> Agent {
        let mut c = sb.cmd();
        for (k, v) in env {
            c.env(k, v);
        }
        Agent::spawn(sb, spec, extra, c)
    }

    /// Started from the command `c` (its environment set by the caller).
    fn start_with(sb: &Sandbox, spec: &Path, c: std::process::Command) -> Agent {
        Agent::spawn(sb, spec, &[], c)
    }

    fn spawn(sb: &Sandbox, spec: &Path, extra: &[&str], mut c: std::process::Command) -> Agent {
        let log = sb.path("agent.log");
        let metrics = sb.path("metrics.prom");
        c.arg("agent")
            .arg(spec)
            .arg("--metrics")
            .arg(&metrics)
            .args(["--interval", "200ms"])
            .args(extra)
            .env("TMPFSCTL_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        let child = c.spawn().expect("spawn tmpfsctl agent");
        Agent { child, log, metrics }
    }

    pub(crate) fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn metrics(&self) -> Metrics {
        Metrics::parse(&fs::read_to_string(&self.metrics).unwrap_or_default())
    }

    /// Polls the metrics file until `cond` holds.
    pub(crate) fn wait_for(&mut self, what: &str, cond: impl Fn(&Metrics) -> bool) -> Metrics {
        let start = Instant::now();
        loop {
            let m = self.metrics();
            if cond(&m) {
                return m;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "agent exited ({st}) while waiting for {what}\n--- log\n{}",
                    self.log()
                );
            }
            if start.elapsed() > DEADLINE {
                panic!(
                    "timed out waiting for {what}\n--- metrics\n{}\n--- log\n{}",
                    fs::read_to_string(&self.metrics).unwrap_or_default(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_log(&mut self, what: &str) {
        let start = Instant::now();
        while !self.log().contains(what) {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "agent exited ({st}) while waiting for {what:?} in its log\n{}",
                    self.log()
                );
            }
            assert!(
                start.elapsed() < DEADLINE,
                "timed out waiting for {what:?} in the log\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Waits for the agent to end by itself; its exit code (`None`: a signal).
    fn wait_exit(&mut self) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the agent did not end\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then the exit status (within the deadline).
    pub(crate) fn stop(&mut self) -> i32 {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                promtool_check(&self.metrics);
                return st.code().unwrap_or(-1);
            }
            assert!(start.elapsed() < DEADLINE, "agent did not stop\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            if std::thread::panicking() {
                eprintln!("--- agent log\n{}", self.log());
            }
        }
    }
}

/// `promtool check metrics` on a metrics file: the exposition format and
/// Prometheus' naming rules.
fn promtool_check(path: &Path) {
    let Ok(text) = fs::read(path) else { return };
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            common::ci::missing(
                &format!("promtool, to check the metrics format ({e})"),
                "apt-get install prometheus",
            );
            return;
        }
    };
    child.stdin.take().unwrap().write_all(&text).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- file\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&text)
    );
}

fn spec_one(sb: &Sandbox, cache: &Path, extra: &str) -> PathBuf {
    sb.one_mount_spec("c", cache, "8MiB", extra)
}

/// Writes `n` files of `size` bytes, each a little older than the next, so
/// least-recently-used order is the order written.
pub(crate) fn fill(dir: &Path, prefix: &str, n: usize, size: usize) {
    for i in 0..n {
        // Times set through the open file: a fallback that switches the path
        // to the disk directory between the write and a second lookup would
        // make the name vanish under the test.
        let mut f = fs::File::create(dir.join(format!("{prefix}{i:03}"))).unwrap();
        std::io::Write::write_all(&mut f, &vec![0x5a; size]).unwrap();
        let t = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000 + i as u64);
        f.set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
            .unwrap();
    }
}

/// Writes 64 files of 256 KiB (twice an 8 MiB mount's size) into `dir`, one every
/// 20 ms: the writes that found it full.
pub(crate) fn fill_twice_over(dir: &Path) -> usize {
    let chunk = vec![0x42u8; 256 << 10];
    let mut enospc = 0;
    for i in 0..64 {
        if let Err(e) = fs::write(dir.join(format!("obj{i:03}")), &chunk) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            enospc += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    enospc
}

pub(crate) fn wait_offloaded(agent: &mut Agent, name: &str) -> Metrics {
    agent.wait_for(&format!("{name} offloaded"), |m| {
        m.state(name) == Some("offloaded")
    })
}

#[test]
fn evict_deletes_oldest_files_down_to_low() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    watchdog: { warn: 50%, high: 80%, low: 40%, action: evict }\n",
    );
    // 7 MiB in 1 MiB files crosses 80% of 8 MiB. Written before the start,
    // so the seed brings them all at once: an eviction while the test was
    // still writing could leave usage between low and high, where the agent
    // rightly does nothing more.
    fill(&cache, "f", 7, MIB as usize);
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    let m = agent.wait_for("an eviction", |m| m.actions("c", "evict") >= 1.0);
    let u = Usage::of(&cache).unwrap();
    assert!(
        u.used <= 8 * MIB * 40 / 100,
        "usage {u:?} not at or below low\n{}",
        agent.log()
    );
    assert!(m.used("c") <= (8 * MIB * 40 / 100) as f64);
    // Least recently used first: the newest files are the ones left.
    assert!(cache.join("f006").exists() && cache.join("f005").exists());
    assert!(!cache.join("f000").exists() && !cache.join("f001").exists());
    assert_eq!(m.state("c"), Some("offloaded"));
    // At `high`, or before it for a writer this fast.
    let log = agent.log();
    assert!(
        log.contains("-> high") || log.contains("(filling fast: high within"),
        "{log}"
    );
    assert_eq!(agent.stop(), 0);
}

#[test]
fn evict_by_polling_alone_and_by_inodes() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    inodes: 200\n    watchdog: { high: 90%, low: 50%, action: evict }\n",
    );
    let mut agent = Agent::start(&sb, &spec, &["--no-fanotify"], &[]);
    wait_offloaded(&mut agent, "c");
    assert!(agent.log().contains("polling usage only"));
    assert_eq!(agent.metrics().get("tmpfsctl_agent_fanotify"), 0.0);
    // Small files: bytes stay low, inodes reach 90% of 200 with the last one.
    let mut n = 0;
    while Usage::of(&cache).unwrap().inodes_pct() < 90.0 {
        fill(&cache, &format!("i{n:03}-"), 1, 10);
        n += 1;
    }
    agent.wait_for("an eviction", |m| m.actions("c", "evict") >= 1.0);
    let u = Usage::of(&cache).unwrap();
    assert!(u.inodes_used <= 100, "{u:?}\n{}", agent.log());
    assert_eq!(agent.stop(), 0);
}

#[test]
fn evict_keeps_files_open_for_writing() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    watchdog: { high: 80%, low: 20%, action: evict }\n",
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    // The oldest file is held open for writing by another process.
    fill(&cache, "f", 1, MIB as usize);
    let mut writer = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("exec 3>>{}/f000; exec sleep 600", cache.display()))
        .spawn()
        .unwrap();
    // Open before the cache fills (a loaded machine starts a shell slowly).
    let open = format!("/proc/{}/fd/3", writer.id());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fs::read_link(&open).ok() != Some(cache.join("f000")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer never opened f000"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    fill(&cache, "g", 6, MIB as usize);
    agent.wait_for("an eviction", |m| m.actions("c", "evict") >= 1.0);
    // Checked while it is still open: once closed, a later eviction may take it.
    let kept = cache.join("f000").exists();
    let _ = writer.kill();
    let _ = writer.wait();
    assert!(kept, "a file open for writing is never evicted\n{}", agent.log());
    // One file or more: a file still being filled may be open too.
    let log = agent.log();
    assert!(
        log.contains("1 file open for writing was kept") || log.contains("files open for writing were kept"),
        "{log}"
    );
    assert_eq!(agent.stop(), 0);
}

#[test]
fn warn_only_logs_and_counts() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(&sb, &cache, "    watchdog: { warn: 25%, high: 50%, low: 10% }\n");
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    fill(&cache, "f", 3, MIB as usize);
    agent.wait_for("level warn", |m| {
        m.get("tmpfsctl_mount_level{name=\"c\",level=\"warn\"}") == 1.0
    });
    fill(&cache, "g", 2, MIB as usize);
    let m = agent.wait_for("the warn action", |m| m.actions("c", "warn") == 1.0);
    assert_eq!(m.get("tmpfsctl_mount_level{name=\"c\",level=\"high\"}"), 1.0);
    assert_eq!(m.actions("c", "evict"), 0.0);
    assert!(cache.join("f000").exists(), "warn deletes nothing");
    assert!(agent.log().contains("action warn: nothing else is done"));
    assert_eq!(agent.stop(), 0);
}

#[test]
fn grow_in_steps_to_max_size_then_evict() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 1234, 2345, 0o750);
    let spec = spec_one(
        &sb,
        &cache,
        "    options: [nosuid, nodev, noexec]\n    watchdog:\n      high: 80%\n      low: 40%\n      action: [grow, evict]\n      max_size: 12MiB\n      grow_step: 2MiB\n",
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    fill(&cache, "a", 7, MIB as usize); // 7 of 8: grow to 10
    agent.wait_for("a grow to 10MiB", |m| m.size("c") == (10 * MIB) as f64);
    // One write each from here, so each check sees the whole step.
    fill(&cache, "b", 1, 2 * MIB as usize); // 9 of 10: grow to 12
    agent.wait_for("a grow to 12MiB", |m| m.size("c") == (12 * MIB) as f64);
    // The remount repeated every flag and kept the root.
    let top = sb.top(&cache).unwrap();
    for f in ["nosuid", "nodev", "noexec"] {
        assert!(top.has_mount_option(f), "{f} dropped by the remount: {top:?}");
    }
    assert_eq!(common::owner_of(&cache), (1234, 2345));
    assert_eq!(common::mode_of(&cache), 0o750);
    fill(&cache, "c", 1, 2 * MIB as usize); // 11 of 12, at max: evict to 40%
    let m = agent.wait_for("an eviction", |m| m.actions("c", "evict") >= 1.0);
    assert_eq!(m.actions("c", "grow"), 2.0);
    let u = Usage::of(&cache).unwrap();
    assert_eq!(u.size, 12 * MIB);
    // The eviction may run while c000 is still being written (it is kept as
    // open for writing), so that file's rest can land during and after it: the
    // agent's own figure and the final one must each be within c000's size of
    // `low` (the agent's was 41.7% once, in CI under load).
    let log = agent.log();
    let after: f64 = log
        .lines()
        .find_map(|l| {
            l.split(" -> ")
                .nth(1)?
                .split('%')
                .next()?
                .parse()
                .ok()
                .filter(|_| l.contains("evicted"))
        })
        .unwrap_or(f64::NAN);
    assert!(
        after <= 40.0 + 100.0 * 2.0 / 12.0,
        "eviction stopped above low\n{log}"
    );
    assert!(u.used <= 12 * MIB * 40 / 100 + 2 * MIB, "{u:?}\n{log}");
    assert!(
        agent.log().contains("grow skipped: already at max_size"),
        "{}",
        agent.log()
    );
    assert_eq!(agent.stop(), 0);
}

#[test]
fn fallback_with_a_busy_writer_keeps_the_writer_working_and_the_data() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    fs::write(cache.join("seeded"), "from disk").unwrap();
    let spec = spec_one(
        &sb,
        &cache,
        "    persist: on-stop\n    watchdog: { high: 60%, low: 30%, action: fallback }\n",
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    fs::write(cache.join("written-in-ram"), "keep me").unwrap();

    // A writer that holds its file open and appends all the time.
    let stop = Arc::new(AtomicBool::new(false));
    let log_path = cache.join("app.log");
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .unwrap();
    let stop2 = stop.clone();
    let writer = std::thread::spawn(move || -> std::io::Result<u64> {
        let mut n = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            f.write_all(format!("line {n}\n").as_bytes())?;
            n += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
        f.sync_all()?;
        Ok(n)
    });
    std::thread::sleep(Duration::from_millis(300));
    fill(&cache, "big", 5, MIB as usize); // 5 of 8 MiB: past 60%
    let m = agent.wait_for("the fallback", |m| m.state("c") == Some("fallback"));
    assert_eq!(m.actions("c", "fallback"), 1.0);
    assert!(sb.top(&cache).is_none(), "the tmpfs is gone from the path");
    // The writer keeps going on its open file for a while, without errors.
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let lines = writer.join().unwrap().expect("the writer saw no error");
    assert!(lines > 10);
    // The RAM copy is written back after the switch, beside the agent's checks.
    let m = agent.wait_for("the fallback's write-back", |m| m.actions("c", "sync") >= 1.0);
    // New files land on the disk directory.
    fs::write(cache.join("after-fallback"), "on disk").unwrap();
    assert!(sb.top(&cache).is_none());
    // What was in RAM reached the disk: seeded, written, and the log up to
    // the fallback.
    assert_eq!(
        fs::read_to_string(cache.join("written-in-ram")).unwrap(),
        "keep me"
    );
    assert_eq!(fs::read_to_string(cache.join("seeded")).unwrap(), "from disk");
    assert_eq!(fs::metadata(cache.join("big004")).unwrap().len(), MIB);
    let on_disk = fs::read_to_string(&log_path).unwrap();
    assert!(on_disk.starts_with("line 0\nline 1\n"), "{on_disk:.100}");
    assert_eq!(
        fs::read_to_string(cache.join("after-fallback")).unwrap(),
        "on disk"
    );
    // status shows why.
    let st = sb.run(["status".as_ref(), spec.as_os_str()]);
    st.code(0).stdout_has("fell back").stdout_has(" fallback ");
    let log = agent.log();
    assert!(log.contains("fell back to the disk directory"), "{log}");
    assert!(
        m.get("tmpfsctl_mount_last_sync_success{name=\"c\"}") == 1.0,
        "the write-back before the fallback is in the metrics\n{m:?}"
    );
    assert_eq!(agent.stop(), 0);
}

#[test]
fn fallback_then_reoffload_after_when_the_contents_fit() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    watchdog: { high: 60%, low: 30%, action: fallback, reoffload_after: 10s }\n",
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    fill(&cache, "big", 5, MIB as usize);
    agent.wait_for("the fallback", |m| m.state("c") == Some("fallback"));
    // Volatile: the RAM contents are gone with the tmpfs; the disk directory
    // is what the application sees now.
    assert!(!cache.join("big000").exists());
    // Too much on disk to come back: postponed, not flapping.
    fill(&cache, "disk", 6, MIB as usize);
    agent.wait_log("not re-offloaded");
    for i in 0..6 {
        fs::remove_file(cache.join(format!("disk{i:03}"))).unwrap();
    }
    fs::write(cache.join("small"), "x").unwrap();
    // Edit the schedule: the next try is in another 10s.
    let m = agent.wait_for("the re-offload", |m| m.actions("c", "reoffload") == 1.0);
    assert_eq!(m.state("c"), Some("offloaded"));
    assert_eq!(sb.top(&cache).unwrap().source, "tmpfsctl-c");
    assert_eq!(
        fs::read_to_string(cache.join("small")).unwrap(),
        "x",
        "seeded again"
    );
    assert_eq!(agent.stop(), 0);
}

#[test]
fn sigterm_writes_persisted_mounts_back_and_exits_0() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(&sb, &cache, "    persist: on-stop\n");
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    fs::write(cache.join("late"), "written just before stop").unwrap();
    let lower = sb.state.join("lower/c");
    assert!(!lower.join("late").exists());
    assert_eq!(agent.stop(), 0, "{}", agent.log());
    assert_eq!(
        fs::read_to_string(lower.join("late")).unwrap(),
        "written just before stop",
        "SIGTERM wrote the mount back\n{}",
        agent.log()
    );
    assert_eq!(
        sb.top(&cache).unwrap().source,
        "tmpfsctl-c",
        "the tmpfs stays (down takes it away)"
    );
    let m = agent.metrics();
    assert_eq!(m.get("tmpfsctl_mount_syncs_total{name=\"c\",result=\"ok\"}"), 1.0);
}

/// A spec reloaded with `persist: none` under a mount built persisted: the
/// reload's apply refuses the change, and SIGTERM still writes the mount back
/// (a review helper's probe: it wrote nothing back).
#[test]
fn sigterm_writes_back_a_mount_built_persisted_after_a_reload_says_none() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(&sb, &cache, "    persist: on-stop\n");
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    fs::write(cache.join("late"), "written while persisted").unwrap();
    let text = fs::read_to_string(&spec).unwrap();
    fs::write(&spec, text.replace("persist: on-stop", "persist: none")).unwrap();
    agent.wait_log("built with `persist: on-stop` and the spec asks for `persist: none`");
    assert_eq!(agent.stop(), 0, "{}", agent.log());
    assert_eq!(
        fs::read_to_string(sb.state.join("lower/c/late")).unwrap(),
        "written while persisted",
        "SIGTERM wrote the mount back\n{}",
        agent.log()
    );
}

/// A copy mount built persisted, under a spec edited to an overlay with
/// `evict` (which validation allows only there): the agent's apply refuses the
/// seed change, and the agent does not evict from the mount as it was built,
/// whose deletions would reach the disk (a review helper's probe: 11 of 22
/// files lost, one of them on disk before the mount).
#[test]
fn no_eviction_from_a_mount_built_persisted_under_a_spec_edited_to_evict() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    fs::write(cache.join("kept"), "on disk before").unwrap();
    let spec = spec_one(&sb, &cache, "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    spec_one(
        &sb,
        &cache,
        "    seed: overlay\n    persist: on-stop\n    watchdog: { high: 60%, low: 30%, action: evict }\n",
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    agent.wait_log("the live mount is a full copy in RAM and the spec asks for an overlay");
    fill(&cache, "f", 6, MIB as usize);
    agent.wait_log("not evicting: the mount was built persisted");
    assert_eq!(agent.stop(), 0, "{}", agent.log());
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(fs::read_to_string(cache.join("kept")).unwrap(), "on disk before");
    for i in 0..6 {
        assert!(
            cache.join(format!("f{i:03}")).exists(),
            "f{i:03} lost\n{}",
            agent.log()
        );
    }
}

#[test]
fn persist_every_writes_back_on_schedule() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(&sb, &cache, "    persist: every 10s\n");
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    fs::write(cache.join("periodic"), "v1").unwrap();
    let m = agent.wait_for("a periodic write-back", |m| m.actions("c", "sync") >= 1.0);
    assert_eq!(
        fs::read_to_string(sb.state.join("lower/c/periodic")).unwrap(),
        "v1"
    );
    assert_eq!(m.get("tmpfsctl_mount_last_sync_success{name=\"c\"}"), 1.0);
    assert!(m.get("tmpfsctl_mount_last_sync_timestamp_seconds{name=\"c\"}") > 1.6e9);
    assert!(m.get("tmpfsctl_mount_last_sync_duration_seconds{name=\"c\"}") >= 0.0);
    assert_eq!(agent.stop(), 0);
}

/// A `seed: overlay` mount with `persist: every` is written back on schedule
/// by the agent, which otherwise leaves it alone.
#[test]
fn persist_every_writes_an_overlay_back_on_schedule() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    fs::write(cache.join("seeded"), "seeded").unwrap();
    let spec = spec_one(&sb, &cache, "    seed: overlay\n    persist: every 10s\n");
    sb.run(["apply", spec.to_str().unwrap()]).code(0);
    assert_eq!(sb.top(&cache).unwrap().fstype, "overlay");
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    fs::write(cache.join("periodic"), "v1").unwrap();
    fs::remove_file(cache.join("seeded")).unwrap();
    let m = agent.wait_for("a periodic write-back", |m| m.actions("c", "sync") >= 1.0);
    assert_eq!(
        fs::read_to_string(sb.state.join("lower/c/periodic")).unwrap(),
        "v1"
    );
    assert!(!sb.state.join("lower/c/seeded").exists());
    assert_eq!(m.get("tmpfsctl_mount_last_sync_success{name=\"c\"}"), 1.0);
    assert_eq!(agent.stop(), 0);
    assert_eq!(
        sb.top(&cache).unwrap().fstype,
        "overlay",
        "the agent leaves the mount"
    );
}

/// A `seed: overlay` mount of 8 MiB whose watchdog acts with `action` past 60%,
/// under the agent, a busy application on it, and 5 MiB written at once.
fn overlay_past_high(action: &str, seed: u64) -> (Sandbox, PathBuf, PathBuf, Agent, common::App) {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        &format!("    seed: overlay\n    persist: on-stop\n    watchdog: {{ high: 60%, low: 30%, action: {action} }}\n"),
    );
    sb.run(["apply", spec.to_str().unwrap()]).code(0);
    assert_eq!(sb.top(&cache).unwrap().fstype, "overlay");
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    let app = common::App::paced(cache.clone(), Vec::new(), seed, Duration::from_millis(8));
    std::thread::sleep(Duration::from_millis(300));
    fill(&cache, "big", 5, MIB as usize);
    (sb, cache, spec, agent, app)
}

/// `down`, then every name the application wrote, and the 5 MiB, are on disk as
/// last written, and nothing it deleted is back.
fn down_loses_nothing(sb: &Sandbox, spec: &Path, cache: &Path, app: common::App, what: &str) {
    std::thread::sleep(Duration::from_millis(300));
    let down = sb.run(["down".as_ref(), spec.as_os_str()]);
    app.event("down done");
    let mut exp = app.stop();
    down.code(0);
    for i in 0..5 {
        exp.names
            .insert(format!("big{i:03}"), Some(vec![0x5a; MIB as usize]));
    }
    exp.assert_nothing_lost(cache, what);
}

/// `evict` on a `seed: overlay` mount: past `high` the agent writes the upper layer
/// back and starts it afresh (a file cannot leave a mounted upper layer by itself).
/// Its tmpfs is nearly empty again, the path is an overlay again, what was evicted
/// is read from the disk, and nothing the busy application wrote is lost or back.
#[test]
fn evict_on_an_overlay_writes_the_upper_layer_back_and_starts_it_afresh() {
    let (sb, cache, spec, mut agent, app) = overlay_past_high("evict", 17);
    agent.wait_for("the eviction", |m| m.actions("c", "evict") >= 1.0);
    app.event("evicted");
    let m = wait_offloaded(&mut agent, "c");
    assert_eq!(m.actions("c", "fallback"), 0.0);
    assert_eq!(sb.top(&cache).unwrap().fstype, "overlay", "offloaded again");
    // The overlay reports its upper layer's filesystem.
    let upper = nix::sys::statvfs::statvfs(&cache).unwrap();
    let used = (upper.blocks() - upper.blocks_free()) as f64 / upper.blocks() as f64;
    assert!(
        used < 0.3,
        "the upper layer is {:.0}% full after the eviction",
        used * 100.0
    );
    assert_eq!(fs::read(cache.join("big000")).unwrap(), vec![0x5a; MIB as usize]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(agent.stop(), 0);
    down_loses_nothing(&sb, &spec, &cache, app, "evict on an overlay");
}

/// An overlay's eviction whose write-back fails (its disk is full): nothing was
/// switched, the overlay stays with everything in it, and the agent says the
/// eviction failed; it counts none.
#[test]
fn an_overlay_eviction_that_cannot_write_back_counts_for_nothing() {
    let sb = Sandbox::new();
    let mnt = sb.path("disk");
    fs::create_dir_all(&mnt).unwrap();
    let _disk = common::LoopFs::new(&mnt, 16, "defaults");
    let cache = mnt.join("cache");
    fs::create_dir(&cache).unwrap();
    let free = nix::sys::statvfs::statvfs(&cache).unwrap();
    let room = free.blocks_available() * free.fragment_size();
    fs::write(cache.join("filler"), vec![7u8; (room - (1 << 20)) as usize]).unwrap();
    let spec = spec_one(
        &sb,
        &cache,
        "    seed: overlay\n    persist: on-stop\n    watchdog: { high: 60%, low: 30%, action: evict }\n",
    );
    sb.run(["apply", spec.to_str().unwrap()]).code(0);
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    fill(&cache, "big", 5, MIB as usize);
    let deadline = Instant::now() + DEADLINE;
    while !agent.log().contains("eviction failed") {
        assert!(Instant::now() < deadline, "no failed eviction\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(agent.metrics().actions("c", "evict"), 0.0, "{}", agent.log());
    assert!(!agent.log().contains("started afresh"), "{}", agent.log());
    assert_eq!(sb.top(&cache).unwrap().fstype, "overlay");
    assert_eq!(fs::read(cache.join("big004")).unwrap(), vec![0x5a; MIB as usize]);
    // With room again, the agent's own write-back at its stop, and `down`, succeed.
    let disk_side = sb.state.join("lower/c");
    fs::remove_file(disk_side.join("filler")).unwrap();
    assert_eq!(agent.stop(), 0, "{}", agent.log());
    sb.run(["down", spec.to_str().unwrap()]).code(0);
    assert_eq!(fs::read(cache.join("big004")).unwrap(), vec![0x5a; MIB as usize]);
}

/// `fallback` on a `seed: overlay` mount: past `high` the agent writes the upper
/// layer back and leaves the application on its disk directory, with everything
/// the application wrote there; `apply` offloads it again, as an overlay.
#[test]
fn fallback_on_an_overlay_leaves_the_application_on_its_disk_directory() {
    let (sb, cache, spec, mut agent, app) = overlay_past_high("fallback", 19);
    agent.wait_for("the fallback", |m| m.state("c") == Some("fallback"));
    app.event("fell back");
    assert!(
        sb.top(&cache).is_none_or(|e| e.fstype != "overlay"),
        "the overlay is still at the path"
    );
    assert_eq!(fs::read(cache.join("big004")).unwrap(), vec![0x5a; MIB as usize]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(agent.stop(), 0);
    sb.run(["apply", spec.to_str().unwrap()]).code(0);
    app.event("applied");
    assert_eq!(sb.top(&cache).unwrap().fstype, "overlay", "offloaded again");
    down_loses_nothing(&sb, &spec, &cache, app, "fallback on an overlay");
}

/// With the agent running, `sync` reads only the directories that changed (its
/// change tracker answers), `sync --full` reads everything, and without the agent
/// `sync` reads everything and says why; every pass leaves the disk equal to the RAM.
#[test]
fn sync_reads_only_what_the_agent_saw_change() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(&sb, &cache, "    persist: on-stop\n");
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    for d in 0..20 {
        fs::create_dir(cache.join(format!("d{d}"))).unwrap();
        for f in 0..5 {
            fs::write(cache.join(format!("d{d}/f{f}")), format!("{d}/{f}")).unwrap();
        }
    }
    let lower = sb.state.join("lower/c");
    let stats = |r: &Run| r.json()[0]["stats"].clone();
    // The first write-back after the seed reads everything: no directory of the
    // baseline is trusted yet.
    sb.run(["sync", spec.to_str().unwrap(), "--format", "json"])
        .code(0);
    std::thread::sleep(Duration::from_millis(20));
    fs::write(cache.join("d3/f1"), "changed in place").unwrap();
    fs::write(cache.join("d7/new"), "new").unwrap();
    fs::remove_file(cache.join("d9/f0")).unwrap();
    let r = sb.run(["sync", spec.to_str().unwrap(), "--format", "json"]);
    r.code(0);
    let s = stats(&r);
    assert_eq!(s["tracked"], true, "{s}\n{}", agent.log());
    assert!(s["dirs_skipped"].as_u64().unwrap() >= 17, "{s}");
    assert_eq!(
        fs::read_to_string(lower.join("d3/f1")).unwrap(),
        "changed in place"
    );
    assert_eq!(fs::read_to_string(lower.join("d7/new")).unwrap(), "new");
    assert!(!lower.join("d9/f0").exists());
    fs::write(cache.join("d11/f2"), "again").unwrap();
    let r = sb.run(["sync", spec.to_str().unwrap(), "--full", "--format", "json"]);
    r.code(0);
    let s = stats(&r);
    assert_eq!(
        (s["tracked"].clone(), s["dirs_skipped"].clone()),
        (false.into(), 0.into()),
        "{s}"
    );
    assert_eq!(fs::read_to_string(lower.join("d11/f2")).unwrap(), "again");
    assert_eq!(agent.stop(), 0, "{}", agent.log());
    fs::write(cache.join("d12/f3"), "no agent").unwrap();
    let r = sb.run(["sync", spec.to_str().unwrap(), "--format", "json"]);
    r.code(0);
    assert_eq!(stats(&r)["tracked"], false);
    let why = r.json()[0]["whole_tree"].as_str().unwrap_or_default().to_string();
    assert!(why.contains("no change tracker runs"), "{why}");
    assert_eq!(
        contents(&cache),
        contents(&lower),
        "the disk holds what the RAM holds"
    );
}

/// A tracked `sync` that meets a changed hard-linked file reads the whole tree
/// again (the file's other names may lie where it read nothing), and says why.
/// Before, its report said it read the whole tree without a reason.
#[test]
fn a_sync_that_reads_the_whole_tree_for_a_linked_file_says_why() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(&sb, &cache, "    persist: on-stop\n");
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    for d in ["a", "b", "c"] {
        fs::create_dir(cache.join(d)).unwrap();
    }
    fs::write(cache.join("a/f"), "one").unwrap();
    fs::hard_link(cache.join("a/f"), cache.join("b/f")).unwrap();
    sb.run(["sync", spec.to_str().unwrap()]).code(0);
    std::thread::sleep(Duration::from_millis(20));
    fs::OpenOptions::new()
        .append(true)
        .open(cache.join("a/f"))
        .unwrap()
        .write_all(b" two")
        .unwrap();
    let r = sb.run(["sync", spec.to_str().unwrap(), "--format", "json"]);
    r.code(0);
    let why = r.json()[0]["whole_tree"].as_str().unwrap_or_default().to_string();
    assert!(why.contains("a hard-linked file changed"), "{}", r.json());
    let lower = sb.state.join("lower/c");
    assert_eq!(fs::read_to_string(lower.join("b/f")).unwrap(), "one two");
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}

/// A tracked `sync` that finds, before its removals, the RAM changed below a
/// directory it skipped starts again tracked, with a fresh answer from the change
/// tracker: a whole pass cannot tell a RAM file below a changed directory from one
/// moved in, and would take the RAM's older version of `d/f` over the one a
/// directory the application moved on disk brought (whose ctime is older). Before,
/// the restart was a whole pass, and it did (a review helper's probe, 4 of 4).
#[test]
fn a_sync_that_finds_the_ram_changed_where_it_read_nothing_starts_again_tracked() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(&sb, &cache, "    persist: on-stop\n");
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    let lower = sb.state.join("lower/c");
    let sync = || {
        sb.run(["sync", spec.to_str().unwrap()]).code(0);
    };
    let tick = || std::thread::sleep(Duration::from_millis(20));
    fs::create_dir_all(cache.join("d")).unwrap();
    fs::create_dir_all(cache.join("s/sub")).unwrap();
    fs::write(cache.join("x"), "x").unwrap();
    fs::write(cache.join("s/sub/in"), "in").unwrap();
    tick();
    sync();
    // The disk's own directory, older than the RAM's version of `d/f`.
    fs::create_dir(lower.join("old")).unwrap();
    fs::write(lower.join("old/f"), "moved in on disk").unwrap();
    tick();
    fs::write(cache.join("d/f"), "the RAM's").unwrap();
    tick();
    sync();
    assert_eq!(fs::read_to_string(lower.join("d/f")).unwrap(), "the RAM's");
    tick();
    nix::fcntl::renameat2(
        nix::fcntl::AT_FDCWD,
        &lower.join("d"),
        nix::fcntl::AT_FDCWD,
        &lower.join("old"),
        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
    )
    .unwrap();
    tick();
    sync();
    assert_eq!(fs::read_to_string(lower.join("d/f")).unwrap(), "moved in on disk");
    tick();
    fs::write(cache.join("d/new"), "a later change of the RAM directory").unwrap();
    fs::remove_file(cache.join("x")).unwrap();
    fs::write(lower.join("d/disk"), "and of the disk's").unwrap();
    tick();
    let (code, out) = crate::no_write_lost::stopped_at(
        &sb,
        "sync",
        &spec,
        "stop=before-removals",
        &["before-removals", "before-removals"],
        |i| {
            if i == 0 {
                fs::write(cache.join("s/sub/more"), "below a skipped directory").unwrap();
            }
        },
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        fs::read_to_string(lower.join("d/f")).unwrap(),
        "moved in on disk",
        "{out}"
    );
    assert!(out.contains("read only what changed"), "{out}");
    assert_eq!(
        fs::read_to_string(lower.join("s/sub/more")).unwrap(),
        "below a skipped directory"
    );
    assert!(!lower.join("x").exists(), "{out}");
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}

#[test]
fn reload_applies_a_valid_spec_and_keeps_the_old_one_when_invalid() {
    let sb = Sandbox::new();
    let a = sb.cache_dir("a", 0, 0, 0o755);
    let b = sb.cache_dir("b", 0, 0, 0o755);
    let v1 = format!(
        "version: 1\nmounts:\n  - name: a\n    path: {}\n    size: 8MiB\n    watchdog: {{ high: 90%, low: 20%, action: evict }}\n",
        a.display()
    );
    let spec = sb.write_spec("cache.yaml", &v1);
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "a");

    // A valid change, written the way editors do (temporary file + rename):
    // a grows online, b is new.
    let v2 = format!(
        "{}  - name: b\n    path: {}\n    size: 4MiB\n",
        v1.replace("size: 8MiB", "size: 16MiB"),
        b.display()
    );
    fs::write(sb.path("cache.yaml.tmp"), &v2).unwrap();
    fs::rename(sb.path("cache.yaml.tmp"), &spec).unwrap();
    let m = agent.wait_for("reload of v2", |m| {
        m.state("b") == Some("offloaded") && m.size("a") == (16 * MIB) as f64
    });
    assert_eq!(m.get("tmpfsctl_agent_reloads_total{result=\"ok\"}"), 1.0);

    // An invalid spec: logged with its diagnostic; the old one stays.
    fs::write(&spec, v2.replace("size: 4MiB", "size: 12 parsecs")).unwrap();
    let m = agent.wait_for("the invalid reload", |m| {
        m.get("tmpfsctl_agent_reloads_total{result=\"invalid\"}") == 1.0
    });
    agent.wait_log("invalid size `12 parsecs`");
    let log = agent.log();
    assert!(log.contains("the spec in force stays"), "{log}");
    assert!(
        log.contains(&format!("{}:9:11", spec.display())),
        "diagnostic with file:line:col\n{log}"
    );
    assert_eq!(m.state("a"), Some("offloaded"));
    assert_eq!(m.state("b"), Some("offloaded"));
    // ... and is still enforced: a's thresholds act.
    fill(&a, "f", 15, MIB as usize);
    agent.wait_for("eviction under the old spec", |m| m.actions("a", "evict") >= 1.0);

    // SIGHUP re-reads: still invalid.
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    agent.wait_for("the SIGHUP reload", |m| {
        m.get("tmpfsctl_agent_reloads_total{result=\"invalid\"}") == 2.0
    });
    // Fixed: the valid spec (b at 6MiB) is applied.
    fs::write(&spec, v2.replace("size: 4MiB", "size: 6MiB")).unwrap();
    agent.wait_for("b resized", |m| m.size("b") == (6 * MIB) as f64);
    assert_eq!(
        agent.metrics().get("tmpfsctl_agent_reloads_total{result=\"ok\"}"),
        2.0
    );
    assert_eq!(agent.stop(), 0);
}

/// A fixture /proc: meminfo and pressure/memory are files the test writes;
/// self/mountinfo is the real one (a symlink resolved by the agent itself).
struct FakeProc {
    dir: PathBuf,
}

impl FakeProc {
    fn new(sb: &Sandbox) -> FakeProc {
        let dir = sb.path("proc");
        fs::create_dir_all(dir.join("self")).unwrap();
        fs::create_dir_all(dir.join("pressure")).unwrap();
        std::os::unix::fs::symlink("/proc/self/mountinfo", dir.join("self/mountinfo")).unwrap();
        let p = FakeProc { dir };
        p.set(8 << 30, 0.0);
        p
    }

    fn set(&self, mem_available: u64, psi: f64) {
        let write = |name: &str, text: String| {
            let tmp = self.dir.join(format!("{name}.tmp"));
            fs::write(&tmp, text).unwrap();
            fs::rename(&tmp, self.dir.join(name)).unwrap();
        };
        write(
            "meminfo",
            format!(
                "MemTotal:       16777216 kB\nMemFree:        1000 kB\nMemAvailable:   {} kB\nShmem:          1000 kB\n",
                mem_available / 1024
            ),
        );
        write(
            "pressure/memory",
            format!("some avg10={psi:.2} avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"),
        );
    }
}

#[test]
fn memory_pressure_evicts_then_falls_back_lowest_priority_first() {
    let sb = Sandbox::new();
    let vol = sb.cache_dir("vol", 0, 0, 0o755);
    let keep = sb.cache_dir("keep", 0, 0, 0o755);
    let fake = FakeProc::new(&sb);
    let spec = sb.write_spec(
        "cache.yaml",
        &format!(
            "version: 1\nagent:\n  min_available: 1GiB\n  max_pressure: 20%\n  cooldown: 300ms\nmounts:\n  - name: keep\n    path: {}\n    size: 8MiB\n    persist: on-stop\n    watchdog: {{ priority: 60 }}\n  - name: vol\n    path: {}\n    size: 8MiB\n    watchdog: {{ high: 99%, low: 25%, priority: 10 }}\n",
            keep.display(),
            vol.display()
        ),
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[("TMPFSCTL_PROC", &fake.dir)]);
    wait_offloaded(&mut agent, "keep");
    wait_offloaded(&mut agent, "vol");
    fill(&vol, "v", 6, MIB as usize);
    fs::write(keep.join("precious"), "persisted").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        agent.metrics().actions("vol", "evict"),
        0.0,
        "no pressure, no action"
    );

    // MemAvailable drops below the floor: the volatile cache is evicted
    // first, then the mounts fall back, lowest priority first.
    fake.set(512 << 20, 0.0);
    let m = agent.wait_for("pressure active", |m| {
        m.get("tmpfsctl_memory_pressure_active") == 1.0
    });
    assert_eq!(m.get("tmpfsctl_memory_available_bytes"), (512u64 << 20) as f64);
    agent.wait_for("vol evicted", |m| m.actions("vol", "evict") >= 1.0);
    let m = agent.wait_for("both fell back", |m| {
        m.state("vol") == Some("fallback") && m.state("keep") == Some("fallback")
    });
    assert_eq!(
        m.actions("keep", "evict"),
        0.0,
        "a persisted mount is never evicted"
    );
    // The fallback switches at once and writes the RAM copy back beside (a loaded
    // CI machine read the disk 30 ms too early).
    agent.wait_log("keep: the RAM copy the fallback left is written back");
    assert_eq!(
        fs::read_to_string(keep.join("precious")).unwrap(),
        "persisted",
        "written back"
    );
    let log = agent.log();
    let (v, k) = (log.find("vol: fell back"), log.find("keep: fell back"));
    assert!(
        v.is_some() && k.is_some() && v < k,
        "priority 10 before 60\n{log}"
    );
    agent.wait_log("no mount has anything left to give");

    // Pressure over: calm again; the mounts stay on disk (no reoffload_after).
    fake.set(8 << 30, 0.0);
    agent.wait_for("pressure over", |m| {
        m.get("tmpfsctl_memory_pressure_active") == 0.0
    });
    assert_eq!(agent.stop(), 0);
}

#[test]
fn psi_above_the_limit_triggers_the_guard() {
    let sb = Sandbox::new();
    let vol = sb.cache_dir("vol", 0, 0, 0o755);
    let fake = FakeProc::new(&sb);
    let spec = sb.write_spec(
        "cache.yaml",
        &format!(
            "version: 1\nagent:\n  max_pressure: 20%\n  cooldown: 10s\nmounts:\n  - name: vol\n    path: {}\n    size: 8MiB\n    watchdog: {{ high: 99%, low: 25%, pressure: [evict] }}\n",
            vol.display()
        ),
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[("TMPFSCTL_PROC", &fake.dir)]);
    wait_offloaded(&mut agent, "vol");
    fill(&vol, "v", 6, MIB as usize);
    fake.set(8 << 30, 35.5);
    let m = agent.wait_for("PSI eviction", |m| m.actions("vol", "evict") >= 1.0);
    assert_eq!(m.get("tmpfsctl_memory_pressure_some_avg10"), 35.5);
    assert!(Usage::of(&vol).unwrap().used <= 2 * MIB);
    // pressure: [evict] only: never falls back.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(agent.metrics().state("vol"), Some("offloaded"));
    assert!(agent.log().contains("PSI some avg10"), "{}", agent.log());
    assert_eq!(agent.stop(), 0);
}

#[test]
fn an_invalid_spec_at_start_exits_2_with_the_diagnostic() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    watchdog: { action: evict }\n    persist: on-stop\n",
    );
    let r = sb.run(["agent".as_ref(), spec.as_os_str()]);
    r.code(2)
        .stderr_has("`evict` deletes files")
        .stderr_has("field: mounts[0].watchdog.action");
    assert!(sb.mounts().is_empty());
}

/// Files the application creates while a busy persisted mount falls back, in
/// RAM before the detach or on the disk directory after it, must all survive:
/// `down_one`'s second write-back (from the detached tree) merges into what is
/// now the live disk directory, deleting nothing there and keeping whatever
/// changed there after the detach.
#[test]
fn fallback_of_a_busy_persisted_mount_loses_no_file_created_meanwhile() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    persist: on-stop\n    watchdog: { high: 60%, low: 30%, action: fallback }\n",
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    let _hold = fs::File::create(cache.join("held")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let dir = cache.clone();
    let creator = std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            fs::write(dir.join(format!("new{n:06}")), "x").unwrap();
            n += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        n
    });
    std::thread::sleep(Duration::from_millis(200));
    fill(&cache, "big", 5, MIB as usize);
    agent.wait_for("the fallback", |m| m.state("c") == Some("fallback"));
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let n = creator.join().unwrap();
    // The fallback switches at once and writes the RAM copy back beside the
    // agent's checks: what was created in RAM is on disk once that is done.
    let start = Instant::now();
    while !agent
        .log()
        .contains("the RAM copy the fallback left is written back")
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no write-back\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let missing: Vec<u64> = (0..n)
        .filter(|i| !cache.join(format!("new{i:06}")).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "created {n}; lost after the fallback: {missing:?}"
    );
    assert_eq!(agent.stop(), 0);
}

/// Fallback of a persisted mount, then its re-offload, with the application
/// creating, rewriting, deleting and renaming files all along: nothing it wrote is
/// lost, nothing it deleted comes back.
#[test]
fn fallback_then_reoffload_with_a_busy_application_loses_and_resurrects_nothing() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    persist: on-stop\n    watchdog: { high: 60%, low: 30%, action: fallback, reoffload_after: 10s }\n",
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    let app = common::App::paced(cache.clone(), Vec::new(), 11, Duration::from_millis(8));
    std::thread::sleep(Duration::from_millis(300));
    fill(&cache, "big", 5, MIB as usize);
    agent.wait_for("the fallback", |m| m.state("c") == Some("fallback"));
    app.event("fallback");
    // The application drops the big files once it sees them on disk, so the rest
    // fits again.
    let start = Instant::now();
    for i in 0..5 {
        let p = cache.join(format!("big{i:03}"));
        while fs::remove_file(&p).is_err() {
            assert!(
                start.elapsed() < DEADLINE,
                "{} never reached the disk",
                p.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    agent.wait_for("the re-offload", |m| m.actions("c", "reoffload") == 1.0);
    app.event("re-offloaded");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(agent.stop(), 0);
    let down = sb.run(["down".as_ref(), spec.as_os_str()]);
    app.event("down done");
    let mut exp = app.stop();
    down.code(0);
    for i in 0..5 {
        exp.names.insert(format!("big{i:03}"), None);
    }
    exp.assert_nothing_lost(&cache, "fallback, then re-offload");
}

/// A persisted mount with a fallback watchdog, offloaded by an agent, then watched
/// by an agent started again to be killed (`kill -9`) at `point` of its fallback:
/// the managed path, the spec and that agent.
fn offloaded_then_killed_at(sb: &Sandbox, point: &str) -> (PathBuf, PathBuf, Agent) {
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        sb,
        &cache,
        "    persist: on-stop\n    watchdog: { high: 60%, low: 30%, action: fallback }\n",
    );
    let mut agent = Agent::start(sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    drop(agent);
    let mut c = sb.cmd();
    c.env("TMPFSCTL_FAILPOINT", format!("{point}:c"));
    let agent = Agent::start_with(sb, &spec, c);
    (cache, spec, agent)
}

/// The agent killed (`kill -9`) in every phase of a fallback of a persisted mount,
/// the application busy all along; `down` finishes the write-back.
#[test]
fn agent_killed_in_every_phase_of_a_fallback_loses_and_resurrects_nothing() {
    for (i, point) in ["after-hold", "after-switch", "after-merge", "after-baseline"]
        .into_iter()
        .enumerate()
    {
        let sb = Sandbox::new();
        let (cache, spec, mut agent) = offloaded_then_killed_at(&sb, point);
        let app = common::App::paced(cache.clone(), Vec::new(), 40 + i as u64, Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(200));
        fill(&cache, "big", 5, MIB as usize);
        let status = agent.wait_exit();
        app.event(&format!("agent died at {point}"));
        assert_eq!(
            status,
            None,
            "{point}: the agent was to be killed\n{}",
            agent.log()
        );
        down_loses_nothing(&sb, &spec, &cache, app, point);
    }
}

/// The agent killed in its fallback after the switch, then started again: it
/// finishes the write-back it left pending by itself (the data reaches the disk
/// directory without a `down`). Before, only a re-offload retried it, and that
/// needs the fallback's record, written once the take-out returns.
#[test]
fn an_agent_started_again_finishes_the_write_back_its_killed_fallback_left() {
    let sb = Sandbox::new();
    let (cache, spec, mut agent) = offloaded_then_killed_at(&sb, "after-switch");
    fill(&cache, "big", 5, MIB as usize);
    assert_eq!(
        agent.wait_exit(),
        None,
        "the agent was to be killed\n{}",
        agent.log()
    );
    // The application is on its disk directory; the RAM copy waits, held.
    assert!(!cache.join("big000").exists(), "{}", agent.log());
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    let start = Instant::now();
    while !(0..5).all(|i| cache.join(format!("big{i:03}")).exists()) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the pending write-back was not finished
{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(agent.stop(), 0, "{}", agent.log());
    for i in 0..5 {
        assert_eq!(fs::metadata(cache.join(format!("big{i:03}"))).unwrap().len(), MIB);
    }
}

/// A `down` holding the lock after its switch while the agent runs: the agent
/// leaves its write-back to it (no retry of its own, no failed write-back
/// recorded, its loop not held up waiting for the lock). Before, the agent waited
/// for the lock, then wrote back a tmpfs `down` had finished with, and `status`
/// showed that failed write-back (a review helper's probe).
#[test]
fn the_agent_leaves_a_running_downs_write_back_to_it() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(&sb, &cache, "    persist: on-stop\n");
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    fs::write(cache.join("new"), "in RAM").unwrap();
    let (code, out) = crate::no_write_lost::stopped_at(
        &sb,
        "down",
        &spec,
        "stop=after-switch:c",
        &["after-switch"],
        |_| {
            std::thread::sleep(Duration::from_secs(3));
        },
    );
    assert_eq!(code, 0, "{out}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(agent.stop(), 0, "{}", agent.log());
    let log = agent.log();
    assert!(
        !log.contains("FAILED") && !log.contains("ERROR") && !log.contains("left pending"),
        "{log}"
    );
    let st = sb.run(["status".as_ref(), spec.as_os_str()]);
    assert!(!st.stdout.contains("FAILED"), "{st}\n{log}");
    assert_eq!(fs::read_to_string(cache.join("new")).unwrap(), "in RAM");
}

/// A cache that refills as fast as it is evicted (Apache under load): the agent
/// evicts again and again, never gives up, and the writer never meets a full disk.
#[test]
fn evict_keeps_up_with_a_writer_that_refills_at_once() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    watchdog: { high: 85%, low: 60%, action: evict }\n",
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    // 64 KiB every 10 ms (6.4 MB/s) for 3 s: the 8 MiB mount fills three times over.
    let mut enospc = 0;
    let chunk = vec![0x42u8; 64 << 10];
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(3) {
        if let Err(e) = fs::write(cache.join(format!("obj{i:05}")), &chunk) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            enospc += 1;
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    let m = agent.metrics();
    assert!(
        m.actions("c", "evict") >= 3.0,
        "evictions: {}\n{}",
        m.actions("c", "evict"),
        agent.log()
    );
    assert_eq!(enospc, 0, "writes that found the mount full\n{}", agent.log());
    let st = sb.run([
        "status".as_ref(),
        spec.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    st.code(0);
    let j = st.json();
    assert_eq!(j["agent"]["running"], true, "{st}");
    assert!(
        j["mounts"][0]["agent"]["evicted_files"].as_u64().unwrap() > 0,
        "{st}"
    );
    assert!(j["mounts"][0]["agent"]["exhausted"].is_null(), "{st}");
    let log = agent.log();
    let evict_lines = log.lines().filter(|l| l.contains("evicted")).count();
    assert!(
        evict_lines <= 3,
        "the log repeats itself: {evict_lines} eviction lines in 3 s\n{log}"
    );
    assert_eq!(agent.stop(), 0);
    let st = sb.run([
        "status".as_ref(),
        spec.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(st.json()["agent"]["running"], false, "{st}");
    sb.run(["status".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("agent: not running");
}

/// Apache `mod_cache_disk` keeps an entry in two files, `X.header` and `X.data`:
/// eviction takes both or neither.
#[test]
fn evict_removes_apache_entries_whole() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    watchdog: { high: 80%, low: 40%, action: evict }\n",
    );
    // Written on disk before the agent seeds the mount from it: entries that are
    // whole when the agent first looks (one written a file at a time while an
    // eviction runs is, for a moment, an entry of one file).
    let sub = cache.join("aB").join("cD");
    fs::create_dir_all(&sub).unwrap();
    // Headers read recently, data written long ago: an entry is as recent as its
    // most recent file, so neither goes alone.
    for i in 0..70 {
        let stem = format!("k{i:03}xYz");
        fs::write(sub.join(format!("{stem}.data")), vec![1u8; 100 << 10]).unwrap();
        fs::write(sub.join(format!("{stem}.header")), vec![2u8; 300]).unwrap();
        let old = nix::sys::time::TimeSpec::new(1_000_000 + i, 0);
        let read = nix::sys::time::TimeSpec::new(2_000_000 - i, 0);
        for (name, t) in [("data", old), ("header", read)] {
            nix::sys::stat::utimensat(
                nix::fcntl::AT_FDCWD,
                &sub.join(format!("{stem}.{name}")),
                &t,
                &t,
                nix::sys::stat::UtimensatFlags::NoFollowSymlink,
            )
            .unwrap();
        }
    }
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    agent.wait_for("an eviction", |m| m.actions("c", "evict") >= 1.0);
    // Between the headers and the data of a chunk an eviction shows data without
    // its header (a miss to a reader); what it leaves is whole.
    assert_eq!(agent.stop(), 0);
    let log = agent.log();
    let mut gone = 0;
    for i in 0..70 {
        let stem = format!("k{i:03}xYz");
        let (d, h) = (
            sub.join(format!("{stem}.data")).exists(),
            sub.join(format!("{stem}.header")).exists(),
        );
        assert_eq!(d, h, "{stem}: data {d}, header {h}\n{log}");
        gone += usize::from(!d);
    }
    assert!(gone > 0);
    // The entries whose header was read last (the first ones) stay.
    assert!(sub.join("k000xYz.data").exists());
}

/// Another tmpfsctl holds the state lock (a long `down` or `sync`) while a mount
/// with `action: [grow, evict]` fills: the agent does not wait for the lock to grow
/// it, but goes on to evict, and the writer never meets a full mount. Before, each
/// check waited the `--wait` time for the lock, gave up, and tried to grow again:
/// nothing was evicted and 32 of 48 writes found the mount full (a hunting helper's
/// probe).
#[test]
fn evict_goes_on_while_another_tmpfsctl_holds_the_lock() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    watchdog:\n      high: 80%\n      low: 40%\n      action: [grow, evict]\n      max_size: 64MiB\n",
    );
    let mut agent = Agent::start(&sb, &spec, &["--wait", "10"], &[]);
    wait_offloaded(&mut agent, "c");
    let lock = fs::OpenOptions::new()
        .write(true)
        .open(sb.path("state/lock"))
        .unwrap();
    let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    let enospc = fill_twice_over(&cache);
    drop(held);
    let m = agent.metrics();
    assert!(m.actions("c", "evict") >= 1.0, "no eviction\n{}", agent.log());
    assert_eq!(enospc, 0, "writes that found the mount full\n{}", agent.log());
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}

/// Mount `c` at `srv/cache` (with `extra` in its spec) under an agent, offloaded;
/// then `srv` renamed to `srv.away`. The cache's path, the agent, and both names of
/// `srv`.
fn renamed_away(sb: &Sandbox, extra: &str) -> (PathBuf, Agent, (PathBuf, PathBuf)) {
    let cache = sb.cache_dir("srv/cache", 0, 0, 0o755);
    let spec = spec_one(sb, &cache, extra);
    let mut agent = Agent::start(sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    let (srv, away) = (sb.path("srv"), sb.path("srv.away"));
    fs::rename(&srv, &away).unwrap();
    (cache, agent, (srv, away))
}

/// A directory above the managed path renamed away, the mount table changed
/// meanwhile (so the agent reads it), and renamed back: the mount, filled to twice
/// its size right after, is evicted and every write finds room. Before, the read
/// of the table while it was away stopped the watch, and only the timed rescan,
/// 30 s later, took it up again (a hunting helper's probe).
#[test]
fn a_mount_whose_parent_is_renamed_away_and_back_stays_watched() {
    let sb = Sandbox::new();
    let (cache, mut agent, (srv, away)) =
        renamed_away(&sb, "    watchdog: { high: 80%, low: 40%, action: evict }\n");
    let other = sb.path("other");
    fs::create_dir(&other).unwrap();
    nix::mount::mount(
        Some("other"),
        &other,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    fs::rename(&away, &srv).unwrap();
    let enospc = fill_twice_over(&cache);
    assert_eq!(enospc, 0, "writes that found the mount full\n{}", agent.log());
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}

/// A persisted mount past `high` while a directory above it is renamed away: the
/// fallback follows the mount where it went (as `down` does), and everything
/// written to RAM is on disk once the directory is back.
#[test]
fn a_fallback_while_a_directory_above_is_renamed_away_keeps_the_data() {
    let sb = Sandbox::new();
    let (cache, mut agent, (srv, away)) = renamed_away(
        &sb,
        "    persist: on-stop\n    watchdog: { high: 60%, low: 30%, action: fallback }\n",
    );
    fill(&away.join("cache"), "big", 5, MIB as usize);
    agent.wait_for("the fallback's write-back", |m| m.actions("c", "sync") >= 1.0);
    fs::rename(&away, &srv).unwrap();
    assert!(sb.top(&cache).is_none(), "the tmpfs is gone from the path");
    assert_eq!(fs::metadata(cache.join("big004")).unwrap().len(), MIB);
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}

/// A fallback whose write-back fails on a full disk, without `reoffload_after`: once
/// the disk has room again, the agent finishes the write-back within a few
/// intervals, and the mount stays fallen back (to be offloaded again). Before, it
/// was retried only by a due re-offload, so never without `reoffload_after`, and the
/// application's files stayed in the held RAM copy until a `down`; and after a retry
/// that succeeded, the mount was forgotten as fallen back (a hunting helper's probes).
#[test]
fn a_fallback_left_pending_by_a_full_disk_finishes_once_there_is_room() {
    let sb = Sandbox::new();
    let disk = sb.path("disk");
    fs::create_dir(&disk).unwrap();
    nix::mount::mount(
        Some("disk"),
        &disk,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=24m"),
    )
    .unwrap();
    let cache = disk.join("cache");
    fs::create_dir(&cache).unwrap();
    fs::write(disk.join("filler"), vec![0u8; 14 << 20]).unwrap();
    let spec = sb.one_mount_spec(
        "c",
        &cache,
        "20MiB",
        "    persist: on-stop\n    watchdog: { high: 50%, low: 20%, action: fallback }\n",
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    let mut written = Vec::new();
    for i in 0..12 {
        let name = format!("big{i:02}");
        if fs::write(cache.join(&name), vec![i as u8; 1 << 20]).is_ok() {
            written.push(name);
        }
    }
    agent.wait_for("the fallback", |m| m.state("c") == Some("fallback"));
    std::thread::sleep(Duration::from_secs(1));
    fs::remove_file(disk.join("filler")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let on_disk = || written.iter().filter(|n| cache.join(n).exists()).count();
    while on_disk() < written.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(on_disk(), written.len(), "{}", agent.log());
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(agent.metrics().state("c"), Some("fallback"), "{}", agent.log());
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}

/// A second agent on the same state directory is refused (exit 4, naming the one
/// running) and changes nothing; the first goes on. Before, both acted on the same
/// mounts, and `status` lost the running one once the second stopped (a hunting
/// helper's probe).
#[test]
fn a_second_agent_on_the_same_state_directory_is_refused() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    watchdog: { high: 85%, low: 60%, action: evict }\n",
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    let mut second = sb
        .cmd()
        .arg("agent")
        .arg(&spec)
        .env("TMPFSCTL_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a second agent that is not refused runs until stopped.
    let start = Instant::now();
    while second.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = second.kill();
    let second = second.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(4), "{err}");
    assert!(err.contains("another agent runs on the state directory"), "{err}");
    let st = sb.run(["status".as_ref(), spec.as_os_str()]);
    assert!(st.stdout.contains("agent: running"), "{st}");
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}

/// The agent's stderr is a pipe nobody reads: 3,000 reloads (a log line each)
/// fill it. The agent goes on (its metrics stay fresh) and stops at SIGTERM.
/// Before, it blocked in `write` for good once the pipe was full, and ignored
/// SIGTERM (a hunting helper's probe).
#[test]
fn an_agent_whose_stderr_is_not_read_goes_on() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    watchdog: { high: 85%, low: 60%, action: evict }\n",
    );
    let metrics = sb.path("metrics.prom");
    let mut child = sb
        .cmd()
        .arg("agent")
        .arg(&spec)
        .arg("--metrics")
        .arg(&metrics)
        .args(["--interval", "200ms"])
        .env("TMPFSCTL_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let start = Instant::now();
    while !fs::read_to_string(&metrics)
        .unwrap_or_default()
        .contains("state=\"offloaded\"} 1")
    {
        assert!(start.elapsed() < DEADLINE, "never offloaded");
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..3000 {
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("the agent did not stop with its stderr unread");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
}

/// The spec is a symlink into a directory swapped at each update, as Kubernetes
/// mounts a ConfigMap (`spec.yaml -> ..data/spec.yaml`, `..data -> ..v1`, then
/// `..v2`, `..v3`, each old one removed). Every update is reloaded. Before, the
/// first was and the later ones were not (until a SIGHUP): the watch stayed on the
/// first target directory (a hunting helper's probe).
#[test]
fn a_spec_in_a_swapped_symlinked_directory_is_reloaded_at_every_update() {
    use std::os::unix::fs::symlink;
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let cfg = sb.path("cfg");
    fs::create_dir(&cfg).unwrap();
    let text = |high: u32| {
        format!(
            "version: 1\nmounts:\n  - name: c\n    path: {}\n    size: 8MiB\n    watchdog: {{ high: {high}%, low: 40%, action: evict }}\n",
            cache.display()
        )
    };
    let publish = |v: u32| {
        let dir = cfg.join(format!("..v{v}"));
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("spec.yaml"), text(90 - v)).unwrap();
        symlink(format!("..v{v}"), cfg.join("..data_tmp")).unwrap();
        fs::rename(cfg.join("..data_tmp"), cfg.join("..data")).unwrap();
        if v > 1 {
            fs::remove_dir_all(cfg.join(format!("..v{}", v - 1))).unwrap();
        }
    };
    publish(1);
    symlink("..data/spec.yaml", cfg.join("spec.yaml")).unwrap();
    let mut agent = Agent::start(&sb, &cfg.join("spec.yaml"), &[], &[]);
    wait_offloaded(&mut agent, "c");
    for (v, reloads) in [(2, 1.0), (3, 2.0), (4, 3.0)] {
        publish(v);
        agent.wait_for(&format!("the reload of ..v{v}"), |m| {
            m.get("tmpfsctl_agent_reloads_total{result=\"ok\"}") == reloads
        });
    }
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}

/// `action: [grow, fallback]` while another tmpfsctl holds the state lock for a
/// few seconds: the mount grows once the lock is free and does not fall back.
/// Before this check only handed over, the busy grow moved the chain on for good,
/// and the mount went to disk (a review helper's probe: 4 of 4).
#[test]
fn a_grow_the_lock_holds_up_is_not_taken_for_a_fallback() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_one(
        &sb,
        &cache,
        "    persist: on-stop\n    watchdog:\n      high: 80%\n      low: 40%\n      action: [grow, fallback]\n      max_size: 64MiB\n",
    );
    let mut agent = Agent::start(&sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "c");
    let lock = fs::OpenOptions::new()
        .write(true)
        .open(sb.path("state/lock"))
        .unwrap();
    let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    for i in 0..7 {
        fs::write(cache.join(format!("obj{i}")), vec![0u8; 1 << 20]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    drop(held);
    let m = agent.wait_for("the grow", |m| m.actions("c", "grow") >= 1.0);
    assert_eq!(m.actions("c", "fallback"), 0.0, "{}", agent.log());
    assert_eq!(m.state("c"), Some("offloaded"), "{}", agent.log());
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}
