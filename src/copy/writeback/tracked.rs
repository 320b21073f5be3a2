//! A tracked pass: the write-back told which RAM directories changed since the
//! baseline (by the agent's tracker, see [`crate::dirty`]) visits only those, and
//! carries the baseline's records of every other subtree over unread.
//!
//! A RAM subdirectory is skipped, neither listed nor its entries stated, when all of
//! these hold:
//! - the tracker saw no change of an entry in it or below it (`Dirty::dirs`), and it
//!   is not in or below a directory created or moved in since (`Dirty::subtrees`:
//!   its entries are new at their paths, whatever their ctimes say);
//! - the baseline has its directory record (it is not new at its path);
//! - its own ctime is before the baseline's (no name added, removed or renamed in
//!   it, no change of its own metadata);
//! - the disk directory of that path, and every one below it, still matches its
//!   trusted record: nobody changed the disk side there (checked before the walk, one
//!   `fstatat` per directory of the baseline).
//!
//! A skipped subtree is then unchanged on both sides since the baseline, and a full
//! pass would only have confirmed its records, as long as nothing changes in it after
//! the tracker answered: a pass with names to remove checks that first
//! ([`Filter::changed_unread`]), and the scan reads all of a directory changed after
//! the answer. One case a directory cannot tell: a
//! hard-linked file changed through a name in another directory. A pass that meets a
//! changed multiply-linked file (or one new at its path: in a directory moved in)
//! asks for a full pass after it ([`super::sync_tree`]).

use std::collections::{HashMap, HashSet};
use std::os::fd::BorrowedFd;

use nix::fcntl::AtFlags;
use nix::sys::stat::{self, FileStat};

use crate::copy::baseline::{Baseline, Mark, Sig, Time};
use crate::copy::ops::{file_type, open_below, split_parent};

/// RAM directories that changed since the baseline was taken, as a tracker saw them:
/// paths relative to the tmpfs root (`""` for the root itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dirty {
    /// Directories in which an entry was created, written, had its metadata
    /// changed, deleted or renamed.
    pub dirs: Vec<Box<[u8]>>,
    /// Directories created or moved in: everything below is new at its path.
    pub subtrees: Vec<Box<[u8]>>,
    /// The directories of `dirs` whose every change the tracker saw by the name it
    /// happened to: their other entries are as they were at the baseline.
    pub named: Vec<Box<[u8]>>,
    /// The paths of those changed entries.
    pub entries: Vec<Box<[u8]>>,
}

/// What the change tracker's barriers did to the RAM root's ctime (see
/// [`crate::dirty::ask`]): each moves it to the time it was made, and the root's
/// ctime stands for when the RAM deleted a name there. A barrier made after the
/// disk's version of a name won over the RAM's deletion (a disk written while the
/// application works on it: `down`'s window, a retried write-back) would otherwise
/// have the next pass take the deletion for the later change, and delete the
/// disk's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barriers {
    /// The root's ctime the last barrier left.
    pub left: Time,
    /// The root's ctime before the first of the barriers since the application last
    /// added, removed or renamed a name there.
    pub before: Time,
}

impl Barriers {
    /// The time the root's ctime `ctime` stands for (never a later one).
    pub fn undo(this: Option<Barriers>, ctime: Time) -> Time {
        match this {
            Some(b) if b.left == ctime => b.before.min(ctime),
            _ => ctime,
        }
    }
}

/// What the scan asks of each RAM subdirectory in a tracked pass.
pub(crate) struct Filter {
    /// The directories to enter: changed ones, those whose disk side changed, and
    /// every directory above one of them.
    enter: HashSet<Box<[u8]>>,
    subtrees: HashSet<Box<[u8]>>,
    /// Paths with a directory record in the baseline.
    known: HashSet<Box<[u8]>>,
    /// Directories with a change the tracker saw.
    changed: HashSet<Box<[u8]>>,
    /// Of those, the ones whose every change it saw by name: those names.
    touched: HashMap<Box<[u8]>, HashSet<Box<[u8]>>>,
    /// The names touched in a directory without a change: none.
    none: HashSet<Box<[u8]>>,
    taken: Time,
    /// This pass's time, taken before the tracker was asked: a RAM directory changed
    /// at or after it may have changed after the answer, in ways it does not tell.
    answered: Time,
    /// The tracker saw no change at all.
    quiet: bool,
}

/// Adds `path` and every directory above it.
fn with_parents(set: &mut HashSet<Box<[u8]>>, path: &[u8]) {
    let mut path = path;
    while set.insert(path.into()) && !path.is_empty() {
        path = split_parent(path).0;
    }
}

impl Filter {
    /// The filter for a pass against `base` (which must have a time) with the
    /// tracker's `dirty`, after a look at every disk directory the baseline holds
    /// (through `dst`, the disk root). `None` without a baseline time: a full pass.
    pub(crate) fn new(base: &Baseline, dirty: &Dirty, dst: BorrowedFd<'_>, answered: Time) -> Option<Filter> {
        let taken = base.taken?;
        base.listed_after?;
        let mut enter = HashSet::new();
        enter.insert(Box::from(&b""[..]));
        for d in &dirty.dirs {
            with_parents(&mut enter, d);
        }
        let mut known = HashSet::new();
        for (path, mark) in base.marks.iter() {
            if !matches!(mark, Mark::Entry(sig) | Mark::DiskWon(sig) if sig.is_dir()) {
                continue;
            }
            known.insert(Box::from(path));
            let unchanged = matches!(mark, Mark::Entry(_))
                && disk_dir(dst, path).is_some_and(|now| base.unchanged_dir(path, &Sig::of(&now)));
            if !unchanged {
                with_parents(&mut enter, path);
            }
        }
        let mut touched: HashMap<_, HashSet<_>> =
            dirty.named.iter().map(|d| (d.clone(), HashSet::new())).collect();
        for path in &dirty.entries {
            let (dir, name) = split_parent(path);
            if let Some(names) = touched.get_mut(dir) {
                names.insert(name.into());
            }
        }
        Some(Filter {
            enter,
            subtrees: dirty.subtrees.iter().cloned().collect(),
            known,
            answered,
            changed: dirty.dirs.iter().cloned().collect(),
            touched,
            none: HashSet::new(),
            taken,
            quiet: dirty.dirs.is_empty() && dirty.subtrees.is_empty(),
        })
    }

    /// Whether nothing changed below the root: the tracker saw no change in RAM,
    /// and no disk directory of the baseline changed.
    pub(crate) fn nothing_changed(&self) -> bool {
        self.quiet && self.enter.len() == 1
    }

    /// The first directory the baseline records at or below one of `skipped` (paths
    /// of directories the pass did not read) that changed after the answer, is gone
    /// or is no directory now, in the RAM at `src`. The application may have moved a
    /// file there from a name the pass read as deleted (a move into a subdirectory
    /// leaves the ctimes above it as they were), and the pass did not write it.
    pub(crate) fn changed_unread(
        &self,
        skipped: &HashSet<Box<[u8]>>,
        src: BorrowedFd<'_>,
    ) -> Option<Box<[u8]>> {
        let below_skipped = |path: &[u8]| {
            let mut at = path;
            loop {
                if skipped.contains(at) {
                    return true;
                }
                if at.is_empty() {
                    return false;
                }
                at = split_parent(at).0;
            }
        };
        self.known
            .iter()
            .filter(|path| !path.is_empty() && below_skipped(path))
            .find(|path| {
                // One name at a time, following no symlink: one planted above would
                // lead the look to another, unchanged tree (a review helper's probe).
                open_below(src, path)
                    .and_then(|dir| stat::fstat(&dir))
                    .map_or(true, |st| self.changed_since_asked(&st))
            })
            .cloned()
    }

    /// The directories the baseline records.
    pub(crate) fn known_dirs(&self) -> usize {
        self.known.len()
    }

    /// Whether the RAM directory stated `st` changed since the pass asked the tracker:
    /// its names may be other than the answer says (one renamed over another, a
    /// directory moved over another).
    pub(crate) fn changed_since_asked(&self, st: &FileStat) -> bool {
        Sig::of(st).ctime >= self.answered
    }

    /// Whether the RAM subdirectory at `path`, stated `st`, is to be read; `in_new`:
    /// its parent is in or below a directory created or moved in. Returns whether it
    /// is read, and whether its subdirectories are in such a directory.
    pub(crate) fn enter(&self, path: &[u8], st: &FileStat, in_new: bool) -> (bool, bool) {
        let new = in_new || self.subtrees.contains(path);
        let read =
            new || self.enter.contains(path) || !self.known.contains(path) || Sig::of(st).ctime >= self.taken;
        (read, new)
    }

    /// The names in the RAM directory at `path`, stated `st`, that the tracker saw a
    /// change of since the baseline, where it saw every change there by name: any
    /// other entry is the one the baseline recorded at its path, unchanged. `None`
    /// where that is not known: a change without a name, a directory new at its path
    /// (`in_new`: in or below one), one the baseline has no record of, or one
    /// changed since the pass asked (a name renamed over another after the answer).
    pub(crate) fn touched(&self, path: &[u8], st: &FileStat, in_new: bool) -> Option<&HashSet<Box<[u8]>>> {
        if in_new
            || self.changed_since_asked(st)
            || self.subtrees.contains(path)
            || !(path.is_empty() || self.known.contains(path))
        {
            return None;
        }
        if self.changed.contains(path) {
            self.touched.get(path)
        } else {
            Some(&self.none)
        }
    }
}

/// The disk directory at `path` below the root `dst`, if it is one.
fn disk_dir(dst: BorrowedFd<'_>, path: &[u8]) -> Option<FileStat> {
    let at = if path.is_empty() { &b"."[..] } else { path };
    // Any failure to look is a change: the directory is then read.
    stat::fstatat(dst, at, AtFlags::AT_SYMLINK_NOFOLLOW)
        .ok()
        .filter(|st| file_type(st) == libc::S_IFDIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_entered_up_to_the_root() {
        let mut set = HashSet::new();
        with_parents(&mut set, b"a/b/c");
        with_parents(&mut set, b"a/x");
        let mut got: Vec<_> = set
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        got.sort();
        assert_eq!(got, ["", "a", "a/b", "a/b/c", "a/x"]);
    }
}
