//! Which processes hold files on a filesystem, so `down` can name them.

use std::fs;
use std::os::unix::fs::MetadataExt;

use serde::Serialize;

use super::Host;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    pub pid: u32,
    pub command: String,
    /// Open files, cwd, root or mapped files on the filesystem.
    pub uses: usize,
}

impl Host {
    /// Processes with an open fd, cwd, root or mapping on the filesystem
    /// `dev` (major, minor). Processes that vanish mid-scan are skipped.
    pub fn holders(&self, dev: (u32, u32)) -> Vec<Holder> {
        let want = nix::sys::stat::makedev(dev.0 as u64, dev.1 as u64);
        let maps_dev = format!("{:02x}:{:02x}", dev.0, dev.1);
        let Ok(dir) = fs::read_dir(self.proc_root()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for ent in dir.flatten() {
            let Some(pid) = ent.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let base = ent.path();
            let on_dev = |p: std::path::PathBuf| fs::metadata(p).map(|m| m.dev() == want).unwrap_or(false);
            let mut uses = 0;
            if let Ok(fds) = fs::read_dir(base.join("fd")) {
                uses += fds.flatten().filter(|fd| on_dev(fd.path())).count();
            }
            uses += ["cwd", "root"].iter().filter(|l| on_dev(base.join(l))).count();
            if let Ok(maps) = fs::read_to_string(base.join("maps")) {
                uses += maps
                    .lines()
                    .filter(|l| l.split_whitespace().nth(3) == Some(maps_dev.as_str()))
                    .count();
            }
            if uses > 0 {
                let command = fs::read_to_string(base.join("comm"))
                    .map(|c| c.trim_end().to_string())
                    .unwrap_or_default();
                out.push(Holder { pid, command, uses });
            }
        }
        out.sort_by_key(|h| h.pid);
        out
    }
}
