//! DIR's tree: its size, inodes and file sizes, and optionally its page-cache
//! residency. The walk stays on DIR's filesystem (a tmpfs over DIR would hold
//! only what is on it), does not follow symlinks, and counts a file with several
//! hard links once. Entries the application deletes while the walk runs are
//! skipped: a cache under load changes as it is read.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::residency::file_residency;

/// Upper bounds of the file-size classes, in bytes; the last class is open.
pub const SIZE_CLASSES: [u64; 4] = [4 << 10, 64 << 10, 1 << 20, 16 << 20];

#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Tree {
    /// Sum of regular files' st_size.
    pub bytes: u64,
    /// What the files occupy (st_blocks × 512): a tmpfs charges whole pages.
    pub allocated: u64,
    pub files: u64,
    pub directories: u64,
    /// Symlinks, FIFOs, sockets, device nodes.
    pub others: u64,
    /// Every inode counted once: what `nr_inodes` limits.
    pub inodes: u64,
    pub sizes: SizeStats,
    /// Page-cache residency of the files, when asked for.
    pub resident_percent: Option<f64>,
    /// Entries that could not be read (not those deleted meanwhile).
    pub errors: u64,
}

#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct SizeStats {
    pub median: u64,
    pub p90: u64,
    pub max: u64,
    /// Files per class of [`SIZE_CLASSES`] (≤ 4 KiB, ≤ 64 KiB, ≤ 1 MiB, ≤ 16 MiB), then larger.
    pub classes: [u64; 5],
}

impl SizeStats {
    pub fn of(mut sizes: Vec<u64>) -> SizeStats {
        sizes.sort_unstable();
        let at = |q: f64| -> u64 {
            if sizes.is_empty() {
                return 0;
            }
            let i = ((sizes.len() - 1) as f64 * q).round() as usize;
            sizes[i]
        };
        let mut classes = [0u64; 5];
        for s in &sizes {
            let class = SIZE_CLASSES.iter().position(|c| s <= c).unwrap_or(4);
            classes[class] += 1;
        }
        SizeStats {
            median: at(0.5),
            p90: at(0.9),
            max: sizes.last().copied().unwrap_or(0),
            classes,
        }
    }
}

/// Walks the tree at `dir`; with `residency`, asks mincore about every file too.
pub fn scan(dir: &Path, residency: bool) -> Result<Tree> {
    let top = fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    let mut w = Walk {
        dev: top.dev(),
        residency,
        tree: Tree::default(),
        seen: HashSet::new(),
        sizes: Vec::new(),
        pages: (0, 0),
    };
    w.tree.directories = 1;
    w.tree.inodes = 1;
    w.dir(dir)
        .with_context(|| format!("reading the directory {}", dir.display()))?;
    let (pages, cached) = w.pages;
    w.tree.resident_percent = residency.then(|| {
        if pages == 0 {
            0.0
        } else {
            cached as f64 * 100.0 / pages as f64
        }
    });
    w.tree.sizes = SizeStats::of(w.sizes);
    Ok(w.tree)
}

struct Walk {
    dev: u64,
    residency: bool,
    tree: Tree,
    /// Inodes with more than one link already counted.
    seen: HashSet<u64>,
    sizes: Vec<u64>,
    pages: (u64, u64),
}

impl Walk {
    fn dir(&mut self, dir: &Path) -> io::Result<()> {
        for entry in fs::read_dir(dir)? {
            let entry = match entry {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(_) => {
                    self.tree.errors += 1;
                    continue;
                }
            };
            let path = entry.path();
            let md = match fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(_) => {
                    self.tree.errors += 1;
                    continue;
                }
            };
            if md.dev() != self.dev {
                continue;
            }
            if md.nlink() > 1 && !md.is_dir() && !self.seen.insert(md.ino()) {
                continue;
            }
            self.tree.inodes += 1;
            if md.is_dir() {
                self.tree.directories += 1;
                match self.dir(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(_) => self.tree.errors += 1,
                }
            } else if md.is_file() {
                self.tree.files += 1;
                self.tree.bytes += md.size();
                self.tree.allocated += md.blocks() * 512;
                self.sizes.push(md.size());
                if self.residency {
                    if let Ok(r) = file_residency(&path) {
                        self.pages.0 += r.pages;
                        self.pages.1 += r.cached_pages;
                    }
                }
            } else {
                self.tree.others += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_fall_in_their_classes_and_quantiles_are_of_the_files() {
        let s = SizeStats::of(vec![
            0,
            4096,
            4097,
            65536,
            1 << 20,
            (1 << 20) + 1,
            16 << 20,
            1 << 30,
        ]);
        assert_eq!(s.classes, [2, 2, 1, 2, 1]);
        assert_eq!(s.max, 1 << 30);
        assert_eq!(s.median, 1 << 20);
        assert_eq!(SizeStats::of(vec![7; 10]).p90, 7);
        assert_eq!(SizeStats::of(Vec::new()), SizeStats::default());
    }

    #[test]
    fn a_tree_is_counted_once_per_inode_without_following_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir(d.join("sub")).unwrap();
        fs::write(d.join("a"), vec![1u8; 5000]).unwrap();
        fs::write(d.join("sub/b"), vec![1u8; 100]).unwrap();
        fs::hard_link(d.join("a"), d.join("sub/a-again")).unwrap();
        std::os::unix::fs::symlink("/", d.join("root")).unwrap();
        let t = scan(d, true).unwrap();
        assert_eq!((t.files, t.directories, t.others, t.inodes), (2, 2, 1, 5));
        assert_eq!(t.bytes, 5100);
        assert!(t.resident_percent.is_some());
        assert_eq!(t.errors, 0);
    }
}
