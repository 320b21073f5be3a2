//! The heart: (desired spec, observed host) → ordered steps. Pure; every
//! decision about what `apply` will do is made here and unit-tested.

use std::path::PathBuf;

use serde::Serialize;

use crate::backend::{self, Change, Live};
use crate::host::usage::Usage;
use crate::mount::RootAttrs;
use crate::observe::{AtPath, Leftover, Observed, SideBind, World};
use crate::spec::size::format_bytes;
use crate::spec::{Backend, MountSpec, Persist, Seed, Spec};
use crate::state::State;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Step {
    /// Tear down a tmpfs an interrupted apply left at the staging point.
    DetachStage {
        stage: PathBuf,
    },
    /// Drop a side bind that does not lead to the managed directory.
    DetachSide {
        side: PathBuf,
    },
    CreateDir {
        path: PathBuf,
        root: RootAttrs,
    },
    BindSide {
        path: PathBuf,
        side: PathBuf,
    },
    MountStage {
        source: String,
        stage: PathBuf,
        options: backend::MountOptions,
    },
    Seed {
        from: PathBuf,
        to: PathBuf,
    },
    /// Mounts the overlay of the disk directory (`lower`, the side bind) and
    /// the tmpfs at `stage` onto the managed path in one step (`seed: overlay`).
    MountOverlay {
        source: String,
        lower: PathBuf,
        stage: PathBuf,
        path: PathBuf,
        root: RootAttrs,
        flags: crate::spec::Flags,
    },
    /// Moves the built tmpfs onto the managed path in one step.
    MoveIntoPlace {
        stage: PathBuf,
        path: PathBuf,
    },
    Remount {
        path: PathBuf,
        options: backend::MountOptions,
        changes: Vec<Change>,
    },
    SetRoot {
        path: PathBuf,
        from: RootAttrs,
        to: RootAttrs,
    },
    /// Removes a side path or staging point of a name no longer in the spec.
    RemoveLeftover {
        path: PathBuf,
        mounted: bool,
    },
    /// Makes a state directory a private mount of its own (binding it onto
    /// itself first unless `mounted`): mounts may only be moved out of a
    /// non-shared parent, and side binds must not propagate.
    PrivateStateDir {
        dir: PathBuf,
        mounted: bool,
    },
    /// Ends the peer-group membership of a side bind left by a crash.
    PrivateSide {
        side: PathBuf,
    },
    /// Rebuilds a lost side bind under a live tmpfs: a non-recursive bind of
    /// the parent directory (at `scratch`) does not carry the tmpfs, so its
    /// entry for the managed directory is the disk directory.
    RestoreSide {
        path: PathBuf,
        side: PathBuf,
        scratch: PathBuf,
    },
}

impl Step {
    pub fn describe(&self) -> String {
        match self {
            Step::DetachStage { stage } => format!("detach unfinished tmpfs at {}", stage.display()),
            Step::DetachSide { side } => format!("detach stale side bind {}", side.display()),
            Step::CreateDir { path, root } => {
                format!("create directory {} ({})", path.display(), root.describe())
            }
            Step::BindSide { path, side } => {
                format!("bind {} to {} (private)", path.display(), side.display())
            }
            Step::MountStage {
                source,
                stage,
                options,
            } => format!(
                "mount {} {source} at {} ({})",
                options.backend(),
                stage.display(),
                options.describe()
            ),
            Step::Seed { from, to } => format!("copy contents of {} into {}", from.display(), to.display()),
            Step::MountOverlay {
                source,
                lower,
                stage,
                path,
                root,
                ..
            } => format!(
                "mount overlay {source} onto {} (lower {}, upper on the tmpfs at {}, {})",
                path.display(),
                lower.display(),
                stage.display(),
                root.describe()
            ),
            Step::MoveIntoPlace { stage, path } => {
                format!("move {} onto {}", stage.display(), path.display())
            }
            Step::Remount { path, changes, .. } => {
                let c: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
                format!("remount {} online: {}", path.display(), c.join(", "))
            }
            Step::SetRoot { path, from, to } => {
                format!(
                    "set root of {}: {} -> {}",
                    path.display(),
                    from.describe(),
                    to.describe()
                )
            }
            Step::PrivateStateDir { dir, .. } => format!("make {} a private mount", dir.display()),
            Step::PrivateSide { side } => format!("make side bind {} private", side.display()),
            Step::RestoreSide { path, side, .. } => {
                format!(
                    "restore side bind {} to the disk directory under {}",
                    side.display(),
                    path.display()
                )
            }
            Step::RemoveLeftover { path, mounted } => {
                if *mounted {
                    format!("detach and remove leftover {}", path.display())
                } else {
                    format!("remove leftover {}", path.display())
                }
            }
        }
    }
}

/// Why a mount cannot be brought to its spec now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Blocked {
    /// No tmpfs can be put there: the application stays on what it has.
    CannotOffload { reason: String },
    /// The tmpfs is live but a change cannot be made online; it stays as it is.
    Refused { reason: String },
}

impl Blocked {
    pub fn reason(&self) -> &str {
        match self {
            Blocked::CannotOffload { reason } | Blocked::Refused { reason } => reason,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MountPlan {
    pub name: String,
    pub path: PathBuf,
    pub steps: Vec<Step>,
    pub blocked: Option<Blocked>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// Host-wide preparation, run before any mount's steps.
    pub prepare: Vec<Step>,
    pub mounts: Vec<MountPlan>,
    /// Host-wide clean-up of leftovers of names no longer in the spec.
    pub cleanup: Vec<Step>,
    /// Managed mounts whose names the spec does not have; never touched by apply.
    #[serde(serialize_with = "crate::out::lossy::named_paths")]
    pub orphans: Vec<(String, PathBuf)>,
}

impl Plan {
    pub fn changes(&self) -> bool {
        !self.prepare.is_empty()
            || !self.cleanup.is_empty()
            || self.mounts.iter().any(|m| !m.steps.is_empty())
    }
}

pub fn plan(spec: &Spec, world: &World, state: &State) -> Plan {
    let mounts: Vec<MountPlan> = spec
        .mounts
        .iter()
        .zip(&world.mounts)
        .map(|(m, o)| plan_mount(m, o, state, world.page_size))
        .collect();
    let builds = mounts.iter().any(|m| {
        m.steps
            .iter()
            .any(|s| matches!(s, Step::BindSide { .. } | Step::MountStage { .. }))
    });
    let prepare = if builds {
        world
            .state_not_private
            .iter()
            .map(|(d, mounted)| Step::PrivateStateDir {
                dir: d.clone(),
                mounted: *mounted,
            })
            .collect()
    } else {
        Vec::new()
    };
    Plan {
        prepare,
        mounts,
        cleanup: world
            .leftovers
            .iter()
            .map(|Leftover { path, mounted, .. }| Step::RemoveLeftover {
                path: path.clone(),
                mounted: *mounted,
            })
            .collect(),
        orphans: world.orphans.clone(),
    }
}

/// The root attributes the tmpfs should have: the spec's, else the disk's.
fn desired_root(m: &MountSpec, disk: Option<RootAttrs>) -> Option<RootAttrs> {
    let base = disk.or_else(|| {
        m.create.then_some(RootAttrs {
            uid: 0,
            gid: 0,
            mode: 0o755,
        })
    })?;
    Some(RootAttrs {
        uid: m.owner.unwrap_or(base.uid),
        gid: m.group.unwrap_or(base.gid),
        mode: m.mode.unwrap_or(base.mode),
    })
}

pub fn plan_mount(m: &MountSpec, o: &Observed, state: &State, page_size: u64) -> MountPlan {
    let mut p = MountPlan {
        name: m.name.clone(),
        path: m.path.clone(),
        steps: Vec::new(),
        blocked: None,
    };
    let offload_blocked = |reason: String| Some(Blocked::CannotOffload { reason });

    if let Some(elsewhere) = o
        .ours_elsewhere
        .as_ref()
        .filter(|e| e.starts_with(state.held_root()))
    {
        p.blocked = offload_blocked(format!(
            "an earlier tmpfs of `{}` waits at {} for its write-back into the disk directory; run `tmpfsctl sync {}` (after freeing disk space if it failed) before it can be offloaded again",
            m.name,
            elsewhere.display(),
            m.name
        ));
        return p;
    }
    if let Some(elsewhere) = &o.ours_elsewhere {
        p.blocked = offload_blocked(format!(
            "{} is mounted at {}; take it down with the spec that mounted it (`tmpfsctl down`) before moving it to {}",
            m.source(),
            elsewhere.display(),
            m.path.display()
        ));
        return p;
    }
    match &o.at_path {
        AtPath::Ours(live) => {
            plan_side_of_live(m, o, state, &mut p);
            plan_live(m, o, live, page_size, &mut p);
            return p;
        }
        AtPath::OtherManaged { source } => {
            p.blocked = offload_blocked(format!(
                "{} already holds the tmpfs {source}; rename it back or take that mount down first",
                m.path.display()
            ));
            return p;
        }
        AtPath::Foreign { fstype, source } if !m.takeover => {
            p.blocked = offload_blocked(format!(
                "{} is already a mount point ({fstype} from {source}); set `takeover: true` to mount the tmpfs over it",
                m.path.display()
            ));
            return p;
        }
        AtPath::Foreign { .. } | AtPath::Disk => {}
    }
    if let Some((name, at)) = &o.nested {
        p.blocked = offload_blocked(if at.starts_with(&m.path) {
            format!(
                "{} inside {} holds `{name}`, a mount of another spec: a mount over it would hide it, and take it along unwritten when taken down; take `{name}` down first (`tmpfsctl down` with its spec)",
                at.display(),
                m.path.display()
            )
        } else {
            format!(
                "{} lies inside {}, where `{name}` of another spec is mounted: taken down, that mount would take this one along unwritten; take `{name}` down first (`tmpfsctl down` with its spec) or choose a path outside it",
                m.path.display(),
                at.display()
            )
        });
        return p;
    }
    if !o.path_exists && !m.create {
        p.blocked = offload_blocked(format!(
            "{} does not exist; set `create: true` to create it",
            m.path.display()
        ));
        return p;
    }
    if o.stage_holds_upper {
        p.blocked = offload_blocked(format!(
            "{} holds the upper layer of an overlay of `{}` that is no longer mounted, with changes not yet on disk; run `tmpfsctl sync {}` to write them back",
            state.stage(&m.name).display(),
            m.name,
            m.name
        ));
        return p;
    }
    let Some(root) = desired_root(m, o.disk) else {
        p.blocked = offload_blocked(format!("cannot read the owner and mode of {}", m.path.display()));
        return p;
    };

    p.steps = offload_steps(m, o, state, root);
    p
}

/// The agent's grow or shrink of a live mount: one online remount to `size`
/// bytes and `nr_inodes` inodes, every other option as the spec has it and
/// the root as it is (`root`), run by the same executor as `apply`.
pub fn resize(m: &MountSpec, root: RootAttrs, from: Usage, size: u64, nr_inodes: u64) -> Step {
    let mut changes = vec![Change::new("size", format_bytes(from.size), format_bytes(size))];
    if nr_inodes != from.inodes {
        changes.push(Change::new(
            "nr_inodes",
            from.inodes.to_string(),
            nr_inodes.to_string(),
        ));
    }
    Step::Remount {
        path: m.path.clone(),
        options: backend::MountOptions::desired(m, root).resized(size, Some(nr_inodes)),
        changes,
    }
}

/// The steps that build a tmpfs for `m` beside the path and move it into
/// place: side bind, mount at the staging point, seed, move.
fn offload_steps(m: &MountSpec, o: &Observed, state: &State, root: RootAttrs) -> Vec<Step> {
    let mut steps = Vec::new();
    let stage = state.stage(&m.name);
    let side = state.side(&m.name);
    if o.stage_mounted {
        steps.push(Step::DetachStage { stage: stage.clone() });
    }
    if !o.path_exists {
        steps.push(Step::CreateDir {
            path: m.path.clone(),
            root,
        });
    }
    match o.side {
        SideBind::Bound => {}
        SideBind::Shared => steps.push(Step::PrivateSide { side: side.clone() }),
        SideBind::Stale => {
            steps.push(Step::DetachSide { side: side.clone() });
            steps.push(Step::BindSide {
                path: m.path.clone(),
                side: side.clone(),
            });
        }
        SideBind::Absent => steps.push(Step::BindSide {
            path: m.path.clone(),
            side: side.clone(),
        }),
    }
    steps.push(Step::MountStage {
        source: m.source(),
        stage: stage.clone(),
        options: backend::MountOptions::desired(m, root),
    });
    if m.seed == Seed::Overlay {
        steps.push(Step::MountOverlay {
            source: m.source(),
            lower: side,
            stage,
            path: m.path.clone(),
            root,
            flags: m.flags,
        });
        return steps;
    }
    if m.seed == Seed::Copy {
        steps.push(Step::Seed {
            from: side,
            to: stage.clone(),
        });
    }
    steps.push(Step::MoveIntoPlace {
        stage,
        path: m.path.clone(),
    });
    steps
}

/// A live tmpfs whose side bind is missing or wrong gets it back: write-back
/// and `down` need the disk directory.
fn plan_side_of_live(m: &MountSpec, o: &Observed, state: &State, p: &mut MountPlan) {
    let side = state.side(&m.name);
    let restore = Step::RestoreSide {
        path: m.path.clone(),
        side: side.clone(),
        scratch: state.restore(&m.name),
    };
    match o.side {
        SideBind::Bound => {}
        SideBind::Shared => p.steps.push(Step::PrivateSide { side }),
        SideBind::Absent => p.steps.push(restore),
        SideBind::Stale => {
            p.steps.push(Step::DetachSide { side });
            p.steps.push(restore);
        }
    }
}

fn plan_live(m: &MountSpec, o: &Observed, live: &Live, page_size: u64, p: &mut MountPlan) {
    if matches!(live, Live::Overlay(_)) != (m.seed == Seed::Overlay) {
        p.blocked = Some(Blocked::Refused {
            reason: format!(
                "the live mount is {} and the spec asks for {}; run `tmpfsctl down {}` (which writes it back) then `apply`",
                if matches!(live, Live::Overlay(_)) { "an overlay" } else { "a full copy in RAM" },
                if m.seed == Seed::Overlay { "an overlay" } else { "a full copy in RAM" },
                m.name
            ),
        });
        return;
    }
    let live_backend = match live {
        Live::Tmpfs(_) => Some(Backend::Tmpfs),
        Live::Zram(_) => Some(Backend::Zram),
        Live::Overlay(_) => o.record.as_ref().and_then(|r| r.backend),
    };
    if let Some(was) = live_backend.filter(|b| *b != m.backend) {
        p.blocked = Some(Blocked::Refused {
            reason: format!(
                "the live mount is on {} and the spec asks for {}; run `tmpfsctl down {}` (which writes it back) then `apply`",
                was.name(),
                m.backend.name(),
                m.name
            ),
        });
        return;
    }
    if let Some(rec) = o
        .record
        .as_ref()
        .filter(|r| r.persisted() != (m.persist != Persist::None))
    {
        let down = if rec.persisted() {
            "which writes it back"
        } else {
            "which discards its contents, as a volatile mount's: the disk directory stays as it is"
        };
        p.blocked = Some(Blocked::Refused {
            reason: format!(
                "the live mount was built with `persist: {}` and the spec asks for `persist: {}`; run `tmpfsctl down {}` ({down}) then `apply`",
                rec.persist,
                m.persist.name(),
                m.name
            ),
        });
        return;
    }
    // Unseen disk directory (side bind lost): keep the live root, never the
    // `create` defaults.
    let live_root = live.root();
    let root = desired_root(m, Some(o.disk.unwrap_or(live_root))).unwrap_or(live_root);
    match live.online(m, root, page_size) {
        Err(reason) => {
            p.blocked = Some(Blocked::Refused { reason });
            return;
        }
        Ok(Some((options, changes))) => p.steps.push(Step::Remount {
            path: m.path.clone(),
            options,
            changes,
        }),
        Ok(None) => {}
    }
    if root != live_root {
        p.steps.push(Step::SetRoot {
            path: m.path.clone(),
            from: live_root,
            to: root,
        });
    }
}

#[cfg(test)]
mod tests;
