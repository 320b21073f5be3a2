//! The only place that calls mount(2) and umount2(2).

use std::path::Path;

use std::os::unix::fs::DirBuilderExt;

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use serde::Serialize;

/// Owner, group and mode of a directory (the tmpfs root, the on-disk dir).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RootAttrs {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

impl RootAttrs {
    pub fn of(path: &Path) -> Result<RootAttrs> {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::symlink_metadata(path).with_context(|| format!("stat {}", path.display()))?;
        Ok(RootAttrs {
            uid: md.uid(),
            gid: md.gid(),
            mode: md.mode() & 0o7777,
        })
    }

    pub fn describe(&self) -> String {
        format!("{}:{} {:04o}", self.uid, self.gid, self.mode)
    }

    /// Of what `path` names after symlinks: what a mount on it covers.
    pub fn of_followed(path: &Path) -> Result<RootAttrs> {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
        anyhow::ensure!(md.is_dir(), "{} is not a directory", path.display());
        Ok(RootAttrs {
            uid: md.uid(),
            gid: md.gid(),
            mode: md.mode() & 0o7777,
        })
    }
}

/// Mounts a new filesystem of `fstype`; the backends build flags and data.
pub fn mount_fs(source: &str, target: &Path, fstype: &str, flags: MsFlags, data: &str) -> Result<()> {
    mount(Some(source), target, Some(fstype), flags, Some(data))
        .with_context(|| format!("mount -t {fstype} -o {data} {source} {}", target.display()))
}

/// MS_REMOUNT with flags and data as given.
pub fn remount(target: &Path, flags: MsFlags, data: &str) -> Result<(), Errno> {
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT | flags,
        Some(data),
    )
}

/// Binds `src` to `dst` and makes the bind private, before anything else is
/// mounted at `src`: a shared bind would receive the tmpfs by propagation.
pub fn bind_private(src: &Path, dst: &Path) -> Result<()> {
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .with_context(|| format!("bind {} to {}", src.display(), dst.display()))?;
    make_private(dst)
}

pub fn make_private(target: &Path) -> Result<()> {
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .with_context(|| format!("making {} a private mount", target.display()))
}

/// Makes the state directory `dir` a private mount (binding it onto itself if it
/// is not a mount point yet), so nothing mounted below it propagates anywhere.
pub fn ensure_private_dir(dir: &Path, table: &crate::host::mountinfo::MountTable) -> Result<()> {
    match table.top_at(dir) {
        Some(e) if e.is_private() => Ok(()),
        Some(_) => make_private(dir),
        None => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
            bind_private(dir, dir)
        }
    }
}

/// Makes `dir`, a mount point of tmpfsctl's in its state directory, a real directory:
/// created (0700, with missing parents) if absent; a symlink there is removed and
/// logged, never mounted through; anything else that is not a directory is refused
/// with its path.
pub fn ensure_mount_point(dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(m) if m.file_type().is_symlink() => {
            tracing::warn!(
                "{}: a symlink where tmpfsctl mounts; removed, not followed",
                dir.display()
            );
            std::fs::remove_file(dir).with_context(|| format!("removing the symlink {}", dir.display()))?;
        }
        Ok(_) => anyhow::bail!(
            "{} is not a directory, and tmpfsctl mounts there; remove it if nothing needs it",
            dir.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("checking {}", dir.display())),
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// Mounts a small private tmpfs for tmpfsctl's own records at `dir` (source `source`),
/// unless one is there already.
pub fn ensure_records_tmpfs(dir: &Path, source: &str) -> Result<()> {
    let table = crate::host::mountinfo::MountTable::read(Path::new("/proc/thread-self/mountinfo"))?;
    if table
        .top_at(dir)
        .is_some_and(|e| e.fstype == "tmpfs" && e.source == source)
    {
        return Ok(());
    }
    ensure_mount_point(dir)?;
    mount(
        Some(source),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=256m,nr_inodes=16384,mode=0700"),
    )
    .with_context(|| format!("mount -t tmpfs {source} {}", dir.display()))?;
    make_private(dir)
}

/// Moves a mount; the seeded tmpfs appears at `to` in one step.
pub fn move_mount(from: &Path, to: &Path) -> Result<()> {
    mount(Some(from), to, None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .with_context(|| format!("move mount {} to {}", from.display(), to.display()))
}

/// A detached copy of the mount tree at `path` (a bind mount of it, attached
/// nowhere): it keeps its filesystem alive without a mount point, and goes
/// with the descriptor when not attached by [`attach_tree`].
pub fn clone_tree(path: &Path) -> Result<std::os::fd::OwnedFd> {
    use nix::NixPath;
    use std::os::fd::FromRawFd;
    let fd = path
        .with_nix_path(|c| {
            // SAFETY: open_tree(2) reads the NUL-terminated path and returns a
            // new descriptor or -1; nothing else is touched.
            unsafe {
                libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC as libc::c_uint,
                )
            }
        })
        .with_context(|| format!("{} holds a NUL byte", path.display()))?;
    if fd < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("open_tree(OPEN_TREE_CLONE) {}", path.display()));
    }
    // SAFETY: a descriptor open_tree just returned, owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches a tree from [`clone_tree`] at `target`.
pub fn attach_tree(tree: std::os::fd::OwnedFd, target: &Path) -> Result<()> {
    use nix::NixPath;
    use std::os::fd::AsRawFd;
    let r = target
        .with_nix_path(|c| {
            // SAFETY: move_mount(2) reads the two NUL-terminated paths ("" and
            // the target) and the descriptor, which stays open across the call.
            unsafe {
                libc::syscall(
                    libc::SYS_move_mount,
                    tree.as_raw_fd(),
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    libc::MOVE_MOUNT_F_EMPTY_PATH,
                )
            }
        })
        .with_context(|| format!("{} holds a NUL byte", target.display()))?;
    if r < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("move_mount to {}", target.display()));
    }
    Ok(())
}

/// Unmounts if nothing uses the mount; `Ok(false)` when it is busy.
///
/// Busy is asked a few times over about 100 ms: a thread of this process that read
/// the mount (a write-back's worker) is joined before the kernel closes its files
/// (`do_exit` wakes the joiner before `exit_files`), so the first try can find the
/// mount busy with this process's own last reads (an overlay's `down` was detached
/// lazily instead of unmounted, once in a CI run).
pub fn unmount_if_idle(target: &Path) -> Result<bool> {
    unmount_if_idle_with(target, MntFlags::empty())
}

fn unmount_if_idle_with(target: &Path, flags: MntFlags) -> Result<bool> {
    for attempt in 0..5 {
        match umount2(target, flags) {
            Ok(()) => return Ok(true),
            Err(Errno::EBUSY) if attempt < 4 => std::thread::sleep(std::time::Duration::from_millis(25)),
            Err(Errno::EBUSY) => return Ok(false),
            Err(e) => return Err(e).with_context(|| format!("umount {}", target.display())),
        }
    }
    Ok(false)
}

/// A mount point, reached through its parent directory opened without following a
/// symlink, and checked to hold the mount the mount table showed there (by mount
/// ID). Binding from, remounting and unmounting `path()` (`/proc/self/fd/N/NAME`)
/// act on that mount. A user owning a directory above it can move that away and put
/// a symlink, or a directory of its own, in its place: by its name, `down` then
/// unmounted or bound as the tmpfs whatever that led to (a root-only mount
/// elsewhere). A mount point itself cannot be renamed, removed or replaced.
pub struct PinnedMount {
    parent: PinnedDir,
    name: std::ffi::OsString,
}

impl PinnedMount {
    /// `id`: the mount's ID in the mount table.
    pub fn open(path: &Path, id: u32) -> Result<PinnedMount> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            anyhow::bail!("{} is not a mount point tmpfsctl acts on", path.display());
        };
        let parent = PinnedDir::open(parent)?;
        let found = mount_id(parent.as_fd(), name).with_context(|| format!("statx {}", path.display()))?;
        anyhow::ensure!(
            found == u64::from(id),
            "{} is no longer the mount tmpfsctl found there (a directory above it was moved, and a symlink or another directory put in its place); nothing was done to it",
            path.display()
        );
        Ok(PinnedMount {
            parent,
            name: name.to_owned(),
        })
    }

    /// The ID of the mount at `name` in the pinned directory `parent`.
    pub fn id_at(parent: &PinnedDir, name: &std::ffi::OsStr) -> Result<u64, Errno> {
        mount_id(parent.as_fd(), name)
    }

    /// The path that reaches exactly this mount point.
    pub fn path(&self) -> std::path::PathBuf {
        self.parent.proc_path().join(&self.name)
    }

    /// See [`unmount_if_idle`].
    pub fn unmount_if_idle(&self) -> Result<bool> {
        unmount_if_idle_with(&self.path(), MntFlags::UMOUNT_NOFOLLOW)
    }

    pub fn detach(&self) -> Result<()> {
        let path = self.path();
        umount2(&path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW)
            .with_context(|| format!("umount -l {}", path.display()))
    }
}

/// The ID of the mount `name` in `dir` is on (the top one, where it is a mount
/// point), not following a symlink.
fn mount_id(dir: std::os::fd::BorrowedFd<'_>, name: &std::ffi::OsStr) -> Result<u64, Errno> {
    use nix::fcntl::{openat, OFlag};
    let fd = openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    mount_id_of(std::os::fd::AsFd::as_fd(&fd))
}

/// The ID (as in the mount table) of the mount the open file `fd` is on: `statx`'s
/// `STATX_MNT_ID` (Linux 5.8), else the `mnt_id` of its `/proc/self/fdinfo`.
pub fn mount_id_of(fd: std::os::fd::BorrowedFd<'_>) -> Result<u64, Errno> {
    use std::os::fd::AsRawFd;
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the path is a NUL-terminated empty string (with AT_EMPTY_PATH: the
    // descriptor itself) and `stx` is a writable statx buffer that outlives the
    // call; the kernel writes at most its size.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            stx.as_mut_ptr(),
        )
    };
    if r == 0 {
        // SAFETY: statx succeeded, so it filled the buffer (zeroed before, so every
        // field is initialised either way).
        let stx = unsafe { stx.assume_init() };
        if stx.stx_mask & libc::STATX_MNT_ID != 0 {
            return Ok(stx.stx_mnt_id);
        }
    }
    fdinfo_mount_id(fd)
}

fn fdinfo_mount_id(fd: std::os::fd::BorrowedFd<'_>) -> Result<u64, Errno> {
    use std::os::fd::AsRawFd;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(Errno::ENOSYS)
}

/// A directory opened (as O_PATH) without following any symlink on the
/// way. Mounting onto, binding from and chown/chmod of `proc_path()` act on
/// the directory that was checked, even if a symlink is swapped in later.
pub struct PinnedDir {
    fd: std::os::fd::OwnedFd,
}

impl PinnedDir {
    pub fn open(path: &Path) -> Result<PinnedDir> {
        use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag, AT_FDCWD};
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
        let fd = openat2(AT_FDCWD, path, how).with_context(|| {
            format!(
                "opening {} without following symlinks (is a symlink on the way?)",
                path.display()
            )
        })?;
        Ok(PinnedDir { fd })
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }

    /// The magic link that names exactly this directory.
    pub fn proc_path(&self) -> std::path::PathBuf {
        proc_path(self.as_fd())
    }
}

/// The magic link through which this process reaches the open file `fd`, wherever
/// it is now: a path built from names others can change would not be it.
pub fn proc_path(fd: std::os::fd::BorrowedFd<'_>) -> std::path::PathBuf {
    use std::os::fd::AsRawFd;
    format!("/proc/self/fd/{}", fd.as_raw_fd()).into()
}

/// Detaches every mount stacked at `target`.
pub fn detach_all(target: &Path) -> Result<()> {
    // A stack deeper than this is not something a crash leaves behind.
    for _ in 0..64 {
        match umount2(target, MntFlags::MNT_DETACH) {
            Ok(()) => {}
            Err(Errno::EINVAL) => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("umount -l {}", target.display())),
        }
    }
    anyhow::bail!("{} still has mounts after 64 detaches", target.display())
}

/// Moves the calling thread into a new mount namespace with every mount
/// private, so nothing mounted from here on can reach the host's table.
/// Children spawned from this thread inherit the namespace.
pub fn enter_private_namespace() -> Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).context("unshare(CLONE_NEWNS)")?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("making / private in the new mount namespace")
}

/// Joins the mount namespace `ns`: a PID's, or one named by a path
/// (mount(8)'s `-N`).
pub fn enter_namespace(ns: &str) -> Result<()> {
    let path = if !ns.is_empty() && ns.bytes().all(|b| b.is_ascii_digit()) {
        format!("/proc/{ns}/ns/mnt")
    } else {
        ns.to_string()
    };
    let f = std::fs::File::open(&path).with_context(|| format!("opening mount namespace {path}"))?;
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNS)
        .with_context(|| format!("entering mount namespace {path}"))
}

/// Lazy unmount: holders keep their open files; new lookups see what is below.
pub fn detach(target: &Path) -> Result<()> {
    umount2(target, MntFlags::MNT_DETACH).with_context(|| format!("umount -l {}", target.display()))
}

/// A scratch tmpfs of `size` bytes, root-only, for measurements (`bench --disk`);
/// its caller is in a private mount namespace.
pub fn mount_scratch_tmpfs(source: &str, target: &Path, size: u64) -> Result<()> {
    let data = format!("size={size},huge=never,mode=700");
    mount(
        Some(source),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .with_context(|| format!("mount -t tmpfs -o {data} {source} {}", target.display()))
}

/// Unmounts `target`, lazily if it is busy; for cleanups, which cannot fail.
pub fn unmount_or_detach(target: &Path) {
    if umount2(target, MntFlags::empty()).is_err() {
        let _ = umount2(target, MntFlags::MNT_DETACH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `statx` cannot tell a mount's ID (Linux before 5.8), `fdinfo` tells the
    /// same one; and both are the mount table's.
    #[test]
    fn the_mount_id_from_fdinfo_is_the_one_statx_and_the_table_give() {
        let root = PinnedDir::open(Path::new("/")).unwrap();
        let by_statx = mount_id_of(root.as_fd()).unwrap();
        assert_eq!(fdinfo_mount_id(root.as_fd()).unwrap(), by_statx);
        let table = crate::host::mountinfo::MountTable::read(Path::new("/proc/self/mountinfo")).unwrap();
        let top = table.top_at(Path::new("/")).unwrap();
        assert_eq!(u64::from(top.id), by_statx);
    }
}
