//! `status`: what each managed mount looks like right now.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use crate::backend;
use crate::host::meminfo::MemInfo;
use crate::host::usage::Usage;
use crate::host::Host;
use crate::observe::{self, AtPath, MountState, Observed, StateFacts, World};
use crate::spec::{MountSpec, Spec};
use crate::state::{AgentMount, ProgressRecord, State, SyncRecord};

#[derive(Debug, Clone, Serialize)]
pub struct MountStatus {
    pub name: String,
    #[serde(serialize_with = "crate::out::lossy::path")]
    pub path: PathBuf,
    pub state: MountState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageView>,
    /// A zram mount's device, what it stores and the RAM that really takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compressed: Option<backend::zram::Compressed>,
    /// A `seed: overlay` mount's layers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlay: Option<OverlayView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persist: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<SyncRecord>,
    /// A seed or write-back running now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressRecord>,
    /// What the running agent says of it (none without an agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentMount>,
}

/// Where a `seed: overlay` mount's layers are: the disk directory (lower, through
/// the side bind) and the tmpfs holding the upper layer, whose usage is the mount's.
#[derive(Debug, Clone, Serialize)]
pub struct OverlayView {
    #[serde(serialize_with = "crate::out::lossy::path")]
    pub lower: PathBuf,
    #[serde(serialize_with = "crate::out::lossy::path")]
    pub upper: PathBuf,
}

/// Whether an agent runs for this state directory.
#[derive(Debug, Clone, Serialize)]
pub struct AgentView {
    pub running: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Unix time it started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct UsageView {
    pub size: u64,
    pub used: u64,
    pub used_pct: f64,
    pub inodes: u64,
    pub inodes_used: u64,
    pub inodes_pct: f64,
}

impl From<Usage> for UsageView {
    fn from(u: Usage) -> Self {
        UsageView {
            size: u.size,
            used: u.used,
            used_pct: round1(u.used_pct()),
            inodes: u.inodes,
            inodes_used: u.inodes_used,
            inodes_pct: round1(u.inodes_pct()),
        }
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    pub mem_total: u64,
    pub mem_available: u64,
    pub shmem: u64,
    /// Bytes used by the managed tmpfs mounts listed (part of Shmem).
    pub managed_used: u64,
    /// RAM taken by the managed zram mounts listed (not part of Shmem).
    #[serde(skip_serializing_if = "is_zero")]
    pub managed_zram: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    pub agent: AgentView,
    pub mounts: Vec<MountStatus>,
    pub memory: Memory,
}

pub fn status(spec: Option<&Spec>, host: &Host, state: &State) -> Result<StatusReport> {
    let mut mounts = Vec::new();
    let mem: MemInfo;
    match spec {
        Some(spec) => {
            let world = observe::observe(spec, host, state)?;
            mem = world.mem;
            for (m, o) in spec.mounts.iter().zip(&world.mounts) {
                mounts.push(spec_mount(m, o, &world, state));
            }
            for (name, path) in world.orphans {
                mounts.push(orphan(name, path, state, MountState::Orphan));
            }
        }
        None => {
            mem = host.meminfo()?;
            let table = host.mounts()?;
            for e in &table.entries {
                let Some(name) = backend::managed_name(e) else {
                    continue;
                };
                if e.mount_point.starts_with(state.dir()) {
                    // A RAM copy waiting for its write-back: of the mounts under the
                    // state directory, the one an operator must see (it was left out).
                    if e.mount_point == state.held(name)
                        && !mounts.iter().any(|m: &MountStatus| m.name == name)
                    {
                        mounts.push(orphan(
                            name.to_string(),
                            e.mount_point.clone(),
                            state,
                            MountState::WritebackPending,
                        ));
                    }
                    continue;
                }
                mounts.push(orphan(
                    name.to_string(),
                    e.mount_point.clone(),
                    state,
                    MountState::Offloaded,
                ));
            }
        }
    }
    let agent = state.agent_status();
    if let Some(a) = &agent {
        for m in &mut mounts {
            m.agent = a.mounts.get(&m.name).cloned();
        }
    }
    let managed_used = mounts
        .iter()
        .filter(|m| m.compressed.is_none())
        .filter_map(|m| m.usage.as_ref())
        .map(|u| u.used)
        .sum();
    let managed_zram = mounts
        .iter()
        .filter_map(|m| m.compressed.as_ref())
        .map(|c| c.ram_used)
        .sum();
    Ok(StatusReport {
        agent: AgentView {
            running: agent.is_some(),
            pid: agent.as_ref().map(|a| a.pid),
            since: agent.as_ref().map(|a| a.since),
        },
        mounts,
        memory: Memory {
            mem_total: mem.mem_total,
            mem_available: mem.mem_available,
            shmem: mem.shmem,
            managed_used,
            managed_zram,
        },
    })
}

/// One mount of the spec: its state, why, and its usage where it can be seen.
fn spec_mount(m: &MountSpec, o: &Observed, world: &World, state: &State) -> MountStatus {
    let degraded = state.degraded(&m.name);
    let fallback = state.fallback(&m.name);
    let held = state.held(&m.name);
    let pending = crate::sync::held(&world.table, m, state);
    let moved = o.ours_elsewhere.as_ref().filter(|p| !p.starts_with(state.dir()));
    let state_now = observe::classify(&StateFacts {
        offloaded: matches!(o.at_path, AtPath::Ours(_)),
        writeback_pending: pending || o.stage_holds_upper,
        moved: moved.is_some(),
        covered: matches!(o.at_path, AtPath::Foreign { .. } | AtPath::OtherManaged { .. }),
        fallback: fallback.is_some(),
        degraded: degraded.is_some(),
    });
    let usage = match (&o.at_path, state_now) {
        (AtPath::Ours(live), _) => Some(live.usage().into()),
        (_, MountState::WritebackPending) if o.stage_holds_upper => {
            Usage::of(&state.stage(&m.name)).ok().map(Into::into)
        }
        (_, MountState::WritebackPending) => Usage::of(&held).ok().map(Into::into),
        (_, MountState::Moved) => moved.and_then(|p| Usage::of(p).ok()).map(Into::into),
        _ => None,
    };
    let reason = match (&o.at_path, state_now) {
        (_, MountState::WritebackPending) if o.stage_holds_upper => Some(format!(
            "the overlay is gone, but its upper layer at {} holds writes not yet on disk; `tmpfsctl sync {}` writes them back",
            state.stage(&m.name).display(),
            m.name
        )),
        (_, MountState::WritebackPending) => Some(format!(
            "the application uses its disk directory; the RAM copy at {} waits for its write-back{}; `tmpfsctl sync {}` retries it",
            held.display(),
            state
                .last_sync(&m.name)
                .and_then(|s| s.error)
                .map(|e| format!(" (last attempt: {e})"))
                .unwrap_or_default(),
            m.name
        )),
        (_, MountState::Moved) => moved.map(|p| {
            format!(
                "its tmpfs is at {} now (a parent directory was renamed or moved); `sync` and `down` still write it back",
                p.display()
            )
        }),
        (AtPath::Foreign { fstype, source }, _) => {
            Some(format!("{fstype} from {source} is mounted there"))
        }
        (AtPath::OtherManaged { source }, _) => Some(format!("{source} is mounted there")),
        (_, MountState::Degraded) => degraded,
        (_, MountState::Fallback) => fallback.map(|f| match f.reoffload_at {
            Some(at) => format!(
                "fell back to the disk directory: {} (offloaded again by the agent at unix time {at})",
                f.reason
            ),
            None => format!(
                "fell back to the disk directory: {} (offloaded again by the next `tmpfsctl apply`)",
                f.reason
            ),
        }),
        _ => None,
    };
    MountStatus {
        name: m.name.clone(),
        path: m.path.clone(),
        state: state_now,
        reason,
        usage,
        compressed: match &o.at_path {
            AtPath::Ours(live) => live.compressed(),
            _ => None,
        },
        overlay: match &o.at_path {
            AtPath::Ours(crate::backend::Live::Overlay(l)) => Some(OverlayView {
                lower: state.side(&m.name),
                upper: l.stage.join(crate::backend::overlay::UPPER),
            }),
            _ => None,
        },
        persist: Some(m.persist.name()),
        last_sync: state.last_sync(&m.name),
        progress: state.progress(&m.name),
        agent: None,
    }
}

fn orphan(name: String, path: PathBuf, state: &State, st: MountState) -> MountStatus {
    MountStatus {
        usage: Usage::of(&path).ok().map(Into::into),
        compressed: None,
        overlay: None,
        persist: state.record(&name).map(|r| r.persist),
        last_sync: state.last_sync(&name),
        progress: state.progress(&name),
        name,
        path,
        state: st,
        reason: None,
        agent: None,
    }
}
