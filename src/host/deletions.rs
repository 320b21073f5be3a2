//! Names deleted or renamed away on a disk filesystem since a moment: a fanotify
//! group reporting directory file handles and names (`FAN_REPORT_DFID_NAME`, Linux
//! ≥ 5.9) with a filesystem mark for `FAN_DELETE | FAN_MOVED_FROM`.
//!
//! The write-back needs it for one case the directory alone cannot tell. Once a held
//! tmpfs is switched away, the application works in the disk directory while the
//! merge runs. A name the RAM created that the disk lacks was either never on disk
//! (write it back) or created there again by the application and deleted (leave it
//! gone). Only the event of the deletion tells the two apart.
//!
//! Events of this process (the merge's own renames and removals) are ignored. If the
//! queue overflows, nothing can be told any more: every such name is written back
//! (a deleted name may come back; no write is lost), and that is logged.
//!
//! Where the kernel reports the deleted entry's own handle too
//! (`FAN_REPORT_TARGET_FID`, Linux ≥ 5.17), a deleted directory is remembered by its
//! handle, so that names deleted in it can still be asked about once it is gone.

use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::fanotify::{EventFFlags, Fanotify, InitFlags, MarkFlags, MaskFlags};

use crate::copy::baseline::Time;
use crate::copy::DiskDeletions;

pub use super::fanotify::Handle;
use super::fanotify::{handle_of, parse, Event};

/// One deletion seen: the directory's handle and the name, with the deleted entry's
/// own handle where it was a directory and the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Gone {
    pub dir: Handle,
    pub name: Vec<u8>,
    pub object: Option<Handle>,
}

impl Gone {
    /// Not a deletion: the record that the directory `new` was made in place of the
    /// removed `old` (see [`Deletions::stands_for`]). No name has a slash.
    pub fn made_again(new: Handle, old: Handle) -> Gone {
        Gone {
            dir: old,
            name: MADE_AGAIN.to_vec(),
            object: Some(new),
        }
    }
}

impl Gone {
    /// The directories (new, removed) of a [`Gone::made_again`] record.
    pub fn into_made_again(self) -> Option<(Handle, Handle)> {
        match (&self.name[..], self.object) {
            (MADE_AGAIN, Some(new)) => Some((new, self.dir)),
            _ => None,
        }
    }
}

const MADE_AGAIN: &[u8] = b"/";

/// The directories (by handle) and names an entry was moved away from, in order.
pub type WentFrom = Vec<(Handle, Vec<u8>)>;

pub struct Deletions {
    group: Fanotify,
    /// When the watched changes began to matter: every name seen deleted is taken to
    /// have gone at (or after) it.
    since: Option<Time>,
    gone: HashSet<(Handle, Vec<u8>)>,
    /// The part of `gone` another watch saw.
    added: HashSet<(Handle, Vec<u8>)>,
    /// The part of `dirs` another watch saw: (where, the directory's own handle).
    added_dirs: HashSet<((Handle, Vec<u8>), Handle)>,
    /// The handles of the deleted directories, by their directory and name.
    dirs: HashMap<(Handle, Vec<u8>), Vec<Handle>>,
    own_pid: i32,
    ignored: Option<i32>,
    overflowed: bool,
    /// A directory made again in place of a removed one, by its handle: the removed
    /// one's (see [`Self::stands_for`]).
    again: HashMap<Handle, Handle>,
    /// Where entries were moved away from, by their own handles, in the order of the
    /// moves; kept only when asked for ([`Self::keep_moves`]).
    moved: Option<HashMap<Handle, WentFrom>>,
}

impl Deletions {
    /// Starts watching the filesystem `dir` is on.
    pub fn watch(dir: &Path) -> Result<Deletions, Errno> {
        // The queue holds the whole filesystem's deletions (the merge's own too) until
        // drained: unlimited, so that an overflow does not blind it.
        let flags = InitFlags::FAN_CLASS_NOTIF
            | InitFlags::FAN_CLOEXEC
            | InitFlags::FAN_NONBLOCK
            | InitFlags::FAN_UNLIMITED_QUEUE;
        let init = |report| {
            Fanotify::init(
                flags | InitFlags::from_bits_retain(report),
                EventFFlags::O_RDONLY | EventFFlags::O_CLOEXEC,
            )
        };
        let group = match init(libc::FAN_REPORT_DFID_NAME_TARGET) {
            Err(Errno::EINVAL) => init(libc::FAN_REPORT_DFID_NAME)?,
            other => other?,
        };
        let at =
            std::fs::File::open(dir).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
        group.mark(
            MarkFlags::FAN_MARK_ADD | MarkFlags::FAN_MARK_FILESYSTEM,
            MaskFlags::FAN_DELETE | MaskFlags::FAN_MOVED_FROM | MaskFlags::FAN_ONDIR,
            at.as_fd(),
            None::<&str>,
        )?;
        Ok(Deletions {
            group,
            since: None,
            gone: HashSet::new(),
            added: HashSet::new(),
            added_dirs: HashSet::new(),
            dirs: HashMap::new(),
            own_pid: std::process::id() as i32,
            ignored: None,
            overflowed: false,
            again: HashMap::new(),
            moved: None,
        })
    }

    /// Deletions count from `t` on (a time after the last change the RAM side got).
    pub fn since(&mut self, t: Time) {
        self.since = Some(t);
    }

    /// Names deleted in the removed directory `old` count as deleted in the directory
    /// `new` too, made in its place: a write-back into `new` knows what the
    /// application removed with the old one.
    pub fn stands_for(&mut self, new: Handle, old: Handle) {
        self.again.insert(new, old);
    }

    /// `dir`, and the removed directories it was made again for, newest first (a
    /// directory removed and made again more than once while a write-back waited).
    fn with_removed(&self, dir: Handle) -> impl Iterator<Item = Handle> + '_ {
        std::iter::successors(Some(dir), |d| self.again.get(d).cloned()).take(1 + self.again.len())
    }

    /// Keeps, from now on, where each entry moved away went from (its directory and
    /// name, by the entry's own handle, where the kernel reports it).
    pub fn keep_moves(&mut self) {
        self.moved.get_or_insert_with(HashMap::new);
    }

    /// The entries seen moved away (see [`Self::keep_moves`]): by their own handles,
    /// each directory and name they went from, in the order of the moves.
    pub fn moves(&mut self) -> HashMap<Handle, WentFrom> {
        self.drain();
        self.moved.clone().unwrap_or_default()
    }

    /// The time set by [`Self::since`].
    pub fn counted_from(&self) -> Option<Time> {
        self.since
    }

    /// Ignores the events of `pid` as well (the tmpfsctl a keeper works for).
    pub fn ignore(&mut self, pid: i32) {
        self.ignored = Some(pid);
    }

    /// What this watch saw deleted itself (not what [`Self::add`] added), a deleted
    /// directory with each handle it had.
    pub fn seen(&mut self) -> Vec<Gone> {
        self.drain();
        let mut seen = Vec::new();
        for key in &self.gone {
            let gone = |object| Gone {
                dir: key.0.clone(),
                name: key.1.clone(),
                object,
            };
            let own = !self.added.contains(key);
            let objects = self.dirs.get(key).map_or(&[][..], Vec::as_slice);
            // A directory deleted at a name another watch saw deleted too: its own.
            let own_objects = objects
                .iter()
                .filter(|o| !self.added_dirs.contains(&(key.clone(), (*o).clone())));
            let before = seen.len();
            seen.extend(own_objects.map(|o| gone(Some(o.clone()))));
            if own && seen.len() == before {
                seen.push(gone(None));
            }
        }
        seen
    }

    /// Adds deletions seen by another watch (a keeper's); `None`: that watch overflowed.
    pub fn add(&mut self, seen: Option<Vec<Gone>>) {
        let Some(seen) = seen else {
            if !self.overflowed {
                tracing::warn!("a keeper's record of deletions in the disk directory overflowed or could not be written (the state directory's records area full?); names the RAM created are written back even if the application deleted them on disk meanwhile");
            }
            self.overflowed = true;
            return;
        };
        for g in seen {
            if g.name == MADE_AGAIN {
                if let Some((new, old)) = g.into_made_again() {
                    self.stands_for(new, old);
                }
                continue;
            }
            let key = (g.dir, g.name);
            if let Some(object) = g.object {
                if self.dir_gone(key.clone(), object.clone()) {
                    self.added_dirs.insert((key.clone(), object));
                }
            }
            if self.gone.insert(key.clone()) {
                self.added.insert(key);
            }
        }
    }

    /// Remembers the handle of a directory deleted at `key`; whether it is new.
    fn dir_gone(&mut self, key: (Handle, Vec<u8>), object: Handle) -> bool {
        let known = self.dirs.entry(key).or_default();
        let new = !known.contains(&object);
        if new {
            known.push(object);
        }
        new
    }

    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The group's descriptor, to wait on.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.group.as_fd()
    }

    /// Reads every queued event; returns the deletions not seen before (a name seen
    /// before, again with a directory's handle not seen before).
    pub fn drain(&mut self) -> Vec<Gone> {
        let mut new = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match nix::unistd::read(self.group.as_fd(), &mut buf) {
                // A signal `down` goes on after (see crate::signals).
                Err(nix::errno::Errno::EINTR) => continue,
                Ok(0) | Err(_) => return new,
                Ok(n) => {
                    for ev in parse(&buf[..n]) {
                        match ev {
                            Event::Overflow => {
                                if !self.overflowed {
                                    tracing::warn!("the watch for deletions in the disk directory overflowed; names the RAM created are written back even if the application deleted them on disk meanwhile");
                                }
                                self.overflowed = true;
                            }
                            Event::Named {
                                pid,
                                dir,
                                name,
                                mask,
                                object,
                            } if pid != self.own_pid && Some(pid) != self.ignored => {
                                if let (Some(moved), Some(entry)) = (self.moved.as_mut(), &object) {
                                    if mask & libc::FAN_MOVED_FROM != 0 {
                                        moved
                                            .entry(entry.clone())
                                            .or_default()
                                            .push((dir.clone(), name.clone()));
                                    }
                                }
                                let key = (dir, name);
                                let object = object.filter(|_| mask & libc::FAN_ONDIR != 0);
                                let new_dir = object
                                    .clone()
                                    .is_some_and(|object| self.dir_gone(key.clone(), object));
                                if self.gone.insert(key.clone()) || new_dir {
                                    new.push(Gone {
                                        dir: key.0,
                                        name: key.1,
                                        object,
                                    });
                                }
                            }
                            Event::Named { .. } | Event::Object { .. } => {}
                        }
                    }
                }
            }
        }
    }
}

impl DiskDeletions for Deletions {
    fn deleted(&mut self, dir: BorrowedFd<'_>, name: &CStr) -> Option<Time> {
        let since = self.since?;
        self.drain();
        if self.overflowed {
            return None;
        }
        let handle = handle_of(dir).ok()?;
        let name = name.to_bytes().to_vec();
        self.with_removed(handle)
            .any(|h| self.gone.contains(&(h, name.clone())))
            .then_some(since)
    }

    fn gone_dirs(&mut self, dir: Result<BorrowedFd<'_>, &[u8]>, name: &CStr) -> Vec<Vec<u8>> {
        self.drain();
        let parent = match dir {
            Ok(fd) => handle_of(fd).ok(),
            Err(key) => from_key(key),
        };
        let Some(parent) = parent else {
            return Vec::new();
        };
        self.with_removed(parent)
            .filter_map(|p| self.dirs.get(&(p, name.to_bytes().to_vec())))
            .flatten()
            .map(to_key)
            .collect()
    }

    fn moved_here(&mut self, dir: BorrowedFd<'_>) -> bool {
        self.drain();
        // A directory moved away is reported with its own handle, as a deleted one
        // is; only a moved one is still there to be opened.
        handle_of(dir).is_ok_and(|h| self.dirs.values().any(|objects| objects.contains(&h)))
    }

    fn deleted_in(&mut self, gone: &[u8], name: &CStr) -> Option<Time> {
        let since = self.since?;
        self.drain();
        if self.overflowed {
            return None;
        }
        self.gone
            .contains(&(from_key(gone)?, name.to_bytes().to_vec()))
            .then_some(since)
    }
}

/// The directory of a key [`DiskDeletions::gone_dirs`] handed out, if it still
/// opens on the filesystem `on` is on (`O_PATH`): it was moved away, not removed.
pub fn open_moved(on: BorrowedFd<'_>, key: &[u8]) -> Option<std::os::fd::OwnedFd> {
    crate::host::fanotify::open_handle(on, &from_key(key)?).ok()
}

/// The directory `name` in the directory of a key [`DiskDeletions::gone_dirs`]
/// handed out, where that one was moved away (not removed), as such a key: what
/// moved with it.
pub fn moved_child(on: BorrowedFd<'_>, key: &[u8], name: &CStr) -> Option<Vec<u8>> {
    let moved = open_moved(on, key)?;
    let child = nix::fcntl::openat(
        &moved,
        name,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_NOFOLLOW,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    handle_of(child.as_fd()).ok().map(|h| to_key(&h))
}

/// A handle as the key [`DiskDeletions::gone_dirs`] hands out: its type, then its bytes.
fn to_key((kind, bytes): &Handle) -> Vec<u8> {
    [&kind.to_ne_bytes()[..], bytes].concat()
}

fn from_key(key: &[u8]) -> Option<Handle> {
    let kind = i32::from_ne_bytes(key.get(..4)?.try_into().ok()?);
    Some((kind, key[4..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real kernel: a deletion by another process is seen, in the right directory.
    #[test]
    fn a_deletion_by_another_process_is_seen() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("a"), "a").unwrap();
        std::fs::write(sub.join("b"), "b").unwrap();
        let Ok(mut d) = Deletions::watch(dir.path()) else {
            eprintln!("fanotify with FAN_REPORT_DFID_NAME is not available here");
            return;
        };
        d.since((1, 0));
        let st = std::process::Command::new("rm")
            .arg(sub.join("a"))
            .status()
            .unwrap();
        assert!(st.success());
        std::fs::remove_file(sub.join("b")).unwrap();
        let fd = std::fs::File::open(&sub).unwrap();
        assert_eq!(d.deleted(fd.as_fd(), c"a"), Some((1, 0)));
        assert_eq!(d.deleted(fd.as_fd(), c"b"), None, "our own deletion");
        let top = std::fs::File::open(dir.path()).unwrap();
        assert_eq!(d.deleted(top.as_fd(), c"a"), None, "another directory");
    }

    /// What a watch hands over is what it saw itself: not what it took over, but a
    /// directory it saw deleted at a name it took over, with the directory's handle.
    #[test]
    fn what_is_handed_over_is_what_this_watch_saw() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let Ok(mut d) = Deletions::watch(dir.path()) else {
            eprintln!("fanotify with FAN_REPORT_DFID_NAME is not available here");
            return;
        };
        let top = handle_of(std::fs::File::open(dir.path()).unwrap().as_fd()).unwrap();
        let earlier = Gone {
            dir: top.clone(),
            name: b"d".to_vec(),
            object: Some((1, vec![7; 8])),
        };
        let other = Gone {
            dir: top.clone(),
            name: b"f".to_vec(),
            object: None,
        };
        d.add(Some(vec![earlier.clone(), other.clone()]));
        let st = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"mkdir "$1/d" && rmdir "$1/d""#)
            .arg("sh")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success());
        // The whole filesystem is watched: other tests delete too.
        let seen: Vec<Gone> = d.seen().into_iter().filter(|g| g.dir == top).collect();
        assert!(!seen.contains(&earlier) && !seen.contains(&other), "{seen:?}");
        if d.gone_dirs(Err(&to_key(&top)), c"d").len() < 2 {
            eprintln!("no FAN_REPORT_TARGET_FID here: directories are not told apart");
            return;
        }
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!((&seen[0].dir, &seen[0].name[..]), (&top, &b"d"[..]));
        assert!(seen[0].object.is_some());
    }

    /// A directory made again twice while the write-back waited stands for both
    /// removed ones (their records come from the keeper, oldest first), and a cycle
    /// of such records ends.
    #[test]
    fn a_directory_made_again_twice_stands_for_both_removed_ones() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let Ok(mut d) = Deletions::watch(dir.path()) else {
            eprintln!("fanotify with FAN_REPORT_DFID_NAME is not available here");
            return;
        };
        let (first, second, now) = ((1, vec![1; 8]), (1, vec![2; 8]), (1, vec![3; 8]));
        d.add(Some(vec![
            Gone::made_again(second.clone(), first.clone()),
            Gone::made_again(now.clone(), second.clone()),
        ]));
        assert!(d.seen().iter().all(|g| g.name != MADE_AGAIN), "not a deletion");
        let back: Vec<Handle> = d.with_removed(now.clone()).collect();
        assert_eq!(back, vec![now.clone(), second.clone(), first.clone()]);
        d.stands_for(first.clone(), now.clone());
        assert_eq!(d.with_removed(now).count(), 4);
    }
}
