//! `tmpfsctl residency` against the real page cache, driven like operators
//! do: the built binary, its exit status and output. Files live on a disk
//! filesystem (POSIX_FADV_DONTNEED does nothing on tmpfs); only the test's
//! own files are dropped from the cache, never the global drop_caches.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common;

use serde_json::Value;
use tmpfsctl::residency::file_residency;

const BIN: &str = env!("CARGO_BIN_EXE_tmpfsctl");
const PAGE: u64 = 4096;

struct Run {
    cmd: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn code(&self, want: i32) -> &Run {
        assert_eq!(self.code, Some(want), "unexpected exit status\n{self}");
        self
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON: {e}\n{self}"))
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cut = |s: &str| s.chars().take(4000).collect::<String>();
        writeln!(f, "$ {}\nexit: {:?}", self.cmd, self.code)?;
        writeln!(
            f,
            "--- stdout\n{}\n--- stderr\n{}",
            cut(&self.stdout),
            cut(&self.stderr)
        )
    }
}

/// Runs a command; fails the test (after killing it) if it takes more than
/// `limit` — a hang, not a speed threshold.
fn run_cmd(mut c: Command, limit: Duration) -> Run {
    let cmd = format!("{c:?}");
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("spawn tmpfsctl");
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel::<std::io::Result<Output>>();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{cmd} hung for {limit:?} and was killed");
        }
    };
    Run {
        cmd,
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn residency(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
    let mut c = Command::new(BIN);
    c.arg("residency");
    for a in args {
        c.arg(a);
    }
    run_cmd(c, Duration::from_secs(120))
}

fn drop_cache(f: &File) {
    f.sync_data().unwrap();
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise DONTNEED");
}

/// A file of `pages` pages of non-zero data, clean and dropped from the cache.
fn cold_file(dir: &Path, name: &str, pages: u64) -> PathBuf {
    let p = dir.join(name);
    let mut f = File::create(&p).unwrap();
    let chunk = vec![0xa5u8; PAGE as usize * 64];
    let mut left = pages * PAGE;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    drop_cache(&f);
    p
}

fn only_file(v: &Value) -> &Value {
    let files = v["files"].as_array().expect("files array");
    assert_eq!(files.len(), 1, "{v:#}");
    &files[0]
}

#[test]
fn fully_read_file_is_100_percent() {
    let dir = common::disk_tempdir("tmpfsctl-residency-");
    let p = cold_file(dir.path(), "data", 1024);
    let mut buf = Vec::new();
    File::open(&p).unwrap().read_to_end(&mut buf).unwrap();

    let r = residency(&[&p, &"--format", &"json"]);
    let v = r.code(0).json();
    let f = only_file(&v);
    assert_eq!(f["pages"], 1024, "{r}");
    assert_eq!(f["cached_pages"], 1024, "{r}");
    assert_eq!(f["percent"], 100.0, "{r}");
    assert_eq!(f["first_cached_page"], 0, "{r}");
    assert_eq!(f["size"], 1024 * PAGE, "{r}");
    assert_eq!(v["total"]["cached_pages"], 1024, "{r}");
    assert_eq!(v["total"]["errors"], 0, "{r}");
}

#[test]
fn dropped_file_is_close_to_zero_percent() {
    let dir = common::disk_tempdir("tmpfsctl-residency-");
    let p = cold_file(dir.path(), "data", 2048);
    let api = file_residency(&p).unwrap();
    assert_eq!(api.pages, 2048);
    assert!(api.percent() <= 1.0, "{api:?}");

    let r = residency(&[&p, &"--format", &"json"]);
    let f = only_file(&r.code(0).json()).clone();
    assert!(f["percent"].as_f64().unwrap() <= 1.0, "{r}");
}

#[test]
fn second_half_read_is_about_half_from_the_middle() {
    let dir = common::disk_tempdir("tmpfsctl-residency-");
    let pages = 2048u64;
    let p = cold_file(dir.path(), "data", pages);
    let mut f = File::open(&p).unwrap();
    f.seek(SeekFrom::Start(pages / 2 * PAGE)).unwrap();
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).unwrap();
    assert_eq!(buf.len() as u64, pages / 2 * PAGE);

    let r = residency(&[&p, &"--format", &"json"]);
    let v = r.code(0).json();
    let f = only_file(&v);
    let pct = f["percent"].as_f64().unwrap();
    assert!((45.0..=55.0).contains(&pct), "{r}");
    let first = f["first_cached_page"].as_u64().expect("a cached page");
    assert!(
        first.abs_diff(pages / 2) <= 32,
        "first cached page {first}, expected ≈ {}\n{r}",
        pages / 2
    );

    let api = file_residency(&p).unwrap();
    assert_eq!(api.first_cached_page, Some(first));
}

#[test]
fn sparse_files_are_quick_and_exact() {
    let dir = common::disk_tempdir("tmpfsctl-residency-");
    // 1 GiB apparent, one page of data in the middle (dirty, so cached).
    let p = dir.path().join("sparse");
    let f = File::create(&p).unwrap();
    f.set_len(1 << 30).unwrap();
    f.write_all_at(b"data", 512 << 20).unwrap();
    // 64 GiB apparent: 64 mmap windows of 1 GiB.
    let big = dir.path().join("sparse-64g");
    let g = File::create(&big).unwrap();
    g.set_len(64 << 30).unwrap();
    g.write_all_at(b"tail", (64 << 30) - 10).unwrap();

    let r = residency(&[&p, &big, &"--format", &"json"]);
    let v = r.code(0).json();
    let files = v["files"].as_array().unwrap();
    assert_eq!(files[0]["pages"], 262_144, "{r}");
    assert_eq!(files[0]["cached_pages"], 1, "{r}");
    assert_eq!(files[0]["first_cached_page"], 131_072, "{r}");
    assert_eq!(files[1]["pages"], 16 << 20, "{r}");
    assert_eq!(files[1]["cached_pages"], 1, "{r}");
    assert_eq!(files[1]["first_cached_page"], (16 << 20) - 1, "{r}");
    assert_eq!(v["total"]["size"], (1u64 << 30) + (64 << 30), "{r}");
}

#[test]
fn empty_files_have_no_pages() {
    let dir = common::disk_tempdir("tmpfsctl-residency-");
    let p = dir.path().join("empty");
    File::create(&p).unwrap();
    let r = residency(&[&p, &"--format", &"json"]);
    let v = r.code(0).json();
    let f = only_file(&v);
    assert_eq!(f["size"], 0, "{r}");
    assert_eq!(f["pages"], 0, "{r}");
    assert_eq!(f["cached_pages"], 0, "{r}");
    assert_eq!(f["percent"], 0.0, "{r}");
    assert!(f["first_cached_page"].is_null(), "{r}");
    assert_eq!(v["total"]["files"], 1, "{r}");
}

#[test]
fn five_thousand_files_and_deep_nesting_with_64_descriptors() {
    let dir = common::disk_tempdir("tmpfsctl-residency-");
    let root = dir.path().join("tree");
    for d in 0..50 {
        let sub = root.join(format!("d{d:02}"));
        fs::create_dir_all(&sub).unwrap();
        for i in 0..100 {
            fs::write(sub.join(format!("f{i:03}")), b"x").unwrap();
        }
    }
    // Deeper than the descriptor limit: directories must not stay open.
    let mut deep = root.join("deep");
    for i in 0..100 {
        deep = deep.join(format!("l{i}"));
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("bottom"), b"y").unwrap();

    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(r#"ulimit -n 64 && exec "$0" "$@""#)
        .arg(BIN)
        .args(["residency", "--format", "json"])
        .arg(&root);
    let r = run_cmd(c, Duration::from_secs(120));
    let v = r.code(0).json();
    assert_eq!(v["total"]["files"], 5001, "{r}");
    assert_eq!(v["total"]["errors"], 0, "{r}");
    assert_eq!(v["total"]["directories"], 1 + 50 + 1 + 100, "{r}");
    let files = v["files"].as_array().unwrap();
    assert_eq!(files.len(), 5001);
    // Written just now, so every page is cached.
    assert!(files.iter().all(|f| f["cached_pages"] == 1), "{r}");
    // Depth-first, in name order.
    assert!(
        files[0]["path"].as_str().unwrap().ends_with("tree/d00/f000"),
        "{r}"
    );
    assert!(
        files[5000]["path"].as_str().unwrap().ends_with("l99/bottom"),
        "{r}"
    );
}

#[test]
fn special_files_are_skipped_without_hanging_and_symlinks_not_followed() {
    let dir = common::disk_tempdir("tmpfsctl-residency-");
    let root = dir.path().join("tree");
    fs::create_dir(&root).unwrap();
    fs::write(root.join("a-file"), b"hello").unwrap();
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    if nix::unistd::geteuid().is_root() {
        nix::sys::stat::mknod(
            &root.join("null"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap();
    }
    let outside = dir.path().join("outside");
    fs::write(&outside, vec![1u8; 10_000]).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    std::os::unix::fs::symlink(dir.path(), root.join("dirlink")).unwrap();

    let r = residency(&[&root, &"--format", &"json"]);
    let v = r.code(0).json();
    let f = only_file(&v);
    assert!(f["path"].as_str().unwrap().ends_with("tree/a-file"), "{r}");
    let specials = if nix::unistd::geteuid().is_root() { 5 } else { 4 };
    assert_eq!(
        v["total"]["skipped"], specials,
        "fifo, socket, [device,] 2 symlinks\n{r}"
    );
    assert_eq!(v["total"]["files"], 1, "{r}");

    // A FIFO named on the command line is skipped too, not opened.
    let r = residency(&[&root.join("fifo"), &"--format", &"json"]);
    assert_eq!(r.code(0).json()["total"]["skipped"], 1, "{r}");
    // A symlink named on the command line is followed (as find -H).
    let r = residency(&[&root.join("link"), &"--format", &"json"]);
    assert_eq!(only_file(&r.code(0).json())["size"], 10_000, "{r}");
}

#[test]
fn hard_links_are_counted_once() {
    let dir = common::disk_tempdir("tmpfsctl-residency-");
    fs::write(dir.path().join("a"), vec![1u8; 8192]).unwrap();
    fs::hard_link(dir.path().join("a"), dir.path().join("b")).unwrap();
    let r = residency(&[&dir.path(), &"--format", &"json"]);
    let v = r.code(0).json();
    assert_eq!(v["total"]["files"], 1, "{r}");
    assert_eq!(v["total"]["hard_links"], 1, "{r}");
    assert_eq!(v["total"]["pages"], 2, "{r}");
}

#[test]
fn errors_are_reported_counted_and_the_walk_goes_on() {
    let dir = common::disk_tempdir("tmpfsctl-residency-");
    let good = dir.path().join("good");
    fs::write(&good, b"fine").unwrap();
    let missing = dir.path().join("missing");
    let r = residency(&[&missing, &good, &"--format", &"json"]);
    let v = r.code(1).json();
    assert!(r.stderr.contains("missing"), "{r}");
    assert_eq!(v["total"]["errors"], 1, "{r}");
    assert_eq!(v["total"]["files"], 1, "{r}");

    // Unreadable to an unprivileged user: run the binary as nobody.
    if !nix::unistd::geteuid().is_root() {
        common::ci::missing("root, to run the binary as nobody", "run the tests as root");
        return;
    }
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let secret = dir.path().join("secret");
    fs::write(&secret, b"root only").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let as_nobody = || {
        let mut c = Command::new(BIN);
        c.uid(65534).gid(65534);
        c
    };
    let mut probe = as_nobody();
    probe.arg("--version");
    if !probe.output().is_ok_and(|o| o.status.success()) {
        common::ci::missing(
            &format!("user nobody (uid 65534) able to run {BIN}"),
            "a uid 65534 that may execute the build (every directory above it searchable by others)",
        );
        return;
    }
    let mut c = as_nobody();
    c.args(["residency", "--format", "json"]).arg(dir.path());
    let r = run_cmd(c, Duration::from_secs(60));
    let v = r.code(1).json();
    assert!(r.stderr.contains("secret"), "{r}");
    assert_eq!(v["total"]["errors"], 1, "{r}");
    assert_eq!(v["total"]["files"], 1, "good is still listed\n{r}");
}

#[test]
fn summarize_only_cached_and_the_human_table() {
    let dir = common::disk_tempdir("tmpfsctl-residency-");
    let cold = cold_file(dir.path(), "cold", 16);
    let warm = dir.path().join("warm");
    fs::write(&warm, vec![2u8; 3 * PAGE as usize]).unwrap();

    let r = residency(&[&dir.path(), &"--only-cached", &"--format", &"json"]);
    let v = r.code(0).json();
    let f = only_file(&v);
    assert!(f["path"].as_str().unwrap().ends_with("/warm"), "{r}");
    assert_eq!(v["total"]["files"], 2, "the total covers every file\n{r}");
    assert_eq!(v["total"]["pages"], 19, "{r}");

    let r = residency(&[&dir.path(), &"--summarize", &"--format", &"json"]);
    let v = r.code(0).json();
    assert_eq!(v["files"].as_array().unwrap().len(), 0, "{r}");
    assert_eq!(v["total"]["files"], 2, "{r}");
    assert_eq!(v["total"]["cached_pages"], 3, "{r}");

    let r = residency(&[&warm, &cold]);
    r.code(0);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "header, 2 files, total\n{r}");
    assert!(
        lines[0].contains("RES PAGES") && lines[0].ends_with("FILE"),
        "{r}"
    );
    let col = lines[0].find("FILE").unwrap();
    assert!(
        lines[1][col..].ends_with("/warm") && lines[1].contains("100.0%"),
        "{r}"
    );
    assert!(
        lines[2][col..].ends_with("/cold") && lines[2].contains("0.0%"),
        "{r}"
    );
    assert!(lines[3][col..].starts_with("total: 2 files"), "{r}");
    assert!(lines[1].contains("12KiB"), "human-readable sizes\n{r}");

    let r = residency(&[&warm, &"--summarize"]);
    assert_eq!(r.code(0).stdout.lines().count(), 2, "header and total\n{r}");
}
