//! Test sandbox: every test thread gets its own private mount namespace, so
//! real tmpfs mounts, binds and moves happen for real and vanish with the
//! thread; nothing can leak into the host's mount table.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::mount::{umount2, MntFlags};
use tmpfsctl::host::mountinfo::{MountEntry, MountTable};

pub struct Sandbox {
    pub root: PathBuf,
    pub state: PathBuf,
    _tmp: tempfile::TempDir,
}

/// Makes the calling thread's mount namespace private. Children spawned from
/// this thread inherit it; the host's namespace never sees our mounts.
pub fn enter_private_namespace() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "integration tests need root (they mount tmpfs)"
    );
    tmpfsctl::mount::enter_private_namespace().expect("private mount namespace for the test thread");
}

/// A temporary directory on a disk filesystem (not tmpfs), where page-cache
/// residency can be dropped and observed and a disk can be benchmarked.
pub fn disk_tempdir(prefix: &str) -> tempfile::TempDir {
    let candidates = [
        PathBuf::from("/var/tmp"),
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        PathBuf::from("/tmp"),
    ];
    for c in &candidates {
        let Ok(sf) = nix::sys::statfs::statfs(c) else {
            continue;
        };
        if sf.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
            return tempfile::Builder::new().prefix(prefix).tempdir_in(c).unwrap();
        }
    }
    panic!("no disk (non-tmpfs) directory among {candidates:?}");
}

pub struct Run {
    pub cmd: String,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(cmd: String, out: Output) -> Run {
        use std::os::unix::process::ExitStatusExt;
        Run {
            cmd,
            code: out.status.code(),
            signal: out.status.signal(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Asserts the exit status, printing command, output and mounts if not.
    pub fn code(&self, want: i32) -> &Run {
        assert_eq!(self.code, Some(want), "unexpected exit status\n{self}");
        self
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON: {e}\n{self}"))
    }

    pub fn stdout_has(&self, s: &str) -> &Run {
        assert!(self.stdout.contains(s), "stdout lacks {s:?}\n{self}");
        self
    }

    pub fn stdout_has_not(&self, s: &str) -> &Run {
        assert!(!self.stdout.contains(s), "stdout has {s:?}\n{self}");
        self
    }

    pub fn stderr_has(&self, s: &str) -> &Run {
        assert!(self.stderr.contains(s), "stderr lacks {s:?}\n{self}");
        self
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "$ {}", self.cmd)?;
        writeln!(f, "exit: {:?} signal: {:?}", self.code, self.signal)?;
        writeln!(f, "--- stdout\n{}", self.stdout)?;
        writeln!(f, "--- stderr\n{}", self.stderr)?;
        writeln!(f, "--- mounts (this test's namespace)")?;
        for l in fs::read_to_string("/proc/thread-self/mountinfo")
            .unwrap_or_default()
            .lines()
        {
            if l.contains("tmpfsctl") {
                writeln!(f, "{l}")?;
            }
        }
        Ok(())
    }
}

impl Sandbox {
    pub fn new() -> Sandbox {
        enter_private_namespace();
        let tmp = tempfile::Builder::new()
            .prefix("tmpfsctl-it-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let root = tmp.path().to_path_buf();
        Sandbox {
            state: root.join("state"),
            root,
            _tmp: tmp,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// A directory standing in for an application's on-disk cache.
    pub fn cache_dir(&self, rel: &str, uid: u32, gid: u32, mode: u32) -> PathBuf {
        let p = self.path(rel);
        fs::create_dir_all(&p).unwrap();
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    pub fn write_spec(&self, name: &str, yaml: &str) -> PathBuf {
        let p = self.path(name);
        fs::write(&p, yaml).unwrap();
        p
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_tmpfsctl"));
        c.env("TMPFSCTL_STATE_DIR", &self.state)
            .env_remove("TMPFSCTL_FAILPOINT");
        c
    }

    pub fn run<I, S>(&self, args: I) -> Run
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.run_with(self.cmd(), args)
    }

    pub fn run_with<I, S>(&self, mut c: Command, args: I) -> Run
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_os_string()).collect();
        c.args(&args);
        let cmd = format!(
            "tmpfsctl {}",
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        );
        Run::from(cmd, c.output().expect("spawn tmpfsctl"))
    }

    pub fn table(&self) -> MountTable {
        MountTable::parse(&fs::read_to_string("/proc/thread-self/mountinfo").unwrap()).unwrap()
    }

    /// Mounts at or below the sandbox, as (mount point, source, fstype).
    pub fn mounts(&self) -> Vec<MountEntry> {
        self.table()
            .entries
            .into_iter()
            .filter(|e| e.mount_point.starts_with(&self.root))
            .collect()
    }

    pub fn mounts_at(&self, p: &Path) -> Vec<MountEntry> {
        self.mounts().into_iter().filter(|e| e.mount_point == p).collect()
    }

    pub fn top(&self, p: &Path) -> Option<MountEntry> {
        self.table().top_at(p).cloned()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Deepest first, so the tempdir can be removed; the namespace dies
        // with the thread anyway.
        let mut points: Vec<PathBuf> = self.mounts().into_iter().map(|e| e.mount_point).collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            let _ = umount2(&p, MntFlags::MNT_DETACH);
        }
    }
}

pub fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

pub fn owner_of(p: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}
