//! `sync`: writes the RAM contents of persisted mounts back to their disk
//! directories (through the private side bind), changed files only.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use serde::Serialize;

use crate::copy::{self, SyncOptions, SyncStats};
use crate::error::UnknownName;
use crate::host::Host;
use crate::observe::{self, AtPath, Lower};
use crate::spec::{MountSpec, Persist, Spec};
use crate::state::{State, SyncRecord};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SyncOutcome {
    Synced,
    /// Nothing to write back: not persisted, or not offloaded.
    Skipped,
    Failed,
}

#[derive(Debug, Clone, Serialize)]
pub struct SyncResult {
    pub name: String,
    pub path: PathBuf,
    pub result: SyncOutcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<SyncStats>,
    pub seconds: f64,
}

/// Syncs `names` (every persisted mount of the spec when empty).
pub fn sync(spec: &Spec, names: &[String], host: &Host, state: &State) -> Result<Vec<SyncResult>> {
    UnknownName::check(spec, names, |_| false)?;
    let world = observe::observe(spec, host, state)?;
    let mut out = Vec::new();
    for (m, o) in spec.mounts.iter().zip(&world.mounts) {
        let asked = names.contains(&m.name);
        if !names.is_empty() && !asked {
            continue;
        }
        let skip = |reason: String| SyncResult {
            name: m.name.clone(),
            path: m.path.clone(),
            result: SyncOutcome::Skipped,
            reason: Some(reason),
            stats: None,
            seconds: 0.0,
        };
        if m.persist == Persist::None {
            if asked {
                out.push(skip("volatile (persist: none): nothing is written back".into()));
            }
            continue;
        }
        if !matches!(o.at_path, AtPath::Ours(_)) {
            out.push(skip(
                "not offloaded: the application already uses the disk directory".into(),
            ));
            continue;
        }
        if o.lower != Lower::Bound {
            // Writing into anything but the disk directory would report a
            // write-back that did not happen.
            out.push(SyncResult {
                result: SyncOutcome::Failed,
                reason: Some(format!(
                    "the disk directory is not reachable at {}; run `tmpfsctl down` then `apply` to restore the side bind",
                    state.lower(&m.name).display()
                )),
                ..skip(String::new())
            });
            continue;
        }
        out.push(sync_one(m, &m.path, state)?);
    }
    Ok(out)
}

/// Writes `src` (the tmpfs root, or a path to it that survives a detach)
/// back to the mount's disk directory and records the outcome.
pub fn sync_one(m: &MountSpec, src: &Path, state: &State) -> Result<SyncResult> {
    sync_one_with(m, src, state, SyncOptions::MIRROR)
}

/// [`sync_one`] with the copy's options: `down`'s last pass merges instead of
/// mirroring (see [`copy::sync_tree_with`]).
pub fn sync_one_with(m: &MountSpec, src: &Path, state: &State, opts: SyncOptions) -> Result<SyncResult> {
    let started = Instant::now();
    let res = copy::sync_tree_with(src, &state.lower(&m.name), opts, None);
    let seconds = started.elapsed().as_secs_f64();
    let (result, reason, stats) = match res {
        Ok(s) => (SyncOutcome::Synced, None, Some(s)),
        Err(e) => (
            SyncOutcome::Failed,
            Some(format!("{:#}", anyhow::Error::new(e))),
            None,
        ),
    };
    let st = stats.clone().unwrap_or_default();
    state.write_sync(
        &m.name,
        &SyncRecord {
            at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            seconds,
            ok: result == SyncOutcome::Synced,
            error: reason.clone(),
            files_written: st.files_written,
            bytes_written: st.bytes_written,
            deleted: st.deleted,
        },
    )?;
    Ok(SyncResult {
        name: m.name.clone(),
        path: m.path.clone(),
        result,
        reason,
        stats,
        seconds,
    })
}
