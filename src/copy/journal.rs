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
//! A journal belongs to the baseline it extends (the header names its `taken` time):
//! one left beside a newer baseline (a crash between saving the baseline and removing
//! the journal) is ignored.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
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

fn record(path: &[u8], mark: &Mark) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + path.len());
    put_record(&mut out, path, mark);
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// The records of `data` that belong to a baseline taken at `base_taken`, in order,
/// up to the first damaged or partial one.
fn records(data: &[u8], base_taken: Option<Time>) -> Vec<(Box<[u8]>, Mark)> {
    let head = header(base_taken);
    let Some(mut rest) = data.strip_prefix(head.as_slice()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    loop {
        let mut r = RecordReader(rest);
        let (Ok((path, mark)), Ok(sum)) = (r.record(), r.array::<8>()) else {
            break;
        };
        let body = &rest[..rest.len() - r.0.len() - 8];
        if fnv1a(body).to_le_bytes() != sum {
            break;
        }
        out.push((path.into(), mark));
        rest = r.0;
    }
    out
}

impl Journal {
    /// Opens the journal at `path` for a pass merging against `base` (which must
    /// already hold what [`Journal::replay`] found): a journal of that baseline is
    /// appended to, anything else is replaced by a new one.
    pub fn open(path: &Path, base: &Baseline) -> io::Result<Journal> {
        let head = header(base.taken);
        // Only the header tells whose journal it is.
        let current = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(f) => {
                let mut found = Vec::with_capacity(head.len());
                std::io::Read::take(f, head.len() as u64).read_to_end(&mut found)?;
                found == head
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        let mut opts = OpenOptions::new();
        opts.append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
        let mut file = opts.open(path)?;
        if !current {
            file.set_len(0)?;
            file.write_all(&head)?;
        }
        Ok(Journal { file })
    }

    /// Records what the pass established for `path` (relative to the synced root).
    pub fn note(&self, path: &[u8], mark: &Mark) -> io::Result<()> {
        (&self.file).write_all(&record(path, mark))
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
        for (p, mark) in found {
            match mark {
                Mark::Placing(_) => {
                    if let Some(before) = base.marks.get(&p).filter(|m| !matches!(m, Mark::Placing(_))) {
                        base.placing_before.insert(p.clone(), before);
                    }
                }
                _ => {
                    base.placing_before.remove(&p);
                }
            }
            base.marks.insert(&p, mark);
        }
        Ok(n)
    }
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
            let one = header(None).len() + record(b"a", &Mark::Entry(sig(1))).len();
            assert_eq!(n, usize::from(cut >= one), "cut at {cut}");
        }
        let mut flipped = full.clone();
        let last = flipped.len() - 10;
        flipped[last] ^= 1;
        assert_eq!(records(&flipped, None).len(), 1);
        assert_eq!(records(b"garbage", None).len(), 0);
    }
}
