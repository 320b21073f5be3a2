//! What tmpfsctl prints, against a reader that went away and against host
//! strings chosen by a hostile neighbour.
//!
//! Every command is run with stdout, stderr or both connected to a pipe whose
//! read end is already closed (every write fails with EPIPE, as after `| head
//! -c0`), in a fresh sandbox each time, and must end exactly as a normal run
//! does: the same exit status, the same mounts and files left behind, no
//! panic. Process names, paths and spec values full of control characters
//! must reach human output only escaped (see `tmpfsctl::out::escape`).

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, Sandbox};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Normal,
    StdoutClosed,
    StderrClosed,
    BothClosed,
}

const MODES: [Mode; 4] = [
    Mode::Normal,
    Mode::StdoutClosed,
    Mode::StderrClosed,
    Mode::BothClosed,
];

/// A pipe nobody will ever read.
fn closed_pipe() -> Stdio {
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    Stdio::from(writer)
}

struct Ran {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

fn show(args: &[OsString], r: &Ran) -> String {
    format!(
        "$ tmpfsctl {}\nexit: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        r.code,
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    )
}

fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(a: I) -> Vec<OsString> {
    a.into_iter().map(|s| s.as_ref().to_os_string()).collect()
}

/// Runs tmpfsctl with the streams `mode` closes connected to a dead pipe,
/// the others captured.
fn run_in(sb: &Sandbox, mode: Mode, a: &[OsString]) -> Ran {
    let mut c = sb.cmd();
    c.args(a).stdin(Stdio::null());
    let (out_closed, err_closed) = match mode {
        Mode::Normal => (false, false),
        Mode::StdoutClosed => (true, false),
        Mode::StderrClosed => (false, true),
        Mode::BothClosed => (true, true),
    };
    c.stdout(if out_closed { closed_pipe() } else { Stdio::piped() });
    c.stderr(if err_closed { closed_pipe() } else { Stdio::piped() });
    let out = c.output().expect("spawn tmpfsctl");
    let r = Ran {
        code: out.status.code(),
        stdout: out.stdout,
        stderr: out.stderr,
    };
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe") && r.code != Some(101),
        "{mode:?}: a closed reader is no failure\n{}",
        show(a, &r)
    );
    if mode == Mode::Normal {
        assert!(
            !r.stdout.is_empty() || !r.stderr.is_empty(),
            "the normal run prints something, so the closed runs meet a dead pipe\n{}",
            show(a, &r)
        );
    }
    r
}

/// The mounts below the sandbox as a normal run would leave them, with the
/// sandbox's own path taken out so that two sandboxes compare.
fn mount_state(sb: &Sandbox) -> Vec<String> {
    let root = sb.root.to_string_lossy().into_owned();
    let mut v: Vec<String> = sb
        .mounts()
        .into_iter()
        .map(|e| {
            format!(
                "{} {} {} {} size={}",
                e.mount_point.to_string_lossy().replace(&root, "ROOT"),
                e.fstype,
                e.source.replace(&root, "ROOT"),
                e.mount_options.join(","),
                e.super_option("size").unwrap_or("-")
            )
        })
        .collect();
    v.sort();
    v
}

/// Every file below `dir` with its content, as the application would see it.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
                out.push(format!("{rel}/"));
            } else {
                let content = fs::read(&p).unwrap();
                out.push(format!(
                    "{rel}: {} bytes, {}",
                    content.len(),
                    content.first().unwrap_or(&0)
                ));
            }
        }
    }
    out.sort();
    out
}

/// Every command once (and `apply`, `down` twice), in one fresh sandbox: the
/// exit statuses and what the host looks like after the commands that change it.
fn transcript(mode: Mode) -> Vec<String> {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 1234, 2345, 0o750);
    fs::write(cache.join("index"), vec![7u8; 100_000]).unwrap();
    let big = sb.cache_dir("var/cache/big", 0, 0, 0o755);
    fs::write(big.join("blob"), vec![1u8; 2 << 20]).unwrap();
    // `big` cannot be seeded into 1MiB: apply degrades it and exits 3.
    let spec = sb.write_spec(
        "cache.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: app\n    path: {}\n    size: 8MiB\n    persist: on-stop\n  - name: big\n    path: {}\n    size: 1MiB\n",
            cache.display(),
            big.display()
        ),
    );
    let bad = sb.write_spec(
        "bad.yaml",
        "version: 1\nmounts:\n  - name: x\n    size: 12 parsecs\n",
    );
    let image = sb.path("image");
    let bench_dir = common::disk_tempdir("tmpfsctl-output-it-");
    let s = spec.as_os_str();
    let mut log = Vec::new();
    let root = sb.root.to_string_lossy().into_owned();
    let bench_root = bench_dir.path().to_string_lossy().into_owned();
    let step = |a: Vec<OsString>| {
        let r = run_in(&sb, mode, &a);
        let shown: Vec<String> = a
            .iter()
            .map(|x| {
                x.to_string_lossy()
                    .replace(&root, "ROOT")
                    .replace(&bench_root, "DISK")
            })
            .collect();
        format!("{} -> {:?}", shown.join(" "), r.code)
    };
    let cmds: Vec<Vec<OsString>> = vec![
        args([OsStr::new("validate"), s]),
        args([OsStr::new("plan"), s]),
        args([OsStr::new("plan"), s, "--format".as_ref(), "json".as_ref()]),
        args([OsStr::new("apply"), s]),
    ];
    log.extend(cmds.into_iter().map(step));
    log.push(format!("mounts: {:?}", mount_state(&sb)));
    fs::write(cache.join("made-in-ram"), "ram").unwrap();
    let cmds: Vec<Vec<OsString>> = vec![
        args([OsStr::new("apply"), s, "--format".as_ref(), "json".as_ref()]),
        args(["status"]),
        args([OsStr::new("status"), s]),
        args([OsStr::new("status"), s, "--format".as_ref(), "json".as_ref()]),
        args([OsStr::new("sync"), s]),
        args([OsStr::new("sync"), s, "--format".as_ref(), "json".as_ref()]),
        args([OsStr::new("residency"), cache.as_os_str()]),
        args([
            OsStr::new("residency"),
            cache.as_os_str(),
            "--format".as_ref(),
            "json".as_ref(),
        ]),
        args([
            OsStr::new("boot"),
            "install".as_ref(),
            s,
            "--mode".as_ref(),
            "sysv".as_ref(),
            "--root".as_ref(),
            image.as_os_str(),
            "--binary".as_ref(),
            "/usr/bin/tmpfsctl".as_ref(),
        ]),
        args([
            OsStr::new("boot"),
            "remove".as_ref(),
            "--root".as_ref(),
            image.as_os_str(),
        ]),
        args([OsStr::new("down"), s]),
    ];
    log.extend(cmds.into_iter().map(step));
    log.push(format!("mounts: {:?}", mount_state(&sb)));
    log.push(format!("on disk: {:?}", files(&sb.path("var/cache"))));
    let cmds: Vec<Vec<OsString>> = vec![
        args([OsStr::new("down"), s, "--format".as_ref(), "json".as_ref()]),
        args([OsStr::new("validate"), bad.as_os_str()]),
        args([OsStr::new("down"), s, "nosuch".as_ref()]),
        args(["completions", "bash"]),
        args(["manpage"]),
        args(["--help"]),
        args(["--version"]),
        args(["no-such-command"]),
        args([
            OsStr::new("bench"),
            "--disk".as_ref(),
            bench_dir.path().as_os_str(),
            "--size".as_ref(),
            "1MiB".as_ref(),
            "--runs".as_ref(),
            "1".as_ref(),
            "--time-cap".as_ref(),
            "0.2".as_ref(),
        ]),
    ];
    log.extend(cmds.into_iter().map(step));
    log.push(format!("mounts: {:?}", mount_state(&sb)));
    log
}

#[test]
fn every_command_ends_as_usual_when_nobody_reads_its_output() {
    let normal = transcript(Mode::Normal);
    // The scenario means something: it changes the host, degrades, fails.
    let text = normal.join("\n");
    for want in [
        "apply ROOT/cache.yaml -> Some(3)",
        "tmpfsctl-app",
        "made-in-ram",
        "-> Some(2)",
    ] {
        assert!(text.contains(want), "{want:?} in\n{text}");
    }
    for mode in &MODES[1..] {
        let got = transcript(*mode);
        for (n, g) in normal.iter().zip(&got) {
            assert_eq!(g, n, "{mode:?} differs from a normal run");
        }
        assert_eq!(got.len(), normal.len());
    }
}

/// `tmpfsctl residency DIR | head -n1`: the reader leaves while the command
/// is still writing (more than a pipe buffer holds).
#[test]
fn a_reader_leaving_part_way_stops_the_output_quietly() {
    let sb = Sandbox::new();
    let dir = sb.cache_dir("many", 0, 0, 0o755);
    for i in 0..3000 {
        fs::write(dir.join(format!("file-with-a-longish-name-{i:05}")), "x").unwrap();
    }
    let mut child = sb
        .cmd()
        .args([OsStr::new("residency"), dir.as_os_str()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("PAGES"), "{first}");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "nothing on stderr: {err}");
}

/// Metrics file sample, or NaN.
fn metric(path: &Path, series: &str) -> f64 {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(f64::NAN)
}

fn wait_until(child: &mut Child, what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the agent exited ({st}) while waiting for {what}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The agent logs to stderr; when that is a pipe nobody reads any more (a
/// journal stream that went away), it keeps working and stops as usual.
/// With a log file, a hostile value it logs stays on one escaped line.
#[test]
fn the_agent_works_on_with_a_dead_log_and_escapes_what_it_logs() {
    for dead in [true, false] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("c", 0, 0, 0o755);
        let good = format!(
            "version: 1\nmounts:\n  - name: c\n    path: {}\n    size: 8MiB\n",
            cache.display()
        );
        let spec = sb.write_spec("cache.yaml", &good);
        let metrics = sb.path("metrics.prom");
        let log = sb.path("agent.log");
        let mut child = sb
            .cmd()
            .args([
                OsStr::new("agent"),
                spec.as_os_str(),
                "--metrics".as_ref(),
                metrics.as_os_str(),
            ])
            .args(["--interval", "200ms"])
            .env("TMPFSCTL_LOG", "debug")
            .env_remove("JOURNAL_STREAM")
            .stdin(Stdio::null())
            .stdout(if dead { closed_pipe() } else { Stdio::null() })
            .stderr(if dead {
                closed_pipe()
            } else {
                Stdio::from(fs::File::create(&log).unwrap())
            })
            .spawn()
            .unwrap();
        let state = "tmpfsctl_mount_state{name=\"c\",state=\"offloaded\"}";
        wait_until(&mut child, "the mount offloaded", || {
            metric(&metrics, state) == 1.0
        });
        // An invalid name full of control characters: the reload is refused
        // and logged with the value.
        fs::write(
            &spec,
            good.replace("name: c", "name: \"\\e]0;OWNED\\a\\e[2J\\nx\""),
        )
        .unwrap();
        let invalid = "tmpfsctl_agent_reloads_total{result=\"invalid\"}";
        wait_until(&mut child, "the invalid reload", || {
            metric(&metrics, invalid) >= 1.0
        });
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let st = child.wait().unwrap();
        assert_eq!(st.code(), Some(0), "dead log: {dead}: {st}");
        if !dead {
            let text = fs::read(&log).unwrap();
            assert_printable(&text, "the agent's log");
            let text = String::from_utf8(text).unwrap();
            let line = text
                .lines()
                .find(|l| l.contains("OWNED"))
                .unwrap_or_else(|| panic!("the refused value is logged\n{text}"));
            assert!(line.contains("\\x1b]0;OWNED\\x07\\x1b[2J\\nx"), "{line}");
            assert!(
                line.contains("cache.yaml:3:"),
                "the diagnostic on the same line: {line}"
            );
        }
    }
}

/// Fails unless `text` is UTF-8 with no control character but the line breaks.
fn assert_printable(text: &[u8], what: &str) {
    let s = std::str::from_utf8(text).unwrap_or_else(|e| panic!("{what} is not UTF-8: {e}"));
    let raw: Vec<char> = s
        .chars()
        .filter(|&c| c != '\n' && (c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)))
        .collect();
    assert!(raw.is_empty(), "{what} has raw control characters {raw:?}:\n{s}");
}

/// A process holding a file in the tmpfs, named `comm` (the raw bytes, as a
/// process can name itself anything).
fn named_holder(file: &Path, comm: &[u8]) -> Child {
    let mut c = Command::new("bash")
        .arg("-c")
        .arg("exec 3<\"$1\"; printf %s \"$2\" > /proc/self/comm; echo ready; read -r _")
        .arg("bash")
        .arg(file)
        .arg(OsStr::from_bytes(comm))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = [0u8; 6];
    c.stdout.as_mut().unwrap().read_exact(&mut ready).unwrap();
    let comm_now = fs::read(format!("/proc/{}/comm", c.id())).unwrap();
    assert_eq!(&comm_now[..comm_now.len() - 1], comm, "the name took");
    c
}

#[test]
fn hostile_process_names_reach_down_escaped() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    let spec = sb.one_mount_spec("app", &cache, "8MiB", "");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("held"), "x").unwrap();
    let title: &[u8] = b"\x1b]0;OWNED\x07\x1b[2J";
    // The newline last: bash writes a line at a time, and each write to
    // /proc/self/comm replaces the name.
    let mixed: &[u8] = b"b\xff\xc2\x9b\x7f\t\n";
    let down = |format: &str| {
        let holders = [
            named_holder(&cache.join("held"), title),
            named_holder(&cache.join("held"), mixed),
        ];
        let a = args([
            OsStr::new("down"),
            spec.as_os_str(),
            "--format".as_ref(),
            format.as_ref(),
        ]);
        let r = run_in(&sb, Mode::Normal, &a);
        let pids = holders.map(|mut h| {
            let _ = h.kill();
            let _ = h.wait();
            h.id()
        });
        assert_eq!(r.code, Some(0), "{}", show(&a, &r));
        (pids, String::from_utf8(r.stdout).unwrap())
    };

    let (pids, out) = down("human");
    assert_printable(out.as_bytes(), "down's output");
    for (pid, shown) in pids
        .iter()
        .zip(["\\x1b]0;OWNED\\x07\\x1b[2J", "b\\xff\\u{9b}\\x7f\\t\\n"])
    {
        let want = format!("held by pid {pid} ({shown})");
        assert!(out.contains(&want), "{want:?} in\n{out}");
    }

    // JSON is the same report, serde-escaped: the exact name survives.
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("held"), "x").unwrap();
    let (_, json) = down("json");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let names: Vec<&str> = v[0]["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("holders in {json}"))
        .iter()
        .map(|h| h["command"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"\u{1b}]0;OWNED\u{7}\u{1b}[2J"), "{names:?}");
    assert!(names.contains(&"b\u{fffd}\u{9b}\u{7f}\t\n"), "{names:?}");
}

/// The parent of a managed path renamed by whoever owns it: `status` and
/// `down` read the new path from the mount table and show it escaped (or,
/// in JSON, lossily: never a panic).
#[test]
fn a_path_renamed_by_its_owner_reaches_status_escaped() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("user/cache", 0, 0, 0o755);
    let spec = sb.one_mount_spec("app", &cache, "8MiB", "");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let mut hostile = sb.root.clone().into_os_string().into_vec();
    hostile.extend_from_slice(b"/\x1b[2J\n\xff\xe2\x80\xaeevil");
    let hostile = PathBuf::from(OsString::from_vec(hostile));
    fs::rename(sb.path("user"), &hostile).unwrap();
    for a in [args(["status"]), args([OsStr::new("status"), spec.as_os_str()])] {
        let r = run_in(&sb, Mode::Normal, &a);
        assert_eq!(r.code, Some(0), "{}", show(&a, &r));
        assert_printable(&r.stdout, "status");
    }
    let r = run_in(&sb, Mode::Normal, &args(["status"]));
    let out = String::from_utf8(r.stdout).unwrap();
    assert!(out.contains("/\\x1b[2J\\n\\xff\\u{202e}evil/cache"), "{out}");
    // JSON has the path as a JSON string, its non-UTF-8 byte as U+FFFD.
    let a = args(["status", "--format", "json"]);
    let r = run_in(&sb, Mode::Normal, &a);
    assert_eq!(r.code, Some(0), "{}", show(&a, &r));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let path = v["mounts"][0]["path"].as_str().unwrap();
    assert!(
        path.ends_with("/\u{1b}[2J\n\u{fffd}\u{202e}evil/cache"),
        "{path:?}"
    );
    // `down` finds it by its source wherever it went, and says where.
    let a = args([
        OsStr::new("down"),
        spec.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    let r = run_in(&sb, Mode::Normal, &a);
    assert_eq!(r.code, Some(0), "{}", show(&a, &r));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert!(v[0]["path"].as_str().unwrap().contains("\u{fffd}"), "{v}");
    assert!(
        sb.mounts().iter().all(|e| e.source != "tmpfsctl-app"),
        "taken down"
    );
    fs::rename(&hostile, sb.path("user")).unwrap();
}

/// Error messages embed paths and values from the command line, the spec and
/// the host: they are escaped too.
#[test]
fn error_messages_show_hostile_strings_escaped() {
    let sb = Sandbox::new();
    let dir = sb.cache_dir("c", 0, 0, 0o755);
    let spec = sb.write_spec(
        "cache.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: \"\\e]0;OWNED\\a\"\n    path: {}\n    size: 1MiB\n",
            dir.display()
        ),
    );
    let good = sb.write_spec(
        "good.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: c\n    path: {}\n    size: 1MiB\n",
            dir.display()
        ),
    );
    let mut missing = sb.root.clone().into_os_string().into_vec();
    missing.extend_from_slice(b"/\x1b[2J\n\xff.yaml");
    let missing = OsString::from_vec(missing);
    let cases: Vec<(Vec<OsString>, i32, &str)> = vec![
        (
            args([OsStr::new("validate"), spec.as_os_str()]),
            2,
            "`\\x1b]0;OWNED\\x07`",
        ),
        // Messages that show a path through std's `display()` have already
        // replaced its non-UTF-8 bytes with U+FFFD; the controls are escaped.
        (
            args([OsStr::new("validate"), &missing]),
            2,
            "\\x1b[2J\\n\u{fffd}.yaml",
        ),
        (
            args([OsStr::new("status"), &missing]),
            2,
            "\\x1b[2J\\n\u{fffd}.yaml",
        ),
        (
            args([OsStr::new("residency"), &missing]),
            1,
            "\\x1b[2J\\n\\xff.yaml",
        ),
        (
            args([OsStr::new("bench"), "--disk".as_ref(), &missing]),
            1,
            "\\x1b[2J\\n\\xff.yaml",
        ),
        (
            args([OsStr::new("down"), good.as_os_str(), "\u{1b}[2J\u{9b}".as_ref()]),
            2,
            "`\\x1b[2J\\u{9b}`",
        ),
    ];
    for (a, code, want) in cases {
        let r = run_in(&sb, Mode::Normal, &a);
        let text = show(&a, &r);
        assert_eq!(r.code, Some(code), "{text}");
        assert_printable(&r.stderr, &text);
        assert!(
            String::from_utf8_lossy(&r.stderr).contains(want),
            "{want:?} in\n{text}"
        );
    }

    // A path deep in an error chain: a state directory below a file whose
    // name is hostile (the status is not this test's business).
    let mut blocker = sb.root.clone().into_os_string().into_vec();
    blocker.extend_from_slice(b"/\x1b]0;OWNED\x07\n");
    let blocker = PathBuf::from(OsString::from_vec(blocker));
    fs::write(&blocker, "").unwrap();
    let mut c = sb.cmd();
    c.env("TMPFSCTL_STATE_DIR", blocker.join("state"));
    let r = sb.run_with(c, ["apply".as_ref(), good.as_os_str()]);
    assert_ne!(r.code, Some(0), "{r}");
    assert_printable(r.stderr.as_bytes(), &r.to_string());
    r.stderr_has("\\x1b]0;OWNED\\x07\\n/state");
    assert!(sb.top(&dir).is_none(), "nothing mounted\n{r}");
}
