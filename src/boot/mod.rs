//! Boot persistence: artifacts that re-apply the spec at boot and take the
//! mounts down (writing back) at shutdown. Renderers are pure (`systemd`,
//! `fstab`, `sysv`); `install`/`remove` write them under a root directory.

pub mod escape;
pub mod fstab;
pub mod helper;
pub mod systemd;
pub mod sysv;

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use clap::ValueEnum;
use serde::Serialize;

use crate::error::BadInput;
use crate::spec::Spec;
use crate::state::{self, State};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Units and drop-ins (seeding and write-back work).
    Systemd,
    /// A marked block in /etc/fstab (no seeding, no write-back).
    Fstab,
    /// An LSB init script for systems without systemd.
    Sysv,
}

/// Everything a renderer needs.
pub struct Context<'a> {
    pub spec: &'a Spec,
    /// The spec's path as the booted system sees it.
    pub spec_path: PathBuf,
    /// The tmpfsctl binary as the booted system sees it.
    pub binary: PathBuf,
    pub state: State,
    /// TimeoutStartSec=/TimeoutStopSec= value (seeding and write-back time).
    pub timeout: String,
}

impl Context<'_> {
    fn header(&self) -> String {
        format!(
            "# Written by `tmpfsctl boot install {}`; `tmpfsctl boot remove` deletes it.\n",
            self.spec_path.display()
        )
    }

    /// Units named in any mount's `before:`, sorted, once each.
    pub fn consumers(&self) -> Vec<String> {
        let mut c: Vec<String> = self
            .spec
            .mounts
            .iter()
            .flat_map(|m| m.before.iter().cloned())
            .collect();
        c.sort();
        c.dedup();
        c
    }
}

/// The context for `spec`, once the command line's paths and timeout are
/// known to be writable into unit files, scripts and fstab as they are: the
/// spec's own values are checked by validation, these here.
pub fn context<'a>(
    spec: &'a Spec,
    spec_path: PathBuf,
    binary: PathBuf,
    timeout: String,
) -> Result<Context<'a>, BadInput> {
    plain_path("--spec-path", &spec_path)?;
    let bin = plain_path("--binary", &binary)?;
    // systemd refuses an executable path with quotes or backslashes
    // ("Executable name contains special characters").
    if bin.contains(['"', '\'', '\\']) {
        return Err(BadInput(format!(
            "--binary `{bin}`: systemd cannot run an executable whose path has quotes or backslashes"
        )));
    }
    check_timespan(&timeout)
        .map_err(|why| BadInput(format!("--timeout `{}`: {why}", crate::out::escape(&timeout))))?;
    Ok(Context {
        spec,
        spec_path,
        binary,
        state: State::new(state::DEFAULT_DIR),
        timeout,
    })
}

/// The rate [`default_timeout`] allows for seeding and writing back: a slow
/// disk with small files. This host's SSD seeded 270 MB/s cold and wrote back
/// 140 MB/s (docs/benchmarks.md).
pub const TIMEOUT_RATE_FLOOR: u64 = 20 << 20;

/// The rate [`default_timeout`] allows for a `seed: overlay` mount's
/// write-back, which merges file by file through the overlay's upper layer: a
/// review helper measured 5–6 MiB/s for caches of 4 KiB files here, against
/// 15–38 MiB/s for the tmpfs backend's.
pub const OVERLAY_RATE_FLOOR: u64 = 5 << 20;

/// The apply unit's start and stop timeout when `--timeout` is not given:
/// every mount that seeds or writes back, full, at [`TIMEOUT_RATE_FLOOR`]
/// ([`OVERLAY_RATE_FLOOR`] for an overlay), plus a minute; never under 15
/// minutes.
pub fn default_timeout(spec: &Spec) -> String {
    let seconds: u64 = spec
        .mounts
        .iter()
        .filter(|m| m.seed == crate::spec::Seed::Copy || m.persist != crate::spec::Persist::None)
        .map(|m| match m.seed {
            crate::spec::Seed::Overlay => m.size / OVERLAY_RATE_FLOOR,
            _ => m.size / TIMEOUT_RATE_FLOOR,
        })
        .sum();
    let minutes = (60 + seconds).div_ceil(60).max(15);
    format!("{minutes}min")
}

/// An absolute UTF-8 path without control characters, as text.
fn plain_path<'p>(what: &str, p: &'p Path) -> Result<&'p str, BadInput> {
    let text = p
        .to_str()
        .ok_or_else(|| BadInput(format!("{what} `{}`: not UTF-8", crate::out::escape(p))))?;
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(BadInput(format!(
            "{what} `{}`: contains the control character U+{:04X}",
            crate::out::escape(text),
            c as u32
        )));
    }
    if !p.is_absolute() {
        return Err(BadInput(format!("{what} `{text}`: not an absolute path")));
    }
    Ok(text)
}

/// systemd's time span syntax (systemd.time(7)): `infinity`, or numbers
/// with units such as `15min`, `1h 30min`, `90`; written into
/// TimeoutStartSec= as given.
fn check_timespan(t: &str) -> Result<(), String> {
    timespan_secs(t).map(drop)
}

/// The seconds of a systemd time span ([`check_timespan`]); `None` for
/// `infinity`.
fn timespan_secs(t: &str) -> Result<Option<f64>, String> {
    const UNITS: &[(&str, f64)] = &[
        ("", 1.0),
        ("usec", 1e-6),
        ("us", 1e-6),
        ("µs", 1e-6),
        ("μs", 1e-6),
        ("msec", 1e-3),
        ("ms", 1e-3),
        ("seconds", 1.0),
        ("second", 1.0),
        ("sec", 1.0),
        ("s", 1.0),
        ("minutes", 60.0),
        ("minute", 60.0),
        ("min", 60.0),
        ("m", 60.0),
        ("hours", 3600.0),
        ("hour", 3600.0),
        ("hr", 3600.0),
        ("h", 3600.0),
        ("days", 86400.0),
        ("day", 86400.0),
        ("d", 86400.0),
        ("weeks", 604_800.0),
        ("week", 604_800.0),
        ("w", 604_800.0),
        ("months", 2_629_800.0),
        ("month", 2_629_800.0),
        ("M", 2_629_800.0),
        ("years", 31_557_600.0),
        ("year", 31_557_600.0),
        ("y", 31_557_600.0),
    ];
    const ACCEPTED: &str = "a systemd time span such as 15min, 1h 30min, 900 or infinity";
    let t = t.trim();
    if t == "infinity" {
        return Ok(None);
    }
    if t.is_empty() {
        return Err(format!("empty; {ACCEPTED}"));
    }
    let (mut rest, mut secs) = (t, 0.0);
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(digits);
        let value = Some(num)
            .filter(|n| !n.starts_with('.') && !n.ends_with('.') && n.matches('.').count() <= 1)
            .and_then(|n| n.parse::<f64>().ok())
            .ok_or_else(|| format!("`{}` is not a number; {ACCEPTED}", crate::out::escape(num)))?;
        let after = after.trim_start_matches(' ');
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == ' ')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let Some((_, per)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(format!("unknown unit `{}`; {ACCEPTED}", crate::out::escape(unit)));
        };
        secs += value * per;
        rest = next.trim_start_matches(' ');
    }
    Ok(Some(secs))
}

/// How long a shutdown may take before systemd forces the reboot or power-off
/// (`JobTimeoutSec=` of reboot.target and poweroff.target, with
/// `JobTimeoutAction=reboot-force`/`poweroff-force`).
const SHUTDOWN_LIMIT_SECS: f64 = 30.0 * 60.0;

/// A note when `timeout` lets the write-back at shutdown go on past
/// [`SHUTDOWN_LIMIT_SECS`]: the forced reboot ends it there.
fn shutdown_note(timeout: &str) -> Option<String> {
    let over = timespan_secs(timeout)
        .ok()?
        .is_none_or(|s| s > SHUTDOWN_LIMIT_SECS);
    over.then(|| format!(
        "TimeoutStopSec={timeout} lets the write-back at shutdown run longer than systemd lets a shutdown take: reboot.target and poweroff.target force the reboot or power-off after 30min (JobTimeoutSec=), and what is not on disk by then is lost; `persist: every` keeps what is left to write at shutdown small, or raise JobTimeoutSec= in drop-ins for those targets"
    ))
}

/// A file to put under the root (path relative to it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Artifact {
    File {
        path: PathBuf,
        content: String,
        mode: u32,
    },
    /// A symlink, as `systemctl enable` makes.
    Link { path: PathBuf, target: PathBuf },
}

impl Artifact {
    pub fn path(&self) -> &Path {
        match self {
            Artifact::File { path, .. } | Artifact::Link { path, .. } => path,
        }
    }
}

const UNIT_DIR: &str = "etc/systemd/system";
const MANIFEST: &str = "etc/tmpfsctl/boot.manifest";
const FSTAB: &str = "etc/fstab";

/// The files of `mode` for `cx` (fstab's block is spliced, not listed here).
pub fn artifacts(cx: &Context, mode: Mode) -> Vec<Artifact> {
    match mode {
        Mode::Systemd => {
            let unit_dir = Path::new(UNIT_DIR);
            let mut v = vec![
                Artifact::File {
                    path: unit_dir.join(systemd::APPLY_UNIT),
                    content: systemd::apply_unit(cx),
                    mode: 0o644,
                },
                Artifact::File {
                    path: unit_dir.join(systemd::DOWN_UNIT),
                    content: systemd::down_unit(cx),
                    mode: 0o644,
                },
                Artifact::File {
                    path: unit_dir.join(systemd::AGENT_UNIT),
                    content: systemd::agent_unit(cx),
                    mode: 0o644,
                },
            ];
            for unit in [systemd::APPLY_UNIT, systemd::DOWN_UNIT, systemd::AGENT_UNIT] {
                v.push(Artifact::Link {
                    path: unit_dir.join("multi-user.target.wants").join(unit),
                    target: Path::new("/").join(UNIT_DIR).join(unit),
                });
            }
            for c in cx.consumers() {
                v.push(Artifact::File {
                    path: unit_dir.join(format!("{c}.d")).join("50-tmpfsctl.conf"),
                    content: systemd::consumer_dropin(cx, &c),
                    mode: 0o644,
                });
            }
            v
        }
        Mode::Sysv => vec![Artifact::File {
            path: sysv::SCRIPT.into(),
            content: sysv::script(cx),
            mode: 0o755,
        }],
        Mode::Fstab => Vec::new(),
    }
}

/// fstab mode's lines need `/sbin/mount.tmpfsctl`. The packages ship it;
/// where it is missing, `install` links it to the binary and lists it, so
/// `remove` takes it away again. A helper that is not ours is left alone.
fn helper_link(cx: &Context, root: &Path) -> Result<Option<Artifact>> {
    let sbin = root.join("sbin");
    let dir = match fs::symlink_metadata(&sbin) {
        Ok(md) if md.is_symlink() => {
            let to = fs::read_link(&sbin).with_context(|| format!("reading the link {}", sbin.display()))?;
            // Merged /usr. An absolute link would lead out of an image root.
            if to != Path::new("usr/sbin") && to != Path::new("/usr/sbin") {
                bail!(
                    "{} links to {}; cannot tell where mount(8) looks for {}: install the package, or link it by hand",
                    sbin.display(),
                    to.display(),
                    helper::NAME
                );
            }
            "usr/sbin"
        }
        _ => "sbin",
    };
    let rel = Path::new(dir).join(helper::NAME);
    let ours = read_manifest(root).contains(&rel);
    if !ours && fs::symlink_metadata(root.join(&rel)).is_ok() {
        return Ok(None);
    }
    Ok(Some(Artifact::Link {
        path: rel,
        target: cx.binary.clone(),
    }))
}

#[derive(Debug, Clone, Serialize)]
pub struct BootReport {
    /// The mode installed; `None` for `remove`.
    pub mode: Option<Mode>,
    pub root: PathBuf,
    pub changed: bool,
    /// Paths (under root) written, linked or removed.
    pub written: Vec<PathBuf>,
    pub removed: Vec<PathBuf>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Installs `mode`'s artifacts under `root`; idempotent. Artifacts of an
/// earlier install that are no longer wanted (a consumer dropped from the
/// spec, another mode) are removed.
pub fn install(cx: &Context, mode: Mode, root: &Path) -> Result<BootReport> {
    let mut rep = BootReport {
        mode: Some(mode),
        root: root.to_path_buf(),
        changed: false,
        written: vec![],
        removed: vec![],
        notes: vec![],
    };
    if let Some(m) = cx
        .spec
        .mounts
        .iter()
        .find(|m| mode == Mode::Fstab && m.backend == crate::spec::Backend::Zram)
    {
        bail!(
            "`{}` is a zram mount, which fstab cannot express (its device is made and formatted before it is mounted); use --mode systemd or sysv, which run `tmpfsctl apply`",
            m.name
        );
    }
    if let Some(m) = cx
        .spec
        .mounts
        .iter()
        .find(|m| mode == Mode::Fstab && m.seed == crate::spec::Seed::Overlay)
    {
        bail!(
            "`{}` is a seed: overlay mount, which fstab cannot express (it is two mounts, the tmpfs of its upper layer under the state directory and the overlay on it, and its changes must be written back before the overlay goes); use --mode systemd or sysv, which run `tmpfsctl apply` and `tmpfsctl down`",
            m.name
        );
    }
    let mut wanted = artifacts(cx, mode);
    if mode == Mode::Fstab {
        wanted.extend(helper_link(cx, root)?);
    }
    for a in &wanted {
        if put(root, a)? {
            rep.written.push(a.path().to_path_buf());
        }
    }
    let fstab_block = match mode {
        Mode::Fstab => fstab::block(cx),
        _ => String::new(),
    };
    if splice_fstab(root, &fstab_block)? {
        rep.written.push(FSTAB.into());
    }
    let keep: Vec<PathBuf> = wanted.iter().map(|a| a.path().to_path_buf()).collect();
    rep.removed = remove_listed(root, &read_manifest(root), &keep)?;
    write_manifest(root, &keep)?;
    rep.changed = !rep.written.is_empty() || !rep.removed.is_empty();
    rep.notes = notes(mode);
    if mode == Mode::Systemd {
        rep.notes.extend(shutdown_note(&cx.timeout));
    }
    Ok(rep)
}

/// Removes everything `install` put under `root`.
pub fn remove(root: &Path) -> Result<BootReport> {
    let mut rep = BootReport {
        mode: None,
        root: root.to_path_buf(),
        changed: false,
        written: vec![],
        removed: vec![],
        notes: vec![],
    };
    rep.removed = remove_listed(root, &read_manifest(root), &[])?;
    if splice_fstab(root, "")? {
        rep.removed.push(FSTAB.into());
    }
    let manifest = root.join(MANIFEST);
    if manifest.exists() {
        fs::remove_file(&manifest).with_context(|| format!("removing {}", manifest.display()))?;
    }
    rep.changed = !rep.removed.is_empty();
    Ok(rep)
}

fn notes(mode: Mode) -> Vec<String> {
    match mode {
        Mode::Systemd => vec!["run `systemctl daemon-reload` to load the units".into()],
        Mode::Fstab => vec![
            "fstab mode mounts empty tmpfs: it cannot seed from the disk directory or write back; use systemd mode for that".into(),
        ],
        Mode::Sysv => vec!["enable the script with `update-rc.d tmpfsctl defaults` (Debian) or `chkconfig --add tmpfsctl`".into()],
    }
}

/// Writes one artifact if it differs; returns whether it changed anything.
fn put(root: &Path, a: &Artifact) -> Result<bool> {
    let full = root.join(a.path());
    if let Some(dir) = full.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    match a {
        Artifact::File { content, mode, .. } => {
            let same = fs::read(&full).is_ok_and(|c| c == content.as_bytes())
                && fs::metadata(&full).is_ok_and(|m| m.permissions().mode() & 0o7777 == *mode);
            if same {
                return Ok(false);
            }
            state::write_atomic(&full, content.as_bytes())?;
            fs::set_permissions(&full, fs::Permissions::from_mode(*mode))
                .with_context(|| format!("chmod {}", full.display()))?;
            Ok(true)
        }
        Artifact::Link { target, .. } => {
            if fs::read_link(&full).is_ok_and(|t| t == *target) {
                return Ok(false);
            }
            match fs::remove_file(&full) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("removing {}", full.display()))
                }
                _ => {}
            }
            std::os::unix::fs::symlink(target, &full)
                .with_context(|| format!("linking {}", full.display()))?;
            Ok(true)
        }
    }
}

fn read_manifest(root: &Path) -> Vec<PathBuf> {
    fs::read_to_string(root.join(MANIFEST))
        .map(|t| {
            t.lines()
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

fn write_manifest(root: &Path, paths: &[PathBuf]) -> Result<()> {
    let full = root.join(MANIFEST);
    if paths.is_empty() {
        return match fs::remove_file(&full) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", full.display()))
            }
            _ => Ok(()),
        };
    }
    if let Some(dir) = full.parent() {
        fs::DirBuilder::new().recursive(true).mode(0o755).create(dir)?;
    }
    let mut text =
        String::from("# Files written by `tmpfsctl boot install`, removed by `tmpfsctl boot remove`.\n");
    for p in paths {
        text.push_str(&format!("{}\n", p.display()));
    }
    state::write_atomic(&full, text.as_bytes())
}

/// Removes listed artifacts not in `keep`, and the directories that become empty.
fn remove_listed(root: &Path, listed: &[PathBuf], keep: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for rel in listed.iter().filter(|p| !keep.contains(p)) {
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            bail!(
                "refusing to remove `{}` listed in {}: not a path below the root",
                rel.display(),
                MANIFEST
            );
        }
        let full = root.join(rel);
        match fs::remove_file(&full) {
            Ok(()) => removed.push(rel.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", full.display())),
        }
        // Drop-in and .wants directories we created; kept if anything else is in them.
        if let Some(dir) = full.parent() {
            if dir.extension().is_some_and(|e| e == "d" || e == "wants") {
                let _ = fs::remove_dir(dir);
            }
        }
    }
    Ok(removed)
}

/// Puts `block` into ROOT/etc/fstab (or takes ours out when empty) with a
/// backup of the previous file; returns whether the file changed.
fn splice_fstab(root: &Path, block: &str) -> Result<bool> {
    let path = root.join(FSTAB);
    let current = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && block.is_empty() => return Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let next = fstab::splice(&current, block).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if next == current {
        return Ok(false);
    }
    if path.exists() {
        let backup = path.with_file_name("fstab.tmpfsctl~");
        fs::copy(&path, &backup)
            .with_context(|| format!("backing up {} to {}", path.display(), backup.display()))?;
    } else if let Some(dir) = path.parent() {
        fs::DirBuilder::new().recursive(true).mode(0o755).create(dir)?;
    }
    state::write_atomic(&path, next.as_bytes())?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644))
        .with_context(|| format!("chmod {}", path.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{MountSpec, Persist, Seed};

    fn spec(mounts: Vec<MountSpec>) -> Spec {
        Spec {
            file: "/etc/tmpfsctl/cache.yaml".into(),
            max_total: u64::MAX,
            mounts,
            agent: Default::default(),
        }
    }

    #[test]
    fn the_default_timeout_follows_the_sizes_that_seed_or_write_back() {
        const GIB: u64 = 1 << 30;
        assert_eq!(default_timeout(&spec(vec![])), "15min");
        assert_eq!(
            default_timeout(&spec(vec![MountSpec::for_test("a", "/a", 512 << 20)])),
            "15min"
        );
        // 64 GiB at 20 MiB/s is 3,277 s, plus a minute: 56 minutes.
        assert_eq!(
            default_timeout(&spec(vec![MountSpec::for_test("a", "/a", 64 * GIB)])),
            "56min"
        );
        let volatile_empty = MountSpec {
            seed: Seed::Empty,
            persist: Persist::None,
            ..MountSpec::for_test("b", "/b", 64 * GIB)
        };
        assert_eq!(default_timeout(&spec(vec![volatile_empty])), "15min");
        let persisted_empty = MountSpec {
            seed: Seed::Empty,
            persist: Persist::OnStop,
            ..MountSpec::for_test("c", "/c", 32 * GIB)
        };
        let seeded = MountSpec::for_test("d", "/d", 32 * GIB);
        assert_eq!(default_timeout(&spec(vec![persisted_empty, seeded])), "56min");
        // 8 GiB through an overlay at 5 MiB/s is 1,638 s, plus a minute.
        let overlay = MountSpec {
            seed: Seed::Overlay,
            persist: Persist::OnStop,
            ..MountSpec::for_test("e", "/e", 8 * GIB)
        };
        assert_eq!(default_timeout(&spec(vec![overlay])), "29min");
    }

    #[test]
    fn time_spans_are_read_as_systemd_reads_them() {
        assert_eq!(timespan_secs("15min"), Ok(Some(900.0)));
        assert_eq!(timespan_secs("1h 30min"), Ok(Some(5400.0)));
        assert_eq!(timespan_secs("90"), Ok(Some(90.0)));
        assert_eq!(timespan_secs("1.5h"), Ok(Some(5400.0)));
        assert_eq!(timespan_secs("infinity"), Ok(None));
        for bad in ["", "x", "5 parsecs", "1..5s", ".5s"] {
            assert!(timespan_secs(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_stop_timeout_past_the_shutdown_limit_is_noted() {
        assert_eq!(shutdown_note("30min"), None);
        assert_eq!(shutdown_note("15min"), None);
        for long in ["31min", "1h", "infinity"] {
            let note = shutdown_note(long).unwrap_or_default();
            assert!(
                note.contains("force the reboot or power-off after 30min"),
                "{long}: {note}"
            );
        }
    }
}
