//! Turns a positioned raw spec into a `Spec`, collecting every problem.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use serde_saphyr::{Location, Spanned};

use super::raw::{NameList, RawAgent, RawDefaults, RawMount, RawSpec, RawWatchdog};
use super::size::{self, SizeLit, COUNT_ACCEPTED, SIZE_ACCEPTED};
use super::{
    Action, AgentSettings, Atime, EvictGroup, Flags, Huge, MetricsTarget, MountSpec, OnFailure, Persist,
    PressureAction, Seed, Spec, Thresholds, Watchdog, DEFAULT_PRIORITY,
};
use crate::error::{Diagnostic, SpecError};

/// Directories a tmpfs must never hide. Entries ending in `/` are refused
/// together with everything beneath them; the others only as themselves.
/// Besides these, [`ssh_dir`] refuses SSH key directories wherever they are.
/// The list is in README.md ("Refused paths").
pub const SYSTEM_DIRS: &[&str] = &[
    "/bin/",
    "/boot/",
    "/dev/",
    "/etc/",
    "/lib/",
    "/lib32/",
    "/lib64/",
    "/libx32/",
    "/proc/",
    "/run/",
    "/sbin/",
    "/sys/",
    "/usr/",
    // Package databases: a tmpfs there makes the package manager forget
    // what is installed, or lose it at the next reboot.
    "/var/lib/apt/",
    "/var/lib/dnf/",
    "/var/lib/dpkg/",
    "/var/lib/pacman/",
    "/var/lib/rpm/",
    "/var/lib/yum/",
    // Persistent system state: machine-id seeds, timers, journal cursors.
    "/var/lib/systemd/",
    // Scheduled jobs: crontabs and at jobs.
    "/var/spool/anacron/",
    "/var/spool/at/",
    "/var/spool/cron/",
    "/home",
    "/media",
    "/mnt",
    "/opt",
    "/root",
    "/srv",
    "/tmp",
    "/var",
    "/var/cache",
    "/var/lib",
    "/var/log",
    "/var/spool",
    "/var/tmp",
];

const OPTIONS_ACCEPTED: &str = "nosuid, nodev, noexec, and at most one of relatime, noatime, strictatime";
const NAME_ACCEPTED: &str = "1 to 48 characters of a-z, 0-9, '_' and '-', starting with a letter or digit";
const MAX_PATH_BYTES: usize = 4095;
const MAX_NAME_BYTES: usize = 255;
/// systemd's UNIT_NAME_MAX less its NUL: a longer name is hashed by systemd,
/// and the boot units could not name the mount.
const MAX_UNIT_NAME: usize = 255;
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
const DEFAULT_MAX_TOTAL_PERCENT: f64 = 50.0;
/// More tmpfs mounts than any host runs for its caches; keeps the pairwise
/// path checks cheap whatever the input.
const MAX_MOUNTS: usize = 1000;
const MOUNTS_ACCEPTED: &str = "a list of at most 1000 mounts";

struct Ctx {
    diags: Vec<Diagnostic>,
    paths: Paths,
}

/// How far managed paths are checked against the filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paths {
    /// They must exist (or be creatable) without a symlink on the way: for
    /// commands that mount there (`validate`, `plan`, `apply`, the agent).
    Check,
    /// As written: for commands that find their mounts in the mount table
    /// (`status`, `sync`, `down`), where one renamed or missing path must not
    /// keep the other mounts from being written back.
    AsWritten,
    /// As [`Paths::Check`], inside an image or container tree: managed paths
    /// are looked up under this directory, and user and group names in its
    /// `etc/passwd` and `etc/group` instead of the host's databases
    /// (`validate --root`, `boot install --root`).
    Under(PathBuf),
}

impl Paths {
    /// The tree managed paths are checked in (`/` for the host), or `None`
    /// when they are taken as written.
    fn tree(&self) -> Option<&Path> {
        match self {
            Paths::Check => Some(Path::new("/")),
            Paths::AsWritten => None,
            Paths::Under(root) => Some(root),
        }
    }

    /// `path` (absolute) as it is reached from this process.
    fn host_path(&self, path: &Path) -> PathBuf {
        match self {
            Paths::Under(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
            _ => path.to_path_buf(),
        }
    }
}

/// Looks `name` up in a passwd- or group-format file (`name:x:id:...`).
fn id_in_file(file: &Path, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let mut f = l.split(':');
        (f.next() == Some(name))
            .then(|| f.nth(1)?.parse::<u32>().ok())
            .flatten()
    })
}

impl Ctx {
    fn at<T>(&mut self, s: &Spanned<T>, field: &str, message: String, accepted: Option<&str>) {
        self.at_loc(&s.referenced, field, message, accepted);
    }

    fn at_loc(&mut self, loc: &Location, field: &str, message: String, accepted: Option<&str>) {
        self.diags.push(diagnostic(loc, field, message, accepted));
    }
}

pub(super) fn diagnostic(loc: &Location, field: &str, message: String, accepted: Option<&str>) -> Diagnostic {
    Diagnostic {
        line: loc.line().max(1),
        column: loc.column().max(1),
        width: (loc.span().len() as usize).max(1),
        field: field.to_string(),
        message,
        accepted: accepted.map(str::to_string),
    }
}

struct Defaults {
    flags: Flags,
    huge: Huge,
    noswap: bool,
    seed: Seed,
    on_failure: OnFailure,
}

/// `diags` holds what reading the YAML found; validation adds to it.
pub fn validate(
    file: &Path,
    text: &str,
    raw: RawSpec,
    diags: Vec<Diagnostic>,
    mem_total: u64,
    paths: Paths,
) -> Result<Spec, SpecError> {
    let mut cx = Ctx { diags, paths };
    if let Some(v) = raw.version.as_ref().filter(|v| v.value != 1) {
        cx.at(
            v,
            "version",
            format!("unsupported spec version {}", v.value),
            Some("1"),
        );
    }
    let max_total = match &raw.max_total {
        None => SizeLit::Percent(DEFAULT_MAX_TOTAL_PERCENT).resolve(mem_total),
        Some(s) => match size::parse_size(&s.value) {
            Ok(lit) => lit.resolve(mem_total),
            Err(why) => {
                cx.at(
                    s,
                    "max_total",
                    format!("invalid size `{}`: {why}", s.value),
                    Some(SIZE_ACCEPTED),
                );
                u64::MAX
            }
        },
    };
    let raw_defaults = raw.defaults.unwrap_or_default();
    let defaults = defaults(&mut cx, &raw_defaults);
    let agent = agent(&mut cx, raw.agent.as_ref(), mem_total);
    // `mounts: []` is valid and mounts nothing: the packaged
    // /etc/tmpfsctl/cache.yaml until an operator fills it in.
    let no_mounts = Vec::new();
    let raw_mounts = raw.mounts.as_ref().map_or(&no_mounts, |m| &m.value);
    if let Some(list) = raw.mounts.as_ref().filter(|l| l.value.len() > MAX_MOUNTS) {
        cx.at(
            list,
            "mounts",
            format!("{} mounts; at most {MAX_MOUNTS} are managed", list.value.len()),
            Some(MOUNTS_ACCEPTED),
        );
    }

    let mut mounts = Vec::new();
    let mut by_name: HashMap<String, usize> = HashMap::new();
    // Existing directories by (device, inode): one directory can have two
    // paths (a bind mount), and two tmpfs over it would hide each other.
    let mut by_dir: HashMap<(u64, u64), (usize, PathBuf)> = HashMap::new();
    let mut budget_used: u64 = 0;
    for (i, m) in raw_mounts.iter().enumerate().take(MAX_MOUNTS) {
        let Some(m) = m else { continue };
        let wd_defaults = raw_defaults.watchdog.as_ref();
        let Some(spec) = mount(&mut cx, i, m, &defaults, wd_defaults, mem_total, max_total) else {
            continue;
        };
        let field = |f: &str| format!("mounts[{i}].{f}");
        // `mount` returns a spec only when all three are there.
        let (Some(m_name), Some(m_path), Some(m_size)) = (&m.name, &m.path, &m.size) else {
            continue;
        };
        if let Some(prev) = by_name.insert(spec.name.clone(), i) {
            cx.at(
                m_name,
                &field("name"),
                format!("duplicate mount name `{}` (also mounts[{prev}])", spec.name),
                Some("a name unique within the spec"),
            );
        }
        let dir = cx
            .paths
            .tree()
            .and_then(|_| std::fs::metadata(cx.paths.host_path(&spec.path)).ok())
            .map(|md| (md.dev(), md.ino()));
        if let Some(id) = dir {
            // The same path twice is reported below as a duplicate.
            match by_dir.get(&id).filter(|(_, p)| *p != spec.path) {
                Some((j, other)) => cx.at(
                    m_path,
                    &field("path"),
                    format!(
                        "`{}` is the same directory as mounts[{j}] `{}` (a bind mount?)",
                        spec.path.display(),
                        other.display()
                    ),
                    Some("each directory managed once"),
                ),
                None => {
                    by_dir.insert(id, (i, spec.path.clone()));
                }
            }
        }
        for (j, other) in &mounts {
            let other: &MountSpec = other;
            if other.path == spec.path {
                cx.at(
                    m_path,
                    &field("path"),
                    format!("duplicate path `{}` (also mounts[{j}])", spec.path.display()),
                    Some("each path managed once"),
                );
            } else if other.path.starts_with(&spec.path) || spec.path.starts_with(&other.path) {
                cx.at(
                    m_path,
                    &field("path"),
                    format!(
                        "`{}` and mounts[{j}] `{}` are nested; one tmpfs would hide the other",
                        spec.path.display(),
                        other.path.display()
                    ),
                    Some("paths that are not inside one another"),
                );
            }
        }
        budget_used = budget_used.saturating_add(spec.size);
        if budget_used > max_total {
            cx.at(
                m_size,
                &field("size"),
                format!(
                    "total size {} of mounts[0..={i}] exceeds the RAM budget max_total {} (MemTotal {})",
                    size::format_bytes(budget_used),
                    size::format_bytes(max_total),
                    size::format_bytes(mem_total)
                ),
                Some("smaller sizes, or a larger top-level `max_total` (default 50% of MemTotal)"),
            );
            budget_used = 0;
        }
        mounts.push((i, spec));
    }

    if cx.diags.is_empty() {
        Ok(Spec {
            file: file.to_path_buf(),
            max_total,
            mounts: mounts.into_iter().map(|(_, m)| m).collect(),
            agent,
        })
    } else {
        cx.diags.sort_by_key(|d| (d.line, d.column));
        // A bad `defaults` value is found once per mount that inherits it.
        let mut seen = std::collections::HashSet::new();
        cx.diags
            .retain(|d| seen.insert((d.line, d.column, d.field.clone(), d.message.clone())));
        Err(SpecError {
            file: file.to_path_buf(),
            source_text: text.to_string(),
            diagnostics: cx.diags,
        })
    }
}

fn defaults(cx: &mut Ctx, raw: &RawDefaults) -> Defaults {
    Defaults {
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

fn mount(
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
    let path = m.path.as_ref().and_then(|p| path(cx, &field("path"), p, create));

    let size = m.size.as_ref().map_or(0, |s| match size::parse_size(&s.value) {
        Ok(lit) => match lit.resolve(mem_total) {
            0 => {
                cx.at(
                    s,
                    &field("size"),
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
                &field("size"),
                format!("invalid size `{}`: {why}", s.value),
                Some(SIZE_ACCEPTED),
            );
            0
        }
    });
    let inodes = m.inodes.as_ref().and_then(|s| match size::parse_count(&s.value) {
        Ok(n) => Some(n),
        Err(why) => {
            cx.at(
                s,
                &field("inodes"),
                format!("invalid inode count `{}`: {why}", s.value),
                Some(COUNT_ACCEPTED),
            );
            None
        }
    });
    let owner = m.owner.as_ref().and_then(|s| user(cx, &field("owner"), s));
    let group = m.group.as_ref().and_then(|s| group(cx, &field("group"), s));
    let mode = m.mode.as_ref().and_then(|s| match parse_mode(&s.value) {
        Some(v) => Some(v),
        None => {
            cx.at(
                s,
                &field("mode"),
                format!("invalid mode `{}`", s.value),
                Some(MODE_ACCEPTED),
            );
            None
        }
    });
    let flags = match &m.options {
        Some(o) => flags(cx, &field("options"), o),
        None => Some(d.flags),
    };
    let huge = match &m.huge {
        Some(h) => huge(cx, &field("huge"), h),
        None => Some(d.huge),
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
        if p != Persist::None {
            cx.at(s, &field("persist"), format!(
                "persist `{}` with seed: empty would replace the on-disk contents with an empty tree at the first write-back",
                s.value
            ), Some("persist: none with seed: empty, or seed: copy"));
        }
    }
    let watchdog = watchdog(
        cx,
        &WdCtx {
            i,
            mount: m.watchdog.as_ref(),
            defaults: wd_defaults,
            size,
            persist,
            mem_total,
            max_total,
        },
    );
    let mut before_units = Vec::new();
    if let Some(list) = &m.before {
        for (k, u) in list.value.iter().enumerate() {
            if BOOT_ORDER.contains(&u.value.as_str()) {
                cx.at(
                    u,
                    &field(&format!("before[{k}]")),
                    format!(
                        "`{}` starts before tmpfsctl's boot units (or is one): ordering it after them is a cycle, which systemd breaks by dropping a job",
                        u.value
                    ),
                    Some("the units that use the cache, such as nginx.service"),
                );
            } else if valid_unit(&u.value) {
                before_units.push(u.value.clone());
            } else {
                cx.at(u, &field(&format!("before[{k}]")), format!("invalid systemd unit name `{}`", u.value), Some(
                    "a unit name such as nginx.service (letters, digits, :-_.\\@, and a suffix like .service, .socket, .target)",
                ));
            }
        }
    }

    if cx.diags.len() != before {
        return None;
    }
    Some(MountSpec {
        name: name?,
        path: path?,
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

fn path(cx: &mut Ctx, field: &str, s: &Spanned<String>, create: bool) -> Option<PathBuf> {
    let text = s.value.as_str();
    let p = Path::new(text);
    let bad = |cx: &mut Ctx, msg: String, acc: &str| {
        cx.at(s, field, msg, Some(acc));
        None
    };
    const ABS: &str = "an absolute, normalised path to a directory, e.g. /var/cache/nginx";
    if !p.is_absolute() {
        return bad(cx, format!("path `{text}` is relative"), ABS);
    }
    let normal = p
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let canonical_text = p.components().collect::<PathBuf>();
    if !normal || canonical_text.as_os_str() != p.as_os_str() {
        return bad(
            cx,
            format!("path `{text}` is not normalised (`.`, `..`, `//` or a trailing `/`)"),
            ABS,
        );
    }
    if text.len() > MAX_PATH_BYTES || p.components().any(|c| c.as_os_str().len() > MAX_NAME_BYTES) {
        return bad(
            cx,
            format!("path `{text}` is too long"),
            "at most 4095 bytes, and at most 255 bytes between slashes (PATH_MAX, NAME_MAX)",
        );
    }
    let unit = crate::boot::escape::mount_unit(p);
    if unit.len() > MAX_UNIT_NAME {
        return bad(
            cx,
            format!(
                "path `{text}` is too long for systemd: its mount unit name has {} characters",
                unit.len()
            ),
            "a path whose `systemd-escape --path --suffix=mount` form has at most 255 characters",
        );
    }
    const ELSEWHERE: &str = "an application cache directory such as /var/cache/nginx";
    if let Some(sys) = system_dir(text) {
        return bad(
            cx,
            format!(
                "path `{text}` is a system directory ({sys}); a tmpfs there would hide what the system needs"
            ),
            ELSEWHERE,
        );
    }
    if let Some(why) = ssh_dir(p, &cx.paths) {
        return bad(
            cx,
            format!("path `{text}` is {why}; SSH keys are never managed"),
            ELSEWHERE,
        );
    }
    if cx.paths.tree().is_none() {
        return Some(p.to_path_buf());
    }
    // Walk the existing prefix with lstat so a symlink anywhere is caught.
    // Under a root, `cur` stays the path inside the tree (what messages
    // show) and `cx.paths.host_path` is where it is looked up.
    let mut cur = PathBuf::from("/");
    for comp in p.components().skip(1) {
        cur.push(comp);
        let here = cx.paths.host_path(&cur);
        match std::fs::symlink_metadata(&here) {
            Ok(md) if md.file_type().is_symlink() => {
                let target = std::fs::read_link(&here)
                    .map(|t| t.display().to_string())
                    .unwrap_or_default();
                return bad(
                    cx,
                    format!(
                        "path `{text}` passes through the symlink `{}` -> `{target}`",
                        cur.display()
                    ),
                    "a path without symlinks: write the resolved path into the spec",
                );
            }
            Ok(md) if !md.is_dir() => {
                return bad(cx, format!("`{}` is not a directory", cur.display()), ABS);
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if create {
                    break;
                }
                let inside = match &cx.paths {
                    Paths::Under(root) => format!(" in {}", crate::out::escape(root)),
                    _ => String::new(),
                };
                return bad(
                    cx,
                    format!(
                        "path `{text}` does not exist{inside} (`{}` is missing)",
                        cur.display()
                    ),
                    "an existing directory, or `create: true` to create it",
                );
            }
            Err(e) => {
                return bad(cx, format!("cannot inspect `{}`: {e}", cur.display()), ABS);
            }
        }
    }
    Some(p.to_path_buf())
}

/// Why `path` is an SSH directory or holds one: a tmpfs there would hide (or,
/// seeded, let anyone who can write the cache plant) `authorized_keys`.
/// Home directories are not only under /home (/root, /var/lib/git, ...), so
/// any `.ssh` component is refused, and with `look` a directory that has a
/// `.ssh` entry (a home directory).
fn ssh_dir(path: &Path, paths: &Paths) -> Option<String> {
    if path.components().any(|c| c.as_os_str() == ".ssh") {
        return Some("an SSH directory".into());
    }
    let inner = path.join(".ssh");
    (paths.tree().is_some() && std::fs::symlink_metadata(paths.host_path(&inner)).is_ok())
        .then(|| format!("a home directory: it holds {}", inner.display()))
}

/// Names the system directory `path` is or lies under.
fn system_dir(path: &str) -> Option<String> {
    if path == "/" {
        return Some("/".into());
    }
    SYSTEM_DIRS.iter().find_map(|d| match d.strip_suffix('/') {
        Some(tree) if path == tree => Some(tree.to_string()),
        Some(tree) if path.starts_with(d) => Some(format!("under {tree}")),
        None if path == *d => Some(d.to_string()),
        _ => None,
    })
}

/// `(uid_t)-1` means "leave unchanged" to chown(2) and is refused by tmpfs's
/// `uid=`/`gid=`: the largest id there is is one below.
const MAX_ID: u64 = u32::MAX as u64 - 1;
const ID_RANGE: &str = "a number from 0 to 4294967294";

/// The two id databases an owner is looked up in.
#[derive(Clone, Copy)]
enum IdDb {
    Passwd,
    Group,
}

impl IdDb {
    /// (file under etc/, what it holds, the numeric form's name)
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            IdDb::Passwd => ("passwd", "user", "uid"),
            IdDb::Group => ("group", "group", "gid"),
        }
    }

    fn lookup_on_host(self, name: &str) -> Option<u32> {
        match self {
            IdDb::Passwd => nix::unistd::User::from_name(name)
                .ok()
                .flatten()
                .map(|u| u.uid.as_raw()),
            IdDb::Group => nix::unistd::Group::from_name(name)
                .ok()
                .flatten()
                .map(|g| g.gid.as_raw()),
        }
    }
}

fn user(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<u32> {
    id(cx, field, s, IdDb::Passwd)
}

fn group(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<u32> {
    id(cx, field, s, IdDb::Group)
}

/// A numeric id, or a name looked up in `db` on the host (in the tree with `--root`).
fn id(cx: &mut Ctx, field: &str, s: &Spanned<String>, db: IdDb) -> Option<u32> {
    let (file, what, numeric) = db.names();
    if let Ok(n) = s.value.parse::<u64>() {
        return numeric_id(cx, field, s, n, numeric);
    }
    let (found, located) = match &cx.paths {
        Paths::Under(root) => (
            id_in_file(&root.join("etc").join(file), &s.value),
            in_tree(root, file),
        ),
        _ => (db.lookup_on_host(&s.value), String::new()),
    };
    if found.is_none() {
        cx.at(
            s,
            field,
            format!("unknown {what} `{}`{located}", s.value),
            Some(&format!(
                "a {what} name known to the {file} database (getent {file}), or a {numeric}: {ID_RANGE}"
            )),
        );
    }
    found
}

/// " in ROOT/etc/DB", for messages about a tree's databases.
fn in_tree(root: &Path, db: &str) -> String {
    format!(" in {}", crate::out::escape(&root.join("etc").join(db)))
}

fn numeric_id(cx: &mut Ctx, field: &str, s: &Spanned<String>, n: u64, what: &str) -> Option<u32> {
    if n <= MAX_ID {
        return u32::try_from(n).ok();
    }
    cx.at(
        s,
        field,
        format!("{what} {} is out of range", s.value),
        Some(&format!("{ID_RANGE} (4294967295 is the kernel's \"no id\")")),
    );
    None
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

fn huge(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<Huge> {
    choice(cx, field, s, "huge page policy", &Huge::ALL)
}

pub(super) const SEEDS: [(&str, Seed); 2] = [("copy", Seed::Copy), ("empty", Seed::Empty)];
pub(super) const ON_FAILURES: [(&str, OnFailure); 2] =
    [("keep-disk", OnFailure::KeepDisk), ("fail", OnFailure::Fail)];
/// What `flags` accepts in `options` (the JSON schema's list).
pub(super) const OPTION_NAMES: [&str; 6] =
    ["nosuid", "nodev", "noexec", "relatime", "noatime", "strictatime"];

fn seed(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<Seed> {
    choice(cx, field, s, "seed mode", &SEEDS)
}

fn on_failure(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<OnFailure> {
    choice(cx, field, s, "failure policy", &ON_FAILURES)
}

const PERSIST_ACCEPTED: &str =
    "none, on-stop, or `every <duration>` with s/m/h/d units from 10s to 30d, e.g. every 15m";

/// The shortest period of `persist: every` and `reoffload_after`.
const MIN_PERIOD_SECS: u64 = 10;
/// The longest: beyond a month a period means "never" and is better said so
/// (`on-stop`, `never`); bounded so the agent's clock arithmetic cannot overflow.
const MAX_PERIOD_SECS: u64 = 30 * 86_400;

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

/// `90s`, `15m`, `2h`, `1d`, or combinations like `1h30m`.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let mut total: u64 = 0;
    let mut num = String::new();
    if text.is_empty() {
        return Err("missing duration".into());
    }
    for c in text.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let mult = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => return Err(format!("unknown duration unit `{c}`")),
        };
        let n: u64 = num
            .parse()
            .map_err(|_| format!("`{c}` needs a number before it"))?;
        total = n
            .checked_mul(mult)
            .and_then(|x| total.checked_add(x))
            .ok_or("duration too long")?;
        num.clear();
    }
    if !num.is_empty() {
        return Err(format!("`{num}` needs a unit (s, m, h or d)"));
    }
    Ok(total)
}

/// `90s`, `250ms`, `1m30s`: a duration in milliseconds (units ms, s, m, h, d).
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("missing duration".into());
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (num, after) = rest.split_at(digits);
        let unit_len = after.find(|c: char| c.is_ascii_digit()).unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let mult: u64 = match unit {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(format!("`{num}` needs a unit (ms, s, m, h or d)")),
            other => return Err(format!("unknown duration unit `{other}`")),
        };
        if num.is_empty() {
            return Err(format!("`{unit}` needs a number before it"));
        }
        let n: u64 = num.parse().map_err(|_| "duration too long".to_string())?;
        total = n
            .checked_mul(mult)
            .and_then(|x| total.checked_add(x))
            .ok_or("duration too long")?;
        rest = next;
    }
    Ok(total)
}

const PCT_ACCEPTED: &str = "a percentage with a % sign, above 0% and at most 100%, e.g. 80%";
const ACTION_ACCEPTED: &str = "warn, evict, grow, fallback, or a list tried in order such as [grow, evict]; \
     `warn` stands alone and `fallback` comes last";
const PRESSURE_ACCEPTED: &str =
    "none, or a list of evict, shrink, fallback tried in order, e.g. [evict, shrink, fallback]";
const REOFFLOAD_ACCEPTED: &str = "never, or a duration from 10s to 30d such as 10m (units s, m, h, d)";
const INTERVAL_ACCEPTED: &str = "a duration from 100ms to 1h, e.g. 1s, 500ms, 2s";
const COOLDOWN_ACCEPTED: &str = "a duration from 100ms to 1h, e.g. 10s";
const METRICS_ACCEPTED: &str =
    "off, or an absolute path to a .prom file such as /var/lib/prometheus/node-exporter/tmpfsctl.prom";
const MAX_PRIORITY: u32 = 100;

/// What watchdog validation needs to know about the mount.
struct WdCtx<'a> {
    i: usize,
    mount: Option<&'a RawWatchdog>,
    defaults: Option<&'a RawWatchdog>,
    /// 0 when the size itself is invalid (already reported).
    size: u64,
    /// `None` when `persist` itself is invalid (already reported).
    persist: Option<Persist>,
    mem_total: u64,
    max_total: u64,
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

fn percent(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<f64> {
    let text = s.value.trim();
    let why = match text.strip_suffix('%') {
        None => format!("invalid percentage `{}`: the % sign is missing", s.value),
        Some(n) => match n.trim().parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 && p.is_finite() => return Some(p),
            Ok(_) => format!("invalid percentage `{}`: above 0% and at most 100%", s.value),
            Err(_) => format!("invalid percentage `{}`: `{n}` is not a number", s.value),
        },
    };
    cx.at(s, field, why, Some(PCT_ACCEPTED));
    None
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

fn watchdog(cx: &mut Ctx, w: &WdCtx<'_>) -> Option<Watchdog> {
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

    let volatile = w.persist.map(|p| p == Persist::None);
    let evict_needs_volatile = |cx: &mut Ctx, loc: &Location, field: &str| {
        if volatile == Some(false) {
            cx.at_loc(
                loc,
                field,
                format!(
                    "`evict` deletes files, but mounts[{}] is persisted (`persist` is not none): the deletions would reach the disk copy",
                    w.i
                ),
                Some("evict only on volatile caches (persist: none); for persisted mounts grow, shrink or fallback"),
            );
        }
    };

    let action_pick = w.pick("action", |r| r.action.as_ref());
    let parsed = match &action_pick {
        None => Some(Vec::new()),
        Some(p) => names(cx, p, "action", &Action::ALL, ACTION_ACCEPTED),
    };
    // When the list itself is bad, checks that depend on it stay quiet.
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
            Action::Evict => evict_needs_volatile(cx, &a.loc, &a.field),
            _ => {}
        }
    }
    let chain: Vec<Action> = if actions.is_empty() {
        vec![Action::Warn]
    } else {
        actions.iter().map(|a| a.value).collect()
    };
    let has = |x: Action| chain.contains(&x);
    let lacks = |x: Action| known && !chain.contains(&x);

    let max_size = match w.pick("max_size", |r| r.max_size.as_ref()) {
        None => None,
        Some(p) => match size::parse_size(&p.v.value) {
            Err(why) => {
                cx.at(
                    p.v,
                    &p.field,
                    format!("invalid size `{}`: {why}", p.v.value),
                    Some(SIZE_ACCEPTED),
                );
                None
            }
            Ok(lit) => {
                let max = lit.resolve(w.mem_total);
                if p.own && lacks(Action::Grow) {
                    cx.at(
                        p.v,
                        &p.field,
                        "`max_size` has no effect without `grow` in `action`".into(),
                        Some(ACTION_ACCEPTED),
                    );
                } else if w.size > 0 && max <= w.size && has(Action::Grow) {
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
                } else if max > w.max_total && has(Action::Grow) {
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
        },
    };
    if let Some(g) = actions.iter().find(|a| a.value == Action::Grow) {
        if max_size.is_none() && cx.diags.len() == before {
            cx.at_loc(
                &g.loc,
                &g.field,
                "`grow` needs `max_size`, the size it may grow to".into(),
                Some("a `max_size` above `size` in the same watchdog (or in defaults.watchdog)"),
            );
        }
    }

    let default_step = SizeLit::Percent(25.0).resolve(w.size).max(1);
    let grow_step = match w.pick("grow_step", |r| r.grow_step.as_ref()) {
        None => default_step,
        Some(p) => {
            if p.own && lacks(Action::Grow) {
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
    };

    let pressure_pick = w.pick("pressure", |r| r.pressure.as_ref());
    let mut pressure_known = true;
    let pressure: Vec<PressureAction> = match &pressure_pick {
        None if volatile == Some(true) => {
            vec![
                PressureAction::Evict,
                PressureAction::Shrink,
                PressureAction::Fallback,
            ]
        }
        None => vec![PressureAction::Shrink, PressureAction::Fallback],
        Some(p) if matches!(&p.v.value, NameList::One(n) if n == "none") => Vec::new(),
        Some(p) if matches!(&p.v.value, NameList::Many(l) if l.is_empty()) => Vec::new(),
        Some(p) => {
            let list = names(cx, p, "pressure action", &PressureAction::ALL, PRESSURE_ACCEPTED);
            pressure_known = list.is_some();
            let list = list.unwrap_or_default();
            for a in list.iter().filter(|a| a.value == PressureAction::Evict) {
                evict_needs_volatile(cx, &a.loc, &a.field);
            }
            list.into_iter().map(|a| a.value).collect()
        }
    };

    let reoffload_after = match w.pick("reoffload_after", |r| r.reoffload_after.as_ref()) {
        None => None,
        Some(p) => {
            if p.own
                && lacks(Action::Fallback)
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
                None
            } else {
                match parse_duration(v) {
                    Ok(secs) if (MIN_PERIOD_SECS..=MAX_PERIOD_SECS).contains(&secs) => Some(secs),
                    Ok(secs) => {
                        let why = if secs < MIN_PERIOD_SECS {
                            "at least 10s, or the mount would flap"
                        } else {
                            "at most 30d; for no re-offload by the agent write `never`"
                        };
                        cx.at(
                            p.v,
                            &p.field,
                            format!("invalid reoffload_after `{}`: {why}", p.v.value),
                            Some(REOFFLOAD_ACCEPTED),
                        );
                        None
                    }
                    Err(why) => {
                        cx.at(
                            p.v,
                            &p.field,
                            format!("invalid reoffload_after `{}`: {why}", p.v.value),
                            Some(REOFFLOAD_ACCEPTED),
                        );
                        None
                    }
                }
            }
        }
    };

    let priority = match w.pick("priority", |r| r.priority.as_ref()) {
        None => DEFAULT_PRIORITY,
        Some(p) => match u32::try_from(p.v.value).ok().filter(|v| *v <= MAX_PRIORITY) {
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
        },
    };

    let evict_group = match w.pick("evict_group", |r| r.evict_group.as_ref()) {
        None => EvictGroup::default(),
        Some(p) => match EvictGroup::ALL.iter().find(|(n, _)| *n == p.v.value.trim()) {
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
        },
    };

    if cx.diags.len() != before {
        return None;
    }
    Some(Watchdog {
        evict_group,
        bytes: bytes?,
        inodes: inodes?,
        max_size: max_size.filter(|_| has(Action::Grow)),
        actions: chain,
        grow_step,
        reoffload_after,
        pressure,
        priority,
    })
}

fn agent(cx: &mut Ctx, raw: Option<&RawAgent>, mem_total: u64) -> AgentSettings {
    let mut a = AgentSettings::defaults(mem_total);
    let Some(raw) = raw else {
        return a;
    };
    let duration = |cx: &mut Ctx, s: &Spanned<String>, field: &str, accepted: &str| -> Option<u64> {
        match parse_duration_ms(&s.value) {
            Ok(ms) if (100..=3_600_000).contains(&ms) => Some(ms),
            Ok(_) => {
                cx.at(
                    s,
                    field,
                    format!("invalid {field} `{}`: out of range", s.value),
                    Some(accepted),
                );
                None
            }
            Err(why) => {
                cx.at(
                    s,
                    field,
                    format!("invalid {field} `{}`: {why}", s.value),
                    Some(accepted),
                );
                None
            }
        }
    };
    let ram_size = |cx: &mut Ctx, s: &Spanned<String>, field: &str| -> Option<u64> {
        match size::parse_size(&s.value) {
            Ok(lit) => Some(lit.resolve(mem_total)),
            Err(why) => {
                cx.at(
                    s,
                    field,
                    format!("invalid size `{}`: {why}", s.value),
                    Some(SIZE_ACCEPTED),
                );
                None
            }
        }
    };
    if let Some(s) = &raw.interval {
        a.interval_ms = duration(cx, s, "agent.interval", INTERVAL_ACCEPTED).unwrap_or(a.interval_ms);
    }
    if let Some(s) = &raw.cooldown {
        a.cooldown_ms = duration(cx, s, "agent.cooldown", COOLDOWN_ACCEPTED).unwrap_or(a.cooldown_ms);
    }
    if let Some(s) = &raw.min_available {
        a.min_available = ram_size(cx, s, "agent.min_available").unwrap_or(a.min_available);
    }
    if let Some(s) = &raw.grow_floor {
        a.grow_floor = ram_size(cx, s, "agent.grow_floor").unwrap_or(a.grow_floor);
    }
    if let Some(s) = &raw.max_pressure {
        a.max_pressure = percent(cx, "agent.max_pressure", s).unwrap_or(a.max_pressure);
    }
    if let Some(s) = &raw.metrics {
        a.metrics = match metrics_target(&s.value) {
            Ok(t) => t,
            Err(why) => {
                cx.at(s, "agent.metrics", why, Some(METRICS_ACCEPTED));
                a.metrics
            }
        };
    }
    a
}

/// `off` or an absolute, normalised path to a `.prom` file. The textfile
/// collector reads nothing else, and the suffix keeps a slip of the pen from
/// making the agent (root) overwrite some other file with metrics.
pub fn metrics_target(text: &str) -> Result<MetricsTarget, String> {
    if text == "off" {
        return Ok(MetricsTarget::Off);
    }
    if text.contains(char::is_control) {
        return Err(format!(
            "invalid metrics path `{}`: it contains control characters",
            crate::out::escape(text)
        ));
    }
    let p = Path::new(text);
    let normal = p
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !p.is_absolute() || !normal || p.components().collect::<PathBuf>().as_os_str() != p.as_os_str() {
        return Err(format!(
            "invalid metrics path `{text}`: not an absolute, normalised path"
        ));
    }
    if p.is_dir() {
        return Err(format!(
            "invalid metrics path `{text}`: it is a directory; name the file"
        ));
    }
    if !p
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.len() > ".prom".len() && n.ends_with(".prom"))
    {
        return Err(format!(
            "invalid metrics path `{text}`: not a .prom file (the textfile collector reads only those)"
        ));
    }
    Ok(MetricsTarget::File(p.to_path_buf()))
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

    #[test]
    fn system_dirs() {
        for sys in [
            "/",
            "/etc",
            "/etc/nginx",
            "/usr/lib",
            "/proc/1",
            "/run/x",
            "/var",
            "/var/lib",
            "/tmp",
            "/home",
        ] {
            assert!(system_dir(sys).is_some(), "{sys}");
        }
        for ok in [
            "/var/cache/nginx",
            "/tmp/x",
            "/var/lib/php/sessions",
            "/srv/cache",
            "/etcetera",
            "/usrx",
        ] {
            assert!(system_dir(ok).is_none(), "{ok}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15m"), Ok(900));
        assert_eq!(parse_duration("1h30m"), Ok(5400));
        assert_eq!(parse_duration("1d"), Ok(86400));
        assert_eq!(parse_duration("90s"), Ok(90));
        assert!(parse_duration("15").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("m").unwrap_err().contains("needs a number"));
        assert!(parse_duration("5w").unwrap_err().contains("unit `w`"));
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn durations_in_milliseconds() {
        assert_eq!(parse_duration_ms("1s"), Ok(1000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("1m30s"), Ok(90_000));
        assert_eq!(parse_duration_ms("1s500ms"), Ok(1500));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert!(parse_duration_ms("5").unwrap_err().contains("needs a unit"));
        assert!(parse_duration_ms("ms").unwrap_err().contains("needs a number"));
        assert!(parse_duration_ms("3w").unwrap_err().contains("unit `w`"));
        assert!(parse_duration_ms("").is_err());
        assert!(parse_duration_ms("99999999999999999999d").is_err());
    }

    #[test]
    fn metrics_targets() {
        assert_eq!(metrics_target("off"), Ok(MetricsTarget::Off));
        assert_eq!(
            metrics_target("/x/y.prom"),
            Ok(MetricsTarget::File("/x/y.prom".into()))
        );
        for bad in [
            "x.prom",
            "/x/../y.prom",
            "/x//y",
            "/",
            "/tmp",
            "/etc/passwd",
            "/x/.prom",
            "/x/y.prom\n",
        ] {
            assert!(metrics_target(bad).is_err(), "{bad}");
        }
    }
}
