//! `sync_tree_with` in merge mode (`down`'s last pass, from a detached tmpfs into a disk
//! directory the application writes to again): nothing on disk is deleted, and what
//! changed on disk at or after the cutoff wins over the RAM copy.
//!
//! Plain directories under /tmp; the cutoff is taken between two pauses, so entries
//! changed before it have older ctimes and entries changed after it newer ones.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tmpfsctl::copy::{sync_tree, sync_tree_with, SyncOptions, SyncStats};

fn write(p: &Path, s: &str) {
    fs::write(p, s).unwrap();
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap()
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// A cutoff with a pause on both sides: well after every ctime so far, well before any
/// later one, whatever the timestamp granularity of the kernel clock.
fn cutoff() -> (i64, i64) {
    std::thread::sleep(Duration::from_millis(50));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    (now.as_secs() as i64, i64::from(now.subsec_nanos()))
}

fn merge(src: &Path, dst: &Path, cutoff: (i64, i64)) -> SyncStats {
    sync_tree_with(src, dst, SyncOptions::merge_since(cutoff), None).expect("merge")
}

/// Source and destination after a mirror, then changed on both sides: some before the
/// cutoff (the RAM copy moved on while the disk stayed as the first pass left it), some
/// after (the application, back on its disk directory).
struct Setup {
    _src: tempfile::TempDir,
    _dst: tempfile::TempDir,
    cut: (i64, i64),
}

fn setup() -> (Setup, std::path::PathBuf, std::path::PathBuf) {
    let src_t = tempfile::tempdir_in("/tmp").unwrap();
    let dst_t = tempfile::tempdir_in("/tmp").unwrap();
    let (src, dst) = (src_t.path().to_path_buf(), dst_t.path().to_path_buf());
    write(&src.join("old-changed"), "ram v1");
    write(&src.join("disk-changed"), "ram v1");
    write(&src.join("same"), "same");
    fs::create_dir(src.join("dir")).unwrap();
    write(&src.join("dir/inner"), "inner v1");
    chmod(&src.join("dir"), 0o755);
    fs::create_dir(src.join("dir-old")).unwrap();
    chmod(&src.join("dir-old"), 0o755);
    write(&src.join("became-dir"), "ram file");
    fs::create_dir(src.join("in-the-way")).unwrap();
    write(&src.join("in-the-way/below"), "below");
    sync_tree(&src, &dst, None).expect("first pass");

    // Before the cutoff: RAM moves on; the disk is as the first pass left it, plus
    // what was there before (a name the RAM never had).
    write(&dst.join("disk-only-old"), "disk");
    write(&src.join("old-changed"), "ram v2, longer");
    chmod(&src.join("dir-old"), 0o750);
    write(&src.join("dir/inner"), "inner v2, longer");
    write(&src.join("dir/new-in-ram"), "ram");
    write(&src.join("missing-on-disk"), "ram only");
    fs::remove_dir_all(src.join("in-the-way")).unwrap();
    write(&src.join("in-the-way"), "ram file now");
    fs::remove_file(src.join("same")).unwrap();
    let cut = cutoff();

    // After the cutoff: the application writes to the disk directory.
    write(&src.join("disk-changed"), "ram v2, late");
    write(&dst.join("disk-changed"), "disk v2");
    write(&dst.join("disk-only-new"), "disk new");
    chmod(&src.join("dir"), 0o700);
    chmod(&dst.join("dir"), 0o711);
    fs::remove_file(dst.join("became-dir")).unwrap();
    fs::create_dir(dst.join("became-dir")).unwrap();
    write(&dst.join("became-dir/app"), "app");
    (
        Setup {
            _src: src_t,
            _dst: dst_t,
            cut,
        },
        src,
        dst,
    )
}

#[test]
fn merge_deletes_nothing_and_keeps_what_changed_on_disk_after_the_cutoff() {
    let (s, src, dst) = setup();
    let stats = merge(&src, &dst, s.cut);

    // Names only the disk has stay, old or new.
    assert_eq!(read(&dst.join("disk-only-old")), "disk");
    assert_eq!(read(&dst.join("disk-only-new")), "disk new");
    assert_eq!(
        read(&dst.join("same")),
        "same",
        "gone from RAM, still not deleted"
    );
    assert_eq!(stats.deleted, 0, "{stats:?}");
    // Changed on disk after the cutoff: the disk's version wins over a differing RAM.
    assert_eq!(read(&dst.join("disk-changed")), "disk v2");
    // Older on disk and different in RAM: rewritten.
    assert_eq!(read(&dst.join("old-changed")), "ram v2, longer");
    assert_eq!(read(&dst.join("dir/inner")), "inner v2, longer");
    // Missing on disk: written, also inside a directory whose metadata is kept.
    assert_eq!(read(&dst.join("missing-on-disk")), "ram only");
    assert_eq!(read(&dst.join("dir/new-in-ram")), "ram");
    // A directory changed on disk after the cutoff keeps its mode.
    assert_eq!(mode(&dst.join("dir")), 0o711);
    // One unchanged on disk since takes the RAM's.
    assert_eq!(mode(&dst.join("dir-old")), 0o750);
    // A type change on disk after the cutoff wins, with what is below it.
    assert!(dst.join("became-dir").is_dir());
    assert_eq!(read(&dst.join("became-dir/app")), "app");
    // A directory in the way of a RAM file is not removed by a pass that deletes
    // nothing.
    assert_eq!(read(&dst.join("in-the-way/below")), "below");
    // disk-changed, dir (metadata), became-dir, in-the-way.
    assert_eq!(stats.kept_newer, 4, "{stats:?}");
    // old-changed, dir/inner, dir/new-in-ram, missing-on-disk.
    assert_eq!(stats.files_written, 4, "{stats:?}");
    assert_eq!(stats.metadata_updated, 1, "dir-old: {stats:?}");
    // No temporaries left behind.
    for e in walk(&dst) {
        assert!(!e.contains(tmpfsctl::copy::TEMP_PREFIX), "temporary left: {e}");
    }
}

#[test]
fn a_mirror_of_the_same_trees_would_have_lost_the_applications_changes() {
    // The reference the merge is measured against: `sync_tree` (pass 1's mode) makes
    // the disk equal to the RAM, so every change above would be undone.
    let (_s, src, dst) = setup();
    let stats = sync_tree(&src, &dst, None).expect("mirror");
    assert!(!dst.join("disk-only-new").exists());
    assert_eq!(read(&dst.join("disk-changed")), "ram v2, late");
    assert!(stats.deleted > 0);
    assert_eq!(stats.kept_newer, 0);
}

#[test]
fn merge_without_a_cutoff_writes_everything_but_deletes_nothing() {
    let (_s, src, dst) = setup();
    let opts = SyncOptions {
        delete: false,
        keep_changed_since: None,
    };
    let stats = sync_tree_with(&src, &dst, opts, None).expect("sync");
    assert_eq!(read(&dst.join("disk-changed")), "ram v2, late");
    assert_eq!(read(&dst.join("disk-only-new")), "disk new");
    assert_eq!(read(&dst.join("same")), "same");
    assert_eq!(stats.deleted, 0, "{stats:?}");
}

#[test]
fn merge_from_the_tree_leaves_a_second_merge_with_nothing_to_do() {
    let (s, src, dst) = setup();
    merge(&src, &dst, s.cut);
    let again = merge(&src, &dst, s.cut);
    assert_eq!(
        (
            again.files_written,
            again.deleted,
            again.metadata_updated,
            again.links_written
        ),
        (0, 0, 0, 0),
        "{again:?}"
    );
}

fn walk(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            out.push(e.path().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    out
}
