//! Where a mount's RAM comes from. One module per backend owns its mount
//! options, mount and remount, the test for "is this mount ours", the
//! reading of its live mounts and its usage figures; the plan, `status`,
//! `down` and the agent speak only through the types here. tmpfs is the
//! first backend: a new one is a module here, a variant of each enum below
//! and one of `spec::Backend` (the spec's `backend:`).

pub mod overlay;
pub mod tmpfs;
pub mod zram;

use std::path::Path;

use anyhow::Context;
use nix::errno::Errno;
use nix::mount::MsFlags;
use serde::Serialize;

use crate::host::mountinfo::{MountEntry, MountTable};
use crate::host::usage::Usage;
use crate::mount::RootAttrs;
use crate::spec::{self, Atime, Backend, Flags, MountSpec};
use crate::state::State;

/// How a mount is built (and rebuilt online).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "backend", rename_all = "lowercase")]
pub enum MountOptions {
    Tmpfs(tmpfs::TmpfsOptions),
    Zram(zram::ZramOptions),
}

impl MountOptions {
    /// The options `m` asks for, with `root` as the mount's root.
    pub fn desired(m: &MountSpec, root: RootAttrs) -> MountOptions {
        match m.backend {
            Backend::Tmpfs => MountOptions::Tmpfs(tmpfs::TmpfsOptions::desired(m, root)),
            Backend::Zram => MountOptions::Zram(zram::ZramOptions::desired(m, root)),
        }
    }

    /// The backend's name, as operators know the filesystem.
    pub fn backend(&self) -> &'static str {
        match self {
            MountOptions::Tmpfs(_) => tmpfs::FSTYPE,
            MountOptions::Zram(_) => zram::NAME,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            MountOptions::Tmpfs(o) => o.describe(),
            MountOptions::Zram(o) => o.describe(),
        }
    }

    /// The same options resized to `size` bytes and `nr_inodes` inodes.
    pub fn resized(mut self, size: u64, nr_inodes: Option<u64>) -> MountOptions {
        match &mut self {
            MountOptions::Tmpfs(o) => {
                o.size = size;
                o.nr_inodes = nr_inodes;
            }
            // Never reached: validation refuses `grow` on zram, so the agent
            // never resizes one; its device keeps the size it was made with.
            MountOptions::Zram(_) => {}
        }
        self
    }
}

/// A description of one option that an online change alters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    pub what: &'static str,
    pub from: String,
    pub to: String,
}

impl Change {
    pub fn new(what: &'static str, from: impl Into<String>, to: impl Into<String>) -> Change {
        Change {
            what,
            from: from.into(),
            to: to.into(),
        }
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} -> {}", self.what, self.from, self.to)
    }
}

/// Mounts a new filesystem of the options' backend at `target`. A backend
/// that needs a device creates it here and records it in `state`.
pub fn mount(source: &str, target: &Path, o: &MountOptions, state: &State) -> anyhow::Result<()> {
    match o {
        MountOptions::Tmpfs(o) => tmpfs::mount(source, target, o),
        MountOptions::Zram(o) => zram::mount(source, target, o, state),
    }
}

/// Changes a live mount's options in place.
pub fn remount(target: &Path, o: &MountOptions) -> Result<(), Errno> {
    match o {
        MountOptions::Tmpfs(o) => tmpfs::remount(target, o),
        MountOptions::Zram(o) => zram::remount(target, o),
    }
}

/// What [`release_unused`] did, one line per device.
#[derive(Debug, Default)]
pub struct Released {
    pub freed: Vec<String>,
    /// Devices kept for a later call, each with why: still open (a mount
    /// detached while busy), or failing to reset.
    pub held: Vec<String>,
}

/// Frees the devices recorded in `state` that no mount uses any more (a
/// mount taken down, rolled back, or left half-built by a crash); tmpfs has
/// none. A device still open (a mount detached while busy) is kept for a
/// later call. Must run with the state lock held: a device being built has
/// no mount yet.
pub fn release_unused(state: &State) -> anyhow::Result<Released> {
    zram::release_unused(state, zram::RESET_PATIENCE)
}

/// [`release_unused`] without waiting for a device just closed by others (udev,
/// blkid) to be free, for a caller that tries again later.
pub fn release_unused_now(state: &State) -> anyhow::Result<Released> {
    zram::release_unused(state, std::time::Duration::ZERO)
}

/// Whether any device is recorded in `state`, in use or not.
pub fn any_recorded(state: &State) -> bool {
    zram::any_recorded(state)
}

/// Whether `e` is the mount with `source` (`tmpfsctl-NAME`, see
/// `spec::source_for`): how tmpfsctl knows a mount of its own from anybody
/// else's.
pub fn is_ours(e: &MountEntry, source: &str) -> bool {
    tmpfs::is_ours(e, source) || zram::is_ours(e, source) || overlay::is_ours(e, source)
}

/// The root of the mount `name` has at `path`, opened without following a
/// symlink, and checked to be that mount (by its mount ID, in the mount table): by
/// name, a user owning the directories above two managed paths could swap them,
/// and a remount of one resized the other, or a `sync` wrote one's tmpfs into
/// the other's disk directory (a review helper's probes).
pub fn own_mount(path: &Path, name: &str) -> anyhow::Result<crate::mount::PinnedDir> {
    let pinned = crate::mount::PinnedDir::open(path)?;
    let id = crate::mount::mount_id_of(pinned.as_fd())
        .with_context(|| format!("finding the mount of {}", path.display()))?;
    is_own_mount(id, name, path)?;
    Ok(pinned)
}

/// Fails unless the mount with `id` is one of `name`'s (its tmpfs, zram or overlay).
pub fn is_own_mount(id: u64, name: &str, path: &Path) -> anyhow::Result<()> {
    let table = crate::host::mountinfo::MountTable::read(Path::new("/proc/self/mountinfo"))?;
    let source = crate::spec::source_for(name);
    anyhow::ensure!(
        table
            .entries
            .iter()
            .any(|e| u64::from(e.id) == id && is_ours(e, &source)),
        "{} is no longer the mount of `{name}` (a directory above it was moved, and another put in its place); nothing was done to it",
        path.display()
    );
    Ok(())
}

/// Every mount in `table` with `source`, wherever it is.
pub fn mounts_of<'a>(table: &'a MountTable, source: &'a str) -> impl Iterator<Item = &'a MountEntry> + 'a {
    table.entries.iter().filter(move |e| is_ours(e, source))
}

/// The spec name of `e` when it is a mount of tmpfsctl's (of any spec).
pub fn managed_name(e: &MountEntry) -> Option<&str> {
    let source = zram::source_of(e).unwrap_or(&e.source);
    let name = source.strip_prefix(spec::SOURCE_PREFIX)?;
    is_ours(e, source).then_some(name)
}

/// The device number the files of the mount `e` show (`st_dev`), read at its
/// mount point when it is the top mount there: a btrfs's differs from the
/// one the mount table shows.
pub fn files_dev(e: &MountEntry) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    if e.fstype != spec::ZramFs::Btrfs.name() {
        return e.dev;
    }
    std::fs::metadata(&e.mount_point).map_or(e.dev, |m| {
        (
            nix::sys::stat::major(m.dev()) as u32,
            nix::sys::stat::minor(m.dev()) as u32,
        )
    })
}

/// A live mount of ours as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "backend", rename_all = "lowercase")]
pub enum Live {
    Tmpfs(tmpfs::LiveTmpfs),
    Zram(zram::LiveZram),
    Overlay(overlay::LiveOverlay),
}

impl Live {
    /// Reads the mount `e` of ours at `path`; `None` when it cannot be seen.
    pub fn read(e: &MountEntry, path: &Path) -> Option<Live> {
        if e.fstype == tmpfs::FSTYPE {
            tmpfs::LiveTmpfs::read(e, path).map(Live::Tmpfs)
        } else if e.fstype == overlay::FSTYPE {
            overlay::LiveOverlay::read(e, path).map(Live::Overlay)
        } else {
            zram::LiveZram::read(e, path).map(Live::Zram)
        }
    }

    pub fn dev(&self) -> (u32, u32) {
        match self {
            Live::Tmpfs(l) => l.dev,
            Live::Zram(l) => l.dev,
            Live::Overlay(l) => l.dev,
        }
    }

    pub fn root(&self) -> RootAttrs {
        match self {
            Live::Tmpfs(l) => l.root,
            Live::Zram(l) => l.root,
            Live::Overlay(l) => l.root,
        }
    }

    pub fn usage(&self) -> Usage {
        match self {
            Live::Tmpfs(l) => l.usage,
            Live::Zram(l) => l.usage,
            Live::Overlay(l) => l.usage(),
        }
    }

    /// What it takes to bring this mount to `m` online: nothing, a remount
    /// with these options (described by the changes), or why it cannot be.
    pub fn online(
        &self,
        m: &MountSpec,
        root: RootAttrs,
        page_size: u64,
    ) -> Result<Option<(MountOptions, Vec<Change>)>, String> {
        match self {
            Live::Tmpfs(l) => {
                Ok(tmpfs::online(m, l, root, page_size)?.map(|(o, c)| (MountOptions::Tmpfs(o), c)))
            }
            Live::Zram(l) => {
                Ok(zram::online(m, l, root, page_size)?.map(|(o, c)| (MountOptions::Zram(o), c)))
            }
            Live::Overlay(l) => overlay::online(m, l, page_size).map(|()| None),
        }
    }

    /// The RAM a compressed mount really takes, and what it holds; `None`
    /// for tmpfs, whose RAM is its usage.
    pub fn compressed(&self) -> Option<zram::Compressed> {
        match self {
            Live::Tmpfs(_) => None,
            Live::Zram(l) => Some(l.compressed()),
            Live::Overlay(l) => l.upper.compressed(),
        }
    }
}

/// The mount(2) flags for `f`: every security flag, every time, because a
/// bare MS_REMOUNT resets them.
fn ms_flags(f: Flags) -> MsFlags {
    let mut ms = MsFlags::empty();
    ms.set(MsFlags::MS_NOSUID, f.nosuid);
    ms.set(MsFlags::MS_NODEV, f.nodev);
    ms.set(MsFlags::MS_NOEXEC, f.noexec);
    match f.atime {
        Some(Atime::Relatime) => ms |= MsFlags::MS_RELATIME,
        Some(Atime::Noatime) => ms |= MsFlags::MS_NOATIME,
        Some(Atime::Strictatime) => ms |= MsFlags::MS_STRICTATIME,
        None => {}
    }
    ms
}

/// The flags a live mount has, from its per-mount options.
fn flags_of(e: &MountEntry) -> Flags {
    let atime = if e.has_mount_option("noatime") {
        Atime::Noatime
    } else if e.has_mount_option("relatime") {
        Atime::Relatime
    } else {
        Atime::Strictatime
    };
    Flags {
        nosuid: e.has_mount_option("nosuid"),
        nodev: e.has_mount_option("nodev"),
        noexec: e.has_mount_option("noexec"),
        atime: Some(atime),
    }
}

/// The flag changes from `have` to `want`; an unset atime leaves it alone.
fn flag_changes(have: Flags, want: Flags) -> Vec<Change> {
    let mut changes = Vec::new();
    for (what, h, w) in [
        ("nosuid", have.nosuid, want.nosuid),
        ("nodev", have.nodev, want.nodev),
        ("noexec", have.noexec, want.noexec),
    ] {
        if h != w {
            changes.push(Change::new(what, onoff(h), onoff(w)));
        }
    }
    if let Some(w) = want.atime {
        if have.atime != Some(w) {
            let from = have.atime.map(|a| a.name()).unwrap_or("default");
            changes.push(Change::new("atime", from, w.name()));
        }
    }
    changes
}

fn onoff(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}
