//! Directory pairs: listed and paired, entered, and finished once their contents are in
//! place (metadata after contents, then an `fsync`).

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::stat::{self, FileStat, Mode};
use nix::unistd::{self, UnlinkatFlags};

use crate::copy::baseline::{Mark, Sig, Time, Verdict};
use crate::copy::durable::{DstDir, Job};
use crate::copy::error::{dst_err, Failed};
use crate::copy::ops::{atime, file_type, mtime, open_dst_dir};
use crate::copy::place::rename_no_replace;
use crate::copy::scan::{read_names, Name, SrcEntry};
use crate::copy::temp::create_temp;

use super::compare::{pair_listings, same_meta};
use super::{ctime, rel_path, Frame, Left, Stepped, Stop, Syncer, Tentative, Went};

impl Syncer<'_, '_> {
    /// Lists the destination side of a directory pair (a directory created just now is
    /// known to be empty, one whose names the disk kept since the baseline at `path`
    /// is listed there) and pairs it with the scanned source side. The deletion times
    /// are the caller's to set.
    pub(super) fn frame(
        &mut self,
        src: OwnedFd,
        entries: Vec<SrcEntry>,
        dst: Arc<DstDir>,
        meta: Option<FileStat>,
        before: Option<FileStat>,
        path: Option<&[u8]>,
    ) -> Result<Frame, Failed> {
        let created = before.is_none() && meta.is_some();
        let kept = match (path, &before) {
            (Some(path), Some(before)) if self.base.unchanged_dir(path, &Sig::of(before)) => {
                self.names_in_baseline(path)
            }
            _ => None,
        };
        let trusted = kept.is_some();
        self.reporter.stats.dirs_trusted += u64::from(trusted);
        let dst_names = if created {
            Vec::new()
        } else if let Some(names) = kept {
            names
        } else {
            read_names(&dst.fd).map_err(dst_err("read directory"))?
        };
        Ok(Frame {
            src,
            dst,
            steps: pair_listings(entries, dst_names).into_iter(),
            meta,
            before,
            changed: false,
            ram_deleted_at: (0, 0),
            disk_deleted_at: (0, 0),
            tentative: None,
            ram_meta: true,
            trusted,
            ram_kept: false,
            new: false,
            rel_len: self.rel.len(),
        })
    }

    /// The disk directory at `path`'s names as the baseline holds them.
    pub(super) fn names_in_baseline(&self, path: &[u8]) -> Option<Vec<Name>> {
        let Some(by_dir) = &self.by_dir else {
            return Some(Vec::new());
        };
        by_dir
            .names(path)
            .map(|n| CString::new(n).ok().map(|name| Name { name, dtype: None }))
            .collect()
    }

    /// Makes the directory `name` in `dst_dir` for the RAM directory `src` (`s`):
    /// under a temporary name, given its owner, attributes and mode (in that
    /// order: an access ACL is permission bits too, and the mode alone let a
    /// group in that the ACL keeps out, a review helper's probe), then renamed
    /// into place unless the name exists (`None`: the application made it
    /// meanwhile); its times follow its contents. Made owner-only at its name,
    /// it gave the application EACCES until the pass was done with it, and a
    /// kill before the journal's record of it left it so for good (a hunting
    /// helper's runs under nginx: 2 of 4 with `sync` killed at random times,
    /// and every fallback under load).
    fn make_dir(
        &mut self,
        dst_dir: BorrowedFd<'_>,
        name: &CStr,
        (src, s): (BorrowedFd<'_>, &FileStat),
    ) -> Result<Option<OwnedFd>, Failed> {
        let (mut temp, ()) = create_temp(&mut self.temps, dst_dir, |dir, temp| {
            stat::mkdirat(dir, temp, Mode::S_IRWXU).map_err(dst_err("create directory"))
        })?;
        let made = (|| {
            let fd = open_dst_dir(dst_dir, &temp.name).map_err(dst_err("open directory"))?;
            self.transfer.set_metadata(src, fd.as_fd(), s, true)?;
            let placed = rename_no_replace(dst_dir, &temp.name, name).map_err(dst_err("create directory"))?;
            Ok(placed.then_some(fd))
        })();
        if !matches!(made, Ok(Some(_))) {
            // Still at its temporary name, empty: a leftover would be removed by
            // the next pass anyway.
            let _ = unistd::unlinkat(dst_dir, temp.name.as_c_str(), UnlinkatFlags::RemoveDir);
        }
        temp.live = false;
        made
    }

    /// A RAM directory: entered, with the disk's directory of that name, or a new one
    /// (`tentative` when the disk deleted it: see [`Frame::tentative`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sync_dir(
        &mut self,
        parent: &Frame,
        name: &CStr,
        path: Vec<u8>,
        (src, s, entries, mount, new): (OwnedFd, FileStat, Vec<SrcEntry>, bool, bool),
        d: Option<FileStat>,
        ram_meta: bool,
        tentative: Option<Time>,
    ) -> Result<Stepped, Stop> {
        let dst_dir = parent.dst.fd.as_fd();
        let (mut changed, mut raced) = (false, false);
        let (dst, before) = match d {
            Some(d) if file_type(&d) == libc::S_IFDIR => {
                if d.st_dev != self.dst_dev {
                    // Another filesystem is mounted here: not ours to change.
                    self.skip_scanned()?;
                    self.carry(&path);
                    self.reporter.stats.unchanged += 1;
                    return Ok(Stepped::default());
                }
                (
                    open_dst_dir(dst_dir, name).map_err(dst_err("open directory"))?,
                    Some(d),
                )
            }
            other => {
                if let Some(d) = other {
                    // A non-directory the RAM side won over, unless the application
                    // changed it since.
                    self.touch(&d)?;
                    if self.remove_compared(dst_dir, name, &d)? == 0 {
                        self.skip_scanned()?;
                        self.keep_disk(path, Verdict::Disk(None), None)?;
                        return Ok(Stepped::default());
                    }
                    self.reporter.stats.deleted += 1;
                }
                let (made, fd) = match self.make_dir(dst_dir, name, (src.as_fd(), &s))? {
                    Some(fd) => (true, fd),
                    // The application made it meanwhile (it works in the disk
                    // directory while a held tmpfs is merged): merged into as it is.
                    None => (
                        false,
                        open_dst_dir(dst_dir, name).map_err(dst_err("open directory"))?,
                    ),
                };
                let st = stat::fstat(&fd).map_err(dst_err("stat"))?;
                if made {
                    changed = true;
                    self.journal_note(&path, &Mark::Entry(Sig::of(&st)))?;
                    self.journal_made(&path, &st, crate::copy::born(fd.as_fd(), c""))?;
                    crate::failpoint::hit("dir-made", "");
                    (fd, None)
                } else {
                    raced = true;
                    (fd, Some(st))
                }
            }
        };
        // A directory the application made on disk while the pass ran keeps its own
        // metadata: the later change. One this pass made has none worth keeping (it is
        // root's and closed): it gets the RAM's, whatever the RAM directory's ctime (one
        // that reached its path through a move of a directory above keeps an older
        // one, and was left root's 0700 for good: a hunting helper's probe).
        let ram_meta = (ram_meta || changed) && !raced;
        // Earlier directories here the application deleted while this pass ran.
        let gone = self
            .deletions
            .map(|dl| parent.dst.gone_below(dl, name))
            .unwrap_or_default();
        let disk_deleted_at = tentative
            .or_else(|| before.as_ref().map(ctime))
            .unwrap_or(parent.disk_deleted_at);
        let tentative = tentative.map(|at| {
            // Only where the baseline records what the disk had can a name the disk
            // lacks be known never to have been there. (With no records, it counts as
            // before. The merge of what the application wrote on disk during a seed
            // has the seed's: a directory the application removed in the tmpfs lost
            // only what the tmpfs had, and a file written on disk that it never saw
            // is brought in, as a write-back brings in what the RAM wrote.)
            let moved: Vec<_> = gone
                .iter()
                .filter_map(|k| crate::host::deletions::open_moved(dst_dir, k))
                .collect();
            let went = if gone.is_empty() || (self.base.marks.is_empty() && self.copied.is_none()) {
                Went::Before
            } else if !moved.is_empty() {
                Went::Moved(moved)
            } else {
                Went::Meanwhile
            };
            tracing::debug!(
                "write-back: {}: made again for what the RAM wrote since the disk deleted it ({})",
                String::from_utf8_lossy(&path),
                match went {
                    Went::Before => "before this pass",
                    Went::Meanwhile => "while this pass ran",
                    Went::Moved(_) => "moved away while this pass ran",
                }
            );
            Tentative {
                at,
                parent: Arc::clone(&parent.dst),
                name: name.to_owned(),
                went,
            }
        });
        if mount {
            // A mount point in the tmpfs: the directory itself is synced, but neither
            // entered nor emptied on disk.
            self.expect_leave()?;
            let left = Left {
                src,
                dst: DstDir::new(dst, gone),
                meta: Some(s),
                before,
                changed: false,
                tentative,
                ram_meta,
                rel: path,
            };
            self.finish_dir(&left)?;
            return Ok(Stepped { enter: None, changed });
        }
        let mut frame = self.frame(src, entries, DstDir::new(dst, gone), Some(s), before, Some(&path))?;
        frame.ram_deleted_at = ctime(&s);
        frame.disk_deleted_at = disk_deleted_at;
        // A tracked pass knows every directory moved in since the baseline (`new`):
        // one that was not holds its names at their paths, whatever else changed in it
        // before the pass asked (a directory moved over it after the answer is not
        // told).
        frame.ram_kept = parent.ram_kept
            && (self.tracked && !new && ctime(&s) < self.taken
                || self.base.taken.is_some_and(|t| ctime(&s) < t));
        frame.new = new;
        frame.tentative = tentative;
        frame.ram_meta = ram_meta;
        self.rel.push(name);
        frame.rel_len = self.rel.len();
        Ok(Stepped {
            enter: Some(frame),
            changed,
        })
    }

    /// The walk is done with a directory: it is finished now, or once the renames
    /// into it landed.
    pub(super) fn leave(&mut self, frame: Frame) -> Result<(), Failed> {
        let left = Left {
            src: frame.src,
            dst: frame.dst,
            meta: frame.meta,
            before: frame.before,
            changed: frame.changed,
            tentative: frame.tentative,
            ram_meta: frame.ram_meta,
            rel: self.rel.as_bytes().to_vec(),
        };
        if left.dst.leave() {
            self.finish_dir(&left)
        } else {
            self.waiting.insert(left.dst.key(), left);
            Ok(())
        }
    }

    /// Applies a directory's metadata after its contents, then has it fsynced if
    /// names in it changed. The root's metadata belongs to the caller. A tentative
    /// directory that received nothing is removed again.
    ///
    /// A directory whose mtime differs only because the sync changed names in it counts
    /// as unchanged: `before` is how it looked before (`None` if it was created).
    pub(super) fn finish_dir(&mut self, left: &Left) -> Result<(), Failed> {
        if let Some(Tentative { at, parent, name, .. }) = &left.tentative {
            if read_names(&left.dst.fd)
                .map_err(dst_err("read directory"))?
                .is_empty()
            {
                match unistd::unlinkat(parent.fd.as_fd(), name.as_c_str(), UnlinkatFlags::RemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => {
                        tracing::debug!(
                            "write-back: {}: made again for nothing, removed",
                            String::from_utf8_lossy(&left.rel)
                        );
                        self.keep_disk(left.rel.clone(), Verdict::Disk(Some(*at)), None)?;
                        return Ok(());
                    }
                    // The application put something there meanwhile.
                    Err(Errno::ENOTEMPTY | Errno::EEXIST) => {}
                    Err(e) => return Err(dst_err("remove directory")(e)),
                }
            }
        }
        let mut same = true;
        if let Some(s) = &left.meta {
            let (src, dst) = (left.src.as_fd(), left.dst.fd.as_fd());
            let mut now = stat::fstat(dst).map_err(dst_err("stat"))?;
            if left.ram_meta {
                let same_xattrs = left.before.is_some() && self.transfer.same_xattrs_fd(src, dst)?;
                same = same_xattrs && same_meta(s, &now);
                // An access ACL is permission bits too (the attributes differ).
                let deferred = !same && self.defer_meta(&left.rel, s, &now, !same_xattrs);
                if !same && !deferred {
                    self.transfer.set_metadata(src, dst, s, true)?;
                    now = stat::fstat(dst).map_err(dst_err("stat"))?;
                }
                if !deferred {
                    self.journal_own_meta(&left.rel, &now, dst, left.before.is_none())?;
                }
                let stats = &mut self.reporter.stats;
                match &left.before {
                    None => stats.dirs_created += 1,
                    Some(before) if same_xattrs && same_meta(s, before) => stats.unchanged += 1,
                    Some(_) => stats.metadata_updated += 1,
                }
            } else {
                if let Some(before) = left
                    .before
                    .as_ref()
                    .filter(|b| left.changed && !same_meta(b, &now))
                {
                    // The pass's own names gave it a new mtime; its metadata stays the
                    // disk's, as it was before the pass.
                    stat::futimens(dst, &atime(before), &mtime(before)).map_err(dst_err("set times of"))?;
                    now = stat::fstat(dst).map_err(dst_err("stat"))?;
                }
                if same_meta(s, &now) {
                    self.reporter.stats.unchanged += 1;
                } else {
                    // Replaced or changed on disk since the baseline, or its metadata
                    // won before while the RAM's did not change since: owner, mode and
                    // times stay.
                    self.reporter.stats.kept_disk += 1;
                }
            }
            self.record(left.rel.clone(), &now);
        }
        if left.changed || !same {
            self.durable.submit(Job::FsyncDir {
                dir: Arc::clone(&left.dst),
                rel: rel_path(&left.rel),
            });
        }
        Ok(())
    }
}
