//! The desired state: a validated spec. `load` is the only way to get one.

mod raw;
pub mod size;
mod validate;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Diagnostic, SpecError};

pub use validate::SYSTEM_DIRS;

#[derive(Debug, Clone, Serialize)]
pub struct Spec {
    pub file: PathBuf,
    /// RAM budget for the sum of all mount sizes, in bytes.
    pub max_total: u64,
    pub mounts: Vec<MountSpec>,
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
}

impl MountSpec {
    /// The tmpfs source name that marks a mount as ours in the mount table.
    pub fn source(&self) -> String {
        source_for(&self.name)
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Seed {
    /// Copy the on-disk contents into the new tmpfs.
    Copy,
    /// Start empty; the on-disk contents stay reachable under the side path.
    Empty,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    /// Leave the application on its disk directory and report degraded.
    KeepDisk,
    /// Stop at the first failure with exit status 1.
    Fail,
}

/// Reads, parses and validates a spec file. Reads the host (MemTotal, users,
/// the managed paths) but never changes it.
pub fn load(file: &Path, mem_total: u64) -> Result<Spec, SpecLoadError> {
    let text = std::fs::read_to_string(file).map_err(|e| SpecLoadError::Read {
        file: file.to_path_buf(),
        source: e,
    })?;
    parse(file, &text, mem_total).map_err(SpecLoadError::Invalid)
}

/// Parses and validates spec text; `file` is only used in messages.
pub fn parse(file: &Path, text: &str, mem_total: u64) -> Result<Spec, SpecError> {
    let raw = raw_from_yaml(text).map_err(|d| SpecError::single(file, text, d))?;
    validate::validate(file, text, raw, mem_total)
}

#[derive(Debug, thiserror::Error)]
pub enum SpecLoadError {
    #[error("cannot read spec {}: {source}", file.display())]
    Read { file: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Invalid(SpecError),
}

fn raw_from_yaml(text: &str) -> Result<raw::RawSpec, Diagnostic> {
    let opts = serde_saphyr::options! {
        strict_booleans: true,
        legacy_octal_numbers: false,
    };
    serde_saphyr::from_str_with_options(text, opts).map_err(|e| {
        let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((1, 1));
        let message = e.without_snippet().to_string();
        // serde names the missing field; the location is its mapping's.
        let field = match message
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
        {
            Some(missing) => missing.to_string(),
            None => field_of_yaml_error(text, line, column),
        };
        let accepted = message
            .contains("boolean")
            .then(|| "true or false (yes/no/on/off are not booleans in a tmpfsctl spec)".to_string());
        Diagnostic {
            line,
            column,
            width: token_width(text, line, column),
            field,
            message: yaml_message(&message),
            accepted,
        }
    })
}

/// Width of the token starting at line:column, for the caret.
fn token_width(text: &str, line: u64, column: u64) -> usize {
    text.lines()
        .nth(line.saturating_sub(1) as usize)
        .map(|l| {
            l.chars()
                .skip(column.saturating_sub(1) as usize)
                .take_while(|c| !c.is_whitespace() && *c != ',' && *c != ']')
                .count()
        })
        .unwrap_or(1)
        .max(1)
}

/// saphyr's message carries its own location suffix; ours is in the header.
fn yaml_message(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message);
    match first.rfind(" at line ") {
        Some(i) => first[..i].to_string(),
        None => first.to_string(),
    }
}

/// Best-effort field name for a YAML-level error: the key on that line.
fn field_of_yaml_error(text: &str, line: u64, column: u64) -> String {
    let Some(l) = text.lines().nth(line.saturating_sub(1) as usize) else {
        return "(document)".into();
    };
    let upto: String = l.chars().take(column.saturating_sub(1) as usize).collect();
    let key_part = if upto.contains(':') { upto.as_str() } else { l };
    let key = key_part
        .trim_start()
        .trim_start_matches("- ")
        .split(':')
        .next()
        .unwrap_or("")
        .trim();
    if key.is_empty() {
        "(document)".into()
    } else {
        key.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn parse_ok(yaml: &str) -> Spec {
        parse(Path::new("t.yaml"), yaml, 16 * GIB).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse_err(yaml: &str) -> SpecError {
        parse(Path::new("t.yaml"), yaml, 16 * GIB).expect_err("spec should be invalid")
    }

    fn dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("tmpfsctl-spec-")
            .tempdir_in("/tmp")
            .unwrap()
    }

    #[test]
    fn minimal_spec_gets_secure_defaults() {
        let d = dir();
        let s = parse_ok(&format!(
            "version: 1\nmounts:\n  - name: c\n    path: {}\n    size: 10%\n",
            d.path().display()
        ));
        let m = &s.mounts[0];
        assert_eq!(m.size, 16 * GIB / 10);
        assert_eq!(
            m.flags,
            Flags {
                nosuid: true,
                nodev: true,
                noexec: false,
                atime: None
            }
        );
        assert_eq!(
            (m.huge, m.seed, m.persist, m.on_failure),
            (Huge::Never, Seed::Copy, Persist::None, OnFailure::KeepDisk)
        );
        assert_eq!((m.owner, m.group, m.mode, m.inodes), (None, None, None, None));
        assert!(!m.create && !m.takeover && !m.noswap);
        assert_eq!(s.max_total, 8 * GIB, "default budget is 50% of MemTotal");
        assert_eq!(m.source(), "tmpfsctl-c");
    }

    #[test]
    fn defaults_apply_and_mounts_override_them() {
        let d = dir();
        let p = d.path().display();
        let s = parse_ok(&format!(
            "version: 1\nmax_total: 2GiB\ndefaults:\n  options: [noexec]\n  huge: within_size\n  noswap: true\n  seed: empty\n  on_failure: fail\nmounts:\n  - name: a\n    path: {p}/a\n    size: 1G\n    create: true\n  - name: b\n    path: {p}/b\n    size: 1G\n    create: true\n    options: [nosuid, strictatime]\n    huge: never\n    noswap: false\n    seed: copy\n    persist: every 1h30m\n    on_failure: keep-disk\n    inodes: 2k\n    mode: \"0750\"\n    owner: root\n    group: \"0\"\n    before: [nginx.service, php-fpm.socket]\n"
        ));
        let (a, b) = (&s.mounts[0], &s.mounts[1]);
        assert_eq!(s.max_total, 2 * GIB);
        assert_eq!(
            a.flags,
            Flags {
                noexec: true,
                ..Flags::default()
            }
        );
        assert_eq!(
            (a.huge, a.noswap, a.seed, a.on_failure),
            (Huge::WithinSize, true, Seed::Empty, OnFailure::Fail)
        );
        assert_eq!(
            b.flags,
            Flags {
                nosuid: true,
                atime: Some(Atime::Strictatime),
                ..Flags::default()
            }
        );
        assert_eq!(
            (b.huge, b.noswap, b.seed, b.on_failure),
            (Huge::Never, false, Seed::Copy, OnFailure::KeepDisk)
        );
        assert_eq!(b.persist, Persist::Every(5400));
        assert_eq!(
            (b.inodes, b.mode, b.owner, b.group),
            (Some(2048), Some(0o750), Some(0), Some(0))
        );
        assert_eq!(b.before, ["nginx.service", "php-fpm.socket"]);
    }

    #[test]
    fn budget_counts_the_sum_of_all_sizes() {
        let d = dir();
        let p = d.path().display();
        let yaml = |a: &str, b: &str| {
            format!("version: 1\nmounts:\n  - name: a\n    path: {p}/a\n    size: {a}\n    create: true\n  - name: b\n    path: {p}/b\n    size: {b}\n    create: true\n")
        };
        parse_ok(&yaml("4G", "4G"));
        let e = parse_err(&yaml("4G", "5G"));
        assert_eq!(e.diagnostics.len(), 1);
        assert_eq!(e.diagnostics[0].field, "mounts[1].size");
        assert!(e.diagnostics[0].message.contains("total size 9GiB"), "{e}");
    }

    #[test]
    fn yaml_11_booleans_and_wrong_types_are_refused() {
        let d = dir();
        for (value, line) in [("yes", 6), ("on", 6), ("1", 6), ("no", 6)] {
            let e = parse_err(&format!(
                "version: 1\nmounts:\n  - name: a\n    path: {}\n    size: 1G\n    takeover: {value}\n",
                d.path().display()
            ));
            assert_eq!(e.diagnostics[0].line, line, "{value}: {e}");
        }
    }

    #[test]
    fn diagnostics_are_sorted_and_all_reported() {
        let e = parse_err("version: 3\nmounts:\n  - name: A\n    path: x\n    size: 0\n    mode: \"9\"\n");
        let lines: Vec<u64> = e.diagnostics.iter().map(|d| d.line).collect();
        assert_eq!(lines, [1, 3, 4, 5, 6]);
        let fields: Vec<&str> = e.diagnostics.iter().map(|d| d.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "version",
                "mounts[0].name",
                "mounts[0].path",
                "mounts[0].size",
                "mounts[0].mode"
            ]
        );
    }

    #[test]
    fn carets_cover_the_bad_value() {
        let e = parse_err("version: 1\nmounts:\n  - name: BadName\n    path: /x\n    size: 1G\n");
        let d = e
            .diagnostics
            .iter()
            .find(|d| d.field == "mounts[0].name")
            .unwrap();
        assert_eq!((d.line, d.column, d.width), (3, 11, 7));
    }

    #[test]
    fn unknown_fields_name_the_field() {
        let e = parse_err("version: 1\nmounts: []\nboot: systemd\n");
        let d = &e.diagnostics[0];
        assert_eq!(d.line, 3);
        assert!(d.message.contains("unknown field `boot`"), "{e}");
        assert_eq!(d.field, "boot");
    }
}
