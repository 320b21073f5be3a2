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
//! A persisted mount into which anything was brought then gets a write-back at
//! once, so that its baseline knows the names brought in: without it, one the
//! application deletes in RAM would be the disk's own again at the next write-back.

use std::sync::Mutex;
use std::time::Instant;

use crate::copy::baseline::Time;
use crate::copy::{self, Baseline, DiskDeletions, Merge, SyncStats};
use crate::host::deletions::Deletions;
use crate::progress::Progress;
use crate::spec::{MountSpec, Persist};
use crate::state::State;

/// Merges what changed in the disk directory of `m` since `seed_started` into its
/// tmpfs, now at its path; `watch`: the application's deletions in the tmpfs since
/// it became visible. Then, for a persisted mount, a write-back.
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
    let brought_in =
        st.files_written + st.metadata_updated + st.dirs_created + st.links_written + st.specials_written;
    // Nothing brought in: the seed's records already stand for all the tmpfs holds.
    if m.persist != Persist::None && brought_in > 0 {
        let synced = super::sync_one(m, &m.path, state, None, "apply", true)
            .map_err(|e| format!("the write-back after the seed: {e:#}"))?;
        if let Some(reason) = synced.reason {
            return Err(format!("the write-back after the seed: {reason}"));
        }
    }
    Ok(merged.stats)
}
