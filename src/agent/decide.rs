//! The agent's decisions, as pure functions of (usage, what happened before,
//! thresholds, memory state). No syscalls here: `agent` measures, asks, and
//! carries out; everything that decides is unit-tested below.
//!
//! Per mount, usage is compared with `warn`, `high` and `low`, for bytes, for
//! inodes and, on a zram mount with `memory` thresholds, for the RAM its
//! device takes (whichever is fuller counts):
//!
//! - **Level** `ok` → `warn` at `warn`, → `high` at `high`. A level is left
//!   only at or below `low` (hysteresis), so a mount hovering around a
//!   threshold does not flap, log or act over and over.
//! - **Actions** run whenever usage is at or above `high`, in the order of
//!   the `action` chain: the current *stage* first; a stage that cannot help
//!   (grow at `max_size`, below the memory floor or under pressure; evict that
//!   found too little to delete) hands over to the next one. At or below
//!   `low` the mount is re-armed and the chain starts again from its first
//!   action.
//! - **Memory pressure** (MemAvailable below `min_available`, or PSI memory
//!   `some avg10` above `max_pressure`) is answered across mounts, gentlest
//!   action first: evict (lowest priority first), then shrink, then fallback;
//!   one action per `cooldown`, so the kernel's figures can show its effect.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::host::usage::Usage;
use crate::spec::{Action, AgentSettings, MemoryThresholds, PressureAction, Thresholds, Watchdog};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    #[default]
    Ok,
    Warn,
    High,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::Ok, Level::Warn, Level::High];

    pub fn name(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::High => "high",
        }
    }
}

/// One usage sample as the thresholds see it: percentages of the size and
/// inode limit (an unlimited, size 0, count is 0%), and the RAM a zram
/// device takes (`None`: not watched, or not known).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fill {
    pub bytes: f64,
    pub inodes: f64,
    pub memory: Option<u64>,
}

/// Which threshold a comparison is against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    Warn,
    High,
}

impl Fill {
    pub fn of(u: &Usage, memory: Option<u64>) -> Fill {
        Fill {
            bytes: u.used_pct(),
            inodes: u.inodes_pct(),
            memory,
        }
    }

    /// The RAM and the memory thresholds, when both are known.
    fn ram<'a>(&self, w: &'a Watchdog) -> Option<(u64, &'a MemoryThresholds)> {
        Some((self.memory?, w.memory.as_ref()?))
    }

    fn at_or_above(&self, w: &Watchdog, mark: Mark) -> bool {
        let pick = |t: &Thresholds| match mark {
            Mark::Warn => t.warn,
            Mark::High => t.high,
        };
        let ram = self.ram(w).is_some_and(|(used, t)| {
            used >= match mark {
                Mark::Warn => t.warn,
                Mark::High => t.high,
            }
        });
        self.bytes >= pick(&w.bytes) || self.inodes >= pick(&w.inodes) || ram
    }

    fn at_or_below_low(&self, w: &Watchdog) -> bool {
        self.bytes <= w.bytes.low
            && self.inodes <= w.inodes.low
            && self.ram(w).is_none_or(|(used, t)| used <= t.low)
    }

    /// Out of `warn`: below `warn` and at or below `low`, for every kind.
    fn clear_of_warn(&self, w: &Watchdog) -> bool {
        let clear = |pct: f64, t: &Thresholds| pct < t.warn && pct <= t.low;
        clear(self.bytes, &w.bytes)
            && clear(self.inodes, &w.inodes)
            && self.ram(w).is_none_or(|(used, t)| used < t.warn && used <= t.low)
    }
}

/// What the watchdog remembers of a mount between two checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tracker {
    pub level: Level,
    /// Index into the `action` chain of the action in force.
    pub stage: usize,
    /// The chain ran out: nothing could be freed right now. Never for good: it is
    /// tried again from the start at `retry_at_ms`, or sooner when usage moves.
    pub exhausted: bool,
    /// The running out was reported during this excursion (logged once).
    pub exhausted_reported: bool,
    /// When the chain ran out, and the usage then (bytes, inodes).
    pub exhausted_at_ms: u64,
    pub exhausted_usage: (u64, u64),
    /// The next try; the wait doubles from [`RETRY_MIN_MS`] to [`RETRY_MAX_MS`]
    /// while nothing can be freed, and starts over once something was.
    pub retry_at_ms: u64,
    pub backoff_ms: u64,
    /// `warn` (the action) was reported during this excursion.
    pub warned: bool,
    /// The last check: when, and the bytes used then.
    pub last: Option<(u64, u64)>,
    /// How fast usage grows, bytes a second, averaged over the last checks (0 while
    /// it does not grow): an eviction starts early enough to finish before a fast
    /// writer crosses `high` (see [`LEAD_MS`]).
    pub growth: u64,
}

/// How far ahead an eviction looks: the time from a write to the end of the
/// eviction it triggers (about 9 ms to wake and measure, 25 ms for the first
/// eviction from an Apache cache of 4,000 entries; docs/agent.md). An eviction
/// starts once usage plus this much growth at the current rate reaches `high`.
pub const LEAD_MS: u64 = 40;

/// Growth samples further apart than this are not a rate.
const RATE_WINDOW_MS: u64 = 1_000;

/// The first wait after a chain ran out.
pub const RETRY_MIN_MS: u64 = 1_000;
/// The longest wait between tries while nothing can be freed.
pub const RETRY_MAX_MS: u64 = 30_000;
/// Usage that moved since the chain ran out brings the next try forward, but not
/// closer than this to the last one.
pub const RETRY_MOVED_MS: u64 = 250;

/// Host-wide facts a decision may depend on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemView {
    pub mem_total: u64,
    pub mem_available: u64,
    /// PSI memory `some avg10` in percent; `None` without PSI.
    pub psi_some_avg10: Option<f64>,
}

/// What growing may use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// The spec's `max_total`.
    pub max_total: u64,
    /// Sum of the live sizes of all mounts of the spec.
    pub total_size: u64,
    /// `grow` keeps MemAvailable minus the growth at or above this.
    pub grow_floor: u64,
    /// The pressure guard is active: nothing grows.
    pub under_pressure: bool,
    pub page_size: u64,
}

/// What a check of one mount found.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// `Some((from, to))` when the level changed.
    pub transition: Option<(Level, Level)>,
    pub act: Option<Act>,
    /// Stages skipped on the way, with why (logged).
    pub skipped: Vec<(Action, String)>,
    /// Usage is at or above `high` and nothing could be freed; the chain is tried
    /// again in this many milliseconds, or sooner when usage moves (reported once
    /// per excursion).
    pub exhausted: Option<u64>,
    /// The action comes before `high`, for a writer that would reach it first.
    pub early: bool,
}

/// An action to carry out now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    /// Report that usage reached `high` (the `warn` action).
    Warn,
    /// Delete least-recently-used files until usage is at or below these.
    Evict {
        target: EvictTarget,
    },
    /// Remount with this size (and nr_inodes, when the spec sets it).
    Grow {
        size: u64,
        nr_inodes: Option<u64>,
    },
    Fallback,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictTarget {
    /// Used bytes to get down to.
    pub bytes: u64,
    /// Used inodes to get down to.
    pub inodes: u64,
    /// The RAM of a zram device to get down to (memory `low`); `None`: not watched.
    pub memory: Option<u64>,
}

impl EvictTarget {
    /// The `low` watermarks of `u`'s size and inode limit, and of the RAM when
    /// `memory` (the device's RAM now) is known.
    pub fn low(w: &Watchdog, u: &Usage, memory: Option<u64>) -> EvictTarget {
        EvictTarget {
            bytes: (u.size as f64 * w.bytes.low / 100.0) as u64,
            inodes: if u.inodes == 0 {
                u64::MAX
            } else {
                (u.inodes as f64 * w.inodes.low / 100.0) as u64
            },
            memory: memory.and(w.memory.map(|t| t.low)),
        }
    }

    /// How much must go: (bytes, inodes), with `ram` the device's RAM now. RAM
    /// above its target asks for the same share of the data: the files evicted
    /// compress about as well as the rest. Eviction measures between chunks,
    /// so an estimate off either way stops early or goes on.
    pub fn need(&self, u: &Usage, ram: Option<u64>) -> (u64, u64) {
        let by_ram = match (self.memory, ram) {
            (Some(low), Some(ram)) if ram > low => {
                ((ram - low) as f64 * u.used as f64 / ram as f64).ceil() as u64
            }
            _ => 0,
        };
        (
            u.used.saturating_sub(self.bytes).max(by_ram),
            u.inodes_used.saturating_sub(self.inodes),
        )
    }
}

/// The limits of the live mount, as `decide` needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `size` of the spec.
    pub spec_size: u64,
    /// `inodes` of the spec (`None`: the kernel's, left alone).
    pub spec_inodes: Option<u64>,
}

impl Tracker {
    /// Smooths the growth rate (bytes per second) with a usage sample.
    fn sample(&mut self, now_ms: u64, used: u64) {
        self.growth = match self.last {
            Some((at, before)) if now_ms > at && now_ms - at <= RATE_WINDOW_MS => {
                let now = used.saturating_sub(before).saturating_mul(1000) / (now_ms - at);
                (self.growth + now) / 2
            }
            Some((at, _)) if now_ms == at => self.growth,
            _ => 0,
        };
        self.last = Some((now_ms, used));
    }
}

/// The level after a check: `high` enters High; a level is left only at or
/// below `low` (hysteresis).
fn level_after(w: &Watchdog, fill: &Fill, before: Level, high: bool) -> Level {
    if high {
        Level::High
    } else if fill.at_or_below_low(w) && fill.clear_of_warn(w) {
        Level::Ok
    } else if fill.at_or_below_low(w) {
        Level::Warn
    } else if before == Level::High {
        Level::High
    } else if fill.at_or_above(w, Mark::Warn) || (before == Level::Warn && !fill.clear_of_warn(w)) {
        Level::Warn
    } else {
        Level::Ok
    }
}

/// One check of one mount at `now_ms` (a monotonic clock): updates `t` and says
/// what to do.
#[allow(clippy::too_many_arguments)]
pub fn decide(
    w: &Watchdog,
    t: &mut Tracker,
    u: &Usage,
    memory: Option<u64>,
    lim: Limits,
    mem: &MemView,
    b: &Budget,
    now_ms: u64,
) -> Assessment {
    let fill = Fill::of(u, memory);
    let before = t.level;
    let high = fill.at_or_above(w, Mark::High);
    t.sample(now_ms, u.used);
    // Where usage will be when an eviction started now would have finished.
    let ahead = u.used.saturating_add(t.growth.saturating_mul(LEAD_MS) / 1000);
    let early = !high
        && fill.bytes > w.bytes.low
        && u.size > 0
        && ahead as f64 * 100.0 / u.size as f64 >= w.bytes.high
        && w.actions.get(t.stage) == Some(&Action::Evict);
    t.level = level_after(w, &fill, before, high);
    if fill.at_or_below_low(w) {
        // Re-armed: the next excursion starts the chain from the beginning.
        *t = Tracker {
            level: t.level,
            last: t.last,
            growth: t.growth,
            ..Tracker::default()
        };
    }
    let mut v = Assessment {
        transition: (t.level != before).then_some((before, t.level)),
        early,
        act: None,
        skipped: Vec::new(),
        exhausted: None,
    };
    if !high && !early {
        return v;
    }
    if t.exhausted {
        let (bytes, inodes) = t.exhausted_usage;
        let moved = u.used.abs_diff(bytes) >= (u.size / 100).max(1) || u.inodes_used != inodes;
        let due = now_ms >= t.retry_at_ms || (moved && now_ms >= t.exhausted_at_ms + RETRY_MOVED_MS);
        if !due {
            return v;
        }
        // Something may be freeable again: the whole chain, from the start.
        t.exhausted = false;
        t.stage = 0;
    }
    while let Some(&action) = w.actions.get(t.stage) {
        match action {
            Action::Warn => {
                if !t.warned {
                    t.warned = true;
                    v.act = Some(Act::Warn);
                }
                return v;
            }
            Action::Evict => {
                v.act = Some(Act::Evict {
                    target: EvictTarget::low(w, u, memory),
                });
                return v;
            }
            Action::Grow => match grow_size(w, u, lim, mem, b) {
                Ok((size, nr_inodes)) => {
                    v.act = Some(Act::Grow { size, nr_inodes });
                    return v;
                }
                Err(why) => {
                    v.skipped.push((Action::Grow, why));
                    t.stage += 1;
                }
            },
            Action::Fallback => {
                v.act = Some(Act::Fallback);
                return v;
            }
        }
    }
    t.exhausted = true;
    t.exhausted_at_ms = now_ms;
    t.exhausted_usage = (u.used, u.inodes_used);
    t.backoff_ms = (t.backoff_ms * 2).clamp(RETRY_MIN_MS, RETRY_MAX_MS);
    t.retry_at_ms = now_ms + t.backoff_ms;
    if !t.exhausted_reported {
        t.exhausted_reported = true;
        v.exhausted = Some(t.backoff_ms);
    }
    v
}

/// After an action ran: `after` is the usage it left, `freed` whether it freed
/// anything. An eviction that left usage at or above `high` hands over to the next
/// action of the chain; the last one evicts again as long as it frees something
/// (the application may refill as fast as it frees), and counts as having run out
/// once it frees nothing.
pub fn after_action(
    w: &Watchdog,
    t: &mut Tracker,
    act: &Act,
    after: &Usage,
    after_memory: Option<u64>,
    freed: bool,
) {
    if freed {
        t.backoff_ms = 0;
    }
    if let Act::Evict { .. } = act {
        let last = t.stage + 1 >= w.actions.len();
        if Fill::of(after, after_memory).at_or_above(w, Mark::High) && (!freed || !last) {
            t.stage += 1;
        }
    }
}

fn round_up(bytes: u64, page: u64) -> u64 {
    let page = page.max(1);
    bytes.div_ceil(page) * page
}

/// The next size of a growing mount, or why it cannot grow.
pub fn grow_size(
    w: &Watchdog,
    u: &Usage,
    lim: Limits,
    mem: &MemView,
    b: &Budget,
) -> Result<(u64, Option<u64>), String> {
    use crate::spec::size::format_bytes;
    let Some(max) = w.max_size else {
        return Err("no max_size".into());
    };
    let max = round_up(max, b.page_size);
    if u.size >= max {
        return Err(format!("already at max_size {}", format_bytes(max)));
    }
    if b.under_pressure {
        return Err("the host is under memory pressure".into());
    }
    let step = round_up(w.grow_step.max(1), b.page_size);
    let size = (u.size + step).min(max);
    let added = size - u.size;
    if mem.mem_available < b.grow_floor.saturating_add(added) {
        return Err(format!(
            "MemAvailable {} would fall below the grow floor {}",
            format_bytes(mem.mem_available.saturating_sub(added)),
            format_bytes(b.grow_floor)
        ));
    }
    if b.total_size.saturating_add(added) > b.max_total {
        return Err(format!(
            "the mounts would total {}, above max_total {}",
            format_bytes(b.total_size.saturating_add(added)),
            format_bytes(b.max_total)
        ));
    }
    // A spec that limits inodes keeps the ratio of inodes to bytes it set.
    let nr_inodes = lim.spec_inodes.map(|_| {
        let per_byte = u.inodes as f64 / u.size.max(1) as f64;
        ((size as f64 * per_byte).ceil() as u64).max(u.inodes)
    });
    Ok((size, nr_inodes))
}

/// A smaller size for a mount the agent grew: back toward the spec's size,
/// but never so small that the present contents would sit above `high`.
/// `None` when there is nothing to give back.
pub fn shrink_size(w: &Watchdog, u: &Usage, lim: Limits, page: u64) -> Option<(u64, Option<u64>)> {
    let spec = round_up(lim.spec_size, page);
    let needed = round_up((u.used as f64 * 100.0 / w.bytes.high).ceil() as u64, page);
    let size = spec.max(needed);
    if size >= u.size {
        return None;
    }
    let nr_inodes = lim.spec_inodes.map(|spec_inodes| {
        let per_byte = u.inodes as f64 / u.size.max(1) as f64;
        let scaled = (size as f64 * per_byte).ceil() as u64;
        let needed = (u.inodes_used as f64 * 100.0 / w.inodes.high).ceil() as u64;
        scaled.max(spec_inodes).max(needed).min(u.inodes)
    });
    Some((size, nr_inodes))
}

/// A file that eviction may delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Last use: the later of atime and mtime, in nanoseconds.
    pub last_use: i128,
    /// Bytes the tmpfs gets back when it goes (0 for a hard link with other names).
    pub bytes: u64,
    /// It frees an inode (its last name).
    pub frees_inode: bool,
    /// The cache entry it belongs to: the files of one entry go together.
    pub entry: usize,
    /// Open for writing: it, and so its whole entry, stays.
    pub busy: bool,
}

/// Picks, least recently used entry first, the candidates to delete to free
/// `need_bytes` and `need_inodes`: whole entries (an entry was used when any of its
/// files was), never one with a file open for writing. Returns indices into `c`, in
/// deletion order; within an entry the smaller files go first (a header or index
/// before its data, so a reader finds the entry whole or not at all).
pub fn pick_evictions(c: &[Candidate], need_bytes: u64, need_inodes: u64) -> Vec<usize> {
    #[derive(Default)]
    struct Entry {
        last_use: i128,
        bytes: u64,
        inodes: u64,
        busy: bool,
        members: Vec<usize>,
    }
    let mut entries: std::collections::HashMap<usize, Entry> = std::collections::HashMap::new();
    for (i, f) in c.iter().enumerate() {
        let e = entries.entry(f.entry).or_insert_with(|| Entry {
            last_use: i128::MIN,
            ..Entry::default()
        });
        e.last_use = e.last_use.max(f.last_use);
        e.bytes += f.bytes;
        e.inodes += u64::from(f.frees_inode);
        e.busy |= f.busy;
        e.members.push(i);
    }
    let mut order: Vec<(usize, Entry)> = entries.into_iter().filter(|(_, e)| !e.busy).collect();
    order.sort_by_key(|(id, e)| (e.last_use, *id));
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut out = Vec::new();
    for (_, mut e) in order {
        if bytes >= need_bytes && inodes >= need_inodes {
            break;
        }
        bytes += e.bytes;
        inodes += e.inodes;
        e.members.sort_by_key(|&i| (c[i].bytes, i));
        out.extend(e.members);
    }
    out
}

/// Is the host short of memory, and why.
pub fn pressure(mem: &MemView, s: &AgentSettings) -> Option<String> {
    use crate::spec::size::format_bytes;
    if mem.mem_available < s.min_available {
        return Some(format!(
            "MemAvailable {} is below min_available {}",
            format_bytes(mem.mem_available),
            format_bytes(s.min_available)
        ));
    }
    match mem.psi_some_avg10 {
        Some(p) if p > s.max_pressure => Some(format!(
            "memory pressure (PSI some avg10) {p:.2}% is above max_pressure {}%",
            s.max_pressure
        )),
        _ => None,
    }
}

/// A mount as the pressure guard sees it.
#[derive(Debug, Clone)]
pub struct PressureView<'a> {
    /// Position in the spec.
    pub index: usize,
    pub watchdog: &'a Watchdog,
    pub usage: Usage,
    /// The RAM of a zram mount with memory thresholds.
    pub memory: Option<u64>,
    pub limits: Limits,
}

/// What the guard does now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// No pressure.
    Calm,
    /// Pressure, but the last action is younger than `cooldown`.
    Cooling,
    /// Act on the mount at `index` of the spec.
    Act {
        index: usize,
        action: PressureAction,
        act: Act,
    },
    /// Pressure, and no mount has anything left to give.
    Exhausted,
}

/// The guard's decision. `since_last_ms`: time since its last action (`None`:
/// it never acted).
pub fn guard(
    mem: &MemView,
    s: &AgentSettings,
    mounts: &[PressureView<'_>],
    since_last_ms: Option<u64>,
    page: u64,
) -> Guard {
    if pressure(mem, s).is_none() {
        return Guard::Calm;
    }
    if since_last_ms.is_some_and(|ms| ms < s.cooldown_ms) {
        return Guard::Cooling;
    }
    let mut order: Vec<&PressureView<'_>> = mounts.iter().collect();
    // Lowest priority first; among equals, the one later in the spec.
    order.sort_by_key(|m| (m.watchdog.priority, std::cmp::Reverse(m.index)));
    for action in [
        PressureAction::Evict,
        PressureAction::Shrink,
        PressureAction::Fallback,
    ] {
        for m in order.iter().filter(|m| m.watchdog.pressure.contains(&action)) {
            let act = match action {
                PressureAction::Evict => {
                    let target = EvictTarget::low(m.watchdog, &m.usage, m.memory);
                    let (b, i) = target.need(&m.usage, m.memory);
                    (b > 0 || i > 0).then_some(Act::Evict { target })
                }
                PressureAction::Shrink => shrink_size(m.watchdog, &m.usage, m.limits, page)
                    .map(|(size, nr_inodes)| Act::Grow { size, nr_inodes }),
                PressureAction::Fallback => Some(Act::Fallback),
            };
            if let Some(act) = act {
                return Guard::Act {
                    index: m.index,
                    action,
                    act,
                };
            }
        }
    }
    Guard::Exhausted
}

/// Seconds until the next periodic write-back is due: a period after the
/// last one. Never synced: a full period from now (the disk copy is what the
/// tmpfs was seeded from).
pub fn sync_due_in(period_secs: u64, last_sync_at: Option<u64>, now: u64) -> u64 {
    match last_sync_at {
        None => period_secs,
        // A record from the future (a clock set back, a damaged state file)
        // must not postpone the write-back beyond one period.
        Some(at) => at
            .saturating_add(period_secs)
            .saturating_sub(now)
            .min(period_secs),
    }
}

/// Far enough to mean "not in this process's life", near enough that adding
/// it to an `Instant` cannot overflow.
const FAR_SECS: u64 = 100 * 365 * 86_400;

/// `now` plus `secs`, for periods from the spec and times read back from the
/// state directory (which may hold anything): capped at [`FAR_SECS`], never
/// a panic.
pub fn deadline(now: Instant, secs: u64) -> Instant {
    now.checked_add(Duration::from_secs(secs.min(FAR_SECS)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests;
