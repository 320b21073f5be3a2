//! A root process writes back into a directory unprivileged applications could write
//! to: whatever is planted in the destination (symlinks to directories or files
//! outside, dangling symlinks, hard links to outside files) must be replaced as a
//! wrong-typed entry, never followed, and nothing outside the destination may be
//! created, changed or removed. Needs root.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::common_copy::*;
use nix::sys::stat::{utimensat, UtimensatFlags};
use nix::sys::time::TimeSpec;

/// Everything about a tree that a write through a planted link could change: the
/// walker's view of every entry (contents compared separately) and the root's own
/// metadata. Atimes and link counts are left out: reading moves the former, and
/// removing a planted hard link from the destination lowers the latter legitimately.
#[derive(Debug, PartialEq)]
struct Outside {
    root: (u32, u32, u32, i64, i64),
    tree: Tree,
    contents: Vec<(Vec<u8>, Vec<u8>)>,
}

fn observe(dir: &Path) -> Outside {
    let md = fs::symlink_metadata(dir).expect("stat outside");
    let mut tree = snapshot(dir);
    for meta in tree.values_mut() {
        meta.atime = (0, 0);
        meta.nlink = None;
        meta.link_group = None;
    }
    let contents = tree
        .iter()
        .filter(|(_, m)| m.kind == libc::S_IFREG)
        .map(|(rel, _)| {
            let p = dir.join(std::ffi::OsStr::new(
                std::str::from_utf8(rel).expect("utf-8 names"),
            ));
            (rel.clone(), fs::read(p).expect("read outside file"))
        })
        .collect();
    Outside {
        root: (md.mode(), md.uid(), md.gid(), md.mtime(), md.mtime_nsec()),
        tree,
        contents,
    }
}

fn set_mtime(p: &Path, s: i64) {
    let t = TimeSpec::new(s, 123);
    utimensat(nix::fcntl::AT_FDCWD, p, &t, &t, UtimensatFlags::NoFollowSymlink).expect("utimens");
}

/// A directory outside both trees with a file, a subdirectory and an attribute, all
/// with fixed times.
fn outside() -> tempfile::TempDir {
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let o = dir.path();
    fs::write(o.join("victim"), b"0123456789").expect("write");
    fs::set_permissions(o.join("victim"), fs::Permissions::from_mode(0o640)).expect("chmod");
    xattr::set(o.join("victim"), "user.keep", b"as is").expect("xattr");
    fs::create_dir(o.join("sub")).expect("mkdir");
    fs::write(o.join("sub/a"), b"aaaa").expect("write");
    for p in ["victim", "sub/a", "sub", ""] {
        set_mtime(&o.join(p), 1_000_000_000);
    }
    dir
}

/// Syncs, checks `dst` equals `src` and that `outside` is as it was.
fn sync_and_check(src: &Path, dst: &Path, outside: &Path, before: &Outside) {
    set_future_atimes(src);
    mirror(src, dst, None).expect("sync");
    assert_eq!(
        &observe(outside),
        before,
        "something outside the destination changed"
    );
    assert_in_sync(src, dst);
}

#[test]
fn a_planted_directory_symlink_is_replaced_not_followed() {
    let (src, dst, out) = (tempdir(), tempdir(), outside());
    let s = src.path();
    fs::create_dir_all(s.join("sub/deeper")).expect("mkdir");
    // Same name, size and mtime as the outside file, other mode and owner: following
    // the link would find "the same data" and update its metadata in place.
    fs::write(s.join("sub/a"), b"AAAA").expect("write");
    set_mtime(&s.join("sub/a"), 1_000_000_000);
    fs::set_permissions(s.join("sub/a"), fs::Permissions::from_mode(0o4777)).expect("chmod");
    std::os::unix::fs::chown(s.join("sub/a"), Some(1234), Some(1234)).expect("chown");
    fs::write(s.join("sub/new"), b"would be created outside").expect("write");
    fs::write(s.join("sub/deeper/c"), b"c").expect("write");
    symlink(out.path(), s.join("escape")).expect("symlink in the source");
    symlink(out.path(), dst.path().join("sub")).expect("plant");
    let before = observe(out.path());
    sync_and_check(s, dst.path(), out.path(), &before);
    assert!(fs::symlink_metadata(dst.path().join("sub"))
        .expect("stat")
        .is_dir());
    assert!(fs::symlink_metadata(dst.path().join("escape"))
        .expect("stat")
        .is_symlink());
}

#[test]
fn a_planted_file_symlink_is_replaced_not_followed() {
    let (src, dst, out) = (tempdir(), tempdir(), outside());
    let s = src.path();
    fs::write(s.join("file"), b"9876543210").expect("write");
    set_mtime(&s.join("file"), 1_000_000_000);
    fs::set_permissions(s.join("file"), fs::Permissions::from_mode(0o666)).expect("chmod");
    std::os::unix::fs::chown(s.join("file"), Some(1234), Some(1234)).expect("chown");
    fs::write(s.join("new"), b"not outside").expect("write");
    symlink(out.path().join("victim"), dst.path().join("file")).expect("plant");
    // Dangling: O_CREAT without O_EXCL|O_NOFOLLOW would create the target.
    symlink(out.path().join("created"), dst.path().join("new")).expect("plant");
    let before = observe(out.path());
    sync_and_check(s, dst.path(), out.path(), &before);
    assert!(!out.path().join("created").exists());
    assert!(fs::symlink_metadata(dst.path().join("file"))
        .expect("stat")
        .is_file());
}

#[test]
fn a_planted_hard_link_to_an_outside_file_is_not_changed_in_place() {
    let (src, dst, out) = (tempdir(), tempdir(), outside());
    let s = src.path();
    fs::write(s.join("hl"), b"0123456789").expect("write");
    set_mtime(&s.join("hl"), 1_000_000_000);
    fs::set_permissions(s.join("hl"), fs::Permissions::from_mode(0o4755)).expect("chmod");
    std::os::unix::fs::chown(s.join("hl"), Some(0), Some(0)).expect("chown");
    xattr::set(s.join("hl"), "user.other", b"value").expect("xattr");
    // Same size and mtime: only the metadata seems to differ.
    fs::hard_link(out.path().join("victim"), dst.path().join("hl")).expect("plant");
    let before = observe(out.path());
    sync_and_check(s, dst.path(), out.path(), &before);
    let victim = fs::metadata(out.path().join("victim")).expect("stat");
    assert_eq!(victim.nlink(), 1, "the planted name was replaced");
}

#[test]
fn a_symlink_planted_between_two_syncs_replaces_nothing_outside() {
    let (src, dst, out) = (tempdir(), tempdir(), outside());
    let s = src.path();
    fs::create_dir(s.join("dir")).expect("mkdir");
    fs::write(s.join("dir/a"), b"first").expect("write");
    fs::write(s.join("dir/old"), b"old").expect("write");
    set_future_atimes(s);
    mirror(s, dst.path(), None).expect("first sync");
    assert_in_sync(s, dst.path());

    fs::remove_dir_all(dst.path().join("dir")).expect("rm");
    symlink(out.path().join("sub"), dst.path().join("dir")).expect("plant");
    fs::write(s.join("dir/a"), b"second").expect("write");
    fs::write(s.join("dir/new"), b"new").expect("write");
    fs::remove_file(s.join("dir/old")).expect("rm");
    let before = observe(out.path());
    sync_and_check(s, dst.path(), out.path(), &before);
}

#[test]
fn destination_only_symlinks_and_trees_are_removed_without_following() {
    let (src, dst, out) = (tempdir(), tempdir(), outside());
    let d = dst.path();
    fs::write(src.path().join("kept"), b"kept").expect("write");
    symlink(out.path(), d.join("gone")).expect("plant");
    symlink(out.path().join("victim"), d.join("gonefile")).expect("plant");
    fs::create_dir_all(d.join("olddir/sub")).expect("mkdir");
    symlink(out.path(), d.join("olddir/link")).expect("plant");
    symlink(out.path().join("sub"), d.join("olddir/sub/link2")).expect("plant");
    fs::hard_link(out.path().join("sub/a"), d.join("olddir/sub/hard")).expect("plant");
    let before = observe(out.path());
    let stats = mirror(src.path(), d, None).expect("sync");
    assert_eq!(stats.deleted, 7, "{stats:?}");
    assert_eq!(&observe(out.path()), &before);
    assert_in_sync(src.path(), d);
}

/// A symlink in the source is copied as a symlink; the directory it points to is not
/// walked (its contents would otherwise show up below the destination).
#[test]
fn source_symlinks_are_copied_not_followed() {
    let (src, dst, out) = (tempdir(), tempdir(), outside());
    symlink(out.path(), src.path().join("to-outside")).expect("symlink");
    symlink(out.path().join("victim"), src.path().join("to-file")).expect("symlink");
    let before = observe(out.path());
    set_future_atimes(src.path());
    let stats = mirror(src.path(), dst.path(), None).expect("sync");
    assert_eq!((stats.links_written, stats.files_written), (2, 0), "{stats:?}");
    assert_eq!(&observe(out.path()), &before);
    assert_in_sync(src.path(), dst.path());
    assert_eq!(fs::read_dir(dst.path()).expect("read_dir").count(), 2);
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in("/tmp").expect("tempdir")
}
