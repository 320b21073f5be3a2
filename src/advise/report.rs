//! The report of a watch: its JSON form (serde), its table for people, and the
//! recommended entry as a spec.

use std::fmt::Write;

use serde::Serialize;

use super::disk::Written;
use super::recommend::{Advice, Entry};
use super::tree::Tree;
use super::watch::{Activity, Counts};
use crate::diskbench::{fmt_sig, FsInfo};
use crate::out::escape;
use crate::spec::size::format_bytes;

#[derive(Debug, Clone, Serialize)]
pub struct AdviseReport {
    pub dir: String,
    pub filesystem: Option<FsInfo>,
    pub requested_seconds: f64,
    pub seconds: f64,
    /// Ended early by SIGINT, SIGTERM or SIGHUP.
    pub interrupted: bool,
    pub activity: Activity,
    pub per_second: Rates,
    pub tree: TreeReport,
    /// DIR's block device over the watch; `null` when it has none.
    pub device: Option<Written>,
    pub advice: Advice,
}

/// [`Counts`] over the watch, per second.
#[derive(Debug, Clone, Serialize)]
pub struct Rates {
    pub creates: f64,
    pub writes: f64,
    pub deletes: f64,
    pub renames: f64,
    pub bytes_written: f64,
}

impl Rates {
    pub fn of(c: &Counts, seconds: f64) -> Rates {
        let per = |n: u64| ((n as f64 / seconds.max(1e-3)) * 100.0).round() / 100.0;
        Rates {
            creates: per(c.creates),
            writes: per(c.writes),
            deletes: per(c.deletes),
            renames: per(c.renames),
            bytes_written: per(c.bytes_written),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TreeReport {
    pub start: Tree,
    pub end: Tree,
    /// The largest of every walk (start, end and those in between).
    pub peak_bytes: u64,
    pub peak_inodes: u64,
    pub growth_bytes_per_second: f64,
    /// Walks made.
    pub samples: u64,
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |p| format!("{p:.1}%"))
}

/// The table for people.
pub fn human(r: &AdviseReport) -> String {
    let mut s = String::new();
    let fs = r
        .filesystem
        .as_ref()
        .map(|f| format!(" ({} on {})", escape(&f.fstype), escape(&f.source)))
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "advise: {}{fs}, watched {:.0}s{}\n",
        escape(&r.dir),
        r.seconds,
        if r.interrupted { " (interrupted)" } else { "" }
    );
    let (t, p, ps) = (&r.activity.total, &r.activity.peak_1s, &r.per_second);
    let _ = writeln!(
        s,
        "{:<26}{:>12}{:>14}{:>14}",
        "ACTIVITY", "TOTAL", "PER SECOND", "PEAK 1S"
    );
    for (what, total, rate, peak) in [
        ("creates", t.creates, ps.creates, p.creates),
        ("writes (files closed)", t.writes, ps.writes, p.writes),
        ("deletes", t.deletes, ps.deletes, p.deletes),
        ("renames", t.renames, ps.renames, p.renames),
    ] {
        let _ = writeln!(s, "{what:<26}{total:>12}{:>14}{peak:>14}", fmt_sig(rate));
    }
    let _ = writeln!(
        s,
        "{:<26}{:>12}{:>14}{:>14}",
        "bytes written",
        format_bytes(t.bytes_written),
        format!("{}/s", format_bytes(ps.bytes_written as u64)),
        format_bytes(p.bytes_written)
    );
    let _ = writeln!(s, "{:<26}{:>12}\n", "files touched", r.activity.files_touched);

    let (a, b) = (&r.tree.start, &r.tree.end);
    let _ = writeln!(s, "{:<26}{:>12}{:>14}{:>14}", "TREE", "START", "END", "PEAK");
    let _ = writeln!(
        s,
        "{:<26}{:>12}{:>14}{:>14}",
        "size",
        format_bytes(a.bytes),
        format_bytes(b.bytes),
        format_bytes(r.tree.peak_bytes)
    );
    let _ = writeln!(
        s,
        "{:<26}{:>12}{:>14}{:>14}",
        "inodes", a.inodes, b.inodes, r.tree.peak_inodes
    );
    let _ = writeln!(s, "{:<26}{:>12}{:>14}", "files", a.files, b.files);
    let _ = writeln!(
        s,
        "{:<26}{:>12}{:>14}",
        "in the page cache",
        pct(a.resident_percent),
        pct(b.resident_percent)
    );
    let z = &b.sizes;
    let _ = writeln!(
        s,
        "file sizes: median {}, p90 {}, largest {}; ≤4KiB {}, ≤64KiB {}, ≤1MiB {}, ≤16MiB {}, larger {}",
        format_bytes(z.median),
        format_bytes(z.p90),
        format_bytes(z.max),
        z.classes[0],
        z.classes[1],
        z.classes[2],
        z.classes[3],
        z.classes[4]
    );
    let unread = a.errors.max(b.errors);
    if unread > 0 {
        let _ = writeln!(
            s,
            "warning: {} could not be read (a path past 4096 bytes, or no permission): the sizes above and the advice leave {} out",
            crate::plural::count(unread, "entry", "entries"),
            if unread == 1 { "it" } else { "them" }
        );
    }
    match &r.device {
        Some(d) => {
            let _ = writeln!(
                s,
                "device {}: {} write requests, {} written",
                escape(&d.device),
                d.write_ops,
                format_bytes(d.write_bytes)
            );
        }
        None => s.push_str("device: none (the filesystem has no block device of its own)\n"),
    }

    let adv = &r.advice;
    s.push_str("\nRECOMMENDED MOUNT ENTRY (`--spec` prints it as a spec)\n");
    for (field, value) in fields(&adv.entry) {
        let why = adv
            .reasons
            .iter()
            .find(|x| x.field == field)
            .map(|x| x.why.as_str());
        let _ = writeln!(s, "  {field:<9}{value:<18}{}", why.unwrap_or(""));
    }
    let sv = &adv.saving;
    let _ = writeln!(
        s,
        "\nSAVING PER HOUR: {} written and {} file operations kept off the disk{}",
        format_bytes(sv.bytes_per_hour),
        sv.file_ops_per_hour,
        sv.device_write_ops_per_hour
            .map(|n| format!("; about {n} device write requests"))
            .unwrap_or_default()
    );
    if !adv.warnings.is_empty() {
        s.push_str("\nWARNINGS\n");
        for w in &adv.warnings {
            let _ = writeln!(s, "  - {w}");
        }
    }
    s
}

/// The entry's fields as a spec writes them (path aside), in spec order.
fn fields(e: &Entry) -> Vec<(&'static str, String)> {
    let action = if e.action.len() == 1 {
        e.action[0].to_string()
    } else {
        format!("[{}]", e.action.join(", "))
    };
    let mut v = vec![
        ("size", format!("{}MiB", e.size >> 20)),
        ("inodes", format!("{}k", e.inodes / 1024)),
        ("huge", e.huge.to_string()),
        ("persist", e.persist.to_string()),
        ("high", format!("{}%", e.high)),
        ("low", format!("{}%", e.low)),
        ("action", action),
    ];
    if let Some(max) = e.max_size {
        v.push(("max_size", format!("{}MiB", max >> 20)));
    }
    v
}

/// A spec holding the recommended entry, each value after a comment with its
/// reason. The path is a double-quoted scalar (JSON's escaping is YAML's); the
/// comments hold figures only, never a host string.
pub fn spec_yaml(seconds: f64, adv: &Advice) -> String {
    let mut s = format!(
        "# Recommended by `tmpfsctl advise` after watching for {seconds:.0}s; check it with `tmpfsctl validate`.\n"
    );
    for w in &adv.warnings {
        let _ = writeln!(s, "# warning: {w}");
    }
    let path = serde_json::to_string(&adv.entry.path).expect("a string serialises to JSON");
    let _ = write!(
        s,
        "version: 1\nmounts:\n  - name: {}\n    path: {path}\n",
        adv.entry.name
    );
    let mut watchdog = String::from("    watchdog:\n");
    for (field, value) in fields(&adv.entry) {
        let why = adv
            .reasons
            .iter()
            .find(|x| x.field == field)
            .map(|x| x.why.as_str());
        let into_watchdog = matches!(field, "high" | "low" | "action" | "max_size");
        let (out, indent) = if into_watchdog {
            (&mut watchdog, "      ")
        } else {
            (&mut s, "    ")
        };
        if let Some(why) = why {
            let _ = writeln!(out, "{indent}# {why}");
        }
        let _ = writeln!(out, "{indent}{field}: {value}");
    }
    s.push_str(&watchdog);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advise::recommend::{recommend, Figures};

    /// Every kind of entry the recommendation makes is a spec that validates, with
    /// the values it recommends.
    #[test]
    fn every_kind_of_entry_is_a_valid_spec() {
        let dir = tempfile::Builder::new()
            .prefix("tmpfsctl-advise-")
            .tempdir_in("/tmp")
            .unwrap();
        let path = dir.path().to_str().unwrap();
        let base = Figures {
            seconds: 600.0,
            bytes_start: 50 << 20,
            bytes_end: 60 << 20,
            bytes_peak: 60 << 20,
            inodes_start: 1000,
            inodes_end: 1000,
            inodes_peak: 1000,
            median_file: 16 << 10,
            creates: 10,
            writes: 10,
            deletes: 10,
            bytes_written: 1 << 20,
            peak_bytes_per_sec: 1 << 20,
            mem_total: 16 << 30,
            ..Figures::default()
        };
        let variants = [
            base.clone(),
            Figures {
                deletes: 0,
                ..base.clone()
            },
            Figures {
                deletes: 0,
                bytes_start: 60 << 20,
                ..base.clone()
            },
            Figures {
                median_file: 8 << 20,
                peak_bytes_per_sec: 4 << 30,
                ..base
            },
        ];
        let mut actions = Vec::new();
        for f in &variants {
            let adv = recommend(path, f);
            let text = spec_yaml(f.seconds, &adv);
            let spec = crate::spec::parse(std::path::Path::new("advised.yaml"), &text, f.mem_total)
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            let m = &spec.mounts[0];
            assert_eq!(
                (m.size, m.inodes),
                (adv.entry.size, Some(adv.entry.inodes)),
                "{text}"
            );
            assert_eq!(m.watchdog.bytes.high, f64::from(adv.entry.high), "{text}");
            assert_eq!(m.watchdog.max_size, adv.entry.max_size, "{text}");
            actions.push(adv.entry.action.join(","));
        }
        assert_eq!(actions, ["evict", "grow,fallback", "fallback", "evict"]);
    }
}
