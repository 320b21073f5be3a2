//! Where a mount's RAM comes from. One module per backend owns its mount
//! options, mount and remount, the test for "is this mount ours", the
//! reading of its live mounts and its usage figures; the plan, `status`,
//! `down` and the agent speak only through the types here. tmpfs is the
//! first backend: a new one is a module here, a variant of each enum below
//! and one of `spec::Backend` (the spec's `backend:`).

pub mod tmpfs;

use std::path::Path;

use nix::errno::Errno;
use serde::Serialize;

use crate::host::mountinfo::{MountEntry, MountTable};
use crate::host::usage::Usage;
use crate::mount::RootAttrs;
use crate::spec::{self, Backend, MountSpec};

/// How a mount is built (and rebuilt online).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "backend", rename_all = "lowercase")]
pub enum MountOptions {
    Tmpfs(tmpfs::TmpfsOptions),
}

impl MountOptions {
    /// The options `m` asks for, with `root` as the mount's root.
    pub fn desired(m: &MountSpec, root: RootAttrs) -> MountOptions {
        match m.backend {
            Backend::Tmpfs => MountOptions::Tmpfs(tmpfs::TmpfsOptions::desired(m, root)),
        }
    }

    /// The backend's name, as operators know the filesystem.
    pub fn backend(&self) -> &'static str {
        match self {
            MountOptions::Tmpfs(_) => tmpfs::FSTYPE,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            MountOptions::Tmpfs(o) => o.describe(),
        }
    }

    /// The same options resized to `size` bytes and `nr_inodes` inodes.
    pub fn resized(mut self, size: u64, nr_inodes: Option<u64>) -> MountOptions {
        match &mut self {
            MountOptions::Tmpfs(o) => {
                o.size = size;
                o.nr_inodes = nr_inodes;
            }
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

/// Mounts a new filesystem of the options' backend at `target`.
pub fn mount(source: &str, target: &Path, o: &MountOptions) -> anyhow::Result<()> {
    match o {
        MountOptions::Tmpfs(o) => tmpfs::mount(source, target, o),
    }
}

/// Changes a live mount's options in place.
pub fn remount(target: &Path, o: &MountOptions) -> Result<(), Errno> {
    match o {
        MountOptions::Tmpfs(o) => tmpfs::remount(target, o),
    }
}

/// Whether `e` is the mount with `source` (`tmpfsctl-NAME`, see
/// `spec::source_for`): how tmpfsctl knows a mount of its own from anybody
/// else's.
pub fn is_ours(e: &MountEntry, source: &str) -> bool {
    tmpfs::is_ours(e, source)
}

/// Every mount in `table` with `source`, wherever it is.
pub fn mounts_of<'a>(table: &'a MountTable, source: &'a str) -> impl Iterator<Item = &'a MountEntry> + 'a {
    table.entries.iter().filter(move |e| is_ours(e, source))
}

/// The spec name of `e` when it is a mount of tmpfsctl's (of any spec).
pub fn managed_name(e: &MountEntry) -> Option<&str> {
    let name = e.source.strip_prefix(spec::SOURCE_PREFIX)?;
    is_ours(e, &e.source).then_some(name)
}

/// A live mount of ours as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "backend", rename_all = "lowercase")]
pub enum Live {
    Tmpfs(tmpfs::LiveTmpfs),
}

impl Live {
    /// Reads the mount `e` of ours at `path`; `None` when it cannot be seen.
    pub fn read(e: &MountEntry, path: &Path) -> Option<Live> {
        tmpfs::LiveTmpfs::read(e, path).map(Live::Tmpfs)
    }

    pub fn dev(&self) -> (u32, u32) {
        match self {
            Live::Tmpfs(l) => l.dev,
        }
    }

    pub fn root(&self) -> RootAttrs {
        match self {
            Live::Tmpfs(l) => l.root,
        }
    }

    pub fn usage(&self) -> Usage {
        match self {
            Live::Tmpfs(l) => l.usage,
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
        }
    }
}
