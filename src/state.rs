//! `/run/tmpfsctl/`: the lock, side paths to the on-disk directories,
//! staging mount points, and per-mount records. Lives on /run so it vanishes
//! at boot together with the mounts it describes.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::copy::baseline::{read_nofollow, write_durably, BaselineError};
use crate::copy::Baseline;
use crate::copy::Journal;
use crate::host::trust::{self, Untrusted};
use crate::spec::{Backend, MountSpec, Persist, Seed, Spec};

pub const DEFAULT_DIR: &str = "/run/tmpfsctl";

/// The layout of the state directory this build writes: 2 added the write-back
/// baseline and held tmpfs mounts. An older layout is adopted as it is (its mounts
/// have no baseline, so their first write-back only merges); a newer one is refused.
pub const FORMAT: u32 = 2;

/// The source of the records tmpfs at `STATE/run` (a `/` cannot be in a mount name,
/// so it is never taken for a managed mount).
pub const RUN_SOURCE: &str = "tmpfsctl/records";

#[derive(Debug, Clone)]
pub struct State {
    dir: PathBuf,
}

/// What `apply` recorded about a mount it finished building.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    pub path: PathBuf,
    /// `none`, `on-stop` or `every <seconds>s`.
    pub persist: String,
    /// How it was built; absent in records written before these were kept
    /// (the spec's then stand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<Seed>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    pub applied_at: u64,
}

impl Record {
    pub fn persisted(&self) -> bool {
        self.persist != "none"
    }
}

/// A seed or write-back while it runs, for `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressRecord {
    /// `seed` or `write-back`.
    pub op: String,
    pub pid: u32,
    /// Unix times.
    pub started: u64,
    pub updated: u64,
    /// Entries done (a seed's copied, a write-back's compared) and data bytes
    /// copied, against the totals where they are known (a seed's).
    pub entries: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entries_total: Option<u64>,
    pub bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
}

/// The outcome of the last write-back of a mount.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncRecord {
    /// Who wrote back: `sync`, `down`, `schedule` (the agent's `persist: every`),
    /// `fallback` (the agent), `retry` (the agent retrying a pending write-back).
    #[serde(default)]
    pub by: String,
    /// Unix time the sync finished.
    pub at: u64,
    pub seconds: f64,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    pub files_written: u64,
    pub bytes_written: u64,
    pub deleted: u64,
}

/// What a running agent publishes for `status` (`STATE/agent.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentStatus {
    pub pid: u32,
    /// Unix time it started, and last published.
    pub since: u64,
    pub updated: u64,
    pub mounts: std::collections::BTreeMap<String, AgentMount>,
}

/// One mount as the agent sees it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AgentMount {
    /// `ok`, `warn` or `high`.
    pub level: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub last_action: Option<AgentAction>,
    pub evicted_files: u64,
    pub evicted_bytes: u64,
    /// The chain can free nothing right now, and why; it is tried again.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub exhausted: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentAction {
    /// `warn`, `evict`, `grow`, `shrink`, `fallback`, `reoffload`, `sync`.
    pub action: String,
    /// Unix time.
    pub at: u64,
    pub detail: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another tmpfsctl holds {} (waited {waited:?}); retry later or raise --wait", path.display())]
    Busy { path: PathBuf, waited: Duration },
    #[error("cannot lock {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("the state directory must be root's alone, and {0}: use a --state-dir that only root can change (the default is {DEFAULT_DIR})")]
    Unsafe(Untrusted),
    #[error("{} was written by a newer tmpfsctl (state format {found}, this one knows {FORMAT}); use that tmpfsctl, or a newer one, to manage these mounts", path.display())]
    Newer { path: PathBuf, found: u32 },
}

/// What the agent remembers about a fallback, in STATE/agent/NAME.fallback.json.
/// It counts only while the mount's degraded marker exists: a successful
/// `apply` or a `down` clears that marker, and with it the fallback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FallbackRecord {
    /// Unix time of the fallback.
    pub at: u64,
    pub reason: String,
    /// Unix time the agent offloads the mount again; `None`: the next
    /// `apply`, or a change of this mount in the spec.
    pub reoffload_at: Option<u64>,
}

impl State {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        State { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Side binds live under `lower/`, the name they had before the code
    /// called them side binds: live mounts and installed units (ordered after
    /// `run-tmpfsctl-lower-NAME.mount`) keep working across an upgrade.
    pub fn side_root(&self) -> PathBuf {
        self.dir.join("lower")
    }

    pub fn stage_root(&self) -> PathBuf {
        self.dir.join("stage")
    }

    /// Scratch mount points for rebuilding a side bind; never kept.
    pub fn restore(&self, name: &str) -> PathBuf {
        self.dir.join("restore").join(name)
    }

    pub fn restore_names(&self) -> Vec<String> {
        list_names(&self.dir.join("restore"))
    }

    pub fn held_root(&self) -> PathBuf {
        self.dir.join("held")
    }

    /// Where `down` and the fallback keep a tmpfs after the application went back
    /// to its disk directory, until its write-back succeeded: reachable, listed in
    /// the mount table, and surviving a crash of tmpfsctl.
    pub fn held(&self, name: &str) -> PathBuf {
        self.held_root().join(name)
    }

    /// The write-back's baseline of a mount (see [`crate::copy::baseline`]).
    pub fn baseline_path(&self, name: &str) -> PathBuf {
        self.dir.join("baseline").join(name)
    }

    /// The baseline to merge against; none (merge only, delete nothing) when there
    /// is none or it is damaged. A baseline of a newer format is an error.
    ///
    /// What the journal of an interrupted write-back recorded is part of it.
    pub fn baseline(&self, name: &str) -> Result<Baseline> {
        let mut base = self.recorded_baseline(name)?;
        let journal = self.journal_path(name);
        let replayed =
            Journal::replay(&journal, &mut base).with_context(|| format!("reading {}", journal.display()))?;
        base.replayed = replayed > 0;
        Ok(base)
    }

    /// Where records live that matter only as long as a tmpfs of tmpfsctl does (the
    /// write-back journal, the deletion keeper's): a small private tmpfs, so that they
    /// can be written when the disk is full, and go with the tmpfs at a reboot.
    pub fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// Creates [`Self::run_dir`]: a directory when the state directory is on a tmpfs
    /// already (the default, under /run), else a tmpfs mounted there.
    pub fn ensure_run_dir(&self) -> Result<()> {
        self.ensure_dirs()?;
        let on_tmpfs = nix::sys::statfs::statfs(&self.dir)
            .is_ok_and(|f| f.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
        if on_tmpfs {
            return fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(self.run_dir())
                .with_context(|| format!("creating {}", self.run_dir().display()));
        }
        crate::mount::ensure_records_tmpfs(&self.run_dir(), RUN_SOURCE)
    }

    /// The write-back journal of a mount (see [`crate::copy::journal`]).
    pub fn journal_path(&self, name: &str) -> PathBuf {
        self.run_dir().join(format!("{name}.journal"))
    }

    /// What the write-backs of a `seed: overlay` mount after its switch placed on
    /// disk themselves (see [`crate::copy::placings`]).
    pub fn placings_path(&self, name: &str) -> PathBuf {
        self.run_dir().join(format!("{name}.placed"))
    }

    /// Marks the seeded tmpfs of a mount whose merge of what the application wrote
    /// on disk during the seed is not recorded yet (see `sync::seed_window`): set
    /// before the switch, cleared once recorded, gone with the tmpfs at a reboot.
    pub fn seed_merge_path(&self, name: &str) -> PathBuf {
        self.run_dir().join(format!("{name}.seed-merge"))
    }

    pub fn mark_seed_merge(&self, name: &str) -> Result<()> {
        self.ensure_run_dir()?;
        write_atomic(&self.seed_merge_path(name), b"")
    }

    pub fn seed_merge_pending(&self, name: &str) -> bool {
        self.seed_merge_path(name).exists()
    }

    pub fn clear_seed_merge(&self, name: &str) -> Result<()> {
        remove_if_present(&self.seed_merge_path(name))
    }

    /// Opens the journal for a write-back pass against `base`.
    pub fn journal(&self, name: &str, base: &Baseline) -> Result<Journal> {
        self.ensure_run_dir()?;
        let path = self.journal_path(name);
        Journal::open(&path, base)
            .with_context(|| format!("opening the write-back journal {}", path.display()))
    }

    fn recorded_baseline(&self, name: &str) -> Result<Baseline> {
        match Baseline::load(&self.baseline_path(name)) {
            Ok(b) => Ok(b.unwrap_or_default()),
            Err(e @ BaselineError::Newer(_)) => Err(anyhow::Error::new(e))
                .with_context(|| format!("reading {}", self.baseline_path(name).display())),
            Err(e) => {
                tracing::warn!(
                    "{name}: {e} ({}); the next write-back only merges and deletes nothing",
                    self.baseline_path(name).display()
                );
                Ok(Baseline::none())
            }
        }
    }

    pub fn save_baseline(&self, name: &str, b: &Baseline) -> Result<()> {
        self.ensure_dirs()?;
        let path = self.baseline_path(name);
        b.save(&path)
            .with_context(|| format!("saving the write-back baseline {}", path.display()))?;
        // Now part of the baseline; a journal left by a crash here belongs to the old
        // one and is ignored.
        remove_if_present(&self.journal_path(name))
    }

    /// The zram devices tmpfsctl made: one directory per device (see
    /// `crate::backend::zram`), the only ones it ever resets or removes.
    pub fn zram_root(&self) -> PathBuf {
        self.dir.join("zram")
    }

    /// Side path where the on-disk directory stays reachable under the tmpfs.
    pub fn side(&self, name: &str) -> PathBuf {
        self.side_root().join(name)
    }

    /// Where a new tmpfs is built and seeded before it is moved into place,
    /// so the application never sees a half-seeded cache.
    pub fn stage(&self, name: &str) -> PathBuf {
        self.stage_root().join(name)
    }

    pub fn side_names(&self) -> Vec<String> {
        list_names(&self.side_root())
    }

    pub fn stage_names(&self) -> Vec<String> {
        list_names(&self.dir.join("stage"))
    }

    /// Creates the state directory tree, root-only.
    pub fn ensure_dirs(&self) -> Result<()> {
        for d in std::iter::once(self.dir.clone()).chain(SUBDIRS.iter().map(|s| self.dir.join(s))) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&d)
                .with_context(|| format!("creating state directory {}", d.display()))?;
        }
        Ok(())
    }

    /// Makes sure the state directory is root's alone before root trusts anything in
    /// it: created 0700 if missing; refused if it, or a directory above it, could be
    /// changed by another user; its own directories repaired where they are not
    /// plain root-only directories (a symlink there is removed, never followed). Run
    /// as another user (who cannot mount anyway) it only creates the tree.
    fn secure(&self) -> Result<(), LockError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| LockError::Io { path, source }
        };
        if !nix::unistd::geteuid().is_root() {
            return self.ensure_dirs().map_err(|e| LockError::Io {
                path: self.dir.clone(),
                source: std::io::Error::other(format!("{e:#}")),
            });
        }
        if let Some(parent) = self.dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(io(parent))?;
        }
        match fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(io(&self.dir)(e)),
            _ => {}
        }
        trust::root_directory(&self.dir).map_err(LockError::Unsafe)?;
        own_directory(&self.dir).map_err(io(&self.dir))?;
        for sub in SUBDIRS {
            let d = self.dir.join(sub);
            own_directory(&d).map_err(io(&d))?;
        }
        Ok(())
    }

    /// The agent's own lock (`STATE/agent.lock`), held for its whole life: `None`
    /// when another agent holds it. Two agents on one state directory both acted on
    /// the same mounts (two fallbacks of one mount, one detached lazily with the
    /// other as its holder), and `status` lost the one still running.
    pub fn agent_lock(&self) -> Result<Option<Flock<File>>, LockError> {
        self.secure()?;
        let path = self.dir.join("agent.lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|source| LockError::Io {
                path: path.clone(),
                source,
            })?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Some(lock)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(LockError::Io {
                path,
                source: e.into(),
            }),
        }
    }

    /// Takes the exclusive lock, waiting up to `wait`.
    pub fn lock(&self, wait: Duration) -> Result<Flock<File>, LockError> {
        let path = self.dir.join("lock");
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io)?;
        self.secure()?;
        match fs::symlink_metadata(&path) {
            Ok(m) if !m.is_file() => {
                tracing::warn!(
                    "{}: not a regular file where tmpfsctl keeps its lock; removed",
                    path.display()
                );
                fs::remove_file(&path).map_err(io)?;
            }
            _ => {}
        }
        let start = Instant::now();
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io)?;
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    self.adopt_format()?;
                    return Ok(lock);
                }
                Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                    if start.elapsed() >= wait {
                        return Err(LockError::Busy { path, waited: wait });
                    }
                    file = f;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err((_, e)) => return Err(io(e.into())),
            }
        }
    }

    /// Refuses a state directory of a newer format; records this one's otherwise.
    fn adopt_format(&self) -> Result<(), LockError> {
        let path = self.dir.join("format");
        let found = read_text(&path).and_then(|t| t.trim().parse::<u32>().ok());
        match found {
            Some(found) if found > FORMAT => Err(LockError::Newer { path, found }),
            Some(found) if found == FORMAT => Ok(()),
            _ => write_durably(&path, format!("{FORMAT}\n").as_bytes())
                .map_err(|source| LockError::Io { path, source }),
        }
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.dir.join("mounts").join(format!("{name}.json"))
    }

    fn degraded_path(&self, name: &str) -> PathBuf {
        self.dir.join("mounts").join(format!("{name}.degraded"))
    }

    /// What the change tracker's barriers did to the RAM root's ctime (see
    /// [`crate::dirty::ask`]).
    pub fn barriers_path(&self, name: &str) -> PathBuf {
        self.dir.join("mounts").join(format!("{name}.barriers"))
    }

    pub fn record(&self, name: &str) -> Option<Record> {
        let text = read_text(&self.record_path(name))?;
        serde_json::from_str(&text).ok()
    }

    /// `m` as its mount was built, where one is recorded: a spec edited since
    /// (`apply` refuses to change these on a live mount) must not change how it
    /// is written back. Its seed and backend are the record's, and so is whether
    /// it is persisted: what was written while it was persisted is written back
    /// (with `persist: none` in the spec, at `down` only), and a volatile one is
    /// never, its baseline being the seed's (a review helper's probe: `evict`'s
    /// deletions in a volatile mount, written back after the spec said
    /// `persist: on-stop`, deleted 18 of 22 files on disk).
    pub fn as_mounted(&self, m: &MountSpec) -> MountSpec {
        let Some(rec) = self.record(&m.name) else {
            return m.clone();
        };
        let mut m = m.clone();
        m.seed = rec.seed.unwrap_or(m.seed);
        m.backend = rec.backend.unwrap_or(m.backend);
        if !rec.persisted() {
            m.persist = Persist::None;
        } else if m.persist == Persist::None {
            m.persist = Persist::OnStop;
        }
        m
    }

    /// `spec` with each mount [`as_mounted`](Self::as_mounted).
    pub fn spec_as_mounted(&self, spec: &Spec) -> Spec {
        Spec {
            mounts: spec.mounts.iter().map(|m| self.as_mounted(m)).collect(),
            ..spec.clone()
        }
    }

    pub fn write_record(&self, rec: &Record) -> Result<()> {
        self.ensure_dirs()?;
        let json = serde_json::to_vec_pretty(rec).expect("a Record always serialises");
        write_atomic(&self.record_path(&rec.name), &json)
    }

    fn sync_path(&self, name: &str) -> PathBuf {
        self.dir.join("mounts").join(format!("{name}.sync.json"))
    }

    pub fn last_sync(&self, name: &str) -> Option<SyncRecord> {
        let text = read_text(&self.sync_path(name))?;
        serde_json::from_str(&text).ok()
    }

    pub fn write_sync(&self, name: &str, rec: &SyncRecord) -> Result<()> {
        self.ensure_dirs()?;
        let json = serde_json::to_vec_pretty(rec).expect("a SyncRecord always serialises");
        write_atomic(&self.sync_path(name), &json)
    }

    fn progress_path(&self, name: &str) -> PathBuf {
        self.dir.join("mounts").join(format!("{name}.progress.json"))
    }

    /// The seed or write-back of `name` in progress, if the process running
    /// it is still there.
    pub fn progress(&self, name: &str) -> Option<ProgressRecord> {
        let text = read_text(&self.progress_path(name))?;
        let rec: ProgressRecord = serde_json::from_str(&text).ok()?;
        Path::new(&format!("/proc/{}", rec.pid)).exists().then_some(rec)
    }

    pub fn write_progress(&self, name: &str, rec: &ProgressRecord) -> Result<()> {
        self.ensure_dirs()?;
        let json = serde_json::to_vec_pretty(rec).expect("a ProgressRecord always serialises");
        write_quick(&self.progress_path(name), &json)
    }

    pub fn clear_progress(&self, name: &str) {
        let _ = fs::remove_file(self.progress_path(name));
    }

    fn agent_status_path(&self) -> PathBuf {
        self.dir.join("agent.json")
    }

    /// What the agent last published; `None` when no agent wrote one, or the one
    /// that did is not running any more.
    pub fn agent_status(&self) -> Option<AgentStatus> {
        let text = read_text(&self.agent_status_path())?;
        let st: AgentStatus = serde_json::from_str(&text).ok()?;
        let cmdline = fs::read(format!("/proc/{}/cmdline", st.pid)).ok()?;
        let running = cmdline.split(|&b| b == 0).any(|a| a == b"agent");
        running.then_some(st)
    }

    pub fn write_agent_status(&self, st: &AgentStatus) -> Result<()> {
        self.ensure_dirs()?;
        let json = serde_json::to_vec_pretty(st).expect("an AgentStatus always serialises");
        write_quick(&self.agent_status_path(), &json)
    }

    pub fn clear_agent_status(&self, pid: u32) {
        if self.agent_status().is_none_or(|s| s.pid == pid) {
            let _ = fs::remove_file(self.agent_status_path());
        }
    }

    fn fallback_path(&self, name: &str) -> PathBuf {
        self.dir.join("agent").join(format!("{name}.fallback.json"))
    }

    /// The agent's fallback of `name`, while it is in force.
    pub fn fallback(&self, name: &str) -> Option<FallbackRecord> {
        self.degraded(name)?;
        let text = fs::read_to_string(self.fallback_path(name)).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn set_fallback(&self, name: &str, rec: &FallbackRecord) -> Result<()> {
        let dir = self.dir.join("agent");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let json = serde_json::to_vec_pretty(rec).expect("a FallbackRecord always serialises");
        write_atomic(&self.fallback_path(name), &json)
    }

    pub fn clear_fallback(&self, name: &str) {
        let _ = fs::remove_file(self.fallback_path(name));
    }

    pub fn degraded(&self, name: &str) -> Option<String> {
        read_text(&self.degraded_path(name))
    }

    pub fn set_degraded(&self, name: &str, reason: &str) -> Result<()> {
        self.ensure_dirs()?;
        write_atomic(&self.degraded_path(name), reason.as_bytes())
    }

    /// Forgets a mount: record, degraded marker, baseline and journal. The record of
    /// its last write-back stays, for `status`.
    pub fn forget(&self, name: &str) -> Result<()> {
        for p in [
            self.record_path(name),
            self.degraded_path(name),
            self.baseline_path(name),
            self.journal_path(name),
            self.placings_path(name),
            self.seed_merge_path(name),
        ] {
            remove_if_present(&p)?;
        }
        // Only ever matches the ctime of the tmpfs root it was made on, which is gone.
        let _ = fs::remove_file(self.barriers_path(name));
        Ok(())
    }

    pub fn clear_degraded(&self, name: &str) -> Result<()> {
        match fs::remove_file(self.degraded_path(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing degraded marker of {name}"))
            }
            _ => Ok(()),
        }
    }
}

/// Now, in the unix seconds the records hold.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Replaces a record that is rewritten often and only read by `status`:
/// atomic, but not worth an fsync.
pub(crate) fn write_quick(path: &Path, data: &[u8]) -> Result<()> {
    // Beside the file, under its whole name: records of one mount that differ only
    // in their extension are written by different threads.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp~");
    let tmp = PathBuf::from(tmp);
    let _ = fs::remove_file(&tmp);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, data))
        .and_then(|()| fs::rename(&tmp, path))
        .with_context(|| format!("writing {}", path.display()))
}

/// The directories directly under the state directory.
const SUBDIRS: [&str; 8] = [
    "lower", "stage", "restore", "held", "mounts", "baseline", "run", "zram",
];

/// One of tmpfsctl's own records, never read through a symlink.
fn read_text(path: &Path) -> Option<String> {
    String::from_utf8(read_nofollow(path).ok()?).ok()
}

/// Makes `dir` a directory of root's with mode 0700: created if missing; a symlink
/// or other entry in its place is removed (it can only be stale, or planted by
/// whoever could once write there) and the directory created; owner and mode are
/// repaired. Each repair is logged with the path.
fn own_directory(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    match meta {
        Some(m) if m.is_dir() => {
            if m.uid() != 0 || m.gid() != 0 {
                tracing::warn!("{}: owned by {}:{}, made root's", dir.display(), m.uid(), m.gid());
                std::os::unix::fs::lchown(dir, Some(0), Some(0))?;
            }
            if m.mode() & 0o7777 != 0o700 {
                tracing::warn!("{}: mode {:o}, made 0700", dir.display(), m.mode() & 0o7777);
                fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
            }
            Ok(())
        }
        Some(m) => {
            let what = if m.file_type().is_symlink() {
                "a symlink"
            } else {
                "not a directory"
            };
            tracing::warn!(
                "{}: {what} where tmpfsctl keeps a directory; removed",
                dir.display()
            );
            fs::remove_file(dir)?;
            fs::DirBuilder::new().mode(0o700).create(dir)
        }
        None => fs::DirBuilder::new().mode(0o700).create(dir),
    }
}

fn remove_if_present(p: &Path) -> Result<()> {
    match fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", p.display()))
        }
        _ => Ok(()),
    }
}

fn list_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Temporary file (never through a symlink), fsync, rename, fsync of the
/// directory: readers and a power cut see the old or the new content.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    write_durably(path, data).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_forget() {
        let dir = tempfile::tempdir().unwrap();
        let st = State::new(dir.path());
        st.ensure_dirs().unwrap();
        assert!(st.record("a").is_none());
        let rec = Record {
            name: "a".into(),
            path: "/x".into(),
            persist: "none".into(),
            seed: Some(Seed::Overlay),
            backend: Some(Backend::Zram),
            applied_at: 5,
        };
        st.write_record(&rec).unwrap();
        assert_eq!(st.record("a"), Some(rec));
        st.set_degraded("a", "why").unwrap();
        assert_eq!(st.degraded("a").as_deref(), Some("why"));
        st.forget("a").unwrap();
        assert!(st.record("a").is_none() && st.degraded("a").is_none());
    }

    #[test]
    fn second_lock_times_out_as_busy() {
        let dir = tempfile::tempdir().unwrap();
        let st = State::new(dir.path());
        let _held = st.lock(Duration::ZERO).unwrap();
        let err = st.lock(Duration::from_millis(120)).unwrap_err();
        assert!(matches!(err, LockError::Busy { .. }), "{err}");
        assert!(err.to_string().contains("--wait"));
    }

    #[test]
    fn an_older_state_is_adopted_and_a_newer_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let st = State::new(dir.path());
        drop(st.lock(Duration::ZERO).unwrap());
        assert_eq!(fs::read_to_string(dir.path().join("format")).unwrap(), "2\n");
        fs::write(dir.path().join("format"), "1\n").unwrap();
        drop(st.lock(Duration::ZERO).unwrap());
        assert_eq!(fs::read_to_string(dir.path().join("format")).unwrap(), "2\n");
        fs::write(dir.path().join("format"), "3\n").unwrap();
        let err = st.lock(Duration::ZERO).unwrap_err();
        assert!(matches!(err, LockError::Newer { found: 3, .. }), "{err}");
        assert!(err.to_string().contains("newer tmpfsctl"), "{err}");
    }
}
