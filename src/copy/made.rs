//! Owner, mode and times of a symlink or node this process just made. Neither can
//! be opened for reading or writing, so the usual way is by name, and after
//! `down`'s switch the application works in the disk directory: it can swap the
//! name for a symlink, or (where `protected_hardlinks` is off) a hard link to a file
//! of root's, between the `mknod` and the `chmod`, and the mode would land on that
//! file. Here the entry is opened once with `O_PATH`, checked to be the one made,
//! and everything goes through that descriptor.

use std::ffi::CStr;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, FchmodatFlags, FileStat, Mode, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{self, Gid, Uid};

use super::error::{dst_err, Failed};
use super::xattrs::{self, fd_path, XattrBufs, XattrTarget};

/// What an entry gets from the one it copies.
pub(super) struct Attrs {
    uid: u32,
    gid: u32,
    perm: Mode,
    atime: TimeSpec,
    mtime: TimeSpec,
}

impl Attrs {
    pub(super) fn of(st: &FileStat) -> Attrs {
        Attrs {
            uid: st.st_uid,
            gid: st.st_gid,
            perm: Mode::from_bits_truncate(st.st_mode & 0o7777),
            atime: TimeSpec::new(st.st_atime, st.st_atime_nsec),
            mtime: TimeSpec::new(st.st_mtime, st.st_mtime_nsec),
        }
    }

    pub(super) fn of_metadata(md: &std::fs::Metadata) -> Attrs {
        Attrs {
            uid: md.uid(),
            gid: md.gid(),
            perm: Mode::from_bits_truncate(md.mode() & 0o7777),
            atime: TimeSpec::new(md.atime(), md.atime_nsec()),
            mtime: TimeSpec::new(md.mtime(), md.mtime_nsec()),
        }
    }
}

/// Opens `name` in `dir`, which this process just made as a `kind` (`S_IFLNK`,
/// `S_IFIFO`, ...): refused unless it still is one of this process's with one name.
/// Returns it and its stat.
pub(super) fn open_made(
    dir: BorrowedFd<'_>,
    name: &CStr,
    kind: libc::mode_t,
) -> Result<(OwnedFd, FileStat), Failed> {
    let fd = fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(dst_err("open the entry just made"))?;
    let st = stat::fstat(&fd).map_err(dst_err("stat"))?;
    let euid = unistd::geteuid().as_raw();
    if st.st_mode & libc::S_IFMT != kind || st.st_uid != euid || st.st_nlink != 1 {
        return Err(dst_err("set metadata of")(io::Error::other(format!(
            "not the entry just made: type {:o}, owner {}, {} names, where a new {:o} of uid {euid} \
             with one name was expected (replaced meanwhile, or a filesystem that does not \
             give new entries their maker's uid)",
            st.st_mode & libc::S_IFMT,
            st.st_uid,
            st.st_nlink,
            kind,
        ))));
    }
    Ok((fd, st))
}

/// Gives the entry `made` (from [`open_made`]) the owner, mode and times of `attrs`
/// and the extended attributes of `src`; with `exact`, also removes those `src`
/// lacks. Owner first (chown clears setuid/setgid and capabilities), times last.
pub(super) fn set_made(
    made: BorrowedFd<'_>,
    attrs: &Attrs,
    src: XattrTarget<'_>,
    bufs: &mut XattrBufs,
    exact: bool,
) -> Result<(), Failed> {
    unistd::fchownat(
        made,
        c"",
        Some(Uid::from_raw(attrs.uid)),
        Some(Gid::from_raw(attrs.gid)),
        AtFlags::AT_EMPTY_PATH,
    )
    .map_err(dst_err("set owner of"))?;
    let dst = XattrTarget::Opath(made);
    if exact {
        xattrs::sync_xattrs(src, dst, bufs)?;
    } else {
        xattrs::copy_xattrs(src, dst, bufs)?;
    }
    let mut buf = Vec::new();
    let path = fd_path(&mut buf, made);
    let is_symlink = stat::fstat(made).map_err(dst_err("stat"))?.st_mode & libc::S_IFMT == libc::S_IFLNK;
    // A symlink's mode is fixed at 0777 on Linux.
    if !is_symlink {
        stat::fchmodat(fcntl::AT_FDCWD, path, attrs.perm, FchmodatFlags::FollowSymlink)
            .map_err(dst_err("set mode of"))?;
    }
    stat::utimensat(
        fcntl::AT_FDCWD,
        path,
        &attrs.atime,
        &attrs.mtime,
        UtimensatFlags::FollowSymlink,
    )
    .map_err(dst_err("set times of"))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::fd::AsFd;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    use super::*;

    fn set_times(p: &std::path::Path, atime: TimeSpec, mtime: TimeSpec) {
        stat::utimensat(
            fcntl::AT_FDCWD,
            p,
            &atime,
            &mtime,
            UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
    }

    /// Gives `made` in `dir` (of `kind`) the metadata of `src` there.
    fn copy_metadata(dir: &fs::File, src: &CStr, made: &CStr, kind: libc::mode_t) {
        let (fd, _) = open_made(dir.as_fd(), made, kind).unwrap();
        let st = stat::fstatat(dir.as_fd(), src, AtFlags::AT_SYMLINK_NOFOLLOW).unwrap();
        set_made(
            fd.as_fd(),
            &Attrs::of(&st),
            XattrTarget::At(dir.as_fd(), src),
            &mut XattrBufs::default(),
            true,
        )
        .unwrap();
    }

    #[test]
    fn a_node_gets_the_metadata_through_its_descriptor() {
        let d = tempfile::tempdir().unwrap();
        let dir = fs::File::open(d.path()).unwrap();
        let (src, made) = (d.path().join("src"), d.path().join("made"));
        unistd::mkfifo(&src, Mode::from_bits_truncate(0o640)).unwrap();
        set_times(&src, TimeSpec::new(1_000, 1), TimeSpec::new(2_000, 2));
        unistd::mkfifo(&made, Mode::S_IRUSR | Mode::S_IWUSR).unwrap();
        copy_metadata(&dir, c"src", c"made", libc::S_IFIFO);
        let md = fs::symlink_metadata(&made).unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, 0o640);
        assert_eq!((md.mtime(), md.mtime_nsec(), md.atime()), (2_000, 2, 1_000));
    }

    #[test]
    fn a_symlinks_times_are_its_own_and_not_its_targets() {
        let d = tempfile::tempdir().unwrap();
        let dir = fs::File::open(d.path()).unwrap();
        let target = d.path().join("target");
        fs::write(&target, b"x").unwrap();
        let before = fs::metadata(&target).unwrap();
        symlink("target", d.path().join("src")).unwrap();
        symlink("target", d.path().join("made")).unwrap();
        set_times(
            &d.path().join("src"),
            TimeSpec::new(1_000, 0),
            TimeSpec::new(3_000, 0),
        );
        copy_metadata(&dir, c"src", c"made", libc::S_IFLNK);
        assert_eq!(
            fs::symlink_metadata(d.path().join("made")).unwrap().mtime(),
            3_000
        );
        let after = fs::metadata(&target).unwrap();
        assert_eq!(
            (after.mtime(), after.mtime_nsec(), after.mode()),
            (before.mtime(), before.mtime_nsec(), before.mode())
        );
    }

    #[test]
    fn an_entry_swapped_in_for_the_one_made_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let dir = fs::File::open(d.path()).unwrap();
        let victim = d.path().join("victim");
        fs::write(&victim, b"x").unwrap();
        // A symlink where a FIFO was made.
        symlink(&victim, d.path().join("link")).unwrap();
        assert!(open_made(dir.as_fd(), c"link", libc::S_IFIFO).is_err());
        // A hard link to another file where a file of that type was made.
        fs::hard_link(&victim, d.path().join("hard")).unwrap();
        assert!(open_made(dir.as_fd(), c"hard", libc::S_IFREG).is_err());
        fs::remove_file(d.path().join("hard")).unwrap();
        assert!(open_made(dir.as_fd(), c"victim", libc::S_IFREG).is_ok());
        if unistd::geteuid().is_root() {
            // Another user's, moved to the name.
            unistd::mkfifo(&d.path().join("theirs"), Mode::S_IRUSR).unwrap();
            unistd::chown(&d.path().join("theirs"), Some(Uid::from_raw(65_534)), None).unwrap();
            assert!(open_made(dir.as_fd(), c"theirs", libc::S_IFIFO).is_err());
        }
    }
}
