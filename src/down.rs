//! `down`: takes managed mounts away safely; the application is back on its
//! disk directory.
//!
//! This module finds what is mounted and decides ([`decide`], pure); the
//! executor carries the decision out (`execute::takedown`).
//!
//! A persisted mount is switched first and written back after: the tmpfs is bound
//! to `STATE/held/NAME` and detached from the managed path, two mount calls that
//! take the same time whatever the size of the tree, so the application is on its
//! disk directory at once. The held tmpfs is then merged into the disk directory
//! (see [`crate::copy::sync_tree`]) and unmounted only once that succeeded; until
//! then it stays in the mount table, survives a crash of tmpfsctl, shows in
//! `status`, and `down`, `sync` and the agent retry it.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use crate::backend;
use crate::error::UnknownName;
use crate::execute::takedown;
use crate::host::mountinfo::{MountEntry, MountTable};
use crate::host::procs::Holder;
use crate::host::Host;
use crate::observe;
use crate::spec::{self, Persist, Spec};
use crate::state::State;
use crate::sync::SyncResult;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DownOutcome {
    /// Unmounted cleanly.
    Unmounted,
    /// Busy: detached lazily; holders keep their open files.
    Detached,
    /// The application is on its disk directory, but the write-back of the RAM
    /// copy failed: it is kept at `held` until a retry succeeds.
    Pending,
    /// There was no managed tmpfs to take down (leftovers were cleaned).
    NotMounted,
    /// Not taken down; see reason.
    Refused,
    /// An error stopped it part way; see reason. Later mounts were still tried.
    Failed,
}

#[derive(Debug, Clone, Serialize)]
pub struct DownResult {
    pub name: String,
    #[serde(serialize_with = "crate::out::lossy::opt_path")]
    pub path: Option<PathBuf>,
    pub result: DownOutcome,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Milliseconds from the decision until the path showed the disk directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switch_ms: Option<f64>,
    /// Where the RAM copy waits for its write-back (`Pending`).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::out::lossy::opt_path"
    )]
    pub held: Option<PathBuf>,
    /// The write-back of the RAM copy into the disk directory.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub syncs: Vec<SyncResult>,
}

impl DownResult {
    fn new(name: &str, path: Option<PathBuf>, result: DownOutcome) -> Self {
        DownResult {
            name: name.to_string(),
            path,
            result,
            holders: Vec::new(),
            reason: None,
            switch_ms: None,
            held: None,
            syncs: Vec::new(),
        }
    }
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
    let table = host.mounts()?;
    UnknownName::check(spec, &targets, |n| {
        backend::mounts_of(&table, &spec::source_for(n)).next().is_some()
    })?;
    let mut out = Vec::new();
    for name in targets {
        // One mount's error must not keep the others from being written back.
        out.push(down_one(spec, &name, host, state, "down").unwrap_or_else(|e| {
            let mut r = DownResult::new(
                &name,
                spec.mount(&name).map(|m| m.path.clone()),
                DownOutcome::Failed,
            );
            r.reason = Some(format!("{e:#}"));
            r
        }));
    }
    Ok(out)
}

/// What `down` finds for one name.
pub struct Found {
    /// The tmpfs the application sees: at the spec's path, or wherever it went
    /// (a renamed parent directory takes the mount along).
    pub live: Option<MountEntry>,
    /// A tmpfs already switched away from the application, waiting for its write-back.
    pub held: Option<MountEntry>,
}

fn find(spec: &Spec, name: &str, table: &MountTable, state: &State) -> Found {
    let source = spec::source_for(name);
    let held_path = state.held(name);
    let held = table
        .stack_at(&held_path)
        .into_iter()
        .find(|e| backend::is_ours(e, &source))
        .cloned();
    // The tmpfs at the spec's path, not a bind of it elsewhere (a chroot).
    let at_spec_path = spec.mount(name).and_then(|m| {
        table
            .stack_at(&m.path)
            .into_iter()
            .find(|e| backend::is_ours(e, &source))
    });
    let live = at_spec_path
        .or_else(|| backend::mounts_of(table, &source).find(|e| !e.mount_point.starts_with(state.dir())))
        .cloned();
    Found { live, held }
}

/// What `down` does with one name. Decided by [`decide`] from the mount
/// table and the state before anything changes; `down` and the agent's
/// fallback carry out the same decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Takedown {
    /// Not touched; the reason says why and what to do.
    Refuse(String),
    /// Nothing of ours is mounted: only the side bind and staging point go.
    CleanUp,
    /// A volatile tmpfs: unmounted (detached lazily when busy), nothing written back.
    Unmount(MountEntry),
    /// A persisted tmpfs: the application is switched to its disk directory
    /// (when the tmpfs is still where it sees it), then the RAM copy is
    /// written back from where it is held.
    WriteBack { switch: Option<MountEntry> },
}

/// The facts [`decide`] needs beyond the mount table, read before it.
pub struct Facts<'a> {
    pub spec: &'a Spec,
    pub name: &'a str,
    /// The side bind of `name` (`STATE/lower/NAME`).
    pub side: PathBuf,
    /// The state's record says the mount was persisted.
    pub recorded_persisted: bool,
    /// A managed mount of another name below the live one (see
    /// [`observe::managed_below`]), with its mount point.
    pub inner: Option<(String, PathBuf)>,
}

/// Pure: what to do with one name (see [`Takedown`]).
pub fn decide(f: &Facts, found: &Found, table: &MountTable) -> Takedown {
    let m = f.spec.mount(f.name);
    let persisted = m.is_some_and(|m| m.persist != Persist::None);
    if let Some(e) = &found.live {
        if let Some(top) = table.top_at(&e.mount_point).filter(|t| t.id != e.id) {
            return Takedown::Refuse(format!(
                "{} is covered by another mount ({} from {}); take that down first",
                e.mount_point.display(),
                top.fstype,
                top.source
            ));
        }
        if let Some((name, at)) = &f.inner {
            return Takedown::Refuse(format!(
                "{} inside {} holds `{name}`, a mount of another spec, which this one's takedown would take along unwritten; take `{name}` down first (`tmpfsctl down` with its spec) — nothing was written back or unmounted",
                at.display(),
                e.mount_point.display()
            ));
        }
        if persisted && !observe::side_reaches_disk(table, e.dev, &f.side) {
            return Takedown::Refuse(format!(
                "the disk directory is not reachable through {} (missing, stacked or shared side bind); run `tmpfsctl apply` to restore it, then `down` again — nothing was written back or unmounted",
                f.side.display()
            ));
        }
    }
    if m.is_none() && (found.held.is_some() || (found.live.is_some() && f.recorded_persisted)) {
        return Takedown::Refuse(format!(
            "`{}` is persisted but not in {}; take it down with the spec that mounted it, so its data is written back",
            f.name,
            f.spec.file.display()
        ));
    }
    match (persisted, &found.live, &found.held) {
        (true, Some(e), _) => Takedown::WriteBack {
            switch: Some(e.clone()),
        },
        (true, None, Some(_)) => Takedown::WriteBack { switch: None },
        (false, Some(e), _) => Takedown::Unmount(e.clone()),
        _ => Takedown::CleanUp,
    }
}

/// Takes one mount down, then removes the side bind and staging point and has
/// the state forget the mount. Shared by `down` and the agent's fallback, which
/// sets its own marker afterwards.
///
/// Observes, decides ([`decide`]) and has the executor carry it out
/// ([`takedown::run`]): a volatile mount (`persist: none`) is unmounted
/// cleanly when idle, else detached lazily; a persisted one is switched to
/// the disk directory at once ([`takedown::switch_to_disk`]), then written
/// back from where it is held ([`crate::sync::finish_writeback`]).
///
/// `by` is recorded with the write-back: `down`, or `fallback` for the agent.
pub fn down_one(spec: &Spec, name: &str, host: &Host, state: &State, by: &str) -> Result<DownResult> {
    take_down(spec, name, host, state, by, false).map(|(res, _)| res)
}

/// [`down_one`] up to the switch: a persisted mount's write-back is left to the
/// caller, `Pending` with its [`takedown::Handoff`] (the agent's fallback, which
/// writes back on its worker thread while it goes on watching the other mounts).
pub fn switch_one(
    spec: &Spec,
    name: &str,
    host: &Host,
    state: &State,
    by: &str,
) -> Result<(DownResult, Option<takedown::Handoff>)> {
    take_down(spec, name, host, state, by, true)
}

fn take_down(
    spec: &Spec,
    name: &str,
    host: &Host,
    state: &State,
    by: &str,
    defer: bool,
) -> Result<(DownResult, Option<takedown::Handoff>)> {
    // As it was built, whatever the spec says now (see `State::as_mounted`).
    let spec = &state.spec_as_mounted(spec);
    let table = host.mounts()?;
    let found = find(spec, name, &table, state);
    // Where the application sees the tmpfs, else where the spec says it goes.
    let mut res = DownResult::new(
        name,
        found
            .live
            .as_ref()
            .map(|e| e.mount_point.clone())
            .or_else(|| spec.mount(name).map(|m| m.path.clone())),
        DownOutcome::NotMounted,
    );
    let facts = Facts {
        spec,
        name,
        side: state.side(name),
        recorded_persisted: state.record(name).is_some_and(|r| r.persisted()),
        inner: found
            .live
            .as_ref()
            .and_then(|e| observe::managed_below(&e.mount_point, name, &table, state)),
    };
    let takedown = decide(&facts, &found, &table);
    if let Some(e) = &found.live {
        if !matches!(takedown, Takedown::Refuse(_)) {
            let overlay = (e.fstype == "overlay").then_some(e.id);
            res.holders = host.holders(backend::files_dev(e), overlay);
        }
    }
    let cx = takedown::Actor {
        spec,
        host,
        state,
        by,
        defer,
    };
    let handoff = takedown::run(&cx, name, takedown, &found, &table, &mut res)?;
    Ok((res, handoff))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{AgentSettings, Flags, MountSpec};

    /// Our tmpfs at /c with its side bind; 60 covers /covered; 70 is held.
    const TABLE: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:39 / /c rw,nosuid,nodev - tmpfs tmpfsctl-c rw,size=1024k
41 22 254:0 /c /run/tmpfsctl/lower/c rw,relatime - ext4 /dev/vda rw
50 22 0:40 / /covered rw - tmpfs tmpfsctl-c rw,size=1024k
60 50 0:41 / /covered rw - tmpfs other rw,size=1024k
70 22 0:42 / /run/tmpfsctl/held/c rw - tmpfs tmpfsctl-c rw,size=1024k
";

    fn spec(persist: Persist) -> Spec {
        Spec {
            file: "/etc/tmpfsctl/cache.yaml".into(),
            max_total: 1 << 30,
            mounts: vec![MountSpec {
                flags: Flags::default(),
                persist,
                ..MountSpec::for_test("c", "/c", 1 << 20)
            }],
            agent: AgentSettings::default(),
        }
    }

    fn entry(t: &MountTable, id: u32) -> Option<MountEntry> {
        t.entries.iter().find(|e| e.id == id).cloned()
    }

    fn run(
        spec: &Spec,
        name: &str,
        live: Option<u32>,
        held: Option<u32>,
        side: &str,
        recorded: bool,
    ) -> Takedown {
        let t = MountTable::parse(TABLE).unwrap();
        let found = Found {
            live: live.and_then(|id| entry(&t, id)),
            held: held.and_then(|id| entry(&t, id)),
        };
        let facts = Facts {
            spec,
            name,
            side: side.into(),
            recorded_persisted: recorded,
            inner: None,
        };
        decide(&facts, &found, &t)
    }

    fn refused(t: Takedown, why: &str) {
        match t {
            Takedown::Refuse(r) => assert!(r.contains(why), "{r}"),
            other => panic!("not refused: {other:?}"),
        }
    }

    const LOWER: &str = "/run/tmpfsctl/lower/c";
    const NO_LOWER: &str = "/run/tmpfsctl/lower/gone";

    #[test]
    fn a_persisted_live_mount_is_switched_then_written_back() {
        let s = spec(Persist::OnStop);
        let t = MountTable::parse(TABLE).unwrap();
        assert_eq!(
            run(&s, "c", Some(40), None, LOWER, true),
            Takedown::WriteBack {
                switch: entry(&t, 40)
            }
        );
        assert_eq!(
            run(&s, "c", None, Some(70), LOWER, true),
            Takedown::WriteBack { switch: None },
            "a held copy is written back without a switch"
        );
    }

    #[test]
    fn a_volatile_live_mount_is_unmounted_without_a_write_back() {
        let t = MountTable::parse(TABLE).unwrap();
        assert_eq!(
            run(&spec(Persist::None), "c", Some(40), None, NO_LOWER, false),
            Takedown::Unmount(entry(&t, 40).unwrap())
        );
    }

    #[test]
    fn nothing_mounted_leaves_only_the_clean_up() {
        for p in [Persist::None, Persist::OnStop] {
            assert_eq!(run(&spec(p), "c", None, None, NO_LOWER, true), Takedown::CleanUp);
        }
    }

    #[test]
    fn a_covered_mount_is_refused() {
        refused(
            run(&spec(Persist::None), "c", Some(50), None, LOWER, false),
            "covered by another mount (tmpfs from other)",
        );
    }

    #[test]
    fn a_persisted_mount_without_its_side_bind_is_refused() {
        refused(
            run(&spec(Persist::OnStop), "c", Some(40), None, NO_LOWER, true),
            "not reachable through /run/tmpfsctl/lower/gone",
        );
        // A bind of the tmpfs itself at the side path is no way to the disk.
        refused(
            run(
                &spec(Persist::OnStop),
                "c",
                Some(70),
                None,
                "/run/tmpfsctl/held/c",
                true,
            ),
            "not reachable",
        );
    }

    #[test]
    fn a_persisted_mount_missing_from_the_spec_is_refused() {
        let other = Spec {
            mounts: vec![],
            ..spec(Persist::None)
        };
        refused(
            run(&other, "c", None, Some(70), LOWER, false),
            "persisted but not in /etc/tmpfsctl/cache.yaml",
        );
        refused(
            run(&other, "c", Some(40), None, LOWER, true),
            "persisted but not in",
        );
        let t = MountTable::parse(TABLE).unwrap();
        assert_eq!(
            run(&other, "c", Some(40), None, LOWER, false),
            Takedown::Unmount(entry(&t, 40).unwrap()),
            "a volatile mount removed from the spec can still be taken down"
        );
    }
}
