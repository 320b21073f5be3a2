//! How much a tmpfs must hold to take a tree: measured before a seed, and by the agent
//! before it takes a mount back into RAM.

use std::collections::HashSet;
use std::path::Path;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat;

use super::error::{src_err, CopyError};
use super::ops::{self, file_type, open_root_dir, open_src, src_listing, RelPath};

/// Size of a tree as a tmpfs would have to hold it.
///
/// Hard-linked inodes are counted once, because the copy keeps them linked.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TreeSize {
    /// Sum of `st_blocks * 512`: what the data really occupies, holes excluded.
    pub allocated: u64,
    /// Sum of `st_size`.
    pub apparent: u64,
    pub inodes: u64,
}

/// Measures `dir` without following symlinks or entering other filesystems, so the
/// result matches what [`copy_tree`](super::copy_tree) would put into the tmpfs. The root itself is not
/// counted, as the tmpfs brings its own root.
pub fn measure(dir: &Path) -> Result<TreeSize, CopyError> {
    let mut rel = RelPath::default();
    let (root, root_st) = open_root_dir(dir, true)?;
    let root_dev = root_st.st_dev;
    let mut stack = vec![(src_listing(root).map_err(|f| f.at(rel.path(None)))?, 0)];
    let mut linked = HashSet::new();
    let mut size = TreeSize::default();
    while let Some((listing, _)) = stack.last_mut() {
        let Some(next) = listing.next() else {
            stack.pop();
            if let Some(&(_, rel_len)) = stack.last() {
                rel.truncate(rel_len);
            }
            continue;
        };
        let entry = next
            .map_err(src_err("read directory"))
            .map_err(|f| f.at(rel.path(None)))?;
        let name = entry.file_name();
        let st = stat::fstatat(listing.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(src_err("stat"))
            .map_err(|f| f.at(rel.path(Some(name))))?;
        let is_dir = file_type(&st) == libc::S_IFDIR;
        if is_dir || st.st_nlink <= 1 || linked.insert((st.st_dev, st.st_ino)) {
            size.allocated += ops::allocated_bytes(&st);
            size.apparent += u64::try_from(st.st_size).unwrap_or(0);
            size.inodes += 1;
        }
        if is_dir && st.st_dev == root_dev {
            let child = open_src(listing.fd(), name, OFlag::O_DIRECTORY)
                .map_err(src_err("open directory"))
                .and_then(src_listing)
                .map_err(|f| f.at(rel.path(Some(name))))?;
            rel.push(name);
            stack.push((child, rel.len()));
        }
    }
    Ok(size)
}
