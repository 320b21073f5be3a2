//! `tmpfsctl advise` against a synthetic application: a writer thread with a
//! known file size and working set, in a directory on a loop-device ext4 of the
//! test's own (so that its block device writes for this test only), in the test
//! thread's private mount namespace. The figures are checked against what the
//! writer itself counted while advise ran, within the tolerances stated at each
//! check; never against a speed.

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::common::{LoopFs, Sandbox};

const SIZE: u64 = 16 << 10;
const KEEP: u64 = 100;
const RATE: f64 = 40.0;

/// The synthetic application: every 1/RATE s it writes a file of SIZE under a
/// temporary name, fsyncs it, renames it into place and deletes the oldest, so
/// that KEEP files remain (a cache that expires its own entries).
struct Writer {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    enospc: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn prefill(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    for n in 0..KEEP {
        fs::write(dir.join(format!("f{n}")), vec![b'x'; SIZE as usize]).unwrap();
    }
}

impl Writer {
    /// Starts writing after the KEEP files `prefill` made.
    fn start(dir: &Path) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let enospc = Arc::new(AtomicU64::new(0));
        let (s, d, e, full, dir) = (
            stop.clone(),
            done.clone(),
            errors.clone(),
            enospc.clone(),
            dir.to_path_buf(),
        );
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut n = KEEP;
            while !s.load(Ordering::Relaxed) {
                let due = start + Duration::from_secs_f64((n - KEEP) as f64 / RATE);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let tmp = dir.join(format!(".tmp{n}"));
                let res = fs::File::create(&tmp)
                    .and_then(|mut f| {
                        f.write_all(&vec![b'y'; SIZE as usize])?;
                        f.sync_all()
                    })
                    .and_then(|()| fs::rename(&tmp, dir.join(format!("f{n}"))))
                    .and_then(|()| fs::remove_file(dir.join(format!("f{}", n - KEEP))));
                match res {
                    Ok(()) => {
                        d.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(err) => {
                        if err.raw_os_error() == Some(libc::ENOSPC) {
                            full.fetch_add(1, Ordering::SeqCst);
                        }
                        e.fetch_add(1, Ordering::SeqCst);
                    }
                }
                n += 1;
            }
        });
        Writer {
            stop,
            done,
            errors,
            enospc,
            thread: Some(thread),
        }
    }

    fn done(&self) -> u64 {
        self.done.load(Ordering::SeqCst)
    }

    /// Stops; (files written, errors, ENOSPC among them).
    fn stop(mut self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        (
            self.done(),
            self.errors.load(Ordering::SeqCst),
            self.enospc.load(Ordering::SeqCst),
        )
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{path} missing in {v:#}"))
}

fn f(v: &Value, path: &str) -> f64 {
    v.pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} missing in {v:#}"))
}

/// `lo <= x <= hi`, with the report on failure.
fn within(what: &str, x: f64, lo: f64, hi: f64, report: &Value) {
    assert!(
        (lo..=hi).contains(&x),
        "{what} = {x}, expected {lo}..={hi}\n{report:#}"
    );
}

/// A loop ext4 with the cache directory `cache` on it, prefilled.
fn disk(sb: &Sandbox) -> (LoopFs, PathBuf) {
    let disk = LoopFs::new(&sb.path("disk"), 64, "defaults");
    let dir = disk.mount_point.join("cache");
    prefill(&dir);
    (disk, dir)
}

#[test]
fn advise_reports_a_synthetic_writer_within_tolerances() {
    let sb = Sandbox::new();
    let (_disk, dir) = disk(&sb);
    let w = Writer::start(&dir);
    std::thread::sleep(Duration::from_millis(300));
    let before = w.done();
    let r = sb.run([
        "advise".as_ref(),
        dir.as_os_str(),
        "--for".as_ref(),
        "5s".as_ref(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    let did = (w.done() - before) as f64;
    let (_, errors, _) = w.stop();
    r.code(0);
    assert_eq!(errors, 0, "the writer failed");
    let j = r.json();
    within("seconds", f(&j, "/seconds"), 5.0, 5.5, &j);
    assert_eq!(j["interrupted"], false);
    // The writer ran near its rate; advise's window lies within its process's
    // life, which also walks the tree before and after: each count is at most
    // what the writer did meanwhile (+1 for a file in flight at either end) and
    // at least 75% of it.
    assert!(did >= RATE * 5.0 * 0.5, "the writer did only {did} files");
    for what in ["creates", "writes", "renames", "deletes"] {
        let n = f(&j, &format!("/activity/total/{what}"));
        within(what, n, did * 0.75, did + 2.0, &j);
    }
    // Each file grows from 0 to SIZE once: the bytes are the files × SIZE, give or
    // take a file whose creation fell before the watch.
    let creates = f(&j, "/activity/total/creates");
    let bytes = f(&j, "/activity/total/bytes_written");
    within(
        "bytes_written",
        bytes,
        (creates - 2.0) * SIZE as f64,
        (creates + 1.0) * SIZE as f64,
        &j,
    );
    within(
        "files_touched",
        f(&j, "/activity/files_touched"),
        creates - 1.0,
        creates + 2.0,
        &j,
    );
    within(
        "per_second.creates",
        f(&j, "/per_second/creates"),
        creates / 5.5,
        creates / 5.0 + 0.01,
        &j,
    );
    // The busiest second holds at least the average and at most everything.
    let peak = f(&j, "/activity/peak_1s/bytes_written");
    within("peak_1s.bytes_written", peak, bytes / 6.0, bytes, &j);
    assert_eq!(u(&j, "/activity/overflows"), 0);
    // The tree: KEEP files (one more while a temporary file is in flight, one fewer
    // when the listing misses the name being renamed: readdir need not return an
    // entry renamed while it reads, and ext4 moves it in its hash order; seen in CI
    // under load) and the directory itself.
    within(
        "tree.end.files",
        f(&j, "/tree/end/files"),
        KEEP as f64 - 1.0,
        KEEP as f64 + 1.0,
        &j,
    );
    within(
        "tree.end.inodes",
        f(&j, "/tree/end/inodes"),
        f(&j, "/tree/end/files") + 1.0,
        f(&j, "/tree/end/files") + 1.0,
        &j,
    );
    let size = SIZE as f64;
    within(
        "tree.end.bytes",
        f(&j, "/tree/end/bytes"),
        (KEEP - 1) as f64 * size,
        (KEEP + 1) as f64 * size,
        &j,
    );
    within(
        "tree.peak_bytes",
        f(&j, "/tree/peak_bytes"),
        KEEP as f64 * size - size,
        (KEEP + 1) as f64 * size,
        &j,
    );
    assert_eq!(u(&j, "/tree/end/sizes/median"), SIZE);
    assert!(u(&j, "/tree/samples") >= 3, "{j:#}");
    // Every file was fsynced: the loop device wrote.
    assert!(
        j["device"]["device"].as_str().unwrap().starts_with("loop"),
        "{j:#}"
    );
    assert!(u(&j, "/device/write_ops") > 0, "{j:#}");
    // The recommendation: a cache that deletes its entries is evicted, and its peak
    // sits at 75% of the size.
    let e = &j["advice"]["entry"];
    assert_eq!(e["action"], serde_json::json!(["evict"]), "{j:#}");
    assert_eq!(
        (e["persist"].as_str(), e["huge"].as_str()),
        (Some("none"), Some("never"))
    );
    assert!(u(&j, "/advice/entry/size") as f64 >= f(&j, "/tree/peak_bytes") / 0.75);
    assert!((80..=90).contains(&u(&j, "/advice/entry/high")), "{j:#}");
    assert!(u(&j, "/advice/entry/inodes") >= 2 * u(&j, "/tree/peak_inodes"));
    within(
        "saving.bytes_per_hour",
        f(&j, "/advice/saving/bytes_per_hour"),
        bytes / f(&j, "/seconds") * 3600.0 * 0.99,
        bytes / f(&j, "/seconds") * 3600.0 * 1.01,
        &j,
    );
    assert!(
        j["advice"]["saving"]["device_write_ops_per_hour"]
            .as_u64()
            .is_some(),
        "{j:#}"
    );
}

/// What `--spec` prints is a spec `validate` accepts; applied, it holds the same
/// workload under the agent without a full filesystem.
#[test]
fn advise_spec_validates_and_holds_the_workload_under_the_agent() {
    let sb = Sandbox::new();
    let (_disk, dir) = disk(&sb);
    let w = Writer::start(&dir);
    let r = sb.run([
        "advise".as_ref(),
        dir.as_os_str(),
        "--for".as_ref(),
        "3s".as_ref(),
        "--spec".as_ref(),
    ]);
    let _ = w.stop();
    r.code(0).stdout_has("version: 1").stdout_has("action: evict");
    let spec = sb.write_spec("advised.yaml", &r.stdout);
    sb.run(["validate".as_ref(), spec.as_os_str()]).code(0);

    // The application starts again from its KEEP files, now in RAM.
    fs::remove_dir_all(&dir).unwrap();
    prefill(&dir);
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(sb.top(&dir).map(|m| m.fstype), Some("tmpfs".to_string()));
    let log = sb.path("agent.log");
    let mut agent = sb
        .cmd()
        .arg("agent")
        .arg(&spec)
        .args(["--metrics", "off", "--interval", "200ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let w = Writer::start(&dir);
    std::thread::sleep(Duration::from_secs(5));
    let (did, errors, enospc) = w.stop();
    let alive = agent.try_wait().unwrap().is_none();
    let _ = kill(Pid::from_raw(agent.id() as i32), Signal::SIGTERM);
    let _ = agent.wait();
    let log = fs::read_to_string(&log).unwrap_or_default();
    assert!(alive, "the agent exited\n{log}");
    assert!(did > 0);
    assert_eq!((errors, enospc), (0, 0), "the writer failed\n{log}");
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
}

#[test]
fn advise_interrupted_reports_what_it_saw() {
    let sb = Sandbox::new();
    let dir = sb.path("cache");
    prefill(&dir);
    let child = sb
        .cmd()
        .args([
            "advise".as_ref(),
            dir.as_os_str(),
            "--for".as_ref(),
            "1h".as_ref(),
            "--format".as_ref(),
            "json".as_ref(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let pid = Pid::from_raw(child.id() as i32);
    kill(pid, Signal::SIGINT).unwrap();
    let mut child = child;
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        // A hang guard, not a speed threshold.
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("advise did not stop after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut text = String::new();
    child.stdout.take().unwrap().read_to_string(&mut text).unwrap();
    assert_eq!(status.code(), Some(0), "{text}");
    let j: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(j["interrupted"], true);
    assert!(f(&j, "/seconds") < 60.0, "{j:#}");
    assert_eq!(u(&j, "/tree/end/files"), KEEP);
    let warnings = j["advice"]["warnings"].to_string();
    assert!(warnings.contains("nothing was created"), "{warnings}");
}

#[test]
fn advise_refuses_bad_input_with_exit_2() {
    let sb = Sandbox::new();
    let file = sb.path("file");
    fs::write(&file, "x").unwrap();
    sb.run(["advise".as_ref(), file.as_os_str()])
        .code(2)
        .stderr_has("is not a directory");
    for bad in ["0s", "25h", "10"] {
        sb.run(["advise", "/tmp", "--for", bad])
            .code(2)
            .stderr_has("--for");
    }
    sb.run(["advise", "/tmp", "--for", "0s"])
        .stderr_has("from 1s to 24h");
    sb.run(["advise", "/tmp", "--spec", "--format", "json"]).code(2);
    // A spec cannot name a directory whose path is not plain text: refused
    // before the watch, not written with U+FFFD in its place.
    let odd = sb.root.join(OsStr::from_bytes(b"ca\xffche"));
    fs::create_dir(&odd).unwrap();
    sb.run(["advise".as_ref(), odd.as_os_str(), "--spec".as_ref()])
        .code(2)
        .stderr_has("cannot name this directory");
}

/// On a terminal, a progress line is kept up to date on stderr and erased before
/// the report.
#[test]
fn advise_shows_progress_on_a_terminal() {
    let sb = Sandbox::new();
    let dir = sb.path("cache");
    prefill(&dir);
    let cmd = format!(
        "{} advise {} --for 2s",
        env!("CARGO_BIN_EXE_tmpfsctl"),
        dir.display()
    );
    // script(1) gives the command a pseudo-terminal and copies what it wrote.
    let r = sb.run_with(
        std::process::Command::new("script"),
        ["-qec", cmd.as_str(), "/dev/null"],
    );
    r.code(0)
        .stdout_has("\rwatching ")
        .stdout_has("s of 2s, 0 creates, 0B written, 0 deletes")
        .stdout_has("\r\x1b[K")
        .stdout_has("RECOMMENDED MOUNT ENTRY");
}
