//! The baseline's records by path. A write-back looks up every entry of the tree once
//! and records it again, so a pass over 100,000 entries makes 200,000 lookups and
//! inserts: the records live in one arena, in the order they were made (the walk's
//! order, which the next pass nearly repeats), with an open-addressing index over
//! them. No allocation per path.
//!
//! A tree of a million files keeps a million records, twice during a write-back (the
//! old baseline and the next): each record is its path and its mark packed into
//! variable-length integers, about 25 bytes besides the path where a [`Mark`] takes
//! 64 (see docs/benchmarks.md, "Memory"). No hash is kept per record: an index slot
//! holds high bits of its path's hash beside the record number, so a probe rarely
//! reads another path's record, and a larger index hashes every path again.
//!
//! The index hashes with std's `RandomState` (keyed SipHash): names come from the
//! application, and a hash a local user could collide on purpose would make every
//! pass quadratic.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};

use super::baseline::{Mark, Sig, Time};
use super::ops::split_parent;

/// Records by path; for a path recorded more than once the last record holds.
#[derive(Clone, Default)]
pub struct Marks {
    hasher: RandomState,
    /// The records: each is the path's length, the path and the mark (see
    /// [`put_mark`]). A mark replaced by one of another length is appended again with
    /// its path, and the old bytes are left unused.
    bytes: Vec<u8>,
    /// Where each record starts in `bytes`, in the order their paths were first
    /// recorded.
    starts: Vec<u64>,
    /// Index into `starts` plus one in the bits below the length, the high bits of
    /// the path's hash above them ([`Marks::tag`]), 0 for a free slot; a power of two
    /// long (or empty), at most half full.
    slots: Vec<u32>,
    /// The length of all paths, and how many records are [`Mark::Deleted`]: the
    /// length of the saved form, which its checksum starts from.
    path_bytes: usize,
    deleted: usize,
}

impl Marks {
    /// Room for `records` records of `bytes` bytes in all (see [`Marks::byte_len`]),
    /// without growing.
    pub fn with_capacity(records: usize, bytes: usize) -> Marks {
        let mut marks = Marks {
            bytes: Vec::with_capacity(bytes),
            starts: Vec::with_capacity(records),
            ..Marks::default()
        };
        marks.resize_index(records);
        marks
    }

    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// The bytes the records take: what a copy of them needs at most.
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// The length of all paths.
    pub fn path_bytes(&self) -> usize {
        self.path_bytes
    }

    /// How many records are [`Mark::Deleted`].
    pub fn deleted(&self) -> usize {
        self.deleted
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    pub fn get(&self, path: &[u8]) -> Option<Mark> {
        let i = self.find(self.hasher.hash_one(path), path).ok()?;
        Some(self.record(i).1)
    }

    /// Records `mark` for `path`, in place of an earlier record of it.
    pub fn insert(&mut self, path: &[u8], mark: Mark) {
        // The index is then at most 2^32 slots, numbered by a u32.
        assert!(
            self.len() < 1 << 31,
            "fewer than 2^31 records: a tree cannot hold that many names"
        );
        if (self.len() + 1) * 2 > self.slots.len() {
            self.resize_index(self.len() + 1);
        }
        let hash = self.hasher.hash_one(path);
        let deleted = usize::from(matches!(mark, Mark::Deleted(_)));
        match self.find(hash, path) {
            Ok(i) => {
                let (_, at) = read_path(&self.bytes, self.start(i));
                let (old, old_end) = read_mark(&self.bytes, at);
                self.deleted = self.deleted + deleted - usize::from(matches!(old, Mark::Deleted(_)));
                // Encoded at the end first: kept there only when it does not fit.
                let end = self.bytes.len();
                put_mark(&mut self.bytes, &mark);
                if self.bytes.len() - end == old_end - at {
                    self.bytes.copy_within(end.., at);
                    self.bytes.truncate(end);
                } else {
                    self.bytes.truncate(end);
                    self.starts[i] = end as u64;
                    self.push_record(path, &mark);
                }
            }
            Err(slot) => {
                // Below the index's length, which is at most 2^32.
                self.slots[slot] = self.tag(hash) | (self.len() + 1) as u32;
                self.starts.push(self.bytes.len() as u64);
                self.push_record(path, &mark);
                self.path_bytes += path.len();
                self.deleted += deleted;
            }
        }
    }

    /// The records in the order their paths were first recorded.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Mark)> + '_ {
        (0..self.len()).map(|i| self.record(i))
    }

    /// The records by the directory their path is in.
    pub fn by_dir(&self) -> ByDir<'_> {
        let mut first: HashMap<&[u8], u32> = HashMap::new();
        let mut next = vec![0; self.len()];
        // From the last, so that each directory's records chain in the order made.
        for i in (0..self.len()).rev() {
            let dir = split_parent(read_path(&self.bytes, self.start(i)).0).0;
            // Below 2^32: `insert` checks.
            if let Some(later) = first.insert(dir, i as u32 + 1) {
                next[i] = later;
            }
        }
        ByDir {
            marks: self,
            first,
            next,
        }
    }

    fn start(&self, i: usize) -> usize {
        // Below `bytes.len()`, a `usize`.
        self.starts[i] as usize
    }

    fn record(&self, i: usize) -> (&[u8], Mark) {
        let (path, at) = read_path(&self.bytes, self.start(i));
        (path, read_mark(&self.bytes, at).0)
    }

    fn push_record(&mut self, path: &[u8], mark: &Mark) {
        put_varint(&mut self.bytes, path.len() as u64);
        self.bytes.extend_from_slice(path);
        put_mark(&mut self.bytes, mark);
    }

    /// The record of `path` (`Ok`), or the free slot where it belongs (`Err`). The
    /// index must have a free slot.
    fn find(&self, hash: u64, path: &[u8]) -> Result<usize, usize> {
        if self.slots.is_empty() {
            return Err(0);
        }
        let mask = self.slots.len() - 1;
        let tag = self.tag(hash);
        let mut i = hash as usize & mask;
        loop {
            match self.slots[i] {
                0 => return Err(i),
                s if s & !(mask as u32) == tag => {
                    let n = (s & mask as u32) as usize - 1;
                    if read_path(&self.bytes, self.start(n)).0 == path {
                        return Ok(n);
                    }
                }
                _ => {}
            }
            i = (i + 1) & mask;
        }
    }

    /// The bits of a slot above the record number: the high half of `hash`, whose
    /// low bits pick the slot, masked to what the index's length leaves (11 bits for
    /// a million records).
    fn tag(&self, hash: u64) -> u32 {
        // The index is at most 2^32 long: its mask fits.
        (hash >> 32) as u32 & !((self.slots.len() - 1) as u32)
    }

    /// An index for at least `records` records at most half full, rebuilt by hashing
    /// every path again (the index doubles, so each path is hashed about twice in
    /// all).
    fn resize_index(&mut self, records: usize) {
        let want = (records * 2).next_power_of_two().max(16);
        if want <= self.slots.len() {
            return;
        }
        self.slots = vec![0; want];
        let mask = want - 1;
        for n in 0..self.len() {
            let hash = self.hasher.hash_one(read_path(&self.bytes, self.start(n)).0);
            let mut i = hash as usize & mask;
            while self.slots[i] != 0 {
                i = (i + 1) & mask;
            }
            // Below `want`, which is at most 2^32.
            self.slots[i] = self.tag(hash) | (n + 1) as u32;
        }
    }
}

/// The records by the directory their path is in (`""` for the root's entries), in
/// the order made: each directory's first record, and each record's next one in its
/// directory. Four bytes a record, where vectors of paths by directory take sixteen
/// and more.
pub struct ByDir<'a> {
    marks: &'a Marks,
    first: HashMap<&'a [u8], u32>,
    /// The record number plus one of the next record in the same directory, 0 for
    /// none.
    next: Vec<u32>,
}

impl<'a> ByDir<'a> {
    /// The records of the entries of `dir` (not of those further below).
    pub fn records(&self, dir: &[u8]) -> impl Iterator<Item = (&'a [u8], Mark)> + '_ {
        let mut n = self.first.get(dir).copied().unwrap_or(0);
        let marks = self.marks;
        std::iter::from_fn(move || {
            let i = n.checked_sub(1)? as usize;
            n = self.next[i];
            Some(marks.record(i))
        })
    }

    /// The names the records of `dir` hold: the disk directory's names, where
    /// [`Baseline::unchanged_dir`](super::baseline::Baseline::unchanged_dir) holds. A
    /// name remembered as deleted is not on the disk.
    pub fn names(&self, dir: &[u8]) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.records(dir)
            .filter(|(_, m)| !matches!(m, Mark::Deleted(_)))
            .map(|(p, _)| split_parent(p).1)
    }
}

/// A mark as its kind and the fields of its [`Sig`] (or its time) as LEB128
/// integers: signed ones zigzagged, nanoseconds as they are (below 2^30: at most
/// five bytes), the mtime
/// as its difference from the ctime (often nothing). Every value of every field
/// comes back exactly.
fn put_mark(out: &mut Vec<u8>, mark: &Mark) {
    let (kind, sig) = match mark {
        Mark::Entry(s) => (0, s),
        Mark::Deleted(t) => {
            out.push(1);
            put_time(out, *t);
            return;
        }
        Mark::DiskWon(s) => (2, s),
        Mark::Placing(s) => (3, s),
    };
    out.push(kind);
    put_varint(out, sig.ino);
    put_varint(out, u64::from(sig.mode));
    put_varint(out, zigzag(sig.size));
    put_time(out, sig.ctime);
    put_varint(out, zigzag(sig.mtime.0.wrapping_sub(sig.ctime.0)));
    put_varint(out, zigzag(sig.mtime.1.wrapping_sub(sig.ctime.1)));
}

fn put_time(out: &mut Vec<u8>, t: Time) {
    put_varint(out, zigzag(t.0));
    put_varint(out, t.1 as u64);
}

/// What [`put_mark`] wrote at `at`, and where it ends.
fn read_mark(bytes: &[u8], at: usize) -> (Mark, usize) {
    let mut r = Reader { bytes, at: at + 1 };
    let mark = match bytes[at] {
        1 => Mark::Deleted(r.time()),
        kind => {
            let ino = r.varint();
            let mode = u32::try_from(r.varint()).expect("put_mark wrote a u32");
            let size = unzigzag(r.varint());
            let ctime = r.time();
            let mtime = (
                ctime.0.wrapping_add(unzigzag(r.varint())),
                ctime.1.wrapping_add(unzigzag(r.varint())),
            );
            let sig = Sig {
                ino,
                mode,
                size,
                mtime,
                ctime,
            };
            match kind {
                0 => Mark::Entry(sig),
                2 => Mark::DiskWon(sig),
                _ => Mark::Placing(sig),
            }
        }
    };
    (mark, r.at)
}

/// The path of the record at `start`, and where its mark starts.
fn read_path(bytes: &[u8], start: usize) -> (&[u8], usize) {
    let mut r = Reader { bytes, at: start };
    // Below `bytes.len()`, a `usize`.
    let len = r.varint() as usize;
    (&bytes[r.at..r.at + len], r.at + len)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Reads what this module wrote: the arena is never read from anywhere else, so
/// its contents are known to be well formed.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn varint(&mut self) -> u64 {
        let mut v = 0;
        let mut shift = 0;
        loop {
            let b = self.bytes[self.at];
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return v;
            }
            shift += 7;
        }
    }

    fn time(&mut self) -> Time {
        (unzigzag(self.varint()), self.varint() as i64)
    }
}

/// The same records, in whatever order.
impl PartialEq for Marks {
    fn eq(&self, other: &Marks) -> bool {
        self.len() == other.len() && self.iter().all(|(p, m)| other.get(p) == Some(m))
    }
}

impl Eq for Marks {}

impl fmt::Debug for Marks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(p, m)| (String::from_utf8_lossy(p), m)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(t: i64) -> Mark {
        Mark::Deleted((t, 0))
    }

    #[test]
    fn the_last_record_of_a_path_holds_and_the_first_order_stays() {
        let mut marks = Marks::default();
        for (p, t) in [("b", 1), ("a", 2), ("b", 3), ("a/x", 4), ("a", 5)] {
            marks.insert(p.as_bytes(), m(t));
        }
        let got: Vec<_> = marks.iter().map(|(p, k)| (p.to_vec(), k)).collect();
        assert_eq!(
            got,
            vec![
                (b"b".to_vec(), m(3)),
                (b"a".to_vec(), m(5)),
                (b"a/x".to_vec(), m(4))
            ]
        );
        assert_eq!(marks.get(b"a/x"), Some(m(4)));
        assert_eq!((marks.path_bytes(), marks.deleted()), (5, 3));
        let sig = Sig {
            ino: 1,
            mode: 0o40755,
            size: 0,
            mtime: (0, 0),
            ctime: (0, 0),
        };
        marks.insert(b"a", Mark::Entry(sig));
        assert_eq!((marks.path_bytes(), marks.deleted()), (5, 2));
        assert_eq!(marks.get(b"a/"), None);
        assert_eq!(marks.get(b""), None);
    }

    #[test]
    fn many_paths_survive_growth_and_compare_regardless_of_order() {
        let paths: Vec<Vec<u8>> = (0..5000u32)
            .map(|i| format!("d{}/f\u{e9}{i}\n", i % 37).into_bytes())
            .collect();
        let mut grown = Marks::default();
        let mut sized = Marks::with_capacity(paths.len(), 0);
        for (i, p) in paths.iter().enumerate() {
            grown.insert(p, m(i as i64));
        }
        for (i, p) in paths.iter().enumerate().rev() {
            sized.insert(p, m(i as i64));
        }
        assert_eq!(grown.len(), 5000);
        for (i, p) in paths.iter().enumerate() {
            assert_eq!(grown.get(p), Some(m(i as i64)));
        }
        assert_eq!(grown, sized);
        sized.insert(&paths[7], m(-1));
        assert_ne!(grown, sized);
        let mut fewer = grown.clone();
        fewer.insert(b"extra", m(0));
        assert_ne!(grown, fewer);
        assert_ne!(fewer, grown);
    }

    #[test]
    fn every_value_comes_back_and_a_longer_record_replaces_a_shorter() {
        let sig = |v: i64| Sig {
            ino: v as u64,
            mode: v as u32,
            size: v,
            mtime: (v, v.wrapping_neg()),
            ctime: (v.wrapping_mul(3), v),
        };
        let values = [0, 1, -1, 127, 128, 1 << 30, 999_999_999, i64::MAX, i64::MIN];
        let all: Vec<Mark> = values
            .iter()
            .flat_map(|&v| {
                [
                    Mark::Entry(sig(v)),
                    Mark::Deleted((v, v.wrapping_add(1).wrapping_neg())),
                    Mark::DiskWon(sig(v)),
                    Mark::Placing(sig(v)),
                ]
            })
            .collect();
        let mut marks = Marks::default();
        for (i, mark) in all.iter().enumerate() {
            marks.insert(format!("p{i}").as_bytes(), *mark);
        }
        // Each path again with each other length: replaced in place or appended.
        for (i, mark) in all.iter().rev().enumerate() {
            marks.insert(format!("p{i}").as_bytes(), *mark);
            assert_eq!(marks.get(format!("p{i}").as_bytes()), Some(*mark));
        }
        let got: Vec<_> = marks.iter().map(|(p, k)| (p.to_vec(), k)).collect();
        let want: Vec<_> = all
            .iter()
            .rev()
            .enumerate()
            .map(|(i, k)| (format!("p{i}").into_bytes(), *k))
            .collect();
        assert_eq!(got, want);
    }
}
