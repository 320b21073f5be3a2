//! Tree copies between the on-disk directory and its tmpfs: [`copy_tree`] seeds a fresh
//! tmpfs from the directory it is about to hide, [`sync_tree`] writes the tmpfs back.
//!
//! Both run as root over directories that unprivileged applications can write to, so
//! every lookup below the two roots is a single name relative to an open directory
//! descriptor and never follows a symlink. A symlink planted in the source or in the
//! destination, at any depth and at any moment, therefore cannot redirect a read or a
//! write outside the trees: at worst the copy fails.
//!
//! The result is meant to be indistinguishable from `cp -ax` / `rsync -aHAX`: types,
//! permission bits, owners, nanosecond times, symlink targets, hard links, extended
//! attributes and ACLs, device numbers and holes are kept, and other filesystems
//! mounted below the source are not entered.
//!
//! Where things are: the seed in `seed` (and its size beforehand in `measure`), the
//! write-back in `writeback`, with the rule and its records in `baseline`, `marks`,
//! `settle` and `journal` (and, for `seed: overlay` after its switch, `placings`).
//! The write-back reads its source ahead on a second thread
//! (`scan`), leaves `fsync` and rename to workers (`durable`), and puts entries in
//! place through `place` under the names of `temp`. The primitives both walks share
//! (opens, data copies, metadata, hard-link lookups, progress) live in `ops`, the
//! metadata of a symlink or node just made in `made`, extended attributes in `xattrs`,
//! errors in `error`; each module imports only from those
//! below it.

pub mod baseline;
mod durable;
mod error;
pub mod journal;
mod made;
mod marks;
mod measure;
mod ops;
pub mod overlay;
mod place;
pub mod placings;
mod scan;
mod seed;
mod settle;
mod temp;
mod writeback;
mod xattrs;

pub use baseline::Baseline;
pub use error::CopyError;
pub use journal::Journal;
pub use measure::{measure, TreeSize};
pub use ops::born;
pub use place::DiskDeletions;
pub use placings::Placings;
pub use seed::{copy_tree, replace_with_copy, seed_tree, CopyStats};
pub use temp::TEMP_PREFIX;
pub use writeback::{
    remove_entry, remove_older, remove_unchanged, sync_tree, Barriers, Dirty, Merge, SyncStats, Synced,
};
pub use xattrs::{get_attr, set_attr};

/// The names of the directory `fd`, in byte order, each once, even where the
/// directory changes while it is read (see `scan::read_names`).
pub fn read_names(fd: &std::os::fd::OwnedFd) -> nix::Result<Vec<std::ffi::CString>> {
    Ok(scan::read_names(fd)?.into_iter().map(|n| n.name).collect())
}

/// The directory part of a relative path (`""` at the top).
pub fn parent_of(path: &[u8]) -> &[u8] {
    ops::split_parent(path).0
}
