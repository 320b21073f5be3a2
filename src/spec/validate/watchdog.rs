//! A mount's `watchdog:`: the usage thresholds, the actions at `high`, what
//! the memory-pressure guard may do, each field its own or the defaults'.

use serde_saphyr::{Location, Spanned};

use super::{percent, Ctx, MAX_PERIOD_SECS, MIN_PERIOD_SECS};
use crate::spec::duration::parse_duration;
use crate::spec::raw::{NameList, RawWatchdog};
use crate::spec::size::{self, SizeLit, SIZE_ACCEPTED};
use crate::spec::{
    Action, Backend, EvictGroup, MemoryThresholds, Persist, PressureAction, Thresholds, Watchdog,
    DEFAULT_PRIORITY,
};

const ACTION_ACCEPTED: &str = "warn, evict, grow, fallback, or a list tried in order such as [grow, evict]; \
     `warn` stands alone and `fallback` comes last";
const PRESSURE_ACCEPTED: &str =
    "none, or a list of evict, shrink, fallback tried in order, e.g. [evict, shrink, fallback]";
const MEMORY_ACCEPTED: &str =
    "a size of RAM such as 64MiB, or a percentage of the mount's size such as 25%; above 0 and at most the mount's size";
const REOFFLOAD_ACCEPTED: &str = "never, or a duration from 10s to 30d such as 10m (units s, m, h, d)";

const MAX_PRIORITY: u32 = 100;

/// What watchdog validation needs to know about the mount.
pub(super) struct WdCtx<'a> {
    pub(super) i: usize,
    pub(super) mount: Option<&'a RawWatchdog>,
    pub(super) defaults: Option<&'a RawWatchdog>,
    /// 0 when the size itself is invalid (already reported).
    pub(super) size: u64,
    /// `None` when `persist` itself is invalid (already reported).
    pub(super) persist: Option<Persist>,
    /// `None` when `backend` itself is invalid (already reported).
    pub(super) backend: Option<Backend>,
    pub(super) mem_total: u64,
    pub(super) max_total: u64,
    /// `seed: overlay`: eviction writes the upper layer back and starts it afresh
    /// (docs/overlay.md), so it does not need a volatile mount.
    pub(super) overlay: bool,
}

/// A watchdog field as it applies to a mount: its own, else the defaults'.
struct Pick<'a, T> {
    v: &'a Spanned<T>,
    field: String,
    /// Set in the mount itself (not inherited from `defaults`).
    own: bool,
}

impl<'a> WdCtx<'a> {
    fn pick<T>(
        &self,
        name: &str,
        get: impl Fn(&'a RawWatchdog) -> Option<&'a Spanned<T>>,
    ) -> Option<Pick<'a, T>> {
        if let Some(v) = self.mount.and_then(&get) {
            return Some(Pick {
                v,
                field: format!("mounts[{}].watchdog.{name}", self.i),
                own: true,
            });
        }
        self.defaults.and_then(get).map(|v| Pick {
            v,
            field: format!("defaults.watchdog.{name}"),
            own: false,
        })
    }

    /// `evict` deletes files: on a persisted mount the deletions would be
    /// written back.
    fn evict_needs_volatile(&self, cx: &mut Ctx, loc: &Location, field: &str) {
        if !self.overlay && self.persist.is_some_and(|p| p != Persist::None) {
            cx.at_loc(
                loc,
                field,
                format!(
                    "`evict` deletes files, but mounts[{}] is persisted (`persist` is not none): the deletions would reach the disk copy",
                    self.i
                ),
                Some("evict only on volatile caches (persist: none); for persisted mounts grow, shrink or fallback"),
            );
        }
    }
}

/// The `action` chain as it applies.
struct Chain {
    actions: Vec<Action>,
    /// The list as written was valid; when not, checks that depend on it stay quiet.
    known: bool,
    /// Where `grow` is written, if it is.
    grow: Option<(Location, String)>,
}

impl Chain {
    fn has(&self, a: Action) -> bool {
        self.actions.contains(&a)
    }

    /// Known not to have `a`.
    fn lacks(&self, a: Action) -> bool {
        self.known && !self.has(a)
    }
}

/// A name of a `NameList` with where it was written.
struct Named<T> {
    value: T,
    loc: Location,
    field: String,
}

/// Parses a name or list of names against `table`; unknown names and
/// duplicates are reported.
fn names<T: Copy + PartialEq>(
    cx: &mut Ctx,
    p: &Pick<'_, NameList>,
    what: &str,
    table: &[(&str, T)],
    accepted: &str,
) -> Option<Vec<Named<T>>> {
    let items: Vec<(String, Location, String)> = match &p.v.value {
        NameList::One(n) => vec![(n.clone(), p.v.referenced, p.field.clone())],
        NameList::Many(list) => list
            .iter()
            .enumerate()
            .map(|(k, n)| (n.value.clone(), n.referenced, format!("{}[{k}]", p.field)))
            .collect(),
    };
    if items.is_empty() {
        cx.at(p.v, &p.field, format!("empty {what} list"), Some(accepted));
        return None;
    }
    let mut out: Vec<Named<T>> = Vec::new();
    let mut ok = true;
    for (name, loc, field) in items {
        match table.iter().find(|(n, _)| *n == name) {
            None => {
                cx.at_loc(&loc, &field, format!("invalid {what} `{name}`"), Some(accepted));
                ok = false;
            }
            Some((_, v)) if out.iter().any(|o| o.value == *v) => {
                cx.at_loc(
                    &loc,
                    &field,
                    format!("{what} `{name}` is listed twice"),
                    Some(accepted),
                );
                ok = false;
            }
            Some((_, v)) => out.push(Named {
                value: *v,
                loc,
                field,
            }),
        }
    }
    ok.then_some(out)
}

/// warn/high/low of one kind, falling back to `base` for unset ones.
fn thresholds(
    cx: &mut Ctx,
    picks: [Option<Pick<'_, String>>; 3],
    base: Thresholds,
    of_what: &str,
) -> Option<Thresholds> {
    let [w, h, l] = picks;
    let before = cx.diags.len();
    let mut val = |p: &Option<Pick<'_, String>>| p.as_ref().map(|p| percent(cx, &p.field, p.v));
    let (wv, hv, lv) = (val(&w), val(&h), val(&l));
    // Unset values follow `high`: warn at most high, low at most 3/4 of it.
    let high = hv.flatten().unwrap_or(base.high);
    let t = Thresholds {
        warn: wv.flatten().unwrap_or(base.warn.min(high)),
        high,
        low: lv.flatten().unwrap_or(base.low.min(high * 0.75)),
    };
    if cx.diags.len() != before {
        return None;
    }
    // Blame the value written nearest to the mount: its own, else the one set.
    let blame = |a: &Option<Pick<'_, String>>, b: &Option<Pick<'_, String>>| -> Option<(Location, String)> {
        let own = |p: &Option<Pick<'_, String>>| {
            p.as_ref()
                .filter(|p| p.own)
                .map(|p| (p.v.referenced, p.field.clone()))
        };
        let any = |p: &Option<Pick<'_, String>>| p.as_ref().map(|p| (p.v.referenced, p.field.clone()));
        own(a).or_else(|| own(b)).or_else(|| any(a)).or_else(|| any(b))
    };
    if t.low >= t.high {
        if let Some((loc, field)) = blame(&l, &h) {
            cx.at_loc(
                &loc,
                &field,
                format!(
                    "low {}% must be below high {}% (of the {of_what}); the gap is the hysteresis",
                    t.low, t.high
                ),
                Some("low < high, e.g. high: 95%, low: 70%"),
            );
        }
    }
    if t.warn > t.high {
        if let Some((loc, field)) = blame(&w, &h) {
            cx.at_loc(
                &loc,
                &field,
                format!(
                    "warn {}% is above high {}% (of the {of_what}); it would never warn first",
                    t.warn, t.high
                ),
                Some("warn <= high, e.g. warn: 80%, high: 95%"),
            );
        }
    }
    (cx.diags.len() == before).then_some(t)
}

pub(super) fn watchdog(cx: &mut Ctx, w: &WdCtx<'_>) -> Option<Watchdog> {
    let before = cx.diags.len();
    let bytes = thresholds(
        cx,
        [
            w.pick("warn", |r| r.warn.as_ref()),
            w.pick("high", |r| r.high.as_ref()),
            w.pick("low", |r| r.low.as_ref()),
        ],
        Thresholds::DEFAULT,
        "size",
    );
    let inodes = thresholds(
        cx,
        [
            w.pick("inodes.warn", |r| r.inodes.as_ref()?.warn.as_ref()),
            w.pick("inodes.high", |r| r.inodes.as_ref()?.high.as_ref()),
            w.pick("inodes.low", |r| r.inodes.as_ref()?.low.as_ref()),
        ],
        bytes.unwrap_or(Thresholds::DEFAULT),
        "inode limit",
    );
    let memory = memory(cx, w);
    let chain = chain(cx, w);
    let max_size = max_size(cx, w, &chain);
    if let Some((loc, field)) = &chain.grow {
        if max_size.is_none() && cx.diags.len() == before {
            cx.at_loc(
                loc,
                field,
                "`grow` needs `max_size`, the size it may grow to".into(),
                Some("a `max_size` above `size` in the same watchdog (or in defaults.watchdog)"),
            );
        }
    }
    let grow_step = grow_step(cx, w, &chain);
    let (pressure, pressure_known) = pressure(cx, w);
    let reoffload_after = reoffload_after(cx, w, &chain, &pressure, pressure_known);
    let priority = priority(cx, w);
    let evict_group = evict_group(cx, w);

    if cx.diags.len() != before {
        return None;
    }
    Some(Watchdog {
        evict_group,
        bytes: bytes?,
        inodes: inodes?,
        memory,
        max_size: max_size.filter(|_| chain.has(Action::Grow)),
        actions: chain.actions,
        grow_step,
        reoffload_after,
        pressure,
        priority,
    })
}

/// `memory:` in bytes. Only a zram mount has a RAM figure of its own (a
/// tmpfs's RAM is its usage, which `warn`/`high`/`low` watch): the mount's own
/// `memory` on a tmpfs is refused, one inherited from `defaults` ignored.
/// Unset: `warn` at `high` (no earlier warning), `low` at ¾ of `high`.
fn memory(cx: &mut Ctx, w: &WdCtx<'_>) -> Option<MemoryThresholds> {
    let picks = [
        w.pick("memory.warn", |r| r.memory.as_ref()?.warn.as_ref()),
        w.pick("memory.high", |r| r.memory.as_ref()?.high.as_ref()),
        w.pick("memory.low", |r| r.memory.as_ref()?.low.as_ref()),
    ];
    match w.backend? {
        Backend::Zram => {}
        Backend::Tmpfs => {
            for p in picks.iter().flatten().filter(|p| p.own) {
                cx.at(
                    p.v,
                    &p.field,
                    format!(
                        "`memory` thresholds watch the RAM of a zram device; mounts[{}] is a tmpfs, whose RAM is its usage (`warn`, `high`, `low`)",
                        w.i
                    ),
                    Some("memory thresholds on backend: zram only; on a tmpfs `high` (of its size) bounds its RAM"),
                );
            }
            return None;
        }
    }
    if picks.iter().all(Option::is_none) {
        return None;
    }
    let before = cx.diags.len();
    let mut bytes = |p: &Option<Pick<'_, String>>| -> Option<u64> {
        let p = p.as_ref()?;
        let why = match size::parse_size(&p.v.value) {
            Err(why) => why,
            Ok(SizeLit::Percent(pct)) if !(pct > 0.0 && pct <= 100.0) => {
                "a percentage above 0% and at most 100% (of the mount's size)".into()
            }
            // The size itself is invalid (reported): nothing to resolve against.
            Ok(_) if w.size == 0 => return None,
            Ok(lit) => match lit.resolve(w.size) {
                0 => "0 bytes would always be exceeded".into(),
                b if b > w.size => format!(
                    "above the mount's size {}: the device stores at most that much, so its RAM never reaches it",
                    size::format_bytes(w.size)
                ),
                b => return Some(b),
            },
        };
        cx.at(
            p.v,
            &p.field,
            format!("invalid memory threshold `{}`: {why}", p.v.value),
            Some(MEMORY_ACCEPTED),
        );
        None
    };
    let [pw, ph, pl] = &picks;
    let (warn, high, low) = (bytes(pw), bytes(ph), bytes(pl));
    if cx.diags.len() != before {
        return None;
    }
    let Some(high) = high else {
        let p = pw.as_ref().or(pl.as_ref())?;
        cx.at(
            p.v,
            &p.field,
            "`memory` needs `high`: the RAM at which the action chain runs".into(),
            Some("memory: { high: 64MiB } (warn and low are optional)"),
        );
        return None;
    };
    let t = MemoryThresholds {
        warn: warn.unwrap_or(high),
        high,
        low: low.unwrap_or(high / 4 * 3),
    };
    let fmt = size::format_bytes;
    let own_first = |a: &Option<Pick<'_, String>>, b: &Option<Pick<'_, String>>| {
        [a, b]
            .into_iter()
            .flatten()
            .find(|p| p.own)
            .or(a.as_ref())
            .or(b.as_ref())
            .map(|p| (p.v.referenced, p.field.clone()))
    };
    if t.low >= t.high {
        if let Some((loc, field)) = own_first(pl, ph) {
            cx.at_loc(
                &loc,
                &field,
                format!(
                    "memory low {} must be below memory high {}; the gap is the hysteresis",
                    fmt(t.low),
                    fmt(t.high)
                ),
                Some("low < high, e.g. memory: { high: 64MiB, low: 48MiB }"),
            );
        }
    }
    if t.warn > t.high {
        if let Some((loc, field)) = own_first(pw, ph) {
            cx.at_loc(
                &loc,
                &field,
                format!(
                    "memory warn {} is above memory high {}; it would never warn first",
                    fmt(t.warn),
                    fmt(t.high)
                ),
                Some("warn <= high, e.g. memory: { warn: 56MiB, high: 64MiB }"),
            );
        }
    }
    (cx.diags.len() == before).then_some(t)
}

/// The `action` chain, `[warn]` when unset; misplaced actions are reported.
fn chain(cx: &mut Ctx, w: &WdCtx<'_>) -> Chain {
    let parsed = match &w.pick("action", |r| r.action.as_ref()) {
        None => Some(Vec::new()),
        Some(p) => names(cx, p, "action", &Action::ALL, ACTION_ACCEPTED),
    };
    let known = parsed.is_some();
    let actions: Vec<Named<Action>> = parsed.unwrap_or_default();
    let n = actions.len();
    for (k, a) in actions.iter().enumerate() {
        match a.value {
            Action::Warn if n > 1 => cx.at_loc(
                &a.loc,
                &a.field,
                "`warn` only logs and cannot be combined with other actions".into(),
                Some(ACTION_ACCEPTED),
            ),
            Action::Fallback if k + 1 < n => cx.at_loc(
                &a.loc,
                &a.field,
                "`fallback` takes the mount out of RAM; no action can follow it".into(),
                Some(ACTION_ACCEPTED),
            ),
            Action::Evict => w.evict_needs_volatile(cx, &a.loc, &a.field),
            Action::Grow if w.overlay => cx.at_loc(
                &a.loc,
                &a.field,
                "`grow` acts on a tmpfs at the path; a seed: overlay mount has its overlay there, over a tmpfs it keeps elsewhere".into(),
                Some("evict (write the upper layer back and start it afresh), fallback or warn on a seed: overlay mount"),
            ),
            _ => {}
        }
    }
    Chain {
        grow: actions
            .iter()
            .find(|a| a.value == Action::Grow)
            .map(|a| (a.loc, a.field.clone())),
        actions: if actions.is_empty() {
            vec![Action::Warn]
        } else {
            actions.iter().map(|a| a.value).collect()
        },
        known,
    }
}

/// `max_size` in bytes; reported when it cannot serve `grow`.
fn max_size(cx: &mut Ctx, w: &WdCtx<'_>, chain: &Chain) -> Option<u64> {
    let p = w.pick("max_size", |r| r.max_size.as_ref())?;
    let max = match size::parse_size(&p.v.value) {
        Err(why) => {
            cx.at(
                p.v,
                &p.field,
                format!("invalid size `{}`: {why}", p.v.value),
                Some(SIZE_ACCEPTED),
            );
            return None;
        }
        Ok(lit) => lit.resolve(w.mem_total),
    };
    if p.own && chain.lacks(Action::Grow) {
        cx.at(
            p.v,
            &p.field,
            "`max_size` has no effect without `grow` in `action`".into(),
            Some(ACTION_ACCEPTED),
        );
    } else if w.size > 0 && max <= w.size && chain.has(Action::Grow) {
        cx.at(
            p.v,
            &p.field,
            format!(
                "max_size {} is not above the mount's size {}; grow would have no room",
                size::format_bytes(max),
                size::format_bytes(w.size)
            ),
            Some("a size above `size` (a percentage is of RAM)"),
        );
    } else if max > w.max_total && chain.has(Action::Grow) {
        cx.at(
            p.v,
            &p.field,
            format!(
                "max_size {} exceeds the RAM budget max_total {}",
                size::format_bytes(max),
                size::format_bytes(w.max_total)
            ),
            Some("at most `max_total` (default 50% of MemTotal)"),
        );
    }
    Some(max)
}

/// Bytes per grow step, by default a quarter of the mount's size.
fn grow_step(cx: &mut Ctx, w: &WdCtx<'_>, chain: &Chain) -> u64 {
    let default_step = SizeLit::Percent(25.0).resolve(w.size).max(1);
    let Some(p) = w.pick("grow_step", |r| r.grow_step.as_ref()) else {
        return default_step;
    };
    if p.own && chain.lacks(Action::Grow) {
        cx.at(
            p.v,
            &p.field,
            "`grow_step` has no effect without `grow` in `action`".into(),
            Some(ACTION_ACCEPTED),
        );
    }
    match size::parse_size(&p.v.value) {
        // A percentage is of the mount's size, not of RAM.
        Ok(lit) => lit.resolve(w.size).max(1),
        Err(why) => {
            cx.at(
                p.v,
                &p.field,
                format!("invalid grow step `{}`: {why}", p.v.value),
                Some("a size such as 64MiB, or a percentage of the mount's size such as 25%"),
            );
            default_step
        }
    }
}

/// The pressure guard's actions, and whether the list as written was valid.
fn pressure(cx: &mut Ctx, w: &WdCtx<'_>) -> (Vec<PressureAction>, bool) {
    let volatile = w.persist.map(|p| p == Persist::None);
    let picked = w.pick("pressure", |r| r.pressure.as_ref());
    let none = |p: &Pick<'_, NameList>| match &p.v.value {
        NameList::One(n) => n == "none",
        NameList::Many(l) => l.is_empty(),
    };
    if w.overlay {
        // Its RAM is the upper layer, given back by its own watchdog's evict; the
        // guard leaves it alone, and says so where asked otherwise (not for defaults).
        if let Some(p) = picked.as_ref().filter(|p| p.own && !none(p)) {
            cx.at_loc(
                &p.v.referenced,
                &p.field,
                "the memory-pressure guard leaves seed: overlay mounts alone; their RAM is given back by the watchdog's evict".into(),
                Some("pressure: none on a seed: overlay mount, and evict in its watchdog's action"),
            );
        }
        return (Vec::new(), true);
    }
    match &picked {
        None if volatile == Some(true) => (
            vec![
                PressureAction::Evict,
                PressureAction::Shrink,
                PressureAction::Fallback,
            ],
            true,
        ),
        None => (vec![PressureAction::Shrink, PressureAction::Fallback], true),
        Some(p) if matches!(&p.v.value, NameList::One(n) if n == "none") => (Vec::new(), true),
        Some(p) if matches!(&p.v.value, NameList::Many(l) if l.is_empty()) => (Vec::new(), true),
        Some(p) => {
            let list = names(cx, p, "pressure action", &PressureAction::ALL, PRESSURE_ACCEPTED);
            let known = list.is_some();
            let list = list.unwrap_or_default();
            for a in list.iter().filter(|a| a.value == PressureAction::Evict) {
                w.evict_needs_volatile(cx, &a.loc, &a.field);
            }
            (list.into_iter().map(|a| a.value).collect(), known)
        }
    }
}

/// Seconds after a fallback before the agent offloads again; `None`: never.
fn reoffload_after(
    cx: &mut Ctx,
    w: &WdCtx<'_>,
    chain: &Chain,
    pressure: &[PressureAction],
    pressure_known: bool,
) -> Option<u64> {
    let p = w.pick("reoffload_after", |r| r.reoffload_after.as_ref())?;
    if p.own
        && chain.lacks(Action::Fallback)
        && pressure_known
        && !pressure.contains(&PressureAction::Fallback)
    {
        cx.at(
            p.v,
            &p.field,
            "`reoffload_after` has no effect: neither `action` nor `pressure` has `fallback`".into(),
            Some(ACTION_ACCEPTED),
        );
    }
    let v = p.v.value.trim();
    if v == "never" {
        return None;
    }
    let why = match parse_duration(v) {
        Ok(secs) if (MIN_PERIOD_SECS..=MAX_PERIOD_SECS).contains(&secs) => return Some(secs),
        Ok(secs) if secs < MIN_PERIOD_SECS => "at least 10s, or the mount would flap".to_string(),
        Ok(_) => "at most 30d; for no re-offload by the agent write `never`".to_string(),
        Err(why) => why,
    };
    cx.at(
        p.v,
        &p.field,
        format!("invalid reoffload_after `{}`: {why}", p.v.value),
        Some(REOFFLOAD_ACCEPTED),
    );
    None
}

fn priority(cx: &mut Ctx, w: &WdCtx<'_>) -> u32 {
    let Some(p) = w.pick("priority", |r| r.priority.as_ref()) else {
        return DEFAULT_PRIORITY;
    };
    match u32::try_from(p.v.value).ok().filter(|v| *v <= MAX_PRIORITY) {
        Some(v) => v,
        None => {
            cx.at(
                p.v,
                &p.field,
                format!("invalid priority {}", p.v.value),
                Some("a whole number from 0 (acted on first under memory pressure) to 100"),
            );
            DEFAULT_PRIORITY
        }
    }
}

fn evict_group(cx: &mut Ctx, w: &WdCtx<'_>) -> EvictGroup {
    let Some(p) = w.pick("evict_group", |r| r.evict_group.as_ref()) else {
        return EvictGroup::default();
    };
    match EvictGroup::ALL.iter().find(|(n, _)| *n == p.v.value.trim()) {
        Some((_, g)) => *g,
        None => {
            cx.at(
                p.v,
                &p.field,
                format!("invalid evict_group `{}`", p.v.value),
                Some("stem (files named alike up to their first dot go together), directory, or file"),
            );
            EvictGroup::default()
        }
    }
}
