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
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::sys::stat::FileStat;

use super::baseline::{fnv1a, put_time, Time};

const MAGIC: &[u8] = b"tmpfsctl-placed\n";
const RECORD: usize = 1 + 8 + 8 + 16 + 8;
const FILE: u8 = b'f';
const DIR: u8 = b'd';

/// The disk entries one switch's write-backs placed (see the module's doc).
/// [`Placings::none`] records nothing and knows nothing: a pass before the switch,
/// whose disk directory nobody else writes.
#[derive(Debug, Default)]
pub struct Placings {
    file: Option<File>,
    /// By device and inode: whether it is a directory, and its ctime (a file) or
    /// birth time (a directory).
    known: HashMap<(u64, u64), (bool, Time)>,
}

fn header(switched: Time) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    put_time(&mut out, switched);
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

fn record(dir: bool, dev: u64, ino: u64, t: Time) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD);
    out.push(if dir { DIR } else { FILE });
    out.extend_from_slice(&dev.to_le_bytes());
    out.extend_from_slice(&ino.to_le_bytes());
    put_time(&mut out, t);
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

fn word(b: &[u8]) -> [u8; 8] {
    b.try_into().expect("an 8-byte slice")
}

/// The records after `head` in `data`, up to the first damaged or partial one, and
/// where that one starts; `None` if `data` is not a record of that switch.
type Known = HashMap<(u64, u64), (bool, Time)>;

fn read(data: &[u8], head: &[u8]) -> Option<(Known, usize)> {
    let mut rest = data.strip_prefix(head)?;
    let mut known = HashMap::new();
    while let Some(r) = rest.get(..RECORD) {
        let (body, sum) = r.split_at(RECORD - 8);
        if fnv1a(body).to_le_bytes() != word(sum) || !matches!(body[0], FILE | DIR) {
            break;
        }
        let at = |i: usize| word(&body[i..i + 8]);
        let t = (i64::from_le_bytes(at(17)), i64::from_le_bytes(at(25)));
        known.insert(
            (u64::from_le_bytes(at(1)), u64::from_le_bytes(at(9))),
            (body[0] == DIR, t),
        );
        rest = &rest[RECORD..];
    }
    Some((known, data.len() - rest.len()))
}

fn ctime(md: &fs::Metadata) -> Time {
    (md.ctime(), md.ctime_nsec())
}

fn born(md: &fs::Metadata) -> Option<Time> {
    let d = md.created().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some((d.as_secs() as i64, i64::from(d.subsec_nanos())))
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

    /// Records the entry `md` as placed by this pass: a file (or symlink, or
    /// special file) as it is right after its placing, a directory right after it
    /// was made. A directory without a birth time is not recorded: nothing would
    /// tell it from one made again with its inode number.
    pub fn note(&mut self, md: &fs::Metadata) -> io::Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        let (dir, t) = if md.is_dir() {
            match born(md) {
                Some(t) => (true, t),
                None => return Ok(()),
            }
        } else {
            (false, ctime(md))
        };
        file.write_all(&record(dir, md.dev(), md.ino(), t))?;
        self.known.insert((md.dev(), md.ino()), (dir, t));
        Ok(())
    }

    /// Whether the disk entry `md` is one this switch's write-backs placed, unchanged
    /// since (a file), or made (a directory, whatever was done in it since).
    pub fn placed(&self, md: &fs::Metadata) -> bool {
        match self.known.get(&(md.dev(), md.ino())) {
            Some(&(true, t)) => md.is_dir() && born(md) == Some(t),
            Some(&(false, t)) => !md.is_dir() && ctime(md) == t,
            None => false,
        }
    }

    /// Whether the directory open at `dir` is one this switch's write-backs made.
    pub fn made_dir(&self, dir: BorrowedFd<'_>) -> bool {
        !self.known.is_empty()
            && fs::metadata(format!("/proc/self/fd/{}", dir.as_raw_fd())).is_ok_and(|md| self.placed(&md))
    }

    /// [`Self::placed`] of a file, from its `stat`.
    pub fn placed_file(&self, st: &FileStat) -> bool {
        self.known.get(&(st.st_dev, st.st_ino)) == Some(&(false, (st.st_ctime, st.st_ctime_nsec)))
            && st.st_mode & libc::S_IFMT != libc::S_IFDIR
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.placed");
        (d, p)
    }

    #[test]
    fn a_placed_file_is_known_until_it_changes_and_across_a_reopen() {
        let (d, rec) = scratch();
        let f = d.path().join("f");
        fs::write(&f, "ours").unwrap();
        let mut p = Placings::open(&rec, (10, 0)).unwrap();
        p.note(&fs::metadata(&f).unwrap()).unwrap();
        assert!(p.placed(&fs::metadata(&f).unwrap()));
        let again = Placings::open(&rec, (10, 0)).unwrap();
        assert!(again.placed(&fs::metadata(&f).unwrap()), "read back");
        assert!(again.placed_file(&nix::sys::stat::lstat(&f).unwrap()));
        std::thread::sleep(std::time::Duration::from_millis(5));
        fs::write(&f, "the application's").unwrap();
        assert!(!again.placed(&fs::metadata(&f).unwrap()), "changed since");
        assert!(!again.placed_file(&nix::sys::stat::lstat(&f).unwrap()));
    }

    #[test]
    fn a_record_of_another_switch_is_started_again() {
        let (d, rec) = scratch();
        let f = d.path().join("f");
        fs::write(&f, "ours").unwrap();
        Placings::open(&rec, (10, 0))
            .unwrap()
            .note(&fs::metadata(&f).unwrap())
            .unwrap();
        let other = Placings::open(&rec, (11, 0)).unwrap();
        assert!(!other.placed(&fs::metadata(&f).unwrap()));
        assert_eq!(fs::read(&rec).unwrap(), header((11, 0)));
    }

    #[test]
    fn a_torn_record_is_cut_away_and_the_ones_before_it_stay() {
        let (d, rec) = scratch();
        let (f, g) = (d.path().join("f"), d.path().join("g"));
        fs::write(&f, "f").unwrap();
        fs::write(&g, "g").unwrap();
        let mut p = Placings::open(&rec, (10, 0)).unwrap();
        p.note(&fs::metadata(&f).unwrap()).unwrap();
        p.note(&fs::metadata(&g).unwrap()).unwrap();
        let whole = fs::metadata(&rec).unwrap().len();
        let torn = OpenOptions::new().write(true).open(&rec).unwrap();
        torn.set_len(whole - 3).unwrap();
        let mut again = Placings::open(&rec, (10, 0)).unwrap();
        assert!(again.placed(&fs::metadata(&f).unwrap()));
        assert!(!again.placed(&fs::metadata(&g).unwrap()), "its record was torn");
        again.note(&fs::metadata(&g).unwrap()).unwrap();
        assert!(Placings::open(&rec, (10, 0))
            .unwrap()
            .placed(&fs::metadata(&g).unwrap()));
    }

    #[test]
    fn a_directory_made_is_known_by_its_birth_whatever_changes_in_it() {
        let (d, rec) = scratch();
        let sub = d.path().join("sub");
        fs::create_dir(&sub).unwrap();
        let mut p = Placings::open(&rec, (10, 0)).unwrap();
        let md = fs::metadata(&sub).unwrap();
        md.created().expect("birth times on the test's filesystem");
        p.note(&md).unwrap();
        fs::write(sub.join("x"), "x").unwrap();
        assert!(p.placed(&fs::metadata(&sub).unwrap()));
        fs::remove_dir_all(&sub).unwrap();
        fs::create_dir(&sub).unwrap();
        assert!(!p.placed(&fs::metadata(&sub).unwrap()), "made again");
    }

    #[test]
    fn none_records_and_knows_nothing() {
        let (d, _) = scratch();
        let mut p = Placings::none();
        let md = fs::metadata(d.path()).unwrap();
        p.note(&md).unwrap();
        assert!(!p.placed(&md));
    }
}
