//! The write-back's baseline: what the disk directory held, entry by entry, when the
//! two sides were last known to agree (at the seed, and after every write-back). The
//! write-back is a three-way merge against it ([`decide`]), never a mirror: only a
//! baseline tells "the application deleted it in RAM" from "the application created
//! it on disk while the tmpfs hid the directory".
//!
//! The RAM side needs no per-entry record: the baseline also keeps the moment it was
//! taken, and a RAM entry changed since has a ctime at or after it (the tmpfs is
//! private to tmpfsctl until that moment: it is taken before the seeded tmpfs is moved
//! into place, and at the start of each write-back pass).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use nix::sys::stat::FileStat;

/// `(seconds, nanoseconds)` since the epoch, on the clock inode ctimes use.
pub type Time = (i64, i64);

const MAGIC: &[u8] = b"tmpfsctl-baseline\n";
/// The format this build writes; it reads it and older ones, and refuses a newer one
/// rather than guess at it. Format 3 lacks [`Baseline::listed_after`] (read as
/// `None`); format 2 also has a bytewise FNV-1a checksum, which took longer than the
/// rest of a load.
pub const FORMAT: u32 = 4;

/// A disk entry as the baseline saw it: enough to tell whether it changed since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sig {
    pub ino: u64,
    /// Type and permission bits.
    pub mode: u32,
    pub size: i64,
    pub mtime: Time,
    pub ctime: Time,
}

impl Sig {
    pub fn of(st: &FileStat) -> Sig {
        // `st_mode` is u32 and the time fields i64 on every Linux target.
        #[allow(clippy::unnecessary_cast)]
        Sig {
            ino: st.st_ino as u64,
            mode: st.st_mode as u32,
            size: st.st_size as i64,
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as i64),
        }
    }

    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }

    /// The same type, mode, size and mtime: the same version by what a copy keeps of
    /// it (another inode, and its own ctime).
    pub fn same_version(&self, now: &Sig) -> bool {
        (self.mode, self.size, self.mtime) == (now.mode, now.size, now.mtime)
    }

    /// The same inode with the same type, mode, size and mtime: what a rename leaves
    /// of it (it changes the ctime).
    pub fn same_but_ctime(&self, now: &Sig) -> bool {
        self.ino == now.ino && self.same_version(now)
    }

    /// Whether `now` is still this entry. A directory counts as the same while it is
    /// the same directory inode: its times change with every name added or removed,
    /// which the merge of its contents looks at one by one.
    pub fn unchanged(&self, now: &Sig) -> bool {
        if self.is_dir() || now.is_dir() {
            return self.is_dir() && now.is_dir() && self.ino == now.ino;
        }
        self == now
    }
}

/// The current time on the clock inode ctimes use (at most a tick behind them).
pub fn now_coarse() -> Time {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_REALTIME_COARSE)
        .map(|t| (t.tv_sec(), t.tv_nsec()))
        .expect("CLOCK_REALTIME_COARSE exists on every Linux since 2.6.32")
}

/// A time on the clock inode ctimes use such that every change made before this is
/// called has a ctime before it, and every change made after it returns one at or
/// after it.
///
/// Inode ctimes come from the coarse realtime clock, or, with multigrain timestamps
/// (Linux 6.13 and later, on tmpfs and ext4 among others), from the fine-grained clock
/// for a change that follows a stat of the inode; never from below the coarse clock. A
/// fine-grained ctime may be ahead of the coarse clock by a tick or more (longer on a
/// tickless idle CPU). So the fine-grained time is read first, and the coarse clock
/// is waited for until it has passed that (a few milliseconds).
pub fn now_after_tick() -> Time {
    use nix::time::{clock_gettime, ClockId};
    let fine = clock_gettime(ClockId::CLOCK_REALTIME)
        .map(|t| (t.tv_sec(), t.tv_nsec()))
        .expect("CLOCK_REALTIME exists everywhere");
    // A tick is 1 to 10 ms; 100 ms covers a stalled clock without hanging.
    for _ in 0..200 {
        let now = now_coarse();
        if now > fine {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    now_coarse()
}

/// One path's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Both sides held this; the disk entry looked like this.
    Entry(Sig),
    /// The disk side deleted it at (or before) this time, while the RAM still has an
    /// older version: kept, so that version does not come back later.
    Deleted(Time),
    /// The disk side's newer version (looking like this) won over the RAM's older one,
    /// which the RAM still has: the disk side is followed until the RAM changes it
    /// after that version's ctime.
    DiskWon(Sig),
    /// Only in a journal: a pass was about to rename this inode into place (its ctime
    /// is the one before the rename). Found there, both sides agree; not found, the
    /// name is unknown (the rename may never have happened).
    Placing(Sig),
}

pub use super::marks::{ByDir, Marks};

/// Paths are relative to the synced root, `/`-separated, without a leading `/`; the
/// root itself has no record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Baseline {
    /// When it was taken: RAM entries with a ctime at or after it changed since. `None`
    /// for no baseline at all (a mount of an older tmpfsctl, a lost state directory):
    /// the merge then deletes nothing and lets the newer side of every pair win.
    pub taken: Option<Time>,
    /// Every directory record with a ctime before this was read from the disk at or
    /// after it, so a later change of that directory gives it another ctime (see
    /// [`Baseline::unchanged_dir`]). `None`: no record is known to be, as after a seed,
    /// which reads the disk before it knows its time.
    pub listed_after: Option<Time>,
    /// By path: looked up once per entry of the tree each pass, so hashed.
    pub marks: Marks,
    /// For a [`Mark::Placing`] from a journal: the record it replaced, which holds
    /// if the placing never happened. Not saved (a saved baseline has no `Placing`).
    pub placing_before: HashMap<Box<[u8]>, Mark>,
    /// Records of an interrupted pass's journal were replayed into it: what they
    /// establish is saved only with the next baseline. Not saved.
    pub replayed: bool,
    /// The disk inodes an interrupted pass's journal says it unlinked, replaced or
    /// linked a name of while others stayed (see
    /// [`Merge::touched`](super::Merge::touched)). Not saved.
    pub touched: std::collections::HashSet<u64>,
    /// The disk directories an interrupted pass's journal says it made, by
    /// [`super::journal::made_key`]. Not saved.
    pub made: std::collections::HashSet<Box<[u8]>>,
}

impl Baseline {
    pub fn none() -> Baseline {
        Baseline::default()
    }

    pub fn get(&self, path: &[u8]) -> Option<Mark> {
        self.marks.get(path)
    }

    /// Whether the disk directory at `path`, which looks like `now`, has the names it
    /// had when its record was read: the record is trusted and equal to `now`. A name
    /// added, removed or renamed sets the directory's ctime to the current time, which
    /// is at or after `listed_after`, so never back to a trusted record's ctime. (A
    /// file changed in place does not change its directory: a caller that trusts the
    /// names still stats what it must compare.)
    pub fn unchanged_dir(&self, path: &[u8], now: &Sig) -> bool {
        match (self.listed_after, self.get(path)) {
            (Some(after), Some(Mark::Entry(sig))) => sig.is_dir() && sig.ctime < after && sig == *now,
            _ => false,
        }
    }

    /// The records of everything below `dir` (not `dir` itself), in no order. A scan
    /// of all records: only needed for a subtree a pass did not walk.
    pub fn below<'a>(&'a self, dir: &[u8]) -> impl Iterator<Item = (&'a [u8], Mark)> + 'a {
        let mut prefix = dir.to_vec();
        prefix.push(b'/');
        self.marks.iter().filter(move |(p, _)| p.starts_with(&prefix))
    }

    /// The saved form, as [`Baseline::save`] writes it.
    #[cfg(test)]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out).expect("writing to a Vec cannot fail");
        out
    }

    /// Writes the saved form to `out` a record at a time: a million records take
    /// about 70 MiB saved, which need not be in memory beside them.
    fn write_to(&self, out: impl Write) -> std::io::Result<()> {
        // The checksum starts from the length: each record is its path's length, the
        // path, a kind and a time or a `Sig`.
        let (n, deleted) = (self.marks.len(), self.marks.deleted());
        let records = 5 * n + self.marks.path_bytes() + 16 * deleted + SIG_LEN * (n - deleted);
        let mut out = Summing {
            out,
            sum: Sum64::new((HEADER_LEN + records) as u64),
        };
        let mut buf = Vec::with_capacity(HEADER_LEN);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&FORMAT.to_le_bytes());
        for t in [self.taken, self.listed_after] {
            let (has, t) = match t {
                Some(t) => (1u8, t),
                None => (0, (0, 0)),
            };
            buf.push(has);
            put_time(&mut buf, t);
        }
        buf.extend_from_slice(&(self.marks.len() as u64).to_le_bytes());
        out.write_all(&buf)?;
        // In the order they were made, which the next pass's walk nearly repeats.
        // In pieces of 64 KiB: the checksum is fastest over long runs.
        buf.clear();
        for (path, mark) in self.marks.iter() {
            put_record(&mut buf, path, &mark);
            if buf.len() >= 1 << 16 {
                out.write_all(&buf)?;
                buf.clear();
            }
        }
        out.write_all(&buf)?;
        let sum = out.sum.finish();
        out.out.write_all(&sum.to_le_bytes())
    }

    /// Reads what [`Baseline::encode`] wrote.
    #[cfg(test)]
    pub fn decode(data: &[u8]) -> Result<Baseline, BaselineError> {
        Baseline::read_from(data, data.len() as u64)
    }

    /// Reads the saved form from `input`, `len` bytes long, a record at a time. The
    /// checksum is compared at the end; when it does not match, that is the error,
    /// whatever else was found wrong on the way.
    fn read_from(input: impl Read, len: u64) -> Result<Baseline, BaselineError> {
        let body_len = len.checked_sub(8).ok_or(BaselineError::Corrupt("truncated"))?;
        let mut r = BodyReader {
            input,
            left: body_len,
            buf: Vec::new(),
            sum: None,
        };
        if r.take(MAGIC.len())? != MAGIC {
            return Err(BaselineError::Corrupt("not a baseline file"));
        }
        let format = u32::from_le_bytes(r.array()?);
        if format > FORMAT {
            return Err(BaselineError::Newer(format));
        }
        let mut sum = if format >= 3 {
            Checksum::Words(Sum64::new(body_len))
        } else {
            Checksum::Bytes(FNV_BASIS)
        };
        sum.update(MAGIC);
        sum.update(&format.to_le_bytes());
        r.sum = Some(sum);
        let read = Baseline::read_records(&mut r, format);
        // The rest of the body, when reading stopped early, for the checksum.
        while r.left > 0 {
            r.take(r.left.min(1 << 16) as usize)?;
        }
        let mut stored = [0; 8];
        r.input.read_exact(&mut stored).map_err(BaselineError::Io)?;
        let sum = r.sum.take().expect("set above").finish();
        if sum.to_le_bytes() != stored {
            return Err(BaselineError::Corrupt("checksum mismatch"));
        }
        read
    }

    /// Everything after the format.
    fn read_records(r: &mut BodyReader<impl Read>, format: u32) -> Result<Baseline, BaselineError> {
        let has = r.take(1)?[0];
        let t = r.time()?;
        let taken = (has == 1).then_some(t);
        let listed_after = if format >= 4 {
            let has = r.take(1)?[0];
            let t = r.time()?;
            (has == 1).then_some(t)
        } else {
            None
        };
        let count = u64::from_le_bytes(r.array()?);
        // Every record is 4 bytes of length and 17 of payload besides its path.
        let count = usize::try_from(count)
            .ok()
            .filter(|&n| n as u64 <= r.left / 21)
            .ok_or(BaselineError::Corrupt("record count"))?;
        // Paths and payloads: more than the records take packed (see `Marks`).
        let bytes = usize::try_from(r.left).unwrap_or(usize::MAX) - count * 21;
        let mut marks = Marks::with_capacity(count, bytes);
        // Read in pieces of 64 KiB (the checksum is fastest over long runs), a record
        // that runs over the end of one completed from the next.
        let (mut piece, mut at) = (Vec::new(), 0);
        for _ in 0..count {
            loop {
                let mut rr = RecordReader(&piece[at..]);
                match rr.record() {
                    Ok((path, mark)) => {
                        at = piece.len() - rr.0.len();
                        marks.insert(path, mark);
                        break;
                    }
                    Err(BaselineError::Corrupt("truncated")) if r.left > 0 => {
                        piece.drain(..at);
                        at = 0;
                        let more = r.left.min(1 << 16) as usize;
                        piece.extend_from_slice(r.take(more)?);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if at < piece.len() || r.left > 0 {
            return Err(BaselineError::Corrupt("trailing bytes"));
        }
        Ok(Baseline {
            taken,
            listed_after,
            marks,
            placing_before: HashMap::new(),
            replayed: false,
            touched: Default::default(),
            made: Default::default(),
        })
    }

    /// Reads the baseline at `path`; `Ok(None)` when there is none.
    pub fn load(path: &Path) -> Result<Option<Baseline>, BaselineError> {
        match open_nofollow(path) {
            Ok(f) => {
                let len = f.metadata().map_err(BaselineError::Io)?.len();
                Baseline::read_from(std::io::BufReader::new(f), len).map(Some)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(BaselineError::Io(e)),
        }
    }

    /// Writes it durably in place of the old one: temporary, `fsync`, rename, `fsync`
    /// of the directory. A crash leaves the old or the new baseline, both safe to
    /// merge against (the merge never trusts a baseline to be current).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        write_durably_with(path, |f| {
            let mut out = std::io::BufWriter::new(f);
            self.write_to(&mut out)?;
            out.flush()
        })
    }
}

/// The contents of the file at `path`, never through a symlink in its last component
/// (tmpfsctl's own records: a link planted there is refused, not followed).
pub fn read_nofollow(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::new();
    open_nofollow(path)?.read_to_end(&mut data)?;
    Ok(data)
}

/// The regular file at `path`, opened for reading, never through a symlink in its
/// last component.
fn open_nofollow(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(f)
}

/// Temporary file (created fresh, never through a symlink), `fsync`, rename over
/// `path`, `fsync` of the directory: readers and a power cut see the old or the new
/// content.
pub fn write_durably(path: &Path, data: &[u8]) -> std::io::Result<()> {
    write_durably_with(path, |f| f.write_all(data))
}

/// [`write_durably`] with the content written by `write`.
fn write_durably_with(
    path: &Path,
    write: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp~{}", std::process::id()));
    let tmp = dir.join(name);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = write(&mut f).and_then(|()| f.sync_all());
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir)?.sync_all()
}

#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error("the baseline is damaged ({0})")]
    Corrupt(&'static str),
    #[error("the baseline has format {0}, newer than this tmpfsctl's {FORMAT}: use the tmpfsctl that wrote it, or a newer one")]
    Newer(u32),
    #[error("cannot read the baseline: {0}")]
    Io(std::io::Error),
}

/// One path's record: length, path bytes, kind, payload.
pub(super) fn put_record(out: &mut Vec<u8>, path: &[u8], mark: &Mark) {
    out.extend_from_slice(&(path.len() as u32).to_le_bytes());
    out.extend_from_slice(path);
    match mark {
        Mark::Entry(s) => {
            out.push(0);
            s.put(out);
        }
        Mark::Deleted(at) => {
            out.push(1);
            put_time(out, *at);
        }
        Mark::DiskWon(s) => {
            out.push(2);
            s.put(out);
        }
        Mark::Placing(s) => {
            out.push(3);
            s.put(out);
        }
    }
}

pub(super) fn put_time(out: &mut Vec<u8>, t: Time) {
    out.extend_from_slice(&t.0.to_le_bytes());
    out.extend_from_slice(&t.1.to_le_bytes());
}

impl Sig {
    pub(super) fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ino.to_le_bytes());
        out.extend_from_slice(&self.mode.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        put_time(out, self.mtime);
        put_time(out, self.ctime);
    }
}

pub(super) struct RecordReader<'a>(pub(super) &'a [u8]);

impl<'a> RecordReader<'a> {
    /// What [`put_record`] wrote.
    pub(super) fn record(&mut self) -> Result<(&'a [u8], Mark), BaselineError> {
        let len = u32::from_le_bytes(self.array()?) as usize;
        let path = self.take(len)?;
        let mark = match self.take(1)?[0] {
            0 => Mark::Entry(self.sig()?),
            1 => Mark::Deleted(self.time()?),
            2 => Mark::DiskWon(self.sig()?),
            3 => Mark::Placing(self.sig()?),
            _ => return Err(BaselineError::Corrupt("unknown record")),
        };
        Ok((path, mark))
    }

    pub(super) fn sig(&mut self) -> Result<Sig, BaselineError> {
        Ok(Sig {
            ino: u64::from_le_bytes(self.array()?),
            mode: u32::from_le_bytes(self.array()?),
            size: i64::from_le_bytes(self.array()?),
            mtime: self.time()?,
            ctime: self.time()?,
        })
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], BaselineError> {
        if self.0.len() < n {
            return Err(BaselineError::Corrupt("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], BaselineError> {
        Ok(self.take(N)?.try_into().expect("take returned N bytes"))
    }

    pub(super) fn time(&mut self) -> Result<Time, BaselineError> {
        Ok((
            i64::from_le_bytes(self.array()?),
            i64::from_le_bytes(self.array()?),
        ))
    }
}

const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// The saved form's header: magic, format, `taken` and `listed_after` (a flag and
/// two i64 each), the record count.
const HEADER_LEN: usize = MAGIC.len() + 4 + 2 * 17 + 8;
/// A saved [`Sig`]: ino, mode, size, mtime, ctime.
const SIG_LEN: usize = 8 + 4 + 8 + 16 + 16;

/// FNV-1a: the checksum of the state's small binary records (and of format-2
/// baselines).
pub fn fnv1a(data: &[u8]) -> u64 {
    fnv1a_from(FNV_BASIS, data)
}

fn fnv1a_from(h: u64, data: &[u8]) -> u64 {
    data.iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME))
}

/// The checksum of a baseline (megabytes for a large tree): FNV's multiply-xor a word
/// at a time, each step folding the high half down so every bit reaches the rest, and
/// the length mixed in. It detects damage, it authenticates nothing.
pub fn sum64(data: &[u8]) -> u64 {
    let mut sum = Sum64::new(data.len() as u64);
    sum.update(data);
    sum.finish()
}

/// [`sum64`] fed piece by piece, of data whose length is known beforehand.
struct Sum64 {
    h: u64,
    /// The bytes of a word not complete yet.
    pending: [u8; 8],
    pending_len: usize,
}

impl Sum64 {
    fn new(len: u64) -> Sum64 {
        Sum64 {
            h: FNV_BASIS ^ len,
            pending: [0; 8],
            pending_len: 0,
        }
    }

    fn step(&mut self, word: [u8; 8]) {
        let h = (self.h ^ u64::from_le_bytes(word)).wrapping_mul(FNV_PRIME);
        self.h = h ^ (h >> 32);
    }

    fn update(&mut self, mut data: &[u8]) {
        if self.pending_len > 0 {
            let n = data.len().min(8 - self.pending_len);
            self.pending[self.pending_len..self.pending_len + n].copy_from_slice(&data[..n]);
            self.pending_len += n;
            data = &data[n..];
            if self.pending_len < 8 {
                return;
            }
            self.step(self.pending);
            self.pending_len = 0;
        }
        let mut words = data.chunks_exact(8);
        for w in &mut words {
            self.step(w.try_into().expect("chunks of 8"));
        }
        let rest = words.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.pending_len = rest.len();
    }

    /// The last word, padded with zeros (a whole one of zeros if none is left).
    fn finish(mut self) -> u64 {
        self.pending[self.pending_len..].fill(0);
        self.step(self.pending);
        self.h
    }
}

/// The checksum of a baseline being read: [`sum64`], or [`fnv1a`] before format 3.
enum Checksum {
    Words(Sum64),
    Bytes(u64),
}

impl Checksum {
    fn update(&mut self, data: &[u8]) {
        match self {
            Checksum::Words(s) => s.update(data),
            Checksum::Bytes(h) => *h = fnv1a_from(*h, data),
        }
    }

    fn finish(self) -> u64 {
        match self {
            Checksum::Words(s) => s.finish(),
            Checksum::Bytes(h) => h,
        }
    }
}

/// A writer that checksums what passes through it.
struct Summing<W> {
    out: W,
    sum: Sum64,
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.sum.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Reads a saved baseline's body (all but the checksum) in pieces, checksumming them
/// once the format is known.
struct BodyReader<R> {
    input: R,
    /// Body bytes not read yet.
    left: u64,
    buf: Vec<u8>,
    sum: Option<Checksum>,
}

impl<R: Read> BodyReader<R> {
    fn take(&mut self, n: usize) -> Result<&[u8], BaselineError> {
        if self.left < n as u64 {
            return Err(BaselineError::Corrupt("truncated"));
        }
        self.buf.resize(n, 0);
        self.input.read_exact(&mut self.buf).map_err(BaselineError::Io)?;
        self.left -= n as u64;
        if let Some(sum) = &mut self.sum {
            sum.update(&self.buf);
        }
        Ok(&self.buf)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], BaselineError> {
        Ok(self.take(N)?.try_into().expect("take returned N bytes"))
    }

    fn time(&mut self) -> Result<Time, BaselineError> {
        Ok((
            i64::from_le_bytes(self.array()?),
            i64::from_le_bytes(self.array()?),
        ))
    }
}

/// The RAM (source) side of one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ram {
    Absent,
    /// Present, with its ctime.
    Present(Time),
}

/// The disk (destination) side of one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disk {
    Absent,
    Present(Sig),
}

/// What the merge does with one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The RAM side wins: the disk entry is made equal to it (written, updated, or
    /// deleted when the RAM has none). A name the disk lacks is put in place only if
    /// it still lacks it.
    Ram,
    /// The disk side wins and stays exactly as it is; `Some(t)`: it is a deletion,
    /// remembered in the next baseline as [`Mark::Deleted`] at `t`.
    Disk(Option<Time>),
    /// Neither side has it: nothing to do, nothing to remember.
    Gone,
}

/// Whether both sides changed since the baseline: a conflict, decided for the side
/// that changed later (the disk on a tie), and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    pub conflict: bool,
}

/// The three-way rule for one name (see docs/writeback.md for the table).
///
/// - `mark`: the baseline's record of the name; `since`: when the baseline was taken.
/// - `ram_in_place`: no RAM directory above the name was moved since the baseline,
///   so a RAM entry with a ctime before it was at this path then.
/// - `ram_deleted_at`, `disk_deleted_at`: when a side that lacks the name deleted it,
///   as far as can be told: the ctime of the directory it was in, as the pass found it
///   (a deletion changes it; so may later changes, which makes a deletion look later,
///   never earlier).
///
/// The rules: a side that did not change since the baseline follows the side that did;
/// a name in no baseline is never deleted; when both changed, the later change wins.
pub fn decide(
    mark: Option<&Mark>,
    since: Option<Time>,
    ram: Ram,
    ram_in_place: bool,
    disk: Disk,
    ram_deleted_at: Time,
    disk_deleted_at: Time,
) -> Decision {
    let plain = |verdict| Decision {
        verdict,
        conflict: false,
    };
    let conflict = |ram_at: Time, disk_at: Time, disk_gone: bool| Decision {
        verdict: if ram_at > disk_at {
            Verdict::Ram
        } else {
            Verdict::Disk(disk_gone.then_some(disk_at))
        },
        conflict: true,
    };
    // Unchanged only where it was at this path then: one moved in with a RAM
    // directory above it keeps its old ctime.
    let ram_changed = |at: Time| !ram_in_place || since.is_none_or(|s| at >= s);
    match (mark, ram, disk) {
        (_, Ram::Absent, Disk::Absent) => plain(Verdict::Gone),
        // In no baseline: nothing is deleted, and of two versions the newer wins.
        (None, Ram::Present(_), Disk::Absent) => plain(Verdict::Ram),
        (None, Ram::Absent, Disk::Present(_)) => plain(Verdict::Disk(None)),
        (None, Ram::Present(r), Disk::Present(d)) => Decision {
            verdict: if r > d.ctime {
                Verdict::Ram
            } else {
                Verdict::Disk(None)
            },
            conflict: false,
        },
        // A journal's `Placing` is resolved against the disk before; as a fallback it
        // counts as an entry.
        (Some(Mark::DiskWon(won)), ram, disk) => {
            // The disk's version `won` was the newer one: the RAM wins again only with a
            // change made after it. Decided by times alone, so the record holds against
            // any baseline time (it may come from the journal of an interrupted pass).
            let disk_changed = match disk {
                Disk::Present(d) => !won.unchanged(&d),
                Disk::Absent => true,
            };
            let (disk_at, disk_gone) = match disk {
                Disk::Present(d) => (d.ctime, false),
                Disk::Absent => (disk_deleted_at, true),
            };
            let ram_at = match ram {
                Ram::Present(r) => r,
                Ram::Absent => ram_deleted_at,
            };
            // The disk's version may be older than the RAM's that lost to it (a
            // directory moved in on disk keeps its files' ctimes): a RAM entry
            // unchanged since the baseline at this path has not changed since it
            // lost either.
            if ram_at <= won.ctime || !ram_changed(ram_at) {
                plain(Verdict::Disk(disk_gone.then_some(disk_at)))
            } else if !disk_changed {
                plain(Verdict::Ram)
            } else {
                conflict(ram_at, disk_at, disk_gone && ram != Ram::Absent)
            }
        }
        (Some(Mark::Entry(base) | Mark::Placing(base)), ram, disk) => {
            let disk_changed = match disk {
                Disk::Present(d) => !base.unchanged(&d),
                Disk::Absent => true,
            };
            let disk_at = match disk {
                Disk::Present(d) => d.ctime,
                Disk::Absent => disk_deleted_at,
            };
            let disk_gone = disk == Disk::Absent;
            match ram {
                _ if !disk_changed => plain(Verdict::Ram),
                Ram::Present(r) if ram_changed(r) => conflict(r, disk_at, disk_gone),
                Ram::Present(_) => plain(Verdict::Disk(disk_gone.then_some(disk_at))),
                Ram::Absent => conflict(ram_deleted_at, disk_at, false),
            }
        }
        (Some(Mark::Deleted(at)), Ram::Present(r), Disk::Absent) => {
            if ram_changed(r) {
                conflict(r, *at, true)
            } else {
                plain(Verdict::Disk(Some(*at)))
            }
        }
        (Some(Mark::Deleted(_)), Ram::Present(r), Disk::Present(d)) => {
            if ram_changed(r) {
                conflict(r, d.ctime, false)
            } else {
                plain(Verdict::Disk(None))
            }
        }
        // The disk made the name again, the RAM deleted its older version: the
        // later change wins (the disk's version is then the disk's own, unrecorded).
        (Some(Mark::Deleted(_)), Ram::Absent, Disk::Present(d)) => conflict(ram_deleted_at, d.ctime, false),
    }
}

#[cfg(test)]
mod tests;
