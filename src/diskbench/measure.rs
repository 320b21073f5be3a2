//! One measurement on one side: sequential writes, small files, random and
//! sequential reads, each stopped at the time cap.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

use super::report::Side;
use super::{PAGE, READ_CHUNK, SMALL_FILE};
use crate::signals::check_interrupt;

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

pub(super) fn side(
    value_per_sec: impl Fn(f64) -> f64,
    ops: u64,
    bytes: u64,
    seconds: f64,
    capped: bool,
) -> Side {
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
pub(super) fn seq_write(dir: &Path, req: u64, size: u64, cap: Duration) -> Result<(Side, Side)> {
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
pub(super) fn small_files(dir: &Path, count: u64, fsync: bool, cap: Duration) -> Result<Side> {
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
pub(super) fn read_file(dir: &Path, size: u64, cap: Duration) -> Result<PathBuf> {
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
pub(super) fn random_reads(path: &Path, cold: bool, cap: Duration) -> Result<Side> {
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
pub(super) fn seq_read(path: &Path, cold: bool, cap: Duration) -> Result<Side> {
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
