//! `down`: takes managed mounts away safely; the application is back on its
//! disk directory.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use crate::host::procs::Holder;
use crate::host::Host;
use crate::mount::{self, Unmounted};
use crate::spec::{self, Persist, Spec};
use crate::state::State;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DownOutcome {
    /// Unmounted cleanly.
    Unmounted,
    /// Busy: detached lazily; holders keep their open files.
    Detached,
    /// There was no managed tmpfs to take down (leftovers were cleaned).
    NotMounted,
    /// Not taken down; see reason.
    Refused,
}

#[derive(Debug, Clone, Serialize)]
pub struct DownResult {
    pub name: String,
    pub path: Option<PathBuf>,
    pub result: DownOutcome,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Takes down `names` (all of the spec's, last first, when empty). A name
/// not in the spec is accepted when a managed tmpfs of that name is mounted,
/// so a mount removed from the spec can still be taken down.
pub fn down(spec: &Spec, names: &[String], host: &Host, state: &State) -> Result<Vec<DownResult>> {
    let targets: Vec<String> = if names.is_empty() {
        spec.mounts.iter().rev().map(|m| m.name.clone()).collect()
    } else {
        names.to_vec()
    };
    let mut out = Vec::new();
    for name in targets {
        out.push(down_one(spec, &name, host, state)?);
    }
    Ok(out)
}

fn down_one(spec: &Spec, name: &str, host: &Host, state: &State) -> Result<DownResult> {
    let table = host.mounts()?;
    let source = spec::source_for(name);
    let live = table
        .by_source(&source)
        .find(|e| !e.mount_point.starts_with(state.dir()))
        .cloned();
    let persisted = match spec.mount(name) {
        Some(m) => m.persist != Persist::None,
        None => state.record(name).is_some_and(|r| r.persist != "none"),
    };
    let mut res = DownResult {
        name: name.to_string(),
        path: live.as_ref().map(|e| e.mount_point.clone()),
        result: DownOutcome::NotMounted,
        holders: Vec::new(),
        reason: None,
    };

    if spec.mount(name).is_none() && live.is_none() {
        let known: Vec<&str> = spec.mounts.iter().map(|m| m.name.as_str()).collect();
        anyhow::bail!(
            "no mount named `{name}` in {} and no managed tmpfs {source} is mounted; known names: {}",
            spec.file.display(),
            known.join(", ")
        );
    }
    if let Some(e) = &live {
        if persisted {
            res.result = DownOutcome::Refused;
            res.reason = Some(format!(
                "{} is persisted (write-back), and this version cannot write RAM contents back to disk yet; taking it down would lose data. Copy the data out of {} first, or set `persist: none`",
                name,
                e.mount_point.display()
            ));
            return Ok(res);
        }
        res.holders = host.holders(e.dev);
        res.result = match mount::unmount(&e.mount_point)? {
            Unmounted::Clean => DownOutcome::Unmounted,
            Unmounted::Lazy => DownOutcome::Detached,
        };
    }
    for side in [state.stage(name), state.lower(name)] {
        if table.top_at(&side).is_some() {
            mount::detach(&side)?;
        }
        match std::fs::remove_dir(&side) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(anyhow::Error::new(e).context(format!("removing {}", side.display())))
            }
            _ => {}
        }
    }
    state.forget(name)?;
    Ok(res)
}
