//! Reads what the host looks like for each mount of a spec. Nothing here
//! changes the host; `plan` turns the result into steps.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::backend::{self, Live};
use crate::host::meminfo::MemInfo;
use crate::host::mountinfo::MountTable;
use crate::host::Host;
use crate::mount::RootAttrs;
use crate::spec::{self, MountSpec, Spec};
use crate::state::{Record, State};

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum AtPath {
    /// The path is not a mount point: the application uses the disk.
    Disk,
    /// Our tmpfs is on top.
    Ours(Live),
    /// Another tmpfsctl-managed mount (another name) is on top.
    OtherManaged { source: String },
    /// Somebody else's mount is on top.
    Foreign { fstype: String, source: String },
}

/// What a managed mount is now, as `status` and the agent report it.
/// Told from what was seen in one place, [`classify`].
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

impl MountState {
    /// As JSON and the metrics' `state` label write it.
    pub fn name(self) -> &'static str {
        match self {
            MountState::Offloaded => "offloaded",
            MountState::Degraded => "degraded",
            MountState::Fallback => "fallback",
            MountState::WritebackPending => "writeback-pending",
            MountState::Moved => "moved",
            MountState::Absent => "absent",
            MountState::Foreign => "foreign",
            MountState::Orphan => "orphan",
        }
    }
}

/// What a mount's state is told from; each caller fills in what it sees.
#[derive(Debug, Clone, Copy, Default)]
pub struct StateFacts {
    /// Our mount is at the spec's path.
    pub offloaded: bool,
    /// A RAM copy is held for its write-back.
    pub writeback_pending: bool,
    /// Our mount is somewhere else (a parent directory was renamed).
    pub moved: bool,
    /// Somebody else's mount (or another managed one) is at the path.
    pub covered: bool,
    /// The agent's fallback record is in force.
    pub fallback: bool,
    /// The degraded marker is set.
    pub degraded: bool,
}

pub fn classify(s: &StateFacts) -> MountState {
    if s.offloaded {
        MountState::Offloaded
    } else if s.writeback_pending {
        MountState::WritebackPending
    } else if s.covered {
        MountState::Foreign
    } else if s.moved {
        MountState::Moved
    } else if s.fallback {
        MountState::Fallback
    } else if s.degraded {
        MountState::Degraded
    } else {
        MountState::Absent
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Observed {
    pub name: String,
    pub path_exists: bool,
    pub at_path: AtPath,
    /// Our source mounted at a path other than the spec's (spec path changed).
    pub ours_elsewhere: Option<PathBuf>,
    /// A tmpfs left at the staging point by an interrupted apply.
    pub stage_mounted: bool,
    /// That tmpfs holds a non-empty overlay upper layer whose overlay is gone:
    /// changes that must be written back, never detached.
    pub stage_holds_upper: bool,
    pub side: SideBind,
    /// Owner/mode of the on-disk directory, when it can be seen.
    pub disk: Option<RootAttrs>,
    /// What `apply` recorded when it built the live mount.
    pub record: Option<Record>,
    /// A managed mount of another name (another spec's) inside the path or
    /// above it: its name and mount point.
    pub nested: Option<(String, PathBuf)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SideBind {
    Absent,
    /// One private bind that leads to the disk directory.
    Bound,
    /// The right bind, but still in a peer group (a crash between bind and
    /// make-private): a tmpfs moved onto the path would propagate onto it.
    Shared,
    /// Stacked, showing the tmpfs, or leading elsewhere: rebuild it.
    Stale,
}

/// Whether the side bind of a live tmpfs (device `tmpfs_dev`) is one private
/// bind that is not the tmpfs itself: the only state in which writing back
/// through it reaches the disk directory.
pub fn side_reaches_disk(table: &MountTable, tmpfs_dev: (u32, u32), side_path: &Path) -> bool {
    let stack = table.stack_at(side_path);
    matches!(stack.as_slice(), [only] if only.dev != tmpfs_dev && only.is_private())
}

/// Whether the side path leads to the disk directory, and only there.
fn side_state(
    table: &MountTable,
    at_path: &AtPath,
    source: &str,
    path_md: &Option<std::fs::Metadata>,
    side_path: &Path,
) -> SideBind {
    let stack = table.stack_at(side_path);
    let Some(top) = stack.last() else {
        return SideBind::Absent;
    };
    if stack.len() > 1 || backend::is_ours(top, source) {
        return SideBind::Stale;
    }
    let same_dir = match at_path {
        // The path shows the tmpfs; the bind must at least not be that tmpfs.
        AtPath::Ours(live) => top.dev != live.dev(),
        _ => match (path_md, std::fs::symlink_metadata(side_path)) {
            (Some(p), Ok(l)) => p.dev() == l.dev() && p.ino() == l.ino(),
            _ => false,
        },
    };
    match (same_dir, top.is_private()) {
        (false, _) => SideBind::Stale,
        (true, true) => SideBind::Bound,
        (true, false) => SideBind::Shared,
    }
}

/// Host-wide facts plus one observation per spec mount.
#[derive(Debug, Clone)]
pub struct World {
    pub table: MountTable,
    pub mem: MemInfo,
    pub page_size: u64,
    pub mounts: Vec<Observed>,
    /// Side paths and staging points of names the spec does not have.
    pub leftovers: Vec<Leftover>,
    /// Managed tmpfs mounts whose name the spec does not have.
    pub orphans: Vec<(String, PathBuf)>,
    /// State directories (side paths, staging) that are not private mounts
    /// yet, and whether each is a mount point already (then it is only made
    /// private: binding it again would hide the side binds on it).
    pub state_not_private: Vec<(PathBuf, bool)>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Leftover {
    pub name: String,
    pub path: PathBuf,
    pub mounted: bool,
}

pub fn observe(spec: &Spec, host: &Host, state: &State) -> Result<World> {
    let table = host.mounts()?;
    let mem = host.meminfo()?;
    let page_size = crate::host::page_size();
    let mounts = spec
        .mounts
        .iter()
        .map(|m| observe_mount(m, &table, state))
        .collect();

    let in_spec = |n: &str| spec.mount(n).is_some();
    let mut leftovers = Vec::new();
    for (names, path_of) in [
        (state.stage_names(), State::stage as fn(&State, &str) -> PathBuf),
        (state.side_names(), State::side),
    ] {
        for name in names.into_iter().filter(|n| !in_spec(n)) {
            let path = path_of(state, &name);
            let mounted = table.top_at(&path).is_some();
            // A side bind still serves an orphan tmpfs; keep it.
            let serves_orphan = backend::mounts_of(&table, &spec::source_for(&name))
                .any(|e| !e.mount_point.starts_with(state.dir()));
            if !serves_orphan {
                leftovers.push(Leftover { name, path, mounted });
            }
        }
    }
    // Scratch binds of an interrupted side-bind repair: always leftovers.
    for name in state.restore_names() {
        let path = state.restore(&name);
        let mounted = table.top_at(&path).is_some();
        leftovers.push(Leftover { name, path, mounted });
    }
    let orphans = table
        .entries
        .iter()
        .filter(|e| !e.mount_point.starts_with(state.dir()))
        .filter_map(|e| Some((backend::managed_name(e)?.to_string(), e.mount_point.clone())))
        .filter(|(n, _)| !in_spec(n))
        .collect();
    let state_not_private = [state.side_root(), state.stage_root()]
        .into_iter()
        .filter_map(|d| match table.top_at(&d) {
            Some(e) if e.is_private() => None,
            Some(_) => Some((d, true)),
            None => Some((d, false)),
        })
        .collect();
    Ok(World {
        table,
        mem,
        page_size,
        mounts,
        leftovers,
        orphans,
        state_not_private,
    })
}

fn observe_mount(m: &MountSpec, table: &MountTable, state: &State) -> Observed {
    let source = m.source();
    let path_md = std::fs::symlink_metadata(&m.path).ok();
    let at_path = match table.top_at(&m.path) {
        None => AtPath::Disk,
        Some(e) if backend::is_ours(e, &source) => match Live::read(e, &m.path) {
            Some(l) => AtPath::Ours(l),
            None => AtPath::Foreign {
                fstype: e.fstype.clone(),
                source: e.source.clone(),
            },
        },
        Some(e) if backend::managed_name(e).is_some() => AtPath::OtherManaged {
            source: e.source.clone(),
        },
        Some(e) => AtPath::Foreign {
            fstype: e.fstype.clone(),
            source: e.source.clone(),
        },
    };
    let stage = state.stage(&m.name);
    let side_path = state.side(&m.name);
    // A full bind of the live tmpfs elsewhere (a chroot, an rbind of /var)
    // is not a second copy: only a tmpfs of ours somewhere else while the
    // path has none means the spec's path changed.
    let ours_elsewhere = match at_path {
        AtPath::Ours(_) => None,
        _ => backend::mounts_of(table, &source)
            .map(|e| e.mount_point.clone())
            .find(|p| *p != m.path && *p != stage),
    };
    let side = side_state(table, &at_path, &source, &path_md, &side_path);
    let disk = match (&at_path, side) {
        (_, SideBind::Bound | SideBind::Shared) => RootAttrs::of(&side_path).ok(),
        (AtPath::Ours(_), _) => None,
        _ => RootAttrs::of(&m.path).ok(),
    };
    let stage_holds_upper = m.seed == spec::Seed::Overlay
        && !matches!(at_path, AtPath::Ours(_))
        && table.top_at(&stage).is_some_and(|e| backend::is_ours(e, &source))
        && upper_has_entries(&stage);
    Observed {
        name: m.name.clone(),
        path_exists: path_md.is_some_and(|md| md.is_dir()),
        at_path,
        ours_elsewhere,
        stage_mounted: table.top_at(&stage).is_some(),
        stage_holds_upper,
        side,
        disk,
        record: state.record(&m.name),
        nested: nested_managed(m, table, state),
    }
}

/// A managed mount of a name other than `m`'s inside its path or above it (the
/// state directory's own mounts aside): one spec cannot nest its mounts, two
/// could.
pub fn nested_managed(m: &MountSpec, table: &MountTable, state: &State) -> Option<(String, PathBuf)> {
    other_managed(table, state, &m.name, |p| {
        p != m.path && (p.starts_with(&m.path) || m.path.starts_with(p))
    })
}

/// A managed mount of a name other than `name` below `at`.
pub fn managed_below(at: &Path, name: &str, table: &MountTable, state: &State) -> Option<(String, PathBuf)> {
    other_managed(table, state, name, |p| p != at && p.starts_with(at))
}

/// The first managed mount of a name other than `name` whose mount point `pick`
/// takes, with its name. Only that name's own mount counts: the one at its
/// recorded path, or, where none is (its parent was renamed), any. A bind of
/// its tmpfs elsewhere (a chroot's, a build's) goes with the mount it is in,
/// and the data stays at the path; one left after that mount was taken down
/// (no record) is nobody's to write back (review helpers' probes: such binds
/// made `down` refuse, and the advice to take the other mount down first went
/// round in a circle).
fn other_managed(
    table: &MountTable,
    state: &State,
    name: &str,
    pick: impl Fn(&Path) -> bool,
) -> Option<(String, PathBuf)> {
    table
        .entries
        .iter()
        .filter(|e| !e.mount_point.starts_with(state.dir()) && pick(&e.mount_point))
        .find_map(|e| {
            let other = backend::managed_name(e).filter(|n| *n != name)?;
            let rec = state.record(other)?;
            let at_its_path = || {
                table
                    .entries
                    .iter()
                    .any(|x| x.mount_point == rec.path && backend::managed_name(x) == Some(other))
            };
            (e.mount_point == rec.path || !at_its_path()).then(|| (other.to_string(), e.mount_point.clone()))
        })
}

fn upper_has_entries(stage: &Path) -> bool {
    std::fs::read_dir(stage.join(backend::overlay::UPPER)).is_ok_and(|mut d| d.next().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of what can be seen: the state is the first fact
    /// in the order offloaded, write-back pending, covered, moved, fallback,
    /// degraded; none of them is absent.
    #[test]
    fn classify_takes_the_first_fact_in_order() {
        for bits in 0u8..64 {
            let f = |i: u8| bits & (1 << i) != 0;
            let seen = StateFacts {
                offloaded: f(0),
                writeback_pending: f(1),
                covered: f(2),
                moved: f(3),
                fallback: f(4),
                degraded: f(5),
            };
            let want = [
                MountState::Offloaded,
                MountState::WritebackPending,
                MountState::Foreign,
                MountState::Moved,
                MountState::Fallback,
                MountState::Degraded,
            ]
            .into_iter()
            .enumerate()
            .find(|(i, _)| f(*i as u8))
            .map_or(MountState::Absent, |(_, s)| s);
            assert_eq!(classify(&seen), want, "{seen:?}");
        }
    }

    #[test]
    fn state_names_are_the_json_names() {
        for s in [
            MountState::Offloaded,
            MountState::Degraded,
            MountState::Fallback,
            MountState::WritebackPending,
            MountState::Moved,
            MountState::Absent,
            MountState::Foreign,
            MountState::Orphan,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.name());
        }
    }
}
