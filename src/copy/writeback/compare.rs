//! The comparison of two entries by their stats alone, and what it makes the walk do:
//! pure functions, tested without a filesystem.

use nix::sys::stat::FileStat;

use crate::copy::ops::{file_type, permissions};
use crate::copy::scan::{Name, SrcEntry};
use crate::copy::temp::is_temp;

/// What the walk does with one name of a directory pair.
#[derive(Debug)]
pub(super) enum Pairing {
    /// Only the destination has it: removed. `temp`: a leftover temporary.
    Remove { name: Name, temp: bool },
    /// The source has it; `in_dst` whether the destination listed it too.
    Sync { entry: SrcEntry, in_dst: bool },
}

/// Merges the two listings of a directory pair: removals first (they free space for
/// what is written), then the source's names in byte order (the scan's order).
/// Reserved names are skipped in the source and removed from the destination.
pub(super) fn pair_listings(mut src: Vec<SrcEntry>, mut dst: Vec<Name>) -> Vec<Pairing> {
    src.retain(|e| !is_temp(&e.name));
    src.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    dst.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let mut removals = Vec::new();
    let mut syncs = Vec::with_capacity(src.len());
    let mut theirs = dst.into_iter().peekable();
    for entry in src {
        while let Some(other) = theirs.next_if(|d| d.name < entry.name) {
            let temp = is_temp(&other.name);
            removals.push(Pairing::Remove { name: other, temp });
        }
        let in_dst = theirs.next_if(|d| d.name == entry.name).is_some();
        syncs.push(Pairing::Sync { entry, in_dst });
    }
    for other in theirs {
        let temp = is_temp(&other.name);
        removals.push(Pairing::Remove { name: other, temp });
    }
    removals.extend(syncs);
    removals
}

/// Outcome of the stat-only comparison of two non-directories; symlink targets and
/// attributes are compared afterwards where it matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Diff {
    Same,
    /// Owner, group, mode or times differ (or attributes, found later).
    Meta,
    /// Type, contents (size or mtime for files, target length for symlinks) or device
    /// number differ.
    Data,
}

/// Owner, group, permission bits (not for symlinks, whose are fixed) and mtime.
pub(super) fn same_meta(s: &FileStat, d: &FileStat) -> bool {
    (s.st_uid, s.st_gid) == (d.st_uid, d.st_gid)
        && (file_type(s) == libc::S_IFLNK || permissions(s) == permissions(d))
        && (s.st_mtime, s.st_mtime_nsec) == (d.st_mtime, d.st_mtime_nsec)
}

pub(super) fn compare_stats(s: &FileStat, d: &FileStat) -> Diff {
    let kind = file_type(s);
    let data_differs = kind != file_type(d)
        || match kind {
            libc::S_IFREG => {
                s.st_size != d.st_size || (s.st_mtime, s.st_mtime_nsec) != (d.st_mtime, d.st_mtime_nsec)
            }
            libc::S_IFLNK => s.st_size != d.st_size,
            libc::S_IFCHR | libc::S_IFBLK => s.st_rdev != d.st_rdev,
            _ => false,
        };
    if data_differs {
        Diff::Data
    } else if same_meta(s, d) {
        Diff::Same
    } else {
        Diff::Meta
    }
}

/// How far the destination inode of a name may be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reuse {
    /// Its only name is this one: it may be kept and changed in place.
    InPlace,
    /// Linked elsewhere too, but the source inode is multiply linked and the
    /// destination inode not yet taken by another group: kept only if equal, as the
    /// group's inode.
    AsIs,
    /// Replaced whatever it holds.
    No,
}

/// `claimed`: the destination inode already stands for another group of hard links.
pub(super) fn reuse(src_nlink: libc::nlink_t, d: &FileStat, claimed: bool) -> Reuse {
    if claimed {
        Reuse::No
    } else if d.st_nlink == 1 {
        Reuse::InPlace
    } else if src_nlink > 1 {
        Reuse::AsIs
    } else {
        Reuse::No
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FileAction {
    Keep,
    UpdateMetadata,
    Rewrite,
}

/// Only regular files are updated in place: symlinks and nodes have no data, so
/// writing them anew costs no more.
pub(super) fn decide(kind: libc::mode_t, diff: Diff, reuse: Reuse) -> FileAction {
    match (diff, reuse) {
        (Diff::Data, _) | (_, Reuse::No) => FileAction::Rewrite,
        (Diff::Same, _) => FileAction::Keep,
        (Diff::Meta, Reuse::InPlace) if kind == libc::S_IFREG => FileAction::UpdateMetadata,
        (Diff::Meta, _) => FileAction::Rewrite,
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;

    use nix::dir::Type;
    use nix::sys::stat::{self, FileStat};

    use super::*;

    fn name(s: &[u8], dtype: Option<Type>) -> Name {
        Name {
            name: CString::new(s).expect("no NUL"),
            dtype,
        }
    }

    fn stat_of(kind: libc::mode_t, perm: libc::mode_t) -> FileStat {
        // A real stat with every field the comparisons read set here.
        let mut st = stat::stat("/").expect("stat /");
        (st.st_uid, st.st_gid, st.st_rdev) = (0, 0, 0);
        (st.st_atime, st.st_atime_nsec) = (0, 0);
        st.st_mode = kind | perm;
        st.st_nlink = 1;
        st.st_size = 10;
        st.st_mtime = 1_700_000_000;
        st.st_mtime_nsec = 5;
        st
    }

    #[test]
    fn listings_merge_into_removals_then_source_names_in_byte_order() {
        let entry = |n: &[u8]| SrcEntry {
            name: CString::new(n).expect("no NUL"),
            skipped: false,
            st: None,
            untouched: false,
            xattrs: crate::copy::scan::Xattrs::Unread,
            target: None,
        };
        let src = vec![
            entry(b"b"),
            entry(b"\xff"),
            entry(b"a"),
            entry(b".tmpfsctl-wb.barrier.1.2.3"),
            entry(b".tmpfsctl-wb.app"),
            entry(b"d"),
        ];
        let dst = vec![
            name(b"c", Some(Type::Directory)),
            name(b"a", Some(Type::File)),
            name(b".tmpfsctl-wb.0011223344556677", Some(Type::File)),
            name(b"\xfe", None),
            name(b"d", Some(Type::Symlink)),
            name(b"z", Some(Type::File)),
        ];
        let shown: Vec<String> = pair_listings(src, dst)
            .iter()
            .map(|step| match step {
                Pairing::Remove { name, temp } => format!("remove {:?} {:?} {temp}", name.name, name.dtype),
                Pairing::Sync { entry, in_dst } => format!("sync {:?} {in_dst}", entry.name),
            })
            .collect();
        assert_eq!(
            shown,
            [
                r#"remove ".tmpfsctl-wb.0011223344556677" Some(File) true"#,
                r#"remove "c" Some(Directory) false"#,
                r#"remove "z" Some(File) false"#,
                r#"remove "\xfe" None false"#,
                r#"sync ".tmpfsctl-wb.app" false"#,
                r#"sync "a" true"#,
                r#"sync "b" false"#,
                r#"sync "d" true"#,
                r#"sync "\xff" false"#,
            ]
        );
        assert!(pair_listings(Vec::new(), Vec::new()).is_empty());
    }

    #[test]
    fn stat_comparison_separates_data_from_metadata() {
        let reg = stat_of(libc::S_IFREG, 0o644);
        assert_eq!(compare_stats(&reg, &reg), Diff::Same);
        let other = |f: &dyn Fn(&mut FileStat)| {
            let mut st = reg;
            f(&mut st);
            compare_stats(&reg, &st)
        };
        assert_eq!(other(&|st| st.st_mode = libc::S_IFLNK | 0o644), Diff::Data);
        assert_eq!(other(&|st| st.st_size = 11), Diff::Data);
        assert_eq!(other(&|st| st.st_mtime_nsec = 6), Diff::Data, "nanoseconds count");
        assert_eq!(other(&|st| st.st_mtime += 1), Diff::Data);
        assert_eq!(other(&|st| st.st_mode = libc::S_IFREG | 0o4644), Diff::Meta);
        assert_eq!(other(&|st| st.st_uid = 1), Diff::Meta);
        assert_eq!(other(&|st| st.st_gid = 1), Diff::Meta);
        assert_eq!(other(&|st| st.st_atime = 99), Diff::Same, "atimes are ignored");
        assert_eq!(other(&|st| st.st_nlink = 3), Diff::Same);

        let link = stat_of(libc::S_IFLNK, 0o777);
        let mut longer = link;
        longer.st_size = 12;
        assert_eq!(compare_stats(&link, &longer), Diff::Data);
        let mut moved = link;
        moved.st_mtime_nsec = 1;
        assert_eq!(
            compare_stats(&link, &moved),
            Diff::Meta,
            "a symlink's mtime is metadata"
        );
        let mut perm = link;
        perm.st_mode = libc::S_IFLNK | 0o755;
        assert_eq!(compare_stats(&link, &perm), Diff::Same, "symlink modes are fixed");

        let dev = stat_of(libc::S_IFCHR, 0o600);
        let mut redev = dev;
        redev.st_rdev = 0x0103;
        assert_eq!(compare_stats(&dev, &redev), Diff::Data);
        let mut blk = dev;
        blk.st_mode = libc::S_IFBLK | 0o600;
        assert_eq!(compare_stats(&dev, &blk), Diff::Data);
        let fifo = stat_of(libc::S_IFIFO, 0o600);
        let mut touched = fifo;
        touched.st_size = 0;
        touched.st_mtime = 5;
        assert_eq!(compare_stats(&fifo, &touched), Diff::Meta);
    }

    #[test]
    fn destination_inodes_are_changed_in_place_only_when_singly_linked() {
        let one = stat_of(libc::S_IFREG, 0o644);
        let mut two = one;
        two.st_nlink = 2;
        assert_eq!(reuse(1, &one, false), Reuse::InPlace);
        assert_eq!(reuse(3, &one, false), Reuse::InPlace);
        assert_eq!(reuse(1, &two, false), Reuse::No, "linked to something else");
        assert_eq!(reuse(2, &two, false), Reuse::AsIs);
        assert_eq!(reuse(2, &two, true), Reuse::No, "taken by another group");
        assert_eq!(reuse(1, &one, true), Reuse::No);
    }

    #[test]
    fn decisions() {
        use FileAction::*;
        let reg = libc::S_IFREG;
        let lnk = libc::S_IFLNK;
        assert_eq!(decide(reg, Diff::Same, Reuse::InPlace), Keep);
        assert_eq!(decide(reg, Diff::Same, Reuse::AsIs), Keep);
        assert_eq!(decide(reg, Diff::Same, Reuse::No), Rewrite);
        assert_eq!(decide(reg, Diff::Meta, Reuse::InPlace), UpdateMetadata);
        assert_eq!(decide(reg, Diff::Meta, Reuse::AsIs), Rewrite);
        assert_eq!(decide(reg, Diff::Data, Reuse::InPlace), Rewrite);
        assert_eq!(decide(lnk, Diff::Meta, Reuse::InPlace), Rewrite);
        assert_eq!(decide(lnk, Diff::Same, Reuse::InPlace), Keep);
        assert_eq!(decide(libc::S_IFIFO, Diff::Meta, Reuse::InPlace), Rewrite);
    }
}
