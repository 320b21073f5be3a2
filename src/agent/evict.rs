//! Eviction: deletes least-recently-used cache entries of a volatile cache.
//!
//! An entry is a group of files that go together (`watchdog.evict_group`): by
//! default files of one directory named alike up to their first `.`, so Apache
//! `mod_cache_disk`'s `X.header`, `X.data` and `X.header.vary` leave together
//! (a header without its data gives `AH00708` errors), while nginx's and Squid's
//! dotless hash names stay one file per entry. An entry was used when any of its
//! files was; one with a file open for writing stays whole; its smaller files go
//! first (the header before the data).
//!
//! The tree is walked from the agent's held descriptor of the tmpfs root;
//! every directory is opened relative to it with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`, so an application that swaps a
//! directory for a symlink mid-walk cannot make the agent (root) delete
//! anything outside the cache, and mounts below the root are not entered.
//! Directories, symlinks and special files are never deleted.
//!
//! Files open for writing are skipped: deleting one frees nothing until the
//! writer closes it, and an application that writes a temporary file and then
//! renames it into place (nginx's proxy_temp with `use_temp_path=off`) would
//! fail the rename. They are found by scanning `/proc/PID/fd` (through the
//! host's proc root) for descriptors on this filesystem whose
//! `/proc/PID/fdinfo` flags have O_WRONLY or O_RDWR (a descriptor whose flags
//! cannot be read counts as writing). Writable shared memory
//! mappings are not detected; deleting such a file is harmless (the mapping
//! keeps its pages until unmapped), it only frees nothing at once.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use anyhow::{Context, Result};
use nix::dir::{Dir, Type};
use nix::fcntl::{openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::agent::decide::{pick_evictions, Candidate, EvictTarget};
use crate::host::usage::Usage;
use crate::host::Host;
use crate::spec::EvictGroup;

/// What an eviction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evicted {
    pub files: u64,
    pub bytes: u64,
    /// Regular files skipped because a process has them open for writing.
    pub skipped_open: u64,
    /// Files that vanished or changed between the scan and the delete.
    pub raced: u64,
}

struct File {
    dir: usize,
    name: OsString,
    ino: u64,
}

/// Directories found by the walk: (parent index, name); index 0 is the root.
struct Tree {
    dirs: Vec<(usize, OsString)>,
    files: Vec<File>,
    candidates: Vec<Candidate>,
}

impl Tree {
    fn rel(&self, mut dir: usize) -> PathBuf {
        let mut parts = Vec::new();
        while dir != 0 {
            let (parent, name) = &self.dirs[dir];
            parts.push(name.clone());
            dir = *parent;
        }
        let mut p = PathBuf::from(".");
        for part in parts.iter().rev() {
            p.push(part);
        }
        p
    }
}

fn beneath(root: BorrowedFd<'_>, rel: &std::path::Path) -> nix::Result<OwnedFd> {
    openat2(
        root,
        rel,
        OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            ),
    )
}

fn ns(sec: i64, nsec: i64) -> i128 {
    sec as i128 * 1_000_000_000 + nsec as i128
}

/// The cache entry a file belongs to, under `group`: (directory, key).
fn entry_key(group: EvictGroup, dir: usize, name: &OsStr, file: usize) -> (usize, Vec<u8>) {
    let bytes = name.as_bytes();
    match group {
        EvictGroup::File => (dir, file.to_le_bytes().to_vec()),
        EvictGroup::Directory => (dir, Vec::new()),
        EvictGroup::Stem => match bytes.iter().position(|&b| b == b'.') {
            // A dotfile, or no dot at all: alone (nginx's and Squid's names).
            Some(0) | None => (dir, [b"/", bytes].concat()),
            Some(dot) => (dir, bytes[..dot].to_vec()),
        },
    }
}

fn scan(
    root: BorrowedFd<'_>,
    open_for_write: &HashSet<u64>,
    group: EvictGroup,
    skipped_open: &mut u64,
) -> Result<Tree> {
    let root_dev = fstat(root).context("fstat of the tmpfs root")?.st_dev;
    let mut t = Tree {
        dirs: vec![(0, OsString::from("."))],
        files: Vec::new(),
        candidates: Vec::new(),
    };
    let mut entries_by_key: HashMap<(usize, Vec<u8>), usize> = HashMap::new();
    let mut stack = vec![0usize];
    while let Some(d) = stack.pop() {
        let fd = match beneath(root, &t.rel(d)) {
            Ok(fd) => fd,
            // Removed or replaced by the application meanwhile: skip it.
            Err(_) if d != 0 => continue,
            Err(e) => return Err(e).context("opening the tmpfs root"),
        };
        let mut dir = Dir::from_fd(fd).context("reading a directory")?;
        let mut entries: Vec<(OsString, Option<Type>)> = Vec::new();
        for e in dir.iter() {
            let Ok(e) = e else { continue };
            let name = OsStr::from_bytes(e.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            entries.push((name.to_os_string(), e.file_type()));
        }
        for (name, ty) in entries {
            if matches!(ty, Some(t) if t != Type::Directory && t != Type::File) {
                continue;
            }
            let Ok(st) = fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            if st.st_dev != root_dev {
                continue;
            }
            let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            if kind == SFlag::S_IFDIR {
                t.dirs.push((d, name));
                stack.push(t.dirs.len() - 1);
            } else if kind == SFlag::S_IFREG {
                let busy = open_for_write.contains(&st.st_ino);
                *skipped_open += u64::from(busy);
                let key = entry_key(group, d, &name, t.files.len());
                let next = entries_by_key.len();
                let entry = *entries_by_key.entry(key).or_insert(next);
                t.candidates.push(candidate(&st, entry, busy));
                t.files.push(File {
                    dir: d,
                    name,
                    ino: st.st_ino,
                });
            }
        }
    }
    Ok(t)
}

fn candidate(st: &FileStat, entry: usize, busy: bool) -> Candidate {
    let last = ns(st.st_atime, st.st_atime_nsec).max(ns(st.st_mtime, st.st_mtime_nsec));
    let last_name = st.st_nlink <= 1;
    Candidate {
        last_use: last,
        bytes: if last_name { st.st_blocks as u64 * 512 } else { 0 },
        frees_inode: last_name,
        entry,
        busy,
    }
}

/// Inodes of regular files on device `dev` that some process has open for
/// writing, found through `/proc/PID/fd` and `/proc/PID/fdinfo`.
pub fn open_for_write(host: &Host, dev: u64) -> HashSet<u64> {
    let mut out = HashSet::new();
    let Ok(procs) = std::fs::read_dir(host.proc_root()) else {
        return out;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        if !name.as_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let base = p.path();
        let Ok(fds) = std::fs::read_dir(base.join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            // Sockets, pipes and anonymous inodes are not paths: skip them
            // without a stat.
            match std::fs::read_link(fd.path()) {
                Ok(target) if target.as_os_str().as_bytes().first() == Some(&b'/') => {}
                _ => continue,
            }
            let Ok(md) = std::fs::metadata(fd.path()) else {
                continue;
            };
            use std::os::unix::fs::MetadataExt;
            if md.dev() != dev || !md.is_file() {
                continue;
            }
            // Unreadable flags (no CAP_SYS_PTRACE for another user's process):
            // assume writing, and keep the file.
            let info = base.join("fdinfo").join(fd.file_name());
            if std::fs::read_to_string(info)
                .ok()
                .and_then(|t| fdinfo_flags(&t))
                .is_none_or(|f| f & libc::O_ACCMODE != libc::O_RDONLY)
            {
                out.insert(md.ino());
            }
        }
    }
    out
}

/// The `flags:` field of /proc/PID/fdinfo/N (octal).
pub fn fdinfo_flags(text: &str) -> Option<i32> {
    crate::host::procs::fdinfo_field(text, "flags").and_then(|v| i32::from_str_radix(v, 8).ok())
}

/// Entries deleted between two measurements of usage.
const EVICT_CHUNK: usize = 32;

/// How long a scan of the tree serves the next evictions. Under churn the walk is
/// the slow part (a cache with thousands of directories takes tens of
/// milliseconds) while the room above `high` fills in as many; the entries the
/// next eviction takes are the oldest, which a scan a moment ago already saw.
/// Files created since are the newest, so nothing is missed that would go first.
const SCAN_REUSE: std::time::Duration = std::time::Duration::from_secs(2);

/// A scan kept between evictions of one mount (see [`SCAN_REUSE`]).
pub struct Scanned {
    tree: Tree,
    group: EvictGroup,
    /// Files deleted (or found gone) since.
    gone: Vec<bool>,
    at: std::time::Instant,
}

/// Deletes least-recently-used cache entries (files grouped by `group`) below
/// `root` until usage is at or below `target`; `usage` re-measures the filesystem,
/// `ram` the RAM of a zram device (`None` for a tmpfs). `cache` keeps the scan for
/// the next evictions of the same mount.
pub fn evict(
    root: BorrowedFd<'_>,
    host: &Host,
    target: EvictTarget,
    group: EvictGroup,
    usage: &dyn Fn() -> Result<Usage>,
    ram: &dyn Fn() -> Option<u64>,
    cache: &mut Option<Scanned>,
) -> Result<Evicted> {
    let dev = fstat(root).context("fstat of the tmpfs root")?.st_dev;
    let writing = open_for_write(host, dev);
    let measure = Measure { usage, ram };
    let (first, reused) = evict_once(root, &writing, target, group, &measure, cache, true)?;
    if first.files > 0 || !reused {
        return Ok(first);
    }
    // The kept scan had nothing left that could go: look again.
    Ok(evict_once(root, &writing, target, group, &measure, cache, false)?.0)
}

/// How eviction re-measures what is left to free.
struct Measure<'a> {
    usage: &'a dyn Fn() -> Result<Usage>,
    ram: &'a dyn Fn() -> Option<u64>,
}

impl Measure<'_> {
    fn need(&self, target: &EvictTarget) -> Result<(u64, u64)> {
        Ok(target.need(&(self.usage)()?, (self.ram)()))
    }
}

/// `need` bytes of the filesystem's usage as bytes of its files (`st_blocks`,
/// what the candidates count): the same on a tmpfs or ext4, but btrfs counts
/// what it stores compressed, and its files' blocks uncompressed.
fn in_file_bytes(need: u64, used: u64, files: u64) -> u64 {
    if used == 0 || files <= used {
        return need;
    }
    (need as f64 * files as f64 / used as f64).ceil() as u64
}

/// One eviction from the kept scan (when `may_reuse` and it is recent) or a new
/// one; also says whether the scan was reused.
fn evict_once(
    root: BorrowedFd<'_>,
    writing: &HashSet<u64>,
    target: EvictTarget,
    group: EvictGroup,
    measure: &Measure<'_>,
    cache: &mut Option<Scanned>,
    may_reuse: bool,
) -> Result<(Evicted, bool)> {
    let mut out = Evicted::default();
    let reused = may_reuse
        && cache
            .as_ref()
            .is_some_and(|c| c.group == group && c.at.elapsed() < SCAN_REUSE);
    if !reused {
        let tree = scan(root, writing, group, &mut out.skipped_open)?;
        *cache = Some(Scanned {
            gone: vec![false; tree.files.len()],
            tree,
            group,
            at: std::time::Instant::now(),
        });
    }
    let c = cache.as_mut().expect("set just above or reused");
    // What may go now: not deleted since the scan, and not open for writing now.
    let live: Vec<usize> = (0..c.tree.files.len()).filter(|&i| !c.gone[i]).collect();
    let candidates: Vec<Candidate> = live
        .iter()
        .map(|&i| {
            let mut cd = c.tree.candidates[i];
            cd.busy |= writing.contains(&c.tree.files[i].ino);
            cd
        })
        .collect();
    if reused {
        out.skipped_open = candidates.iter().filter(|cd| cd.busy).count() as u64;
    }
    let tree = &c.tree;
    let used = (measure.usage)()?;
    let (need_bytes, need_inodes) = target.need(&used, (measure.ram)());
    let need_bytes = in_file_bytes(
        need_bytes,
        used.used,
        tree.candidates.iter().map(|c| c.bytes).sum(),
    );
    let order: Vec<usize> = pick_evictions(&candidates, need_bytes, need_inodes)
        .into_iter()
        .map(|k| live[k])
        .collect();
    // Entries in order, each its files smaller first.
    let mut entries: Vec<&[usize]> = Vec::new();
    let mut start = 0;
    for n in 1..=order.len() {
        if n == order.len() || tree.candidates[order[n]].entry != tree.candidates[order[n - 1]].entry {
            entries.push(&order[start..n]);
            start = n;
        }
    }
    let mut current_dir: Option<(usize, OwnedFd)> = None;
    let mut gone = Vec::with_capacity(order.len());
    let mut remove = |i: usize, out: &mut Evicted| {
        let f = &tree.files[i];
        if current_dir.as_ref().is_none_or(|(d, _)| *d != f.dir) {
            current_dir = beneath(root, &tree.rel(f.dir)).ok().map(|fd| (f.dir, fd));
        }
        gone.push(i);
        let Some((_, dfd)) = &current_dir else {
            out.raced += 1;
            return;
        };
        // The name must still be the regular file that was scanned.
        match fstatat(dfd.as_fd(), f.name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st)
                if st.st_ino == f.ino
                    && SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG =>
            {
                match unlinkat(dfd.as_fd(), f.name.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                    Ok(()) => {
                        out.files += 1;
                        out.bytes += tree.candidates[i].bytes;
                    }
                    Err(_) => out.raced += 1,
                }
            }
            _ => out.raced += 1,
        }
    };
    for (n, chunk) in entries.chunks(EVICT_CHUNK).enumerate() {
        // The estimate can be off (sparse files, concurrent writes): measure between
        // chunks and stop as soon as the target is reached.
        if n > 0 && measure.need(&target)? == (0, 0) {
            break;
        }
        // The smaller files of a whole chunk first (a header, an index), its largest
        // ones after: a reader that opened a header just before it went finds the
        // data still there, unless it waits for a whole chunk to be deleted.
        for files in chunk {
            for &i in &files[..files.len() - 1] {
                remove(i, &mut out);
            }
        }
        for files in chunk {
            remove(files[files.len() - 1], &mut out);
        }
    }
    for i in gone {
        c.gone[i] = true;
    }
    Ok((out, reused))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_compressing_filesystems_need_is_scaled_to_its_files_bytes() {
        assert_eq!(
            in_file_bytes(100, 1000, 800),
            100,
            "tmpfs: files take less than used"
        );
        assert_eq!(in_file_bytes(100, 1000, 3000), 300, "btrfs at 3x");
        assert_eq!(in_file_bytes(100, 0, 3000), 100);
        assert_eq!(in_file_bytes(0, 1000, 3000), 0);
    }

    #[test]
    fn entries_are_grouped_by_stem_directory_or_file() {
        let k = |g, dir, name: &str, file| entry_key(g, dir, OsStr::new(name), file);
        let s = EvictGroup::Stem;
        assert_eq!(k(s, 1, "abc.header", 0), k(s, 1, "abc.data", 1));
        assert_eq!(k(s, 1, "abc.header", 0), k(s, 1, "abc.header.vary", 2));
        assert_ne!(
            k(s, 1, "abc.header", 0),
            k(s, 2, "abc.data", 1),
            "another directory"
        );
        assert_ne!(k(s, 1, "abc.header", 0), k(s, 1, "abd.header", 1));
        // nginx and Squid names have no dot: one file, one entry.
        assert_ne!(k(s, 1, "d41d8cd98f00b204", 0), k(s, 1, "d41d8cd98f00b205", 1));
        assert_ne!(k(s, 1, "abc", 0), k(s, 1, "abc.data", 1));
        assert_ne!(
            k(s, 1, ".hidden", 0),
            k(s, 1, ".other", 1),
            "dotfiles stand alone"
        );
        let d = EvictGroup::Directory;
        assert_eq!(k(d, 3, "x", 0), k(d, 3, "y.z", 1));
        assert_ne!(k(d, 3, "x", 0), k(d, 4, "x", 1));
        let f = EvictGroup::File;
        assert_ne!(k(f, 1, "abc.header", 0), k(f, 1, "abc.data", 1));
    }

    #[test]
    fn fdinfo_flags_are_octal() {
        let t = "pos:\t0\nflags:\t0100002\nmnt_id:\t30\n";
        assert_eq!(fdinfo_flags(t), Some(0o100002));
        assert_eq!(fdinfo_flags(t).unwrap() & libc::O_ACCMODE, libc::O_RDWR);
        assert_eq!(fdinfo_flags("pos: 0\n"), None);
    }

    #[test]
    fn evicts_oldest_files_and_skips_open_writers_and_non_files() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        let set_time = |p: &std::path::Path, secs: i64| {
            let t = nix::sys::time::TimeSpec::new(secs, 0);
            nix::sys::stat::utimensat(
                nix::fcntl::AT_FDCWD,
                p,
                &t,
                &t,
                nix::sys::stat::UtimensatFlags::NoFollowSymlink,
            )
            .unwrap();
        };
        for (name, age) in [("old", 100), ("a/mid", 200), ("a/b/new", 300), ("a/writing", 50)] {
            std::fs::write(root.join(name), vec![1u8; 8192]).unwrap();
            set_time(&root.join(name), age);
        }
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let _writer = std::fs::OpenOptions::new()
            .append(true)
            .open(root.join("a/writing"))
            .unwrap();
        let fd = std::fs::File::open(root).unwrap();
        let host = Host::default();
        // Pretend two files' worth has to go.
        let count = std::cell::Cell::new(4u64);
        let usage = || -> Result<Usage> {
            Ok(Usage {
                size: 1 << 30,
                used: count.get() * 8192,
                inodes: 100,
                inodes_used: 1,
            })
        };
        let target = EvictTarget {
            bytes: 2 * 8192,
            inodes: 100,
            memory: None,
        };
        let r = evict(
            fd.as_fd(),
            &host,
            target,
            EvictGroup::Stem,
            &usage,
            &|| None,
            &mut None,
        )
        .unwrap();
        count.set(2);
        assert_eq!(r.skipped_open, 1, "{r:?}");
        assert_eq!(r.files, 2, "{r:?}");
        assert!(!root.join("old").exists() && !root.join("a/mid").exists());
        assert!(root.join("a/b/new").exists(), "the most recent file stays");
        assert!(root.join("a/writing").exists(), "open for writing: kept");
        assert!(
            root.join("link").symlink_metadata().is_ok(),
            "symlinks are never deleted"
        );
        assert!(root.join("a/b").is_dir(), "directories stay");
    }
}
