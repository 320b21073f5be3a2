//! The report: its rows and header as JSON gives them, and the human form.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::Serialize;

use crate::host::Host;
use crate::out::escape;
use crate::spec::size::format_bytes;

/// One side (disk or tmpfs) of a row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Side {
    /// The row's figure, in the row's unit: the median run's.
    pub value: f64,
    /// Every run's figure, in the order measured.
    pub runs: Vec<f64>,
    /// Operations timed in the median run (writes, files, reads).
    pub ops: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// Mean time per operation.
    pub latency_us: f64,
    /// Stopped at the time cap: the figure is over `ops`, not the full amount.
    pub capped: bool,
    /// Cold reads: how much of the file was still cached when they started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_before_pct: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub id: String,
    pub name: String,
    /// `MiB/s`, `files/s` or `reads/s`: higher is better in every row.
    pub unit: &'static str,
    pub disk: Side,
    pub tmpfs: Side,
    /// tmpfs / disk: the speedup the offload brings for this operation.
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FsInfo {
    pub fstype: String,
    pub source: String,
    pub mount_point: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostInfo {
    pub cpus: usize,
    pub mem_total: u64,
    pub mem_available: u64,
    pub kernel: String,
}

impl HostInfo {
    /// This host as a report shows it, with `mem` as read before the run.
    pub fn now(mem: &crate::host::meminfo::MemInfo) -> HostInfo {
        HostInfo {
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            mem_total: mem.mem_total,
            mem_available: mem.mem_available,
            kernel: nix::sys::utsname::uname()
                .map(|u| u.release().to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    pub disk_dir: String,
    pub filesystem: Option<FsInfo>,
    pub size: u64,
    pub time_cap_seconds: f64,
    pub runs: u32,
    pub small_files: u64,
    pub small_files_fsync: u64,
    pub host: HostInfo,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    pub seconds: f64,
}

/// The mount DIR lives on, for the report header.
pub fn filesystem_of(dir: &Path, host: &Host) -> Option<FsInfo> {
    let dev = fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let table = host.mounts().ok()?;
    table
        .entries
        .iter()
        .filter(|e| e.dev == (major, minor) && dir.starts_with(&e.mount_point))
        .max_by_key(|e| e.mount_point.components().count())
        .map(|e| FsInfo {
            fstype: e.fstype.clone(),
            source: e.source.clone(),
            mount_point: e.mount_point.display().to_string(),
        })
}

/// Three significant digits with k/M/G suffixes: `812`, `48.2k`, `1.23M`.
pub fn fmt_sig(v: f64) -> String {
    let (v, suffix) = match v.abs() {
        a if a >= 1e9 => (v / 1e9, "G"),
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e4 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let digits = match v.abs() {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        _ => 2,
    };
    format!("{v:.digits$}{suffix}")
}

fn fmt_side(s: &Side, unit: &str) -> String {
    let (v, unit) = match unit {
        "MiB/s" if s.value >= 1024.0 => (s.value / 1024.0, "GiB/s"),
        _ => (s.value, unit),
    };
    format!("{} {unit}{}", fmt_sig(v), if s.capped { "*" } else { "" })
}

/// The human report: header, aligned table, notes.
pub fn human(r: &BenchReport) -> String {
    let mut out = String::new();
    let fs = r
        .filesystem
        .as_ref()
        .map(|f| format!(" ({} on {})", escape(&f.fstype), escape(&f.source)))
        .unwrap_or_default();
    out.push_str(&format!(
        "disk: {}{fs}  vs  a private temporary tmpfs; --size {}, median of {}, at most {}s each\n",
        escape(&r.disk_dir),
        format_bytes(r.size),
        crate::plural::count(r.runs, "run", "runs"),
        r.time_cap_seconds
    ));
    out.push_str(&format!(
        "host: {} CPUs, {} RAM ({} available), Linux {}; took {:.0}s\n\n",
        r.host.cpus,
        format_bytes(r.host.mem_total),
        format_bytes(r.host.mem_available),
        r.host.kernel,
        r.seconds
    ));
    let cells: Vec<[String; 4]> = r
        .rows
        .iter()
        .map(|row| {
            [
                row.name.clone(),
                fmt_side(&row.disk, row.unit),
                fmt_side(&row.tmpfs, row.unit),
                format!("{}×", fmt_sig(row.ratio)),
            ]
        })
        .collect();
    let head = [
        "MEASUREMENT".to_string(),
        "DISK".into(),
        "TMPFS".into(),
        "TMPFS/DISK".into(),
    ];
    table(&mut out, &head, &cells);
    if !r.notes.is_empty() {
        out.push('\n');
        for n in &r.notes {
            out.push_str(&format!("- {n}\n"));
        }
    }
    out
}

/// A table of four columns: the first left-aligned, the others right-aligned, each
/// as wide as its widest cell, the header first.
pub(super) fn table(out: &mut String, head: &[String; 4], cells: &[[String; 4]]) {
    let width = |i: usize| {
        cells
            .iter()
            .chain(std::iter::once(head))
            .map(|c| c[i].chars().count())
            .max()
            .unwrap_or(0)
    };
    let w = [width(0), width(1), width(2), width(3)];
    for c in std::iter::once(head).chain(cells.iter()) {
        let pad = |s: &str, n: usize| " ".repeat(n.saturating_sub(s.chars().count()));
        out.push_str(&format!(
            "{}{}  {}{}  {}{}  {}{}\n",
            c[0],
            pad(&c[0], w[0]),
            pad(&c[1], w[1]),
            c[1],
            pad(&c[2], w[2]),
            c[2],
            pad(&c[3], w[3]),
            c[3]
        ));
    }
}
