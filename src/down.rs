//! `down`: takes managed mounts away safely; the application is back on its
//! disk directory.

use std::path::PathBuf;

use std::os::fd::AsRawFd;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::copy::SyncOptions;
use crate::error::UnknownName;
use crate::host::procs::Holder;
use crate::host::Host;
use crate::mount;
use crate::observe;
use crate::spec::{self, Persist, Spec};
use crate::state::State;
use crate::sync::{self, SyncOutcome, SyncResult};

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
    /// An error stopped it part way; see reason. Later mounts were still tried.
    Failed,
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
    /// The write-back done before (and, when detached lazily, after) the unmount.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub syncs: Vec<SyncResult>,
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
        table
            .by_source(&spec::source_for(n))
            .any(|e| !e.mount_point.starts_with(state.dir()))
    })?;
    let mut out = Vec::new();
    for name in targets {
        // One mount's error must not keep the others from being written back.
        out.push(down_one(spec, &name, host, state).unwrap_or_else(|e| DownResult {
            name: name.clone(),
            path: spec.mount(&name).map(|m| m.path.clone()),
            result: DownOutcome::Failed,
            holders: Vec::new(),
            reason: Some(format!("{e:#}")),
            syncs: Vec::new(),
        }));
    }
    Ok(out)
}

/// Takes one mount down, then removes the side bind and staging point and
/// has the state forget the mount. Shared by `down` and the agent's fallback
/// (`agent`), which sets its own marker afterwards.
///
/// A volatile mount (`persist: none`) is unmounted cleanly when idle, else
/// detached lazily; nothing is written back.
///
/// A persisted mount is always detached, between two write-backs:
///
/// 1. a mirror of the live tmpfs into the disk directory (through the side
///    bind); if it fails, `down` refuses and the tmpfs stays mounted;
/// 2. the cutoff is taken (the clock inode ctimes use, once it moved past
///    the end of pass 1, so pass 1's changes are all before it), a root
///    descriptor opened and the tmpfs detached (`MNT_DETACH`): from here on
///    the application opens its disk directory;
/// 3. a merge from the detached tree (through the descriptor) catches what
///    was written to RAM after pass 1 started: it deletes nothing on disk
///    and leaves every disk entry whose ctime is at or after the cutoff as
///    it is — the application changed it after the detach, so its version
///    wins (see [`crate::copy::sync_tree_with`]).
///
/// The result is `Unmounted` when no process held the tmpfs just before
/// the detach (the detached tmpfs goes with the descriptor), else
/// `Detached`; `syncs` lists both passes.
pub fn down_one(spec: &Spec, name: &str, host: &Host, state: &State) -> Result<DownResult> {
    let table = host.mounts()?;
    let source = spec::source_for(name);
    // The tmpfs at the spec's path, not a bind of it elsewhere (a chroot).
    let at_spec_path = spec
        .mount(name)
        .and_then(|m| table.stack_at(&m.path).into_iter().find(|e| e.source == source));
    let live = at_spec_path
        .or_else(|| {
            table
                .by_source(&source)
                .find(|e| !e.mount_point.starts_with(state.dir()))
        })
        .cloned();
    let persisted = spec.mount(name).filter(|m| m.persist != Persist::None);
    let mut res = DownResult {
        name: name.to_string(),
        path: live.as_ref().map(|e| e.mount_point.clone()),
        result: DownOutcome::NotMounted,
        holders: Vec::new(),
        reason: None,
        syncs: Vec::new(),
    };

    if let Some(e) = &live {
        if let Some(top) = table.top_at(&e.mount_point).filter(|t| t.id != e.id) {
            res.result = DownOutcome::Refused;
            res.reason = Some(format!(
                "{} is covered by another mount ({} from {}); take that down first",
                e.mount_point.display(),
                top.fstype,
                top.source
            ));
            return Ok(res);
        }
        if persisted.is_some() && !observe::lower_reaches_disk(&table, e.dev, &state.lower(name)) {
            res.result = DownOutcome::Refused;
            res.reason = Some(format!(
                "the disk directory is not reachable through {} (missing, stacked or shared side bind); run `tmpfsctl apply` to restore it, then `down` again — nothing was written back or unmounted",
                state.lower(name).display()
            ));
            return Ok(res);
        }
        if persisted.is_none()
            && spec.mount(name).is_none()
            && state.record(name).is_some_and(|r| r.persist != "none")
        {
            res.result = DownOutcome::Refused;
            res.reason = Some(format!(
                "`{name}` is persisted but not in {}; take it down with the spec that mounted it, so its data is written back",
                spec.file.display()
            ));
            return Ok(res);
        }
        if let Some(m) = persisted {
            let first = sync::sync_one(m, &e.mount_point, state)?;
            let failed = first.result == SyncOutcome::Failed;
            let why = first.reason.clone().unwrap_or_default();
            res.syncs.push(first);
            if failed {
                res.result = DownOutcome::Refused;
                res.reason = Some(format!("write-back failed, so the tmpfs stays mounted: {why}"));
                return Ok(res);
            }
        }
        res.holders = host.holders(e.dev);
        if let Some(m) = persisted {
            // Held across the detach: the detached tmpfs stays reachable through
            // it for a last write-back of what was written since the first one.
            let root = std::fs::File::open(&e.mount_point)
                .with_context(|| format!("opening {}", e.mount_point.display()))?;
            let cutoff = cutoff_after_tick();
            mount::detach(&e.mount_point)?;
            res.result = if res.holders.is_empty() {
                DownOutcome::Unmounted
            } else {
                DownOutcome::Detached
            };
            let detached = PathBuf::from(format!("/proc/self/fd/{}/.", root.as_raw_fd()));
            let last = sync::sync_one_with(m, &detached, state, SyncOptions::merge_since(cutoff))?;
            if last.result == SyncOutcome::Failed {
                res.reason = Some(format!(
                    "detached, but writing back the late writes failed: {}",
                    last.reason.clone().unwrap_or_default()
                ));
            }
            res.syncs.push(last);
        } else if mount::unmount_if_idle(&e.mount_point)? {
            res.result = DownOutcome::Unmounted;
        } else {
            mount::detach(&e.mount_point)?;
            res.result = DownOutcome::Detached;
        }
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

/// The cutoff of `down`'s last pass, taken just before the detach: a time no
/// earlier than any change pass 1 made and no later than the ctime of any
/// change made after it returns.
///
/// Inode ctimes come from the coarse realtime clock (or, with multigrain
/// timestamps, from a fine-grained time never below it), so the cutoff is read
/// from that clock, after waiting for it to tick once (a few milliseconds at
/// most): pass 1's last change then lies strictly before the cutoff, while
/// anything done after this returns has a ctime at or after it.
// `time_t` and `c_long` are i64 only on 64-bit targets.
#[allow(clippy::unnecessary_cast)]
fn cutoff_after_tick() -> (i64, i64) {
    let coarse = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write to.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
        (ts.tv_sec as i64, ts.tv_nsec as i64)
    };
    let start = coarse();
    // A tick is 1 to 10 ms; 100 ms covers a stalled clock without hanging.
    for _ in 0..200 {
        let now = coarse();
        if now > start {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    coarse()
}
