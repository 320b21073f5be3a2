//! Dirty tracking: which RAM directories changed, so that a write-back reads only
//! those (see [`crate::copy::Dirty`] for what a pass does with them).
//!
//! The agent runs a [`ChangeTracker`] per persisted mount on a thread of its own: a
//! fanotify group with a filesystem mark on the tmpfs, reporting directory handles
//! and names (`FAN_REPORT_DFID_NAME`) for every write, attribute change, creation,
//! deletion and rename, and file ids (`FAN_REPORT_FID`) for what happens to a file
//! without a name (its link count changed through another name). It keeps each
//! changed directory with the time of its last event, and the names the events
//! happened to (up to [`MAX_NAMES`] in all: a directory that would need more, or
//! had an event without a name, counts as changed as a whole); a directory created
//! or moved in is kept as a new subtree.
//!
//! A write-back (`sync`, the agent's schedule, `down`, in any process) asks for the
//! changes since its baseline with a barrier: it creates and removes a reserved name
//! in the tmpfs root, carrying a nonce and the baseline's time. fanotify queues
//! events in the order they happen, so once the tracker reads the barrier it has
//! read every change made before it; it answers in `STATE/mounts/NAME.dirty`.
//!
//! The answer is a full pass (with the reason in the write-back's result) when no tracker
//! runs, it does not answer within [`ANSWER_WITHIN`], it started after the
//! baseline was taken, or its queue overflowed since.
//!
//! What fanotify does not report: writes through a shared writable mapping after the
//! file was closed. A file written that way is seen when it is closed for writing
//! (`FAN_CLOSE_WRITE`) or changed otherwise; `sync --full` reads everything.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::fanotify::{Fanotify, MaskFlags};

use crate::copy::baseline::{read_nofollow, Sig, Time};
use crate::copy::{Barriers, Dirty, TEMP_PREFIX};
use crate::host::fanotify::{fd_path, filesystem_group, open_handle, parse, Event, Handle};
use crate::state::{write_quick, State};

/// How long a write-back waits for the tracker's answer before it reads everything.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// Changed names kept at most, over all directories (and as many files changed in
/// place): about 100 bytes each.
pub const MAX_NAMES: usize = 1 << 16;

/// The events that create, remove or rename the name they report.
const ENTRY_EVENTS: u64 = libc::FAN_CREATE | libc::FAN_DELETE | libc::FAN_MOVED_FROM | libc::FAN_MOVED_TO;

/// The barrier's name after [`TEMP_PREFIX`] (which the write-back never copies):
/// `barrier.NONCE.SECS.NANOS`, the nonce and the baseline's time in decimal.
const BARRIER: &str = "barrier.";

fn now() -> Time {
    use nix::time::{clock_gettime, ClockId};
    let t = clock_gettime(ClockId::CLOCK_REALTIME).expect("CLOCK_REALTIME exists everywhere");
    (t.tv_sec(), t.tv_nsec())
}

/// A barrier's nonce and baseline time, from its name.
fn parse_barrier(name: &[u8]) -> Option<(u64, Time)> {
    let rest = name
        .strip_prefix(TEMP_PREFIX.as_bytes())?
        .strip_prefix(BARRIER.as_bytes())?;
    let mut parts = std::str::from_utf8(rest).ok()?.split('.');
    let nonce = parts.next()?.parse().ok()?;
    let secs = parts.next()?.parse().ok()?;
    let nanos = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((nonce, (secs, nanos)))
}

/// The RAM directories of one tmpfs that changed, as fanotify reports them.
pub struct ChangeTracker {
    group: Fanotify,
    root: File,
    /// Every change after this was seen: when the mark was placed, or the queue last
    /// overflowed.
    since: Time,
    overflowed: bool,
    /// Directories with a changed entry, by handle: the last event's time.
    dirs: HashMap<Handle, Time>,
    /// The names changed in them: the last event's time.
    names: HashMap<(Handle, Vec<u8>), Time>,
    /// Files written or changed in place (not created, deleted or renamed), by
    /// handle: the directory and name the change was reported under, and its time.
    /// fanotify reports the name the writer opened the file by, which may no longer
    /// be the file's (unlinked, with another name left; or a file made with
    /// `O_TMPFILE` and linked since): the answer checks each.
    written: HashMap<Handle, (Handle, Vec<u8>, Time)>,
    /// Directories with a change not told by name (an event on the directory itself,
    /// or one name too many): the last such event's time.
    whole: HashMap<Handle, Time>,
    /// Directories created or moved in (by parent handle and name): their time.
    subtrees: HashMap<(Handle, Vec<u8>), Time>,
    /// Objects changed without a name (a file whose link count changed), by handle:
    /// their directories count as changed.
    objects: HashMap<Handle, Time>,
    /// Changes before this were dropped: write-backs ask for the changes since
    /// their baseline, and baselines only move forward, so an answer for a time
    /// makes what came before it useless.
    dropped_before: Time,
}

/// What a tracker answers a barrier with.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    Changed(Dirty),
    /// No complete record since the baseline's time: why.
    Untracked(String),
}

impl ChangeTracker {
    /// Starts tracking the filesystem whose root directory is open at `root`.
    pub fn start(root: File) -> Result<ChangeTracker> {
        let mask = MaskFlags::FAN_MODIFY
            | MaskFlags::FAN_ATTRIB
            | MaskFlags::FAN_CLOSE_WRITE
            | MaskFlags::FAN_CREATE
            | MaskFlags::FAN_DELETE
            | MaskFlags::FAN_MOVED_FROM
            | MaskFlags::FAN_MOVED_TO
            | MaskFlags::FAN_ONDIR;
        // FID too: a file whose link count changed through another of its names
        // (that name deleted or renamed away) is reported by itself, without a name,
        // and its ctime changed.
        let group = filesystem_group(
            libc::FAN_REPORT_DFID_NAME | libc::FAN_REPORT_FID,
            mask,
            root.as_fd(),
            "FAN_REPORT_DFID_NAME (Linux 5.9 or later, CAP_SYS_ADMIN)",
        )?;
        Ok(ChangeTracker {
            group,
            root,
            since: now(),
            overflowed: false,
            dirs: HashMap::new(),
            names: HashMap::new(),
            written: HashMap::new(),
            whole: HashMap::new(),
            subtrees: HashMap::new(),
            objects: HashMap::new(),
            dropped_before: (0, 0),
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.group.as_fd()
    }

    /// Reads every queued event; returns the barriers among them (nonce, time).
    pub fn drain(&mut self) -> Vec<(u64, Time)> {
        let mut barriers = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match nix::unistd::read(self.group.as_fd(), &mut buf) {
                Ok(0) | Err(_) => return barriers,
                Ok(n) => n,
            };
            let at = now();
            for ev in parse(&buf[..n]) {
                match ev {
                    Event::Overflow => {
                        self.overflowed = true;
                        self.since = at;
                    }
                    Event::Named {
                        mask,
                        dir,
                        name,
                        object,
                        ..
                    } => {
                        if let Some(b) = parse_barrier(&name) {
                            barriers.push(b);
                            continue;
                        }
                        let new_dir = mask & libc::FAN_ONDIR != 0
                            && mask & (libc::FAN_CREATE | libc::FAN_MOVED_TO) != 0;
                        if new_dir {
                            self.subtrees.insert((dir.clone(), name.clone()), at);
                        }
                        let in_place = mask & (libc::FAN_ONDIR | ENTRY_EVENTS) == 0;
                        if let Some(object) = object.filter(|_| in_place) {
                            self.note_written(object, &dir, &name, at);
                        }
                        self.note_name(&dir, name, at);
                        self.dirs.insert(dir, at);
                    }
                    Event::Object { fid, .. } => {
                        self.objects.insert(fid, at);
                    }
                }
            }
        }
    }

    /// Keeps which name the file `object` was changed through; one file too many
    /// makes the directory whole.
    fn note_written(&mut self, object: Handle, dir: &Handle, name: &[u8], at: Time) {
        if self.written.len() >= MAX_NAMES && !self.written.contains_key(&object) {
            self.whole.insert(dir.clone(), at);
        } else {
            self.written.insert(object, (dir.clone(), name.to_vec(), at));
        }
    }

    /// Whether the name `name` in the directory `dir` (opened from its handle: each
    /// directory once per answer) is the file `object` now (as it was when changed
    /// through that name); `None` when that cannot be told.
    fn still_named(&self, object: &Handle, dir: &Result<OwnedFd, Errno>, name: &[u8]) -> Option<bool> {
        let dir = match dir {
            Ok(fd) => fd,
            // A directory gone: so is every name in it.
            Err(Errno::ESTALE | Errno::ENOENT) => return Some(false),
            Err(_) => return None,
        };
        let at = match nix::sys::stat::fstatat(
            dir.as_fd(),
            OsStr::from_bytes(name),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Some(false),
            Err(_) => return None,
        };
        match open_handle(self.root.as_fd(), object) {
            Ok(fd) => {
                let st = nix::sys::stat::fstat(&fd).ok()?;
                Some((st.st_dev, st.st_ino) == (at.st_dev, at.st_ino))
            }
            Err(Errno::ESTALE | Errno::ENOENT) => Some(false),
            Err(_) => None,
        }
    }

    /// Keeps the name a change in `dir` happened to; a change of the directory itself
    /// (reported as `.`), or a name beyond [`MAX_NAMES`], makes it changed as a whole.
    fn note_name(&mut self, dir: &Handle, name: Vec<u8>, at: Time) {
        let full = self.names.len() >= MAX_NAMES;
        if matches!(&name[..], b"" | b"." | b"..")
            || full && !self.names.contains_key(&(dir.clone(), name.clone()))
        {
            self.whole.insert(dir.clone(), at);
        } else {
            self.names.insert((dir.clone(), name), at);
        }
    }

    /// The changes since `taken` (a baseline's time), with paths relative to the
    /// root. Directories deleted since are left out: their parents changed.
    pub fn answer(&mut self, taken: Time) -> Answer {
        if self.since >= taken {
            return Answer::Untracked(if self.overflowed {
                "the change tracker's queue overflowed since the last write-back".into()
            } else {
                "the change tracker started after the last write-back".into()
            });
        }
        if taken < self.dropped_before {
            return Answer::Untracked("asked for changes older than the change tracker keeps".into());
        }
        self.dirs.retain(|_, t| *t >= taken);
        self.names.retain(|_, t| *t >= taken);
        self.written.retain(|_, (_, _, t)| *t >= taken);
        self.whole.retain(|_, t| *t >= taken);
        self.subtrees.retain(|_, t| *t >= taken);
        self.objects.retain(|_, t| *t >= taken);
        self.dropped_before = taken;
        let Some(root) = fd_path(self.root.as_fd()) else {
            return Answer::Untracked("the tmpfs root has no path".into());
        };
        let mut dirty = Dirty::default();
        let mut gone = Vec::new();
        let mut paths = HashMap::new();
        for handle in self.dirs.keys() {
            match self.relative(&root, handle) {
                Resolved::At(p, _) => {
                    paths.insert(handle, p.clone());
                    dirty.dirs.push(p);
                }
                Resolved::Gone => gone.push(handle.clone()),
                Resolved::Unknown => {
                    return Answer::Untracked("a changed directory could not be found".into())
                }
            }
        }
        for (handle, name) in self.subtrees.keys() {
            match self.relative(&root, handle) {
                Resolved::At(parent, _) => {
                    let mut path = parent.into_vec();
                    if !path.is_empty() {
                        path.push(b'/');
                    }
                    path.extend_from_slice(name);
                    dirty.subtrees.push(path.into());
                }
                Resolved::Gone => {}
                Resolved::Unknown => return Answer::Untracked("a new directory could not be found".into()),
            }
        }
        let mut objects_gone = Vec::new();
        // Directories changed without a name: by an object's change, or by a change
        // of a file through a name it no longer has (where the file is now).
        let mut unnamed = std::collections::HashSet::new();
        let mut moved_off = Vec::new();
        // By directory, each opened once, one at a time.
        let mut written: Vec<_> = self.written.iter().collect();
        written.sort_by(|a, b| a.1 .0.cmp(&b.1 .0));
        let mut open: Option<(&Handle, Result<OwnedFd, Errno>)> = None;
        for (object, (dir, name, _)) in written {
            if open.as_ref().is_none_or(|(at, _)| *at != dir) {
                open = Some((dir, open_handle(self.root.as_fd(), dir)));
            }
            let (_, fd) = open.as_ref().expect("opened just above");
            match self.still_named(object, fd, name) {
                Some(true) => {}
                Some(false) => moved_off.push(object.clone()),
                None => return Answer::Untracked("a changed file could not be found".into()),
            }
        }
        for handle in self.objects.keys().chain(&moved_off) {
            let dir: Box<[u8]> = match self.relative(&root, handle) {
                // A file: the directory it is in now (one of its names, if several).
                Resolved::At(p, false) => crate::copy::parent_of(&p).into(),
                Resolved::At(p, true) => p,
                Resolved::Gone => {
                    objects_gone.push(handle.clone());
                    continue;
                }
                Resolved::Unknown => return Answer::Untracked("a changed file could not be found".into()),
            };
            unnamed.insert(dir.clone());
            dirty.dirs.push(dir);
        }
        // By path: a directory seen through two handles (replaced at its path) is
        // named only if both told every change by name.
        for (handle, p) in &paths {
            if self.whole.contains_key(*handle) {
                unnamed.insert(p.clone());
            }
        }
        for p in paths.values() {
            if !unnamed.contains(p) {
                dirty.named.push(p.clone());
            }
        }
        for (handle, name) in self.names.keys() {
            if let Some(p) = paths.get(handle).filter(|p| !unnamed.contains(*p)) {
                let mut path = p.to_vec();
                if !path.is_empty() {
                    path.push(b'/');
                }
                path.extend_from_slice(name);
                dirty.entries.push(path.into());
            }
        }
        for handle in objects_gone {
            self.objects.remove(&handle);
            self.written.remove(&handle);
        }
        for handle in gone {
            self.dirs.remove(&handle);
            self.whole.remove(&handle);
            self.names.retain(|(h, _), _| *h != handle);
            self.subtrees.retain(|(h, _), _| *h != handle);
        }
        dirty.dirs.sort();
        dirty.dirs.dedup();
        dirty.subtrees.sort();
        dirty.named.sort();
        dirty.named.dedup();
        dirty.entries.sort();
        Answer::Changed(dirty)
    }

    fn relative(&self, root: &[u8], handle: &Handle) -> Resolved {
        let fd = match open_handle(self.root.as_fd(), handle) {
            Ok(fd) => fd,
            Err(Errno::ESTALE | Errno::ENOENT) => return Resolved::Gone,
            Err(_) => return Resolved::Unknown,
        };
        let Ok(st) = nix::sys::stat::fstat(&fd) else {
            return Resolved::Unknown;
        };
        // Deleted, but still open somewhere: nothing in it is written back.
        if st.st_nlink == 0 {
            return Resolved::Gone;
        }
        let dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let Some(path) = fd_path(fd.as_fd()) else {
            return Resolved::Unknown;
        };
        let rel = if root == b"/" {
            path.strip_prefix(b"/")
        } else if path == root {
            Some(&b""[..])
        } else {
            path.strip_prefix(root).and_then(|r| r.strip_prefix(b"/"))
        };
        match rel {
            Some(rel) => Resolved::At(rel.into(), dir),
            // Not below the root this tmpfs is seen at: a directory of the same
            // filesystem detached from it cannot be written back.
            None => Resolved::Gone,
        }
    }
}

enum Resolved {
    /// Its path, and whether it is a directory.
    At(Box<[u8]>, bool),
    Gone,
    Unknown,
}

/// A tracker running on its own thread for the mount `name`, answering barriers
/// until dropped.
pub struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    advert: PathBuf,
}

impl Running {
    /// Tracks the tmpfs whose root directory is open at `root`.
    pub fn spawn(name: &str, root: File, state: &State) -> Result<Running> {
        let mut tracker = ChangeTracker::start(root)?;
        state.ensure_dirs()?;
        let answers = answer_path(state, name);
        let advert = advert_path(state, name);
        write_quick(&advert, format!("{}\n", std::process::id()).as_bytes())?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let name = name.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("track {name}"))
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    let mut fds = [PollFd::new(tracker.fd(), PollFlags::POLLIN)];
                    if poll(&mut fds, PollTimeout::from(200u16)).is_err() {
                        continue;
                    }
                    for (nonce, taken) in tracker.drain() {
                        let answer = tracker.answer(taken);
                        if let Err(e) = write_quick(&answers, &encode(nonce, &answer)) {
                            tracing::warn!("{name}: {e:#}");
                        }
                    }
                }
            })
            .context("starting the change tracker's thread")?;
        Ok(Running {
            stop,
            thread: Some(thread),
            advert,
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.advert);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer_path(state: &State, name: &str) -> PathBuf {
    state.dir().join("mounts").join(format!("{name}.dirty"))
}

fn advert_path(state: &State, name: &str) -> PathBuf {
    state.dir().join("mounts").join(format!("{name}.tracker"))
}

const MAGIC: &[u8] = b"tmpfsctl-dirty 1\n";

/// The answer file: magic, nonce, then either `U` and the reason, or `C` and the
/// paths, each a kind (`D` directory, `S` subtree, `N` directory changed by name
/// only, `P` changed entry), a length and the bytes, and `E`: an answer cut short is
/// no answer, never one with fewer directories. An older reader refuses the kinds it
/// does not know, and reads the whole tree.
fn encode(nonce: u64, answer: &Answer) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&nonce.to_le_bytes());
    match answer {
        Answer::Untracked(why) => {
            out.push(b'U');
            out.extend_from_slice(why.as_bytes());
        }
        Answer::Changed(d) => {
            out.push(b'C');
            for (kind, paths) in [
                (b'D', &d.dirs),
                (b'S', &d.subtrees),
                (b'N', &d.named),
                (b'P', &d.entries),
            ] {
                for p in paths {
                    out.push(kind);
                    out.extend_from_slice(&(p.len() as u32).to_le_bytes());
                    out.extend_from_slice(p);
                }
            }
            out.push(b'E');
        }
    }
    out
}

fn decode(bytes: &[u8]) -> Option<(u64, Answer)> {
    let rest = bytes.strip_prefix(MAGIC)?;
    let nonce = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
    let (&kind, mut rest) = rest.get(8..)?.split_first()?;
    match kind {
        b'U' => Some((
            nonce,
            Answer::Untracked(String::from_utf8_lossy(rest).into_owned()),
        )),
        b'C' => {
            let mut d = Dirty::default();
            loop {
                let (&kind, after) = rest.split_first()?;
                if kind == b'E' {
                    return after.is_empty().then_some((nonce, Answer::Changed(d)));
                }
                let len = u32::from_le_bytes(after.get(..4)?.try_into().ok()?) as usize;
                let path: Box<[u8]> = after.get(4..4 + len)?.into();
                match kind {
                    b'D' => d.dirs.push(path),
                    b'S' => d.subtrees.push(path),
                    b'N' => d.named.push(path),
                    b'P' => d.entries.push(path),
                    _ => return None,
                }
                rest = &after[4 + len..];
            }
        }
        _ => None,
    }
}

fn root_ctime(root: &Path) -> Option<Time> {
    nix::sys::stat::stat(root).ok().map(|st| Sig::of(&st).ctime)
}

/// The record's first line; then `LEFT_SECS LEFT_NANOS BEFORE_SECS BEFORE_NANOS`,
/// fixed width, so that `left` is filled in place once the barrier was made.
const BARRIERS_MAGIC: &str = "tmpfsctl-barriers 2\n";
/// `left` while the barrier is being made: no root's ctime.
const PENDING: Time = (0, 0);

fn time_field(t: Time) -> String {
    format!("{:020} {:09}", t.0, t.1)
}

/// What the barriers asked of the tracker of `name` did to its RAM root's ctime, as
/// recorded by the last [`ask`]; a record whose barrier was never filled in (the
/// process died in between) undoes nothing.
pub fn barriers(state: &State, name: &str) -> Option<Barriers> {
    let text = String::from_utf8(read_nofollow(&state.barriers_path(name)).ok()?).ok()?;
    let fields: Vec<i64> = text
        .strip_prefix(BARRIERS_MAGIC)?
        .strip_suffix('\n')?
        .split(' ')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let [ls, ln, bs, bn] = fields[..] else { return None };
    let b = Barriers {
        left: (ls, ln),
        before: (bs, bn),
    };
    let sane = |t: Time| (0..1_000_000_000).contains(&t.1);
    Some(b).filter(|b| b.left != PENDING && sane(b.left) && sane(b.before))
}

/// Records, before a barrier is made, what the root's ctime stood for: `before`,
/// with the barrier's `left` still pending. Without the record there is no barrier
/// (the pass reads the whole tree, and the root's ctime stays what the application
/// made it).
fn record_before(state: &State, name: &str, before: Time) -> Result<()> {
    let text = format!("{BARRIERS_MAGIC}{} {}\n", time_field(PENDING), time_field(before));
    write_quick(&state.barriers_path(name), text.as_bytes())
}

/// Fills in the root's ctime the barrier left, in place: no space is needed that
/// the record did not already have. If this fails, the record stays pending and the
/// next pass takes the root's ctime as it finds it (its deletions there look later,
/// as after any later change in the root).
fn record_left(state: &State, name: &str, left: Option<Time>) {
    use std::os::unix::fs::FileExt;
    let path = state.barriers_path(name);
    let written = left
        .context("the root's ctime after the barrier is unknown")
        .and_then(|left| {
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .and_then(|f| f.write_all_at(time_field(left).as_bytes(), BARRIERS_MAGIC.len() as u64))
                .with_context(|| format!("writing {}", path.display()))
        });
    if let Err(e) = written {
        tracing::warn!("{name}: {e:#}");
    }
}

/// Asks the tracker of `name`, whose tmpfs root is at `root`, for the changes since
/// `taken`; without a complete answer, why the pass reads the whole tree.
///
/// The barrier moves the root's ctime, which the write-back takes for the time of
/// the RAM's deletions there; what the root's ctime was before (less any earlier
/// barrier) is recorded for the next pass ([`barriers`]). A name the application
/// adds, removes or renames in the root between that `stat` and the barrier, or in
/// the barrier's clock tick, gets the earlier time.
pub fn ask(state: &State, name: &str, root: &Path, taken: Time) -> Result<Dirty, String> {
    let pid: Option<i32> = read_nofollow(&advert_path(state, name))
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.trim().parse().ok());
    let Some(pid) = pid.filter(|p| Path::new(&format!("/proc/{p}")).exists()) else {
        return Err("no change tracker runs for it (the agent runs one per persisted mount)".into());
    };
    let nonce = {
        use std::hash::{BuildHasher, Hasher};
        // Seeded from the kernel's random source (see copy::temp).
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    };
    let barrier = root.join(OsStr::from_bytes(
        format!("{TEMP_PREFIX}{BARRIER}{nonce}.{}.{}", taken.0, taken.1).as_bytes(),
    ));
    let before = root_ctime(root)
        .map(|c| Barriers::undo(barriers(state, name), c))
        .ok_or_else(|| format!("cannot ask the change tracker (stat {}: failed)", root.display()))?;
    record_before(state, name, before).map_err(|e| format!("cannot ask the change tracker ({e:#})"))?;
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&barrier);
    if let Err(e) = made {
        return Err(format!(
            "cannot ask the change tracker ({}: {e})",
            barrier.display()
        ));
    }
    let _ = std::fs::remove_file(&barrier);
    record_left(state, name, root_ctime(root));
    let answers = answer_path(state, name);
    let deadline = Instant::now() + ANSWER_WITHIN;
    while Instant::now() < deadline {
        if let Some((n, answer)) = read_nofollow(&answers).ok().and_then(|b| decode(&b)) {
            if n == nonce {
                return match answer {
                    Answer::Changed(d) => Ok(d),
                    Answer::Untracked(why) => Err(why),
                };
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err(format!(
        "the change tracker (pid {pid}) did not answer within {} s",
        ANSWER_WITHIN.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_barriers_record_undoes_only_once_its_barrier_is_filled_in() {
        let dir = tempfile::tempdir().unwrap();
        let state = State::new(dir.path());
        std::fs::create_dir(dir.path().join("mounts")).unwrap();
        record_before(&state, "c", (100, 5)).unwrap();
        assert_eq!(barriers(&state, "c"), None, "pending");
        record_left(&state, "c", Some((1_700_000_000, 999_999_999)));
        let b = barriers(&state, "c").expect("filled in");
        assert_eq!(
            b,
            Barriers {
                left: (1_700_000_000, 999_999_999),
                before: (100, 5)
            }
        );
        assert_eq!(Barriers::undo(Some(b), b.left), (100, 5));
        assert_eq!(Barriers::undo(Some(b), (1_700_000_001, 0)), (1_700_000_001, 0));
        let later = Barriers {
            left: (10, 0),
            before: (20, 0),
        };
        assert_eq!(Barriers::undo(Some(later), (10, 0)), (10, 0), "never later");
        let path = state.barriers_path("c");
        for bad in [
            "",
            "tmpfsctl-barriers 1\n1 2 3 4\n",
            "tmpfsctl-barriers 2\n1 2 3\n",
            "tmpfsctl-barriers 2\n1 2 3 4 5\n",
            "tmpfsctl-barriers 2\n1 2000000000 3 4\n",
            "tmpfsctl-barriers 2\n1 2 3 x\n",
        ] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(barriers(&state, "c"), None, "{bad:?}");
        }
    }

    #[test]
    fn barriers_are_recognised_by_name_only() {
        let name = format!("{TEMP_PREFIX}{BARRIER}42.1700000000.5");
        assert_eq!(parse_barrier(name.as_bytes()), Some((42, (1_700_000_000, 5))));
        for bad in [
            format!("{TEMP_PREFIX}{BARRIER}42.1700000000"),
            format!("{TEMP_PREFIX}{BARRIER}42.1.2.3"),
            format!("{TEMP_PREFIX}{BARRIER}x.1.2"),
            format!("{BARRIER}42.1.2"),
            "barrier".to_string(),
        ] {
            assert_eq!(parse_barrier(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn answers_round_trip_and_damage_is_refused() {
        let changed = Answer::Changed(Dirty {
            dirs: vec![Box::from(&b""[..]), Box::from(&b"a/odd\nname\xff"[..])],
            subtrees: vec![Box::from(&b"new"[..])],
            named: vec![Box::from(&b"a/odd\nname\xff"[..])],
            entries: vec![Box::from(&b"a/odd\nname\xff/f"[..])],
        });
        let bytes = encode(7, &changed);
        assert_eq!(decode(&bytes), Some((7, changed)));
        for cut in 0..bytes.len() {
            assert_eq!(decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let untracked = Answer::Untracked("overflowed".into());
        assert_eq!(decode(&encode(9, &untracked)), Some((9, untracked)));
        assert_eq!(decode(b"tmpfsctl-dirty 2\n"), None);
    }
}
