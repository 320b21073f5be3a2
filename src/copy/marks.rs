//! The baseline's records by path. A write-back looks up every entry of the tree once
//! and records it again, so a pass over 100,000 entries makes 200,000 lookups and
//! inserts: the records live in one arena, in the order they were made (the walk's
//! order, which the next pass nearly repeats), with an open-addressing index over
//! them. No allocation per path.
//!
//! A tree of a million files keeps a million records, once during a write-back (the
//! next baseline shares the old one's unchanged records): each record is its path and
//! its mark packed into
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
use std::sync::Arc;

use super::baseline::{Mark, Sig, Time};
use super::ops::split_parent;

/// Records by path; for a path recorded more than once the last record holds.
///
/// The set a write-back makes for the next baseline ([`Marks::next_of`]) shares the
/// records of the old one instead of copying them: nearly all of them come back
/// unchanged (in a pass that changed nothing, all), and a second copy of a million
/// records is what kept a no-op pass over 64 MiB. Such a set holds a bit per old
/// record for whether it is one of its own, and its changed or new records beside.
#[derive(Clone, Default)]
pub struct Marks {
    hasher: RandomState,
    /// The records of the set this one was made from, of which `live` ones belong to
    /// this set; a path is either there or in `own`, never in both.
    shared: Option<Shared>,
    own: Arc<Arena>,
}

#[derive(Clone)]
struct Shared {
    arena: Arc<Arena>,
    /// A bit per record of `arena`: it is one of this set's.
    live: Vec<u64>,
    len: usize,
    path_bytes: usize,
    deleted: usize,
}

impl Shared {
    fn is_live(&self, i: usize) -> bool {
        self.live[i / 64] & 1 << (i % 64) != 0
    }

    /// Makes the record `i`, of `path` and `mark`, one of the set's or not.
    fn set_live(&mut self, i: usize, path: &[u8], mark: &Mark, live: bool) {
        if self.is_live(i) == live {
            return;
        }
        self.live[i / 64] ^= 1 << (i % 64);
        let deleted = usize::from(matches!(mark, Mark::Deleted(_)));
        if live {
            self.len += 1;
            self.path_bytes += path.len();
            self.deleted += deleted;
        } else {
            self.len -= 1;
            self.path_bytes -= path.len();
            self.deleted -= deleted;
        }
    }
}

/// Records packed in one arena with an open-addressing index over them, hashed by the
/// [`Marks`] holding them.
#[derive(Clone, Default)]
struct Arena {
    /// The records: each is the path's length, the path and the mark (see
    /// [`put_mark`]). A mark replaced by one of another length is appended again with
    /// its path, and the old bytes are left unused.
    bytes: Vec<u8>,
    /// Where each record starts in `bytes`, in the order their paths were first
    /// recorded.
    starts: Starts,
    /// Index into `starts` plus one in the bits below the length, the high bits of
    /// the path's hash above them ([`Arena::tag`]), 0 for a free slot; a power of two
    /// long (or empty), at most half full.
    slots: Vec<u32>,
    /// The length of all paths, and how many records are [`Mark::Deleted`]: the
    /// length of the saved form, which its checksum starts from.
    path_bytes: usize,
    deleted: usize,
}

/// Record offsets: four bytes each while the arena is below 4 GiB (a million records
/// take some 40 MiB), eight once it grows past.
#[derive(Clone)]
enum Starts {
    Small(Vec<u32>),
    Large(Vec<u64>),
}

impl Default for Starts {
    fn default() -> Self {
        Starts::Small(Vec::new())
    }
}

impl Starts {
    fn len(&self) -> usize {
        match self {
            Starts::Small(v) => v.len(),
            Starts::Large(v) => v.len(),
        }
    }

    fn get(&self, i: usize) -> usize {
        match self {
            Starts::Small(v) => v[i] as usize,
            // Below the arena's length, a `usize`.
            Starts::Large(v) => v[i] as usize,
        }
    }

    fn set(&mut self, i: usize, start: usize) {
        match self.fit(start) {
            Starts::Small(v) => v[i] = start as u32,
            Starts::Large(v) => v[i] = start as u64,
        }
    }

    fn push(&mut self, start: usize) {
        match self.fit(start) {
            Starts::Small(v) => v.push(start as u32),
            Starts::Large(v) => v.push(start as u64),
        }
    }

    /// Itself, widened first if `start` does not fit four bytes.
    fn fit(&mut self, start: usize) -> &mut Starts {
        if let Starts::Small(v) = self {
            if u32::try_from(start).is_err() {
                *self = Starts::Large(v.iter().map(|&s| u64::from(s)).collect());
            }
        }
        self
    }
}

impl Marks {
    /// Room for `records` records of `bytes` bytes in all, without growing.
    pub fn with_capacity(records: usize, bytes: usize) -> Marks {
        let hasher = RandomState::new();
        let mut own = Arena {
            bytes: Vec::with_capacity(bytes),
            starts: Starts::Small(Vec::with_capacity(records)),
            ..Arena::default()
        };
        own.resize_index(&hasher, records);
        Marks {
            hasher,
            shared: None,
            own: Arc::new(own),
        }
    }

    /// An empty set for the records that follow `old` (the next baseline's), sharing
    /// `old`'s records: one recorded again with the mark it has there costs a bit.
    pub fn next_of(old: &Marks) -> Marks {
        let (hasher, arena) = if old.shared.is_none() {
            (old.hasher.clone(), Arc::clone(&old.own))
        } else {
            // Shared records of shared records would chain from pass to pass: an
            // old set that shares is copied once (a second pass of one write-back).
            let mut flat = Marks::with_capacity(old.len(), old.own.bytes.len());
            for (path, mark) in old.iter() {
                flat.insert(path, mark);
            }
            (flat.hasher, flat.own)
        };
        Marks {
            hasher,
            shared: Some(Shared {
                live: vec![0; arena.len().div_ceil(64)],
                arena,
                len: 0,
                path_bytes: 0,
                deleted: 0,
            }),
            own: Arc::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.own.len() + self.shared.as_ref().map_or(0, |s| s.len)
    }

    /// The length of all paths.
    pub fn path_bytes(&self) -> usize {
        self.own.path_bytes + self.shared.as_ref().map_or(0, |s| s.path_bytes)
    }

    /// How many records are [`Mark::Deleted`].
    pub fn deleted(&self) -> usize {
        self.own.deleted + self.shared.as_ref().map_or(0, |s| s.deleted)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, path: &[u8]) -> Option<Mark> {
        let hash = self.hasher.hash_one(path);
        if let Ok(i) = self.own.find(hash, path) {
            return Some(self.own.record(i).1);
        }
        let shared = self.shared.as_ref()?;
        let i = shared.arena.find(hash, path).ok()?;
        shared.is_live(i).then(|| shared.arena.record(i).1)
    }

    /// Records `mark` for `path`, in place of an earlier record of it.
    pub fn insert(&mut self, path: &[u8], mark: Mark) {
        let hash = self.hasher.hash_one(path);
        if let Some(shared) = &mut self.shared {
            if let Ok(i) = shared.arena.find(hash, path) {
                if self.own.find(hash, path).is_err() {
                    let (_, old) = shared.arena.record(i);
                    if old == mark {
                        shared.set_live(i, path, &old, true);
                        return;
                    }
                    shared.set_live(i, path, &old, false);
                }
            }
        }
        Arc::make_mut(&mut self.own).insert(&self.hasher, hash, path, mark);
    }

    /// Records `mark` for `path` again, as the set `old` has it under the number `n`
    /// ([`ByDir::numbered`]). When this set was made from `old` and shares its
    /// records, that is setting its bit: the record is known without a lookup (a
    /// tracked pass carries every record of the subtrees it skips so).
    pub fn carry(&mut self, old: &Marks, n: usize, path: &[u8], mark: Mark) {
        if let Some(shared) = &mut self.shared {
            if old.shared.is_none() && Arc::ptr_eq(&shared.arena, &old.own) {
                let own = &self.own;
                if own.len() == 0 || own.find(self.hasher.hash_one(path), path).is_err() {
                    shared.set_live(n, path, &mark, true);
                    return;
                }
            }
        }
        self.insert(path, mark);
    }

    /// The records in the order their paths were first recorded (the shared ones
    /// first, in the order of the set they come from).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Mark)> + '_ {
        self.numbered().map(|(_, path, mark)| (path, mark))
    }

    /// The records, each with a number below [`Self::numbers`]: a shared one's is its
    /// number in the set it comes from, an own one's follows all of those.
    fn numbered(&self) -> impl Iterator<Item = (usize, &[u8], Mark)> + '_ {
        let shared = self.shared.iter().flat_map(|s| {
            (0..s.arena.len()).filter(|&i| s.is_live(i)).map(|i| {
                let (path, mark) = s.arena.record(i);
                (i, path, mark)
            })
        });
        let first_own = self.shared.as_ref().map_or(0, |s| s.arena.len());
        shared.chain((0..self.own.len()).map(move |i| {
            let (path, mark) = self.own.record(i);
            (first_own + i, path, mark)
        }))
    }

    fn numbers(&self) -> usize {
        self.own.len() + self.shared.as_ref().map_or(0, |s| s.arena.len())
    }

    /// The record numbered `n` by [`Self::numbered`].
    fn numbered_record(&self, n: usize) -> (&[u8], Mark) {
        match &self.shared {
            Some(s) if n < s.arena.len() => s.arena.record(n),
            Some(s) => self.own.record(n - s.arena.len()),
            None => self.own.record(n),
        }
    }

    /// The records by the directory their path is in.
    pub fn by_dir(&self) -> ByDir<'_> {
        let mut first: HashMap<&[u8], u32> = HashMap::new();
        let mut next = vec![0; self.numbers()];
        // The directory of the records just chained and its first so far: records
        // come in the walk's order, a directory's mostly together, so the table is
        // looked up once for each run of them rather than for every record.
        let mut run: Option<(&[u8], u32)> = None;
        // From the last, so that each directory's records chain in the order made.
        for n in (0..self.numbers()).rev() {
            if self
                .shared
                .as_ref()
                .is_some_and(|s| n < s.arena.len() && !s.is_live(n))
            {
                continue;
            }
            let dir = split_parent(self.numbered_record(n).0).0;
            let later = match run {
                Some((d, later)) if d == dir => later,
                _ => {
                    if let Some((d, head)) = run {
                        first.insert(d, head);
                    }
                    first.get(dir).copied().unwrap_or(0)
                }
            };
            next[n] = later;
            // Below 2^32: `insert` checks.
            run = Some((dir, n as u32 + 1));
        }
        if let Some((d, head)) = run {
            first.insert(d, head);
        }
        ByDir {
            marks: self,
            first,
            next,
        }
    }
}

impl Arena {
    fn len(&self) -> usize {
        self.starts.len()
    }

    /// Records `mark` for `path` (hashed `hash` by `hasher`), in place of an earlier
    /// record of it.
    fn insert(&mut self, hasher: &RandomState, hash: u64, path: &[u8], mark: Mark) {
        // The index is then at most 2^32 slots, numbered by a u32.
        assert!(
            self.len() < 1 << 31,
            "fewer than 2^31 records: a tree cannot hold that many names"
        );
        if (self.len() + 1) * 2 > self.slots.len() {
            self.resize_index(hasher, self.len() + 1);
        }
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
                    self.starts.set(i, end);
                    self.push_record(path, &mark);
                }
            }
            Err(slot) => {
                // Below the index's length, which is at most 2^32.
                self.slots[slot] = self.tag(hash) | (self.len() + 1) as u32;
                self.starts.push(self.bytes.len());
                self.push_record(path, &mark);
                self.path_bytes += path.len();
                self.deleted += deleted;
            }
        }
    }

    fn start(&self, i: usize) -> usize {
        self.starts.get(i)
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
    fn resize_index(&mut self, hasher: &RandomState, records: usize) {
        let want = (records * 2).next_power_of_two().max(16);
        if want <= self.slots.len() {
            return;
        }
        self.slots = vec![0; want];
        let mask = want - 1;
        for n in 0..self.len() {
            let hash = hasher.hash_one(read_path(&self.bytes, self.start(n)).0);
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
        self.numbered(dir).map(|(_, path, mark)| (path, mark))
    }

    /// [`Self::records`], each with its number for [`Marks::carry`].
    pub fn numbered(&self, dir: &[u8]) -> impl Iterator<Item = (usize, &'a [u8], Mark)> + '_ {
        let mut n = self.first.get(dir).copied().unwrap_or(0);
        let marks = self.marks;
        std::iter::from_fn(move || {
            let i = n.checked_sub(1)? as usize;
            n = self.next[i];
            let (path, mark) = marks.numbered_record(i);
            Some((i, path, mark))
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

    /// A record carried by its number is the one found by its path; a set that does
    /// not share the old one's records, or has the path recorded anew, looks it up.
    #[test]
    fn a_record_carried_by_number_is_the_one_found_by_path() {
        let mut old = Marks::default();
        for (p, t) in [("d", 1), ("d/a", 2), ("d/b", 3), ("e/c", 4)] {
            old.insert(p.as_bytes(), m(t));
        }
        let by_dir = old.by_dir();
        let mut next = Marks::next_of(&old);
        next.insert(b"d/b", m(30));
        for (n, p, k) in by_dir.numbered(b"d") {
            next.carry(&old, n, p, k);
        }
        let mut flat = Marks::default();
        for (p, t) in [("d/a", 2), ("d/b", 3)] {
            flat.insert(p.as_bytes(), m(t));
        }
        assert_eq!(next, flat);
        assert_eq!((next.len(), next.path_bytes()), (2, 6));
        // Not made from `old`: looked up and recorded anew.
        let mut other = Marks::default();
        for (n, p, k) in by_dir.numbered(b"e") {
            other.carry(&old, n, p, k);
        }
        assert_eq!(other.get(b"e/c"), Some(m(4)));
        assert_eq!(other.len(), 1);
    }

    #[test]
    fn offsets_widen_past_four_bytes() {
        let mut starts = Starts::default();
        starts.push(7);
        starts.push(u32::MAX as usize);
        assert!(matches!(starts, Starts::Small(_)));
        starts.set(0, 1 << 33);
        assert!(matches!(starts, Starts::Large(_)));
        starts.push(5);
        let got: Vec<_> = (0..starts.len()).map(|i| starts.get(i)).collect();
        assert_eq!(got, [1 << 33, u32::MAX as usize, 5]);
    }

    /// The next set shares what is recorded again unchanged, holds what changed, and
    /// leaves out what was not recorded again, whatever the order; so does the set
    /// after it, made from one that shares.
    #[test]
    fn the_next_set_holds_exactly_what_was_recorded_in_it() {
        let mut old = Marks::default();
        for (p, t) in [("a", 1), ("a/x", 2), ("a/y", 3), ("b", 4), ("gone", 5)] {
            old.insert(p.as_bytes(), m(t));
        }
        let mut next = Marks::next_of(&old);
        assert!(next.is_empty());
        assert_eq!(next.get(b"a"), None);
        next.insert(b"a/y", m(3));
        next.insert(b"a/x", m(20));
        next.insert(b"new", m(6));
        next.insert(b"a", m(1));
        next.insert(b"b", m(4));
        // Changed after it was carried, and carried after it was changed.
        next.insert(b"b", m(40));
        next.insert(b"a/x", m(2));
        let want = [("a", 1), ("a/x", 2), ("a/y", 3), ("b", 40), ("new", 6)];
        let mut flat = Marks::default();
        for (p, t) in want {
            flat.insert(p.as_bytes(), m(t));
            assert_eq!(next.get(p.as_bytes()), Some(m(t)));
        }
        assert_eq!(next.get(b"gone"), None);
        assert_eq!(next, flat);
        assert_eq!(
            (next.len(), next.path_bytes(), next.deleted()),
            (flat.len(), flat.path_bytes(), flat.deleted())
        );
        // Shared records first: a/x, recorded anew once, stays with the new ones.
        let got: Vec<_> = next
            .by_dir()
            .records(b"a")
            .map(|(p, k)| (p.to_vec(), k))
            .collect();
        assert_eq!(got, vec![(b"a/y".to_vec(), m(3)), (b"a/x".to_vec(), m(2))]);
        let top: Vec<_> = next.by_dir().records(b"").map(|(p, _)| p.to_vec()).collect();
        assert_eq!(top, [&b"a"[..], b"new", b"b"]);
        // The old set is as it was.
        assert_eq!(old.get(b"gone"), Some(m(5)));
        assert_eq!(old.len(), 5);
        let mut after = Marks::next_of(&next);
        for (p, mark) in next.iter() {
            if p != b"a" {
                after.insert(p, mark);
            }
        }
        after.insert(b"a/y", m(30));
        flat.insert(b"a/y", m(30));
        let mut without_a = Marks::default();
        for (p, mark) in flat.iter().filter(|(p, _)| *p != b"a") {
            without_a.insert(p, mark);
        }
        assert_eq!(after, without_a);
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
