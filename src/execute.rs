//! Carries out what was decided: `apply`'s plan with rollback (and the
//! agent's resize, one step of it), and `down`'s decision (`takedown`).
//! Mounts are made through `backend` (and `mount` for binds and moves), the
//! seed through `copy`.

pub mod takedown;

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::backend;
use crate::copy;
use crate::error::ExitCode;
use crate::mount::{self, PinnedDir, RootAttrs};
use crate::plan::{Blocked, MountPlan, Plan, Step};
use crate::progress::Progress;
use crate::spec::size::format_bytes;
use crate::spec::{MountSpec, OnFailure, Spec};
use crate::state::{Record, State};
use crate::sync::seed_window::{self, SeedDeletions};

/// Seeding leaves this share of the tmpfs free for the application.
const SEED_HEADROOM_PCT: u64 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Already as the spec says.
    Unchanged,
    /// Brought to the spec by this run.
    Changed,
    /// Not offloaded: the application runs on its disk directory.
    Degraded,
    /// Offloaded, but a change in the spec could not be applied online.
    Refused,
    /// Failed with `on_failure: fail`; the run stopped here.
    Failed,
    /// Not attempted because an earlier mount failed with `on_failure: fail`.
    Skipped,
}

#[derive(Debug, Clone, Serialize)]
pub struct MountResult {
    pub name: String,
    #[serde(serialize_with = "crate::out::lossy::path")]
    pub path: PathBuf,
    pub result: Outcome,
    pub steps: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seeded: Option<Seeded>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Seeded {
    pub files: u64,
    pub bytes: u64,
    /// Entries that vanished or changed while they were copied: left on disk.
    pub skipped: u64,
    pub seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ApplyReport {
    pub changed: bool,
    pub mounts: Vec<MountResult>,
    /// Host-wide steps done: state directory preparation, leftover clean-up.
    pub host_steps: Vec<String>,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "crate::out::lossy::named_paths"
    )]
    pub orphans: Vec<(String, PathBuf)>,
}

impl ApplyReport {
    pub fn exit_code(&self) -> ExitCode {
        let any = |o: Outcome| self.mounts.iter().any(|m| m.result == o);
        if any(Outcome::Failed) {
            ExitCode::Failed
        } else if any(Outcome::Degraded) || any(Outcome::Refused) {
            ExitCode::Degraded
        } else {
            ExitCode::Ok
        }
    }
}

pub struct ApplyOptions {
    /// Show seeding progress on stderr (a terminal, human output).
    pub progress: bool,
}

pub fn apply(spec: &Spec, plan: &Plan, state: &State, opts: &ApplyOptions) -> Result<ApplyReport> {
    if plan.changes() {
        state.ensure_dirs()?;
    }
    let mut cleanup = Vec::new();
    for step in plan.prepare.iter().chain(&plan.cleanup) {
        // A failed clean-up must not keep the mounts from being applied; a
        // failed preparation shows up again in the mounts that need it.
        match run_step(step, "", state, opts, &mut Vec::new(), &mut None) {
            Ok(_) => cleanup.push(step.describe()),
            Err(e) => cleanup.push(format!("{} FAILED: {e:#}", step.describe())),
        }
        failpoint(step, "");
    }
    let mut results = Vec::new();
    let mut stop = false;
    for (m, mp) in spec.mounts.iter().zip(&plan.mounts) {
        if stop {
            results.push(result(mp, Outcome::Skipped, Vec::new(), None));
            continue;
        }
        // An error outside the steps (the state directory, say) is this
        // mount's failure; the report of the others is kept.
        let r = apply_mount(m, mp, state, opts).unwrap_or_else(|e| {
            let outcome = match m.on_failure {
                OnFailure::KeepDisk => Outcome::Degraded,
                OnFailure::Fail => Outcome::Failed,
            };
            result(mp, outcome, Vec::new(), Some(format!("{e:#}")))
        });
        stop = r.result == Outcome::Failed;
        results.push(r);
    }
    // Devices of mounts rolled back above, or left half-built by a crash.
    match backend::release_unused(state) {
        Ok(released) => {
            for held in &released.held {
                tracing::warn!("{held}");
            }
            cleanup.extend(released.freed);
        }
        Err(e) => cleanup.push(format!("freeing unused devices FAILED: {e:#}")),
    }
    Ok(ApplyReport {
        // A mount that degraded or failed was tried and rolled back: not "no change"
        // to report, whatever steps are left.
        changed: !cleanup.is_empty()
            || results
                .iter()
                .any(|r| !r.steps.is_empty() || matches!(r.result, Outcome::Degraded | Outcome::Failed)),
        mounts: results,
        host_steps: cleanup,
        orphans: plan.orphans.clone(),
    })
}

fn result(mp: &MountPlan, outcome: Outcome, steps: Vec<String>, reason: Option<String>) -> MountResult {
    MountResult {
        name: mp.name.clone(),
        path: mp.path.clone(),
        result: outcome,
        steps,
        reason,
        seeded: None,
    }
}

/// Records that `m` is built as its spec says (see [`Record`]).
fn record_built(state: &State, m: &MountSpec) -> Result<()> {
    state.write_record(&Record {
        name: m.name.clone(),
        path: m.path.clone(),
        persist: m.persist.name(),
        seed: Some(m.seed),
        backend: Some(m.backend),
        applied_at: crate::state::unix_now(),
    })
}

fn apply_mount(m: &MountSpec, mp: &MountPlan, state: &State, opts: &ApplyOptions) -> Result<MountResult> {
    let failed = |reason: String| -> Result<MountResult> {
        let outcome = match m.on_failure {
            OnFailure::KeepDisk => Outcome::Degraded,
            OnFailure::Fail => Outcome::Failed,
        };
        state.set_degraded(&m.name, &reason)?;
        Ok(result(mp, outcome, Vec::new(), Some(reason)))
    };
    match &mp.blocked {
        Some(Blocked::CannotOffload { reason }) => return failed(reason.clone()),
        Some(Blocked::Refused { reason }) => {
            return Ok(result(mp, Outcome::Refused, Vec::new(), Some(reason.clone())))
        }
        None => {}
    }

    // A fresh build is recorded before its first mount: a record a killed `down`
    // left of an earlier build (another seed, say) must never stand for this one,
    // were this `apply` killed before its end (a review helper's probe: `down`
    // then took the tmpfs for an overlay, and failed for good).
    if mp.steps.iter().any(|s| matches!(s, Step::MountStage { .. })) {
        record_built(state, m)?;
    }
    let mut undo = Vec::new();
    let mut done = Vec::new();
    let mut seeded = None;
    let mut baseline = None;
    let mut pinned = None;
    let mut seed_started = None;
    let mut deletions: Option<crate::host::deletions::Deletions> = None;
    let mut seed_deletions = None;
    let mut switched = None;
    let mut unlinked = std::collections::HashSet::new();
    // The seeded tmpfs's root, opened at the stage (root's own directory) before it
    // goes in place: what is done in it after the switch goes through this, never
    // through the managed path, which a user owning a directory above can replace
    // by a symlink (to /etc) the moment the tmpfs is there.
    let mut live_root: Option<std::fs::File> = None;
    for step in &mp.steps {
        let started = Instant::now();
        if let Step::Seed { from, .. } = step {
            // What the application deletes on disk from now on (see `sync::seed_window`).
            seed_deletions = SeedDeletions::watch(from);
            seed_started = Some((copy::baseline::now_after_tick(), Instant::now()));
        }
        if let Step::MoveIntoPlace { stage, .. } = step {
            // The baseline the first write-back merges against: what the disk held
            // when it was copied (but what the disk deleted since), and a time after
            // every copy and before the application can see the tmpfs (its changes
            // come after it).
            let mut b: copy::Baseline = baseline.take().unwrap_or_default();
            let mut dropped = drop_deleted_during_seed(&mut seed_deletions, stage, &b, &m.name);
            // A second look, for the deletions made while the baseline was saved, as
            // close to the switch as can be. What it drops changes the ctimes of other
            // names of the files it removes: the baseline's time is taken, and the
            // baseline saved, again after it.
            for look in 0..2 {
                if look == 1 {
                    dropped = drop_deleted_during_seed(&mut seed_deletions, stage, &b, &m.name);
                    if dropped.is_empty() {
                        break;
                    }
                }
                if !dropped.is_empty() {
                    b = seed_window::forget(&b, &dropped);
                }
                let taken = copy::baseline::now_after_tick();
                b.taken = Some(taken);
                if let Some(w) = deletions.as_mut() {
                    w.since(taken);
                } else if seed_started.is_some() && look == 0 {
                    // What the application deletes in the tmpfs from now on, for the
                    // merge of what it wrote on disk during the seed (see
                    // `sync::seed_window`).
                    deletions = crate::host::deletions::Deletions::watch(stage).ok().map(|mut w| {
                        w.since(taken);
                        w.keep_moves();
                        w
                    });
                }
                if let Err(e) = state.save_baseline(&m.name, &b) {
                    let rollback = roll_back(std::mem::take(&mut undo));
                    let reason = match rollback {
                        Ok(()) => format!("{e:#}"),
                        Err(re) => format!("{e:#}; rollback failed: {re:#}"),
                    };
                    return failed(reason);
                }
            }
            if seed_started.is_some() {
                if let Err(e) = state.mark_seed_merge(&m.name) {
                    tracing::warn!("{}: {e:#}", m.name);
                }
                match std::fs::File::open(stage) {
                    Ok(root) => live_root = Some(root),
                    Err(e) => {
                        let rollback = roll_back(std::mem::take(&mut undo));
                        let reason = format!("opening {}: {e}", stage.display());
                        return failed(match rollback {
                            Ok(()) => reason,
                            Err(re) => format!("{reason}; rollback failed: {re:#}"),
                        });
                    }
                }
            }
            crate::failpoint::hit("before-switch", &m.name);
            switched = Some(b);
        }
        match run_step(step, &m.name, state, opts, &mut undo, &mut pinned) {
            Ok(stats) => {
                if let Some((s, b)) = stats {
                    seeded = Some(Seeded {
                        files: s.files,
                        bytes: s.bytes,
                        skipped: s.skipped,
                        seconds: started.elapsed().as_secs_f64(),
                    });
                    baseline = Some(b);
                }
                done.push(step.describe());
                if let Step::MoveIntoPlace { .. } = step {
                    crate::failpoint::hit("seed-switched", &m.name);
                    // What was deleted on disk between the last look and the switch.
                    if let (Some(mut w), Some(b)) = (seed_deletions.take(), switched.take()) {
                        let taken = b.taken.expect("set before the switch");
                        // Opened without a symlink on the way (a magic link included).
                        if let Err(e) = w.drop_after_switch(&m.path, taken, &b) {
                            tracing::warn!(
                                "{}: dropping what the application deleted on disk during the seed: {e:#}",
                                m.name
                            );
                        }
                        unlinked = w.take_unlinked();
                        let late_drops = w.take_dropped();
                        if !late_drops.is_empty() {
                            forget_in_baseline(state, &m.name, &late_drops);
                        }
                    }
                }
                failpoint(step, &m.name);
            }
            Err(e) => {
                let reason = format!("{}: {e:#}", step.describe());
                if let Step::Remount { .. } | Step::SetRoot { .. } = step {
                    // The live tmpfs stays as it was; nothing to roll back.
                    return Ok(result(mp, Outcome::Refused, done, Some(reason)));
                }
                let rollback = roll_back(undo);
                let reason = match rollback {
                    Ok(()) => reason,
                    Err(re) => format!("{reason}; rollback failed: {re:#}"),
                };
                return failed(reason);
            }
        }
    }

    if state.record(&m.name).is_none() || !mp.steps.is_empty() {
        record_built(state, m)?;
    }
    state.clear_degraded(&m.name)?;
    if let (Some(t0), Some(root)) = (seed_started, &live_root) {
        let live = mount::proc_path(std::os::fd::AsFd::as_fd(root));
        match crate::sync::seed_window::catch_up(m, state, (&live, t0), opts.progress, (deletions, unlinked))
        {
            Ok(_) => {
                if let Err(e) = state.clear_seed_merge(&m.name) {
                    tracing::warn!("{}: {e:#}", m.name);
                }
            }
            // The mount is in place; what stays on disk is kept by the write-back.
            Err(e) => tracing::warn!("{}: {e}", m.name),
        }
    } else if done.is_empty() {
        match PinnedDir::open(&m.path) {
            Ok(live) => crate::sync::seed_window::finish_interrupted(m, state, &live.proc_path()),
            Err(e) => tracing::debug!("{}: {e:#}", m.name),
        }
    }
    let outcome = if done.is_empty() {
        Outcome::Unchanged
    } else {
        Outcome::Changed
    };
    let mut r = result(mp, outcome, done, None);
    r.seeded = seeded;
    Ok(r)
}

/// Drops from the stage what the application deleted on disk after the seed copied it;
/// returns what was dropped, whose records in the seed's baseline no longer hold.
/// A failure leaves those names in RAM until the merge after the switch takes them
/// out by the seed's records: a warning, and no more looks.
fn drop_deleted_during_seed(
    watch: &mut Option<SeedDeletions>,
    stage: &Path,
    seeded: &copy::Baseline,
    name: &str,
) -> seed_window::Dropped {
    let Some(w) = watch.as_mut() else {
        return seed_window::Dropped::default();
    };
    match w.drop_deleted(stage, seeded) {
        Ok(0) => {}
        Ok(n) => {
            tracing::debug!("{name}: dropped {n} entries the application deleted on disk during the seed")
        }
        Err(e) => {
            tracing::warn!("{name}: dropping what the application deleted on disk during the seed: {e:#}");
            let dropped = w.take_dropped();
            *watch = None;
            return dropped;
        }
    }
    w.take_dropped()
}

/// Takes out of the saved baseline of `name` its records of `dropped` (the seed's
/// copies of what the disk deleted, dropped after the baseline was saved). Failing
/// that, a name the application makes again in RAM may count as one the disk deleted
/// later, and not be written back: a warning.
fn forget_in_baseline(state: &State, name: &str, dropped: &seed_window::Dropped) {
    let forgotten = state
        .baseline(name)
        .and_then(|b| state.save_baseline(name, &seed_window::forget(&b, dropped)));
    if let Err(e) = forgotten {
        tracing::warn!("{name}: forgetting the seed's records of what the disk deleted during it: {e:#}");
    }
}

/// What to undo when a later step of the same mount fails.
enum Undo {
    Detach(PathBuf),
}

fn roll_back(undo: Vec<Undo>) -> Result<()> {
    let mut first_err = None;
    for u in undo.into_iter().rev() {
        let Undo::Detach(p) = u;
        if let Err(e) = mount::detach(&p) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// The managed directory, opened once without following symlinks: every
/// later step of the mount acts on that directory, not on whatever the path
/// names by then.
fn pin<'a>(pinned: &'a mut Option<PinnedDir>, path: &Path) -> Result<&'a PinnedDir> {
    if pinned.is_none() {
        *pinned = Some(PinnedDir::open(path)?);
    }
    Ok(pinned.as_ref().expect("set just above"))
}

/// Runs one step that stands alone (the agent's resize): no seed, nothing
/// to roll back.
pub fn run_alone(step: &Step, name: &str, state: &State) -> Result<()> {
    run_step(
        step,
        name,
        state,
        &ApplyOptions { progress: false },
        &mut Vec::new(),
        &mut None,
    )
    .map(|_| ())
}

fn run_step(
    step: &Step,
    name: &str,
    state: &State,
    opts: &ApplyOptions,
    undo: &mut Vec<Undo>,
    pinned: &mut Option<PinnedDir>,
) -> Result<Option<(copy::CopyStats, copy::Baseline)>> {
    match step {
        Step::DetachStage { stage } => mount::detach(stage)?,
        Step::DetachSide { side } => mount::detach_all(side)?,
        Step::RemoveLeftover { path, mounted } => {
            if *mounted {
                mount::detach(path)?;
            }
            remove_empty_dir(path)?;
        }
        Step::PrivateStateDir { dir, mounted } => {
            if *mounted {
                mount::make_private(dir)?;
            } else {
                mount::ensure_mount_point(dir)?;
                mount::bind_private(dir, dir)?;
            }
        }
        Step::PrivateSide { side } => mount::make_private(side)?,
        Step::RestoreSide { path, side, scratch } => restore_side(path, name, side, scratch)?,
        Step::CreateDir { path, root } => {
            create_dir(path)?;
            set_root(&pin(pinned, path)?.proc_path(), *root)?;
        }
        Step::BindSide { path, side } => {
            mount::ensure_mount_point(side)?;
            mount::bind_private(&pin(pinned, path)?.proc_path(), side)?;
            undo.push(Undo::Detach(side.clone()));
        }
        Step::MountStage {
            source,
            stage,
            options,
        } => {
            mount::ensure_mount_point(stage)?;
            backend::mount(source, stage, options, state)?;
            undo.push(Undo::Detach(stage.clone()));
        }
        Step::Seed { from, to } => return seed(from, to, name, state, opts).map(Some),
        Step::MountOverlay {
            source,
            lower,
            stage,
            path,
            root,
            flags,
        } => {
            let upper = stage.join(backend::overlay::UPPER);
            create_dir(&upper)?;
            set_root(&upper, *root)?;
            backend::overlay::mount(source, &pin(pinned, path)?.proc_path(), lower, stage, *flags)?;
            // The overlay is in place: a later failure must tear down neither it
            // nor the tmpfs its upper layer is on.
            undo.retain(|Undo::Detach(p)| p != stage);
        }
        Step::MoveIntoPlace { stage, path } => {
            mount::move_mount(stage, &pin(pinned, path)?.proc_path())?;
            // The tmpfs is in place; a later failure must not tear it down.
            undo.retain(|Undo::Detach(p)| p != stage);
        }
        Step::Remount { path, options, .. } => {
            backend::remount(&backend::own_mount(path, name)?.proc_path(), options).map_err(|e| {
                let hint = if e == nix::errno::Errno::EINVAL {
                    " (the kernel refused; for a shrink, usage may have grown past the new size)"
                } else {
                    ""
                };
                anyhow::anyhow!("remount failed: {e}{hint}")
            })?
        }
        Step::SetRoot { path, to, .. } => set_root(&pin(pinned, path)?.proc_path(), *to)?,
    }
    Ok(None)
}

fn seed(
    from: &Path,
    to: &Path,
    name: &str,
    state: &State,
    opts: &ApplyOptions,
) -> Result<(copy::CopyStats, copy::Baseline)> {
    let need = copy::measure(from).with_context(|| format!("measuring {}", from.display()))?;
    let room = crate::host::usage::Usage::of(to)?;
    // A filesystem that compresses what it stores (fs: btrfs on zram) holds
    // more than its size, by a ratio only the copy finds out; one that makes
    // its inodes as needed reports none. Past what they hold, ENOSPC says it.
    let compresses = nix::sys::statfs::statfs(to).is_ok_and(|s| crate::host::usage::compresses(&s));
    let fit_bytes = room.size / 100 * (100 - SEED_HEADROOM_PCT);
    let fit_inodes = room.inodes / 100 * (100 - SEED_HEADROOM_PCT);
    if (!compresses && need.allocated > fit_bytes) || (room.inodes > 0 && need.inodes > fit_inodes) {
        bail!(
            "the on-disk contents ({}, {}) do not fit into {} / {} with {SEED_HEADROOM_PCT}% headroom; raise `size`/`inodes` or use `seed: empty`",
            format_bytes(need.allocated),
            crate::plural::count(need.inodes, "file", "files"),
            format_bytes(room.size),
            crate::plural::count(room.inodes, "inode", "inodes")
        );
    }
    let mut shown = Progress::new(
        state,
        name,
        "seed",
        opts.progress,
        Some(need.inodes),
        Some(need.apparent),
    );
    let mut progress =
        |s: &copy::CopyStats| shown.update(s.files + s.dirs + s.symlinks + s.specials, s.bytes);
    let stats = copy::seed_tree(from, to, Some(&mut progress)).map_err(|e| {
        let no_space = e.is_no_space();
        let err = anyhow::Error::new(e);
        if no_space {
            err.context(format!(
                "the {} filled up while seeding {} of data{}; raise `size` or use `seed: empty`",
                if compresses { "filesystem" } else { "tmpfs" },
                format_bytes(need.apparent),
                if compresses { ", compressed" } else { "" }
            ))
        } else {
            err
        }
    });
    drop(shown);
    stats
}

/// See `Step::RestoreSide`. The scratch bind is private before anything is
/// taken from it, and is gone afterwards (a leftover after a crash).
///
/// The parent is opened without following a symlink and must hold a mount at the
/// managed path's name; the directory under it is opened the same way. By name, a
/// user owning a directory above the path could swap in a symlink, and the side,
/// bound to where it led (/etc), took every later write-back there.
fn restore_side(path: &Path, name: &str, side: &Path, scratch: &Path) -> Result<()> {
    let parent = PinnedDir::open(path.parent().unwrap_or(Path::new("/")))?;
    let base = path
        .file_name()
        .context("the managed path has a last component")?;
    let on_it = mount::PinnedMount::id_at(&parent, base)
        .with_context(|| format!("finding the mount of {}", path.display()))?;
    backend::is_own_mount(on_it, name, path)?;
    mount::ensure_mount_point(scratch)?;
    mount::bind_private(&parent.proc_path(), scratch)?;
    let result = PinnedDir::open(&scratch.join(base)).and_then(|under| {
        mount::ensure_mount_point(side)?;
        mount::bind_private(&under.proc_path(), side)
    });
    mount::detach(scratch)?;
    remove_empty_dir(scratch)?;
    result
}

fn create_dir(path: &Path) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    match std::fs::create_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(e).with_context(|| format!("creating {}", path.display()))
        }
        _ => {}
    }
    Ok(())
}

/// `path` is a pinned directory's /proc magic link (never a symlink to follow).
fn set_root(path: &Path, a: RootAttrs) -> Result<()> {
    std::os::unix::fs::chown(path, Some(a.uid), Some(a.gid))
        .with_context(|| format!("chown {}:{} {}", a.uid, a.gid, path.display()))?;
    // After chown, which clears setuid/setgid bits.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(a.mode))
        .with_context(|| format!("chmod {:04o} {}", a.mode, path.display()))
}

fn remove_empty_dir(path: &Path) -> Result<()> {
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// Crash point after `step` (see [`crate::failpoint`]).
fn failpoint(step: &Step, name: &str) {
    if std::env::var_os("TMPFSCTL_FAILPOINT").is_none() {
        return;
    }
    let action = serde_json::to_value(step)
        .ok()
        .and_then(|v| v.get("action").and_then(|a| a.as_str().map(str::to_string)))
        .unwrap_or_default();
    crate::failpoint::hit(&format!("after-{action}"), name);
}
