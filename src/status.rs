//! `status`: what each managed mount looks like right now.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use crate::backend;
use crate::host::meminfo::MemInfo;
use crate::host::usage::Usage;
use crate::host::Host;
use crate::observe::{self, AtPath};
use crate::spec::Spec;
use crate::state::{AgentMount, State, SyncRecord};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MountState {
    /// The tmpfs is in place.
    Offloaded,
    /// apply could not offload it; the application runs on disk.
    Degraded,
    /// The agent took it back to disk before it filled (or under memory
    /// pressure); `reason` says why and when it comes back.
    Fallback,
    /// Back on the disk directory (`down` or the agent's fallback), but the RAM
    /// copy's write-back failed: it is held under the state directory until a
    /// retry (`sync`, `down`, the agent) succeeds.
    WritebackPending,
    /// The tmpfs is no longer at the spec's path: a parent directory was renamed
    /// or moved with it. It is still written back and taken down.
    Moved,
    /// Not mounted and never tried (or taken down).
    Absent,
    /// Something else is mounted at the path.
    Foreign,
    /// A managed tmpfs whose name the given spec does not have.
    Orphan,
}

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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persist: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<SyncRecord>,
    /// What the running agent says of it (none without an agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentMount>,
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
                let degraded = state.degraded(&m.name);
                let fallback = crate::agent::read_fallback(state, &m.name);
                let held = state.held(&m.name);
                let pending = crate::sync::held(&world.table, &m.name, state);
                let moved = o.ours_elsewhere.as_ref().filter(|p| !p.starts_with(state.dir()));
                let (state_now, usage) = match &o.at_path {
                    AtPath::Ours(live) => (MountState::Offloaded, Some(live.usage().into())),
                    _ if pending => (
                        MountState::WritebackPending,
                        Usage::of(&held).ok().map(Into::into),
                    ),
                    AtPath::Disk if moved.is_some() => (
                        MountState::Moved,
                        moved.and_then(|p| Usage::of(p).ok()).map(Into::into),
                    ),
                    AtPath::Foreign { .. } | AtPath::OtherManaged { .. } => (MountState::Foreign, None),
                    AtPath::Disk if fallback.is_some() => (MountState::Fallback, None),
                    AtPath::Disk if degraded.is_some() => (MountState::Degraded, None),
                    AtPath::Disk => (MountState::Absent, None),
                };
                let reason = match (&o.at_path, state_now) {
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
                mounts.push(MountStatus {
                    name: m.name.clone(),
                    path: m.path.clone(),
                    state: state_now,
                    reason,
                    usage,
                    persist: Some(crate::execute::persist_name(m.persist)),
                    last_sync: state.last_sync(&m.name),
                    agent: None,
                });
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
        .filter_map(|m| m.usage.as_ref())
        .map(|u| u.used)
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
        },
    })
}

fn orphan(name: String, path: PathBuf, state: &State, st: MountState) -> MountStatus {
    MountStatus {
        usage: Usage::of(&path).ok().map(Into::into),
        persist: state.record(&name).map(|r| r.persist),
        last_sync: state.last_sync(&name),
        name,
        path,
        state: st,
        reason: None,
        agent: None,
    }
}
