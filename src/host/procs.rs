//! Which processes hold files on a filesystem, so `down` can name them.

use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;

use serde::Serialize;

use super::Host;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    pub pid: u32,
    /// The process's name as it set it: any bytes (JSON shows them lossily,
    /// human output escaped).
    #[serde(serialize_with = "crate::out::lossy::path")]
    pub command: OsString,
    /// Open files, cwd, root or mapped files on the filesystem.
    pub uses: usize,
}

/// The field `name` of a /proc/PID/fdinfo/N text (`mnt_id:\t30`), trimmed.
pub fn fdinfo_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// The id of the mount (mountinfo's first field) the open file `fd` is on.
pub fn mount_id(fd: std::os::fd::BorrowedFd) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let text = fs::read_to_string(format!("/proc/thread-self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    fdinfo_field(&text, "mnt_id")?.parse().ok()
}

impl Host {
    /// Processes with an open fd, cwd, root or mapping on the filesystem
    /// `dev` (major, minor), or an open fd on the mount `mount` (by its id: an
    /// overlay's files show the device of their layer, not the overlay's).
    /// Processes that vanish mid-scan are skipped.
    pub fn holders(&self, dev: (u32, u32), mount: Option<u32>) -> Vec<Holder> {
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
            let on_mount = |fd: &fs::DirEntry| {
                mount.is_some_and(|id| {
                    fs::read_to_string(base.join("fdinfo").join(fd.file_name()))
                        .is_ok_and(|t| fdinfo_field(&t, "mnt_id").and_then(|v| v.parse().ok()) == Some(id))
                })
            };
            if let Ok(fds) = fs::read_dir(base.join("fd")) {
                uses += fds
                    .flatten()
                    .filter(|fd| on_dev(fd.path()) || on_mount(fd))
                    .count();
            }
            uses += ["cwd", "root"].iter().filter(|l| on_dev(base.join(l))).count();
            // Lossy: the path of any other mapped file may be bytes that are
            // not UTF-8, and must not hide this process's mappings.
            if let Ok(maps) = fs::read(base.join("maps")) {
                uses += String::from_utf8_lossy(&maps)
                    .lines()
                    .filter(|l| l.split_whitespace().nth(3) == Some(maps_dev.as_str()))
                    .count();
            }
            if uses > 0 {
                let command = fs::read(base.join("comm"))
                    .map(|mut c| {
                        if c.last() == Some(&b'\n') {
                            c.pop();
                        }
                        OsString::from_vec(c)
                    })
                    .unwrap_or_default();
                out.push(Holder { pid, command, uses });
            }
        }
        out.sort_by_key(|h| h.pid);
        out
    }
}
