//! What the application moves in the tmpfs right after `apply`'s switch, before the
//! merge by path ([`super::catch_up`]) reaches it: a directory or file of the seed's
//! copies, found by the deletion watch's handle wherever it is now, gets what the
//! application wrote in it on disk during the seed (see docs/writeback.md, "What the
//! application writes during the seed").

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{self, FileStat};

use super::{below, join, merge_in, open_beneath, open_dir_beneath, same_inode, stat_beneath};
use crate::copy::baseline::{Mark, Sig, Time};
use crate::copy::born;
use crate::copy::{self, Baseline, DiskDeletions};
use crate::host::deletions::{Deletions, WentFrom};
use crate::host::fanotify::{fd_path, handle_of, open_handle, Handle};
use crate::mount::proc_path;
use crate::spec::MountSpec;
use crate::state::State;

/// How many directories moved in RAM right after the switch [`follow_moved`] merges
/// into (about 16 ms each): a bound on what it adds to `apply`.
const MAX_FOLLOWED: usize = 256;

/// A directory of the seed's copies that the application moved in the tmpfs after
/// the switch, and what was merged into it where it is now.
pub(super) struct Followed {
    /// Its path when the tmpfs went in place: the disk directory's.
    pub(super) from: Vec<u8>,
    /// The merge's records (below `from`), or `None` where it failed.
    pub(super) seen: Option<Baseline>,
}

/// Whether `path` is `dir` or below it.
pub(super) fn under(dir: &[u8], path: &[u8]) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'/')
}

/// The paths (at the switch) of the disk entries that the merges into the moved
/// directories `followed` walked, but none below a directory whose merge failed.
pub(super) fn walked_in(followed: &[Followed]) -> impl Iterator<Item = Vec<u8>> + '_ {
    let failed: Vec<&[u8]> = followed
        .iter()
        .filter(|f| f.seen.is_none())
        .map(|f| &f.from[..])
        .collect();
    followed
        .iter()
        .filter_map(|f| Some((f, f.seen.as_ref()?)))
        .flat_map(|(f, seen)| {
            std::iter::once(f.from.clone()).chain(seen.marks.iter().map(|(p, _)| join(&f.from, p)))
        })
        .filter(move |p| !failed.iter().any(|f| under(f, p)))
}

/// Merges into each directory of the seed's copies that the application moved away
/// in the tmpfs right after the switch what the application wrote in it on disk
/// during the seed, where it is now.
///
/// The merge by path ([`catch_up`]) saw such a directory as deleted in RAM: what the
/// application wrote in it on disk before the seed's last look, which the seed had
/// not copied, was lost at `down`, as was the disk's rewrite of a file it had copied;
/// what it wrote after that look brought the whole directory back at its old path
/// (the disk's change counted as the later one). The deletion watch names the
/// directory moved, in its directory then, and its own handle, which finds it
/// wherever it is now.
///
/// `watch`: the application's deletions in the tmpfs, with `copied`, the seed's
/// records; `seed_started`: the merge's time, as [`catch_up`]'s.
pub(super) fn follow_moved(
    m: &MountSpec,
    state: &State,
    live: &Path,
    (watch, copied): (&Mutex<Deletions>, &Baseline),
    seed_started: Time,
    touched: &mut HashSet<u64>,
) -> Vec<Followed> {
    let (moves, switched) = {
        let mut w = watch.lock().expect("no merge has used the watch yet");
        (w.moves(), w.counted_from())
    };
    if moves.is_empty() {
        return Vec::new();
    }
    let side = state.side(&m.name);
    let roots = std::fs::File::open(live).and_then(|ram| Ok((ram, std::fs::File::open(&side)?)));
    let Ok((ram, disk)) = roots else {
        return Vec::new();
    };
    let Some(ram_path) = fd_path(ram.as_fd()) else {
        return Vec::new();
    };
    let seen = Moves {
        ram: (ram.as_fd(), &ram_path),
        disk: disk.as_fd(),
        copied,
        moves: &moves,
        switched,
    };
    // The directories still in the tmpfs (a deleted one's handle opens no more),
    // moved from where the seed copied them.
    let mut found: Vec<(Vec<u8>, Vec<u8>, OwnedFd, OwnedFd)> = Vec::new();
    let mut files = Vec::new();
    for (object, went) in &moves {
        let Some(moved) = seen.live(object) else {
            continue;
        };
        if !stat::fstat(&moved).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR) {
            files.push((object, went));
            continue;
        }
        let (Some((from, on_disk)), Some(to)) = (seen.at_switch(object, 0), seen.path_now(&moved)) else {
            continue;
        };
        if to != from {
            found.push((from, to, on_disk, moved));
        }
    }
    // The seed's records below each, by their paths from there: one look at each.
    let mut rebased: HashMap<Vec<u8>, Baseline> = found
        .iter()
        .map(|(from, ..)| {
            let b = Baseline {
                taken: copied.taken,
                ..Baseline::none()
            };
            (from.clone(), b)
        })
        .collect();
    for (path, mark) in copied.marks.iter() {
        for (i, _) in path.iter().enumerate().filter(|(_, &c)| c == b'/') {
            if let Some(b) = rebased.get_mut(&path[..i]) {
                b.marks.insert(&path[i + 1..], mark);
            }
        }
    }
    let deletions = Some(watch as &Mutex<dyn DiskDeletions + Send>);
    let mut followed = Vec::new();
    // The deepest first: what it took is agreed on for the one above it.
    found.sort_by_key(|(from, ..)| std::cmp::Reverse(from.iter().filter(|&&c| c == b'/').count()));
    let mut merges = 0usize;
    for (from, to, on_disk, moved) in found {
        let below = rebased.remove(&from).unwrap_or_default();
        // Each merge waits for a clock tick or two: none where the disk has nothing
        // the seed did not copy, and a bounded number in all.
        if as_copied(&on_disk, &below) {
            followed.push(Followed {
                from,
                seen: Some(below),
            });
            continue;
        }
        if merges == MAX_FOLLOWED {
            tracing::warn!(
                "{}: more than {MAX_FOLLOWED} directories the application wrote in on disk during the seed were moved in RAM right after the switch; {} and those after it count as deleted there",
                m.name,
                String::from_utf8_lossy(&from)
            );
            break;
        }
        merges += 1;
        let mut base = Baseline {
            taken: Some(seed_started),
            ..Baseline::none()
        };
        agree_followed(disk.as_fd(), &followed, &mut base, &from);
        let (src, dst) = (proc_path(on_disk.as_fd()), proc_path(moved.as_fd()));
        let merged = merge_in((&src, &dst), (&base, Some(&below), deletions), touched, None);
        let (from_, to_) = (String::from_utf8_lossy(&from), String::from_utf8_lossy(&to));
        match merged {
            Ok(merged) => {
                tracing::info!(
                    "{}: {from_}, moved to {to_} in RAM right after the switch: brought in there what the application wrote in it on disk during the seed ({} files)",
                    m.name,
                    merged.stats.files_written
                );
                followed.push(Followed {
                    from,
                    seen: Some(merged.baseline),
                });
            }
            Err(e) => {
                tracing::warn!(
                    "{}: {from_}, moved to {to_} in RAM right after the switch: bringing in what the application wrote in it on disk during the seed: {e}; what the disk has there stays",
                    m.name
                );
                followed.push(Followed { from, seen: None });
            }
        }
    }
    for (file, went) in files {
        match seen.follow_file(file, went) {
            Ok(None) => {}
            Ok(Some((from, to))) => {
                tracing::info!(
                    "{}: {}, moved to {} in RAM right after the switch: its disk version, rewritten during the seed, is there now",
                    m.name,
                    String::from_utf8_lossy(&from),
                    String::from_utf8_lossy(&to)
                );
                followed.push(Followed {
                    from,
                    seen: Some(Baseline::none()),
                });
            }
            Err((from, e)) => {
                tracing::warn!(
                    "{}: {}, moved in RAM right after the switch: bringing in its disk version, rewritten during the seed: {e:#}; that stays on disk",
                    m.name,
                    String::from_utf8_lossy(&from)
                );
                followed.push(Followed { from, seen: None });
            }
        }
    }
    followed
}

/// Records in `base`, as both sides agree on them, the disk entries below `dir` that
/// the merges into the moved directories `followed` walked, by their paths from
/// `dir`: what the disk has where a moved directory was is in it now. A merge by path
/// then takes those for names the application deleted (or moved) in RAM, and does
/// not bring them back, also not into a directory it made there again.
pub(super) fn agree_followed(disk: BorrowedFd<'_>, followed: &[Followed], base: &mut Baseline, dir: &[u8]) {
    for path in walked_in(followed) {
        let rel = if dir.is_empty() {
            &path[..]
        } else {
            match path.strip_prefix(dir).and_then(|r| r.strip_prefix(b"/")) {
                Some(rel) => rel,
                None => continue,
            }
        };
        if let Ok(st) = stat_beneath(disk, &path) {
            base.marks.insert(rel, Mark::Entry(Sig::of(&st)));
        }
    }
}

/// Whether every entry below the disk directory `dir` is as the seed recorded it
/// (`copied`, by paths from there), and nothing else is there.
fn as_copied(dir: &OwnedFd, copied: &Baseline) -> bool {
    let mut found = 0usize;
    let mut dirs: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(rel) = dirs.pop() {
        let Ok(fd) = open_dir_beneath(dir.as_fd(), &rel) else {
            return false;
        };
        let Ok(names) = copy::read_names(&fd) else {
            return false;
        };
        for name in names {
            let path = join(&rel, name.to_bytes());
            let Ok(st) = stat::fstatat(&fd, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                return false;
            };
            if copied.get(&path) != Some(Mark::Entry(Sig::of(&st))) {
                return false;
            }
            found += 1;
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                dirs.push(path);
            }
        }
    }
    found == copied.marks.len()
}

/// A file followed where it was moved: its path at the switch and now; or none; or
/// why not, with its path at the switch.
type FileFollowed = Result<Option<(Vec<u8>, Vec<u8>)>, (Vec<u8>, anyhow::Error)>;

/// The directories the deletion watch saw go from a name in the tmpfs, by their own
/// handles, with where they went from; and where to look them up.
struct Moves<'a> {
    /// The tmpfs, open, and its path as this process sees it.
    ram: (BorrowedFd<'a>, &'a [u8]),
    /// The disk directory, hidden under the tmpfs.
    disk: BorrowedFd<'a>,
    /// The seed's records.
    copied: &'a Baseline,
    moves: &'a HashMap<Handle, WentFrom>,
    /// When the seed's copies were all made (the watch's time).
    switched: Option<Time>,
}

impl Moves<'_> {
    /// The directory `h` of the tmpfs, if it still has it.
    fn live(&self, h: &Handle) -> Option<OwnedFd> {
        open_handle(self.ram.0, h)
            .ok()
            .filter(|fd| stat::fstat(fd).is_ok_and(|st| st.st_nlink > 0))
    }

    fn path_now(&self, fd: &OwnedFd) -> Option<Vec<u8>> {
        below(self.ram.1, &fd_path(fd.as_fd())?)
    }

    /// A file of the seed's copies moved in RAM (`h`, moved away from `went`, the
    /// first first), still that copy, whose disk version was rewritten since the
    /// seed copied it: the disk's version replaces the copy where it is now, and its
    /// path at the switch and now are returned. The application moved the version
    /// it believed it had; left as it was, the rewrite was lost (the move counted as
    /// the name's deletion) or came back at the old name.
    fn follow_file(&self, h: &Handle, went: &[(Handle, Vec<u8>)]) -> FileFollowed {
        let Some(found) = self.moved_file(h, went) else {
            return Ok(None);
        };
        let (from, to, ours, on_disk) = found;
        let (dir, name) = match to.iter().rposition(|&c| c == b'/') {
            Some(i) => (&to[..i], &to[i + 1..]),
            None => (&b""[..], &to[..]),
        };
        let replaced = open_dir_beneath(self.ram.0, dir)
            .map_err(anyhow::Error::from)
            .and_then(|dir| {
                let name = CString::new(name)?;
                let there = stat::fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?;
                if there.st_ino != ours.st_ino {
                    return Ok(false);
                }
                let src = open_beneath(self.disk, &from)?;
                let st = stat::fstat(&src)?;
                if Sig::of(&st) != on_disk {
                    return Ok(false);
                }
                Ok(copy::replace_with_copy(
                    dir.as_fd(),
                    &name,
                    src,
                    &st,
                    &Sig::of(&ours),
                )?)
            });
        match replaced {
            Ok(true) => Ok(Some((from, to))),
            Ok(false) => Ok(None),
            Err(e) => Err((from, e)),
        }
    }

    /// For [`Self::follow_file`]: the file `h` if it is such a copy, with its path at
    /// the switch and now, its stat, and the disk version's record.
    fn moved_file(
        &self,
        h: &Handle,
        went: &[(Handle, Vec<u8>)],
    ) -> Option<(Vec<u8>, Vec<u8>, FileStat, Sig)> {
        let moved = open_handle(self.ram.0, h).ok()?;
        let st = stat::fstat(&moved).ok()?;
        // One with another name too may be changed through it: left to the merge.
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_nlink != 1 {
            return None;
        }
        if let (Some(born), Some(switched)) = (born(moved.as_fd(), c""), self.switched) {
            if born >= switched {
                return None;
            }
        }
        let (dir, name) = went.first()?;
        let (parent, _) = self.at_switch(dir, 0)?;
        let from = join(&parent, name);
        let Some(Mark::Entry(was)) = self.copied.get(&from) else {
            return None;
        };
        let now = Sig::of(&stat_beneath(self.disk, &from).ok()?);
        let rewritten = now.mode & libc::S_IFMT == libc::S_IFREG && !now.same_version(&was);
        let to = self.path_now(&moved)?;
        (rewritten && Sig::of(&st).same_version(&was) && to != from).then_some((from, to, st, now))
    }

    /// Where the directory `h` of the tmpfs was when it went in place, if the seed
    /// copied a directory there, with the disk directory it is the copy of. One moved
    /// since was at the first name it went from, in its directory then (`depth`:
    /// how many of those were looked up already); one born after the seed's copies
    /// (moved away, made again and moved once more) was nowhere.
    fn at_switch(&self, h: &Handle, depth: usize) -> Option<(Vec<u8>, OwnedFd)> {
        // Moves and directories above, looked up one by one: a chain longer than
        // this is not an application's cache.
        const DEEPEST: usize = 128;
        let Some(went) = self.moves.get(h) else {
            let fd = self.live(h)?;
            let path = if same_inode(fd.as_fd(), self.ram.0) {
                Vec::new()
            } else {
                // Not moved itself: in its directory then, which may have moved, under
                // the name it has now.
                if depth >= DEEPEST {
                    return None;
                }
                let now = self.path_now(&fd)?;
                let name = now.rsplit(|&c| c == b'/').next()?.to_vec();
                let up = nix::fcntl::openat(
                    &fd,
                    "..",
                    OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                    stat::Mode::empty(),
                )
                .ok()?;
                let (parent, _) = self.at_switch(&handle_of(up.as_fd()).ok()?, depth + 1)?;
                join(&parent, &name)
            };
            let on_disk = open_dir_beneath(self.disk, &path).ok()?;
            return Some((path, on_disk));
        };
        let born_later = || {
            let fd = self.live(h)?;
            Some(born(fd.as_fd(), c"")? >= self.switched?)
        };
        if depth >= DEEPEST || born_later() == Some(true) {
            return None;
        }
        let (dir, name) = went.first()?;
        let (parent, _) = self.at_switch(dir, depth + 1)?;
        let from = join(&parent, name);
        let Some(Mark::Entry(was)) = self.copied.get(&from) else {
            return None;
        };
        let on_disk = open_dir_beneath(self.disk, &from).ok()?;
        (was.is_dir() && stat::fstat(&on_disk).ok()?.st_ino as u64 == was.ino).then_some((from, on_disk))
    }
}
