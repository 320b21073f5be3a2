//! What the merge decides for one name (through [`baseline::decide`]) and what the next
//! baseline and the journal record of it.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use nix::fcntl::AtFlags;
use nix::sys::stat::{self, FileStat};

use crate::copy::baseline::{self, Decision, Disk, Mark, Ram, Sig, Time, Verdict};
use crate::copy::error::{dst_err, journal_err, Failed};
use crate::copy::journal::made_key;
use crate::copy::ops::{born, file_type};
use crate::copy::settle::UNTRUSTED;

use super::{ctime, Frame, Syncer, Tentative, Went};

impl Syncer<'_, '_> {
    /// The rule's verdict for one name of the directory `frame` (see [`baseline::decide`])
    /// between the RAM's entry `src` and the disk's `disk`; conflicts are counted.
    pub(super) fn decide(
        &mut self,
        path: &[u8],
        src: Option<&FileStat>,
        disk: Option<&FileStat>,
        frame: &Frame,
    ) -> Verdict {
        let ram = src.map_or(Ram::Absent, |s| Ram::Present(ctime(s)));
        let disk = disk.map_or(Disk::Absent, |d| Disk::Present(self.disk_sig(path, d, src)));
        let mut mark = self.base_mark(path, disk);
        if let (None, Disk::Absent, Ram::Present(_)) = (mark, disk, ram) {
            // Not in the baseline, but gone from the disk: below a directory the disk
            // deleted, or seen deleted while the application worked there.
            mark = match &frame.tentative {
                Some(Tentative {
                    went: Went::Before,
                    at,
                    ..
                }) => Some(Mark::Deleted(*at)),
                // A merge into a seed's copy: what the seed copied there went with the
                // directory the application removed, even where no deletion of its own
                // was seen (moved away before: a directory moved out of it and its
                // parent removed came back at the old path, a review helper's probe).
                Some(Tentative {
                    went: Went::Meanwhile,
                    at,
                    ..
                }) if self.copied.is_some_and(|c| c.get(path).is_some()) => Some(Mark::Deleted(*at)),
                Some(Tentative {
                    went: Went::Moved(to),
                    at,
                    ..
                }) if leaf_name(path).is_some_and(|n| to.iter().any(|d| holds(d.as_fd(), &n))) => {
                    Some(Mark::Deleted(*at))
                }
                _ => leaf_name(path)
                    .and_then(|name| frame.dst.deleted(self.deletions?, &name))
                    .map(Mark::Deleted),
            };
        }
        if let (None, Disk::Absent, Some(s)) = (mark, disk, src) {
            // A merge into a seed's copy: the copy was there, and the source has not
            // changed since, so the application deleted or moved it, even where no
            // deletion of that name was seen (a directory moved away with it, and its
            // parent removed: under load the parent's removal and the source's last
            // change fell in one clock tick, and the copy came back at its old path).
            if let Some(taken) = self
                .copied_as(path, &Sig::of(s))
                .and(self.copied.and_then(|c| c.taken))
            {
                mark = Some(Mark::Deleted(taken));
            }
        }
        let outdated = mark.is_none()
            && match src {
                Some(_) => self.copy_outdated(path, src, disk),
                None => self.copy_deleted(path, disk),
            };
        let d = if outdated {
            Decision {
                verdict: Verdict::Ram,
                conflict: false,
            }
        } else {
            baseline::decide(
                mark.as_ref(),
                self.base.taken,
                ram,
                frame.ram_kept || src.is_some_and(|s| agreed_as(mark.as_ref(), s)),
                disk,
                frame.ram_deleted_at,
                frame.disk_deleted_at,
            )
        };
        if d.conflict {
            self.reporter.stats.conflicts += 1;
        }
        tracing::debug!(
            "write-back: {}: record {mark:?}, RAM {ram:?}, disk {disk:?}{}: {:?}",
            String::from_utf8_lossy(path),
            if outdated {
                ", the disk side a copy of an older version"
            } else {
                ""
            },
            d.verdict
        );
        d.verdict
    }

    /// In a merge into a seed's fresh copy ([`super::Merge::copied`]): whether the
    /// destination entry (`disk`) at `path` is the seed's copy, unchanged since, of a
    /// source entry (`src`) that changed after it was copied. The source's version is
    /// then the newer one, whatever the two ctimes say: the copy's ctime is when the
    /// copy was made, which can fall in the clock tick of the source's later change,
    /// or after it where the two filesystems' timestamps differ in grain.
    ///
    /// A copy the application moved to this path in RAM since has another record's.
    /// Directories are left to their times: a verdict only decides their metadata.
    fn copy_outdated(&self, path: &[u8], src: Option<&FileStat>, disk: Disk) -> bool {
        let (Some(src), Disk::Present(d)) = (src, disk) else {
            return false;
        };
        self.copied_as(path, &d)
            .is_some_and(|was| !was.is_dir() && Sig::of(src) != was)
    }

    /// In a merge into a seed's fresh copy: whether the destination entry (`disk`) at
    /// `path`, which the source lacks, is the seed's copy, unchanged since (as in
    /// [`Self::copy_outdated`]), of a source entry deleted (or renamed away) after it
    /// was copied: that deletion is the later change. A directory the seed copied
    /// there counts while unchanged since (no name made or removed in it, not moved
    /// there): it is emptied by the same rule, name by name. One changed since is the
    /// application's, with all it holds: a directory moved in keeps the older ctimes
    /// of its files. The seed's watch for deletions misses what is deleted
    /// between its last look and the switch.
    pub(super) fn copy_deleted(&self, path: &[u8], disk: Disk) -> bool {
        let Disk::Present(d) = disk else {
            return false;
        };
        if d.is_dir() {
            let Some(copied) = self.copied else {
                return false;
            };
            return copied.taken.is_some_and(|t| d.ctime < t)
                && matches!(copied.get(path), Some(Mark::Entry(was)) if was.is_dir());
        }
        self.copied_as(path, &d).is_some_and(|was| !was.is_dir())
    }

    /// What the seed recorded copying to `path`, if the destination entry there (`d`)
    /// is that copy, unchanged: with the type, mode, size and mtime of what the seed
    /// recorded, whatever its ctime. The application may have changed that since the
    /// switch without writing the file (a `chmod` to the same mode, a hard link made
    /// and removed as a lock, a rename away and back): it then still holds the seed's
    /// version, and a rewrite the disk got after the copy is the newer one (a review
    /// helper's probes lost that rewrite, the copy's ctime taken for the later
    /// change).
    fn copied_as(&self, path: &[u8], d: &Sig) -> Option<Sig> {
        let copied = self.copied?;
        let Some(Mark::Entry(was)) = copied.get(path) else {
            return None;
        };
        was.same_version(d).then_some(was)
    }

    /// The baseline's record of `path`, as the disk entry found there (`disk`) makes
    /// it: a name an interrupted pass was putting in place counts as agreed on if it
    /// is there, and as unknown if not.
    pub(super) fn base_mark(&self, path: &[u8], disk: Disk) -> Option<Mark> {
        match self.base.get(path) {
            Some(Mark::Placing(sig)) => match disk {
                Disk::Present(d) if sig.same_but_ctime(&d) => Some(Mark::Entry(d)),
                _ => self.base.placing_before.get(path).copied(),
            },
            other => other,
        }
    }

    /// How the disk entry at `path` compares with the baseline (`src`: the RAM's
    /// entry there, if any): a ctime only a change of the inode's other names caused
    /// is not a change of this one.
    ///
    /// Such a change is this pass's own (it unlinked or replaced another name of the
    /// inode: `touched`), or the application's on another name of a file the
    /// baseline knows under several: it removed, renamed or linked `d/b` on disk
    /// after the switch while the RAM rewrote `d/a`, and that ctime counted as the
    /// disk's later change of `d/a`, so the RAM's rewrite was lost (a hunting
    /// helper's probe). A `chown` looks the same to the ctime: where the RAM has the
    /// name, the owners tell; where it has not, only a link change seen on disk is
    /// excused ([`Self::link_changed`]), so a `chown` of a name the RAM deleted stands
    /// (review helpers' probes found both ways of getting it wrong: the owner change
    /// hidden, and a rewrite lost to a link made and removed again, or to a name
    /// outside the tree). Whether agreed on or the disk's version that won, the
    /// record's ctime stands while the file is still that version. A link or unlink
    /// never changes a file's size or mtime, so a file written since is the
    /// application's change (a retry after a kill took its write for the pass's and
    /// lost it, once the touched inodes were journaled: a hunting helper's probe).
    pub(super) fn disk_sig(&self, path: &[u8], d: &FileStat, src: Option<&FileStat>) -> Sig {
        let mut sig = Sig::of(d);
        if let Some(Mark::Entry(base) | Mark::DiskWon(base)) = self.base.get(path) {
            if base.ino == sig.ino
                && base.ctime != sig.ctime
                && base.same_version(&sig)
                && !sig.is_dir()
                && (self.touched.contains(&sig.ino) || self.linked_unchanged(path, d, src))
            {
                sig.ctime = base.ctime;
            }
        }
        sig
    }

    /// Whether the disk file `d` at `path`, new ctime and all, is the version the
    /// baseline recorded, under names of which it has more than one: with the RAM's
    /// owner where the RAM has the name, else only after a link change on disk.
    fn linked_unchanged(&self, path: &[u8], d: &FileStat, src: Option<&FileStat>) -> bool {
        if !self.linked_in_base().contains_key(&d.st_ino) {
            return false;
        }
        match src {
            Some(s) => (s.st_uid, s.st_gid) == (d.st_uid, d.st_gid),
            None => self.link_changed(path, d),
        }
    }

    /// Whether the disk inode `d` at `path`, which the baseline records under other
    /// names too, lost or gained a name since: its link count is not the number of
    /// those names, or one of them no longer holds it.
    fn link_changed(&self, path: &[u8], d: &FileStat) -> bool {
        // `st_ino` and `st_nlink` are u64 on every 64-bit Linux target.
        #[allow(clippy::unnecessary_cast)]
        let (ino, links) = (d.st_ino as u64, d.st_nlink as u64);
        let Some(names) = self.linked_in_base().get(&ino) else {
            return false;
        };
        let holds = |n: &[u8]| {
            let rel = std::path::Path::new(std::ffi::OsStr::from_bytes(n));
            crate::copy::settle::beneath(self.dst_root.as_fd(), rel, nix::fcntl::OFlag::O_PATH)
                .and_then(|fd| stat::fstat(&fd))
                .is_ok_and(|st| st.st_ino == d.st_ino)
        };
        names.len() as u64 != links || names.iter().filter(|n| &***n != path).any(|n| !holds(n))
    }

    /// The disk inodes of files the baseline records under two names or more, with
    /// those names. Two scans: the inodes alone first (8 bytes a record, sorted), then
    /// the names of the few that repeat.
    fn linked_in_base(&self) -> &HashMap<u64, Vec<Box<[u8]>>> {
        self.linked.get_or_init(|| {
            let file_ino = |mark: Mark| match mark {
                Mark::Entry(s) | Mark::DiskWon(s) if !s.is_dir() => Some(s.ino),
                _ => None,
            };
            let mut inos: Vec<u64> = self.base.marks.iter().filter_map(|(_, m)| file_ino(m)).collect();
            inos.sort_unstable();
            let mut names: HashMap<u64, Vec<Box<[u8]>>> = inos
                .windows(2)
                .filter(|w| w[0] == w[1])
                .map(|w| (w[0], Vec::new()))
                .collect();
            drop(inos);
            if !names.is_empty() {
                for (path, mark) in self.base.marks.iter() {
                    if let Some(n) = file_ino(mark).and_then(|ino| names.get_mut(&ino)) {
                        n.push(path.into());
                    }
                }
            }
            names
        })
    }

    /// A name of the destination inode `d` goes (unlinked or replaced): noted, and
    /// journaled first.
    pub(super) fn touch(&mut self, d: &FileStat) -> Result<(), Failed> {
        if d.st_nlink > 1 {
            self.touch_ino(d.st_ino)?;
        }
        Ok(())
    }

    /// The destination inode `ino` loses or gains a name while it has others.
    pub(super) fn touch_ino(&mut self, ino: u64) -> Result<(), Failed> {
        if self.touched.insert(ino) {
            if let Some(j) = self.journal {
                j.note_touched(ino).map_err(journal_err)?;
            }
        }
        Ok(())
    }

    /// The disk side won: left as it is (`d`, if it has the name), and remembered, so
    /// the RAM's losing version does not come back later.
    pub(super) fn keep_disk(
        &mut self,
        path: Vec<u8>,
        verdict: Verdict,
        d: Option<&FileStat>,
    ) -> Result<(), Failed> {
        self.reporter.stats.kept_disk += 1;
        let mark = match (verdict, d) {
            (Verdict::Disk(Some(at)), _) => Mark::Deleted(at),
            (Verdict::Disk(None), Some(d)) if file_type(d) != libc::S_IFDIR => Mark::DiskWon(Sig::of(d)),
            _ => return Ok(()),
        };
        if self.base.get(&path) == Some(mark) {
            // Known already: carried, not journaled again.
            self.marks.insert(&path, mark);
            return Ok(());
        }
        self.remember(path, mark)
    }

    /// Puts `mark` in the next baseline, and at once in the journal: a retry after a
    /// crash must know it too.
    pub(super) fn remember(&mut self, path: Vec<u8>, mark: Mark) -> Result<(), Failed> {
        self.journal_note(&path, &mark)?;
        self.marks.insert(&path, mark);
        Ok(())
    }

    /// The two sides agree on `path`; the disk entry now looks like `st`.
    pub(super) fn record(&mut self, path: Vec<u8>, st: &FileStat) {
        self.marks.insert(&path, Mark::Entry(Sig::of(st)));
    }

    /// `path` was not looked at (it vanished from the RAM while the pass ran, or lies
    /// below another filesystem): what the baseline knew of it still holds.
    pub(super) fn carry(&mut self, path: &[u8]) -> u64 {
        let base = self.base;
        let mut present = 0;
        if let Some(m) = base.get(path) {
            present += self.carry_mark(path, m, None);
        }
        match self.by_dir.take() {
            Some(by_dir) if self.tracked => {
                let mut todo = vec![path];
                while let Some(dir) = todo.pop() {
                    for (n, p, m) in by_dir.numbered(dir) {
                        present += self.carry_mark(p, m, Some(n));
                        todo.push(p);
                    }
                }
                self.by_dir = Some(by_dir);
            }
            by_dir => {
                self.by_dir = by_dir;
                for (p, m) in base.below(path) {
                    present += self.carry_mark(p, m, None);
                }
            }
        }
        present
    }

    /// Carries one record over, numbered `n` by the baseline's records by directory if
    /// found there; 1 if it stands for an entry, 0 for a deletion.
    fn carry_mark(&mut self, path: &[u8], old: Mark, n: Option<usize>) -> u64 {
        let mark = match old {
            // Not read in this pass: trusted as before, or not at all.
            Mark::Entry(sig) if sig.is_dir() && !self.base.unchanged_dir(path, &sig) => Mark::Entry(Sig {
                ctime: UNTRUSTED,
                ..sig
            }),
            other => other,
        };
        let present = u64::from(!matches!(mark, Mark::Deleted(_)));
        match n {
            Some(n) if mark == old => self.marks.carry(&self.base.marks, n, path, mark),
            _ => self.marks.insert(path, mark),
        }
        present
    }

    /// In a directory whose names the disk kept: a RAM non-directory unchanged since
    /// the baseline, whose record says both sides agreed on it or the disk's version
    /// won, keeps that record without a look at the disk. Had the disk changed it in
    /// place, the disk's version would be kept all the same; whether the RAM then
    /// wins with a later change is decided by times, which the disk's entry shows
    /// whenever the RAM changes it. Hard links are left to the full comparison.
    pub(super) fn carry_unchanged(&mut self, path: &[u8], s: &FileStat) -> bool {
        let ram = ctime(s);
        if file_type(s) == libc::S_IFDIR || s.st_nlink != 1 || self.base.taken.is_none_or(|t| ram >= t) {
            return false;
        }
        self.carry_file_record(path)
    }

    /// Keeps the record of a non-directory both sides agreed on, or whose disk
    /// version won; false for any other record.
    pub(super) fn carry_file_record(&mut self, path: &[u8]) -> bool {
        let mark = match self.base.get(path) {
            Some(m @ Mark::Entry(sig)) if !sig.is_dir() => m,
            Some(m @ Mark::DiskWon(sig)) if !sig.is_dir() => m,
            _ => return false,
        };
        self.marks.insert(path, mark);
        self.reporter.stats.unchanged += 1;
        true
    }

    pub(super) fn journal_note(&self, path: &[u8], mark: &Mark) -> Result<(), Failed> {
        match self.journal {
            Some(j) => j.note(path, mark).map_err(journal_err),
            None => Ok(()),
        }
    }

    /// Records in the journal that the pass made the disk directory `st` at `path`,
    /// born at `born` (see [`Journal::note_made`](crate::copy::journal::Journal::note_made)).
    /// Without a birth time nothing tells it from a directory made again there with
    /// its inode number: not recorded.
    pub(super) fn journal_made(&self, path: &[u8], st: &FileStat, born: Option<Time>) -> Result<(), Failed> {
        match (self.journal, born) {
            (Some(j), Some(born)) => j.note_made(path, st.st_ino, born).map_err(journal_err),
            _ => Ok(()),
        }
    }

    /// Records in the journal that the pass gave the directory `st` at `path`
    /// (open as `fd`) the RAM's owner and mode: a retry after a kill takes that mode
    /// for the pass's own, not for a change on disk since the baseline (which it
    /// would keep: a directory the pass opened stayed open for good after the RAM
    /// closed it again, a review helper's probe). And, where it made the directory
    /// (`made_here`) or an interrupted attempt did, that it is finished.
    pub(super) fn journal_own_meta(
        &self,
        path: &[u8],
        st: &FileStat,
        fd: BorrowedFd<'_>,
        made_here: bool,
    ) -> Result<(), Failed> {
        let Some(j) = self.journal else {
            return Ok(());
        };
        if !path.is_empty() && self.dir_mode_changed(path, st) {
            j.note(path, &Mark::Entry(Sig::of(st))).map_err(journal_err)?;
        }
        if !made_here && self.base.made.is_empty() {
            return Ok(());
        }
        match born(fd, c"") {
            Some(t) if made_here || self.base.made.contains(&*made_key(path, st.st_ino, t)) => {
                j.note_finished(path, st.st_ino, t).map_err(journal_err)
            }
            _ => Ok(()),
        }
    }

    /// Whether the disk directory `d` (`name` in `dir`, at `path`) is one an
    /// interrupted attempt of this write-back made there and had not finished: still
    /// root's and closed as it made it, or already the RAM directory's (`s`) owner's
    /// (killed while it gave it owner, attributes and mode, one after the other: it
    /// stayed 0700 for good, a review helper's probe). Any other owner, or a root's
    /// mode other than 0700, is someone's change since, which stays; so is any
    /// change after the attempt finished it (its journal says so).
    pub(super) fn made_unfinished(
        &self,
        path: &[u8],
        dir: BorrowedFd<'_>,
        name: &CStr,
        (d, s): (&FileStat, &FileStat),
    ) -> bool {
        let own = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let owner = (d.st_uid, d.st_gid);
        !self.base.made.is_empty()
            && file_type(d) == libc::S_IFDIR
            && (owner == (s.st_uid, s.st_gid) || (owner == own && d.st_mode & 0o7777 == 0o700))
            && born(dir, name).is_some_and(|t| self.base.made.contains(&*made_key(path, d.st_ino, t)))
    }

    /// Whether the disk directory `d` (`name` in `dir`, at `path`) has the inode
    /// number of the directory the baseline records there but is not that directory:
    /// born after that record's ctime (a directory's birth is never after its ctime).
    /// Without birth times, not told.
    pub(super) fn remade_dir(&self, path: &[u8], dir: BorrowedFd<'_>, name: &CStr, d: &FileStat) -> bool {
        file_type(d) == libc::S_IFDIR
            && match self.base.get(path) {
                Some(Mark::Entry(sig) | Mark::DiskWon(sig)) if sig.is_dir() && sig.ino == d.st_ino => {
                    born(dir, name).is_some_and(|b| b > sig.ctime)
                }
                _ => false,
            }
    }

    /// Whether the disk directory `d` at `path` is the one the baseline records
    /// there, with another mode: changed on disk since.
    pub(super) fn dir_mode_changed(&self, path: &[u8], d: &FileStat) -> bool {
        file_type(d) == libc::S_IFDIR
            && matches!(
                self.base.get(path),
                Some(Mark::Entry(sig) | Mark::DiskWon(sig))
                    if sig.is_dir() && sig.ino == d.st_ino && sig.mode != d.st_mode
            )
    }

    /// Records in the journal that the pass removed `path` from the disk (see
    /// [`Journal::note_gone`](crate::copy::journal::Journal::note_gone)).
    pub(super) fn journal_gone(&self, path: &[u8]) -> Result<(), Failed> {
        match self.journal {
            Some(j) => j.note_gone(path).map_err(journal_err),
            None => Ok(()),
        }
    }

    /// Records the entry the walk itself just put in place under `name`.
    pub(super) fn record_placed(
        &mut self,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
        path: Vec<u8>,
    ) -> Result<(), Failed> {
        let now = stat::fstatat(dst_dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(dst_err("stat"))?;
        self.remember(path, Mark::Entry(Sig::of(&now)))
    }
}

/// Whether the RAM file `s` still looks like the version both sides agreed on at
/// this path (`mark`: type, mode, size and mtime): then it is that version, not one
/// that came with a RAM directory moved here since, whatever its directory's ctime
/// says.
fn agreed_as(mark: Option<&Mark>, s: &FileStat) -> bool {
    matches!(mark, Some(Mark::Entry(agreed)) if !agreed.is_dir() && agreed.same_version(&Sig::of(s)))
}

/// The last name of `path`.
fn leaf_name(path: &[u8]) -> Option<CString> {
    CString::new(path.rsplit(|&b| b == b'/').next().unwrap_or(path)).ok()
}

/// Whether the directory `dir` has an entry `name`.
fn holds(dir: BorrowedFd<'_>, name: &CStr) -> bool {
    stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
}
