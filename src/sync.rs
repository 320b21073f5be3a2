//! `sync`: writes the RAM contents of persisted mounts back to their disk
//! directories (through the private side bind), changed files only.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

pub mod overlay;
pub mod seed_window;

use crate::backend;
use crate::copy::baseline::now_after_tick;
use crate::copy::{self, DiskDeletions, Merge, SyncStats};
use crate::down::DownOutcome;
use crate::error::UnknownName;
use crate::host::deletions::{Deletions, Handle};
use crate::host::mountinfo::MountTable;
use crate::host::Host;
use crate::keeper;
use crate::mount;
use crate::observe::{self, AtPath, SideBind};
use crate::progress::Progress;
use crate::spec::{self, MountSpec, Persist, Seed, Spec};
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
    #[serde(serialize_with = "crate::out::lossy::path")]
    pub path: PathBuf,
    pub result: SyncOutcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<SyncStats>,
    /// Why the pass read the whole tree rather than only what the change tracker
    /// saw change (see [`crate::dirty`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whole_tree: Option<String>,
    pub seconds: f64,
}

/// Syncs `names` (every persisted mount of the spec when empty).
///
/// `by` is recorded with each write-back: `sync`, `schedule`, `stop`. `full`: read
/// the whole tree even where the change tracker knows what changed.
pub fn sync(
    spec: &Spec,
    names: &[String],
    host: &Host,
    state: &State,
    by: &str,
    full: bool,
) -> Result<Vec<SyncResult>> {
    UnknownName::check(spec, names, |_| false)?;
    let spec = &state.spec_as_mounted(spec);
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
            whole_tree: None,
            seconds: 0.0,
        };
        if m.persist != Persist::None && held(&world.table, m, state) {
            // A switch to disk whose write-back failed: retried here.
            out.push(finish_writeback(m, host, state, None, by)?.0);
            continue;
        }
        if m.persist == Persist::None {
            if asked {
                out.push(skip("volatile (persist: none): nothing is written back".into()));
            }
            continue;
        }
        if let (false, Some(elsewhere)) = (matches!(o.at_path, AtPath::Ours(_)), &o.ours_elsewhere) {
            // Its path was renamed or moved away with the tmpfs on it: the tmpfs is
            // still the application's, and still written back into its disk directory.
            let reachable = world
                .table
                .top_at(elsewhere)
                .is_some_and(|e| observe::side_reaches_disk(&world.table, e.dev, &state.side(&m.name)));
            out.push(if reachable && !elsewhere.starts_with(state.dir()) {
                sync_one(m, elsewhere, state, None, by, full)?
            } else {
                SyncResult {
                    result: SyncOutcome::Failed,
                    reason: Some(format!(
                        "its tmpfs is at {}, not at {}, and the disk directory is not reachable at {}",
                        elsewhere.display(),
                        m.path.display(),
                        state.side(&m.name).display()
                    )),
                    ..skip(String::new())
                }
            });
            continue;
        }
        if o.stage_holds_upper {
            if let Some(r) = overlay::rescue(m, &world.table, state, by)? {
                if r.result == SyncOutcome::Synced {
                    clean_up(&m.name, &host.mounts()?, state)?;
                }
                out.push(r);
                continue;
            }
        }
        if !matches!(o.at_path, AtPath::Ours(_)) {
            out.push(skip(
                "not offloaded: the application already uses the disk directory".into(),
            ));
            continue;
        }
        if o.side != SideBind::Bound {
            // Writing into anything but the disk directory would report a
            // write-back that did not happen.
            out.push(SyncResult {
                result: SyncOutcome::Failed,
                reason: Some(format!(
                    "the disk directory is not reachable at {}; run `tmpfsctl down` then `apply` to restore the side bind",
                    state.side(&m.name).display()
                )),
                ..skip(String::new())
            });
            continue;
        }
        out.push(sync_one(m, &m.path, state, None, by, full)?);
    }
    Ok(out)
}

/// Writes `src` (the live tmpfs root, or where it is held) back into the mount's
/// disk directory, merging against the baseline of the last seed or write-back,
/// then saves the new baseline and records the outcome.
///
/// `deletions`: names the application deleted on disk since `src` last changed
/// (a held tmpfs, while the application works in its disk directory). Unless
/// `full`, the pass reads only what the change tracker saw change, if one runs
/// (see [`crate::dirty`]).
pub fn sync_one(
    m: &MountSpec,
    src: &Path,
    state: &State,
    deletions: Option<&Mutex<dyn DiskDeletions + Send>>,
    by: &str,
    full: bool,
) -> Result<SyncResult> {
    if m.seed == Seed::Overlay {
        // Mounted (or moved with its path): nobody else writes the disk directory.
        let window = copy::overlay::Window::default();
        return overlay::pass(m, Some(src), &state.stage(&m.name), state, window, deletions, by);
    }
    let pinned = backend::own_mount(src, &m.name)?;
    let src_path = pinned.proc_path();
    let src = src_path.as_path();
    seed_window::finish_interrupted(m, state, src);
    let started = Instant::now();
    let mut whole_tree = None;
    let (mut raced, mut freed, mut deleted_before) = (std::collections::HashSet::new(), false, 0);
    // Tracked passes that found the RAM changed where they read nothing.
    let mut unread = 0;
    // The disk inodes whose ctime a pass changed by unlinking another of their names:
    // a pass that starts again must not take that for the application's change.
    let mut touched = std::collections::HashSet::new();
    let res = loop {
        let whole = if full {
            Some("asked for (--full)")
        } else if freed {
            Some("a pass that ran out of space starts again")
        } else if !raced.is_empty() {
            Some("the application changed the disk directory under the last pass")
        } else if unread > TRACKED_AFTER_UNREAD {
            Some("the RAM changed where the tracked passes before it read nothing")
        } else {
            None
        };
        let res = pass(m, src, state, deletions, (whole, &mut whole_tree), &mut touched);
        match res {
            Err(e)
                if raced.len() < PASSES_AFTER_A_RACE
                    && copy_error(&e, copy::CopyError::is_gone_in_copy)
                    && raced.insert(format!("{e:#}")) =>
            {
                tracing::info!(
                    "{}: {e:#}: the application changed the disk directory under the write-back, which starts again ({} of at most {PASSES_AFTER_A_RACE})",
                    m.name,
                    raced.len()
                );
            }
            Err(e)
                if unread <= TRACKED_AFTER_UNREAD && copy_error(&e, copy::CopyError::is_changed_unread) =>
            {
                unread += 1;
                let how = if unread > TRACKED_AFTER_UNREAD {
                    "reading the whole tree"
                } else {
                    "asking the change tracker again"
                };
                tracing::info!("{}: {e:#}: the write-back starts again, {how}", m.name);
            }
            Err(e) if !freed && freed_by(&e).is_some() => {
                freed = true;
                deleted_before = freed_by(&e).unwrap_or(0);
                tracing::info!(
                    "{}: {e:#}: the names the RAM deleted are removed now; the write-back starts again in the space they held",
                    m.name
                );
            }
            res => break res,
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let whole_tree = whole_tree.filter(|_| res.is_ok());
    let (result, reason, stats) = match res {
        Ok(mut s) => {
            s.deleted += deleted_before;
            (SyncOutcome::Synced, None, Some(s))
        }
        Err(e) if copy_error(&e, copy::CopyError::is_no_space) => {
            let hint = format!(
                "{e:#}; the disk directory {} is out of space or inodes (`df -h`, `df -i`): free some there, then write back again (`tmpfsctl sync` or `down`); the RAM copy stays",
                m.path.display()
            );
            (SyncOutcome::Failed, Some(hint), None)
        }
        Err(e) if records_full(&e) => {
            let hint = format!(
                "{e:#}; the records area {} is out of space or inodes (`df -h`, `df -i`): free some there, then write back again (`tmpfsctl sync` or `down`); the RAM copy stays",
                state.run_dir().display()
            );
            (SyncOutcome::Failed, Some(hint), None)
        }
        Err(e) => (SyncOutcome::Failed, Some(format!("{e:#}")), None),
    };
    if let Some(s) = stats.as_ref().filter(|s| s.conflicts > 0) {
        tracing::warn!(
            "{}: {} both in RAM and on disk since the last write-back; the later change of each was kept",
            m.name,
            crate::plural::count(s.conflicts, "name changed", "names changed")
        );
    }
    let st = stats.clone().unwrap_or_default();
    // Only what `status` shows of the last write-back: a state directory on a full
    // disk must not turn a pending write-back into a failed one.
    let recorded = state.write_sync(
        &m.name,
        &SyncRecord {
            by: by.to_string(),
            at: crate::state::unix_now(),
            seconds,
            ok: result == SyncOutcome::Synced,
            error: reason.clone(),
            files_written: st.files_written,
            bytes_written: st.bytes_written,
            deleted: st.deleted,
        },
    );
    if let Err(e) = recorded {
        tracing::warn!("{}: {e:#}", m.name);
    }
    Ok(SyncResult {
        name: m.name.clone(),
        path: m.path.clone(),
        result,
        reason,
        stats,
        whole_tree,
        seconds,
    })
}

/// Whether `e` is the state directory out of space: the journal or the baseline
/// could not be written (the disk directory's own is a [`copy::CopyError`]).
fn records_full(e: &anyhow::Error) -> bool {
    let full = |c: &(dyn std::error::Error + 'static)| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)))
    };
    !copy_error(e, copy::CopyError::is_no_space) && e.chain().any(full)
}

/// Whether `e` holds a [`copy::CopyError`] that `is`.
fn copy_error(e: &anyhow::Error, is: fn(&copy::CopyError) -> bool) -> bool {
    e.chain()
        .any(|c| c.downcast_ref::<copy::CopyError>().is_some_and(is))
}

/// How many entries the write-back that failed with `e` removed after it ran out of
/// space, if it did (see [`copy::CopyError::SpaceFreed`]).
fn freed_by(e: &anyhow::Error) -> Option<u64> {
    e.chain()
        .find_map(|c| c.downcast_ref::<copy::CopyError>()?.freed())
}

/// How often a write-back starts again when a directory of the disk side vanished
/// under it: each time the application removed a directory the pass was working in
/// (htcacheclean removes emptied cache directories) between two of its system calls,
/// each time another one (so it ends: a cleaner removes each directory once). The
/// next pass continues from the journal, as after a crash. With 3, an application
/// that removed every directory the merge opened failed `down` (pending, kept for a
/// retry) in 3 of 8 runs.
const PASSES_AFTER_A_RACE: usize = 1000;

/// Tracked passes after one that found the RAM changed below a directory it
/// skipped, before a whole pass: a fresh answer names that change, and a whole
/// pass cannot tell a RAM file below a changed directory from one moved in, so
/// against a disk version whose ctime understates its change it can keep the
/// wrong one (docs/writeback.md, "What is not covered"; a review helper's probe,
/// 4 of 4). An application that keeps writing below skipped directories makes
/// every try fail; the whole pass then ends it.
const TRACKED_AFTER_UNREAD: u32 = 2;

/// One write-back pass of `src` into the disk directory of `m` against the baseline as
/// recorded (with the journal of an interrupted pass), saving the new baseline.
/// `whole`: why it must read the whole tree, if it must; `whole_tree`: why it read
/// the whole tree, when it did; `touched`: see [`copy::Merge::touched`].
fn pass(
    m: &MountSpec,
    src: &Path,
    state: &State,
    deletions: Option<&Mutex<dyn DiskDeletions + Send>>,
    (whole, whole_tree): (Option<&str>, &mut Option<String>),
    touched: &mut std::collections::HashSet<u64>,
) -> Result<copy::SyncStats> {
    let base = state.baseline(&m.name)?;
    let mut ask = || {
        let asked = match (whole, base.taken) {
            (Some(why), _) => Err(why.to_string()),
            (None, None) => Err("there is no baseline to compare with".to_string()),
            (None, Some(taken)) => crate::dirty::ask(state, &m.name, src, taken),
        };
        asked.map_err(|why| *whole_tree = Some(why)).ok()
    };
    state
        .journal(&m.name, &base)
        .and_then(|journal| {
            let merge = Merge {
                base: &base,
                journal: Some(&journal),
                deletions,
                dirty: Some(&mut ask),
                barriers: Some(&|| crate::dirty::barriers(state, &m.name)),
                copied: None,
                touched: Some(touched),
            };
            let mut shown = Progress::new(state, &m.name, "write-back", true, None, None);
            let mut progress = |s: &copy::SyncStats| shown.update(s.compared(), s.bytes_written);
            copy::sync_tree(src, &state.side(&m.name), merge, Some(&mut progress)).map_err(anyhow::Error::new)
        })
        .and_then(|synced| {
            if let Some(why) = synced.stats.whole_tree_after {
                *whole_tree = Some(why.to_string());
            }
            crate::failpoint::hit("after-merge", &m.name);
            if !synced.kept {
                state.save_baseline(&m.name, &synced.baseline)?;
            }
            crate::failpoint::hit("after-baseline", &m.name);
            Ok(synced.stats)
        })
}

/// Writes the held tmpfs of `m` (see [`crate::down`]) back into its disk
/// directory; on success unmounts it (lazily if still in use: `Detached`),
/// removes the side bind and has the state forget the mount. On failure
/// everything stays for a retry (`Pending`).
///
/// `watch`: deletions in the disk directory watched since before the switch (see
/// [`watch_deletions`]); a retry starts its own.
pub fn finish_writeback(
    m: &MountSpec,
    host: &Host,
    state: &State,
    watch: Option<Deletions>,
    by: &str,
) -> Result<(SyncResult, DownOutcome)> {
    let m = &state.as_mounted(m);
    crate::failpoint::hit("before-writeback", &m.name);
    let held = state.held(&m.name);
    let made_again = rebind_side(m, host, state)?;
    let mut watch = watch.or_else(|| watch_deletions(m, state));
    if let (Some(w), Some((new, old))) = (watch.as_mut(), made_again) {
        w.stands_for(new, old);
    }
    if let Some(w) = watch.as_mut() {
        // The held copy got its last change through the path before this.
        w.since(now_after_tick());
    }
    let watch = watch.map(Mutex::new);
    let deletions = watch.as_ref().map(|w| w as &Mutex<dyn DiskDeletions + Send>);
    let res = if m.seed == Seed::Overlay {
        let stage = state.stage(&m.name);
        let window = overlay::after_switch(&stage)?;
        let merged = Some(held.as_path()).filter(|h| held_overlay(h));
        let res = overlay::pass(m, merged, &stage, state, window, deletions, by)?;
        if res.result == SyncOutcome::Synced {
            overlay::mark_merged(&stage)?;
        }
        res
    } else {
        sync_one(m, &held, state, deletions, by, false)?
    };
    if res.result == SyncOutcome::Failed {
        if let Some(w) = watch {
            let mut w = w.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(e) = keeper::hand_over(state, &m.name, &mut w) {
                tracing::warn!("{}: {e:#}", m.name);
            }
        }
        return Ok((res, DownOutcome::Pending));
    }
    keeper::finish(state, &m.name);
    let outcome = if mount::unmount_if_idle(&held)? {
        DownOutcome::Unmounted
    } else {
        mount::detach(&held)?;
        DownOutcome::Detached
    };
    crate::failpoint::hit("after-release", &m.name);
    remove_side_dir(&held)?;
    clean_up(&m.name, &host.mounts()?, state)?;
    Ok((res, outcome))
}

/// Starts watching the disk directory of `m` for deletions, for a write-back of its
/// held tmpfs: this process's own watch, what the keeper of an earlier attempt saw,
/// and a new keeper should this process die before the write-back is done (see
/// [`keeper`]). Without fanotify (old kernel, no CAP_SYS_ADMIN), none.
pub fn watch_deletions(m: &MountSpec, state: &State) -> Option<Deletions> {
    let mut watch = Deletions::watch(&state.side(&m.name))
        .map_err(|e| {
            tracing::debug!(
                "{}: no watch for deletions in the disk directory ({e}); names the RAM created are written back",
                m.name
            )
        })
        .ok()?;
    keeper::take_over(state, &m.name, &mut watch);
    Some(watch)
}

/// Binds the side of a held tmpfs `m` again, to the directory at its path, if the
/// application removed the disk directory it was bound to (and perhaps made another)
/// while the write-back waited: the write-back goes where the application works now.
/// Creating anything in the removed one fails, so no retry could finish, whatever
/// its message said to do. The deletion keeper's record gets the new directory's
/// handle and the removed one's: the application removed only what the disk had, so
/// what the RAM wrote that it never saw is the RAM's (as for any directory removed
/// between two attempts).
///
/// A side that is no mount at all (this, killed between its two steps) is bound the
/// same way: written into, its bare directory in the state directory would take the
/// RAM copy, and `down` would then drop it with the side.
///
/// Returns the handles of the new directory and the removed one, for a watch
/// started before this.
fn rebind_side(m: &MountSpec, host: &Host, state: &State) -> Result<Option<(Handle, Handle)>> {
    let side = state.side(&m.name);
    let mounted = host.mounts()?.top_at(&side).is_some();
    let old = mounted.then(|| std::fs::File::open(&side).ok()).flatten();
    if mounted
        && old.as_ref().is_none_or(|f| {
            f.metadata()
                .is_ok_and(|md| std::os::unix::fs::MetadataExt::nlink(&md) != 0)
        })
    {
        return Ok(None);
    }
    let now = crate::mount::PinnedDir::open(&m.path).with_context(|| {
        format!(
            "the disk directory {} was removed while its write-back waited; make it again for the write-back",
            m.path.display()
        )
    })?;
    // Unmounted by an attempt killed right after, the side was last bound to the
    // directory that attempt recorded as made again.
    let was = match &old {
        Some(old) => crate::host::fanotify::handle_of(std::os::fd::AsFd::as_fd(old)).ok(),
        None => keeper::last_made_again(state, &m.name),
    };
    let handles = crate::host::fanotify::handle_of(now.as_fd())
        .ok()
        .zip(was)
        .filter(|(new, was)| new != was);
    if let Some((new, old)) = &handles {
        keeper::made_again(state, &m.name, new.clone(), old.clone())?;
    }
    crate::mount::detach_all(&side)?;
    crate::failpoint::hit("side-detached", &m.name);
    crate::mount::ensure_mount_point(&side)?;
    crate::mount::bind_private(&now.proc_path(), &side)?;
    tracing::warn!(
        "{}: the disk directory was removed while its write-back waited, or its bind was lost; writing back into {} as it is now",
        m.name,
        m.path.display()
    );
    Ok(handles)
}

/// Whether an overlay is mounted at `held` (a retry may find only its tmpfs).
fn held_overlay(held: &Path) -> bool {
    nix::sys::statfs::statfs(held)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::OVERLAYFS_SUPER_MAGIC)
}

/// Whether a tmpfs of `m` is held, waiting for its write-back. One also still at
/// its path is a `down` stopped (killed) between holding it and switching the
/// application to disk: the application still works in it, so it is written back
/// as the live tmpfs it is, and the switch is `down`'s to finish. Written back as
/// held, the write-back ended as `down`'s does, without the baseline and the side
/// bind, under the live tmpfs, and what the application deleted in it after that
/// came back at the next `down`.
pub fn held(table: &MountTable, m: &MountSpec, state: &State) -> bool {
    let source = spec::source_for(&m.name);
    let ours = |at: &Path| {
        table
            .stack_at(at)
            .into_iter()
            .filter(|e| backend::is_ours(e, &source))
            .map(|e| e.dev)
            .collect::<Vec<_>>()
    };
    let live = ours(&m.path);
    let held = ours(&state.held(&m.name));
    !held.is_empty() && !held.iter().any(|dev| live.contains(dev))
}

/// Removes the side bind and staging point of a mount that is gone, and has the
/// state forget it.
pub fn clean_up(name: &str, table: &MountTable, state: &State) -> Result<()> {
    for side in [state.stage(name), state.side(name)] {
        if table.top_at(&side).is_some() {
            mount::detach(&side)?;
        }
        remove_side_dir(&side)?;
    }
    // The mount is gone (or detached while busy: then its device stays, for later).
    for held in crate::backend::release_unused(state)?.held {
        tracing::warn!("{held}");
    }
    state.forget(name)
}

fn remove_side_dir(side: &Path) -> Result<()> {
    match std::fs::remove_dir(side) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(anyhow::Error::new(e).context(format!("removing {}", side.display())))
        }
        _ => Ok(()),
    }
}
