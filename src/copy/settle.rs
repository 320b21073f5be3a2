//! Makes a write-back's directory records trustworthy for the next pass, so that it can
//! skip listing and stating the disk side of every directory whose names did not
//! change ([`Baseline::unchanged_dir`]).
//!
//! A name added, removed or renamed sets a directory's ctime to the current time. A
//! record whose ctime lies before the moment it was read therefore changes with any
//! later change of the names. The walk reads every directory after the pass's start
//! (`taken`), so the records of directories the pass did not change qualify as they
//! are. A directory the pass changed got a ctime in the pass itself, possibly in the
//! very clock tick in which it was read, and a change by the application right after
//! the read could keep that ctime. Those are read again here, after the clock ticked
//! once more: stated, listed, and stated again to see that the listing is of that
//! state. The record is kept only if the directory still holds every name the next
//! baseline puts in it; otherwise it is marked untrusted and the next pass lists it.
//!
//! Only trust is at stake: the merge itself compares directories by inode, never by
//! their ctime, so an untrusted mark costs the next pass a listing and nothing else.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat;

use super::baseline::{self, Baseline, Mark, Sig, Time};
use super::ops::split_parent;
use super::scan::read_names;

/// A directory record's ctime that no `listed_after` exceeds: never trusted.
pub(super) const UNTRUSTED: Time = (i64::MAX, 0);

/// `marks` as a pass left them under the disk root `root`, the pass having started at
/// `taken`: directory records with a ctime at or after `taken` are read again and kept
/// if they still hold, or marked [`UNTRUSTED`]. Sets `listed_after`.
pub(super) fn settle(base: &mut Baseline, root: BorrowedFd<'_>, taken: Time) {
    let changed: HashSet<Box<[u8]>> = base
        .marks
        .iter()
        .filter(|(_, m)| matches!(m, Mark::Entry(s) if s.is_dir() && s.ctime >= taken))
        .map(|(p, _)| p.into())
        .collect();
    let settled = baseline::now_after_tick();
    if !changed.is_empty() {
        let fresh: Vec<(&[u8], Sig)> = {
            // Per directory to read again: how many names the new baseline puts in it,
            // each of which must be there. (A count, not the names: after a full
            // first pass every directory is read again.)
            let mut expected: HashMap<&[u8], usize> = changed.iter().map(|p| (&**p, 0)).collect();
            for (path, mark) in base.marks.iter() {
                if !matches!(mark, Mark::Deleted(_)) {
                    if let Some(n) = expected.get_mut(split_parent(path).0) {
                        *n += 1;
                    }
                }
            }
            changed
                .iter()
                .filter_map(|path| {
                    let Some(Mark::Entry(walked)) = base.get(path) else {
                        return None;
                    };
                    let sig = match reread(root, path, expected[&**path], base, settled) {
                        Some(now) if now.ino == walked.ino => now,
                        _ => Sig {
                            ctime: UNTRUSTED,
                            ..walked
                        },
                    };
                    Some((&**path, sig))
                })
                .collect()
        };
        for (path, sig) in fresh {
            base.marks.insert(path, Mark::Entry(sig));
        }
    }
    base.listed_after = Some(settled);
}

/// The directory at `path` below `root` as it is now, if its ctime is before `settled`
/// and it holds every one of the `expected` names `base` records in it and none it
/// remembers as deleted (back on the disk, the next pass must see them to merge the
/// RAM's side against that record). It may hold more: names the disk has on its own.
fn reread(root: BorrowedFd<'_>, path: &[u8], expected: usize, base: &Baseline, settled: Time) -> Option<Sig> {
    let fd = beneath(
        root,
        Path::new(OsStr::from_bytes(path)),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOATIME,
    )
    .ok()?;
    let before = Sig::of(&stat::fstat(&fd).ok()?);
    if before.ctime >= settled {
        return None;
    }
    let listed = read_names(&fd).ok()?;
    let after = Sig::of(&stat::fstat(&fd).ok()?);
    if after != before {
        return None;
    }
    // A listing read while names are renamed may hold one twice.
    let listed: HashSet<&[u8]> = listed.iter().map(|n| n.name.to_bytes()).collect();
    let mut found = 0;
    let mut full = path.to_vec();
    for name in listed {
        full.truncate(path.len());
        if !path.is_empty() {
            full.push(b'/');
        }
        full.extend_from_slice(name);
        match base.get(&full) {
            Some(Mark::Deleted(_)) => return None,
            Some(_) => found += 1,
            None => {}
        }
    }
    (found == expected).then_some(before)
}

/// Opens the directory `rel` below `root` without following a symlink or leaving the
/// filesystem at any component: the application may rename or swap what is there.
/// Listing it must not change its atime, which the write-back copied from the RAM
/// (`O_NOATIME`; without the right to it, as for a caller not root, nothing is read).
/// `marks` after a pass that linked or unlinked names of the multiply-linked disk
/// inodes `touched`: that moved their ctime under every other name, whose records
/// (taken before, or carried from an earlier pass) would show it to the next pass as
/// a change of the disk's. Each record of such an inode whose name still holds it,
/// with the mode, size and mtime recorded, gets its ctime now.
pub(super) fn relinked(base: &mut Baseline, root: BorrowedFd<'_>, touched: &HashSet<u64>) {
    if touched.is_empty() {
        return;
    }
    let stale: Vec<(Box<[u8]>, Mark, Sig)> = base
        .marks
        .iter()
        .filter_map(|(p, m)| match m {
            Mark::Entry(s) | Mark::DiskWon(s) if !s.is_dir() && touched.contains(&s.ino) => {
                Some((p.into(), m, s))
            }
            _ => None,
        })
        .collect();
    for (path, mark, was) in stale {
        let now = beneath(root, Path::new(OsStr::from_bytes(&path)), OFlag::O_PATH)
            .and_then(|fd| stat::fstat(&fd))
            .map(|st| Sig::of(&st));
        let Ok(now) = now else { continue };
        if now.ino == was.ino && now.same_version(&was) && now.ctime != was.ctime {
            let sig = Sig {
                ctime: now.ctime,
                ..was
            };
            let mark = match mark {
                Mark::DiskWon(_) => Mark::DiskWon(sig),
                _ => Mark::Entry(sig),
            };
            base.marks.insert(&path, mark);
        }
    }
}

/// Opens `rel` below `root` with `flags`, without following a symlink anywhere or
/// leaving the filesystem.
pub(super) fn beneath(root: BorrowedFd<'_>, rel: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
    openat2(
        root.as_fd(),
        rel,
        OpenHow::new()
            .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            ),
    )
}
