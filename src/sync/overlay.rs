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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result};

use super::{SyncOutcome, SyncResult};
use crate::backend::overlay::UPPER;
use crate::copy::baseline::{now_after_tick, Time};
use crate::copy::overlay::{merge_upper, AppOnDisk, OverlayStats, Window};
use crate::copy::{self, DiskDeletions, Placings, SyncStats};
use crate::host::mountinfo::MountTable;
use crate::spec::MountSpec;
use crate::state::{State, SyncRecord};

/// The record of the switch, in the tmpfs beside the upper and work directories.
const SWITCHED: &str = "switched";
/// The same record as an attribute of the tmpfs root, which needs neither a free
/// inode nor a block there: an upper layer that filled its tmpfs is when an eviction
/// or a `down` comes.
const SWITCHED_ATTR: &std::ffi::CStr = c"trusted.tmpfsctl.switched";

/// Set once a pass after the switch merged the whole upper layer: the overlay is
/// released next, and what is left of the tmpfs (a crash before it is unmounted)
/// holds nothing more to write. A pass then would bring back what the application
/// deleted on disk since, which no watch follows any more.
const MERGED: &str = "merged";
const MERGED_ATTR: &std::ffi::CStr = c"trusted.tmpfsctl.merged";

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
    if merged_already(stage) {
        tracing::info!(
            "{}: the upper layer was merged after the switch already; nothing to write",
            m.name
        );
        return Ok(SyncResult {
            name: m.name.clone(),
            path: m.path.clone(),
            result: SyncOutcome::Synced,
            reason: None,
            stats: Some(SyncStats::default()),
            whole_tree: None,
            seconds: 0.0,
        });
    }
    let res = placings(state, &m.name, window)
        .and_then(|mut placed| {
            merge_upper(
                &stage.join(UPPER),
                &state.side(&m.name),
                merged,
                window,
                &mut Watched(deletions),
                &mut placed,
            )
        })
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

/// The record of what the passes after the switch placed on disk themselves
/// ([`Placings`]), in the records area; none before the switch, when nobody else
/// writes there.
fn placings(state: &State, name: &str, window: Window) -> Result<Placings> {
    let Some(switched) = window.disk_since else {
        return Ok(Placings::none());
    };
    state.ensure_run_dir()?;
    let path = state.placings_path(name);
    Placings::open(&path, switched).with_context(|| format!("opening {}", path.display()))
}

/// What the application did on disk, as the deletion watch saw it (none without one).
struct Watched<'a>(Option<&'a Mutex<dyn DiskDeletions + Send>>);

impl Watched<'_> {
    fn lock(&self) -> Option<std::sync::MutexGuard<'_, dyn DiskDeletions + Send + 'static>> {
        self.0
            .map(|d| d.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

impl AppOnDisk for Watched<'_> {
    fn deleted(&mut self, dir: &Path, name: &OsStr) -> bool {
        let (Ok(f), Ok(c)) = (File::open(dir), CString::new(name.as_bytes())) else {
            return false;
        };
        self.lock()
            .is_some_and(|mut d| d.deleted(f.as_fd(), &c).is_some())
    }

    fn moved_here(&mut self, dir: BorrowedFd<'_>) -> bool {
        self.lock().is_some_and(|mut d| d.moved_here(dir))
    }

    fn gone_dirs(&mut self, dir: &Path, above: &[Vec<u8>], name: &OsStr) -> Vec<Vec<u8>> {
        let (Ok(f), Ok(c)) = (File::open(dir), CString::new(name.as_bytes())) else {
            return Vec::new();
        };
        let Some(mut d) = self.lock() else {
            return Vec::new();
        };
        let mut keys = d.gone_dirs(Ok(f.as_fd()), &c);
        for key in above {
            keys.extend(d.gone_dirs(Err(key), &c));
            // Moved away with the directory above it (`mv P P.old; mkdir -p P/D`).
            keys.extend(crate::host::deletions::moved_child(f.as_fd(), key, &c));
        }
        keys
    }

    fn deleted_in(&mut self, dir: &Path, gone: &[u8], name: &OsStr, since: Time, moved: bool) -> bool {
        let (Ok(f), Ok(c)) = (File::open(dir), CString::new(name.as_bytes())) else {
            return false;
        };
        // Held by the moved directory from before the switch (born then): it left
        // with it, whatever the application did to it since (a change of it is
        // the application's, and a review helper's probes brought the RAM's old
        // version back beside it when that counted). One made there since, by the
        // application or by this pass through the directory's new path, is
        // another file. Without birth times, one whose ctime is before the switch.
        let held_before = |moved: std::os::fd::OwnedFd| match copy::born(moved.as_fd(), &c) {
            Some(born) => born < since,
            None => nix::sys::stat::fstatat(&moved, c.as_c_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok_and(|st| (st.st_ctime, st.st_ctime_nsec) < since),
        };
        self.lock().is_some_and(|mut d| d.deleted_in(gone, &c).is_some())
            || (moved && crate::host::deletions::open_moved(f.as_fd(), gone).is_some_and(held_before))
    }
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

/// Writes back an upper layer whose overlay went away (unmounted by hand, or
/// a crash after the overlay's unmount): its tmpfs is still at the staging
/// point, and its writes are not on disk yet. `None` when there is none.
/// Only through a side bind that leads to the disk directory.
pub fn rescue(m: &MountSpec, table: &MountTable, state: &State, by: &str) -> Result<Option<SyncResult>> {
    let stage = state.stage(&m.name);
    let Some(tmpfs) = table
        .top_at(&stage)
        .filter(|e| crate::backend::is_ours(e, &m.source()))
    else {
        return Ok(None);
    };
    let has_entries = std::fs::read_dir(stage.join(UPPER)).is_ok_and(|mut d| d.next().is_some());
    if !has_entries {
        return Ok(None);
    }
    if !crate::observe::side_reaches_disk(table, tmpfs.dev, &state.side(&m.name)) {
        return Ok(Some(SyncResult {
            name: m.name.clone(),
            path: m.path.clone(),
            result: SyncOutcome::Failed,
            reason: Some(format!(
                "{} holds writes of `{}` not yet on disk, and the disk directory is not reachable at {}",
                stage.display(),
                m.name,
                state.side(&m.name).display()
            )),
            stats: None,
            whole_tree: None,
            seconds: 0.0,
        }));
    }
    pass(m, None, &stage, state, after_switch(&stage)?, None, by).map(Some)
}

/// Records that a pass after the switch merged the whole upper layer (see
/// [`MERGED`]).
pub fn mark_merged(stage: &Path) -> Result<()> {
    let on_root = File::open(stage).and_then(|root| copy::set_attr(root.as_fd(), MERGED_ATTR, b"1"));
    match on_root {
        Ok(()) => Ok(()),
        Err(_) => crate::state::write_atomic(&stage.join(MERGED), b"1\n"),
    }
}

fn merged_already(stage: &Path) -> bool {
    File::open(stage).is_ok_and(|root| copy::get_attr(root.as_fd(), MERGED_ATTR).is_ok())
        || stage.join(MERGED).exists()
}

/// Records, just before the switch, that the application is on its disk
/// directory from now on, and when the pass before it began (`first_pass`).
pub fn mark_switch(stage: &Path, first_pass: Time) -> Result<()> {
    let t = now_after_tick();
    let text = format!("{} {} {} {}\n", first_pass.0, first_pass.1, t.0, t.1);
    let on_root =
        File::open(stage).and_then(|root| copy::set_attr(root.as_fd(), SWITCHED_ATTR, text.as_bytes()));
    match on_root {
        Ok(()) => Ok(()),
        // A filesystem without such attributes: a file.
        Err(_) => crate::state::write_atomic(&stage.join(SWITCHED), text.as_bytes()),
    }
}

/// The window of the pass after the switch: upper entries changed since the
/// first pass began, never over the application's disk changes since the
/// switch. Without a record (the overlay went away some other way) every upper
/// entry is written, and a disk entry changed after the upper layer's last
/// change is the application's later one.
pub fn after_switch(stage: &Path) -> Result<Window> {
    let recorded = File::open(stage)
        .and_then(|root| copy::get_attr(root.as_fd(), SWITCHED_ATTR))
        .ok()
        .and_then(|v| String::from_utf8(v).ok())
        .or_else(|| std::fs::read_to_string(stage.join(SWITCHED)).ok())
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
    Ok(match recorded {
        Some((first, switched)) => Window {
            upper_since: Some(first),
            disk_since: Some(switched),
        },
        None => {
            let (s, ns) = latest_ctime(&stage.join(UPPER))?;
            Window {
                upper_since: None,
                disk_since: Some(if ns == 999_999_999 {
                    (s + 1, 0)
                } else {
                    (s, ns + 1)
                }),
            }
        }
    })
}

/// The latest ctime in the tree at `dir`, walked by descriptors without following
/// a symlink (the application changes the upper layer through the overlay), with a
/// stack of its own (the tree may be deeper than the thread's would allow).
fn latest_ctime(dir: &Path) -> Result<Time> {
    use std::os::unix::fs::MetadataExt;
    let ctime = |md: &std::fs::Metadata| (md.ctime(), md.ctime_nsec());
    let root = open_nofollow(dir, dir)?;
    let mut latest = ctime(
        &root
            .metadata()
            .with_context(|| format!("stat {}", dir.display()))?,
    );
    let mut stack = vec![(root, dir.to_path_buf())];
    while let Some((held, shown)) = stack.pop() {
        let via = Path::new("/proc/self/fd").join(held.as_raw_fd().to_string());
        for e in std::fs::read_dir(&via).with_context(|| format!("listing {}", shown.display()))? {
            let name = e
                .with_context(|| format!("listing {}", shown.display()))?
                .file_name();
            let (p, shown) = (via.join(&name), shown.join(&name));
            let md = match std::fs::symlink_metadata(&p) {
                Ok(md) => md,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("stat {}", shown.display())),
            };
            latest = latest.max(ctime(&md));
            if md.is_dir() {
                stack.push((open_nofollow(&p, &shown)?, shown));
            }
        }
    }
    Ok(latest)
}

fn open_nofollow(p: &Path, shown: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(p)
        .with_context(|| format!("opening {}", shown.display()))
}
