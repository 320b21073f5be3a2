//! The write-back of `seed: overlay`: the overlay's upper layer (a tmpfs) merged
//! into its lower layer, the disk directory. The upper layer holds only what the
//! application changed: a whiteout (a character device 0:0) is a deletion, a
//! directory with `trusted.overlay.opaque=y` replaces the lower one, every other
//! entry is written over the disk's. Nothing else writes to the lower layer while
//! the overlay is mounted (the disk directory is hidden under it and reachable
//! only through the root-only side bind), so the merge needs no baseline: what the
//! upper layer holds is newer than the disk, by construction.
//!
//! Every write to the lower layer is one the overlay cannot see: the entry it
//! writes is shadowed by the upper entry it copies (docs/overlay.md). The one
//! exception is a directory the application created (a pure upper directory):
//! the overlay looks in no lower layer below it, so deleting a file there leaves
//! no whiteout. The lower copy of such a directory would then bring deleted
//! names back once its dentry leaves the cache. So before such a directory is
//! first created on disk, the upper one is marked opaque: the overlay then keeps
//! treating it as the whole directory (as it already did), and so does the merge.
//!
//! A name new to the disk directory races with the application's deletion of it:
//! overlayfs decides whether an unlink or rename leaves a whiteout by looking the
//! name up in the lower layer, so one deleted while the merge was writing it may
//! leave none, and the merge's copy would come back. Such names are checked
//! again after a barrier: a file created and removed through the overlay in the
//! same directory, which waits for any unlink or rename there in flight (they
//! hold the directory's lock). Every later one sees the lower name and leaves a
//! whiteout; a name gone from the upper layer without one was deleted before,
//! and its copy is removed.
//!
//! What the upper layer deleted (a whiteout, or a name an opaque directory lacks)
//! goes from the disk last, once every file the pass wrote is durable in place: the
//! application may have moved that file's data to a name the walk reaches later (a
//! rename through overlayfs copies the file up under its new name and leaves a
//! whiteout at the old), and a power cut between the removal and that copy would
//! leave the data on no name.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, Mode, SFlag};
use nix::unistd::{self, UnlinkatFlags};

use super::baseline::Time;
use super::error::Failed;
use super::made::{self, Attrs};
use super::ops::{link_checked, open_below, open_dst_dir, split_parent};
use super::place::{put_in_place, remove_seen, Place, Placed, Seen};
use super::placings::Placings;
use super::writeback::{remove_entry, remove_older, remove_older_deleted};
use super::xattrs::{self, XattrBufs, XattrTarget};

/// The xattr overlayfs marks an opaque directory with.
pub const OPAQUE: &str = "trusted.overlay.opaque";
/// The prefix of the merge's temporary names in the disk directory.
pub const TEMP_PREFIX: &str = ".tmpfsctl-ovl.";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OverlayStats {
    /// Files, symlinks and special files written to the disk directory.
    pub written: u64,
    pub bytes: u64,
    /// Disk entries removed for a whiteout or an opaque directory.
    pub removed: u64,
    /// Directories created on disk.
    pub dirs: u64,
    /// Entries of the upper layer already equal to the disk's.
    pub unchanged: u64,
    /// Entries left alone because the disk side changed them after `disk_since`
    /// (the application, once switched back to its disk directory).
    pub kept_disk: u64,
}

/// Which part of the upper layer a pass writes, and what it must not overwrite.
#[derive(Debug, Clone, Copy, Default)]
pub struct Window {
    /// Only upper entries changed (ctime) at or after this time; `None`: all.
    pub upper_since: Option<Time>,
    /// The disk directory is the application's again since this time: a disk
    /// entry changed at or after it is the later change and is kept, and a name
    /// deleted there (told by `deleted`) is not brought back.
    pub disk_since: Option<Time>,
}

/// What the application did in its disk directory after `window.disk_since`, as a
/// watch of it saw (see [`merge_upper`]).
pub trait AppOnDisk {
    /// It deleted `name` in the disk directory at `dir` (a path through the walk's
    /// descriptor of it, `/proc/self/fd/N`).
    fn deleted(&mut self, dir: &Path, name: &OsStr) -> bool;
    /// It moved the directory open at `dir` to where it is now.
    fn moved_here(&mut self, dir: BorrowedFd<'_>) -> bool;
    /// Earlier directories at `name` in the disk directory at `dir` that it
    /// removed or moved away, and at `name` in the earlier directories `above` (at
    /// `dir`'s path), as keys for [`Self::deleted_in`].
    fn gone_dirs(&mut self, _dir: &Path, _above: &[Vec<u8>], _name: &OsStr) -> Vec<Vec<u8>> {
        Vec::new()
    }
    /// `name` is gone from the earlier directory `gone` (see [`Self::gone_dirs`])
    /// as the application left it: it deleted it there, or (with `moved`) moved
    /// the directory away with it, holding it from before `since` (the switch;
    /// `dir`: a disk directory, for the filesystem).
    fn deleted_in(&mut self, _dir: &Path, _gone: &[u8], _name: &OsStr, _since: Time, _moved: bool) -> bool {
        false
    }
}

/// Merges the upper layer `upper` into the disk directory `disk`. `merged`: where
/// the overlay is mounted (the barriers go through it), `None` when it is not.
/// `app`: what the application did on disk after `window.disk_since` (unused
/// without it). `placed`: what earlier attempts since that switch put on disk
/// themselves, where this one notes what it puts there (see [`Placings`]).
pub fn merge_upper(
    upper: &Path,
    disk: &Path,
    merged: Option<&Path>,
    window: Window,
    app: &mut (dyn AppOnDisk + Send),
    placed: &mut Placings,
) -> Result<OverlayStats> {
    // One descriptor is held per level of the walk.
    super::ops::descriptor_limit();
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("overlay-merge".into())
            .stack_size(WALK_STACK)
            .spawn_scoped(s, || merge(upper, disk, merged, window, app, placed))
            .context("starting the overlay merge's thread")?
            .join()
            .unwrap_or_else(|panicked| std::panic::resume_unwind(panicked))
    })
}

/// The walk recurses once per directory level, and holds two descriptors per level:
/// [`MAX_DEPTH`] levels at most, and a stack with room for them, in the merge's own
/// thread (only what is touched is memory; a level takes about 2 KiB of it in a
/// release build).
const WALK_STACK: usize = 256 << 20;
const MAX_DEPTH: usize = 16_384;
/// How deep the walk goes: [`MAX_DEPTH`], or fewer where the limit on open files
/// allows fewer (it then fails with an error naming the depth, not with `EMFILE`
/// somewhere down the tree). An eighth of the limit, and at least 1,024, is kept
/// for what is open beside the walk's levels: the files it copies, the caller's.
fn max_depth() -> usize {
    let fds = usize::try_from(super::ops::descriptor_limit()).unwrap_or(usize::MAX);
    MAX_DEPTH.min(fds.saturating_sub((fds / 8).max(1024)) / 2)
}

fn merge(
    upper: &Path,
    disk: &Path,
    merged: Option<&Path>,
    window: Window,
    app: &mut dyn AppOnDisk,
    placed: &mut Placings,
) -> Result<OverlayStats> {
    let mut m = Merge {
        window,
        app,
        placed,
        stats: OverlayStats::default(),
        links: HashMap::new(),
        touched: HashSet::new(),
        upper,
        merged,
        xattrs: XattrBufs::default(),
        deferred: Vec::new(),
        depth: 0,
        max_depth: max_depth(),
        gone: Vec::new(),
        deferred_meta: Vec::new(),
        disk,
    };
    let mut walked = m.walk();
    if walked.as_ref().is_err_and(no_space) {
        // What the upper layer deleted frees space for what did not fit: once more.
        match m.remove_deferred() {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!("overlay write-back: out of space; {n} entries the upper layer deleted removed, merging again");
                // What the first walk wrote counts as written; the second finds it
                // in place (unchanged, or after the switch as the disk's).
                let first = std::mem::take(&mut m.stats);
                walked = m.walk();
                m.stats.written += first.written;
                m.stats.bytes += first.bytes;
                m.stats.dirs += first.dirs;
                m.stats.removed += first.removed;
            }
            Err(also) => tracing::debug!("overlay write-back: out of space, then removing: {also:#}"),
        }
    }
    walked?;
    m.remove_deferred()?;
    m.apply_deferred_meta()?;
    Ok(m.stats)
}

/// The record of what the pass placed could not be written: never taken for the
/// disk running out of space (no `io::Error` in its chain), whose handling merges
/// again.
fn placings_failed(e: io::Error, shown: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "recording that {} was written back, in the records area: {e}",
        shown.display()
    )
}

/// The disk ran out of space (or the quota).
fn no_space(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
            .is_some_and(|n| n == libc::ENOSPC || n == libc::EDQUOT)
            || c.downcast_ref::<super::CopyError>()
                .is_some_and(super::CopyError::is_no_space)
    })
}

/// A directory of the walk, on either side: `path` for messages (and, on disk, the
/// fsync set and the deletion watch); `via`, `/proc/self/fd/N` of a descriptor
/// opened relative to its parent's without following a symlink, for every system
/// call in it. The application changes both sides while the walk runs: the upper
/// layer through the overlay, the disk directory after `down`'s switch. Renaming a
/// directory the walk is in and planting a symlink at its name leads the walk
/// nowhere else: not to read a file outside the tree, nor to write into one.
#[derive(Clone, Copy)]
struct Held<'p> {
    path: &'p Path,
    via: &'p Path,
}

/// `/proc/self/fd/N` of the directory `held`: a path to it that no rename or symlink
/// elsewhere changes.
fn via(held: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()))
}

impl Held<'_> {
    /// The directory itself, again (`via` is a link to it, not a name in it).
    fn open(&self) -> Result<File> {
        File::open(self.via).with_context(|| ctx("opening", self.path))
    }
}

/// A disk directory's metadata held back until the removals below it are made (a
/// directory the user made in the overlay in place of root's 0700 one would give
/// root's files in it to the user until then): both directories relative to their
/// roots, and their device and inode when decided.
struct HeldMeta {
    disk: PathBuf,
    disk_id: (u64, u64),
    upper: PathBuf,
    upper_id: (u64, u64),
}

/// Whether giving `d` the owner and mode of `u` lets anyone more in: another owner
/// or group, or a permission bit `d` lacks.
fn opens_up(u: &fs::Metadata, d: &fs::Metadata) -> bool {
    (u.uid(), u.gid()) != (d.uid(), d.gid()) || u.mode() & !d.mode() & 0o7777 != 0
}

/// A name the upper layer deleted, as the walk found it on disk: removed after it.
struct Gone {
    /// Its disk directory, relative to the disk root, and that directory's device
    /// and inode then: one moved or replaced since is not the one decided on.
    dir: PathBuf,
    dir_id: (u64, u64),
    name: OsString,
    ino: u64,
    is_dir: bool,
    /// Its birth time, where the filesystem keeps one: a directory made again at
    /// the name can have the same inode number.
    born: Option<std::time::SystemTime>,
    /// The upper directory the walk held, relative to the upper root, and its
    /// device and inode then, whose metadata the disk one gets back after: the
    /// application may move it away through the overlay and put another (its
    /// own) at the path.
    upper: PathBuf,
    upper_id: (u64, u64),
}

struct Merge<'a> {
    window: Window,
    app: &'a mut dyn AppOnDisk,
    /// What this and earlier attempts after the switch put on disk themselves: not
    /// the application's changes, whatever their ctimes.
    placed: &'a mut Placings,
    stats: OverlayStats,
    /// Upper inodes with more than one name, and where the first was written to in
    /// this pass (its path below the disk root, and the disk inode): the others
    /// become hard links to it.
    links: HashMap<(u64, u64), (PathBuf, u64)>,
    /// Disk directories whose names this pass changed: `fsync`ed when the walk leaves them.
    touched: HashSet<PathBuf>,
    upper: &'a Path,
    merged: Option<&'a Path>,
    xattrs: XattrBufs,
    /// What the upper layer deleted, removed from the disk after the walk.
    deferred: Vec<Gone>,
    /// Directories the walk is in.
    depth: usize,
    /// How many it may be in (see [`max_depth`]).
    max_depth: usize,
    /// Per directory the walk is in: earlier directories at its path that the
    /// application removed or moved away (see [`AppOnDisk::gone_dirs`]).
    gone: Vec<Vec<Vec<u8>>>,
    /// Disk directories' owner and mode that let more in, held back until the
    /// removals below them are made.
    deferred_meta: Vec<HeldMeta>,
    disk: &'a Path,
}

/// Makes an entry under a fresh temporary name in `d_dir` (`make` gets the name):
/// one the application cannot guess, and another if it made that one first.
fn fresh_temp<T>(d_dir: Held<'_>, mut make: impl FnMut(&CStr) -> io::Result<T>) -> Result<(CString, T)> {
    let mut attempts = 0;
    loop {
        let name = random_name("");
        match make(&name) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempts < 8 => attempts += 1,
            made => {
                let shown = || d_dir.path.join(OsStr::from_bytes(name.to_bytes()));
                return made
                    .map(|t| (name.clone(), t))
                    .with_context(|| ctx("creating", &shown()));
            }
        }
    }
}

/// `TEMP_PREFIX`, `kind` and 16 random hex digits: a name the application cannot
/// guess and make first.
fn random_name(kind: &str) -> CString {
    use std::hash::{BuildHasher, Hasher};
    // Each `RandomState` has keys of its own, from the kernel's random source.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    CString::new(format!("{TEMP_PREFIX}{kind}{:016x}", h.finish())).expect("no NUL in a hex name")
}

fn ctx(op: &str, p: &Path) -> String {
    format!("{op} {}", p.display())
}

fn owner_mode(md: &fs::Metadata) -> (u32, u32, u32) {
    (md.uid(), md.gid(), md.mode() & 0o7777)
}

/// Whether `md` was born at or after `since` (never, without birth times).
fn born_since(md: &fs::Metadata, since: Time) -> bool {
    md.created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .is_some_and(|d| (d.as_secs() as i64, i64::from(d.subsec_nanos())) >= since)
}

fn ctime(md: &fs::Metadata) -> Time {
    (md.ctime(), md.ctime_nsec())
}

/// A temporary name of the merge's own ([`random_name`]'s exact form): any other,
/// one that merely starts with [`TEMP_PREFIX`] among them, is the application's.
fn ours(name: &OsStr) -> bool {
    name.as_bytes()
        .strip_prefix(TEMP_PREFIX.as_bytes())
        .is_some_and(|rest| {
            let random = ["rm.", "barrier."]
                .iter()
                .find_map(|kind| rest.strip_prefix(kind.as_bytes()))
                .unwrap_or(rest);
            super::temp::is_hex16(random)
        })
}

fn is_whiteout(md: &fs::Metadata) -> bool {
    md.file_type().is_char_device() && md.rdev() == 0
}

impl Merge<'_> {
    /// The walk of the whole upper layer; what it deleted waits in `deferred`.
    fn walk(&mut self) -> Result<()> {
        self.deferred.clear();
        self.deferred_meta.clear();
        // Copies of an earlier walk are no first names to link to.
        self.links.clear();
        let (held, upper) = (open_dir(self.disk)?, open_dir(self.upper)?);
        let (via_disk, via_upper) = (via(&held), via(&upper));
        let root = Held {
            path: self.disk,
            via: &via_disk,
        };
        let upper_root = Held {
            path: self.upper,
            via: &via_upper,
        };
        self.dir(upper_root, root, false, false)?;
        let md = upper.metadata().context(ctx("stat", self.upper))?;
        set_meta_fd(&md, &held).with_context(|| ctx("setting metadata of", self.disk))
    }

    /// Decides to remove the disk entry `md` at `name` in `d_dir`, which the upper
    /// directory `u_dir` deleted.
    fn defer(&mut self, d_dir: Held<'_>, u_dir: Held<'_>, name: &OsStr, md: &fs::Metadata) -> Result<()> {
        let dmd = fs::metadata(d_dir.via).with_context(|| ctx("stat", d_dir.path))?;
        let umd = fs::metadata(u_dir.via).with_context(|| ctx("stat", u_dir.path))?;
        self.deferred.push(Gone {
            dir: d_dir
                .path
                .strip_prefix(self.disk)
                .expect("below the disk root")
                .to_path_buf(),
            dir_id: (dmd.dev(), dmd.ino()),
            name: name.to_os_string(),
            ino: md.ino(),
            is_dir: md.is_dir(),
            born: md.created().ok(),
            upper: u_dir
                .path
                .strip_prefix(self.upper)
                .expect("below the upper root")
                .to_path_buf(),
            upper_id: (umd.dev(), umd.ino()),
        });
        Ok(())
    }

    /// Once every file the walk wrote is durable in place, removes what the upper
    /// layer deleted; returns how many entries went. Each directory is opened again
    /// from the disk root without following a symlink and must be the one decided
    /// on, and so must each entry (inode and type); after the switch to disk an
    /// entry the application changed since stays (a directory: what it changed, and
    /// the directories that hold that). A directory that lost names gets the upper
    /// one's metadata back and is `fsync`ed.
    fn remove_deferred(&mut self) -> Result<u64> {
        let root = open_dir(self.disk)?;
        let deferred = std::mem::take(&mut self.deferred);
        let mut removed = 0;
        for group in deferred.chunk_by(|a, b| (&a.dir, a.dir_id) == (&b.dir, b.dir_id)) {
            let d_dir = self.disk.join(&group[0].dir);
            let dir = match open_below(root.as_fd(), group[0].dir.as_os_str().as_bytes()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
                Err(e) => return Err(io::Error::from(e)).context(ctx("opening", &d_dir)),
            };
            let st = stat::fstat(&dir)
                .map_err(io::Error::from)
                .with_context(|| ctx("stat", &d_dir))?;
            if (st.st_dev, st.st_ino) != group[0].dir_id {
                continue;
            }
            let mut acted = false;
            for gone in group {
                let path = d_dir.join(&gone.name);
                match self
                    .remove_gone(dir.as_fd(), gone)
                    .with_context(|| ctx("removing", &path))?
                {
                    Some(n) => {
                        removed += n;
                        self.stats.removed += n;
                        acted = true;
                    }
                    None => self.stats.kept_disk += 1,
                }
            }
            if acted {
                // What lets more in waits for every removal below ([`HeldMeta`]).
                let now = File::from(dir.try_clone().context(ctx("opening", &d_dir))?).metadata();
                let now = now.with_context(|| ctx("stat", &d_dir))?;
                if let Some(md) = self
                    .upper_dir(&group[0].upper, group[0].upper_id)?
                    .filter(|md| !opens_up(md, &now))
                {
                    set_meta_fd(&md, &dir).with_context(|| ctx("setting metadata of", &d_dir))?;
                }
                unistd::fsync(&dir)
                    .map_err(io::Error::from)
                    .with_context(|| ctx("fsync", &d_dir))?;
            }
        }
        Ok(removed)
    }

    /// Whether a removal waits at or below the disk directory `dir` (its path).
    fn removals_below(&self, dir: &Path) -> bool {
        self.deferred
            .iter()
            .any(|g| self.disk.join(&g.dir).starts_with(dir))
    }

    /// Applies the metadata held back for after the removals ([`HeldMeta`]): each
    /// directory reached again from its root without following a symlink, on both
    /// sides the one decided on (else it is left as it is).
    fn apply_deferred_meta(&mut self) -> Result<()> {
        let (disk_root, upper_root) = (open_dir(self.disk)?, open_dir(self.upper)?);
        for held in std::mem::take(&mut self.deferred_meta) {
            let shown = self.disk.join(&held.disk);
            let opened = (
                open_below(disk_root.as_fd(), held.disk.as_os_str().as_bytes()),
                open_below(upper_root.as_fd(), held.upper.as_os_str().as_bytes()),
            );
            let (Ok(d), Ok(u)) = opened else { continue };
            let (d, u) = (File::from(d), File::from(u));
            let (dmd, umd) = (
                d.metadata().context(ctx("stat", &shown))?,
                u.metadata().context(ctx("stat", &self.upper.join(&held.upper)))?,
            );
            if (dmd.dev(), dmd.ino()) != held.disk_id || (umd.dev(), umd.ino()) != held.upper_id {
                continue;
            }
            set_meta_fd(&umd, &d).with_context(|| ctx("setting metadata of", &shown))?;
            self.sync_xattrs(XattrTarget::Fd(u.as_fd()), XattrTarget::Fd(d.as_fd()), &shown)?;
            d.sync_all().with_context(|| ctx("fsync", &shown))?;
        }
        Ok(())
    }

    /// One removal in its directory `dir`: how many entries went, or `None` where the
    /// entry is not the one decided on or is the application's now.
    fn remove_gone(&mut self, dir: BorrowedFd<'_>, gone: &Gone) -> io::Result<Option<u64>> {
        let name = CString::new(gone.name.as_bytes()).map_err(|_| io::Error::from(Errno::EINVAL))?;
        let now = match stat::fstatat(dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(now) => now,
            Err(Errno::ENOENT) => return Ok(Some(0)),
            Err(e) => return Err(e.into()),
        };
        let is_dir = now.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if now.st_ino != gone.ino || is_dir != gone.is_dir {
            return Ok(None);
        }
        let since = self.window.disk_since;
        Ok(match since {
            Some(since) if is_dir => {
                let opened = match open_dst_dir(dir, &name) {
                    Ok(fd) => fd,
                    Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(None),
                    Err(e) => return Err(e.into()),
                };
                let born = File::from(opened).metadata()?.created().ok();
                match (gone.born, born) {
                    (Some(then), Some(now)) if then != now => None,
                    // The one decided on: what the application changed in it since
                    // stays, the rest goes.
                    (Some(_), Some(_)) => {
                        Some(remove_older_deleted(dir, &name, gone.ino, since, self.placed)?)
                    }
                    // No birth time to tell a directory made again by: one changed
                    // since stays whole.
                    _ => Some(remove_older(dir, &name, since, None, self.placed)?),
                }
            }
            None if is_dir => Some(remove_entry(dir, &name)?),
            Some(since) if (now.st_ctime, now.st_ctime_nsec) >= since && !self.placed.placed_file(&now) => {
                None
            }
            Some(_) => remove_seen(dir, &name, Seen::of(&now), &random_name("rm."))?.then_some(1),
            None => match unistd::unlinkat(dir, name.as_c_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) => Some(1),
                Err(Errno::ENOENT) => Some(0),
                Err(e) => return Err(e.into()),
            },
        })
    }

    /// Merges the upper directory `u` into the disk directory `d`; `opaque`: `u`
    /// is the whole directory, and names only the disk has go; `all`: every entry
    /// below is compared, whatever its ctime (see [`Self::entry`]).
    fn dir(&mut self, u: Held<'_>, d: Held<'_>, opaque: bool, all: bool) -> Result<()> {
        if self.depth == self.max_depth {
            let more = if self.max_depth < MAX_DEPTH {
                "; the walk holds two open files a level: a higher limit on open files (LimitNOFILE=, ulimit -Hn) lets it go deeper"
            } else {
                ""
            };
            anyhow::bail!(
                "{} holds directories nested more than {} deep: not merged{more}",
                self.upper.display(),
                self.max_depth
            );
        }
        self.depth += 1;
        let merged = self.merge_dir(u, d, opaque, all);
        self.depth -= 1;
        // Through the directory held (the application may have moved it, and put
        // anything at its name), failed or not: the removals after the walk wait
        // for the names made here.
        let synced = if self.touched.remove(d.path) {
            d.open()
                .and_then(|f| f.sync_all().with_context(|| ctx("fsync", d.path)))
        } else {
            Ok(())
        };
        merged.and(synced)
    }

    fn merge_dir(&mut self, u: Held<'_>, d: Held<'_>, opaque: bool, all: bool) -> Result<()> {
        let mut names = Vec::new();
        for e in fs::read_dir(u.via).with_context(|| ctx("listing", u.path))? {
            let name = e.with_context(|| ctx("listing", u.path))?.file_name();
            if !ours(&name) {
                names.push(name);
            } else if let Ok(Some(dir)) = self.merged_dir(u.path) {
                // A barrier left by a killed pass, or anything made at a reserved
                // name: the application sees it.
                let n = cstr(&name)?;
                if unistd::unlinkat(dir.as_fd(), n.as_c_str(), UnlinkatFlags::NoRemoveDir)
                    == Err(Errno::EISDIR)
                {
                    let dir = File::from(dir);
                    let _ = fs::remove_dir_all(via(&dir).join(&name));
                }
            }
        }
        names.sort();
        let keep: HashSet<&OsString> = names.iter().collect();
        for e in fs::read_dir(d.via).with_context(|| ctx("listing", d.path))? {
            let name = e.with_context(|| ctx("listing", d.path))?.file_name();
            // Temporaries of a killed pass go, and (after the walk) in an opaque
            // directory every name the upper one lacks.
            if ours(&name) {
                self.remove_ours(d, &name)?;
            } else if opaque && !keep.contains(&name) {
                match lstat_opt(&d.via.join(&name))? {
                    Some(md) if self.apps_dir(d, &name, &md) => self.stats.kept_disk += 1,
                    Some(md) => self.defer(d, u, &name, &md)?,
                    None => {}
                }
            }
        }
        let mut fresh = Vec::new();
        let mut walked = Ok(());
        for name in names {
            match self.entry(u, d, &name, all, opaque) {
                Ok(true) => fresh.push(name),
                Ok(false) => {}
                Err(e) => {
                    walked = Err(e);
                    break;
                }
            }
        }
        if fresh.is_empty() || opaque {
            return walked;
        }
        // Also when the walk failed: a later pass finds these names on disk, no
        // longer new, and would not look again.
        let checked = self.check_fresh(u, d, fresh);
        match walked {
            Err(e) => {
                if let Err(also) = checked {
                    tracing::debug!("overlay write-back: after a failure, checking new names: {also:#}");
                }
                Err(e)
            }
            Ok(()) => checked,
        }
    }

    /// Removes again each name of `fresh` the merge wrote into the disk directory
    /// `d` that the application deleted from the upper directory `u` meanwhile
    /// (after the barrier: see the module's comment).
    fn check_fresh(&mut self, u: Held<'_>, d: Held<'_>, fresh: Vec<OsString>) -> Result<()> {
        self.barrier(u.path)?;
        for name in fresh {
            if lstat_opt(&u.via.join(&name))?.is_none() {
                self.remove(d, &name)?;
            }
        }
        Ok(())
    }

    /// Waits for every unlink and rename in flight in the overlay's directory
    /// for the upper directory `u` (see the module's comment).
    fn barrier(&self, u: &Path) -> Result<()> {
        // The directory is gone from the overlay: so is every name in it.
        let Some(dir) = self.merged_dir(u)? else {
            return Ok(());
        };
        let shown = |name: &CStr| {
            let rel = u.strip_prefix(self.upper).expect("below the upper root");
            self.merged
                .unwrap_or(self.upper)
                .join(rel)
                .join(name.to_string_lossy().as_ref())
        };
        let mut attempts = 0;
        loop {
            let name = random_name("barrier.");
            let made = fcntl::openat(
                dir.as_fd(),
                name.as_c_str(),
                OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::S_IRUSR | Mode::S_IWUSR,
            );
            return match made {
                Ok(_) => unistd::unlinkat(dir.as_fd(), name.as_c_str(), UnlinkatFlags::NoRemoveDir)
                    .map_err(io::Error::from)
                    .with_context(|| ctx("removing", &shown(&name))),
                Err(Errno::ENOENT) => Ok(()),
                Err(Errno::EEXIST) if attempts < 8 => {
                    attempts += 1;
                    continue;
                }
                Err(e) => Err(io::Error::from(e)).with_context(|| ctx("creating", &shown(&name))),
            };
        }
    }

    /// The overlay's directory for the upper directory `u`, reached from where the
    /// overlay is mounted without following a symlink; `None` without an overlay,
    /// or where that directory is gone from it.
    fn merged_dir(&self, u: &Path) -> Result<Option<OwnedFd>> {
        let Some(merged) = self.merged else {
            return Ok(None);
        };
        let rel = u.strip_prefix(self.upper).expect("below the upper root");
        let root = open_dir(merged)?;
        match open_below(root.as_fd(), rel.as_os_str().as_bytes()) {
            Ok(dir) => Ok(Some(dir)),
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => Ok(None),
            Err(e) => Err(io::Error::from(e)).with_context(|| ctx("opening", &merged.join(rel))),
        }
    }

    /// The metadata of the upper directory at `rel` (below the upper root), reached
    /// without following a symlink; `None` where it is gone, or is not the one the
    /// walk held (`id`) any more.
    fn upper_dir(&self, rel: &Path, id: (u64, u64)) -> Result<Option<fs::Metadata>> {
        let root = open_dir(self.upper)?;
        match open_below(root.as_fd(), rel.as_os_str().as_bytes()) {
            Ok(dir) => {
                let md = File::from(dir)
                    .metadata()
                    .context(ctx("stat", &self.upper.join(rel)))?;
                Ok(Some(md).filter(|md| (md.dev(), md.ino()) == id))
            }
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => Ok(None),
            Err(e) => Err(io::Error::from(e)).with_context(|| ctx("opening", &self.upper.join(rel))),
        }
    }

    /// Merges one upper entry; `true` when it put a name the disk directory
    /// did not have.
    fn entry(
        &mut self,
        u_dir: Held<'_>,
        d_dir: Held<'_>,
        name: &OsStr,
        all: bool,
        below_opaque: bool,
    ) -> Result<bool> {
        let (u, u_shown) = (u_dir.via.join(name), u_dir.path.join(name));
        let (d, shown) = (d_dir.via.join(name), d_dir.path.join(name));
        let md = match fs::symlink_metadata(&u) {
            Ok(md) => md,
            // Deleted by the application since the listing: a later pass sees its whiteout.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e).context(ctx("stat", &u_shown)),
        };
        // A directory changed since (`all` below it) may have been moved here,
        // and moving it changes no ctime below it: its whole tree is compared.
        let changed = all || self.window.upper_since.is_none_or(|t| ctime(&md) >= t);
        let disk = lstat_opt(&d)?;
        // A name the disk lacks is asked about whatever its ctime: a directory
        // the first pass wrote and the application deleted or moved on disk
        // since the switch must not be made again (with what changed in it).
        if (changed || disk.is_none()) && self.disk_won(d_dir, name, disk.as_ref(), &md) {
            self.stats.kept_disk += 1;
            return Ok(false);
        }
        if is_whiteout(&md) {
            if let Some(dm) = disk.as_ref().filter(|_| changed) {
                self.defer(d_dir, u_dir, name, dm)?;
            }
            return Ok(false);
        }
        if md.is_dir() {
            // Held from here on, on both sides: wherever the application moves
            // them meanwhile, the walk goes on in them, and the disk one gets its
            // metadata.
            let uf = open_dir_as(&u, &u_shown)?;
            let u_held = via(&uf);
            let opaque_attr = CString::new(OPAQUE).expect("no NUL in the name");
            // Below an opaque directory the overlay looks in no lower layer: a
            // directory there is the whole directory too, marked or not.
            let mut opaque = below_opaque
                || match xattrs::get_attr(uf.as_fd(), &opaque_attr) {
                    Ok(v) => v == b"y",
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) => false,
                    Err(e) => return Err(e).context(ctx(&format!("reading {OPAQUE} of"), &u_shown)),
                };
            let mut made = None;
            match &disk {
                Some(dm) if dm.is_dir() => {}
                _ => {
                    if !opaque {
                        xattrs::set_attr(uf.as_fd(), &opaque_attr, b"y")
                            .with_context(|| ctx(&format!("setting {OPAQUE} on"), &u_shown))?;
                        opaque = true;
                    }
                    if disk.is_some() {
                        self.remove(d_dir, name)?;
                    }
                    made = self.make_dir(d_dir, name, &uf, &md, &shown)?;
                    if made.is_some() {
                        self.touched.insert(d_dir.path.to_path_buf());
                        self.stats.dirs += 1;
                    }
                }
            }
            let made_here = made.is_some();
            let df = match made {
                Some(df) => df,
                None => open_dir_as(&d, &shown)?,
            };
            if made_here && self.window.disk_since.is_some() {
                let md = df.metadata().with_context(|| ctx("stat", &shown))?;
                let parent = d_dir.open()?;
                self.placed
                    .note_dir(&md, parent.as_fd(), name)
                    .map_err(|e| placings_failed(e, &shown))?;
            }
            // Made by an attempt after the switch: root's and closed until it has
            // the upper directory's owner and mode.
            let ours = made_here
                || disk
                    .as_ref()
                    .is_some_and(|dm| self.made_by_attempt(d_dir, name, dm));
            // Made by the application after the switch (its birth time): its owner
            // and mode stay (a root application's `rm -r D; mkdir -m 0700 D` got
            // the upper directory's, and a file in it became readable to others:
            // a review helper's probe). Without birth times, not told.
            let apps_new = !ours
                && disk
                    .as_ref()
                    .zip(self.window.disk_since)
                    .is_some_and(|(dm, since)| born_since(dm, since));
            let gone = match (self.window.disk_since, self.gone.last()) {
                (Some(_), above) => self
                    .app
                    .gone_dirs(d_dir.via, above.map_or(&[], Vec::as_slice), name),
                (None, _) => Vec::new(),
            };
            // Before the walk writes into it: its ctime then is the application's.
            let before_walk = df.metadata().with_context(|| ctx("stat", &shown))?;
            let held = via(&df);
            self.gone.push(gone);
            let walked = self.dir(
                Held {
                    path: &u_shown,
                    via: &u_held,
                },
                Held {
                    path: &shown,
                    via: &held,
                },
                opaque,
                changed,
            );
            self.gone.pop();
            // Failed or not: one made here is root's and closed until it has them,
            // and the application may be on its disk directory already.
            let meta = uf.metadata().context(ctx("stat", &u_shown)).and_then(|umd| {
                if apps_new {
                    return Ok(());
                }
                let dmd = df.metadata().context(ctx("stat", &shown))?;
                // Or changed during the walk, which never changes a directory's own
                // owner and mode before this: the application's (it closed it).
                let during =
                    owner_mode(&dmd) != owner_mode(&before_walk) && owner_mode(&dmd) != owner_mode(&umd);
                if !ours && (during || self.disk_meta_later(&umd, &before_walk)) {
                    self.stats.kept_disk += 1;
                    return Ok(());
                }
                // An access ACL is permission bits too.
                let attrs_differ = !xattrs::same_xattrs(
                    XattrTarget::Fd(uf.as_fd()),
                    XattrTarget::Fd(df.as_fd()),
                    &mut self.xattrs,
                )
                .map_err(|e| anyhow::Error::new(e.at(shown.clone())))?;
                if (opens_up(&umd, &dmd) || attrs_differ) && self.removals_below(&shown) {
                    self.deferred_meta.push(HeldMeta {
                        disk: shown
                            .strip_prefix(self.disk)
                            .expect("below the disk root")
                            .to_path_buf(),
                        disk_id: (dmd.dev(), dmd.ino()),
                        upper: u_shown
                            .strip_prefix(self.upper)
                            .expect("below the upper root")
                            .to_path_buf(),
                        upper_id: (umd.dev(), umd.ino()),
                    });
                    return Ok(());
                }
                set_meta_fd(&umd, &df).with_context(|| ctx("setting metadata of", &shown))?;
                self.sync_xattrs(XattrTarget::Fd(uf.as_fd()), XattrTarget::Fd(df.as_fd()), &shown)
            });
            walked.and(meta)?;
            return Ok(disk.is_none());
        }
        if !changed {
            return Ok(false);
        }
        if disk.as_ref().is_some_and(|dm| same_leaf(&md, dm, &u, &d))
            && self.same_xattrs(u_dir, d_dir, name)?
        {
            self.stats.unchanged += 1;
            return Ok(false);
        }
        self.leaf(&md, u_dir, d_dir, name, disk.as_ref())?;
        Ok(disk.is_none())
    }

    /// Whether the disk entry is the application's later change (only once it
    /// works on its disk directory again).
    /// A directory never wins over a directory (the walk merges the two: one
    /// the application made there keeps its owner and mode, see [`Self::entry`]),
    /// but one the application made or moved there wins
    /// over the upper layer's file: it replaced the file on disk later (`rm N; mv
    /// X N`, which the merge undid before, removing what the directory held: a
    /// hunting helper's probe). A name the disk lacks is the application's
    /// deletion also where it deleted it in an earlier directory at this path
    /// (`rm -r D; mkdir D`: a review helper's probe brought it back).
    fn disk_won(
        &mut self,
        d_dir: Held<'_>,
        name: &OsStr,
        disk: Option<&fs::Metadata>,
        upper: &fs::Metadata,
    ) -> bool {
        let Some(since) = self.window.disk_since else {
            return false;
        };
        // A version of the first pass's time, which it put on disk, where the
        // application saw it: moved away with a directory, it left with it. A file
        // the RAM changed since never was on disk, and is written (lost before: a
        // review helper's probes). A directory's ctime moves with its names and
        // the first pass's own marks: it counts as seen.
        let seen = upper.is_dir() || self.window.upper_since.is_none_or(|first| ctime(upper) < first);
        match disk {
            Some(dm) if dm.is_dir() => !upper.is_dir() && self.apps_dir(d_dir, name, dm),
            Some(dm) => ctime(dm) >= since && !self.placed.placed(dm),
            None => {
                self.app.deleted(d_dir.via, name)
                    || self.gone.last().is_some_and(|gone| {
                        gone.iter()
                            .any(|k| self.app.deleted_in(d_dir.via, k, name, since, seen))
                    })
            }
        }
    }

    /// Whether the disk directory (`d`), changed since the switch, has an owner or
    /// mode other than the upper one's (`u`): the first pass gave it the upper
    /// one's, so the application changed them since (it closed it: given the
    /// upper one's again, a root application's private file in it became readable
    /// to others), and that later change stays. The upper directory's own ctime
    /// cannot tell whether the RAM changed them after the first pass (the
    /// barriers move it): such a change is dropped where the application changed
    /// anything in that directory on disk after the switch.
    fn disk_meta_later(&self, u: &fs::Metadata, d: &fs::Metadata) -> bool {
        self.window
            .disk_since
            .is_some_and(|switched| ctime(d) >= switched)
            && owner_mode(u) != owner_mode(d)
    }

    /// Whether the disk directory `name` (`md`) in `d_dir` is one an earlier
    /// attempt of this write-back made after the switch (see [`Placings`]).
    fn made_by_attempt(&mut self, d_dir: Held<'_>, name: &OsStr, md: &fs::Metadata) -> bool {
        self.window.disk_since.is_some()
            && d_dir
                .open()
                .is_ok_and(|parent| self.placed.made_dir(md, parent.as_fd(), name))
    }

    /// Whether the disk entry `name` (`md`) in `d_dir` is a directory the
    /// application made or moved there after the switch: its own as a whole. Its
    /// files keep their older ctimes: removed as what the upper layer lacks, a
    /// directory moved into one made through the overlay (which is opaque) lost
    /// everything in it (a hunting helper's probe, 6 of 6).
    fn apps_dir(&mut self, d_dir: Held<'_>, name: &OsStr, md: &fs::Metadata) -> bool {
        let Some(since) = self.window.disk_since else {
            return false;
        };
        if !md.is_dir() || ctime(md) < since {
            return false;
        }
        // Made there by an earlier attempt of this write-back, and still there.
        if self.made_by_attempt(d_dir, name, md) {
            return false;
        }
        born_since(md, since)
            || open_dir(&d_dir.via.join(name)).is_ok_and(|dir| self.app.moved_here(dir.as_fd()))
    }

    /// Writes one non-directory under a temporary name, then renames it over
    /// `name` (the disk entry compared, `disk`). Once the application works in
    /// the disk directory, only over that entry, or into a name still free: an
    /// entry it made or changed since stays.
    fn leaf(
        &mut self,
        md: &fs::Metadata,
        u_dir: Held<'_>,
        d_dir: Held<'_>,
        name: &OsStr,
        disk: Option<&fs::Metadata>,
    ) -> Result<()> {
        let (u, u_shown) = (u_dir.via.join(name), u_dir.path.join(name));
        let (d, shown) = (d_dir.via.join(name), d_dir.path.join(name));
        let key = (md.dev(), md.ino());
        let ft = md.file_type();
        let dir = d_dir.open()?;
        let first = self.links.get(&key).filter(|_| md.nlink() > 1);
        let linked = match first {
            Some(first) => {
                let (t, ino) = fresh_temp(d_dir, |t| self.link_first(first, dir.as_fd(), t))?;
                ino.map(|ino| (t, ino))
            }
            None => None,
        };
        let (tmp_name, made_ino) = if let Some(made) = linked {
            made
        } else if ft.is_file() {
            // Never a symlink or FIFO the application renamed over the name since
            // its stat: the file is opened without following one or waiting.
            let opened = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&u);
            let mut src = match opened {
                Ok(f) => f,
                // Deleted through the overlay since its stat: a whiteout (a device
                // node, which the tmpfs's nodev refuses to open), a symlink or
                // nothing is there now, and a later pass sees it.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EACCES | libc::ENXIO | libc::ENOENT | libc::ELOOP)
                    ) && !lstat_opt(&u)?.is_some_and(|now| now.is_file()) =>
                {
                    return Ok(());
                }
                Err(e) => return Err(e).context(ctx("opening", &u_shown)),
            };
            // The file opened may be a newer one renamed over the name since its stat.
            let md = src.metadata().with_context(|| ctx("stat", &u_shown))?;
            if !md.is_file() {
                return Ok(());
            }
            // Only root may open it until its owner and mode are set.
            let (t, mut dst) = fresh_temp(d_dir, |t| {
                fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(d_dir.via.join(OsStr::from_bytes(t.to_bytes())))
            })?;
            let tmp_shown = d_dir.path.join(OsStr::from_bytes(t.to_bytes()));
            self.stats.bytes +=
                io::copy(&mut src, &mut dst).with_context(|| ctx("copying into", &tmp_shown))?;
            dst.flush().with_context(|| ctx("writing", &tmp_shown))?;
            set_meta_fd(&md, &dst).with_context(|| ctx("setting metadata of", &tmp_shown))?;
            self.sync_xattrs(
                XattrTarget::Fd(src.as_fd()),
                XattrTarget::Fd(dst.as_fd()),
                &tmp_shown,
            )?;
            dst.sync_all().with_context(|| ctx("fsync", &tmp_shown))?;
            let ino = dst.metadata().with_context(|| ctx("stat", &tmp_shown))?.ino();
            (t, ino)
        } else {
            let kind = md.mode() & libc::S_IFMT;
            let (t, ()) = if ft.is_symlink() {
                let target = fs::read_link(&u).with_context(|| ctx("reading link", &u_shown))?;
                fresh_temp(d_dir, |t| {
                    unistd::symlinkat(target.as_os_str(), dir.as_fd(), t).map_err(io::Error::from)
                })?
            } else {
                // Only root's until its owner and mode are set.
                fresh_temp(d_dir, |t| {
                    stat::mknodat(
                        dir.as_fd(),
                        t,
                        SFlag::from_bits_truncate(kind),
                        Mode::S_IRUSR | Mode::S_IWUSR,
                        md.rdev(),
                    )
                    .map_err(io::Error::from)
                })?
            };
            let tmp_shown = d_dir.path.join(OsStr::from_bytes(t.to_bytes()));
            let at = |f: Failed| anyhow::Error::new(f.at(tmp_shown.clone()));
            let (made, st) = made::open_made(dir.as_fd(), &t, kind).map_err(at)?;
            let (ud, un) = (u_dir.open()?, cstr(name)?);
            made::set_made(
                made.as_fd(),
                &Attrs::of_metadata(md),
                XattrTarget::At(ud.as_fd(), &un),
                &mut self.xattrs,
                true,
            )
            .map_err(at)?;
            (t, st.st_ino)
        };
        let tmp_os = OsStr::from_bytes(tmp_name.to_bytes());
        let (tmp, tmp_shown) = (d_dir.via.join(tmp_os), d_dir.path.join(tmp_os));
        let mut disk = disk;
        if disk.is_some_and(|dm| dm.is_dir()) {
            self.remove(d_dir, name)?;
            disk = None;
        }
        if self.window.disk_since.is_some() {
            let dir = d_dir.open()?;
            let (t, n) = (tmp_name.as_c_str(), cstr(name)?);
            let how = match disk {
                Some(dm) => Place::Over(Seen::of_metadata(dm)),
                None => Place::Free,
            };
            let placed = put_in_place(dir.as_fd(), t, &n, how)
                .with_context(|| format!("renaming {} to {}", tmp_shown.display(), shown.display()))?;
            if placed != Placed::Yes {
                match fs::remove_file(&tmp) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        return Err(e).context(ctx("removing", &tmp_shown))
                    }
                    _ => {}
                }
                self.stats.kept_disk += 1;
                return Ok(());
            }
        } else {
            fs::rename(&tmp, &d)
                .with_context(|| format!("renaming {} to {}", tmp_shown.display(), shown.display()))?;
        }
        if md.nlink() > 1 && ft.is_file() {
            let rel = shown.strip_prefix(self.disk).expect("below the disk root");
            self.links.entry(key).or_insert((rel.to_path_buf(), made_ino));
        }
        self.touched.insert(d_dir.path.to_path_buf());
        self.stats.written += 1;
        // What the application put at the name right after is its own, and a
        // retry must not take it for this copy.
        match fs::symlink_metadata(&d)
            .ok()
            .filter(|_| self.window.disk_since.is_some())
        {
            Some(now) if now.ino() == made_ino => {
                self.placed.note(&now).map_err(|e| placings_failed(e, &shown))?;
                crate::failpoint::hit("overlay-placed", "");
            }
            _ => {}
        }
        Ok(())
    }

    /// Links `tmp` in `dir` to the first copy of a hard-linked file (its path below
    /// the disk root, and its inode), reached from the root one directory at a
    /// time without following a symlink: a directory on the way that the
    /// application replaced by a symlink leads nowhere else, and only to the inode
    /// written, through a descriptor of it. The inode linked, or `None` where that
    /// copy is no longer there (the application moved or replaced it), and the file
    /// is written again.
    fn link_first(
        &self,
        (first, ino): &(PathBuf, u64),
        dir: BorrowedFd<'_>,
        tmp: &CStr,
    ) -> io::Result<Option<u64>> {
        let gone = |e: Errno| matches!(e, Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP);
        let root = File::open(self.disk)?;
        let (parent, leaf) = split_parent(first.as_os_str().as_bytes());
        let from = match open_below(root.as_fd(), parent) {
            Ok(fd) => fd,
            Err(e) if gone(e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let leaf = CString::new(leaf).map_err(|_| io::Error::from(Errno::EINVAL))?;
        match link_checked(from.as_fd(), leaf.as_c_str(), Some(*ino), dir, tmp) {
            Ok(()) => Ok(Some(*ino)),
            Err(e) if gone(e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes the extended attributes of `dst` (at `path`) those of `src`.
    /// Makes the directory `name` in `d_dir` for the upper directory `uf` (`md`):
    /// under a temporary name, given `uf`'s owner, attributes and mode (in that
    /// order, through a descriptor: an access ACL is permission bits too), then
    /// renamed into place unless the name exists (`None`: the application made
    /// it meanwhile, and the walk merges into that). Made owner-only at its name,
    /// it answered the application with EACCES while the walk filled it, and a
    /// kill before the placings record of it left it so for good
    /// (docs/writeback.md has the tmpfs backend's same change). By path, `chmod`
    /// followed a symlink the cache's owner put in place of the temporary
    /// (a review helper's probe: a root file made 06777).
    fn make_dir(
        &mut self,
        d_dir: Held<'_>,
        name: &OsStr,
        uf: &File,
        md: &fs::Metadata,
        shown: &Path,
    ) -> Result<Option<File>> {
        let parent = d_dir.open()?;
        let (temp, ()) = fresh_temp(d_dir, |n| {
            stat::mkdirat(parent.as_fd(), n, Mode::S_IRWXU).map_err(io::Error::from)
        })?;
        let placed = (|| -> Result<Option<File>> {
            let df = File::from(open_dst_dir(parent.as_fd(), &temp)?);
            unistd::fchown(df.as_fd(), Some(md.uid().into()), Some(md.gid().into()))?;
            self.sync_xattrs(XattrTarget::Fd(uf.as_fd()), XattrTarget::Fd(df.as_fd()), shown)?;
            set_meta_fd(md, &df)?;
            let placed = super::place::rename_no_replace(parent.as_fd(), &temp, &cstr(name)?)?;
            Ok(placed.then_some(df))
        })();
        if !matches!(placed, Ok(Some(_))) {
            // Still at its temporary name: a leftover would be removed by the next pass.
            let _ = unistd::unlinkat(parent.as_fd(), temp.as_c_str(), UnlinkatFlags::RemoveDir);
        }
        placed.with_context(|| ctx("creating directory", shown))
    }

    fn sync_xattrs(&mut self, src: XattrTarget<'_>, dst: XattrTarget<'_>, path: &Path) -> Result<()> {
        xattrs::sync_xattrs(src, dst, &mut self.xattrs)
            .map_err(|e| anyhow::Error::new(e.at(path.to_path_buf())))
    }

    fn same_xattrs(&mut self, u_dir: Held<'_>, d_dir: Held<'_>, name: &OsStr) -> Result<bool> {
        let (ud, dd, n) = (u_dir.open()?, d_dir.open()?, cstr(name)?);
        xattrs::same_xattrs(
            XattrTarget::At(ud.as_fd(), &n),
            XattrTarget::At(dd.as_fd(), &n),
            &mut self.xattrs,
        )
        .map_err(|e| anyhow::Error::new(e.at(d_dir.path.join(name))))
    }

    /// Removes the merge's own temporary `name` from the disk directory (a killed
    /// pass's: reserved, whenever it was made), and all below it.
    fn remove_ours(&mut self, d_dir: Held<'_>, name: &OsStr) -> Result<()> {
        let (d, shown) = (d_dir.via.join(name), d_dir.path.join(name));
        let gone = match lstat_opt(&d)? {
            None => return Ok(()),
            Some(md) if md.is_dir() => fs::remove_dir_all(&d),
            Some(_) => fs::remove_file(&d),
        };
        match gone {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => {
                r.with_context(|| ctx("removing", &shown))?;
                self.touched.insert(d_dir.path.to_path_buf());
                self.stats.removed += 1;
                Ok(())
            }
        }
    }

    /// Removes `name` from the disk directory, and all below it (through
    /// descriptors: nothing followed, no other filesystem entered); once the
    /// application works there again (`disk_since`), what it changed since is
    /// kept, with the directories that lead to it.
    fn remove(&mut self, d_dir: Held<'_>, name: &OsStr) -> Result<()> {
        let (d, shown) = (d_dir.via.join(name), d_dir.path.join(name));
        let Some(md) = lstat_opt(&d)? else {
            return Ok(());
        };
        if self.window.disk_since.is_some_and(|t| ctime(&md) >= t) && !md.is_dir() && !self.placed.placed(&md)
        {
            self.stats.kept_disk += 1;
            return Ok(());
        }
        let dir = d_dir.open()?;
        let n = cstr(name)?;
        let went = if md.is_dir() {
            match self.window.disk_since {
                // The directory just looked at, as a whole: what the application
                // changed in it since the switch stays.
                Some(since) => remove_older_deleted(dir.as_fd(), &n, md.ino(), since, self.placed),
                None => remove_entry(dir.as_fd(), &n),
            }
            .with_context(|| ctx("removing", &shown))?
        } else if self.window.disk_since.is_some() {
            let gone = remove_seen(dir.as_fd(), &n, Seen::of_metadata(&md), &random_name("rm."))
                .with_context(|| ctx("removing", &shown))?;
            u64::from(gone)
        } else {
            match unistd::unlinkat(dir.as_fd(), n.as_c_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) => 1,
                Err(Errno::ENOENT) => 0,
                Err(e) => return Err(io::Error::from(e)).context(ctx("removing", &shown)),
            }
        };
        if went == 0 {
            self.stats.kept_disk += 1;
            return Ok(());
        }
        self.touched.insert(d_dir.path.to_path_buf());
        self.stats.removed += went;
        Ok(())
    }
}

/// Opens the directory `p` (shown as `shown`), not following a symlink at its last
/// name.
fn open_dir_as(p: &Path, shown: &Path) -> Result<File> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(p)
        .with_context(|| ctx("opening", shown))
}

fn open_dir(p: &Path) -> Result<File> {
    open_dir_as(p, p)
}

fn cstr(name: &OsStr) -> Result<CString> {
    CString::new(name.as_bytes()).context("a name with a NUL byte")
}

fn lstat_opt(p: &Path) -> Result<Option<fs::Metadata>> {
    match fs::symlink_metadata(p) {
        Ok(md) => Ok(Some(md)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).context(ctx("stat", p)),
    }
}

/// Whether the disk entry already is the upper one: same type, size, mtime,
/// mode and owner (and link target), and the upper one unchanged since the
/// disk one was written (size and mtime alone miss a rewrite of the same
/// length in the same clock tick).
fn same_leaf(u: &fs::Metadata, d: &fs::Metadata, up: &Path, dp: &Path) -> bool {
    let same = ctime(u) < ctime(d)
        && u.mode() == d.mode()
        && u.uid() == d.uid()
        && u.gid() == d.gid()
        && u.size() == d.size()
        && (u.mtime(), u.mtime_nsec()) == (d.mtime(), d.mtime_nsec());
    if !same || u.file_type().is_symlink() {
        return same && fs::read_link(up).ok() == fs::read_link(dp).ok();
    }
    if !u.is_file() {
        return same && u.rdev() == d.rdev();
    }
    same
}

/// Gives `p` the owner, mode and times of `md`'s entry (the upper one).
/// [`set_meta`] through a descriptor of the entry.
fn set_meta_fd(md: &fs::Metadata, entry: impl AsFd) -> io::Result<()> {
    use nix::sys::time::TimeSpec;
    let dir = entry.as_fd();
    unistd::fchown(dir, Some(md.uid().into()), Some(md.gid().into()))?;
    stat::fchmod(dir, stat::Mode::from_bits_truncate(md.mode() & 0o7777))?;
    stat::futimens(
        dir,
        &TimeSpec::new(md.atime(), md.atime_nsec()),
        &TimeSpec::new(md.mtime(), md.mtime_nsec()),
    )?;
    Ok(())
}
