//! Putting a finished entry in place of a disk name, and removing a disk name, only
//! as the walk compared it: the application works in the disk directory while a held
//! tmpfs is merged. Shared by the walk and the workers that put files in place.

use std::ffi::CStr;
use std::os::fd::{BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag, RenameFlags};
use nix::sys::stat::{self, FileStat, Mode};
use nix::unistd::{self, UnlinkatFlags};

use super::baseline::{Sig, Time};

/// Deletions on the disk side that the directory itself does not show: while the
/// application works in the disk directory during the merge (after a switch), a name
/// the RAM created may be created there again and deleted.
pub trait DiskDeletions {
    /// When `name` was deleted from the disk directory open at `dir`, if it was.
    fn deleted(&mut self, dir: BorrowedFd<'_>, name: &CStr) -> Option<Time>;

    /// The directories that were `name` in `dir` and were deleted, as keys for
    /// [`Self::deleted_in`], as far as the watch knows them: `dir` is the disk
    /// directory open there, or (`Err`) the key of one deleted too.
    fn gone_dirs(&mut self, dir: Result<BorrowedFd<'_>, &[u8]>, name: &CStr) -> Vec<Vec<u8>>;

    /// When `name` was deleted from the deleted directory `gone` (a key from
    /// [`Self::gone_dir`]), if it was.
    fn deleted_in(&mut self, gone: &[u8], name: &CStr) -> Option<Time>;

    /// Whether the directory open at `dir` was seen leaving a name: the application
    /// moved it to where it is now.
    fn moved_here(&mut self, dir: BorrowedFd<'_>) -> bool;
}

/// Renames `temp` to `name` in `dir` unless `name` exists: `Ok(false)` then. A
/// filesystem without `RENAME_NOREPLACE` gets a plain rename after a check, which
/// leaves a window.
pub(super) fn rename_no_replace(dir: BorrowedFd<'_>, temp: &CStr, name: &CStr) -> nix::Result<bool> {
    match fcntl::renameat2(dir, temp, dir, name, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => Ok(true),
        Err(Errno::EEXIST) => Ok(false),
        Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => {
            match stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(_) => Ok(false),
                Err(Errno::ENOENT) => fcntl::renameat(dir, temp, dir, name).map(|()| true),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// A disk entry as the walk compared it. The application works in the disk directory
/// while a held tmpfs is merged, so by the time the walk replaces or removes the
/// entry, it may have replaced or changed it: then its entry stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    ino: u64,
    mode: u32,
    size: i64,
    /// Not the ctime: the walk's own rename changes it.
    mtime: Time,
}

impl Seen {
    /// The same, from a stat taken through `std`.
    pub(super) fn of_metadata(md: &std::fs::Metadata) -> Seen {
        use std::os::unix::fs::MetadataExt;
        Seen {
            ino: md.ino(),
            mode: md.mode(),
            size: md.size() as i64,
            mtime: (md.mtime(), md.mtime_nsec()),
        }
    }

    pub(super) fn of(st: &FileStat) -> Seen {
        let sig = Sig::of(st);
        Seen {
            ino: sig.ino,
            mode: sig.mode,
            size: sig.size,
            mtime: sig.mtime,
        }
    }
}

/// How a finished temporary goes in place of its name.
#[derive(Debug, Clone, Copy)]
pub(super) enum Place {
    /// Only if the name is still free.
    Free,
    /// Only over the entry the walk compared.
    Over(Seen),
}

/// What became of a temporary to put in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Placed {
    Yes,
    /// The application took the name, or replaced or changed the entry, since the
    /// walk compared it: the application's entry stays; the temporary is the caller's
    /// to drop.
    Taken,
    /// The application deleted the entry since the walk compared it: that deletion is
    /// the newer change, and stays.
    Deleted,
}

/// Puts `temp` in place of `name` in `dir` as `place` says.
///
/// Over an entry, the two are exchanged atomically (`RENAME_EXCHANGE`) and what came
/// out is checked to be the entry compared: if it is, it is unlinked; if not, the
/// exchange is undone ([`give_back`]). A filesystem without exchange gets a plain
/// rename after a check, which leaves a window.
pub(super) fn put_in_place(
    dir: BorrowedFd<'_>,
    temp: &CStr,
    name: &CStr,
    place: Place,
) -> nix::Result<Placed> {
    let seen = match place {
        Place::Free => {
            return rename_no_replace(dir, temp, name).map(|ok| if ok { Placed::Yes } else { Placed::Taken })
        }
        Place::Over(seen) => seen,
    };
    let still = |at: &CStr| match stat::fstatat(dir, at, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(Seen::of(&st) == seen)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    };
    let ours = hold(dir, temp)?;
    match fcntl::renameat2(dir, temp, dir, name, RenameFlags::RENAME_EXCHANGE) {
        Ok(()) => match still(temp)? {
            Some(true) | None => {
                match unistd::unlinkat(dir, temp, UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => {}
                    Err(e) => return Err(e),
                }
                Ok(Placed::Yes)
            }
            Some(false) => give_back(dir, temp, name, ours),
        },
        // Which side is missing: the name (the application deleted it: its deletion
        // stays), or the temporary (someone removed it: an error, never a deletion).
        Err(Errno::ENOENT) => match still(temp)? {
            Some(_) => Ok(Placed::Deleted),
            None => Err(Errno::ENOENT),
        },
        Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => match still(name)? {
            Some(true) => fcntl::renameat(dir, temp, dir, name).map(|()| Placed::Yes),
            Some(false) => Ok(Placed::Taken),
            None => Ok(Placed::Deleted),
        },
        Err(e) => Err(e),
    }
}

/// Holds the entry `name` in `dir` open (`O_PATH`, so any type), to recognise it
/// later by inode: while it is held, its inode cannot be freed and its number reused
/// for an entry the application creates.
fn hold(dir: BorrowedFd<'_>, name: &CStr) -> nix::Result<OwnedFd> {
    fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

fn same_inode(held: &OwnedFd, dir: BorrowedFd<'_>, name: &CStr) -> nix::Result<bool> {
    let a = stat::fstat(held)?;
    let b = stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    Ok((a.st_dev, a.st_ino) == (b.st_dev, b.st_ino))
}

/// How often [`give_back`] exchanges before it gives up: each extra round needs the
/// application to rename over the name between two system calls of ours.
const GIVE_BACK_ROUNDS: usize = 10_000;

/// Undoes an exchange: `temp` holds the application's entry, which changed since the
/// walk compared it, and `name` holds `placed`, the entry the exchange put there.
///
/// A second exchange puts the application's entry back. But the application may have
/// replaced `name` meanwhile (renamed a newer version over it). Then a plain undo
/// would leave the older version under the name and hand the newer one to the caller
/// to drop. So each round first looks: if `name` no longer holds what was put there,
/// the application's newer version (or its deletion) is there and stays, and `temp`
/// is stale. Otherwise the exchange is made, and if what comes out is not what was
/// put in (the application renamed between the look and the exchange), the newest
/// version is now in `temp`, and the next round puts it back.
///
/// `Taken` when the application's entry ends under the name; `Deleted` when the
/// application deleted the name meanwhile: its deletion is the newest change.
///
/// `EBUSY` after [`GIVE_BACK_ROUNDS`] rounds, each lost to a rename between two
/// adjacent system calls of ours: the name then holds an application's version, but
/// `temp` may hold a newer one, which the caller removes with its temporary. Only
/// an application renaming over one name without pause for the whole time can get
/// there, and its next rename replaces the name anyway.
fn give_back(dir: BorrowedFd<'_>, temp: &CStr, name: &CStr, placed: OwnedFd) -> nix::Result<Placed> {
    let mut placed = placed;
    for _ in 0..GIVE_BACK_ROUNDS {
        match same_inode(&placed, dir, name) {
            Ok(true) => {}
            Ok(false) => return Ok(Placed::Taken),
            Err(Errno::ENOENT) => return Ok(Placed::Deleted),
            Err(e) => return Err(e),
        }
        let going_in = hold(dir, temp)?;
        match fcntl::renameat2(dir, temp, dir, name, RenameFlags::RENAME_EXCHANGE) {
            Ok(()) => {}
            Err(Errno::ENOENT) => return Ok(Placed::Deleted),
            Err(e) => return Err(e),
        }
        if same_inode(&placed, dir, temp)? {
            return Ok(Placed::Taken);
        }
        placed = going_in;
    }
    Err(Errno::EBUSY)
}

/// Removes the non-directory `name` from `dir` if it is still the entry the walk
/// compared (`seen`): it is renamed away to `temp` first (atomically), checked, then
/// unlinked, or put back. Returns whether it went; false too when it was gone.
pub(super) fn remove_seen(dir: BorrowedFd<'_>, name: &CStr, seen: Seen, temp: &CStr) -> nix::Result<bool> {
    match fcntl::renameat2(dir, name, dir, temp, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => {}
        Err(Errno::ENOENT) => return Ok(false),
        Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => {
            return match stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) if Seen::of(&st) == seen => {
                    match unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
                        Ok(()) => Ok(true),
                        Err(Errno::ENOENT) => Ok(false),
                        Err(e) => Err(e),
                    }
                }
                Ok(_) | Err(Errno::ENOENT) => Ok(false),
                Err(e) => Err(e),
            }
        }
        Err(e) => return Err(e),
    }
    let same = match stat::fstatat(dir, temp, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Seen::of(&st) == seen,
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e),
    };
    if same {
        unistd::unlinkat(dir, temp, UnlinkatFlags::NoRemoveDir)?;
        return Ok(true);
    }
    // Changed since it was compared: the application's; back under its name, unless
    // the application made a newer one there meanwhile.
    if !rename_no_replace(dir, temp, name)? {
        unistd::unlinkat(dir, temp, UnlinkatFlags::NoRemoveDir)?;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::AsFd;

    use super::*;

    /// The application replaces, changes or deletes an entry after the walk compared it:
    /// its version stays.
    #[test]
    fn entries_are_replaced_or_removed_only_as_compared() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dir = File::open(tmp.path()).unwrap();
        let at = dir.as_fd();
        let p = |n: &str| tmp.path().join(n);
        let seen = |n: &str| Seen::of(&stat::stat(&p(n)).unwrap());
        std::fs::write(p("a"), "disk").unwrap();
        let compared = seen("a");
        std::fs::write(p("t"), "ram").unwrap();
        assert_eq!(
            put_in_place(at, c"t", c"a", Place::Over(compared)).unwrap(),
            Placed::Yes
        );
        assert_eq!(std::fs::read_to_string(p("a")).unwrap(), "ram");
        assert!(!p("t").exists());
        // Replaced by the application after the comparison.
        let compared = seen("a");
        std::fs::write(p("new"), "app").unwrap();
        std::fs::rename(p("new"), p("a")).unwrap();
        std::fs::write(p("t"), "ram2").unwrap();
        assert_eq!(
            put_in_place(at, c"t", c"a", Place::Over(compared)).unwrap(),
            Placed::Taken
        );
        assert_eq!(std::fs::read_to_string(p("a")).unwrap(), "app");
        assert_eq!(std::fs::read_to_string(p("t")).unwrap(), "ram2");
        // Deleted by the application.
        let compared = seen("a");
        std::fs::remove_file(p("a")).unwrap();
        assert_eq!(
            put_in_place(at, c"t", c"a", Place::Over(compared)).unwrap(),
            Placed::Deleted
        );
        assert!(!p("a").exists());
        // Removal: only the compared entry goes.
        std::fs::write(p("b"), "v1").unwrap();
        let compared = seen("b");
        assert!(remove_seen(at, c"b", compared, c".tmpfsctl-x").unwrap());
        assert!(!p("b").exists());
        std::fs::write(p("b"), "v1").unwrap();
        let compared = seen("b");
        std::fs::write(p("b"), "longer v2").unwrap();
        assert!(!remove_seen(at, c"b", compared, c".tmpfsctl-x").unwrap());
        assert_eq!(std::fs::read_to_string(p("b")).unwrap(), "longer v2");
        assert!(!p(".tmpfsctl-x").exists());
        assert!(!remove_seen(at, c"gone", compared, c".tmpfsctl-x").unwrap());
    }

    /// The application renames a newer version over the name while an exchange is
    /// being undone: the newest version ends under the name, whatever the order.
    #[test]
    fn giving_back_keeps_the_newest_version() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dir = File::open(tmp.path()).unwrap();
        let at = dir.as_fd();
        let p = |n: &str| tmp.path().join(n);
        let held = |n: &str| hold(at, &std::ffi::CString::new(n).unwrap()).unwrap();
        // The exchange put ours under the name; the app's version came out.
        std::fs::write(p("a"), "ours").unwrap();
        std::fs::write(p("t"), "app v1").unwrap();
        assert_eq!(give_back(at, c"t", c"a", held("a")).unwrap(), Placed::Taken);
        assert_eq!(std::fs::read_to_string(p("a")).unwrap(), "app v1");
        assert_eq!(std::fs::read_to_string(p("t")).unwrap(), "ours");
        // Before the undo, the app renamed v2 over the name (over ours).
        std::fs::write(p("a"), "ours").unwrap();
        let ours = held("a");
        std::fs::write(p("t"), "app v1").unwrap();
        std::fs::write(p("new"), "app v2").unwrap();
        std::fs::rename(p("new"), p("a")).unwrap();
        assert_eq!(give_back(at, c"t", c"a", ours).unwrap(), Placed::Taken);
        assert_eq!(std::fs::read_to_string(p("a")).unwrap(), "app v2");
        assert_eq!(std::fs::read_to_string(p("t")).unwrap(), "app v1");
        // Before the undo, the app deleted the name (ours): its deletion stays.
        std::fs::write(p("a"), "ours").unwrap();
        let ours = held("a");
        std::fs::remove_file(p("a")).unwrap();
        assert_eq!(give_back(at, c"t", c"a", ours).unwrap(), Placed::Deleted);
        assert!(!p("a").exists());
    }

    /// An application renaming versions over the name as fast as it can, while the
    /// walk puts its stale copy in place again and again: its last version stays.
    #[test]
    fn a_stale_copy_never_replaces_a_version_renamed_in_meanwhile() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dir = File::open(tmp.path()).unwrap();
        let at = dir.as_fd();
        let p = |n: &str| tmp.path().join(n);
        std::fs::write(p("a"), "compared").unwrap();
        let compared = Seen::of(&stat::stat(&p("a")).unwrap());
        let versions = 5_000;
        let app = {
            let (a, new) = (p("a"), p("new"));
            std::thread::spawn(move || {
                for v in 0..versions {
                    std::fs::write(&new, format!("v{v}")).unwrap();
                    std::fs::rename(&new, &a).unwrap();
                }
            })
        };
        while std::fs::read_to_string(p("a")).unwrap() == "compared" {
            std::thread::yield_now();
        }
        while !app.is_finished() {
            std::fs::write(p("t"), "stale").unwrap();
            let placed = put_in_place(at, c"t", c"a", Place::Over(compared)).unwrap();
            assert_eq!(placed, Placed::Taken);
            std::fs::remove_file(p("t")).unwrap();
        }
        app.join().unwrap();
        assert_eq!(
            std::fs::read_to_string(p("a")).unwrap(),
            format!("v{}", versions - 1)
        );
    }

    #[test]
    fn a_no_replace_rename_leaves_a_name_taken_meanwhile_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("temp"), "ours").unwrap();
        std::fs::write(dir.path().join("taken"), "theirs").unwrap();
        let fd = super::super::ops::open_root(dir.path()).expect("open");
        assert!(!rename_no_replace(fd.as_fd(), c"temp", c"taken").unwrap());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("taken")).unwrap(),
            "theirs"
        );
        assert!(rename_no_replace(fd.as_fd(), c"temp", c"free").unwrap());
        assert_eq!(std::fs::read_to_string(dir.path().join("free")).unwrap(), "ours");
    }
}
