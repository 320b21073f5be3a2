//! The desired state: a validated spec. `load` is the only way to get one.

mod duration;
#[cfg(test)]
mod fuzz;
mod load;
mod raw;
pub mod schema;
pub mod size;
#[cfg(test)]
mod tests;
mod validate;
mod yaml;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use duration::parse_duration_ms;
pub use load::{load, load_with, only_root_can_change, parse, read_text, SpecLoadError};
pub use validate::{metrics_target, Paths, SYSTEM_DIRS};

#[derive(Debug, Clone, Serialize)]
pub struct Spec {
    pub file: PathBuf,
    /// RAM budget for the sum of all mount sizes, in bytes.
    pub max_total: u64,
    pub mounts: Vec<MountSpec>,
    /// Settings of `tmpfsctl agent` (top-level `agent:`).
    pub agent: AgentSettings,
}

impl Spec {
    pub fn mount(&self, name: &str) -> Option<&MountSpec> {
        self.mounts.iter().find(|m| m.name == name)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MountSpec {
    pub name: String,
    pub path: PathBuf,
    /// Where the mount's RAM comes from.
    pub backend: Backend,
    /// `backend: zram` only: the device's compression algorithm; `None`
    /// keeps the kernel's default.
    pub compression: Option<String>,
    /// `backend: zram` only: the filesystem made on the device.
    pub fs: ZramFs,
    /// Bytes, as given or resolved from a percentage of MemTotal.
    pub size: u64,
    /// nr_inodes; `None` leaves the kernel's choice alone.
    pub inodes: Option<u64>,
    /// Root owner, group and mode; `None` copies the on-disk directory's.
    pub owner: Option<u32>,
    pub group: Option<u32>,
    pub mode: Option<u32>,
    pub create: bool,
    pub takeover: bool,
    pub flags: Flags,
    pub huge: Huge,
    pub noswap: bool,
    pub seed: Seed,
    pub persist: Persist,
    pub on_failure: OnFailure,
    pub before: Vec<String>,
    /// What `tmpfsctl agent` watches for and does (`watchdog:`).
    pub watchdog: Watchdog,
}

impl MountSpec {
    /// The tmpfs source name that marks a mount as ours in the mount table.
    pub fn source(&self) -> String {
        source_for(&self.name)
    }

    /// A mount with the defaults validation gives, for unit tests.
    #[cfg(test)]
    pub fn for_test(name: &str, path: &str, size: u64) -> MountSpec {
        MountSpec {
            name: name.into(),
            path: path.into(),
            backend: Backend::Tmpfs,
            compression: None,
            fs: ZramFs::Ext4,
            size,
            inodes: None,
            owner: None,
            group: None,
            mode: None,
            create: false,
            takeover: false,
            flags: Flags {
                nosuid: true,
                nodev: true,
                noexec: false,
                atime: None,
            },
            huge: Huge::Never,
            noswap: false,
            seed: Seed::Copy,
            persist: Persist::None,
            on_failure: OnFailure::KeepDisk,
            before: vec![],
            watchdog: Watchdog::default(),
        }
    }
}

pub const SOURCE_PREFIX: &str = "tmpfsctl-";

pub fn source_for(name: &str) -> String {
    format!("{SOURCE_PREFIX}{name}")
}

/// Per-mount flags the spec controls. `atime: None` leaves the kernel default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Flags {
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
    pub atime: Option<Atime>,
}

impl Flags {
    /// The names as written in a spec and shown by findmnt.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.nosuid {
            v.push("nosuid");
        }
        if self.nodev {
            v.push("nodev");
        }
        if self.noexec {
            v.push("noexec");
        }
        if let Some(a) = self.atime {
            v.push(a.name());
        }
        v
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Atime {
    Relatime,
    Noatime,
    Strictatime,
}

impl Atime {
    pub fn name(self) -> &'static str {
        match self {
            Atime::Relatime => "relatime",
            Atime::Noatime => "noatime",
            Atime::Strictatime => "strictatime",
        }
    }
}

/// `backend:`, where a mount's RAM comes from: one variant per module of
/// `crate::backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    #[default]
    Tmpfs,
    /// A compressed RAM block device carrying a filesystem (`fs`).
    Zram,
}

impl Backend {
    pub const ALL: [(&'static str, Backend); 2] = [("tmpfs", Backend::Tmpfs), ("zram", Backend::Zram)];

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, b)| *b == self)
            .map(|(n, _)| *n)
            .expect("every Backend variant is listed in Backend::ALL")
    }
}

/// `fs:`, the filesystem on a zram device (docs/zram.md, "Which filesystem").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ZramFs {
    /// Without a journal: each block is written once, and freed blocks are
    /// discarded at once, so deleted files give their compressed memory back.
    #[default]
    Ext4,
    /// Compressing by itself with zstd (`compress-force=zstd:3`), which the
    /// device's own algorithms may lack: text takes far less RAM. `size` then
    /// bounds what btrfs stores after its compression.
    Btrfs,
}

impl ZramFs {
    pub const ALL: [(&'static str, ZramFs); 2] = [("ext4", ZramFs::Ext4), ("btrfs", ZramFs::Btrfs)];

    pub fn name(self) -> &'static str {
        match self {
            ZramFs::Ext4 => "ext4",
            ZramFs::Btrfs => "btrfs",
        }
    }
}

/// The algorithms zram can be built with (drivers/block/zram/backend_*.c).
/// Validation accepts these names; whether this kernel has the one chosen is
/// known only from a device (`comp_algorithm`), so `apply` checks that on the
/// device it creates and lists what the kernel offers when it does not.
pub const ZRAM_COMPRESSIONS: [&str; 7] = ["lzo", "lzo-rle", "lz4", "lz4hc", "zstd", "deflate", "842"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Huge {
    Never,
    Always,
    WithinSize,
    Advise,
}

impl Huge {
    pub const ALL: [(&'static str, Huge); 4] = [
        ("never", Huge::Never),
        ("always", Huge::Always),
        ("within_size", Huge::WithinSize),
        ("advise", Huge::Advise),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, h)| *h == self)
            .map(|(n, _)| *n)
            .expect("every Huge variant is listed in Huge::ALL")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Seed {
    /// Copy the on-disk contents into the new tmpfs.
    Copy,
    /// Start empty; the on-disk contents stay reachable under the side path.
    Empty,
    /// Copy nothing: the RAM holds the upper layer of an overlayfs whose lower
    /// layer is the disk directory (docs/overlay.md).
    Overlay,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "mode", content = "seconds")]
pub enum Persist {
    /// Volatile cache: contents are dropped at unmount.
    None,
    /// Written back to disk when the mount is taken down.
    OnStop,
    /// Written back periodically (seconds) and on stop.
    Every(u64),
}

impl Persist {
    /// As the records and `status` write it: `none`, `on-stop`, `every 300s`.
    pub fn name(self) -> String {
        match self {
            Persist::None => "none".into(),
            Persist::OnStop => "on-stop".into(),
            Persist::Every(s) => format!("every {s}s"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    /// Leave the application on its disk directory and report degraded.
    KeepDisk,
    /// Stop at the first failure with exit status 1.
    Fail,
}

/// Usage thresholds in percent of the mount's size (bytes) or inode limit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Thresholds {
    /// Log and flag (metric) from here on.
    pub warn: f64,
    /// Act from here on (the `action` chain).
    pub high: f64,
    /// Hysteresis: `evict` frees down to here, and a mount is re-armed (the
    /// chain starts again from its first action) once usage is at or below it.
    pub low: f64,
}

impl Thresholds {
    pub const DEFAULT: Thresholds = Thresholds {
        warn: 80.0,
        high: 95.0,
        low: 70.0,
    };
}

/// `watchdog.memory`: thresholds on the RAM a zram mount's device takes
/// (`mm_stat` `mem_used_total`), in bytes. The same levels and action chain
/// as the usage thresholds; whichever of bytes, inodes and memory is fuller
/// counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryThresholds {
    pub warn: u64,
    pub high: u64,
    pub low: u64,
}

/// What the agent does when a mount reaches `high`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Log and count only.
    Warn,
    /// Delete least-recently-used files down to `low` (volatile caches only).
    Evict,
    /// Remount larger by `grow_step`, up to `max_size`, while memory allows.
    Grow,
    /// Write back (persisted mounts), then unmount: the application goes on
    /// with its disk directory.
    Fallback,
}

impl Action {
    pub const ALL: [(&'static str, Action); 4] = [
        ("warn", Action::Warn),
        ("evict", Action::Evict),
        ("grow", Action::Grow),
        ("fallback", Action::Fallback),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, a)| *a == self)
            .map(|(n, _)| *n)
            .expect("every Action is listed in Action::ALL")
    }
}

/// What the memory-pressure guard may do to a mount, in the listed order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PressureAction {
    /// Delete least-recently-used files down to `low` (volatile caches only).
    Evict,
    /// Remount a mount the agent grew back toward its spec size.
    Shrink,
    /// Write back (persisted mounts), then unmount.
    Fallback,
}

impl PressureAction {
    pub const ALL: [(&'static str, PressureAction); 3] = [
        ("evict", PressureAction::Evict),
        ("shrink", PressureAction::Shrink),
        ("fallback", PressureAction::Fallback),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, a)| *a == self)
            .map(|(n, _)| *n)
            .expect("every PressureAction is listed in PressureAction::ALL")
    }
}

/// Which files eviction treats as one cache entry, deleted together (see
/// src/agent/evict.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EvictGroup {
    /// Names in one directory up to their first `.`: Apache's `X.header`,
    /// `X.data` and `X.header.vary`. Names without a dot (nginx, Squid) stand alone.
    #[default]
    Stem,
    /// Every file of a directory.
    Directory,
    /// Every file alone.
    File,
}

impl EvictGroup {
    pub const ALL: [(&'static str, EvictGroup); 3] = [
        ("stem", EvictGroup::Stem),
        ("directory", EvictGroup::Directory),
        ("file", EvictGroup::File),
    ];
}

/// A mount's `watchdog:` with the defaults' fields merged in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Watchdog {
    pub bytes: Thresholds,
    pub inodes: Thresholds,
    /// `backend: zram` only; `None`: memory is not watched.
    pub memory: Option<MemoryThresholds>,
    /// Tried in order at `high`; the next one when the previous cannot bring
    /// usage back below `high` (grow at its limit, nothing left to evict).
    pub actions: Vec<Action>,
    /// Bytes added per grow step.
    pub grow_step: u64,
    /// Upper bound for grow; set whenever `actions` has `grow`.
    pub max_size: Option<u64>,
    /// Seconds after a fallback before the agent offloads the mount again;
    /// `None`: only the next `apply` (or a change of this mount in the spec).
    pub reoffload_after: Option<u64>,
    /// What the memory-pressure guard may do, in order; empty: leave it alone.
    pub pressure: Vec<PressureAction>,
    /// Under memory pressure lower priorities are acted on first.
    pub priority: u32,
    /// Files eviction deletes together.
    pub evict_group: EvictGroup,
}

impl Default for Watchdog {
    /// Warn only; the pressure guard may shrink and fall back.
    fn default() -> Self {
        Watchdog {
            bytes: Thresholds::DEFAULT,
            inodes: Thresholds::DEFAULT,
            memory: None,
            actions: vec![Action::Warn],
            grow_step: 0,
            max_size: None,
            reoffload_after: None,
            pressure: vec![PressureAction::Shrink, PressureAction::Fallback],
            priority: DEFAULT_PRIORITY,
            evict_group: EvictGroup::Stem,
        }
    }
}

pub const DEFAULT_PRIORITY: u32 = 50;

/// Where the agent writes Prometheus metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "mode", content = "path")]
pub enum MetricsTarget {
    /// Unset: [`DEFAULT_METRICS`] when its directory exists, else off.
    Auto,
    Off,
    File(PathBuf),
}

/// The node-exporter textfile collector's usual directory on Debian.
pub const DEFAULT_METRICS: &str = "/var/lib/prometheus/node-exporter/tmpfsctl.prom";

/// Top-level `agent:` settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentSettings {
    /// Usage poll interval in milliseconds.
    pub interval_ms: u64,
    pub metrics: MetricsTarget,
    /// The pressure guard acts below this MemAvailable (bytes).
    pub min_available: u64,
    /// The pressure guard acts above this PSI memory `some avg10` (percent).
    pub max_pressure: f64,
    /// `grow` only while MemAvailable minus the growth stays above this (bytes).
    pub grow_floor: u64,
    /// Milliseconds between two actions of the pressure guard, so the kernel's
    /// figures can show the effect of the last one.
    pub cooldown_ms: u64,
}

impl AgentSettings {
    pub const DEFAULT_INTERVAL_MS: u64 = 1000;
    pub const DEFAULT_MIN_AVAILABLE_PCT: f64 = 5.0;
    pub const DEFAULT_MAX_PRESSURE: f64 = 25.0;
    pub const DEFAULT_GROW_FLOOR_PCT: f64 = 20.0;
    pub const DEFAULT_COOLDOWN_MS: u64 = 10_000;

    /// The defaults for a host with `mem_total` bytes of RAM.
    pub fn defaults(mem_total: u64) -> AgentSettings {
        let pct = |p: f64| size::SizeLit::Percent(p).resolve(mem_total);
        AgentSettings {
            interval_ms: Self::DEFAULT_INTERVAL_MS,
            metrics: MetricsTarget::Auto,
            min_available: pct(Self::DEFAULT_MIN_AVAILABLE_PCT),
            max_pressure: Self::DEFAULT_MAX_PRESSURE,
            grow_floor: pct(Self::DEFAULT_GROW_FLOOR_PCT),
            cooldown_ms: Self::DEFAULT_COOLDOWN_MS,
        }
    }
}

impl Default for AgentSettings {
    /// The defaults on a host without RAM figures: no memory floors.
    fn default() -> Self {
        AgentSettings::defaults(0)
    }
}
