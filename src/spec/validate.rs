//! Turns a positioned raw spec into a `Spec`, collecting every problem.
//!
//! Each mount's own fields are checked in validate/mount.rs (its path in
//! validate/paths.rs, its owner and group in validate/ids.rs, its watchdog in
//! validate/watchdog.rs); what one mount may not do to another in
//! validate/across.rs; the top-level `agent:` in validate/agent.rs.

mod across;
mod agent;
mod ids;
mod mount;
mod paths;
mod watchdog;

use std::path::{Path, PathBuf};

use serde_saphyr::{Location, Spanned};

use super::raw::RawSpec;
use super::size::{self, SizeLit, SIZE_ACCEPTED};
use super::Spec;
use crate::error::{Diagnostic, SpecError};

pub use agent::metrics_target;
pub(super) use mount::{ON_FAILURES, OPTION_NAMES, SEEDS};
pub use paths::SYSTEM_DIRS;

/// systemd's UNIT_NAME_MAX less its NUL: a longer name is hashed by systemd,
/// and the boot units could not name the mount.
const MAX_UNIT_NAME: usize = 255;
const DEFAULT_MAX_TOTAL_PERCENT: f64 = 50.0;
/// More tmpfs mounts than any host runs for its caches; keeps the pairwise
/// path checks cheap whatever the input.
const MAX_MOUNTS: usize = 1000;
const MOUNTS_ACCEPTED: &str = "a list of at most 1000 mounts";

/// The shortest period of `persist: every` and `reoffload_after`.
const MIN_PERIOD_SECS: u64 = 10;
/// The longest: beyond a month a period means "never" and is better said so
/// (`on-stop`, `never`); bounded so the agent's clock arithmetic cannot overflow.
const MAX_PERIOD_SECS: u64 = 30 * 86_400;

const PCT_ACCEPTED: &str = "a percentage with a % sign, above 0% and at most 100%, e.g. 80%";

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

impl Ctx {
    fn at<T>(&mut self, s: &Spanned<T>, field: &str, message: String, accepted: Option<&str>) {
        self.at_loc(&s.referenced, field, message, accepted);
    }

    fn at_loc(&mut self, loc: &Location, field: &str, message: String, accepted: Option<&str>) {
        self.diags.push(diagnostic(loc, field, message, accepted));
    }

    /// The spec, unless a problem was found; then every problem, in the
    /// order of the text, each once.
    fn finish(mut self, file: &Path, text: &str, spec: Spec) -> Result<Spec, SpecError> {
        if self.diags.is_empty() {
            return Ok(spec);
        }
        self.diags.sort_by_key(|d| (d.line, d.column));
        // A bad `defaults` value is found once per mount that inherits it.
        let mut seen = std::collections::HashSet::new();
        self.diags
            .retain(|d| seen.insert((d.line, d.column, d.field.clone(), d.message.clone())));
        Err(SpecError {
            file: file.to_path_buf(),
            source_text: text.to_string(),
            diagnostics: self.diags,
        })
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
    let max_total = max_total(&mut cx, raw.max_total.as_ref(), mem_total);
    let raw_defaults = raw.defaults.unwrap_or_default();
    let defaults = mount::defaults(&mut cx, &raw_defaults);
    let agent = agent::agent(&mut cx, raw.agent.as_ref(), mem_total);
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

    let mut claimed = across::Claimed::new(mem_total, max_total);
    for (i, m) in raw_mounts.iter().enumerate().take(MAX_MOUNTS) {
        let Some(m) = m else { continue };
        let wd_defaults = raw_defaults.watchdog.as_ref();
        let Some(spec) = mount::mount(&mut cx, i, m, &defaults, wd_defaults, mem_total, max_total) else {
            continue;
        };
        claimed.add(&mut cx, i, m, spec);
    }

    let spec = Spec {
        file: file.to_path_buf(),
        max_total,
        mounts: claimed.into_mounts(),
        agent,
    };
    cx.finish(file, text, spec)
}

/// The RAM budget: `max_total`, by default half of MemTotal.
fn max_total(cx: &mut Ctx, raw: Option<&Spanned<String>>, mem_total: u64) -> u64 {
    match raw {
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
    }
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
