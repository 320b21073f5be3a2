//! The run's own mount namespace, with the work directory in DIR and the
//! tmpfs beside it; both are gone when the run ends, however it ends.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nix::sys::statfs::{statfs, TMPFS_MAGIC};

use super::report::Row;
use super::rows::measure_all;
use super::BenchSettings;

/// The temporary subdirectory and the tmpfs in it; removed on drop (also
/// when unwinding or after an interrupt). Lives in the private namespace.
pub(super) struct Workdir {
    pub(super) root: PathBuf,
    mounted: Option<PathBuf>,
}

impl Drop for Workdir {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            crate::mount::unmount_or_detach(&m);
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

pub(super) fn make_workdir(dir: &Path) -> Result<Workdir> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    for attempt in 0..100u32 {
        let root = dir.join(format!(
            ".tmpfsctl-bench-{}-{:08x}",
            std::process::id(),
            nanos.wrapping_add(attempt)
        ));
        match fs::DirBuilder::new().mode(0o700).create(&root) {
            Ok(()) => return Ok(Workdir { root, mounted: None }),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating a directory in {}", dir.display())),
        }
    }
    bail!("could not create a fresh directory in {}", dir.display())
}

/// Runs on the calling thread after moving it into a private mount namespace.
pub(super) fn bench(s: &BenchSettings) -> Result<(Vec<Row>, Vec<String>)> {
    crate::mount::enter_private_namespace()?;
    let mut work = make_workdir(&s.dir)?;
    let disk = work.root.join("disk");
    let tmpfs = work.root.join("tmpfs");
    fs::DirBuilder::new().mode(0o700).create(&disk)?;
    fs::DirBuilder::new().mode(0o700).create(&tmpfs)?;
    crate::mount::mount_scratch_tmpfs("tmpfsctl-bench", &tmpfs, s.tmpfs_size)?;
    work.mounted = Some(tmpfs.clone());
    if statfs(&tmpfs)?.filesystem_type() != TMPFS_MAGIC {
        bail!("{} is not the tmpfs just mounted", tmpfs.display());
    }
    let r = measure_all(s, &disk, &tmpfs);
    drop(work);
    r
}
