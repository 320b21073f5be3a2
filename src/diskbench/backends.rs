//! `tmpfsctl bench --disk DIR --backend zram`: the operator's own data (DIR's
//! regular files, up to `--size`) copied into a private tmpfs and into a
//! private zram device made as `apply` makes one (`--fs`: ext4 without a
//! journal, or btrfs compressing with zstd; mounted with `discard`), side by side: the data each holds per byte of RAM,
//! and write and read throughput, each row with the zram/tmpfs ratio.
//!
//! DIR is only read. Both filesystems are mounted in the benchmark thread's
//! own mount namespace (as the tmpfs of the disk benchmark); the zram device is
//! recorded in the state directory while it exists, so a run killed by
//! SIGKILL leaves it to the next `apply` or `down`, and is reset and removed
//! at the end, on errors and on interrupts. No other zram device is touched.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use serde::Serialize;

use super::report::{fmt_sig, HostInfo, Side};
use super::rows::median;
use super::{private, READ_CHUNK};
use crate::backend::zram::{Scratch, ZramOptions};
use crate::mount::RootAttrs;
use crate::out::escape;
use crate::signals::check_interrupt;
use crate::spec::size::format_bytes;
use crate::spec::{Flags, ZramFs};
use crate::state::State;

/// RAM the host must keep beyond twice the sample (a tmpfs copy, and a
/// zram copy that may not compress at all).
pub const RAM_MARGIN: u64 = super::RAM_MARGIN;

/// The files benchmarked: DIR's regular files in path order until `--size`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Directories to create, parents first, relative to DIR.
    pub dirs: Vec<PathBuf>,
    /// Regular files relative to DIR, with their sizes.
    pub files: Vec<(PathBuf, u64)>,
    pub bytes: u64,
}

/// Walks DIR without following symlinks or leaving its filesystem, in name
/// order, taking regular files while they fit in `cap` bytes.
pub fn sample(dir: &Path, cap: u64) -> Result<Sample> {
    let dev = fs::symlink_metadata(dir)
        .with_context(|| format!("stat {}", dir.display()))?
        .dev();
    let mut s = Sample {
        dirs: Vec::new(),
        files: Vec::new(),
        bytes: 0,
    };
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        if s.bytes >= cap {
            break;
        }
        let abs = dir.join(&rel);
        let mut names: Vec<_> = fs::read_dir(&abs)
            .with_context(|| format!("reading the directory {}", abs.display()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("reading the directory {}", abs.display()))?;
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            let r = rel.join(&name);
            let md = fs::symlink_metadata(dir.join(&r))
                .with_context(|| format!("stat {}", dir.join(&r).display()))?;
            if md.dev() != dev {
                continue;
            }
            if md.is_dir() {
                subdirs.push(r);
            } else if md.is_file() && s.bytes + md.len() <= cap {
                s.bytes += md.len();
                s.files.push((r, md.len()));
            }
        }
        for d in subdirs.into_iter().rev() {
            s.dirs.push(d.clone());
            stack.push(d);
        }
    }
    // Parents before children: a path sorts after its prefix.
    s.dirs.sort();
    Ok(s)
}

/// Every reason not to run, each a full sentence; empty when the run may go.
pub fn refusals(dir: &Path, s: &Sample, mem_available: u64, zram_control: bool) -> Vec<String> {
    let mut why = Vec::new();
    if s.files.is_empty() || s.bytes == 0 {
        why.push(format!(
            "{} holds no regular file with data (within --size): with --backend zram the data measured is DIR's own; give the cache directory",
            escape(dir)
        ));
    }
    let need = 2 * s.bytes + RAM_MARGIN;
    if mem_available < need {
        why.push(format!(
            "MemAvailable is {}; copies of the {} sample in a tmpfs and in a zram device need up to {} (2 × the sample + {} margin); use a smaller --size",
            format_bytes(mem_available),
            format_bytes(s.bytes),
            format_bytes(need),
            format_bytes(RAM_MARGIN)
        ));
    }
    if !zram_control {
        why.push(
            "zram is not available (/sys/class/zram-control is missing): load the module with `modprobe zram num_devices=0` (0: no device is made that tmpfsctl does not own)"
                .into(),
        );
    }
    why
}

/// One row: a figure on tmpfs and on zram.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendRow {
    pub id: &'static str,
    pub name: &'static str,
    /// Higher is better in every row.
    pub unit: &'static str,
    pub tmpfs: Side,
    pub zram: Side,
    /// zram / tmpfs.
    pub ratio: f64,
}

/// What the zram device held after the last copy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ZramFigures {
    pub compression: Option<String>,
    pub fs: ZramFs,
    /// Bytes stored, uncompressed (data and filesystem metadata).
    pub stored: u64,
    /// RAM taken (`mem_used_total`).
    pub ram_used: u64,
    /// The tmpfs's RAM for the same data (its used blocks).
    pub tmpfs_ram_used: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendReport {
    pub data_dir: String,
    pub backend: &'static str,
    pub files: u64,
    pub bytes: u64,
    pub runs: u32,
    pub zram: ZramFigures,
    pub host: HostInfo,
    pub rows: Vec<BackendRow>,
    pub notes: Vec<String>,
    pub seconds: f64,
}

/// How the benchmark thread runs.
pub struct Settings {
    pub dir: PathBuf,
    pub sample: Sample,
    pub runs: u32,
    pub compression: Option<String>,
    pub fs: ZramFs,
    pub state: State,
    pub progress: bool,
}

impl Settings {
    fn say(&self, what: &str) {
        if self.progress {
            crate::out::eprint(&format!("measuring {what} …\n"));
        }
    }
}

/// The rows and the device's figures; runs in the benchmark thread, which
/// enters a private mount namespace first.
pub fn bench(s: &Settings) -> Result<(Vec<BackendRow>, ZramFigures)> {
    crate::mount::enter_private_namespace()?;
    let work = private::make_workdir(&std::env::temp_dir())?;
    let tmpfs = work.root.join("tmpfs");
    let zram = work.root.join("zram");
    for d in [&tmpfs, &zram] {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(d)
            .with_context(|| format!("creating {}", d.display()))?;
    }
    let inodes = (s.sample.files.len() + s.sample.dirs.len()) as u64;
    // Room for the filesystem's own blocks and the tmpfs's page rounding of small files.
    let room = s.sample.bytes + s.sample.bytes / 4 + inodes * 4096 + (64 << 20);
    crate::mount::mount_scratch_tmpfs("tmpfsctl-bench", &tmpfs, room)?;
    let _tmpfs_mount = Unmount(tmpfs.clone());
    let opts = ZramOptions {
        size: room,
        nr_inodes: (s.fs == ZramFs::Ext4).then_some(inodes + 1024),
        compression: s.compression.clone(),
        fs: s.fs,
        flags: Flags {
            nosuid: true,
            nodev: true,
            noexec: true,
            atime: None,
        },
        root: RootAttrs {
            uid: 0,
            gid: 0,
            mode: 0o700,
        },
    };
    let source = format!("{}bench-{}", crate::spec::SOURCE_PREFIX, std::process::id());
    let device = Scratch::new(&source, &zram, &opts, &s.state).context("making the zram device")?;

    s.say("the data's first read (so that DIR's disk is not what the writes measure)");
    for (rel, _) in &s.sample.files {
        read_all(&s.dir.join(rel), false)?;
    }
    let sides = [(&tmpfs, None), (&zram, Some(&device))];
    let mut runs: [Vec<[Side; 4]>; 2] = [Vec::new(), Vec::new()];
    let mut figures = None;
    for run in 0..s.runs {
        for (k, (root, dev)) in sides.iter().enumerate() {
            s.say(&format!(
                "run {} of {} on {}",
                run + 1,
                s.runs,
                if dev.is_some() { "zram" } else { "tmpfs" }
            ));
            empty(root)?;
            let write = copy(s, root)?;
            let ram = match dev {
                None => tmpfs_used(root)?,
                Some(d) => d.compressed()?.ram_used,
            };
            let capacity = ratio_side(s.sample.bytes, ram);
            let cold = read_tree(s, root, true)?;
            let warm = read_tree(s, root, false)?;
            if let Some(d) = dev {
                let c = d.compressed()?;
                figures = Some((c.compression, c.data, c.ram_used));
            }
            runs[k].push([capacity, write, cold, warm]);
        }
    }
    let [t, z] = runs;
    let pick = |v: &[[Side; 4]], i: usize| median(v.iter().map(|r| r[i].clone()).collect());
    let rows = [
        ("capacity_per_ram", "data per byte of RAM", "×"),
        ("write", "copy in + syncfs", "MiB/s"),
        ("read_cold", "read every file, cold", "MiB/s"),
        ("read_warm", "read every file, warm", "MiB/s"),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (id, name, unit))| {
        let (tmpfs, zram) = (pick(&t, i), pick(&z, i));
        BackendRow {
            id,
            name,
            unit,
            ratio: if tmpfs.value > 0.0 {
                zram.value / tmpfs.value
            } else {
                0.0
            },
            tmpfs,
            zram,
        }
    })
    .collect();
    let (compression, stored, ram_used) = figures.expect("at least one run");
    let tmpfs_ram_used = tmpfs_used(&tmpfs)?;
    drop(device);
    Ok((
        rows,
        ZramFigures {
            compression,
            fs: s.fs,
            stored,
            ram_used,
            tmpfs_ram_used,
        },
    ))
}

/// Unmounts on drop (also when unwinding or after an interrupt).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        crate::mount::unmount_or_detach(&self.0);
    }
}

/// Removes what a previous run copied (on zram, `discard` gives its RAM back).
fn empty(root: &Path) -> Result<()> {
    for e in fs::read_dir(root).with_context(|| format!("reading {}", root.display()))? {
        let p = e?.path();
        let r = if p.symlink_metadata()?.is_dir() {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        };
        r.with_context(|| format!("removing {}", p.display()))?;
    }
    Ok(())
}

/// The sample copied under `root` and synced: on zram the data is then
/// compressed in the device, which is what a cache there costs.
fn copy(s: &Settings, root: &Path) -> Result<Side> {
    let t = Instant::now();
    for d in &s.sample.dirs {
        let p = root.join(d);
        fs::create_dir(&p).with_context(|| format!("creating {}", p.display()))?;
    }
    for (rel, _) in &s.sample.files {
        let (from, to) = (s.dir.join(rel), root.join(rel));
        let mut src = File::open(&from).with_context(|| format!("opening {}", from.display()))?;
        let mut dst = File::create(&to).with_context(|| format!("creating {}", to.display()))?;
        std::io::copy(&mut src, &mut dst)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        check_interrupt()?;
    }
    let r = File::open(root).with_context(|| format!("opening {}", root.display()))?;
    nix::unistd::syncfs(&r).with_context(|| format!("syncfs {}", root.display()))?;
    Ok(throughput(s, t.elapsed()))
}

/// Reads every file of the copy under `root`; cold: each file's pages dropped
/// first (clean since the sync: on zram the reads decompress from the device;
/// a tmpfs's pages are its data and stay).
fn read_tree(s: &Settings, root: &Path, cold: bool) -> Result<Side> {
    let t = Instant::now();
    for (rel, _) in &s.sample.files {
        read_all(&root.join(rel), cold)?;
    }
    Ok(throughput(s, t.elapsed()))
}

fn read_all(path: &Path, cold: bool) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    if cold {
        posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)
            .with_context(|| format!("posix_fadvise DONTNEED {}", path.display()))?;
    }
    let mut buf = vec![0u8; READ_CHUNK];
    while f
        .read(&mut buf)
        .with_context(|| format!("reading {}", path.display()))?
        > 0
    {
        check_interrupt()?;
    }
    Ok(())
}

fn throughput(s: &Settings, took: Duration) -> Side {
    let secs = took.as_secs_f64().max(1e-9);
    super::measure::side(
        |secs| s.sample.bytes as f64 / (1 << 20) as f64 / secs,
        s.sample.files.len() as u64,
        s.sample.bytes,
        secs,
        false,
    )
}

/// Data bytes per byte of RAM, as a Side of one "operation".
fn ratio_side(bytes: u64, ram: u64) -> Side {
    let value = if ram == 0 { 0.0 } else { bytes as f64 / ram as f64 };
    Side {
        value,
        runs: vec![value],
        ops: 1,
        bytes: ram,
        seconds: 0.0,
        latency_us: 0.0,
        capped: false,
        cached_before_pct: None,
    }
}

/// The RAM a tmpfs takes: its used blocks (its pages, data and directories).
fn tmpfs_used(root: &Path) -> Result<u64> {
    let v = nix::sys::statvfs::statvfs(root).with_context(|| format!("statvfs {}", root.display()))?;
    Ok((v.blocks() - v.blocks_free()) as u64 * v.fragment_size() as u64)
}

/// What the figures mean.
pub fn notes(r: &BackendReport) -> Vec<String> {
    let z = &r.zram;
    vec![
        "ratio = zram/tmpfs (every figure: higher is better); data per byte of RAM on zram is the capacity gain: the same RAM holds that many times the data".to_string(),
        format!(
            "RAM after the copy: tmpfs {} (its pages), zram {} (mm_stat mem_used_total: {} stored, compressed with {}, allocator and {} metadata included)",
            format_bytes(z.tmpfs_ram_used),
            format_bytes(z.ram_used),
            format_bytes(z.stored),
            z.compression.as_deref().unwrap_or("the kernel's default"),
            z.fs.name()
        ),
        "the sample is read once first, so DIR's disk is not in the write figures; the zram write figure includes the syncfs that compresses the data into the device".to_string(),
        "cold = each file's pages dropped (POSIX_FADV_DONTNEED) before it is read: zram decompresses from the device; on tmpfs cold is the same as warm".to_string(),
        format!(
            "each figure is the median of {}, tmpfs and zram alternating (all runs are in the JSON); the zram device is made as `apply` makes one: {}",
            crate::plural::count(r.runs, "run", "runs"),
            match z.fs {
                ZramFs::Ext4 => "ext4 without a journal, discard",
                ZramFs::Btrfs => "btrfs, compress-force=zstd:3, discard",
            }
        ),
    ]
}

/// The human report: header, table, notes.
pub fn human(r: &BackendReport) -> String {
    let mut out = format!(
        "data: {} ({} in {})  tmpfs vs zram ({}, {}), median of {}\n",
        escape(&r.data_dir),
        format_bytes(r.bytes),
        crate::plural::count(r.files, "file", "files"),
        r.zram.compression.as_deref().unwrap_or("kernel default"),
        r.zram.fs.name(),
        crate::plural::count(r.runs, "run", "runs"),
    );
    out.push_str(&format!(
        "host: {} CPUs, {} RAM ({} available), Linux {}; took {:.0}s\n\n",
        r.host.cpus,
        format_bytes(r.host.mem_total),
        format_bytes(r.host.mem_available),
        r.host.kernel,
        r.seconds
    ));
    let fmt = |s: &Side, unit: &str| format!("{} {unit}", fmt_sig(s.value));
    let cells: Vec<[String; 4]> = r
        .rows
        .iter()
        .map(|row| {
            [
                row.name.to_string(),
                fmt(&row.tmpfs, row.unit),
                fmt(&row.zram, row.unit),
                format!("{}×", fmt_sig(row.ratio)),
            ]
        })
        .collect();
    let head = [
        "MEASUREMENT".to_string(),
        "TMPFS".into(),
        "ZRAM".into(),
        "ZRAM/TMPFS".into(),
    ];
    super::report::table(&mut out, &head, &cells);
    out.push('\n');
    for n in &r.notes {
        out.push_str(&format!("- {n}\n"));
    }
    out
}
