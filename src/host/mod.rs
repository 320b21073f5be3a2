//! What the machine looks like. Reads only; every /proc read goes through
//! `Host::proc_root` so tests can point it at fixture files.

pub mod deletions;
pub mod fanotify;
pub mod meminfo;
pub mod mountinfo;
pub mod procs;
pub mod trust;
pub mod usage;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The page size tmpfs sizes are rounded to.
pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map(|p| p as u64)
        .unwrap_or(4096)
}

#[derive(Debug, Clone)]
pub struct Host {
    proc_root: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Host::new("/proc")
    }
}

impl Host {
    /// `TMPFSCTL_PROC` redirects /proc for tests that drive the host readers
    /// with fixtures; operators never need it.
    pub fn from_env() -> Self {
        match std::env::var_os("TMPFSCTL_PROC") {
            Some(p) => Host::new(p),
            None => Host::default(),
        }
    }

    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        Host {
            proc_root: proc_root.into(),
        }
    }

    pub fn proc_path(&self, rel: &str) -> PathBuf {
        self.proc_root.join(rel)
    }

    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    pub fn mounts(&self) -> Result<mountinfo::MountTable> {
        mountinfo::MountTable::read(&self.proc_path("self/mountinfo"))
    }

    pub fn meminfo(&self) -> Result<meminfo::MemInfo> {
        let p = self.proc_path("meminfo");
        let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        meminfo::MemInfo::parse(&text).with_context(|| format!("parsing {}", p.display()))
    }
}
