//! `tmpfsctl residency`: how much of a file tree is in the page cache right
//! now, like `fincore` and `vmtouch` — the question to ask before offloading a
//! read-mostly cache to tmpfs (pages already resident gain little from it).
//!
//! Each regular file is opened read-only, mapped with `mmap(PROT_READ,
//! MAP_SHARED)` in windows of at most [`WINDOW`] bytes and asked `mincore(2)`
//! which of its pages are resident; the mapping is never read, so nothing is
//! faulted in, no readahead starts and atimes stay as they were. One file is
//! open at a time and directories are read and closed before their entries are
//! visited, so a tree of any size needs two file descriptors and memory for
//! one directory listing per level.
//!
//! Walking rules (documented in docs/when-tmpfs-helps.md):
//! - symbolic links met while walking are not followed (as vmtouch); a symlink
//!   named on the command line is followed (as `find -H`, `du -D`);
//! - mount points are crossed unless `--one-file-system` (vmtouch `-F`);
//! - a file with several hard links is counted once (as vmtouch);
//! - FIFOs, sockets and device nodes are skipped and counted, never opened
//!   (opening a FIFO blocks; opening a device can have side effects);
//! - unreadable entries are reported on stderr and counted; the walk goes on
//!   and the exit status is 1 at the end.
//!
//! Output is streamed, one line per file; only the totals are accumulated.
//! JSON is a single object whose `files` array is written as files are found:
//! `{"files":[ {...},\n {...} ],"total":{...}}`.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::error::ExitCode;
use crate::out::{self, escape};
use crate::spec::size::format_bytes;

/// Largest span mapped at once: bounds address space use on huge files.
pub const WINDOW: u64 = 1 << 30;

/// `tmpfsctl residency PATH...`
#[derive(Debug, Clone, clap::Args)]
pub struct ResidencyArgs {
    /// Files or directories (directories are walked recursively).
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Print only the total.
    #[arg(long, short = 's')]
    pub summarize: bool,
    /// List only files with at least one cached page (the total still covers every file).
    #[arg(long)]
    pub only_cached: bool,
    /// Do not descend into directories on other filesystems (vmtouch -F).
    #[arg(long, short = 'x')]
    pub one_file_system: bool,
}

/// Page-cache residency of one regular file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileResidency {
    pub path: PathBuf,
    /// Apparent size in bytes (st_size).
    pub size: u64,
    pub page_size: u64,
    /// ceil(size / page_size).
    pub pages: u64,
    /// Pages present in the page cache.
    pub cached_pages: u64,
    /// Index of the first resident page, if any.
    pub first_cached_page: Option<u64>,
}

impl FileResidency {
    /// Cached pages as a percentage of the file's pages; 0 for an empty file.
    pub fn percent(&self) -> f64 {
        pct(self.cached_pages, self.pages)
    }

    /// Memory the file's resident pages occupy.
    pub fn cached_bytes(&self) -> u64 {
        self.cached_pages * self.page_size
    }
}

impl Serialize for FileResidency {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("FileResidency", 7)?;
        st.serialize_field("path", &self.path.to_string_lossy())?;
        st.serialize_field("size", &self.size)?;
        st.serialize_field("pages", &self.pages)?;
        st.serialize_field("cached_pages", &self.cached_pages)?;
        st.serialize_field("cached_bytes", &self.cached_bytes())?;
        st.serialize_field("percent", &round2(self.percent()))?;
        st.serialize_field("first_cached_page", &self.first_cached_page)?;
        st.end()
    }
}

/// Totals over every file examined (also those `--only-cached` leaves out).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Totals {
    pub files: u64,
    pub directories: u64,
    pub size: u64,
    pub pages: u64,
    pub cached_pages: u64,
    pub cached_bytes: u64,
    pub percent: f64,
    /// FIFOs, sockets and device nodes (never opened), and symlinks met while walking.
    pub skipped: u64,
    /// Further hard links to a file already counted.
    pub hard_links: u64,
    /// Entries that could not be examined (reported on stderr).
    pub errors: u64,
    pub page_size: u64,
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// The system page size (what mincore reports in).
pub fn page_size() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE) {
        Ok(Some(p)) if p > 0 => p as u64,
        _ => 4096,
    }
}

/// Residency of the regular file at `path` (symlinks followed). Anything but a
/// regular file is refused with `InvalidInput`; FIFOs are opened non-blocking,
/// so a FIFO swapped in never hangs the caller.
pub fn file_residency(path: &Path) -> io::Result<FileResidency> {
    match open_regular(path, false)? {
        Some((file, md)) => residency_of(path, &file, md.len()),
        None => Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")),
    }
}

/// Opens `path` read-only without blocking (FIFOs) or acquiring a controlling
/// terminal; `None` when what was opened is not a regular file.
fn open_regular(path: &Path, nofollow: bool) -> io::Result<Option<(File, fs::Metadata)>> {
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY;
    if nofollow {
        flags |= libc::O_NOFOLLOW;
    }
    let file = fs::OpenOptions::new().read(true).custom_flags(flags).open(path)?;
    let md = file.metadata()?;
    if !md.file_type().is_file() {
        return Ok(None);
    }
    Ok(Some((file, md)))
}

/// mmap + mincore over `size` bytes of `file`, window by window.
fn residency_of(path: &Path, file: &File, size: u64) -> io::Result<FileResidency> {
    let page = page_size();
    let pages = size.div_ceil(page);
    let mut cached = 0u64;
    let mut first = None;
    let mut vec: Vec<u8> = Vec::new();
    let mut offset = 0u64;
    while offset < size {
        let len = (size - offset).min(WINDOW);
        let n = len.div_ceil(page) as usize;
        vec.clear();
        vec.resize(n, 0);
        mincore_window(file, offset, len as usize, &mut vec)?;
        for (i, b) in vec.iter().enumerate() {
            if b & 1 != 0 {
                cached += 1;
                if first.is_none() {
                    first = Some(offset / page + i as u64);
                }
            }
        }
        offset += len;
    }
    Ok(FileResidency {
        path: path.to_path_buf(),
        size,
        page_size: page,
        pages,
        cached_pages: cached,
        first_cached_page: first,
    })
}

/// Maps `len` bytes at `offset` (a multiple of the page size), asks mincore,
/// unmaps. The mapping is never dereferenced.
fn mincore_window(file: &File, offset: u64, len: usize, vec: &mut [u8]) -> io::Result<()> {
    // SAFETY: a fresh read-only shared mapping chosen by the kernel; it is
    // only passed to mincore and munmap, never read or written.
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset as libc::off_t,
        );
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let rc = libc::mincore(addr, len, vec.as_mut_ptr());
        let err = io::Error::last_os_error();
        libc::munmap(addr, len);
        if rc != 0 {
            return Err(err);
        }
    }
    Ok(())
}

const HEADER: &str = " RES PAGES       PAGES       RES      SIZE  PERCENT  FILE";

fn human_row(res_pages: u64, pages: u64, res: u64, size: u64, percent: f64, name: &str) -> String {
    format!(
        "{res_pages:>10}  {pages:>10}  {:>8}  {:>8}  {:>6.1}%  {name}",
        format_bytes(res),
        format_bytes(size),
        percent
    )
}

/// One file's line of the human table.
pub fn human_line(r: &FileResidency) -> String {
    human_row(
        r.cached_pages,
        r.pages,
        r.cached_bytes(),
        r.size,
        r.percent(),
        &escape(&r.path),
    )
}

/// The total line of the human table.
pub fn human_total(t: &Totals) -> String {
    let mut what = format!("total: {}", crate::plural::count(t.files, "file", "files"));
    if t.directories > 0 {
        what.push_str(&format!(
            ", {}",
            crate::plural::count(t.directories, "directory", "directories")
        ));
    }
    if t.hard_links > 0 {
        what.push_str(&format!(
            ", {} not counted",
            crate::plural::count(t.hard_links, "further hard link", "further hard links")
        ));
    }
    if t.skipped > 0 {
        what.push_str(&format!(", {} skipped", t.skipped));
    }
    if t.errors > 0 {
        what.push_str(&format!(
            ", {}",
            crate::plural::count(t.errors, "error", "errors")
        ));
    }
    human_row(t.cached_pages, t.pages, t.cached_bytes, t.size, t.percent, &what)
}

/// Where results go: the human table or the streamed JSON object.
struct Sink<W: Write> {
    out: W,
    json: bool,
    summarize: bool,
    only_cached: bool,
    listed: u64,
}

impl<W: Write> Sink<W> {
    fn begin(&mut self) -> io::Result<()> {
        if self.json {
            write!(self.out, "{{\"files\":[")
        } else {
            writeln!(self.out, "{HEADER}")
        }
    }

    fn file(&mut self, r: &FileResidency) -> io::Result<()> {
        if self.summarize || (self.only_cached && r.cached_pages == 0) {
            return Ok(());
        }
        if self.json {
            let sep = if self.listed == 0 { "\n" } else { ",\n" };
            let v = serde_json::to_string(r).map_err(io::Error::other)?;
            write!(self.out, "{sep}{v}")?;
        } else {
            writeln!(self.out, "{}", human_line(r))?;
        }
        self.listed += 1;
        Ok(())
    }

    fn end(&mut self, t: &Totals) -> io::Result<()> {
        if self.json {
            let v = serde_json::to_string(t).map_err(io::Error::other)?;
            writeln!(self.out, "\n],\"total\":{v}}}")?;
        } else {
            writeln!(self.out, "{}", human_total(t))?;
        }
        self.out.flush()
    }
}

/// One directory entry waiting to be visited.
struct Pending {
    path: PathBuf,
    file_type: Option<fs::FileType>,
}

struct Walker<W: Write> {
    sink: Sink<W>,
    totals: Totals,
    one_file_system: bool,
    /// (dev, ino) of files with more than one link already counted.
    links: HashSet<(u64, u64)>,
}

impl<W: Write> Walker<W> {
    fn error(&mut self, path: &Path, e: impl std::fmt::Display) {
        self.totals.errors += 1;
        out::eprint(&format!("error: {}: {}\n", escape(path), escape(&e.to_string())));
    }

    /// A path named on the command line: symlinks are followed.
    fn argument(&mut self, path: &Path) -> io::Result<()> {
        let md = match fs::metadata(path) {
            Ok(md) => md,
            Err(e) => {
                self.error(path, e);
                return Ok(());
            }
        };
        if md.is_dir() {
            self.totals.directories += 1;
            self.tree(path, md.dev())
        } else if md.is_file() {
            self.file(path, false)
        } else {
            self.totals.skipped += 1;
            Ok(())
        }
    }

    /// Reads a directory completely and closes it before anything in it is
    /// visited: one descriptor at a time, whatever the depth.
    fn list(&mut self, dir: &Path) -> Option<std::vec::IntoIter<Pending>> {
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) => {
                self.error(dir, e);
                return None;
            }
        };
        let mut entries: Vec<(OsString, Pending)> = Vec::new();
        for ent in rd {
            match ent {
                Ok(ent) => entries.push((
                    ent.file_name(),
                    Pending {
                        path: ent.path(),
                        file_type: ent.file_type().ok(),
                    },
                )),
                Err(e) => {
                    self.error(dir, e);
                    break;
                }
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let entries: Vec<Pending> = entries.into_iter().map(|(_, p)| p).collect();
        Some(entries.into_iter())
    }

    /// Walks a directory depth-first, in name order, without recursion.
    fn tree(&mut self, root: &Path, root_dev: u64) -> io::Result<()> {
        let mut stack: Vec<std::vec::IntoIter<Pending>> = Vec::new();
        if let Some(it) = self.list(root) {
            stack.push(it);
        }
        while let Some(top) = stack.last_mut() {
            let Some(ent) = top.next() else {
                stack.pop();
                continue;
            };
            let ft = match ent.file_type {
                Some(ft) => ft,
                None => match fs::symlink_metadata(&ent.path) {
                    Ok(md) => md.file_type(),
                    Err(e) => {
                        self.error(&ent.path, e);
                        continue;
                    }
                },
            };
            if ft.is_dir() {
                if self.one_file_system {
                    match fs::symlink_metadata(&ent.path) {
                        Ok(md) if md.dev() != root_dev => continue,
                        Ok(_) => {}
                        Err(e) => {
                            self.error(&ent.path, e);
                            continue;
                        }
                    }
                }
                self.totals.directories += 1;
                if let Some(it) = self.list(&ent.path) {
                    stack.push(it);
                }
            } else if ft.is_file() {
                self.file(&ent.path, true)?;
            } else if ft.is_symlink()
                || ft.is_fifo()
                || ft.is_socket()
                || ft.is_block_device()
                || ft.is_char_device()
            {
                self.totals.skipped += 1;
            }
        }
        Ok(())
    }

    /// One regular file. Errors writing the output are returned (a closed
    /// pipe ends the walk); errors examining the file are reported and counted.
    fn file(&mut self, path: &Path, nofollow: bool) -> io::Result<()> {
        let (file, md) = match open_regular(path, nofollow) {
            Ok(Some(x)) => x,
            // Replaced by something else since it was listed: a symlink
            // (O_NOFOLLOW refuses it) or a special file.
            Ok(None) => {
                self.totals.skipped += 1;
                return Ok(());
            }
            Err(e) if nofollow && e.raw_os_error() == Some(libc::ELOOP) => {
                self.totals.skipped += 1;
                return Ok(());
            }
            Err(e) => {
                self.error(path, e);
                return Ok(());
            }
        };
        if md.nlink() > 1 && !self.links.insert((md.dev(), md.ino())) {
            self.totals.hard_links += 1;
            return Ok(());
        }
        let r = residency_of(path, &file, md.len());
        drop(file);
        match r {
            Ok(r) => {
                let t = &mut self.totals;
                t.files += 1;
                t.size += r.size;
                t.pages += r.pages;
                t.cached_pages += r.cached_pages;
                self.sink.file(&r)
            }
            Err(e) => {
                self.error(path, e);
                Ok(())
            }
        }
    }
}

/// Runs `tmpfsctl residency`; returns the exit status (1 if any entry could
/// not be examined).
pub fn run(args: &ResidencyArgs, json: bool) -> Result<ExitCode> {
    let out = io::BufWriter::new(out::stdout());
    let mut w = Walker {
        sink: Sink {
            out,
            json,
            summarize: args.summarize,
            only_cached: args.only_cached,
            listed: 0,
        },
        totals: Totals {
            page_size: page_size(),
            ..Totals::default()
        },
        one_file_system: args.one_file_system,
        links: HashSet::new(),
    };
    let walked = (|| -> io::Result<()> {
        w.sink.begin()?;
        for p in &args.paths {
            w.argument(p)?;
        }
        let t = &mut w.totals;
        t.cached_bytes = t.cached_pages * t.page_size;
        t.percent = round2(pct(t.cached_pages, t.pages));
        let t = w.totals.clone();
        w.sink.end(&t)
    })();
    // Only writing the output fails the walk, and the output is all this
    // command makes, so it ends there. A reader that went away (`residency /
    // | head`) is no failure: what was examined until then sets the status.
    // Any other write error is reported by `cli::main` (out::stdout_failure).
    let _ = walked;
    Ok(if w.totals.errors > 0 {
        ExitCode::Failed
    } else {
        ExitCode::Ok
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(size: u64, cached: u64, first: Option<u64>) -> FileResidency {
        FileResidency {
            path: PathBuf::from("/c/x"),
            size,
            page_size: 4096,
            pages: size.div_ceil(4096),
            cached_pages: cached,
            first_cached_page: first,
        }
    }

    #[test]
    fn percent_of_empty_file_is_zero() {
        assert_eq!(res(0, 0, None).percent(), 0.0);
        assert_eq!(res(8192, 1, Some(1)).percent(), 50.0);
        assert_eq!(res(4097, 2, Some(0)).pages, 2);
    }

    #[test]
    fn json_has_every_field() {
        let v = serde_json::to_value(res(10_000, 2, Some(1))).unwrap();
        assert_eq!(v["path"], "/c/x");
        assert_eq!(v["size"], 10_000);
        assert_eq!(v["pages"], 3);
        assert_eq!(v["cached_pages"], 2);
        assert_eq!(v["cached_bytes"], 8192);
        assert_eq!(v["percent"], 66.67);
        assert_eq!(v["first_cached_page"], 1);
        let v = serde_json::to_value(res(0, 0, None)).unwrap();
        assert!(v["first_cached_page"].is_null());
    }

    #[test]
    fn human_rows_line_up_with_the_header() {
        let line = human_line(&res(1 << 20, 256, Some(0)));
        assert_eq!(line, "       256         256      1MiB      1MiB   100.0%  /c/x");
        assert_eq!(line.find("/c/x"), HEADER.find("FILE"));
        let t = Totals {
            files: 3,
            errors: 1,
            ..Totals::default()
        };
        assert!(human_total(&t).ends_with("total: 3 files, 1 error"));
    }

    #[test]
    fn streamed_json_is_one_valid_object() {
        let mut sink = Sink {
            out: Vec::new(),
            json: true,
            summarize: false,
            only_cached: true,
            listed: 0,
        };
        sink.begin().unwrap();
        sink.file(&res(4096, 1, Some(0))).unwrap();
        sink.file(&res(4096, 0, None)).unwrap();
        sink.file(&res(8192, 2, Some(0))).unwrap();
        sink.end(&Totals::default()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&sink.out).unwrap();
        assert_eq!(v["files"].as_array().unwrap().len(), 2);
        assert_eq!(v["total"]["files"], 0);
    }

    #[test]
    fn empty_and_small_files_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        fs::write(&empty, b"").unwrap();
        let r = file_residency(&empty).unwrap();
        assert_eq!((r.pages, r.cached_pages, r.first_cached_page), (0, 0, None));
        let small = dir.path().join("small");
        fs::write(&small, b"just written, so in the page cache").unwrap();
        let r = file_residency(&small).unwrap();
        assert_eq!((r.pages, r.cached_pages, r.first_cached_page), (1, 1, Some(0)));
        let e = file_residency(dir.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
