//! What a write-back of `seed: overlay` after `down`'s switch put on disk itself:
//! each file it placed, as its inode and the ctime the placing gave it, and each
//! directory it made, as its inode and birth time.
//!
//! After the switch, a disk entry changed since is the application's later change,
//! and it stays. A retry (the first attempt ran out of space, failed or was killed)
//! would take the first attempt's own copies for such changes: a write into the held
//! upper layer through a file kept open in between was then never written back (a
//! hunting helper's probe, 5 of 5). With this record the retry tells its own copies
//! from the application's: a copy whose inode still has the recorded ctime is
//! compared with the upper layer again like any entry the disk did not change.
//!
//! Like the write-back journal (`copy::journal`) it only has to outlive a crash of
//! tmpfsctl, not a power cut, so records are plain appends to a file in the records
//! area, each with its checksum, and reading stops at the first one that does not
//! check out. The header names the switch the record belongs to: one of an earlier
//! switch is started again.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::sys::stat::FileStat;

use super::baseline::{fnv1a, put_time, Time};

const MAGIC: &[u8] = b"tmpfsctl-placed\n";
const BODY: usize = 1 + 8 + 8 + 16 + 16 + 8 + 8 + 4;
const RECORD: usize = BODY + 8;
const FILE: u8 = b'f';
const DIR: u8 = b'd';

/// What is recorded of an entry placed, and compared with what is there now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Noted {
    /// A file (or symlink, or special file) as it was right after its placing: its
    /// ctime, and what a change that keeps a coarse ctime (whole seconds, on ext3 or
    /// ext4 with small inodes) still moves: mtime, size, mode and owner.
    File {
        ctime: Time,
        mtime: Time,
        size: u64,
        owner: (u32, u32),
        mode: u32,
    },
    /// A directory as it was made: its birth time, and where (its parent's inode and
    /// a hash of its name): moved by the application, it is the application's.
    Dir { born: Time, parent: u64, name: u64 },
}

impl Noted {
    fn file(md: &fs::Metadata) -> Noted {
        Noted::File {
            ctime: (md.ctime(), md.ctime_nsec()),
            mtime: (md.mtime(), md.mtime_nsec()),
            size: md.size(),
            owner: (md.uid(), md.gid()),
            mode: md.mode(),
        }
    }

    fn file_stat(st: &FileStat) -> Noted {
        Noted::File {
            ctime: (st.st_ctime, st.st_ctime_nsec),
            mtime: (st.st_mtime, st.st_mtime_nsec),
            size: u64::try_from(st.st_size).unwrap_or(0),
            owner: (st.st_uid, st.st_gid),
            mode: st.st_mode,
        }
    }

    fn dir(md: &fs::Metadata, parent: u64, name: &OsStr) -> Option<Noted> {
        Some(Noted::Dir {
            born: born(md)?,
            parent,
            name: fnv1a(name.as_bytes()),
        })
    }
}

/// The disk entries one switch's write-backs placed (see the module's doc), by
/// device and inode. [`Placings::none`] records nothing and knows nothing: a pass
/// before the switch, whose disk directory nobody else writes.
#[derive(Debug, Default)]
pub struct Placings {
    file: Option<File>,
    known: Known,
}

type Known = HashMap<(u64, u64), Noted>;

fn header(switched: Time) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    put_time(&mut out, switched);
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

fn record(dev: u64, ino: u64, noted: Noted) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD);
    let (kind, t1, t2, a, b, c) = match noted {
        Noted::File {
            ctime,
            mtime,
            size,
            owner,
            mode,
        } => (
            FILE,
            ctime,
            mtime,
            size,
            u64::from(owner.0) << 32 | u64::from(owner.1),
            mode,
        ),
        Noted::Dir { born, parent, name } => (DIR, born, (0, 0), parent, name, 0),
    };
    out.push(kind);
    out.extend_from_slice(&dev.to_le_bytes());
    out.extend_from_slice(&ino.to_le_bytes());
    put_time(&mut out, t1);
    put_time(&mut out, t2);
    out.extend_from_slice(&a.to_le_bytes());
    out.extend_from_slice(&b.to_le_bytes());
    out.extend_from_slice(&c.to_le_bytes());
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// One record's body (checked), as its key and what it notes.
fn parse(body: &[u8]) -> Option<((u64, u64), Noted)> {
    let word = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
    let time = |i: usize| (word(i) as i64, word(i + 8) as i64);
    let c = u32::from_le_bytes(body[BODY - 4..].try_into().expect("4 bytes"));
    let noted = match body[0] {
        FILE => Noted::File {
            ctime: time(17),
            mtime: time(33),
            size: word(49),
            owner: ((word(57) >> 32) as u32, word(57) as u32),
            mode: c,
        },
        DIR => Noted::Dir {
            born: time(17),
            parent: word(49),
            name: word(57),
        },
        _ => return None,
    };
    Some(((word(1), word(9)), noted))
}

/// What the records after `head` in `data` note, up to the first damaged or partial
/// one, and where that one starts; `None` if `data` is not a record of that switch.
fn read(data: &[u8], head: &[u8]) -> Option<(Known, usize)> {
    let mut rest = data.strip_prefix(head)?;
    let mut known = HashMap::new();
    while let Some(r) = rest.get(..RECORD) {
        let (body, sum) = r.split_at(BODY);
        let Some((key, noted)) = parse(body).filter(|_| fnv1a(body).to_le_bytes() == sum) else {
            break;
        };
        known.insert(key, noted);
        rest = &rest[RECORD..];
    }
    Some((known, data.len() - rest.len()))
}

fn born(md: &fs::Metadata) -> Option<Time> {
    let d = md.created().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some((d.as_secs() as i64, i64::from(d.subsec_nanos())))
}

/// The inode of the directory open at `dir`.
fn ino_of(dir: BorrowedFd<'_>) -> Option<u64> {
    nix::sys::stat::fstat(dir).ok().map(|st| st.st_ino)
}

impl Placings {
    /// Records nothing, knows nothing.
    pub fn none() -> Placings {
        Placings::default()
    }

    /// Opens the record at `path` of the write-backs after the switch at `switched`:
    /// one of that switch is read and appended to (cut at its first damaged record,
    /// which a killed pass may leave), anything else started again.
    pub fn open(path: &Path, switched: Time) -> io::Result<Placings> {
        let head = header(switched);
        let found = match super::baseline::read_nofollow(path) {
            Ok(data) => read(&data, &head),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let mut file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let known = match found {
            Some((known, end)) => {
                file.set_len(end as u64)?;
                known
            }
            None => {
                file.set_len(0)?;
                file.write_all(&head)?;
                HashMap::new()
            }
        };
        Ok(Placings {
            file: Some(file),
            known,
        })
    }

    fn add(&mut self, md: &fs::Metadata, noted: Noted) -> io::Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        file.write_all(&record(md.dev(), md.ino(), noted))?;
        self.known.insert((md.dev(), md.ino()), noted);
        Ok(())
    }

    /// Records the file (or symlink, or special file) `md` as it is right after this
    /// pass placed it.
    pub fn note(&mut self, md: &fs::Metadata) -> io::Result<()> {
        self.add(md, Noted::file(md))
    }

    /// Records the directory `md` as made by this pass as `name` in the directory
    /// open at `parent`. One without a birth time is not recorded: nothing would
    /// tell it from one made again with its inode number.
    pub fn note_dir(&mut self, md: &fs::Metadata, parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
        match ino_of(parent).and_then(|p| Noted::dir(md, p, name)) {
            Some(noted) => self.add(md, noted),
            None => Ok(()),
        }
    }

    /// Whether the disk file (not a directory) `md` is one this switch's write-backs
    /// placed, unchanged since.
    pub fn placed(&self, md: &fs::Metadata) -> bool {
        !md.is_dir() && self.known.get(&(md.dev(), md.ino())) == Some(&Noted::file(md))
    }

    /// [`Self::placed`], from a `stat`.
    pub fn placed_file(&self, st: &FileStat) -> bool {
        st.st_mode & libc::S_IFMT != libc::S_IFDIR
            && self.known.get(&(st.st_dev, st.st_ino)) == Some(&Noted::file_stat(st))
    }

    /// Whether the directory `md`, found as `name` in the directory open at `parent`,
    /// is one this switch's write-backs made there (whatever was done in it since).
    pub fn made_dir(&self, md: &fs::Metadata, parent: BorrowedFd<'_>, name: &OsStr) -> bool {
        md.is_dir()
            && !self.known.is_empty()
            && ino_of(parent).and_then(|p| Noted::dir(md, p, name)).as_ref()
                == self.known.get(&(md.dev(), md.ino()))
    }

    /// [`Self::made_dir`] of the directory open at `dir`.
    pub fn made_dir_fd(&self, dir: BorrowedFd<'_>, parent: BorrowedFd<'_>, name: &OsStr) -> bool {
        !self.known.is_empty()
            && fs::metadata(format!("/proc/self/fd/{}", dir.as_raw_fd()))
                .is_ok_and(|md| self.made_dir(&md, parent, name))
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    fn scratch() -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.placed");
        (d, p)
    }

    fn dir_fd(p: &Path) -> File {
        File::open(p).unwrap()
    }

    #[test]
    fn a_placed_file_is_known_until_it_changes_and_across_a_reopen() {
        let (d, rec) = scratch();
        let f = d.path().join("f");
        fs::write(&f, "ours").unwrap();
        let mut p = Placings::open(&rec, (10, 0)).unwrap();
        p.note(&fs::symlink_metadata(&f).unwrap()).unwrap();
        assert!(p.placed(&fs::symlink_metadata(&f).unwrap()));
        let again = Placings::open(&rec, (10, 0)).unwrap();
        assert!(again.placed(&fs::symlink_metadata(&f).unwrap()), "read back");
        assert!(again.placed_file(&nix::sys::stat::lstat(&f).unwrap()));
        std::thread::sleep(std::time::Duration::from_millis(5));
        fs::write(&f, "the application's").unwrap();
        assert!(!again.placed(&fs::symlink_metadata(&f).unwrap()), "changed since");
        assert!(!again.placed_file(&nix::sys::stat::lstat(&f).unwrap()));
    }

    /// A change within the same tick of a coarse ctime (whole seconds on ext4 with
    /// small inodes) still shows in the size, mtime, mode or owner.
    #[test]
    fn a_change_that_keeps_the_ctime_is_not_taken_for_the_placing() {
        let (d, _) = scratch();
        let f = d.path().join("f");
        fs::write(&f, "ours").unwrap();
        let md = fs::symlink_metadata(&f).unwrap();
        let Noted::File {
            ctime,
            mtime,
            size,
            owner,
            mode,
        } = Noted::file(&md)
        else {
            unreachable!("a file")
        };
        let file = |mtime, size, owner, mode| Noted::File {
            ctime,
            mtime,
            size,
            owner,
            mode,
        };
        let changed = [
            file(mtime, size + 1, owner, mode),
            file((mtime.0 + 1, mtime.1), size, owner, mode),
            file(mtime, size, owner, mode ^ 0o001),
            file(mtime, size, (owner.0 + 1, owner.1), mode),
        ];
        for other in changed {
            let p = Placings {
                file: None,
                known: [((md.dev(), md.ino()), other)].into(),
            };
            assert!(!p.placed(&md), "{other:?}");
        }
        let p = Placings {
            file: None,
            known: [((md.dev(), md.ino()), file(mtime, size, owner, mode))].into(),
        };
        assert!(p.placed(&md), "as recorded");
    }

    #[test]
    fn a_record_of_another_switch_is_started_again() {
        let (d, rec) = scratch();
        let f = d.path().join("f");
        fs::write(&f, "ours").unwrap();
        Placings::open(&rec, (10, 0))
            .unwrap()
            .note(&fs::symlink_metadata(&f).unwrap())
            .unwrap();
        let other = Placings::open(&rec, (11, 0)).unwrap();
        assert!(!other.placed(&fs::symlink_metadata(&f).unwrap()));
        assert_eq!(fs::read(&rec).unwrap(), header((11, 0)));
    }

    #[test]
    fn a_torn_record_is_cut_away_and_the_ones_before_it_stay() {
        let (d, rec) = scratch();
        let (f, g) = (d.path().join("f"), d.path().join("g"));
        fs::write(&f, "f").unwrap();
        fs::write(&g, "g").unwrap();
        let mut p = Placings::open(&rec, (10, 0)).unwrap();
        p.note(&fs::symlink_metadata(&f).unwrap()).unwrap();
        p.note(&fs::symlink_metadata(&g).unwrap()).unwrap();
        let whole = fs::metadata(&rec).unwrap().len();
        let torn = OpenOptions::new().write(true).open(&rec).unwrap();
        torn.set_len(whole - 3).unwrap();
        let mut again = Placings::open(&rec, (10, 0)).unwrap();
        assert!(again.placed(&fs::symlink_metadata(&f).unwrap()));
        assert!(
            !again.placed(&fs::symlink_metadata(&g).unwrap()),
            "its record was torn"
        );
        again.note(&fs::symlink_metadata(&g).unwrap()).unwrap();
        assert!(Placings::open(&rec, (10, 0))
            .unwrap()
            .placed(&fs::symlink_metadata(&g).unwrap()));
    }

    /// A directory made is the pass's where it made it, whatever is done in it;
    /// moved to another name or parent, or made again, it is not.
    #[test]
    fn a_directory_made_is_known_where_it_was_made() {
        let (d, rec) = scratch();
        let (sub, other) = (d.path().join("sub"), d.path().join("other"));
        fs::create_dir(&sub).unwrap();
        fs::create_dir(&other).unwrap();
        let top = dir_fd(d.path());
        let mut p = Placings::open(&rec, (10, 0)).unwrap();
        let md = fs::metadata(&sub).unwrap();
        md.created().expect("birth times on the test's filesystem");
        p.note_dir(&md, top.as_fd(), OsStr::new("sub")).unwrap();
        fs::write(sub.join("x"), "x").unwrap();
        let again = Placings::open(&rec, (10, 0)).unwrap();
        assert!(again.made_dir(&fs::metadata(&sub).unwrap(), top.as_fd(), OsStr::new("sub")));
        assert!(again.made_dir_fd(dir_fd(&sub).as_fd(), top.as_fd(), OsStr::new("sub")));
        fs::rename(&sub, d.path().join("moved")).unwrap();
        let moved = fs::metadata(d.path().join("moved")).unwrap();
        assert!(
            !again.made_dir(&moved, top.as_fd(), OsStr::new("moved")),
            "renamed"
        );
        fs::rename(d.path().join("moved"), other.join("sub")).unwrap();
        let below = fs::metadata(other.join("sub")).unwrap();
        assert!(
            !again.made_dir(&below, dir_fd(&other).as_fd(), OsStr::new("sub")),
            "moved below another"
        );
        fs::remove_dir_all(other.join("sub")).unwrap();
        fs::create_dir(&sub).unwrap();
        assert!(
            !again.made_dir(&fs::metadata(&sub).unwrap(), top.as_fd(), OsStr::new("sub")),
            "made again"
        );
        assert!(
            !again.placed(&fs::metadata(&sub).unwrap()),
            "a directory is no placed file"
        );
    }

    #[test]
    fn none_records_and_knows_nothing() {
        let (d, _) = scratch();
        let mut p = Placings::none();
        let f = d.path().join("f");
        fs::write(&f, "f").unwrap();
        let md = fs::symlink_metadata(&f).unwrap();
        p.note(&md).unwrap();
        assert!(!p.placed(&md));
    }
}
