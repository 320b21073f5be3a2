//! `seed: overlay`: an overlayfs at the managed path whose lower layer is the
//! disk directory (through the side bind) and whose upper and work directories
//! are on the mount's tmpfs (or zram device), which stays at the staging point
//! `STATE/stage/NAME` (root-only, private) for as long as the overlay lives.
//! Both mounts carry the source `tmpfsctl-NAME`; the overlay is the one the
//! application sees. See docs/overlay.md.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{tmpfs, zram, Live};
use crate::host::mountinfo::{MountEntry, MountTable};
use crate::host::usage::Usage;
use crate::mount::RootAttrs;
use crate::spec::{Flags, MountSpec};

pub const FSTYPE: &str = "overlay";
/// The upper and work directories inside the tmpfs.
pub const UPPER: &str = "upper";
pub const WORK: &str = "work";

/// Everything a redirect, a metacopy or an index would put into the upper
/// layer is off: the upper layer then holds whole files, whiteouts and opaque
/// directories only, which is what the write-back merges (a renamed lower
/// directory is copied by `mv`, which gets EXDEV).
pub const FEATURES: &str = "index=off,metacopy=off,redirect_dir=off,xino=off,nfs_export=off";

/// The overlay's mount data.
pub fn data(lower: &Path, stage: &Path) -> String {
    format!(
        "lowerdir={},upperdir={},workdir={},{FEATURES}",
        lower.display(),
        stage.join(UPPER).display(),
        stage.join(WORK).display()
    )
}

/// Mounts the overlay of `lower` and the tmpfs at `stage` (which must hold
/// the upper directory, with the root's owner and mode) at `target`.
pub fn mount(source: &str, target: &Path, lower: &Path, stage: &Path, flags: Flags) -> anyhow::Result<()> {
    let work = stage.join(WORK);
    match std::fs::create_dir(&work) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(anyhow::Error::new(e).context(format!("creating {}", work.display())))
        }
        _ => {}
    }
    crate::mount::mount_fs(
        source,
        target,
        FSTYPE,
        super::ms_flags(flags),
        &data(lower, stage),
    )
}

pub fn is_ours(e: &MountEntry, source: &str) -> bool {
    e.fstype == FSTYPE && e.source == source
}

/// A live overlay of ours, and the mount its upper layer is on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveOverlay {
    pub dev: (u32, u32),
    pub flags: Flags,
    pub root: RootAttrs,
    /// Where the tmpfs (or zram device) holding the upper layer is mounted.
    pub stage: PathBuf,
    /// That mount: a tmpfs or a zram device, never an overlay.
    pub upper: Box<Live>,
}

impl LiveOverlay {
    /// Reads the overlay `e` at `path`, and its tmpfs from the mount table.
    pub fn read(e: &MountEntry, path: &Path) -> Option<LiveOverlay> {
        let stage = PathBuf::from(e.super_option("upperdir")?).parent()?.to_path_buf();
        let table = MountTable::read(Path::new("/proc/self/mountinfo")).ok()?;
        let t = table
            .top_at(&stage)
            .filter(|t| tmpfs::is_ours(t, &e.source) || zram::is_ours(t, &e.source))?;
        Some(LiveOverlay {
            dev: e.dev,
            flags: super::flags_of(e),
            root: RootAttrs::of(path).ok()?,
            upper: Box::new(Live::read(t, &stage)?),
            stage,
        })
    }

    /// The RAM the upper layer takes: its mount's usage.
    pub fn usage(&self) -> Usage {
        self.upper.usage()
    }
}

/// An overlay is rebuilt, never changed online: its tmpfs is not at the path,
/// so a remount there would change the overlay, and a new option for the
/// tmpfs would have to be remounted at the staging point. Until that is
/// done, any change is refused with the way to make it (and what the upper
/// layer's backend refuses in any case, such as a zram device's new size).
pub fn online(m: &MountSpec, live: &LiveOverlay, page_size: u64) -> Result<(), String> {
    let mut changes = match live.upper.online(m, live.upper.root(), page_size)? {
        Some((_, c)) => c,
        None => Vec::new(),
    };
    // The mount under an overlay carries the spec's flags too, but only the
    // overlay's are the application's.
    changes.retain(|c| ["size", "nr_inodes", "huge"].contains(&c.what));
    changes.extend(super::flag_changes(live.flags, m.flags));
    if changes.is_empty() {
        return Ok(());
    }
    let c: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
    Err(format!(
        "an overlay mount is not changed online yet ({}); run `tmpfsctl down {}` (which writes it back) then `apply`",
        c.join(", "),
        m.name
    ))
}
