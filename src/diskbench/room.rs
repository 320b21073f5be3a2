//! The preconditions: DIR on a disk, with room for the files, and RAM for
//! the tmpfs; gathered from the host, judged purely.

use std::path::Path;

use anyhow::{Context, Result};
use nix::sys::statfs::{statfs, TMPFS_MAGIC};
use nix::sys::statvfs::statvfs;

use super::{DISK_MARGIN, RAMFS_MAGIC, RAM_MARGIN, SMALL_FILE, SMALL_FILES_FSYNC, SMALL_FILES_NOSYNC};
use crate::host::Host;
use crate::spec::size::format_bytes;

/// What the preconditions look at.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRoom {
    pub on_tmpfs: Option<&'static str>,
    pub disk_free: u64,
    /// Free inodes; `None` when the filesystem does not report them.
    pub disk_inodes_free: Option<u64>,
    pub mem_available: u64,
}

/// Every reason to refuse, each a full sentence; empty when the run may go.
pub fn refusals(dir: &Path, size: u64, room: &HostRoom) -> Vec<String> {
    let mut why = Vec::new();
    let d = dir.display();
    if let Some(fs) = room.on_tmpfs {
        why.push(format!(
            "{d} is on {fs}: that would compare tmpfs with tmpfs; give --disk a directory on the disk \
             the cache lives on now (e.g. /var/tmp or the cache's parent)"
        ));
    }
    let need_disk = 2 * size + DISK_MARGIN;
    if room.disk_free < need_disk {
        why.push(format!(
            "{d} has {} free; the benchmark needs {} there (2 × --size {} + {} margin); \
             use a smaller --size or another directory",
            format_bytes(room.disk_free),
            format_bytes(need_disk),
            format_bytes(size),
            format_bytes(DISK_MARGIN)
        ));
    }
    let need_inodes = small_counts(size).0 + 1000;
    if let Some(free) = room.disk_inodes_free {
        if free < need_inodes {
            why.push(format!(
                "{d} has {free} free inodes; the small-file test needs {need_inodes}"
            ));
        }
    }
    let need_ram = 2 * size + RAM_MARGIN;
    if room.mem_available < need_ram {
        why.push(format!(
            "MemAvailable is {}; the temporary tmpfs needs {} (2 × --size {} + {} margin); use a smaller --size",
            format_bytes(room.mem_available),
            format_bytes(need_ram),
            format_bytes(size),
            format_bytes(RAM_MARGIN)
        ));
    }
    why
}

/// Small files created (without fsync, with fsync): bounded by the counts
/// above and by --size, so their data never exceeds --size.
pub fn small_counts(size: u64) -> (u64, u64) {
    let by_size = size / SMALL_FILE as u64;
    (SMALL_FILES_NOSYNC.min(by_size), SMALL_FILES_FSYNC.min(by_size))
}

pub(super) fn host_room(dir: &Path, host: &Host) -> Result<HostRoom> {
    let sf = statfs(dir).with_context(|| format!("statfs {}", dir.display()))?;
    let on_tmpfs = match sf.filesystem_type() {
        t if t == TMPFS_MAGIC => Some("tmpfs"),
        t if (t.0 as u64) & 0xffff_ffff == RAMFS_MAGIC => Some("ramfs"),
        _ => None,
    };
    let vfs = statvfs(dir).with_context(|| format!("statvfs {}", dir.display()))?;
    let files = vfs.files() as u64;
    Ok(HostRoom {
        on_tmpfs,
        disk_free: vfs.blocks_available() as u64 * vfs.fragment_size() as u64,
        disk_inodes_free: (files > 0).then_some(vfs.files_available() as u64),
        mem_available: host.meminfo()?.mem_available,
    })
}
