//! The write-back's journal: what a write-back pass establishes that its older
//! baseline does not know (every name it creates on disk, every deletion and every
//! newer disk version it keeps), recorded the moment it is so, until the pass's new
//! baseline is saved.
//!
//! Without it, a pass that dies after creating a name (kill -9, a failed baseline
//! save) leaves a retry with the older baseline, which does not know the name. If the
//! application deleted it on disk meanwhile, the retry would see "only the RAM has
//! it, no baseline knows it" and write it back: a resurrection. With the journal the
//! retry knows both sides held it, and the deletion wins.
//!
//! It only has to outlive a crash of tmpfsctl, not a power cut: after a power cut the
//! RAM copy is gone and the next `apply` seeds a new baseline. Records are therefore
//! appended with plain `write`s (one per record, on an `O_APPEND` descriptor), which
//! reach the page cache before the next name is created. Each record carries its own
//! checksum; replay stops at the first one that does not check out.
//!
//! A name the pass removed from the disk (the RAM had deleted it) is recorded once it
//! is gone, as gone: a retry forgets the older baseline's record of it, and of
//! everything below it. Kept, that record would say the disk had the name, so one
//! the RAM made again since would count as deleted on disk, at the time of any
//! later change to its directory, and be lost.
//!
//! A journal belongs to the baseline it extends (the header names its `taken` time):
//! one left beside a newer baseline (a crash between saving the baseline and removing
//! the journal) is ignored.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::baseline::{fnv1a, put_record, put_time, Baseline, Mark, RecordReader, Time};

const MAGIC: &[u8] = b"tmpfsctl-journal\n";
const FORMAT: u32 = 1;

/// An open journal, shared by the pass's walk and its workers.
#[derive(Debug)]
pub struct Journal {
    file: File,
}

fn header(base_taken: Option<Time>) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&FORMAT.to_le_bytes());
    let (has, t) = match base_taken {
        Some(t) => (1u8, t),
        None => (0, (0, 0)),
    };
    out.push(has);
    put_time(&mut out, t);
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// The kind bytes of the journal's own records (no [`Mark`] has them): a name
/// removed, and a disk inode one of whose names went while others stay.
const GONE: u8 = 0xff;
const TOUCHED: u8 = 0xfe;
const MADE: u8 = 0xfd;
const FINISHED: u8 = 0xfc;

/// One journal record.
#[derive(Debug, Clone, PartialEq)]
enum Noted {
    Mark(Mark),
    /// The name was removed from the disk.
    Gone,
    /// The disk inode (its number is the record's path, little-endian) is about to
    /// lose a name or gain one: its ctime is the pass's, not the application's (see
    /// [`Merge::touched`](super::Merge::touched)).
    Touched,
    /// The pass made the disk directory whose path, inode and birth time the
    /// record's path holds (see [`Journal::note_made`]).
    Made,
    /// The pass gave that directory its owner and mode (see
    /// [`Journal::note_finished`]).
    Finished,
}

fn record(path: &[u8], noted: &Noted) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + path.len());
    let own = match noted {
        Noted::Mark(mark) => {
            put_record(&mut out, path, mark);
            None
        }
        Noted::Gone => Some(GONE),
        Noted::Touched => Some(TOUCHED),
        Noted::Made => Some(MADE),
        Noted::Finished => Some(FINISHED),
    };
    if let Some(kind) = own {
        out.extend_from_slice(&(path.len() as u32).to_le_bytes());
        out.extend_from_slice(path);
        out.push(kind);
    }
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// A record of the journal's own kinds at the start of `r`'s data.
fn own<'a>(r: &mut RecordReader<'a>) -> Option<(&'a [u8], Noted)> {
    let len = u32::from_le_bytes(r.array().ok()?) as usize;
    let path = r.take(len).ok()?;
    match r.take(1).ok()? {
        [GONE] => Some((path, Noted::Gone)),
        [TOUCHED] => Some((path, Noted::Touched)),
        [MADE] => Some((path, Noted::Made)),
        [FINISHED] => Some((path, Noted::Finished)),
        _ => None,
    }
}

/// The records of `data` that belong to a baseline taken at `base_taken`, in order,
/// up to the first damaged or partial one.
/// A record as read back: its path (or inode) and what it notes.
type Read = (Box<[u8]>, Noted);

fn records(data: &[u8], base_taken: Option<Time>) -> Vec<Read> {
    records_and_end(data, base_taken).0
}

/// The records of `data` up to the first damaged one, and where that one starts
/// (0: not a journal of that baseline).
fn records_and_end(data: &[u8], base_taken: Option<Time>) -> (Vec<Read>, usize) {
    let head = header(base_taken);
    let Some(mut rest) = data.strip_prefix(head.as_slice()) else {
        return (Vec::new(), 0);
    };
    let mut out = Vec::new();
    loop {
        let mut r = RecordReader(rest);
        let found = match own(&mut RecordReader(rest)) {
            Some(_) => own(&mut r),
            None => r.record().ok().map(|(p, m)| (p, Noted::Mark(m))),
        };
        let (Some((path, noted)), Ok(sum)) = (found, r.array::<8>()) else {
            break;
        };
        let body = &rest[..rest.len() - r.0.len() - 8];
        if fnv1a(body).to_le_bytes() != sum {
            break;
        }
        out.push((path.into(), noted));
        rest = r.0;
    }
    (out, data.len() - rest.len())
}

impl Journal {
    /// Opens the journal at `path` for a pass merging against `base` (which must
    /// already hold what [`Journal::replay`] found): a journal of that baseline is
    /// appended to, anything else is replaced by a new one.
    pub fn open(path: &Path, base: &Baseline) -> io::Result<Journal> {
        let head = header(base.taken);
        // Only the header tells whose journal it is. Its records end at the first
        // damaged one (a pass that ran out of room, or was killed, in the middle of
        // one): what follows would never be replayed, so it is cut there (a review
        // helper's probe: a torn record hid a retry's removals, and 372 of 400 names
        // came back).
        let valid = match super::baseline::read_nofollow(path) {
            Ok(data) => Some(records_and_end(&data, base.taken).1).filter(|&end| end > 0),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let mut opts = OpenOptions::new();
        opts.append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
        let mut file = opts.open(path)?;
        match valid {
            Some(end) => file.set_len(end as u64)?,
            None => {
                file.set_len(0)?;
                file.write_all(&head)?;
            }
        }
        Ok(Journal { file })
    }

    /// Records what the pass established for `path` (relative to the synced root).
    pub fn note(&self, path: &[u8], mark: &Mark) -> io::Result<()> {
        (&self.file).write_all(&record(path, &Noted::Mark(*mark)))
    }

    /// Records that the pass removed `path` from the disk (once it is gone).
    pub fn note_gone(&self, path: &[u8]) -> io::Result<()> {
        (&self.file).write_all(&record(path, &Noted::Gone))
    }

    /// Records, before the pass unlinks, replaces or links a name of the disk inode
    /// `ino` that has (or will have) other names, that its ctime is the pass's: a
    /// retry after a kill must not take it for the application's change (a name of
    /// it the RAM deleted came back, a rotated log's new version was lost).
    pub fn note_touched(&self, ino: u64) -> io::Result<()> {
        (&self.file).write_all(&record(&ino.to_le_bytes(), &Noted::Touched))
    }

    /// Records that the pass made the disk directory `ino`, born at `born`, at
    /// `path`, root's and closed until the walk leaves it with its owner and mode: a
    /// retry after a kill in between must still give them (it stayed root's 0700 for
    /// good: a review helper's probe). Only that directory at that path: one the
    /// application moved elsewhere, or made again there, is its own (a review
    /// helper's probes, where a user's files became readable by others).
    pub fn note_made(&self, path: &[u8], ino: u64, born: Time) -> io::Result<()> {
        (&self.file).write_all(&record(&made_key(path, ino, born), &Noted::Made))
    }

    /// Records that the pass gave the directory [`Self::note_made`] recorded its
    /// owner and mode: from then on a change of them is someone's, and stays (a
    /// retry after a kill later in the pass gave a directory a root application
    /// had closed again the RAM's owner and mode: a review helper's probe).
    pub fn note_finished(&self, path: &[u8], ino: u64, born: Time) -> io::Result<()> {
        (&self.file).write_all(&record(&made_key(path, ino, born), &Noted::Finished))
    }

    /// Adds what a journal at `path` recorded for `base` to it, as entries both sides
    /// established; returns how many. A missing, foreign or damaged journal adds nothing.
    pub fn replay(path: &Path, base: &mut Baseline) -> io::Result<usize> {
        let data = match super::baseline::read_nofollow(path) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let found = records(&data, base.taken);
        let n = found.len();
        // Each path's last record, and the last removal of each path, by position.
        let mut noted: std::collections::HashMap<Box<[u8]>, usize> = Default::default();
        let mut removed: std::collections::HashMap<Box<[u8]>, usize> = Default::default();
        for (i, (p, record)) in found.into_iter().enumerate() {
            let mark = match record {
                Noted::Mark(mark) => mark,
                Noted::Gone => {
                    removed.insert(p, i);
                    continue;
                }
                Noted::Touched => {
                    if let Ok(ino) = <[u8; 8]>::try_from(&*p) {
                        base.touched.insert(u64::from_le_bytes(ino));
                    }
                    continue;
                }
                Noted::Made => {
                    base.made.insert(p);
                    continue;
                }
                Noted::Finished => {
                    base.made.remove(&p);
                    continue;
                }
            };
            // The record a placing replaces is no longer there if the path (or one
            // above it) was removed since it was made.
            let forgotten = gone_since(&p, &noted, &removed);
            noted.insert(p.clone(), i);
            match mark {
                Mark::Placing(_) => {
                    let before = base.marks.get(&p).filter(|m| !matches!(m, Mark::Placing(_)));
                    match before.filter(|_| !forgotten) {
                        Some(before) => base.placing_before.insert(p.clone(), before),
                        None => base.placing_before.remove(&p),
                    };
                }
                _ => {
                    base.placing_before.remove(&p);
                }
            }
            base.marks.insert(&p, mark);
        }
        if !removed.is_empty() {
            forget_removed(base, &noted, &removed);
        }
        Ok(n)
    }
}

/// How [`Journal::note_made`] keys a directory, and [`Baseline::made`] holds it: its
/// path (no NUL in it), its inode and its birth time.
pub fn made_key(path: &[u8], ino: u64, born: Time) -> Vec<u8> {
    let mut key = path.to_vec();
    key.push(0);
    key.extend_from_slice(&ino.to_le_bytes());
    put_time(&mut key, born);
    key
}

/// Whether `p`, or a path above it, was recorded as removed after `p`'s own last
/// record (the older baseline's come before any).
fn gone_since(
    p: &[u8],
    noted: &std::collections::HashMap<Box<[u8]>, usize>,
    removed: &std::collections::HashMap<Box<[u8]>, usize>,
) -> bool {
    let since = noted.get(p).copied();
    let ends = p
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b == b'/')
        .map(|(i, _)| i)
        .chain([p.len()]);
    ends.filter_map(|end| removed.get(&p[..end]))
        .any(|&at| since.is_none_or(|s| at > s))
}

/// Drops from `base` every record at or below a path the journal recorded as
/// removed after the record's own (the older baseline's come before any).
fn forget_removed(
    base: &mut Baseline,
    noted: &std::collections::HashMap<Box<[u8]>, usize>,
    removed: &std::collections::HashMap<Box<[u8]>, usize>,
) {
    let gone = |p: &[u8]| gone_since(p, noted, removed);
    let mut kept = super::baseline::Marks::with_capacity(base.marks.len(), base.marks.path_bytes());
    for (p, mark) in base.marks.iter().filter(|(p, _)| !gone(p)) {
        kept.insert(p, mark);
    }
    base.marks = kept;
    base.placing_before.retain(|p, _| !gone(p));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::baseline::Sig;

    fn sig(ino: u64) -> Sig {
        Sig {
            ino,
            mode: libc::S_IFREG | 0o644,
            size: 3,
            mtime: (5, 6),
            ctime: (7, 8),
        }
    }

    fn base(taken: Option<Time>) -> Baseline {
        Baseline {
            taken,
            ..Baseline::none()
        }
    }

    #[test]
    fn records_are_replayed_into_the_baseline_they_extend() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let b = base(Some((100, 0)));
        let j = Journal::open(&path, &b).unwrap();
        j.note(b"a", &Mark::Entry(sig(1))).unwrap();
        j.note(b"d/b", &Mark::DiskWon(sig(2))).unwrap();
        drop(j);
        let mut again = base(Some((100, 0)));
        assert_eq!(Journal::replay(&path, &mut again).unwrap(), 2);
        assert_eq!(again.get(b"d/b"), Some(Mark::DiskWon(sig(2))));
        // Reopened for the same baseline: appended to, not replaced.
        let j = Journal::open(&path, &again).unwrap();
        j.note(b"c", &Mark::Deleted((9, 9))).unwrap();
        let mut third = base(Some((100, 0)));
        assert_eq!(Journal::replay(&path, &mut third).unwrap(), 3);
    }

    /// A directory recorded as made is unfinished until its finish is recorded,
    /// and only that one: the same path with another inode or birth stays made.
    #[test]
    fn a_made_directory_is_unfinished_until_its_finish_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let b = base(Some((100, 0)));
        let j = Journal::open(&path, &b).unwrap();
        j.note_made(b"a", 1, (5, 0)).unwrap();
        j.note_made(b"b", 2, (5, 0)).unwrap();
        j.note_finished(b"a", 1, (5, 0)).unwrap();
        j.note_finished(b"b", 3, (5, 0)).unwrap();
        j.note_finished(b"b", 2, (6, 0)).unwrap();
        drop(j);
        let mut again = base(Some((100, 0)));
        assert_eq!(Journal::replay(&path, &mut again).unwrap(), 5);
        let made: Vec<_> = again.made.iter().cloned().collect();
        assert_eq!(made, [made_key(b"b", 2, (5, 0)).into_boxed_slice()]);
    }

    /// A record torn in the middle (the state directory full, a kill) ends what a
    /// replay reads: a journal opened again is cut back to its last whole record, so
    /// what a retry notes after it is replayed too.
    #[test]
    fn a_torn_record_is_cut_away_before_the_journal_is_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let b = base(Some((100, 0)));
        let j = Journal::open(&path, &b).unwrap();
        j.note(b"a", &Mark::Entry(sig(1))).unwrap();
        j.note(b"torn", &Mark::Entry(sig(2))).unwrap();
        drop(j);
        let len = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let j = Journal::open(&path, &b).unwrap();
        j.note_gone(b"a").unwrap();
        j.note(b"c", &Mark::Deleted((9, 9))).unwrap();
        drop(j);
        let mut again = base(Some((100, 0)));
        assert_eq!(Journal::replay(&path, &mut again).unwrap(), 3);
        assert_eq!(again.get(b"c"), Some(Mark::Deleted((9, 9))));
        assert_eq!(again.get(b"torn"), None);
    }

    /// A removal forgets the older baseline's records at and below its path, and a
    /// journal record made before it; one made after it stands. A name that only
    /// starts like a removed directory's keeps its record.
    #[test]
    fn a_removal_forgets_the_records_at_and_below_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut older = base(Some((100, 0)));
        for (p, ino) in [("d", 1), ("d/a.log", 2), ("d/e/f", 3), ("dx", 4), ("k", 5)] {
            older.marks.insert(p.as_bytes(), Mark::Entry(sig(ino)));
        }
        let j = Journal::open(&path, &older).unwrap();
        j.note(b"n", &Mark::Entry(sig(6))).unwrap();
        j.note_gone(b"d").unwrap();
        j.note_gone(b"n").unwrap();
        j.note_gone(b"k").unwrap();
        j.note(b"k", &Mark::Entry(sig(7))).unwrap();
        drop(j);
        let mut again = older.clone();
        assert_eq!(Journal::replay(&path, &mut again).unwrap(), 5);
        let left: Vec<(String, Mark)> = again
            .marks
            .iter()
            .map(|(p, m)| (String::from_utf8_lossy(p).into_owned(), m))
            .collect();
        assert_eq!(
            left,
            vec![
                ("dx".to_string(), Mark::Entry(sig(4))),
                ("k".to_string(), Mark::Entry(sig(7))),
            ]
        );
    }

    /// A name removed, then about to be placed again by a later pass of the same
    /// journal, killed before the rename: the retry takes the name as unknown, not
    /// as the older baseline's record the removal forgot (a review helper's probe).
    #[test]
    fn a_placing_after_a_removal_does_not_bring_back_the_removed_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut older = base(Some((100, 0)));
        older.marks.insert(b"d/a.log", Mark::Entry(sig(2)));
        let j = Journal::open(&path, &older).unwrap();
        j.note_gone(b"d").unwrap();
        j.note(b"d/a.log", &Mark::Placing(sig(9))).unwrap();
        drop(j);
        let mut again = older.clone();
        Journal::replay(&path, &mut again).unwrap();
        assert_eq!(again.placing_before.get(&b"d/a.log"[..]).copied(), None);
        assert_eq!(again.get(b"d/a.log"), Some(Mark::Placing(sig(9))));
    }

    #[test]
    fn a_journal_of_another_baseline_is_ignored_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let j = Journal::open(&path, &base(Some((100, 0)))).unwrap();
        j.note(b"a", &Mark::Entry(sig(1))).unwrap();
        let mut newer = base(Some((200, 0)));
        assert_eq!(Journal::replay(&path, &mut newer).unwrap(), 0);
        let mut none = base(None);
        assert_eq!(Journal::replay(&path, &mut none).unwrap(), 0);
        Journal::open(&path, &newer).unwrap();
        let mut old = base(Some((100, 0)));
        assert_eq!(Journal::replay(&path, &mut old).unwrap(), 0);
    }

    #[test]
    fn replay_stops_at_a_partial_or_damaged_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let b = base(None);
        let j = Journal::open(&path, &b).unwrap();
        j.note(b"a", &Mark::Entry(sig(1))).unwrap();
        j.note(b"b", &Mark::Entry(sig(2))).unwrap();
        drop(j);
        let full = std::fs::read(&path).unwrap();
        for cut in 0..full.len() {
            let mut data = full.clone();
            data.truncate(cut);
            let n = records(&data, None).len();
            let one = header(None).len() + record(b"a", &Noted::Mark(Mark::Entry(sig(1)))).len();
            assert_eq!(n, usize::from(cut >= one), "cut at {cut}");
        }
        let mut flipped = full.clone();
        let last = flipped.len() - 10;
        flipped[last] ^= 1;
        assert_eq!(records(&flipped, None).len(), 1);
        assert_eq!(records(b"garbage", None).len(), 0);
    }
}
