//! Wakes the agent when its spec file changes: inotify on the directory of
//! the file (and of its target, when it is a symlink), since editors replace
//! files by renaming. The descriptor is polled in the agent's loop.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tracing::warn;

pub struct SpecWatch {
    inotify: Inotify,
    /// The file names that count, in whichever watched directory.
    names: Vec<OsString>,
}

impl SpecWatch {
    /// `None` (logged) when nothing can be watched: SIGHUP still reloads.
    pub fn new(path: &Path) -> Option<SpecWatch> {
        let abs = std::path::absolute(path).ok()?;
        let mut watch: Vec<(PathBuf, OsString)> = Vec::new();
        for p in [Some(abs.clone()), std::fs::canonicalize(&abs).ok()]
            .into_iter()
            .flatten()
        {
            if let (Some(dir), Some(name)) = (p.parent(), p.file_name()) {
                if !watch.iter().any(|(d, n)| d == dir && n == name) {
                    watch.push((dir.to_path_buf(), name.to_os_string()));
                }
            }
        }
        let inotify = match Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK) {
            Ok(i) => i,
            Err(e) => {
                warn!(
                    "cannot watch {} for changes ({e}); reload with SIGHUP",
                    path.display()
                );
                return None;
            }
        };
        let mask = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        let mut watching = false;
        let mut dirs: Vec<&PathBuf> = watch.iter().map(|(d, _)| d).collect();
        dirs.dedup();
        for d in dirs {
            match inotify.add_watch(d.as_path(), mask) {
                Ok(_) => watching = true,
                Err(e) => warn!(
                    "cannot watch {} for changes ({e}); reload with SIGHUP",
                    d.display()
                ),
            }
        }
        watching.then(|| SpecWatch {
            inotify,
            names: watch.into_iter().map(|(_, n)| n).collect(),
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }

    /// Reads every pending event: whether one was about the spec's name.
    pub fn changed(&self) -> bool {
        let mut hit = false;
        while let Ok(events) = self.inotify.read_events() {
            if events.is_empty() {
                break;
            }
            // A watched directory itself gone or moved away: the spec may be
            // elsewhere now (a symlink's new target, a directory made again).
            let gone =
                AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_IGNORED;
            hit |= events
                .iter()
                .any(|e| e.mask.intersects(gone) || e.name.as_ref().is_some_and(|n| self.names.contains(n)));
        }
        hit
    }
}
