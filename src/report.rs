//! Human output of every command. JSON output is the serde form of the same
//! reports; the human form is a view of it, with every string that came from
//! the host (names, paths, reasons, process names) shown through
//! [`escape`].

use std::fmt::Write;

use crate::boot::BootReport;
use crate::down::{DownOutcome, DownResult};
use crate::execute::{ApplyReport, Outcome};
use crate::out::escape;
use crate::plan::{Blocked, Plan};
use crate::plural::count;
use crate::spec::size::format_bytes;
use crate::status::StatusReport;
use crate::sync::{SyncOutcome, SyncResult};

pub fn plan(p: &Plan) -> String {
    let mut s = String::new();
    let width = name_width(p.mounts.iter().map(|m| &m.name));
    for step in p.prepare.iter().chain(&p.cleanup) {
        let _ = writeln!(s, "host: + {}", escape(&step.describe()));
    }
    let mut steps = 0;
    let mut current = 0;
    for m in &p.mounts {
        let (name, path) = (escape(&m.name), escape(&m.path));
        match (&m.blocked, m.steps.is_empty()) {
            (Some(Blocked::CannotOffload { reason }), _) => {
                let _ = writeln!(s, "{name:width$}  {path}: cannot offload: {}", escape(reason));
            }
            (Some(Blocked::Refused { reason }), _) => {
                let _ = writeln!(s, "{name:width$}  {path}: change refused: {}", escape(reason));
            }
            (None, true) => {
                current += 1;
                let _ = writeln!(s, "{name:width$}  {path}: up to date");
            }
            (None, false) => {
                let _ = writeln!(s, "{name:width$}  {path}:");
                for st in &m.steps {
                    steps += 1;
                    let _ = writeln!(s, "{:width$}    + {}", "", escape(&st.describe()));
                }
            }
        }
    }
    for (name, path) in &p.orphans {
        let (name, path) = (escape(name), escape(path));
        let _ = writeln!(s, "note: managed tmpfs `{name}` at {path} is not in this spec; apply leaves it alone (`tmpfsctl down SPEC {name}` takes it down)");
    }
    if p.changes() {
        let _ = writeln!(
            s,
            "Plan: {}; {current} of {} up to date.",
            count(steps + p.prepare.len() + p.cleanup.len(), "step", "steps"),
            count(p.mounts.len(), "mount", "mounts")
        );
    } else {
        let _ = writeln!(
            s,
            "No changes: {current} of {} up to date.",
            count(p.mounts.len(), "mount", "mounts")
        );
    }
    s
}

pub fn apply(r: &ApplyReport) -> String {
    let mut s = String::new();
    let width = name_width(r.mounts.iter().map(|m| &m.name));
    for c in &r.host_steps {
        let _ = writeln!(s, "host: + {}", escape(c));
    }
    for m in &r.mounts {
        let what = match m.result {
            Outcome::Unchanged => "unchanged".to_string(),
            Outcome::Changed => "changed".to_string(),
            Outcome::Degraded => "DEGRADED: the application stays on its disk directory".to_string(),
            Outcome::Refused => "REFUSED: left as it was".to_string(),
            Outcome::Failed => "FAILED".to_string(),
            Outcome::Skipped => "skipped (an earlier mount failed)".to_string(),
        };
        let _ = writeln!(s, "{:width$}  {}: {what}", escape(&m.name), escape(&m.path));
        for st in &m.steps {
            let _ = writeln!(s, "{:width$}    + {}", "", escape(st));
        }
        if let Some(sd) = &m.seeded {
            let _ = writeln!(
                s,
                "{:width$}    seeded {}, {} in {:.2}s",
                "",
                count(sd.files, "file", "files"),
                format_bytes(sd.bytes),
                sd.seconds
            );
            if sd.skipped > 0 {
                let _ = writeln!(
                    s,
                    "{:width$}    {} vanished or changed while seeding: left on disk, kept by the write-back",
                    "",
                    count(sd.skipped, "entry", "entries")
                );
            }
        }
        if let Some(reason) = &m.reason {
            let _ = writeln!(s, "{:width$}    reason: {}", "", escape(reason));
        }
    }
    for (name, path) in &r.orphans {
        let _ = writeln!(
            s,
            "note: managed tmpfs `{}` at {} is not in this spec; left alone",
            escape(name),
            escape(path)
        );
    }
    let _ = writeln!(
        s,
        "changed: {}",
        if r.changed {
            "yes"
        } else {
            "no (already converged)"
        }
    );
    s
}

/// One row per mount: name, path, state, size and usage.
fn status_table(r: &StatusReport) -> String {
    let mut s = String::new();
    let rows: Vec<[String; 7]> = r
        .mounts
        .iter()
        .map(|m| {
            let (size, used, pct, inodes) = match &m.usage {
                Some(u) => (
                    format_bytes(u.size),
                    format_bytes(u.used),
                    format!("{:.1}%", u.used_pct),
                    format!("{}/{} ({:.1}%)", u.inodes_used, u.inodes, u.inodes_pct),
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            [
                escape(&m.name).into_owned(),
                escape(&m.path).into_owned(),
                m.state.name().to_string(),
                size,
                used,
                pct,
                inodes,
            ]
        })
        .collect();
    let header = ["NAME", "PATH", "STATE", "SIZE", "USED", "USE%", "INODES"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row.iter().zip(widths).map(|(c, w)| format!("{c:w$}")).collect();
        let _ = writeln!(s, "{}", line.join("  ").trim_end());
    }
    s
}

pub fn status(r: &StatusReport) -> String {
    let mut s = status_table(r);
    let now = crate::state::unix_now();
    for m in &r.mounts {
        let name = escape(&m.name);
        if let Some(reason) = &m.reason {
            let _ = writeln!(s, "{name}: {}", escape(reason));
        }
        if let Some(c) = &m.compressed {
            let ratio = c.ratio.map(|r| format!(", ratio {r:.2}")).unwrap_or_default();
            let _ = writeln!(
                s,
                "{name}: {} {}: {} stored in {} of RAM{ratio}",
                c.device,
                escape(c.compression.as_deref().unwrap_or("kernel-default")),
                format_bytes(c.data),
                format_bytes(c.ram_used)
            );
        }
        if let Some(o) = &m.overlay {
            let _ = writeln!(
                s,
                "{name}: overlay of the disk directory ({}) and an upper layer in RAM ({}); used is the upper layer",
                escape(&o.lower),
                escape(&o.upper)
            );
        }
        if let Some(p) = &m.progress {
            let elapsed = std::time::Duration::from_secs(now.saturating_sub(p.started));
            let _ = writeln!(s, "{}", crate::progress::describe(&m.name, p, elapsed));
        }
        if let Some(a) = &m.agent {
            let last = a
                .last_action
                .as_ref()
                .map(|l| {
                    format!(
                        "; last action {} {}s ago",
                        escape(&l.action),
                        now.saturating_sub(l.at)
                    )
                })
                .unwrap_or_default();
            let evicted = if a.evicted_files > 0 {
                format!(
                    "; evicted {} ({})",
                    count(a.evicted_files, "file", "files"),
                    format_bytes(a.evicted_bytes)
                )
            } else {
                String::new()
            };
            let _ = writeln!(s, "{name}: agent: level {}{last}{evicted}", escape(&a.level));
            if let Some(why) = &a.exhausted {
                let _ = writeln!(s, "{name}: agent: EXHAUSTED: {}", escape(why));
            }
        }
        if let Some(ls) = &m.last_sync {
            let age = now.saturating_sub(ls.at);
            let how = match &ls.error {
                None => format!(
                    "ok, {}, {}",
                    count(ls.files_written, "file", "files"),
                    format_bytes(ls.bytes_written)
                ),
                Some(e) => format!("FAILED: {}", escape(e)),
            };
            let by = if ls.by.is_empty() { "sync" } else { ls.by.as_str() };
            let _ = writeln!(s, "{name}: last write-back ({}) {age}s ago ({how})", escape(by));
        }
    }
    let _ = match (r.agent.running, r.agent.pid, r.agent.since) {
        (true, Some(pid), Some(since)) => {
            writeln!(s, "agent: running, pid {pid}, for {}s", now.saturating_sub(since))
        }
        _ => writeln!(
            s,
            "agent: not running (no watchdog, no `persist: every` schedule)"
        ),
    };
    let mem = &r.memory;
    let zram = if mem.managed_zram > 0 {
        format!(", managed zram {}", format_bytes(mem.managed_zram))
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "memory: total {}, available {}, shmem {} (managed tmpfs {}){zram}",
        format_bytes(mem.mem_total),
        format_bytes(mem.mem_available),
        format_bytes(mem.shmem),
        format_bytes(mem.managed_used)
    );
    s
}

pub fn down(results: &[DownResult]) -> String {
    let mut s = String::new();
    for d in results {
        // No path only for a name that is neither in the spec nor mounted.
        let at = d
            .path
            .as_ref()
            .map(|p| format!("  {}", escape(p)))
            .unwrap_or_default();
        let what = match d.result {
            DownOutcome::Unmounted => "unmounted; the application sees its disk directory",
            DownOutcome::Detached => "busy: detached lazily; new opens see the disk directory, memory is freed when the holders below close their files",
            DownOutcome::Pending => "WRITE-BACK PENDING: the application sees its disk directory; the RAM copy is kept",
            DownOutcome::NotMounted => "not mounted",
            DownOutcome::Refused => "REFUSED",
            DownOutcome::Failed => "FAILED",
        };
        let _ = writeln!(s, "{}{at}: {what}", escape(&d.name));
        for sy in &d.syncs {
            let _ = writeln!(s, "    {}", sync_line(sy));
        }
        for h in &d.holders {
            let _ = writeln!(
                s,
                "    held by pid {} ({}), {}",
                h.pid,
                escape(&h.command),
                count(h.uses, "open file/map", "open files/maps")
            );
        }
        if let Some(r) = &d.reason {
            let _ = writeln!(s, "    reason: {}", escape(r));
        }
    }
    s
}

fn sync_line(r: &SyncResult) -> String {
    match (r.result, &r.stats) {
        (SyncOutcome::Synced, Some(st)) => format!(
            "synced: {} written ({}), {}, {} deleted, {} unchanged, {} kept as on disk ({}), in {:.2}s; {}",
            count(
                st.files_written + st.links_written + st.specials_written,
                "file",
                "files"
            ),
            format_bytes(st.bytes_written),
            count(st.metadata_updated, "metadata update", "metadata updates"),
            st.deleted,
            st.unchanged,
            st.kept_disk,
            count(st.conflicts, "conflict", "conflicts"),
            r.seconds,
            match &r.whole_tree {
                Some(why) => format!("read the whole tree: {}", escape(why)),
                None => format!(
                    "read only what changed ({} not read)",
                    count(st.dirs_skipped, "directory", "directories")
                ),
            }
        ),
        (SyncOutcome::Failed, _) => format!("sync FAILED: {}", escape(r.reason.as_deref().unwrap_or(""))),
        _ => format!("sync skipped: {}", escape(r.reason.as_deref().unwrap_or(""))),
    }
}

pub fn sync(results: &[SyncResult]) -> String {
    let mut s = String::new();
    let width = name_width(results.iter().map(|r| &r.name));
    for r in results {
        let _ = writeln!(
            s,
            "{:width$}  {}: {}",
            escape(&r.name),
            escape(&r.path),
            sync_line(r)
        );
    }
    if results.is_empty() {
        let _ = writeln!(s, "no persisted mounts in this spec; nothing to write back");
    }
    s
}

pub fn boot(r: &BootReport) -> String {
    let mut s = String::new();
    for p in &r.written {
        let _ = writeln!(s, "wrote {}", escape(&r.root.join(p)));
    }
    for p in &r.removed {
        let _ = writeln!(s, "removed {}", escape(&r.root.join(p)));
    }
    for n in &r.notes {
        let _ = writeln!(s, "note: {}", escape(n));
    }
    let _ = writeln!(s, "changed: {}", if r.changed { "yes" } else { "no" });
    s
}

/// The column width of mount names as shown.
fn name_width<'a>(names: impl Iterator<Item = &'a String>) -> usize {
    names.map(|n| escape(n).chars().count()).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_names_the_path_and_counts_read_right() {
        let mut r = DownResult {
            name: "squid".into(),
            path: Some("/var/spool/squid".into()),
            result: DownOutcome::NotMounted,
            holders: vec![crate::host::procs::Holder {
                pid: 768,
                command: "squid".into(),
                uses: 1,
            }],
            reason: None,
            switch_ms: None,
            held: None,
            syncs: vec![],
        };
        let text = down(std::slice::from_ref(&r));
        assert!(
            text.starts_with("squid  /var/spool/squid: not mounted\n"),
            "{text}"
        );
        assert!(
            text.contains("held by pid 768 (squid), 1 open file/map"),
            "{text}"
        );
        r.path = None;
        assert!(down(&[r]).starts_with("squid: not mounted\n"));
    }

    #[test]
    fn plans_count_in_the_singular_too() {
        let p = Plan {
            prepare: vec![],
            mounts: vec![crate::plan::MountPlan {
                name: "a".into(),
                path: "/a".into(),
                steps: vec![],
                blocked: None,
            }],
            cleanup: vec![],
            orphans: vec![],
        };
        assert!(
            plan(&p).ends_with("No changes: 1 of 1 mount up to date.\n"),
            "{}",
            plan(&p)
        );
    }
}
