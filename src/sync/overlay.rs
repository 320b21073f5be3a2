//! The write-back of `seed: overlay` mounts: the upper layer on the tmpfs at
//! `STATE/stage/NAME` merged into the disk directory ([`copy::overlay`]).
//!
//! While the overlay is mounted nobody but the merge writes to the disk
//! directory, so `sync` merges everything. `down` does that first, while the
//! application still works on the overlay, then switches it to the disk
//! directory (the overlay is held at `STATE/held/NAME`, as a tmpfs is), then
//! merges what changed in between: only upper entries changed since the first
//! pass began, and never over what the application changed or deleted on disk
//! since the switch (its later change wins; deletions are told by the same
//! fanotify watch the other write-back uses). The time of the switch is kept in
//! the tmpfs itself, so a retry after a failure or a crash knows it.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result};

use super::{SyncOutcome, SyncResult};
use crate::backend::overlay::UPPER;
use crate::copy::baseline::{now_after_tick, Time};
use crate::copy::overlay::{merge_upper, OverlayStats, Window};
use crate::copy::{DiskDeletions, SyncStats};
use crate::spec::MountSpec;
use crate::state::{State, SyncRecord};

/// The record of the switch, in the tmpfs beside the upper and work directories.
const SWITCHED: &str = "switched";

/// One pass of the upper layer on the tmpfs at `stage` into the disk
/// directory, recorded for `status` as every write-back is. `merged`: where
/// the overlay is mounted, if it is.
pub fn pass(
    m: &MountSpec,
    merged: Option<&Path>,
    stage: &Path,
    state: &State,
    window: Window,
    deletions: Option<&Mutex<dyn DiskDeletions + Send>>,
    by: &str,
) -> Result<SyncResult> {
    let started = Instant::now();
    let mut deleted = |dir: &Path, name: &OsStr| -> bool {
        let Some(d) = deletions else {
            return false;
        };
        let (Ok(f), Ok(c)) = (File::open(dir), CString::new(name.as_bytes())) else {
            return false;
        };
        let mut d = d.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        d.deleted(f.as_fd(), &c).is_some()
    };
    let res = merge_upper(
        &stage.join(UPPER),
        &state.side(&m.name),
        merged,
        window,
        &mut deleted,
    )
    .with_context(|| format!("writing the upper layer of `{}` back", m.name));
    let seconds = started.elapsed().as_secs_f64();
    let stats = res.as_ref().ok().map(sync_stats);
    let reason = res.as_ref().err().map(|e| format!("{e:#}"));
    let st = stats.clone().unwrap_or_default();
    state.write_sync(
        &m.name,
        &SyncRecord {
            by: by.to_string(),
            at: crate::state::unix_now(),
            seconds,
            ok: res.is_ok(),
            error: reason.clone(),
            files_written: st.files_written,
            bytes_written: st.bytes_written,
            deleted: st.deleted,
        },
    )?;
    Ok(SyncResult {
        name: m.name.clone(),
        path: m.path.clone(),
        result: if res.is_ok() {
            SyncOutcome::Synced
        } else {
            SyncOutcome::Failed
        },
        reason,
        stats,
        whole_tree: None,
        seconds,
    })
}

fn sync_stats(s: &OverlayStats) -> SyncStats {
    SyncStats {
        files_written: s.written,
        bytes_written: s.bytes,
        deleted: s.removed,
        dirs_created: s.dirs,
        unchanged: s.unchanged,
        kept_disk: s.kept_disk,
        ..SyncStats::default()
    }
}

/// Records, just before the switch, that the application is on its disk
/// directory from now on, and when the pass before it began (`first_pass`).
pub fn mark_switch(stage: &Path, first_pass: Time) -> Result<()> {
    let t = now_after_tick();
    let text = format!("{} {} {} {}\n", first_pass.0, first_pass.1, t.0, t.1);
    crate::state::write_atomic(&stage.join(SWITCHED), text.as_bytes())
}

/// The window of the pass after the switch: upper entries changed since the
/// first pass began, never over the application's disk changes since the
/// switch. Without a record (the overlay went away some other way) every
/// upper entry is written, and the disk's changes from now on win.
pub fn after_switch(stage: &Path) -> Window {
    let recorded = std::fs::read_to_string(stage.join(SWITCHED))
        .ok()
        .and_then(|text| {
            let v: Vec<i64> = text
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            match v[..] {
                [a, b, c, d] => Some(((a, b), (c, d))),
                _ => None,
            }
        });
    match recorded {
        Some((first, switched)) => Window {
            upper_since: Some(first),
            disk_since: Some(switched),
        },
        None => Window {
            upper_since: None,
            disk_since: Some(now_after_tick()),
        },
    }
}
