//! Usage of a mounted filesystem from statvfs.

use std::path::Path;

use anyhow::{Context, Result};
use nix::sys::statvfs::statvfs;
use serde::Serialize;

/// Whether the filesystem of `s` compresses what it stores (btrfs, as zram's
/// `fs: btrfs` mounts it): its usage then counts bytes stored, fewer than its
/// files' (`st_size`, `st_blocks`), and a deletion frees room only when btrfs
/// commits its transaction.
pub fn compresses(s: &nix::sys::statfs::Statfs) -> bool {
    s.filesystem_type() == nix::sys::statfs::BTRFS_SUPER_MAGIC
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub size: u64,
    pub used: u64,
    pub inodes: u64,
    pub inodes_used: u64,
}

impl Usage {
    pub fn of(path: &Path) -> Result<Usage> {
        let s = statvfs(path).with_context(|| format!("statvfs {}", path.display()))?;
        Ok(Usage::from_statvfs(&s))
    }

    /// Of the filesystem an open descriptor is on (the agent's held roots).
    pub fn of_fd(fd: impl std::os::fd::AsFd) -> Result<Usage> {
        let s = nix::sys::statvfs::fstatvfs(fd).context("fstatvfs")?;
        Ok(Usage::from_statvfs(&s))
    }

    // The statvfs field types differ between targets (u32 on 32-bit ones).
    #[allow(clippy::unnecessary_cast)]
    fn from_statvfs(s: &nix::sys::statvfs::Statvfs) -> Usage {
        let bsize = s.fragment_size() as u64;
        let blocks = s.blocks() as u64;
        Usage {
            size: blocks * bsize,
            used: blocks.saturating_sub(s.blocks_free() as u64) * bsize,
            inodes: s.files() as u64,
            inodes_used: (s.files() as u64).saturating_sub(s.files_free() as u64),
        }
    }

    /// Percentage used; 0 for an unlimited (size 0) filesystem.
    pub fn used_pct(&self) -> f64 {
        pct(self.used, self.size)
    }

    pub fn inodes_pct(&self) -> f64 {
        pct(self.inodes_used, self.inodes)
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_never_divide_by_zero() {
        let u = Usage {
            size: 0,
            used: 0,
            inodes: 0,
            inodes_used: 0,
        };
        assert_eq!(u.used_pct(), 0.0);
        let u = Usage {
            size: 200,
            used: 50,
            inodes: 10,
            inodes_used: 10,
        };
        assert_eq!(u.used_pct(), 25.0);
        assert_eq!(u.inodes_pct(), 100.0);
    }
}
