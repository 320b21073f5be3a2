//! How much a tmpfs must hold to take a tree: measured before a seed, and by the agent
//! before it takes a mount back into RAM.

use std::collections::HashSet;
use std::path::Path;

use nix::errno::Errno;
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
        // The application works in the tree meanwhile: a name gone since the listing
        // is not there to copy either (the seed skips it the same way).
        let st = match stat::fstatat(listing.fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(src_err("stat")(e).at(rel.path(Some(name)))),
        };
        let is_dir = file_type(&st) == libc::S_IFDIR;
        if is_dir || st.st_nlink <= 1 || linked.insert((st.st_dev, st.st_ino)) {
            size.allocated += ops::allocated_bytes(&st);
            size.apparent += u64::try_from(st.st_size).unwrap_or(0);
            size.inodes += 1;
        }
        if is_dir && st.st_dev == root_dev {
            let child = match open_src(listing.fd(), name, OFlag::O_DIRECTORY) {
                Ok(fd) => src_listing(fd).map_err(|f| f.at(rel.path(Some(name))))?,
                // Removed, or replaced by a non-directory, since the stat.
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
                Err(e) => return Err(src_err("open directory")(e).at(rel.path(Some(name)))),
            };
            rel.push(name);
            stack.push((child, rel.len()));
        }
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names and directories removed while the tree is measured are left out, not an
    /// error: `apply` measures a directory the application works in.
    #[test]
    fn what_vanishes_while_measured_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<_> = (0..2000)
            .map(|i| dir.path().join(format!("d{}", i % 20)).join(format!("f{i}")))
            .collect();
        for n in &names {
            std::fs::create_dir_all(n.parent().unwrap()).unwrap();
            std::fs::write(n, "x").unwrap();
        }
        std::thread::scope(|s| {
            let app = s.spawn(|| {
                for n in names.iter().rev() {
                    std::fs::remove_file(n).unwrap();
                }
                for i in 0..20 {
                    std::fs::remove_dir(dir.path().join(format!("d{i}"))).unwrap();
                }
            });
            while !app.is_finished() {
                let size = measure(dir.path()).expect("measured while the application deletes");
                assert!(size.inodes <= 2020);
            }
        });
        assert_eq!(measure(dir.path()).unwrap(), TreeSize::default());
    }
}
