//! What the application wrote on disk while `apply` seeded, brought into the tmpfs
//! once it is in place.
//!
//! The seed copies the disk directory while the application still works in it. What
//! it writes into a directory the seed has copied already misses the copy: hidden
//! under the tmpfs, the application does not see it, and the write-back keeps the
//! disk's version as the disk's own, even after the application wrote that name in
//! RAM and deleted it again (a deletion undone). So once the tmpfs is in place and
//! the disk directory is reached only through the side bind, the write-back's own
//! merge runs the other way, disk into tmpfs, with no record to go by: of a name
//! both sides have, the side that changed it later wins (the disk's change made
//! during the seed against the copy made before it; the application's change in RAM
//! since against both), and a name only the disk has is copied in, unless the
//! application deleted it in the tmpfs meanwhile (the deletion watch started before
//! the tmpfs became visible). A name the disk deleted during the seed stays in the
//! tmpfs: with no record the merge deletes nothing, and the write-back later lets
//! the disk's deletion stand.
//!
//! The write-back's baseline then records, as both sides agreed on them, the disk's
//! entries the merge saw that the seed did not record as they are: without that, a
//! name brought in and then deleted (or renamed away) by the application in RAM would
//! be the disk's own to the next write-back, which keeps it.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Context;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{self, FileStat};

use crate::copy::baseline::{Mark, Sig, Time};
use crate::copy::{self, Baseline, DiskDeletions, Merge, SyncStats};
use crate::host::deletions::Deletions;
use crate::progress::Progress;
use crate::spec::MountSpec;
use crate::state::State;

/// Merges what changed in the disk directory of `m` since `seed_started` into its
/// tmpfs, now at its path; `watch`: the application's deletions in the tmpfs since
/// it became visible. Then records what it brought in (see [`record_brought_in`]).
///
/// `began`: when the seed began, from which a long seed and this merge together report
/// their progress (`terminal`: as [`Progress::new`] takes it).
pub fn catch_up(
    m: &MountSpec,
    state: &State,
    (seed_started, began): (Time, Instant),
    terminal: bool,
    watch: Option<Deletions>,
) -> Result<SyncStats, String> {
    let base = Baseline {
        taken: Some(seed_started),
        ..Baseline::none()
    };
    let watch = watch.map(Mutex::new);
    let mut shown = Progress::new(state, &m.name, "seed", terminal, None, None).begun_at(began);
    let mut progress = |s: &SyncStats| shown.update(s.compared(), s.bytes_written);
    let merged = copy::sync_tree(
        &state.side(&m.name),
        &m.path,
        Merge {
            base: &base,
            journal: None,
            deletions: watch.as_ref().map(|w| w as &Mutex<dyn DiskDeletions + Send>),
            dirty: None,
        },
        Some(&mut progress),
    )
    .map_err(|e| format!("bringing in what the application wrote on disk during the seed: {e}"))?;
    drop(shown);
    let st = &merged.stats;
    let wrote =
        st.files_written + st.metadata_updated + st.dirs_created + st.links_written + st.specials_written;
    let deleted_in_ram = merged
        .baseline
        .marks
        .iter()
        .any(|(_, m)| matches!(m, Mark::Deleted(_)));
    // Otherwise the seed's records stand: the tmpfs holds what it copied and the
    // application's own changes since, which the write-back takes as such.
    if wrote > 0 || deleted_in_ram {
        record_brought_in(m, state, &merged.baseline)
            .map_err(|e| format!("recording what the seed missed: {e:#}"))?;
    }
    Ok(merged.stats)
}

/// Adds to the seed's baseline of `m` every disk entry among `seen` (the paths the
/// merge walked) that it lacks or records otherwise, as it is on disk now: the
/// version the merge compared. The disk directory is hidden under the tmpfs, so
/// nothing changes it meanwhile.
fn record_brought_in(m: &MountSpec, state: &State, seen: &Baseline) -> anyhow::Result<()> {
    let side = state.side(&m.name);
    let root = std::fs::File::open(&side).with_context(|| format!("opening {}", side.display()))?;
    let mut base = state.baseline(&m.name)?;
    let mut added = 0u64;
    for (path, _) in seen.marks.iter() {
        let Ok(st) = stat_beneath(root.as_fd(), path) else {
            continue;
        };
        let sig = Sig::of(&st);
        if base.get(path) != Some(Mark::Entry(sig)) {
            base.marks.insert(path, Mark::Entry(sig));
            added += 1;
        }
    }
    if added > 0 {
        state.save_baseline(&m.name, &base)?;
    }
    Ok(())
}

/// `path` below `root`, not through a symlink: the application may have made one.
fn stat_beneath(root: BorrowedFd<'_>, path: &[u8]) -> nix::Result<FileStat> {
    let fd = openat2(
        root,
        Path::new(OsStr::from_bytes(path)),
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS),
    )?;
    stat::fstat(&fd)
}
