//! The rows of the report: each measurement run on the disk directory and on
//! the tmpfs, alternating, and the median of the runs kept.

use std::fs;
use std::path::Path;

use anyhow::Result;

use super::measure::{random_reads, read_file, seq_read, seq_write, small_files};
use super::report::{Row, Side};
use super::room::small_counts;
use super::{BenchSettings, REQUEST_SIZES};
use crate::spec::size::format_bytes;

/// The run with the median figure, carrying every run's figure.
pub(super) fn median(mut runs: Vec<Side>) -> Side {
    let all: Vec<f64> = runs.iter().map(|s| s.value).collect();
    runs.sort_by(|a, b| a.value.total_cmp(&b.value));
    let mut m = runs.swap_remove(runs.len() / 2);
    m.runs = all;
    m
}

/// Runs `f` on the disk directory and on the tmpfs, alternating, `runs`
/// times; `f` yields one Side per row. Returns (disk, tmpfs) medians per row.
fn repeat(
    runs: u32,
    disk: &Path,
    tmpfs: &Path,
    mut f: impl FnMut(&Path) -> Result<Vec<Side>>,
) -> Result<Vec<(Side, Side)>> {
    let mut d: Vec<Vec<Side>> = Vec::new();
    let mut t: Vec<Vec<Side>> = Vec::new();
    for _ in 0..runs {
        for (dir, acc) in [(disk, &mut d), (tmpfs, &mut t)] {
            for (i, side) in f(dir)?.into_iter().enumerate() {
                if acc.len() <= i {
                    acc.push(Vec::new());
                }
                acc[i].push(side);
            }
        }
    }
    Ok(d.into_iter().map(median).zip(t.into_iter().map(median)).collect())
}

fn row(id: String, name: String, unit: &'static str, (disk, tmpfs): (Side, Side)) -> Row {
    Row {
        id,
        name,
        unit,
        ratio: if disk.value > 0.0 {
            tmpfs.value / disk.value
        } else {
            0.0
        },
        disk,
        tmpfs,
    }
}

/// Every row of the report, each measured on both sides, and the notes
/// that go with them.
pub(super) fn measure_all(s: &BenchSettings, disk: &Path, tmpfs: &Path) -> Result<(Vec<Row>, Vec<String>)> {
    let mut rows = seq_write_rows(s, disk, tmpfs)?;
    rows.extend(small_file_rows(s, disk, tmpfs)?);
    rows.extend(read_rows(s, disk, tmpfs)?);
    let notes = notes(s, &rows);
    Ok((rows, notes))
}

/// Sequential writes at every request size, buffered and durable.
fn seq_write_rows(s: &BenchSettings, disk: &Path, tmpfs: &Path) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for req in REQUEST_SIZES {
        let r = format_bytes(req);
        s.say(&format!("sequential writes, {r} requests"));
        let mut m = repeat(s.runs, disk, tmpfs, |dir| {
            let (b, d) = seq_write(dir, req, s.size, s.cap)?;
            Ok(vec![b, d])
        })?
        .into_iter();
        let (b, d) = (m.next().expect("two rows"), m.next().expect("two rows"));
        rows.push(row(
            format!("seq_write_{req}_buffered"),
            format!("seq write {r} req, buffered"),
            "MiB/s",
            b,
        ));
        rows.push(row(
            format!("seq_write_{req}_durable"),
            format!("seq write {r} req, +fdatasync"),
            "MiB/s",
            d,
        ));
    }
    Ok(rows)
}

/// Small files created, without and with fsync.
fn small_file_rows(s: &BenchSettings, disk: &Path, tmpfs: &Path) -> Result<Vec<Row>> {
    let (n_nosync, n_fsync) = small_counts(s.size);
    let mut rows = Vec::new();
    for (fsync, n, id, name) in [
        (false, n_nosync, "small_files", "4KiB files: create+write+close"),
        (true, n_fsync, "small_files_fsync", "4KiB files: ... +fsync each"),
    ] {
        s.say(name);
        let m = repeat(s.runs, disk, tmpfs, |dir| {
            Ok(vec![small_files(dir, n, fsync, s.cap)?])
        })?;
        rows.push(row(id.into(), name.into(), "files/s", m[0].clone()));
    }
    Ok(rows)
}

/// Random and sequential reads of one file per side, cold and warm.
fn read_rows(s: &BenchSettings, disk: &Path, tmpfs: &Path) -> Result<Vec<Row>> {
    s.say("reads");
    let (runs, cap) = (s.runs, s.cap);
    let dfile = read_file(disk, s.size, cap)?;
    let tfile = read_file(tmpfs, s.size, cap)?;
    let file_in = |dir: &Path| if dir == disk { dfile.clone() } else { tfile.clone() };
    let mut rows = Vec::new();
    for cold in [true, false] {
        let temp = if cold { "cold" } else { "warm" };
        let m = repeat(runs, disk, tmpfs, |dir| {
            Ok(vec![random_reads(&file_in(dir), cold, cap)?])
        })?;
        rows.push(row(
            format!("rand_read_4k_{temp}"),
            format!("random 4KiB reads, {temp}"),
            "reads/s",
            m[0].clone(),
        ));
    }
    for cold in [true, false] {
        let temp = if cold { "cold" } else { "warm" };
        let m = repeat(runs, disk, tmpfs, |dir| {
            Ok(vec![seq_read(&file_in(dir), cold, cap)?])
        })?;
        rows.push(row(
            format!("seq_read_{temp}"),
            format!("seq read 1MiB req, {temp}"),
            "MiB/s",
            m[0].clone(),
        ));
    }
    fs::remove_file(&dfile)?;
    fs::remove_file(&tfile)?;
    Ok(rows)
}

/// What the figures mean, and where one of them is to be read with care.
fn notes(s: &BenchSettings, rows: &[Row]) -> Vec<String> {
    let (n_nosync, n_fsync) = small_counts(s.size);
    let mut notes = vec![
        "ratio = tmpfs/disk: how many times faster the operation is on tmpfs (every figure: higher is better)"
            .to_string(),
        "buffered = write(2) loop + close; +fdatasync = that plus flushing to the device. On tmpfs \
         fdatasync/fsync return at once: the tmpfs figure is what the application's sync calls cost, \
         not durability (tmpfs contents are lost at reboot)"
            .to_string(),
        "cold = after fdatasync + POSIX_FADV_DONTNEED on that file (not the global drop_caches); on tmpfs \
         cold is the same as warm: its pages are the cache and DONTNEED drops nothing"
            .to_string(),
        format!("small files: {n_nosync} without fsync, {n_fsync} with fsync, in one directory"),
        format!(
            "each figure is the median of {}, disk and tmpfs alternating (all runs are in the JSON); \
             the tmpfs is mounted huge=never, as tmpfsctl mounts by default",
            crate::plural::count(s.runs, "run", "runs")
        ),
    ];
    for r in rows {
        if let Some(pct) = r
            .disk
            .cached_before_pct
            .filter(|p| r.id.ends_with("cold") && *p > 5.0)
        {
            notes.push(format!(
                "{}: {pct:.0}% of the disk file was still cached after DONTNEED; the disk figure is optimistic",
                r.name
            ));
        }
    }
    if rows.iter().any(|r| r.disk.capped || r.tmpfs.capped) {
        notes.push(format!(
            "* stopped at the time cap ({:.1}s); the figure is over what was done by then",
            s.cap.as_secs_f64()
        ));
    }
    notes
}
