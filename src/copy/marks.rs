//! The baseline's records by path. A write-back looks up every entry of the tree once
//! and records it again, so a pass over 100,000 entries makes 200,000 lookups and
//! inserts: the paths live in one arena and the records in one vector, in the order
//! they were made (the walk's order, which the next pass nearly repeats), with an
//! open-addressing index over them. No allocation per path, and loading a saved
//! baseline is a copy of its bytes.
//!
//! The index hashes with std's `RandomState` (keyed SipHash): names come from the
//! application, and a hash a local user could collide on purpose would make every
//! pass quadratic.

use std::fmt;
use std::hash::{BuildHasher, RandomState};

use super::baseline::Mark;

/// Records by path; for a path recorded more than once the last record holds.
#[derive(Clone, Default)]
pub struct Marks {
    hasher: RandomState,
    paths: Vec<u8>,
    recs: Vec<Rec>,
    /// Index into `recs` plus one, 0 for a free slot; a power of two long (or empty),
    /// at most half full.
    slots: Vec<u32>,
}

#[derive(Clone, Copy)]
struct Rec {
    hash: u64,
    start: usize,
    len: usize,
    mark: Mark,
}

impl Marks {
    /// Room for `records` records of `bytes` path bytes in all, without growing.
    pub fn with_capacity(records: usize, bytes: usize) -> Marks {
        let mut marks = Marks {
            paths: Vec::with_capacity(bytes),
            recs: Vec::with_capacity(records),
            ..Marks::default()
        };
        marks.resize_index(records);
        marks
    }

    pub fn len(&self) -> usize {
        self.recs.len()
    }

    /// The bytes of all paths: what a copy of these records needs for them.
    pub fn path_bytes(&self) -> usize {
        self.paths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recs.is_empty()
    }

    pub fn get(&self, path: &[u8]) -> Option<&Mark> {
        let hash = self.hasher.hash_one(path);
        self.find(hash, path).ok().map(|i| &self.recs[i].mark)
    }

    /// Records `mark` for `path`, in place of an earlier record of it.
    pub fn insert(&mut self, path: &[u8], mark: Mark) {
        if (self.recs.len() + 1) * 2 > self.slots.len() {
            self.resize_index(self.recs.len() + 1);
        }
        let hash = self.hasher.hash_one(path);
        match self.find(hash, path) {
            Ok(i) => self.recs[i].mark = mark,
            Err(slot) => {
                let index = u32::try_from(self.recs.len() + 1)
                    .expect("fewer than 2^32 records: a tree cannot hold that many names");
                self.recs.push(Rec {
                    hash,
                    start: self.paths.len(),
                    len: path.len(),
                    mark,
                });
                self.paths.extend_from_slice(path);
                self.slots[slot] = index;
            }
        }
    }

    /// The records in the order their paths were first recorded.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Mark)> + '_ {
        self.recs.iter().map(|r| (self.path(r), &r.mark))
    }

    fn path(&self, r: &Rec) -> &[u8] {
        &self.paths[r.start..r.start + r.len]
    }

    /// The record of `path` (`Ok`), or the free slot where it belongs (`Err`). The
    /// index must have a free slot.
    fn find(&self, hash: u64, path: &[u8]) -> Result<usize, usize> {
        if self.slots.is_empty() {
            return Err(0);
        }
        let mask = self.slots.len() - 1;
        let mut i = hash as usize & mask;
        loop {
            match self.slots[i] {
                0 => return Err(i),
                s => {
                    let r = &self.recs[s as usize - 1];
                    if r.hash == hash && self.path(r) == path {
                        return Ok(s as usize - 1);
                    }
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// An index for at least `records` records at most half full, rebuilt from the
    /// stored hashes.
    fn resize_index(&mut self, records: usize) {
        let want = (records * 2).next_power_of_two().max(16);
        if want <= self.slots.len() {
            return;
        }
        self.slots = vec![0; want];
        let mask = want - 1;
        for (n, r) in self.recs.iter().enumerate() {
            let mut i = r.hash as usize & mask;
            while self.slots[i] != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = n as u32 + 1;
        }
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
        let got: Vec<_> = marks.iter().map(|(p, k)| (p.to_vec(), *k)).collect();
        assert_eq!(
            got,
            vec![
                (b"b".to_vec(), m(3)),
                (b"a".to_vec(), m(5)),
                (b"a/x".to_vec(), m(4))
            ]
        );
        assert_eq!(marks.get(b"a/x"), Some(&m(4)));
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
            assert_eq!(grown.get(p), Some(&m(i as i64)));
        }
        assert_eq!(grown, sized);
        sized.insert(&paths[7], m(-1));
        assert_ne!(grown, sized);
        let mut fewer = grown.clone();
        fewer.insert(b"extra", m(0));
        assert_ne!(grown, fewer);
        assert_ne!(fewer, grown);
    }
}
