//! The deletion keeper: a small process that goes on watching a disk directory for
//! the application's deletions while a held tmpfs waits for its write-back, after the
//! tmpfsctl that switched it ended (a failed write-back) or died (kill -9).
//!
//! Why: once switched, the application works in its disk directory. A name its RAM
//! copy has may be created there again and deleted; only the deletion's event tells
//! the next write-back not to bring the RAM's version back (see
//! [`crate::host::deletions`]). A watch lives as long as its process, so the process
//! doing the write-back hands its watch over to a keeper before it ends:
//!
//! - the write-back starts its own watch and a new keeper (so a kill -9 during the
//!   merge leaves one running), then stops the keepers of earlier attempts (SIGTERM:
//!   each reads its queue empty, records, exits) and takes over the record; it stops
//!   its keeper when the write-back succeeded;
//! - when the write-back fails, it adds what its own watch saw to the record.
//!
//! The record is `STATE/run/NAME.gone`: appended records of (directory handle,
//! name), each with a checksum. Keepers are found by their command line, not by a
//! file of theirs. The keeper exits by itself once the held tmpfs or the record is
//! gone. A keeper killed along with tmpfsctl leaves the gap this closes.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;

use crate::copy::baseline::fnv1a;
use crate::error::ExitCode;
use crate::host::deletions::{Deletions, Gone, Handle};
use crate::state::State;

/// The name of the hidden subcommand a keeper runs as.
pub const SUBCOMMAND: &str = "keep-deletions";

fn record_path(state: &State, name: &str) -> PathBuf {
    state.run_dir().join(format!("{name}.gone"))
}

/// Set in a record's handle type when the deleted directory's own handle follows.
/// Handle types are below 256.
const WITH_OBJECT: i32 = 0x4000_0000;

fn encode(g: &Gone) -> Vec<u8> {
    let mut body = Vec::with_capacity(24 + g.dir.1.len() + g.name.len());
    let flag = if g.object.is_some() { WITH_OBJECT } else { 0 };
    for (i, handle) in std::iter::once(&g.dir).chain(&g.object).enumerate() {
        let kind = if i == 0 { handle.0 | flag } else { handle.0 };
        body.extend_from_slice(&kind.to_le_bytes());
        body.extend_from_slice(&(handle.1.len() as u32).to_le_bytes());
        body.extend_from_slice(&handle.1);
    }
    body.extend_from_slice(&g.name);
    let mut out = Vec::with_capacity(body.len() + 12);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&fnv1a(&body).to_le_bytes());
    out
}

/// A handle at the start of `body` (type, length, bytes), and what follows it.
fn handle_at(body: &[u8]) -> Option<(Handle, &[u8])> {
    let kind = i32::from_le_bytes(body.get(..4)?.try_into().ok()?);
    let len = u32::from_le_bytes(body.get(4..8)?.try_into().ok()?) as usize;
    let bytes = body.get(8..8 + len)?;
    Some(((kind, bytes.to_vec()), &body[8 + len..]))
}

/// One record's body.
fn gone_of(body: &[u8]) -> Option<Gone> {
    let ((kind, dir), rest) = handle_at(body)?;
    let (object, name) = if kind & WITH_OBJECT != 0 {
        let (object, name) = handle_at(rest)?;
        (Some(object), name)
    } else {
        (None, rest)
    };
    Some(Gone {
        dir: (kind & !WITH_OBJECT, dir),
        name: name.to_vec(),
        object,
    })
}

/// The records of `data`. A record with an empty name stands for an overflow of the
/// keeper's watch. Several keepers append to one record: a write cut short (a full
/// disk, a keeper killed) leaves a torn record, and the records after it are found
/// again byte by byte (a false match needs a 64-bit checksum to hold by chance). A
/// keeper whose write failed says so with an overflow record once it can; a torn
/// record at the end is one being written (the new keeper's, which the reader's own
/// watch covers).
fn decode(mut data: &[u8]) -> Vec<Gone> {
    let mut out = Vec::new();
    while !data.is_empty() {
        match record_at(data) {
            Some((gone, len)) => {
                out.push(gone);
                data = &data[len..];
            }
            None => data = &data[1..],
        }
    }
    out
}

/// The record at the start of `data`, and its length, if it is whole and intact.
fn record_at(data: &[u8]) -> Option<(Gone, usize)> {
    let len = u32::from_le_bytes(data.get(..4)?.try_into().ok()?) as usize;
    // Two handles (128 bytes at most each) and a name (255): never near this.
    if len > 4096 {
        return None;
    }
    let body = data.get(4..4 + len)?;
    let sum = data.get(4 + len..12 + len)?;
    if fnv1a(body).to_le_bytes() != sum {
        return None;
    }
    Some((gone_of(body)?, 12 + len))
}

fn open_record(path: &Path, create: bool) -> std::io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(create)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

fn append(file: &mut File, seen: &[Gone]) -> std::io::Result<()> {
    for g in seen {
        file.write_all(&encode(g))?;
    }
    Ok(())
}

/// The overflow marker: no name can have zero bytes.
fn overflow_marker() -> Gone {
    Gone {
        dir: (0, Vec::new()),
        name: Vec::new(),
        object: None,
    }
}

/// The keepers running for `name` with this state directory, found by their command
/// line: every process that has run the keeper's `exec`, ready or not. A file each
/// keeper wrote once its watch was in place missed one that had not got that far (its
/// starter killed meanwhile), and the next attempt read the record while that keeper
/// could still hold deletions it had seen. Stopped that early, a keeper either had no
/// watch yet (its SIGTERM ends it at once) or records what it saw and exits. One
/// still in its `exec` shows an empty command line (the kernel lets the starter go on
/// before the new program's arguments are in place) and is missed, but it has no
/// watch yet: whatever it will see, the caller's watch, already in place, sees too.
fn running(state: &State, name: &str) -> Vec<Pid> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let dir_id = std::fs::metadata(state.dir()).ok().map(|m| (m.dev(), m.ino()));
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != std::process::id() && keeps(pid, state, dir_id, name))
        .map(|pid| Pid::from_raw(pid as i32))
        .collect()
}

/// Whether process `pid` is a keeper of `name` with the state directory of `state`
/// (as [`start`] runs it), whose device and inode are `dir_id`.
fn keeps(pid: u32, state: &State, dir_id: Option<(u64, u64)>, name: &str) -> bool {
    // Anyone can give a process these arguments: a keeper runs as we do.
    if !std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == nix::unistd::geteuid().as_raw()) {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    // The same directory however spelled: `/run/tmpfsctl/`, or through a symlink
    // (`/var/run/tmpfsctl`).
    let same_dir = |arg: &[u8]| {
        let arg = Path::new(std::ffi::OsStr::from_bytes(arg));
        arg == state.dir()
            || dir_id.is_some_and(|id| std::fs::metadata(arg).is_ok_and(|a| (a.dev(), a.ino()) == id))
    };
    args.windows(2).any(|w| w[0] == b"--state-dir" && same_dir(w[1]))
        && args
            .windows(2)
            .any(|w| w[0] == SUBCOMMAND.as_bytes() && w[1] == name.as_bytes())
}

/// Whether `pid` ended (gone, or a zombie its new parent has not reaped yet).
fn ended(pid: Pid) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Starts a keeper for this attempt, then stops the keepers of earlier attempts, if
/// any, and adds what they recorded to `watch`, which must already be watching: the
/// watches overlap, so a deletion falls into one of them whenever this process dies.
/// Usually one runs; more when an attempt was killed between starting its keeper and
/// stopping the earlier one.
pub fn take_over(state: &State, name: &str, watch: &mut Deletions) {
    let earlier = running(state, name);
    if let Err(e) = start(state, name) {
        tracing::warn!(
            "{name}: {e:#}; should this write-back fail, deletions on disk until the next attempt are not seen"
        );
    }
    for &pid in &earlier {
        let _ = kill(pid, Signal::SIGTERM);
    }
    // Each records what it saw before it exits: the record is complete only then.
    let until = Instant::now() + Duration::from_secs(2);
    while earlier.iter().any(|&pid| !ended(pid)) {
        if Instant::now() >= until {
            tracing::warn!(
                "{name}: an earlier deletion keeper did not stop within 2 s; names it saw deleted last may come back"
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let seen = match crate::copy::baseline::read_nofollow(&record_path(state, name)) {
        Ok(data) => decode(&data),
        Err(_) => return,
    };
    let overflowed = seen.contains(&overflow_marker());
    watch.add((!overflowed).then_some(seen));
}

/// Starts a keeper for `name`; returns once its watch is in place.
fn start(state: &State, name: &str) -> Result<()> {
    state.ensure_run_dir()?;
    // The keeper only appends to a record that exists (see `run`).
    let record = record_path(state, name);
    open_record(&record, true).with_context(|| format!("creating {}", record.display()))?;
    let exe = std::env::current_exe().context("finding this executable to start a keeper")?;
    let mut child = Command::new(exe)
        .arg("--state-dir")
        .arg(state.dir())
        .arg(SUBCOMMAND)
        .arg(name)
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .env_remove("TMPFSCTL_FAILPOINT")
        // Not in our process group: a signal to it (a terminal's ^C) is ours alone.
        .process_group(0)
        .spawn()
        .context("starting a deletion keeper")?;
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout is piped");
    let read = BufReader::new(stdout).read_line(&mut line);
    // Reaped when it ends, should this process (the agent) outlive it.
    std::thread::spawn(move || child.wait());
    read.context("waiting for the deletion keeper")?;
    anyhow::ensure!(
        line.trim() == "ready",
        "the deletion keeper did not start: {}",
        line.trim()
    );
    Ok(())
}

/// Adds what `watch` saw to the record, for the next attempt.
pub fn hand_over(state: &State, name: &str, watch: &mut Deletions) -> Result<()> {
    state.ensure_run_dir()?;
    let path = record_path(state, name);
    let mut file = open_record(&path, true).with_context(|| format!("opening {}", path.display()))?;
    let mut seen = watch.seen();
    if watch.overflowed() {
        seen.push(overflow_marker());
    }
    append(&mut file, &seen).with_context(|| format!("writing {}", path.display()))
}

/// Records that the disk directory `new` was made in place of the removed `old`
/// while the write-back waited: every later attempt's watch takes the names deleted
/// with `old` for names deleted in `new` (see [`Deletions::stands_for`]). Written
/// before the side bind is moved, so that a kill in between loses nothing.
pub fn made_again(state: &State, name: &str, new: Handle, old: Handle) -> Result<()> {
    state.ensure_run_dir()?;
    let path = record_path(state, name);
    let mut file = open_record(&path, true).with_context(|| format!("opening {}", path.display()))?;
    append(&mut file, &[Gone::made_again(new, old)]).with_context(|| format!("writing {}", path.display()))
}

/// The directory the last [`made_again`] record of `name` named as the new one.
pub fn last_made_again(state: &State, name: &str) -> Option<Handle> {
    let data = crate::copy::baseline::read_nofollow(&record_path(state, name)).ok()?;
    decode(&data)
        .into_iter()
        .rev()
        .find_map(Gone::into_made_again)
        .map(|(new, _)| new)
}

/// The write-back succeeded: the keeper stops and its record goes.
pub fn finish(state: &State, name: &str) {
    let _ = std::fs::remove_file(record_path(state, name));
    for pid in running(state, name) {
        let _ = kill(pid, Signal::SIGTERM);
    }
}

/// The keeper itself (`tmpfsctl keep-deletions NAME PID`): watches until SIGTERM, or
/// until the held tmpfs or the record is gone; ignores the events of `parent`.
pub fn run(state: &State, name: &str, parent: i32) -> Result<ExitCode> {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGINT);
    mask.thread_block().context("blocking SIGTERM")?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
    let held = state.held(name);
    // A mount point: another device than the directory it is in.
    let held_mounted = || {
        let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
        dev(&held).is_some_and(|d| Some(d) != dev(&state.held_root()))
    };
    let started = Instant::now();
    let mut was_held = false;
    let mut watch =
        Deletions::watch(&state.side(name)).map_err(|e| anyhow::anyhow!("watching for deletions: {e}"))?;
    watch.ignore(parent);
    let record = record_path(state, name);
    // Its starter made the record. Gone by now, the write-back it was started for
    // succeeded (a keeper missed while still in its `exec`, its starter killed):
    // made again, the next write-back would take the names it records then for
    // deletions of its own.
    let mut file = match open_record(&record, false) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ExitCode::Ok),
        r => r.with_context(|| format!("opening {}", record.display()))?,
    };
    // A starter killed meanwhile reads nothing: the keeper stays all the same, the
    // only watch left, for the next attempt to take over.
    let _ = crate::out::stdout().write_all(b"ready\n");
    // Stdout goes back to nowhere: the starter stopped reading.
    let devnull = File::options().write(true).open("/dev/null")?;
    nix::unistd::dup2_stdout(&devnull)?;
    let _ = std::env::set_current_dir("/");
    let mut overflow_noted = false;
    let mut lost = false;
    loop {
        let mut fds = [
            PollFd::new(watch.fd(), PollFlags::POLLIN),
            PollFd::new(std::os::fd::AsFd::as_fd(&signals), PollFlags::POLLIN),
        ];
        let _ = poll(&mut fds, PollTimeout::from(1000u16));
        let stop = fds[1].revents().is_some_and(|r| r.contains(PollFlags::POLLIN));
        let mut new = watch.drain();
        if watch.overflowed() && !overflow_noted {
            new.push(overflow_marker());
            overflow_noted = true;
        }
        if append(&mut file, &new).is_err() {
            lost = true;
        }
        if lost && !overflow_noted {
            // What the record misses is an overflow, and it says so, as soon as it can.
            overflow_noted = append(&mut file, &[overflow_marker()]).is_ok();
        }
        // Started just before the switch: the held tmpfs appears, and when it goes
        // (written back, or taken down), so does the keeper.
        let held_now = held_mounted();
        was_held |= held_now;
        let gone = if was_held {
            !held_now
        } else {
            started.elapsed() > Duration::from_secs(10)
        };
        if stop || gone || !record.exists() {
            return Ok(ExitCode::Ok);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// A shell with a keeper's arguments, as `uid`, which never gets further; its
    /// arguments are in place (a moment after the spawn returns: see `running`).
    fn fake_keeper(dir: &Path, uid: Option<u32>) -> std::process::Child {
        let mut c = Command::new("sh");
        c.args(["-c", "read x", "sh", "--state-dir"])
            .arg(dir)
            .args([SUBCOMMAND, "web", "0"])
            .stdin(Stdio::piped());
        if let Some(uid) = uid {
            c.uid(uid);
        }
        let child = c.spawn().expect("starting sh");
        let start = Instant::now();
        while std::fs::read(format!("/proc/{}/cmdline", child.id())).is_ok_and(|c| c.is_empty()) {
            assert!(start.elapsed() < Duration::from_secs(10), "sh never ran");
            std::thread::yield_now();
        }
        child
    }

    /// A keeper is found from the moment it runs, before it has done anything of its
    /// own, with its state directory however spelled, and only one running as we do.
    #[test]
    fn a_keeper_is_found_by_its_command_line_alone() {
        let tmp = tempfile::tempdir().expect("a temporary directory");
        let dir = tmp.path().join("state");
        std::fs::create_dir(&dir).expect("creating the state directory");
        std::os::unix::fs::symlink(&dir, tmp.path().join("link")).expect("a symlink to it");
        let state = State::new(&dir);
        for spelled in [dir.join(""), tmp.path().join("link")] {
            let mut child = fake_keeper(&spelled, None);
            let mut other = nix::unistd::geteuid()
                .is_root()
                .then(|| fake_keeper(&spelled, Some(65534)));
            let pid = Pid::from_raw(child.id() as i32);
            assert_eq!(running(&state, "web"), vec![pid], "{}", spelled.display());
            assert_eq!(running(&state, "we"), vec![]);
            assert_eq!(running(&State::new(tmp.path()), "web"), vec![]);
            assert!(!ended(pid));
            for c in [Some(&mut child), other.as_mut()].into_iter().flatten() {
                drop(c.stdin.take());
                c.wait().expect("waiting for sh");
            }
            assert_eq!(running(&state, "web"), vec![]);
        }
    }

    #[test]
    fn records_round_trip_and_a_torn_one_is_passed_over() {
        let gone = |dir, name: &[u8], object| Gone {
            dir,
            name: name.to_vec(),
            object,
        };
        let a = gone((1, vec![1, 2, 3, 4]), b"w-1", None);
        let b = gone((2, vec![9; 12]), b"odd\nname\xff", None);
        // A directory, with its own handle.
        let c = gone((0x81, vec![5; 8]), b"d", Some((0x81, vec![6; 8])));
        let records = [encode(&a), encode(&b), encode(&c)];
        let data = records.concat();
        assert_eq!(decode(&data), vec![a.clone(), b.clone(), c.clone()]);
        let m = overflow_marker();
        let ends = [records[0].len(), records[0].len() + records[1].len(), data.len()];
        for cut in 1..data.len() {
            let whole = ends.iter().filter(|&&e| e <= cut).count();
            let want = [&a, &b, &c][..whole]
                .iter()
                .map(|g| (*g).clone())
                .collect::<Vec<_>>();
            assert_eq!(decode(&data[..cut]), want, "cut at {cut}");
        }
        // A torn record in the middle (two keepers append, one was killed): the ones
        // after it are found again.
        let mut torn = records[0].clone();
        torn.extend_from_slice(&records[1][..records[1].len() / 2]);
        torn.extend_from_slice(&records[2]);
        assert_eq!(decode(&torn), vec![a.clone(), c.clone()]);
        assert_eq!(decode(&encode(&m)), vec![m]);
        let distinct: HashSet<_> = decode(&data).into_iter().collect();
        assert_eq!(distinct.len(), 3);
    }
}
