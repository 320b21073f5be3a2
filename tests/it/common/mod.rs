//! Test sandbox: every test thread gets its own private mount namespace, so
//! real tmpfs mounts, binds and moves happen for real and vanish with the
//! thread; nothing can leak into the host's mount table.

pub mod ci;

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

/// Runs `f` on a thread of its own in a new mount namespace where all mounts are
/// private: tmpfs mounted there are invisible to the host and vanish with the thread;
/// children it spawns inherit the namespace.
pub fn in_private_mount_ns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                enter_private_namespace();
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
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

    /// `cache.yaml`: one mount `name` of `size` at `path`, `extra` appended to its
    /// entry (indented lines, each ending in a newline).
    pub fn one_mount_spec(&self, name: &str, path: &Path, size: &str, extra: &str) -> PathBuf {
        self.write_spec(
            "cache.yaml",
            &format!(
                "version: 1\nmounts:\n  - name: {name}\n    path: {}\n    size: {size}\n{extra}",
                path.display()
            ),
        )
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
        MountTable::read(Path::new("/proc/thread-self/mountinfo")).unwrap()
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

/// A `--root` tree's etc/passwd and etc/group naming only root, for specs
/// that name root (or no one).
pub fn root_only_users(root: &Path) {
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
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

/// An ext4 filesystem on a loop device over an image file, mounted in the test's
/// namespace: a small disk to fill, and a device whose image can be copied as a
/// power cut would leave it. The loop device and the image go with it.
pub struct LoopFs {
    pub mount_point: PathBuf,
    pub image: PathBuf,
    device: String,
    _dir: tempfile::TempDir,
}

/// Runs a helper program, failing the test with its output if it fails.
pub fn run_tool(prog: &str, args: &[&OsStr]) -> String {
    let out = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {prog}: {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl LoopFs {
    /// A fresh ext4 of `mib` MiB mounted at `mount_point` with `options`.
    pub fn new(mount_point: &Path, mib: u64, options: &str) -> LoopFs {
        let dir = disk_tempdir("tmpfsctl-loop-");
        let image = dir.path().join("disk.img");
        fs::File::create(&image).unwrap().set_len(mib << 20).unwrap();
        run_tool("mkfs.ext4", &["-q".as_ref(), "-F".as_ref(), image.as_os_str()]);
        let mut fs = LoopFs::attach(&image, mount_point);
        fs._dir = dir;
        fs.mount(options);
        fs
    }

    /// A fresh ext4 of `mib` MiB without a journal in the image file `image`, whose
    /// every block is written (zeros) first, mounted at `mount_point` without the
    /// kernel's zeroing of inode tables: its metadata and files keep their blocks of
    /// the image, and [`LoopFs::trim`] and every later deletion (mounted with
    /// `discard`) punch the free blocks out of it. An image on a tmpfs that is then
    /// filled fails every write of new data, as a failing disk would, and the
    /// filesystem goes on (with a journal, ext4 aborts it on a failed write and
    /// turns read-only). The loop device takes a write that the image file took
    /// only in part for a whole one (a device that lies), so its writes are one
    /// page at most (`max_sectors_kb`), and blocks are pages: a write then lands
    /// whole or fails.
    pub fn on_image(image: &Path, mib: u64, mount_point: &Path) -> LoopFs {
        fs::write(image, vec![0u8; (mib << 20) as usize]).unwrap();
        run_tool(
            "mkfs.ext4",
            &[
                "-q".as_ref(),
                "-F".as_ref(),
                "-b".as_ref(),
                "4096".as_ref(),
                "-O".as_ref(),
                "^has_journal".as_ref(),
                "-E".as_ref(),
                "nodiscard,lazy_itable_init=1".as_ref(),
                image.as_os_str(),
            ],
        );
        let fs = LoopFs::attach(image, mount_point);
        let device = Path::new(&fs.device).file_name().expect("/dev/loopN");
        let limit = Path::new("/sys/block").join(device).join("queue/max_sectors_kb");
        fs::write(&limit, "4").unwrap_or_else(|e| panic!("writing {}: {e}", limit.display()));
        fs.mount("discard,noinit_itable");
        fs
    }

    /// Discards the filesystem's free blocks: the loop device punches them out of
    /// its image, whose other blocks (metadata, files) stay written.
    pub fn trim(&self) {
        run_tool("fstrim", &[self.mount_point.as_os_str()]);
    }

    /// Unmounts the filesystem, checks it (`e2fsck -fn`: a failed write of its own
    /// metadata would show there, not as the write-back's loss) and mounts it again:
    /// its files are then read from the device, not from the page cache (which
    /// keeps data whose write failed).
    pub fn remount(&self) {
        let options = fs::read_to_string("/proc/thread-self/mountinfo")
            .unwrap()
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|f| Path::new(f[4]) == self.mount_point)
            .map(|f| f[5].to_string())
            .expect("mounted");
        umount2(&self.mount_point, MntFlags::empty())
            .unwrap_or_else(|e| panic!("unmounting {}: {e}", self.mount_point.display()));
        let check = Command::new("e2fsck")
            .args(["-fn", &self.device])
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "the test's filesystem on {} is damaged:\n{}",
            self.device,
            String::from_utf8_lossy(&check.stdout)
        );
        self.mount(&options);
    }

    /// `image` on a new loop device, to be mounted at `mount_point`; the device is
    /// detached when the returned guard drops.
    fn attach(image: &Path, mount_point: &Path) -> LoopFs {
        let device = run_tool(
            "losetup",
            &["--find".as_ref(), "--show".as_ref(), image.as_os_str()],
        );
        fs::create_dir_all(mount_point).unwrap();
        LoopFs {
            mount_point: mount_point.to_path_buf(),
            image: image.to_path_buf(),
            device,
            _dir: disk_tempdir("tmpfsctl-loop-"),
        }
    }

    fn mount(&self, options: &str) {
        run_tool(
            "mount",
            &[
                "-t".as_ref(),
                "ext4".as_ref(),
                "-o".as_ref(),
                options.as_ref(),
                self.device.as_ref(),
                self.mount_point.as_os_str(),
            ],
        );
    }

    /// Mounts a copy of an image (its journal replays, as after a power cut) at
    /// `mount_point`; unmounted and detached when the returned guard drops.
    pub fn mount_copy(image: &Path, mount_point: &Path) -> LoopFs {
        let fs = LoopFs::attach(image, mount_point);
        fs.mount("defaults");
        fs
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        // Mounts stacked below it (binds into the state directory) go first.
        let mut below: Vec<PathBuf> = fs::read_to_string("/proc/thread-self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(PathBuf::from))
            .filter(|p| p.starts_with(&self.mount_point))
            .collect();
        below.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in below {
            let _ = umount2(&p, MntFlags::MNT_DETACH);
        }
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
    }
}

/// The application, played by a thread working in a directory through its path (it
/// sees the disk or the tmpfs, whichever is mounted there): it creates, rewrites,
/// deletes and renames files. What it did that succeeded is the expected end state.
pub struct App {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    started: std::time::Instant,
    /// The test's own events, merged into the history shown on a failure.
    events: std::sync::Mutex<Vec<(std::time::Duration, String)>>,
    thread: std::thread::JoinHandle<Expected>,
}

/// What the application's completed operations left, by name: its content, or
/// `None` for deleted. Names whose last operation failed half way are `uncertain`.
#[derive(Debug, Default)]
pub struct Expected {
    pub names: std::collections::BTreeMap<String, Option<Vec<u8>>>,
    pub uncertain: std::collections::BTreeSet<String>,
    pub ops: u64,
    /// Every operation, with its time since the start and its result: shown for the
    /// names a check finds wrong.
    pub log: Vec<(std::time::Duration, String)>,
    /// The test's events, by time.
    pub events: Vec<(std::time::Duration, String)>,
}

impl App {
    /// Starts it in `dir`, where `seeded` names (with their contents) already exist.
    /// `seed` makes its choices reproducible.
    pub fn start(dir: PathBuf, seeded: Vec<(String, Vec<u8>)>, seed: u64) -> App {
        App::paced(dir, seeded, seed, std::time::Duration::from_micros(200))
    }

    /// [`App::start`], pausing `pause` between operations.
    pub fn paced(dir: PathBuf, seeded: Vec<(String, Vec<u8>)>, seed: u64, pause: std::time::Duration) -> App {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stop2 = std::sync::Arc::clone(&stop);
        let started = std::time::Instant::now();
        let thread = std::thread::spawn(move || {
            let mut exp = Expected::default();
            let mut live: Vec<String> = Vec::new();
            for (n, c) in seeded {
                live.push(n.clone());
                exp.names.insert(n, Some(c));
            }
            let mut rng = seed | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut i = 0u64;
            let t0 = started;
            let note = |exp: &mut Expected, what: String| exp.log.push((t0.elapsed(), what));
            while !stop2.load(Ordering::Relaxed) {
                i += 1;
                let roll = next() % 10;
                if roll < 5 || live.is_empty() {
                    let name = format!("w-{i}");
                    let content = format!("{name} {}\n", "x".repeat((next() % 3000) as usize)).into_bytes();
                    let r = fs::write(dir.join(&name), &content);
                    note(&mut exp, format!("create {name}: {r:?}"));
                    match r {
                        Ok(()) => {
                            exp.names.insert(name.clone(), Some(content));
                            live.push(name);
                        }
                        Err(_) => {
                            if fs::remove_file(dir.join(&name)).is_err() && dir.join(&name).exists() {
                                exp.uncertain.insert(name);
                            }
                        }
                    }
                } else {
                    let k = (next() as usize) % live.len();
                    let name = live[k].clone();
                    match roll {
                        5..=6 => {
                            let content = format!("{name} rewritten {i}\n").into_bytes();
                            // Write a temporary, rename it over: how caches replace entries.
                            let tmp = dir.join(format!(".tmp-{i}"));
                            let ok = fs::write(&tmp, &content).is_ok()
                                && fs::rename(&tmp, dir.join(&name)).is_ok();
                            let _ = fs::remove_file(&tmp);
                            note(&mut exp, format!("rewrite {name} (rewritten {i}): {ok}"));
                            if ok {
                                exp.names.insert(name, Some(content));
                            }
                        }
                        7..=8 => {
                            let r = fs::remove_file(dir.join(&name));
                            note(&mut exp, format!("delete {name}: {r:?}"));
                            if r.is_ok() {
                                exp.names.insert(name, None);
                                live.swap_remove(k);
                            }
                        }
                        _ => {
                            let to = format!("r-{i}");
                            let r = fs::rename(dir.join(&name), dir.join(&to));
                            note(&mut exp, format!("rename {name} {to}: {r:?}"));
                            if r.is_ok() {
                                // What it renamed is what it finds under the new name: while a
                                // write-back runs, the disk side may still show an older version.
                                exp.names.insert(name, None);
                                match fs::read(dir.join(&to)) {
                                    Ok(content) => exp.names.insert(to.clone(), Some(content)),
                                    Err(_) => exp.uncertain.insert(to.clone()).then_some(None).flatten(),
                                };
                                live[k] = to;
                            }
                        }
                    }
                }
                exp.ops += 1;
                std::thread::sleep(pause);
            }
            exp
        });
        App {
            stop,
            started,
            events: Default::default(),
            thread,
        }
    }

    /// Notes a moment of the test (a command started or ended) in the history.
    pub fn event(&self, what: &str) -> std::time::Duration {
        let at = self.started.elapsed();
        self.events.lock().unwrap().push((at, format!("== {what}")));
        at
    }

    pub fn stop(self) -> Expected {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut exp = self.thread.join().expect("the application thread");
        exp.events = self.events.into_inner().unwrap();
        exp
    }
}

impl Expected {
    /// Compares `dir` with what the application left: (lost, resurrected), each
    /// with examples. Lost: a name it wrote is missing or holds other content.
    /// Resurrected: a name it deleted or renamed away is back.
    pub fn history(&self, name: &str) -> Vec<String> {
        let (short, _) = name.split_once(':').unwrap_or((name, ""));
        let mut h: Vec<_> = self
            .log
            .iter()
            .filter(|(_, w)| w.split([' ', ':']).any(|t| t == short))
            .chain(&self.events)
            .collect();
        h.sort();
        h.into_iter()
            .map(|(t, w)| format!("{:.3}s {w}", t.as_secs_f64()))
            .collect()
    }

    /// Fails the test, with the history of the first names found wrong, unless
    /// nothing the application wrote was lost and nothing it deleted came back.
    pub fn assert_nothing_lost(&self, dir: &Path, what: &str) {
        let (lost, resurrected) = self.check(dir);
        for n in lost.iter().chain(&resurrected).take(4) {
            eprintln!("{n}:\n  {}", self.history(n).join("\n  "));
        }
        assert!(
            lost.is_empty() && resurrected.is_empty(),
            "{what}: {} operations; lost {}: {:?}; resurrected {}: {:?}",
            self.ops,
            lost.len(),
            &lost[..lost.len().min(10)],
            resurrected.len(),
            &resurrected[..resurrected.len().min(10)]
        );
    }

    pub fn check(&self, dir: &Path) -> (Vec<String>, Vec<String>) {
        let mut lost = Vec::new();
        let mut resurrected = Vec::new();
        for (name, want) in &self.names {
            if self.uncertain.contains(name) {
                continue;
            }
            let have = fs::read(dir.join(name)).ok();
            match (want, have) {
                (Some(w), Some(h)) if *w == h => {}
                (Some(_), Some(h)) => lost.push(format!(
                    "{name}: other content {:?}",
                    String::from_utf8_lossy(&h[..h.len().min(40)])
                )),
                (Some(_), None) => lost.push(format!("{name}: missing")),
                (None, Some(_)) => resurrected.push(name.clone()),
                (None, None) => {}
            }
        }
        for e in fs::read_dir(dir).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if !self.names.contains_key(&name)
                && !self.uncertain.contains(&name)
                && !name.starts_with(".tmp-")
            {
                resurrected.push(format!("{name}: never written"));
            }
        }
        (lost, resurrected)
    }
}
