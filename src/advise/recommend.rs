//! From the figures of a watch to a mount entry, a reason for each value, the
//! expected saving and warnings. Pure: everything it knows is in [`Figures`].

use serde::Serialize;

use crate::spec::size::format_bytes;

/// The agent's reaction time with fanotify, from the write that crosses `high`
/// to the end of the eviction: at most 15 ms for a first eviction, p99 12.3 ms
/// under a 100 MB/s writer (docs/agent.md, "Sizing the headroom";
/// docs/benchmarks.md, "Agent").
pub const REACTION_SECS: f64 = 0.015;
/// docs/agent.md's factor for a slower host than the one measured.
pub const REACTION_FACTOR: f64 = 2.0;
/// The peak tree should sit at this share of the size: below `high`, with room
/// for a busier hour than the one watched.
const PEAK_SHARE: f64 = 0.75;
/// How far ahead a growing tree is projected: as long again as it was watched,
/// up to an hour. Whatever the application's own limit is, it is not in the
/// figures; a watch that ends before the tree stops growing says so in a warning.
const GROWTH_HORIZON_MAX_SECS: f64 = 3600.0;
const MIN_SIZE: u64 = 4 << 20;
const MIN_INODES: u64 = 1024;
const HUGE_PAGE: u64 = 2 << 20;
const HIGH_MAX: u32 = 90;
const HIGH_MIN: u32 = 80;
/// Points between `high` and `low`: what an eviction frees at once.
const HYSTERESIS: u32 = 15;
/// The default RAM budget for all mounts (`max_total`): half of MemTotal.
const BUDGET_SHARE: f64 = 0.5;
/// Residency at or above which reads already come from the page cache.
const RESIDENT: f64 = 90.0;
/// Below both of these the application writes little.
const FEW_BYTES_PER_SEC: f64 = 64.0 * 1024.0;
const FEW_OPS_PER_SEC: f64 = 1.0;
const SHORT_WATCH_SECS: f64 = 60.0;

/// What a watch measured, as the recommendation needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    pub seconds: f64,
    pub bytes_start: u64,
    pub bytes_end: u64,
    pub bytes_peak: u64,
    pub inodes_end: u64,
    pub inodes_peak: u64,
    pub inodes_start: u64,
    pub median_file: u64,
    pub creates: u64,
    pub writes: u64,
    pub deletes: u64,
    pub renames: u64,
    pub bytes_written: u64,
    pub peak_bytes_per_sec: u64,
    pub resident_end: Option<f64>,
    /// The device's writes over the watch: operations and bytes.
    pub device: Option<(u64, u64)>,
    pub mem_total: u64,
    /// DIR is on tmpfs or ramfs already.
    pub in_ram: bool,
    pub overflows: u64,
    pub interrupted: bool,
}

impl Figures {
    fn per_sec(&self, n: u64) -> f64 {
        n as f64 / self.seconds.max(1e-3)
    }

    fn ops(&self) -> u64 {
        self.creates + self.writes + self.deletes + self.renames
    }
}

/// The recommended mount entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    pub name: String,
    pub path: String,
    pub size: u64,
    pub inodes: u64,
    pub huge: &'static str,
    pub persist: &'static str,
    pub high: u32,
    pub low: u32,
    pub action: Vec<&'static str>,
    /// With `grow` only.
    pub max_size: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reason {
    pub field: &'static str,
    pub why: String,
}

/// Disk writes that would go to RAM instead, per hour at the watched rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Saving {
    pub bytes_per_hour: u64,
    /// Creates, writes, deletes and renames in DIR: each costs the disk's
    /// filesystem metadata and journal writes.
    pub file_ops_per_hour: u64,
    /// The device's write requests times DIR's share of the bytes it wrote (at
    /// most all of them): an estimate, since the device also writes for others,
    /// and writes back later than the application writes.
    pub device_write_ops_per_hour: Option<u64>,
    pub dir_share_of_device_bytes: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Advice {
    pub entry: Entry,
    pub reasons: Vec<Reason>,
    pub saving: Saving,
    pub warnings: Vec<String>,
}

/// A mount name from DIR's last component: a-z 0-9 _ -, at most 48 characters.
pub fn name_for(path: &str) -> String {
    let last = path.rsplit('/').find(|c| !c.is_empty()).unwrap_or("");
    let mut name: String = last
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    // A name starts with a letter or digit.
    name = name.trim_start_matches(['-', '_']).to_string();
    if name.trim_matches('-').is_empty() {
        name = "cache".into();
    }
    name
}

fn round_up(v: f64, to: u64) -> u64 {
    (v.max(0.0) / to as f64).ceil() as u64 * to
}

pub fn recommend(path: &str, f: &Figures) -> Advice {
    let mut reasons = Vec::new();
    let mut warnings = Vec::new();
    let mut why = |field, text: String| reasons.push(Reason { field, why: text });

    // size
    let growth = (f.bytes_end as f64 - f.bytes_start as f64) / f.seconds.max(1e-3);
    let horizon = f.seconds.min(GROWTH_HORIZON_MAX_SECS);
    let projected = f.bytes_end as f64 + growth.max(0.0) * horizon;
    let base = (f.bytes_peak as f64).max(projected);
    let mut size = round_up(base / PEAK_SHARE, 1 << 20).max(MIN_SIZE);
    let size_why = if growth > 0.0 && projected > f.bytes_peak as f64 {
        format!(
            "the tree grew {}/s; as long again as the watch ({:.0} s, at most an hour) at that rate makes {}, which sits at {:.0}% of this size",
            format_bytes(growth as u64),
            horizon,
            format_bytes(projected as u64),
            PEAK_SHARE * 100.0
        )
    } else {
        format!(
            "the tree peaked at {}, which sits at {:.0}% of this size (below high)",
            format_bytes(f.bytes_peak),
            PEAK_SHARE * 100.0
        )
    };

    // high: the room above it must hold the peak writes while the agent reacts.
    let room = f.peak_bytes_per_sec as f64 * REACTION_SECS * REACTION_FACTOR;
    let fits = |size: u64, high: u32| size as f64 * (100 - high) as f64 / 100.0 >= room;
    let mut high = HIGH_MAX;
    while high > HIGH_MIN && !fits(size, high) {
        high -= 1;
    }
    let mut size_for_room = false;
    if !fits(size, high) {
        size = round_up(room * 100.0 / (100 - HIGH_MIN) as f64, 1 << 20);
        size_for_room = true;
    }
    why(
        "size",
        if size_for_room {
            format!(
                "{size_why}; raised so that the room above high holds {} (see high)",
                format_bytes(room as u64)
            )
        } else {
            size_why
        },
    );
    why(
        "high",
        format!(
            "the room above high ({}) holds the peak write rate {}/s for {} × the agent's reaction time of {} ms (fanotify, docs/agent.md): {}",
            format_bytes(size * u64::from(100 - high) / 100),
            format_bytes(f.peak_bytes_per_sec),
            REACTION_FACTOR,
            REACTION_SECS * 1000.0,
            format_bytes(room as u64)
        ),
    );
    let low = high - HYSTERESIS;
    let freed = size * u64::from(HYSTERESIS) / 100;
    let avg = f.per_sec(f.bytes_written);
    why(
        "low",
        if avg > 0.0 {
            format!(
                "an eviction or fallback frees down to low: {} at once, {:.0} s of writing at the average {}/s",
                format_bytes(freed),
                freed as f64 / avg,
                format_bytes(avg as u64)
            )
        } else {
            format!("an action frees down to low: {} at once", format_bytes(freed))
        },
    );

    // inodes
    let inode_growth = (f.inodes_end as f64 - f.inodes_start as f64) / f.seconds.max(1e-3);
    let inodes_projected = f.inodes_end as f64 + inode_growth.max(0.0) * horizon;
    let inodes = round_up((f.inodes_peak as f64).max(inodes_projected) * 2.0, 1024).max(MIN_INODES);
    why(
        "inodes",
        if inodes_projected > f.inodes_peak as f64 {
            format!(
                "{} inodes (files and directories) at the end, growing: {:.0} as long again as the watch; twice that",
                f.inodes_end, inodes_projected
            )
        } else {
            format!(
                "{} inodes at the peak (files and directories); twice that",
                f.inodes_peak
            )
        },
    );

    // huge
    let huge = if f.median_file < HUGE_PAGE {
        why(
            "huge",
            format!(
                "the median file is {}, below a 2 MiB huge page: huge pages would round small files up",
                format_bytes(f.median_file)
            ),
        );
        "never"
    } else {
        why(
            "huge",
            format!(
                "the median file is {}: within_size gives files of 2 MiB and more huge pages, without rounding smaller ones up",
                format_bytes(f.median_file)
            ),
        );
        "within_size"
    };

    // action and persist
    let budget = (f.mem_total as f64 * BUDGET_SHARE) as u64;
    let (action, persist, max_size) = if f.deletes > 0 {
        why(
            "action",
            format!(
                "the application deleted {} entries during the watch: it expires its own entries and recreates what is missing, a volatile cache; evict drops the least recently used",
                f.deletes
            ),
        );
        why(
            "persist",
            "a volatile cache refills after a reboot; `evict` needs persist: none".into(),
        );
        (vec!["evict"], "none", None)
    } else if growth > 0.0 && size * 2 <= budget {
        why(
            "action",
            "nothing was deleted and the tree grew: the files may be state rather than cache, so never delete them; grow while RAM allows, then fall back to the disk".into(),
        );
        why(
            "persist",
            "nothing was deleted, so the files may matter after a reboot: write back every 15 minutes (none, if they are a cache)".into(),
        );
        (vec!["grow", "fallback"], "every 15m", Some(size * 2))
    } else {
        why(
            "action",
            "nothing was deleted during the watch: the files may be state rather than cache, so never delete them; at high, the application goes back to its disk directory".into(),
        );
        why(
            "persist",
            "nothing was deleted, so the files may matter after a reboot: write back every 15 minutes (none, if they are a cache)".into(),
        );
        (vec!["fallback"], "every 15m", None)
    };

    // saving
    let hour = |n: u64| (f.per_sec(n) * 3600.0).round() as u64;
    let share = f
        .device
        .filter(|&(_, bytes)| bytes > 0)
        .map(|(_, bytes)| (f.bytes_written as f64 / bytes as f64).min(1.0));
    let saving = Saving {
        bytes_per_hour: hour(f.bytes_written),
        file_ops_per_hour: hour(f.ops()),
        device_write_ops_per_hour: f
            .device
            .zip(share)
            .map(|((ops, _), s)| (f.per_sec(ops) * s * 3600.0).round() as u64),
        dir_share_of_device_bytes: share.map(|s| (s * 1000.0).round() / 1000.0),
    };

    // warnings
    if f.in_ram {
        warnings.push("the directory is on tmpfs or ramfs already: an offload gains nothing".into());
    }
    if f.ops() == 0 {
        warnings.push(
            "nothing was created, written, deleted or renamed during the watch: watch while the application is busy; if it only reads, a tmpfs saves no disk writes".into(),
        );
    } else if f.resident_end.is_some_and(|r| r >= RESIDENT)
        && f.per_sec(f.bytes_written) < FEW_BYTES_PER_SEC
        && f.per_sec(f.ops()) < FEW_OPS_PER_SEC
    {
        warnings.push(format!(
            "offload is unlikely to pay: {:.0}% of the tree is in the page cache already, so reads come from RAM, and it writes little ({:.1} operations/s)",
            f.resident_end.unwrap_or(0.0),
            f.per_sec(f.ops())
        ));
    }
    if size > budget {
        warnings.push(format!(
            "the size {} is above the default RAM budget, half of MemTotal ({}): raise max_total only if the host can spare it, or cap the application's own cache",
            format_bytes(size),
            format_bytes(budget)
        ));
    }
    if growth > 0.0 && projected > f.bytes_peak as f64 {
        warnings.push(format!(
            "the tree was still growing when the watch ended ({}/s): watch longer, and cap the application's own cache below size × high ({}), so that it expires entries before the agent acts",
            format_bytes(growth as u64),
            format_bytes(size * u64::from(high) / 100)
        ));
    }
    if f.overflows > 0 {
        warnings.push(format!(
            "the kernel's event queue overflowed {} times: the counts are lower bounds",
            f.overflows
        ));
    }
    if f.interrupted || f.seconds < SHORT_WATCH_SECS {
        warnings.push(format!(
            "watched for {:.0} s only: the peak may not be typical (the default is 10 minutes)",
            f.seconds
        ));
    }

    Advice {
        entry: Entry {
            name: name_for(path),
            path: path.to_string(),
            size,
            inodes,
            huge,
            persist,
            high,
            low,
            action,
            max_size,
        },
        reasons,
        saving,
        warnings,
    }
}

#[cfg(test)]
#[path = "recommend_tests.rs"]
mod tests;
