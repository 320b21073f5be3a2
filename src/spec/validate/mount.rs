//! A mount's own fields: name, size, owner, mode, options, policies and the
//! units it comes before, with the `defaults:` they inherit.

use serde_saphyr::Spanned;

use super::{ids, paths, watchdog, Ctx, MAX_PERIOD_SECS, MAX_UNIT_NAME, MIN_PERIOD_SECS};
use crate::spec::duration::parse_duration;
use crate::spec::raw::{RawDefaults, RawMount, RawWatchdog};
use crate::spec::size::{self, COUNT_ACCEPTED, SIZE_ACCEPTED};
use crate::spec::{
    Action, Atime, Backend, Flags, Huge, MountSpec, OnFailure, Persist, Seed, Watchdog, ZramFs,
    ZRAM_COMPRESSIONS,
};

const OPTIONS_ACCEPTED: &str = "nosuid, nodev, noexec, and at most one of relatime, noatime, strictatime";
const NAME_ACCEPTED: &str = "1 to 48 characters of a-z, 0-9, '_' and '-', starting with a letter or digit";

const MODE_ACCEPTED: &str = "a quoted octal string up to 07777, e.g. \"0750\"";
/// tmpfsctl's boot units and what they are ordered after (src/boot/systemd.rs).
const BOOT_ORDER: &[&str] = &[
    crate::boot::systemd::APPLY_UNIT,
    crate::boot::systemd::DOWN_UNIT,
    crate::boot::systemd::AGENT_UNIT,
    crate::boot::systemd::APPLY_AFTER[0],
    crate::boot::systemd::APPLY_AFTER[1],
    "local-fs-pre.target",
    "shutdown.target",
];
const UNIT_SUFFIXES: &[&str] = &[
    ".service",
    ".socket",
    ".target",
    ".mount",
    ".automount",
    ".timer",
    ".path",
    ".slice",
    ".scope",
    ".swap",
    ".device",
];
const DEFAULT_OPTIONS: Flags = Flags {
    nosuid: true,
    nodev: true,
    noexec: false,
    atime: None,
};

pub(super) struct Defaults {
    backend: Backend,
    flags: Flags,
    huge: Huge,
    noswap: bool,
    seed: Seed,
    on_failure: OnFailure,
}

pub(super) fn defaults(cx: &mut Ctx, raw: &RawDefaults) -> Defaults {
    Defaults {
        backend: raw
            .backend
            .as_ref()
            .and_then(|b| backend(cx, "defaults.backend", b))
            .unwrap_or_default(),
        flags: raw
            .options
            .as_ref()
            .and_then(|o| flags(cx, "defaults.options", o))
            .unwrap_or(DEFAULT_OPTIONS),
        huge: raw
            .huge
            .as_ref()
            .and_then(|h| huge(cx, "defaults.huge", h))
            .unwrap_or(Huge::Never),
        noswap: raw.noswap.as_ref().map(|b| b.value).unwrap_or(false),
        seed: raw
            .seed
            .as_ref()
            .and_then(|s| seed(cx, "defaults.seed", s))
            .unwrap_or(Seed::Copy),
        on_failure: raw
            .on_failure
            .as_ref()
            .and_then(|s| on_failure(cx, "defaults.on_failure", s))
            .unwrap_or(OnFailure::KeepDisk),
    }
}

pub(super) fn mount(
    cx: &mut Ctx,
    i: usize,
    m: &RawMount,
    d: &Defaults,
    wd_defaults: Option<&RawWatchdog>,
    mem_total: u64,
    max_total: u64,
) -> Option<MountSpec> {
    let field = |f: &str| format!("mounts[{i}].{f}");
    let before = cx.diags.len();

    let name = m.name.as_ref().map(|n| n.value.clone());
    if let Some(n) = m.name.as_ref().filter(|n| !valid_name(&n.value)) {
        cx.at(
            n,
            &field("name"),
            format!("invalid mount name `{}`", n.value),
            Some(NAME_ACCEPTED),
        );
    }
    let create = m.create.as_ref().map(|b| b.value).unwrap_or(false);
    let path = m
        .path
        .as_ref()
        .and_then(|p| paths::path(cx, &field("path"), p, create));

    let size = m
        .size
        .as_ref()
        .map_or(0, |s| mount_size(cx, &field("size"), s, mem_total));
    let inodes = m.inodes.as_ref().and_then(|s| inodes(cx, &field("inodes"), s));
    let owner = m.owner.as_ref().and_then(|s| ids::user(cx, &field("owner"), s));
    let group = m.group.as_ref().and_then(|s| ids::group(cx, &field("group"), s));
    let mode = m.mode.as_ref().and_then(|s| mode(cx, &field("mode"), s));
    let flags = match &m.options {
        Some(o) => flags(cx, &field("options"), o),
        None => Some(d.flags),
    };
    let huge = match &m.huge {
        Some(h) => huge(cx, &field("huge"), h),
        None => Some(d.huge),
    };
    let backend = match &m.backend {
        Some(b) => backend(cx, &field("backend"), b),
        None => Some(d.backend),
    };
    let compression = m
        .compression
        .as_ref()
        .and_then(|c| {
            choice(
                cx,
                &field("compression"),
                c,
                "compression",
                &ZRAM_COMPRESSIONS.map(|n| (n, n)),
            )
        })
        .map(str::to_string);
    let fs = match &m.fs {
        Some(s) => choice(cx, &field("fs"), s, "filesystem", &ZramFs::ALL),
        None => Some(ZramFs::default()),
    };
    let seed = match &m.seed {
        Some(s) => seed(cx, &field("seed"), s),
        None => Some(d.seed),
    };
    let on_failure = match &m.on_failure {
        Some(s) => on_failure(cx, &field("on_failure"), s),
        None => Some(d.on_failure),
    };
    let persist = match &m.persist {
        Some(s) => persist(cx, &field("persist"), s),
        None => Some(Persist::None),
    };
    if let (Some(p), Some(Seed::Empty), Some(s)) = (persist, seed, &m.persist) {
        persisted_but_seeded_empty(cx, &field("persist"), s, p);
    }
    let watchdog = watchdog::watchdog(
        cx,
        &watchdog::WdCtx {
            i,
            mount: m.watchdog.as_ref(),
            defaults: wd_defaults,
            size,
            persist,
            backend,
            mem_total,
            max_total,
            overlay: seed == Some(Seed::Overlay),
        },
    );
    if seed == Some(Seed::Overlay) {
        if let (Some(p), Some(raw), Some(n)) = (&path, &m.path, &name) {
            paths::overlay_lower(cx, &field("path"), raw, p, n);
        }
        overlay_limits(cx, i, m, persist);
    }
    match backend {
        Some(Backend::Zram) => zram_limits(cx, i, m, fs, wd_defaults, watchdog.as_ref()),
        Some(Backend::Tmpfs) => zram_only(cx, i, m),
        None => {}
    }
    let before_units = m
        .before
        .as_ref()
        .map_or_else(Vec::new, |l| before_units(cx, i, &l.value));

    if cx.diags.len() != before {
        return None;
    }
    Some(MountSpec {
        name: name?,
        path: path?,
        backend: backend?,
        compression,
        fs: fs?,
        size,
        inodes,
        owner,
        group,
        mode,
        create,
        takeover: m.takeover.as_ref().map(|b| b.value).unwrap_or(false),
        flags: flags?,
        huge: huge?,
        noswap: m.noswap.as_ref().map(|b| b.value).unwrap_or(d.noswap),
        seed: seed?,
        persist: persist?,
        on_failure: on_failure?,
        before: before_units,
        watchdog: watchdog?,
    })
}

/// `compression` and `fs` describe a zram device; on a tmpfs they would be
/// silently meaningless.
fn zram_only(cx: &mut Ctx, i: usize, m: &RawMount) {
    for (name, v) in [("compression", &m.compression), ("fs", &m.fs)] {
        if let Some(v) = v {
            cx.at(
                v,
                &format!("mounts[{i}].{name}"),
                format!("`{name}` applies to backend: zram only"),
                Some("backend: zram with this field, or no such field"),
            );
        }
    }
}

/// What a zram mount cannot do. `huge` and `noswap` are tmpfs options (zram
/// memory is never swapped); the mount's own values are refused, inherited
/// `defaults` are not its concern. `grow` would need a larger device: a
/// zram device's size is fixed once set. btrfs makes its inodes as it needs
/// them: an `inodes` count would be silently meaningless.
fn zram_limits(
    cx: &mut Ctx,
    i: usize,
    m: &RawMount,
    fs: Option<ZramFs>,
    wd_defaults: Option<&RawWatchdog>,
    watchdog: Option<&Watchdog>,
) {
    if let Some(h) = m.huge.as_ref().filter(|h| h.value != "never") {
        cx.at(
            h,
            &format!("mounts[{i}].huge"),
            format!(
                "huge `{}` is a tmpfs option; a zram mount has no huge pages",
                h.value
            ),
            Some("never, or no `huge` on a zram mount"),
        );
    }
    if let Some(n) = m.noswap.as_ref().filter(|n| n.value) {
        cx.at(
            n,
            &format!("mounts[{i}].noswap"),
            "noswap is a tmpfs option; zram memory is never swapped out".to_string(),
            Some("false, or no `noswap` on a zram mount"),
        );
    }
    if let (Some(ZramFs::Btrfs), Some(n)) = (fs, &m.inodes) {
        cx.at(
            n,
            &format!("mounts[{i}].inodes"),
            format!(
                "inodes `{}` cannot apply to fs: btrfs, which makes its inodes as it needs them",
                n.value
            ),
            Some("no `inodes` with fs: btrfs (or fs: ext4 with `inodes`)"),
        );
    }
    if watchdog.is_some_and(|w| w.actions.contains(&Action::Grow)) {
        let (at, field) = match m.watchdog.as_ref().and_then(|w| w.action.as_ref()) {
            Some(a) => (a.referenced, format!("mounts[{i}].watchdog.action")),
            None => match wd_defaults.and_then(|w| w.action.as_ref()) {
                Some(a) => (a.referenced, "defaults.watchdog.action".to_string()),
                None => return,
            },
        };
        cx.at_loc(
            &at,
            &field,
            "`grow` cannot work on a zram mount: a zram device's size is fixed once set (docs/zram.md, \"Why not grow\"); raise `size` and run `down`, then `apply`, and bound its RAM with `watchdog.memory`".to_string(),
            Some("warn, evict, fallback on a zram mount"),
        );
    }
}

/// What `seed: overlay` cannot do, each refused with its reason
/// (docs/overlay.md). Placed at the mount's own field when it has one, else at
/// its seed or name (the value came from `defaults:`).
fn overlay_limits(cx: &mut Ctx, i: usize, m: &RawMount, persist: Option<Persist>) {
    let Some(anchor) = m.seed.as_ref().or(m.name.as_ref()) else {
        return;
    };
    let field = |f: &str| format!("mounts[{i}].{f}");
    let at = |s: Option<&Spanned<String>>| s.unwrap_or(anchor).referenced;
    if persist == Some(Persist::None) {
        cx.at_loc(
            &at(m.persist.as_ref()),
            &field("persist"),
            "seed: overlay keeps every write only in the RAM upper layer; with persist: none `down` would drop them all, and a cache that may lose its writes needs no overlay (seed: empty)".to_string(),
            Some("persist: on-stop or every <duration> with seed: overlay"),
        );
    }
}

/// A write-back of a tree that started empty would empty the disk directory.
fn persisted_but_seeded_empty(cx: &mut Ctx, field: &str, s: &Spanned<String>, p: Persist) {
    if p != Persist::None {
        cx.at(s, field, format!(
            "persist `{}` with seed: empty would replace the on-disk contents with an empty tree at the first write-back",
            s.value
        ), Some("persist: none with seed: empty, or seed: copy"));
    }
}

/// The size in bytes, 0 when it is invalid (reported).
fn mount_size(cx: &mut Ctx, field: &str, s: &Spanned<String>, mem_total: u64) -> u64 {
    match size::parse_size(&s.value) {
        Ok(lit) => match lit.resolve(mem_total) {
            0 => {
                cx.at(
                    s,
                    field,
                    format!(
                        "size `{}` is 0 bytes of MemTotal {}; 0 would mean an unlimited tmpfs",
                        s.value,
                        size::format_bytes(mem_total)
                    ),
                    Some(SIZE_ACCEPTED),
                );
                0
            }
            bytes => bytes,
        },
        Err(why) => {
            cx.at(
                s,
                field,
                format!("invalid size `{}`: {why}", s.value),
                Some(SIZE_ACCEPTED),
            );
            0
        }
    }
}

fn inodes(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<u64> {
    match size::parse_count(&s.value) {
        Ok(n) => Some(n),
        Err(why) => {
            cx.at(
                s,
                field,
                format!("invalid inode count `{}`: {why}", s.value),
                Some(COUNT_ACCEPTED),
            );
            None
        }
    }
}

fn mode(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<u32> {
    let mode = parse_mode(&s.value);
    if mode.is_none() {
        cx.at(
            s,
            field,
            format!("invalid mode `{}`", s.value),
            Some(MODE_ACCEPTED),
        );
    }
    mode
}

/// The valid units of mounts[i]'s `before`; the others are reported.
fn before_units(cx: &mut Ctx, i: usize, list: &[Spanned<String>]) -> Vec<String> {
    let mut units = Vec::new();
    for (k, u) in list.iter().enumerate() {
        let field = format!("mounts[{i}].before[{k}]");
        if BOOT_ORDER.contains(&u.value.as_str()) {
            cx.at(
                u,
                &field,
                format!(
                    "`{}` starts before tmpfsctl's boot units (or is one): ordering it after them is a cycle, which systemd breaks by dropping a job",
                    u.value
                ),
                Some("the units that use the cache, such as nginx.service"),
            );
        } else if valid_unit(&u.value) {
            units.push(u.value.clone());
        } else {
            cx.at(u, &field, format!("invalid systemd unit name `{}`", u.value), Some(
                "a unit name such as nginx.service (letters, digits, :-_.\\@, and a suffix like .service, .socket, .target)",
            ));
        }
    }
    units
}

fn valid_name(name: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-';
    (1..=48).contains(&name.len())
        && name.chars().all(ok_char)
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// systemd's rules (unit_name_is_valid): a known type suffix after a
/// non-empty prefix of `[A-Za-z0-9:_.\\-]`, with `@` for templates and
/// instances, never first; at most 255 characters.
fn valid_unit(unit: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || ":-_.\\@".contains(c);
    unit.len() <= MAX_UNIT_NAME
        && !unit.starts_with('@')
        && unit.chars().all(ok_char)
        && UNIT_SUFFIXES
            .iter()
            .any(|s| unit.len() > s.len() && unit.ends_with(s))
}

fn parse_mode(text: &str) -> Option<u32> {
    let t = text.trim();
    let t = t.strip_prefix("0o").unwrap_or(t);
    if t.is_empty() || t.len() > 5 || !t.chars().all(|c| ('0'..='7').contains(&c)) {
        return None;
    }
    u32::from_str_radix(t, 8).ok().filter(|m| *m <= 0o7777)
}

fn flags(cx: &mut Ctx, field: &str, list: &Spanned<Vec<Spanned<String>>>) -> Option<Flags> {
    let mut f = Flags::default();
    let mut ok = true;
    for (k, o) in list.value.iter().enumerate() {
        let atime = match o.value.as_str() {
            "nosuid" => {
                f.nosuid = true;
                None
            }
            "nodev" => {
                f.nodev = true;
                None
            }
            "noexec" => {
                f.noexec = true;
                None
            }
            "relatime" => Some(Atime::Relatime),
            "noatime" => Some(Atime::Noatime),
            "strictatime" => Some(Atime::Strictatime),
            other => {
                let why = match other {
                    "ro" => "a read-only cache cannot be written".to_string(),
                    "suid" | "dev" | "exec" => {
                        format!("`{other}` is the default; leave `no{other}` out of the list instead")
                    }
                    s if s.starts_with("size")
                        || s.starts_with("nr_inodes")
                        || s.starts_with("mode")
                        || s.starts_with("uid")
                        || s.starts_with("gid")
                        || s.starts_with("huge") =>
                    {
                        format!("`{other}` has its own field in the spec")
                    }
                    _ => format!("unknown mount option `{other}`"),
                };
                cx.at(o, &format!("{field}[{k}]"), why, Some(OPTIONS_ACCEPTED));
                ok = false;
                None
            }
        };
        if let Some(a) = atime {
            if f.atime.is_some_and(|prev| prev != a) {
                cx.at(
                    o,
                    &format!("{field}[{k}]"),
                    format!("`{}` conflicts with an earlier atime option", o.value),
                    Some(OPTIONS_ACCEPTED),
                );
                ok = false;
            }
            f.atime = Some(a);
        }
    }
    ok.then_some(f)
}

fn choice<T: Copy>(
    cx: &mut Ctx,
    field: &str,
    s: &Spanned<String>,
    what: &str,
    table: &[(&str, T)],
) -> Option<T> {
    let found = table.iter().find(|(n, _)| *n == s.value).map(|(_, v)| *v);
    if found.is_none() {
        let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
        cx.at(
            s,
            field,
            format!("invalid {what} `{}`", s.value),
            Some(&names.join(", ")),
        );
    }
    found
}

fn backend(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<Backend> {
    choice(cx, field, s, "backend", &Backend::ALL)
}

fn huge(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<Huge> {
    choice(cx, field, s, "huge page policy", &Huge::ALL)
}

pub(in crate::spec) const SEEDS: [(&str, Seed); 3] = [
    ("copy", Seed::Copy),
    ("empty", Seed::Empty),
    ("overlay", Seed::Overlay),
];
pub(in crate::spec) const ON_FAILURES: [(&str, OnFailure); 2] =
    [("keep-disk", OnFailure::KeepDisk), ("fail", OnFailure::Fail)];
/// What `flags` accepts in `options` (the JSON schema's list).
pub(in crate::spec) const OPTION_NAMES: [&str; 6] =
    ["nosuid", "nodev", "noexec", "relatime", "noatime", "strictatime"];

fn seed(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<Seed> {
    choice(cx, field, s, "seed mode", &SEEDS)
}

fn on_failure(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<OnFailure> {
    choice(cx, field, s, "failure policy", &ON_FAILURES)
}

const PERSIST_ACCEPTED: &str =
    "none, on-stop, or `every <duration>` with s/m/h/d units from 10s to 30d, e.g. every 15m";

fn persist(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<Persist> {
    let v = s.value.trim();
    let parsed = match v {
        "none" => Ok(Persist::None),
        "on-stop" => Ok(Persist::OnStop),
        _ => match v.strip_prefix("every ") {
            Some(d) => parse_duration(d.trim()).and_then(|secs| {
                if secs < MIN_PERIOD_SECS {
                    Err(
                        "a write-back more often than every 10s would turn the cache back into disk I/O"
                            .to_string(),
                    )
                } else if secs > MAX_PERIOD_SECS {
                    Err("at most every 30d; for a write-back only at shutdown use `on-stop`".to_string())
                } else {
                    Ok(Persist::Every(secs))
                }
            }),
            None => Err("unknown mode".to_string()),
        },
    };
    match parsed {
        Ok(p) => Some(p),
        Err(why) => {
            cx.at(
                s,
                field,
                format!("invalid persist `{}`: {why}", s.value),
                Some(PERSIST_ACCEPTED),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["nginx", "php-fpm", "a", "cache_2", "0cache"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "Nginx", "-x", "_x", "a b", "a/b", "ä", &"x".repeat(49)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn units() {
        for ok in [
            "nginx.service",
            "getty@tty1.service",
            "a.socket",
            "multi-user.target",
        ] {
            assert!(valid_unit(ok), "{ok}");
        }
        for bad in ["nginx", ".service", "a b.service", "x.conf", "a/b.service"] {
            assert!(!valid_unit(bad), "{bad}");
        }
    }

    #[test]
    fn modes() {
        assert_eq!(parse_mode("0750"), Some(0o750));
        assert_eq!(parse_mode("750"), Some(0o750));
        assert_eq!(parse_mode("1777"), Some(0o1777));
        assert_eq!(parse_mode("0o700"), Some(0o700));
        for bad in ["", "0800", "rwx", "17777", "07777 1", "-1"] {
            assert_eq!(parse_mode(bad), None, "{bad}");
        }
    }
}
