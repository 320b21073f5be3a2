//! Carries out `down`'s decision for one mount ([`Takedown`], decided by
//! `down::decide`): refuse, clean up, unmount, or switch the application to
//! its disk directory and write the RAM copy back. `down` and the agent's
//! fallback both come here. The agent's fallback leaves the write-back to its
//! worker thread ([`Handoff`]).

use std::time::Instant;

use anyhow::Result;

use crate::down::{DownOutcome, DownResult, Found, Takedown};
use crate::host::deletions::Deletions;
use crate::host::mountinfo::{MountEntry, MountTable};
use crate::host::Host;
use crate::mount;
use crate::spec::Spec;
use crate::state::State;
use crate::sync::{finish_writeback, watch_deletions, SyncOutcome};

/// Who takes a mount down, and where.
pub struct Actor<'a> {
    pub spec: &'a Spec,
    pub host: &'a Host,
    pub state: &'a State,
    /// Recorded with the write-back: `down`, or `fallback` for the agent.
    pub by: &'a str,
    /// Switch only, and hand the write-back over ([`Handoff`]).
    pub defer: bool,
}

/// A held tmpfs whose write-back the caller carries out
/// ([`crate::sync::finish_writeback`]), with the watch for the application's
/// deletions on disk started before the switch.
pub struct Handoff {
    pub watch: Option<Deletions>,
}

/// Carries out `takedown` for `name` as `found` in `table`, filling in `res`;
/// with `cx.defer`, a write-back is left to the caller (`Pending`, with its
/// [`Handoff`]).
pub fn run(
    cx: &Actor,
    name: &str,
    takedown: Takedown,
    found: &Found,
    table: &MountTable,
    res: &mut DownResult,
) -> Result<Option<Handoff>> {
    let Actor {
        spec,
        host,
        state,
        by,
        defer,
    } = *cx;
    match takedown {
        Takedown::Refuse(reason) => {
            res.result = DownOutcome::Refused;
            res.reason = Some(reason);
        }
        Takedown::CleanUp => {
            // An overlay's upper layer left without its overlay goes to disk first.
            let rescued = match spec.mount(name).filter(|m| m.seed == crate::spec::Seed::Overlay) {
                Some(m) => crate::sync::overlay::rescue(m, table, state, by)?,
                None => None,
            };
            if let Some(sync) = rescued {
                let failed = sync.result == SyncOutcome::Failed;
                let why = sync.reason.clone().unwrap_or_default();
                res.syncs.push(sync);
                if failed {
                    res.result = DownOutcome::Failed;
                    res.reason = Some(format!(
                        "the upper layer left at {} was not written back ({why}); it stays for a retry",
                        state.stage(name).display()
                    ));
                    return Ok(None);
                }
            }
            crate::sync::clean_up(name, table, state)?
        }
        Takedown::Unmount(e) => {
            crate::failpoint::hit("before-unmount", name);
            let at = mount::PinnedMount::open(&e.mount_point, e.id)?;
            res.result = if at.unmount_if_idle()? {
                DownOutcome::Unmounted
            } else {
                at.detach()?;
                DownOutcome::Detached
            };
            crate::sync::clean_up(name, table, state)?;
        }
        Takedown::WriteBack { switch } => {
            let m = spec
                .mount(name)
                .expect("decide writes back only mounts of the spec");
            let mut watch = None;
            if let Some(e) = &switch {
                // Before an overlay's first pass too: refused, nothing is written.
                if let Some(why) = records_short(state) {
                    res.result = DownOutcome::Refused;
                    res.reason = Some(why);
                    return Ok(None);
                }
                if m.seed == crate::spec::Seed::Overlay
                    && !overlay_first_pass(m, &e.mount_point, state, by, res)?
                {
                    return Ok(None);
                }
                let started = Instant::now();
                // From before the switch: the application's deletions on disk from
                // its first moment there on.
                watch = watch_deletions(m, state);
                switch_to_disk(state, name, e, found.held.as_ref(), table)?;
                res.switch_ms = Some(started.elapsed().as_secs_f64() * 1e3);
            }
            if defer {
                res.result = DownOutcome::Pending;
                res.held = Some(state.held(name));
                res.reason = Some(
                    "the application is on its disk directory; the RAM copy is being written back".into(),
                );
                return Ok(Some(Handoff { watch }));
            }
            let (sync, outcome) = finish_writeback(m, host, state, watch, by)?;
            let failed = sync.result == SyncOutcome::Failed;
            let why = sync.reason.clone().unwrap_or_default();
            res.syncs.push(sync);
            if failed {
                res.result = DownOutcome::Pending;
                res.held = Some(state.held(name));
                res.reason = Some(format!(
                    "the application is on its disk directory, but writing the RAM copy back failed: {why}; the RAM copy stays at {} until that succeeds (free space, then `tmpfsctl down {name}` or `tmpfsctl sync {name}`)",
                    state.held(name).display()
                ));
            } else {
                res.result = if res.holders.is_empty() {
                    outcome
                } else {
                    DownOutcome::Detached
                };
            }
        }
    }
    Ok(None)
}

/// Room the state directory's records area must have before a switch: the
/// write-back's journal and the deletion keeper's record are written there while
/// the application works on disk. Full, the keeper's appends failed and the
/// application's deletions on disk were not known: names it deleted came back
/// (a hunting helper's probe, 30 of 31 runs).
const RECORDS_ROOM: u64 = 1 << 20;
const RECORDS_INODES: u64 = 16;

/// Why the records area has too little room for a switch, if it has.
fn records_short(state: &State) -> Option<String> {
    let dir = state.run_dir();
    let at = if dir.exists() {
        dir
    } else {
        state.dir().to_path_buf()
    };
    let st = nix::sys::statvfs::statvfs(&at).ok()?;
    let room = st.blocks_available() as u64 * st.fragment_size() as u64;
    // A filesystem that counts no inodes (btrfs) reports none free.
    let inodes_short = st.files() > 0 && (st.files_available() as u64) < RECORDS_INODES;
    (room < RECORDS_ROOM || inodes_short).then(|| {
        format!(
            "the state directory's records area {} has {} and {} free; the write-back's journal and the watch of the application's deletions on disk need room there (at least {} and {RECORDS_INODES} inodes): free some or give it more, then try again — nothing was switched or written back",
            at.display(),
            crate::spec::size::format_bytes(room),
            crate::plural::count(st.files_available() as u64, "inode", "inodes"),
            crate::spec::size::format_bytes(RECORDS_ROOM)
        )
    })
}

/// The write-back of an overlay while it is still mounted, before the switch:
/// the merge has the disk directory to itself. On failure nothing is switched:
/// the application keeps its overlay, the reason is reported, and `false` is
/// returned.
fn overlay_first_pass(
    m: &crate::spec::MountSpec,
    merged: &std::path::Path,
    state: &State,
    by: &str,
    res: &mut DownResult,
) -> Result<bool> {
    let stage = state.stage(&m.name);
    let first = crate::copy::baseline::now_after_tick();
    let sync = crate::sync::overlay::pass(m, Some(merged), &stage, state, Default::default(), None, by)?;
    let failed = sync.result == SyncOutcome::Failed;
    if failed {
        res.result = DownOutcome::Failed;
        res.reason = Some(format!(
            "writing the upper layer back failed ({}); the overlay stays in place and nothing was switched",
            sync.reason.clone().unwrap_or_default()
        ));
    } else {
        crate::sync::overlay::mark_switch(&stage, first)?;
    }
    res.syncs.push(sync);
    Ok(!failed)
}

/// Puts the application back on its disk directory in one step: the tmpfs `live`
/// is bound to `STATE/held/NAME` (private), then detached from where the
/// application sees it. Re-entrant: a held bind of the same tmpfs left by a crash
/// between the two steps is reused.
pub fn switch_to_disk(
    state: &State,
    name: &str,
    live: &MountEntry,
    held: Option<&MountEntry>,
    table: &MountTable,
) -> Result<()> {
    let held_path = state.held(name);
    let at = mount::PinnedMount::open(&live.mount_point, live.id)?;
    match held {
        Some(h) if h.dev == live.dev => {}
        Some(h) => anyhow::bail!(
            "an earlier tmpfs of `{name}` (device {}:{}) still waits for its write-back at {}; it must be written back first",
            h.dev.0,
            h.dev.1,
            held_path.display()
        ),
        None => {
            mount::ensure_private_dir(&state.held_root(), table)?;
            mount::ensure_mount_point(&held_path)?;
            mount::bind_private(&at.path(), &held_path)?;
            crate::failpoint::hit("after-hold", name);
        }
    }
    at.detach()?;
    crate::failpoint::hit("after-switch", name);
    Ok(())
}
