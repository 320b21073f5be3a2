//! Errors of the copies: [`CopyError`] for the callers, and [`Failed`], the failure of
//! one operation, which the walk (the part that knows where it is) turns into one.

use std::io;
use std::path::PathBuf;

/// A failed copy or measurement. The path is relative to the root being walked
/// (`.` is the root itself), so the same message fits the on-disk directory and the
/// tmpfs. The cause is kept as the error's `source()`.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// Reading the on-disk tree failed.
    #[error("cannot {op} `{}` in the source tree", .path.display())]
    Source {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Creating or updating the copy failed.
    #[error("cannot {op} `{}` in the copy", .path.display())]
    Destination {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A write-back could not record an entry in its journal, which lies in the
    /// state directory, not in the copy: never the copy running out of space, whose
    /// handling removes names (their records would then be missing).
    #[error(
        "cannot record `{}` in the write-back journal (in the state directory's records area, not the disk directory)",
        .path.display()
    )]
    Journal {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A write-back ran out of space, then removed names the RAM deleted (it removes
    /// them last): another pass may fit in the space they held.
    #[error(transparent)]
    SpaceFreed(Box<Freed>),
    /// A tracked pass found the RAM changed, after the change tracker answered,
    /// below a directory it did not read (`dir`): a file the RAM moved there from a
    /// name the pass is to remove would be on no disk name. It removed nothing; a
    /// pass that reads the whole tree follows.
    #[error(
        "the RAM changed below `{}` after the change tracker answered, where this pass read nothing",
        .dir.display()
    )]
    ChangedUnread { dir: PathBuf },
}

/// The error of a write-back that ran out of space, and how many entries it removed
/// after that: it reads as that error.
#[derive(Debug)]
pub struct Freed {
    pub error: CopyError,
    pub removed: u64,
}

impl std::fmt::Display for Freed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for Freed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl CopyError {
    /// The tmpfs (or a quota) is too small for the tree: the caller can report a
    /// sizing problem instead of a generic I/O failure.
    pub fn is_no_space(&self) -> bool {
        match self {
            CopyError::Source { source, .. } | CopyError::Destination { source, .. } => {
                matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
            }
            CopyError::SpaceFreed(_) => true,
            CopyError::Journal { .. } | CopyError::ChangedUnread { .. } => false,
        }
    }

    /// How many entries a write-back that ran out of space removed after that (see
    /// [`CopyError::SpaceFreed`]).
    pub fn freed(&self) -> Option<u64> {
        match self {
            CopyError::SpaceFreed(f) => Some(f.removed),
            _ => None,
        }
    }

    /// A directory of the copy vanished under the walk: removed by someone else (an
    /// application working in the on-disk directory while a held tmpfs is written
    /// back). A new pass finds the tree as it is now.
    pub fn is_changed_unread(&self) -> bool {
        matches!(self, CopyError::ChangedUnread { .. })
    }

    pub fn is_gone_in_copy(&self) -> bool {
        matches!(self, CopyError::Destination { source, .. } if source.raw_os_error() == Some(libc::ENOENT))
    }
}

/// An error whose path is attached by the walk, which is the part that knows it.
#[derive(Debug)]
pub(super) struct Failed {
    on: Side,
    op: &'static str,
    pub(super) err: io::Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Source,
    Destination,
    Journal,
}

impl Failed {
    pub(super) fn at(self, path: PathBuf) -> CopyError {
        let (op, source) = (self.op, self.err);
        match self.on {
            Side::Source => CopyError::Source { op, path, source },
            Side::Destination => CopyError::Destination { op, path, source },
            Side::Journal => CopyError::Journal { path, source },
        }
    }

    pub(super) fn errno(&self) -> Option<i32> {
        self.err.raw_os_error()
    }

    pub(super) fn on_source(&self) -> bool {
        self.on == Side::Source
    }
}

pub(super) fn failed<E: Into<io::Error>>(on_source: bool, op: &'static str) -> impl FnOnce(E) -> Failed {
    let on = if on_source {
        Side::Source
    } else {
        Side::Destination
    };
    move |err| Failed {
        on,
        op,
        err: err.into(),
    }
}

/// A record of the write-back journal could not be written.
pub(super) fn journal_err<E: Into<io::Error>>(err: E) -> Failed {
    Failed {
        on: Side::Journal,
        op: "record",
        err: err.into(),
    }
}

pub(super) fn src_err<E: Into<io::Error>>(op: &'static str) -> impl FnOnce(E) -> Failed {
    failed(true, op)
}

pub(super) fn dst_err<E: Into<io::Error>>(op: &'static str) -> impl FnOnce(E) -> Failed {
    failed(false, op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_no_space_covers_enospc_and_edquot_only() {
        let err = |errno| CopyError::Destination {
            op: "write",
            path: PathBuf::from("f"),
            source: io::Error::from_raw_os_error(errno),
        };
        assert!(err(libc::ENOSPC).is_no_space());
        assert!(err(libc::EDQUOT).is_no_space());
        assert!(!err(libc::EIO).is_no_space());
    }
}
