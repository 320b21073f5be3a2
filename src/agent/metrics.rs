//! Prometheus text exposition of the agent's view, for node-exporter's
//! textfile collector. Rendering is pure; `write` replaces the file
//! atomically (temporary file + rename), so the collector never reads half a
//! file. The temporary name does not end in `.prom`, so it is never collected.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::agent::decide::{Level, MemView};
use crate::host::usage::Usage;
use crate::observe::MountState;

/// The states the agent reports, one gauge each: it watches the spec's
/// path only, so a held write-back or a moved mount shows as what the path has.
pub const STATES: [MountState; 5] = [
    MountState::Offloaded,
    MountState::Fallback,
    MountState::Degraded,
    MountState::Absent,
    MountState::Foreign,
];

/// Actions counted per mount, in the order they are exported.
pub const ACTIONS: [&str; 7] = ["warn", "evict", "grow", "shrink", "fallback", "reoffload", "sync"];

/// One mount's figures.
#[derive(Debug, Clone)]
pub struct MountMetrics {
    pub name: String,
    pub path: PathBuf,
    pub state: MountState,
    pub level: Level,
    /// `None` when not offloaded.
    pub usage: Option<Usage>,
    /// A zram mount's stored data and real RAM; `None` for tmpfs, or when
    /// not offloaded.
    pub compressed: Option<crate::backend::zram::Compressed>,
    /// Actions taken since the agent started, by kind (see [`ACTIONS`]).
    pub actions: BTreeMap<&'static str, u64>,
    pub evicted_files: u64,
    pub evicted_bytes: u64,
    /// The last write-back: unix time it finished, seconds it took, success.
    pub last_sync: Option<(u64, f64, bool)>,
    pub syncs_ok: u64,
    pub syncs_failed: u64,
    /// The last action and the unix time it was taken.
    pub last_action: Option<(&'static str, u64)>,
    /// The watchdog's evict chain freed nothing and backs off.
    pub evict_exhausted: bool,
    /// `persist: every N`: the write-back interval in seconds.
    pub persist_every: Option<u64>,
}

impl MountMetrics {
    pub fn new(name: &str, path: &Path) -> MountMetrics {
        MountMetrics {
            name: name.to_string(),
            path: path.to_path_buf(),
            state: MountState::Absent,
            level: Level::Ok,
            usage: None,
            compressed: None,
            actions: ACTIONS.iter().map(|a| (*a, 0)).collect(),
            evicted_files: 0,
            evicted_bytes: 0,
            last_sync: None,
            syncs_ok: 0,
            syncs_failed: 0,
            last_action: None,
            evict_exhausted: false,
            persist_every: None,
        }
    }

    pub fn count(&mut self, action: &'static str) {
        *self.actions.entry(action).or_insert(0) += 1;
        self.last_action = Some((action, crate::agent::unix_now()));
    }
}

/// Everything exported.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub mounts: Vec<MountMetrics>,
    pub mem: Option<MemView>,
    pub under_pressure: bool,
    pub fanotify: bool,
    /// Reloads by result: `ok`, `invalid` (spec rejected, old one kept), `failed`.
    pub reloads: BTreeMap<&'static str, u64>,
    pub start_time: u64,
}

/// Label value escaping of the text format: backslash, double quote, newline.
fn label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

struct Out(String);

impl Out {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", label(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    /// A family with one sample per mount that has a value.
    fn per_mount(
        &mut self,
        s: &Snapshot,
        name: &str,
        kind: &str,
        help: &str,
        value: impl Fn(&MountMetrics) -> Option<String>,
    ) {
        let rows: Vec<(&str, String)> = s
            .mounts
            .iter()
            .filter_map(|m| value(m).map(|v| (m.name.as_str(), v)))
            .collect();
        if rows.is_empty() {
            return;
        }
        self.head(name, kind, help);
        for (n, v) in rows {
            self.sample(name, &[("name", n)], v);
        }
    }
}

fn b(x: bool) -> u8 {
    u8::from(x)
}

/// The exposition text. `heartbeat` (unix seconds) goes into its own gauge
/// at the end, so callers can compare the rest to skip unchanged writes.
pub fn render(s: &Snapshot, heartbeat: Option<u64>) -> String {
    let mut o = Out(String::new());
    o.mount_states(s);
    o.mount_usage(s);
    o.mount_actions(s);
    o.mount_syncs(s);
    o.host_memory(s);
    o.agent_itself(s, heartbeat);
    o.0
}

impl Out {
    /// Info, state and level of every mount.
    fn mount_states(&mut self, s: &Snapshot) {
        if !s.mounts.is_empty() {
            self.head(
                "tmpfsctl_mount_info",
                "gauge",
                "Managed mounts of the spec (always 1), with their paths.",
            );
            for m in &s.mounts {
                self.sample(
                    "tmpfsctl_mount_info",
                    &[("name", &m.name), ("path", &m.path.to_string_lossy())],
                    1,
                );
            }
            self.head(
                "tmpfsctl_mount_state",
                "gauge",
                "1 for the state the mount is in: offloaded, fallback (taken out of RAM by the agent), degraded, absent, foreign.",
            );
            for m in &s.mounts {
                for st in STATES {
                    self.sample(
                        "tmpfsctl_mount_state",
                        &[("name", &m.name), ("state", st.name())],
                        b(m.state == st),
                    );
                }
            }
            self.head(
                "tmpfsctl_mount_level",
                "gauge",
                "1 for the usage level of the mount: ok, warn (at or above warn), high (at or above high, until back at low).",
            );
            for m in &s.mounts {
                for l in Level::ALL {
                    self.sample(
                        "tmpfsctl_mount_level",
                        &[("name", &m.name), ("level", l.name())],
                        b(m.level == l),
                    );
                }
            }
        }
    }

    /// Size and usage of every mount.
    fn mount_usage(&mut self, s: &Snapshot) {
        self.per_mount(
            s,
            "tmpfsctl_mount_size_bytes",
            "gauge",
            "Size limit of the tmpfs.",
            |m| m.usage.map(|u| u.size.to_string()),
        );
        self.per_mount(
            s,
            "tmpfsctl_mount_used_bytes",
            "gauge",
            "Bytes in use in the tmpfs.",
            |m| m.usage.map(|u| u.used.to_string()),
        );
        self.per_mount(
            s,
            "tmpfsctl_mount_inodes",
            "gauge",
            "Inode limit of the tmpfs.",
            |m| m.usage.map(|u| u.inodes.to_string()),
        );
        self.per_mount(
            s,
            "tmpfsctl_mount_inodes_used",
            "gauge",
            "Inodes in use in the tmpfs.",
            |m| m.usage.map(|u| u.inodes_used.to_string()),
        );
        self.per_mount(
            s,
            "tmpfsctl_mount_zram_stored_bytes",
            "gauge",
            "Bytes stored in a zram mount's device, uncompressed (orig_data_size).",
            |m| m.compressed.as_ref().map(|c| c.data.to_string()),
        );
        self.per_mount(
            s,
            "tmpfsctl_mount_zram_memory_bytes",
            "gauge",
            "RAM a zram mount's device really takes (mem_used_total).",
            |m| m.compressed.as_ref().map(|c| c.ram_used.to_string()),
        );
    }

    /// What the agent did to every mount.
    fn mount_actions(&mut self, s: &Snapshot) {
        if !s.mounts.is_empty() {
            self.head(
                "tmpfsctl_mount_evict_exhausted",
                "gauge",
                "1 while the evict chain frees nothing and backs off (the tmpfs stays full).",
            );
            for m in &s.mounts {
                self.sample(
                    "tmpfsctl_mount_evict_exhausted",
                    &[("name", &m.name)],
                    b(m.evict_exhausted),
                );
            }
            self.head(
                "tmpfsctl_mount_actions_total",
                "counter",
                "Actions the agent took since it started, by kind.",
            );
            for m in &s.mounts {
                for (a, n) in &m.actions {
                    self.sample(
                        "tmpfsctl_mount_actions_total",
                        &[("name", &m.name), ("action", a)],
                        n,
                    );
                }
            }
        }
        self.per_mount(
            s,
            "tmpfsctl_mount_evicted_files_total",
            "counter",
            "Files deleted by eviction since the agent started.",
            |m| Some(m.evicted_files.to_string()),
        );
        self.per_mount(
            s,
            "tmpfsctl_mount_evicted_bytes_total",
            "counter",
            "Bytes freed by eviction since the agent started.",
            |m| Some(m.evicted_bytes.to_string()),
        );
    }

    /// Write-backs of every mount.
    fn mount_syncs(&mut self, s: &Snapshot) {
        self.per_mount(
            s,
            "tmpfsctl_mount_persist_interval_seconds",
            "gauge",
            "The write-back interval of a `persist: every` mount.",
            |m| m.persist_every.map(|n| n.to_string()),
        );
        self.per_mount(
            s,
            "tmpfsctl_mount_last_sync_timestamp_seconds",
            "gauge",
            "Unix time the last write-back to disk finished.",
            |m| m.last_sync.map(|(at, _, _)| at.to_string()),
        );
        self.per_mount(
            s,
            "tmpfsctl_mount_last_sync_duration_seconds",
            "gauge",
            "How long the last write-back to disk took.",
            |m| m.last_sync.map(|(_, secs, _)| format!("{secs:.6}")),
        );
        self.per_mount(
            s,
            "tmpfsctl_mount_last_sync_success",
            "gauge",
            "1 if the last write-back to disk succeeded, 0 if it failed.",
            |m| m.last_sync.map(|(_, _, ok)| b(ok).to_string()),
        );
        if !s.mounts.is_empty() {
            self.head(
                "tmpfsctl_mount_syncs_total",
                "counter",
                "Write-backs run by the agent since it started, by result.",
            );
            for m in &s.mounts {
                self.sample(
                    "tmpfsctl_mount_syncs_total",
                    &[("name", &m.name), ("result", "ok")],
                    m.syncs_ok,
                );
                self.sample(
                    "tmpfsctl_mount_syncs_total",
                    &[("name", &m.name), ("result", "failed")],
                    m.syncs_failed,
                );
            }
        }
    }

    /// The host's memory as the guard sees it.
    fn host_memory(&mut self, s: &Snapshot) {
        if let Some(mem) = &s.mem {
            self.head("tmpfsctl_memory_total_bytes", "gauge", "MemTotal of the host.");
            self.sample("tmpfsctl_memory_total_bytes", &[], mem.mem_total);
            self.head(
                "tmpfsctl_memory_available_bytes",
                "gauge",
                "MemAvailable of the host.",
            );
            self.sample("tmpfsctl_memory_available_bytes", &[], mem.mem_available);
            if let Some(p) = mem.psi_some_avg10 {
                self.head(
                    "tmpfsctl_memory_pressure_some_avg10",
                    "gauge",
                    "PSI memory some avg10: share of the last 10 s some task stalled on memory, in percent.",
                );
                self.sample("tmpfsctl_memory_pressure_some_avg10", &[], format!("{p:.2}"));
            }
        }
        self.head(
            "tmpfsctl_memory_pressure_active",
            "gauge",
            "1 while the memory-pressure guard sees MemAvailable below min_available or PSI above max_pressure.",
        );
        self.sample("tmpfsctl_memory_pressure_active", &[], b(s.under_pressure));
    }

    /// The agent itself; the heartbeat last.
    fn agent_itself(&mut self, s: &Snapshot, heartbeat: Option<u64>) {
        self.head(
            "tmpfsctl_agent_fanotify",
            "gauge",
            "1 if usage checks wake on fanotify write events, 0 if the agent polls only.",
        );
        self.sample("tmpfsctl_agent_fanotify", &[], b(s.fanotify));
        self.head(
            "tmpfsctl_agent_reloads_total",
            "counter",
            "Spec reloads by result: ok, invalid (rejected; the old spec stays in force), failed.",
        );
        for r in ["ok", "invalid", "failed"] {
            self.sample(
                "tmpfsctl_agent_reloads_total",
                &[("result", r)],
                s.reloads.get(r).copied().unwrap_or(0),
            );
        }
        self.head(
            "tmpfsctl_agent_start_time_seconds",
            "gauge",
            "Unix time the agent started.",
        );
        self.sample("tmpfsctl_agent_start_time_seconds", &[], s.start_time);
        if let Some(t) = heartbeat {
            self.head(
                "tmpfsctl_agent_heartbeat_timestamp_seconds",
                "gauge",
                "Unix time this file was written; the agent rewrites it at least every 5 s.",
            );
            self.sample("tmpfsctl_agent_heartbeat_timestamp_seconds", &[], t);
        }
    }
}

/// Replaces `path` with `text` atomically (mode 0644). No fsync: after a
/// crash an old or missing file is harmless, and the agent rewrites it.
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> Snapshot {
        let mut m = MountMetrics::new("nginx", Path::new("/var/cache/nginx"));
        m.state = MountState::Offloaded;
        m.level = Level::Warn;
        m.usage = Some(Usage {
            size: 1 << 20,
            used: 512 << 10,
            inodes: 100,
            inodes_used: 7,
        });
        m.count("evict");
        m.evicted_files = 3;
        m.last_sync = Some((1_700_000_000, 0.25, true));
        m.syncs_ok = 1;
        m.persist_every = Some(900);
        let odd = MountMetrics::new("odd", Path::new("/srv/a \"quoted\"\\dir\nx"));
        Snapshot {
            mounts: vec![m, odd],
            mem: Some(MemView {
                mem_total: 1 << 34,
                mem_available: 1 << 33,
                psi_some_avg10: Some(1.5),
            }),
            under_pressure: false,
            fanotify: true,
            reloads: [("ok", 2)].into_iter().collect(),
            start_time: 1_699_999_000,
        }
    }

    #[test]
    fn renders_families_with_help_type_and_escaped_labels() {
        let text = render(&snapshot(), Some(1_700_000_001));
        for line in [
            "# TYPE tmpfsctl_mount_used_bytes gauge",
            "tmpfsctl_mount_used_bytes{name=\"nginx\"} 524288",
            "tmpfsctl_mount_state{name=\"nginx\",state=\"offloaded\"} 1",
            "tmpfsctl_mount_state{name=\"odd\",state=\"absent\"} 1",
            "tmpfsctl_mount_level{name=\"nginx\",level=\"warn\"} 1",
            "tmpfsctl_mount_actions_total{name=\"nginx\",action=\"evict\"} 1",
            "tmpfsctl_mount_actions_total{name=\"odd\",action=\"fallback\"} 0",
            "tmpfsctl_mount_last_sync_success{name=\"nginx\"} 1",
            "tmpfsctl_mount_persist_interval_seconds{name=\"nginx\"} 900",
            "tmpfsctl_mount_evict_exhausted{name=\"nginx\"} 0",
            "tmpfsctl_mount_last_sync_duration_seconds{name=\"nginx\"} 0.250000",
            "tmpfsctl_mount_info{name=\"odd\",path=\"/srv/a \\\"quoted\\\"\\\\dir\\nx\"} 1",
            "tmpfsctl_memory_pressure_some_avg10 1.50",
            "tmpfsctl_agent_reloads_total{result=\"ok\"} 2",
            "tmpfsctl_agent_reloads_total{result=\"invalid\"} 0",
            "tmpfsctl_agent_heartbeat_timestamp_seconds 1700000001",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // No size sample for a mount that is not offloaded.
        assert!(!text.contains("tmpfsctl_mount_size_bytes{name=\"odd\"}"));
        // Every family has exactly one HELP and one TYPE.
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(types, helps);
        let mut names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "a family appears twice");
    }

    #[test]
    fn a_zram_mount_exports_what_it_stores_and_the_ram_it_takes() {
        let mut s = snapshot();
        s.mounts[0].compressed = Some(crate::backend::zram::Compressed {
            device: "zram3".into(),
            compression: Some("lz4".into()),
            data: 3000,
            compressed: 900,
            ram_used: 1200,
            ratio: Some(2.5),
        });
        let text = render(&s, None);
        for line in [
            "tmpfsctl_mount_zram_stored_bytes{name=\"nginx\"} 3000",
            "tmpfsctl_mount_zram_memory_bytes{name=\"nginx\"} 1200",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(
            !text.contains("zram_memory_bytes{name=\"odd\"}"),
            "tmpfs mounts have none"
        );
        assert!(
            !render(&snapshot(), None).contains("zram"),
            "nor a spec without zram"
        );
    }

    #[test]
    fn heartbeat_is_last_so_the_rest_compares() {
        let s = snapshot();
        let a = render(&s, Some(1));
        let b = render(&s, Some(2));
        assert_ne!(a, b);
        assert_eq!(render(&s, None), render(&s, None));
        assert!(a.starts_with(&render(&s, None)));
    }

    #[test]
    fn write_replaces_atomically() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.prom");
        write(&p, "a 1\n").unwrap();
        write(&p, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a 2\n");
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["t.prom"], "no temporary file left");
    }
}
