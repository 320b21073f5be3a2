//! `copy_tree` must produce a tree indistinguishable from its source: checked with an
//! independent metadata walker and, where installed, with `rsync -aHAXn`. So must
//! `apply` and `down`, run end to end.
//!
//! The tests need root (ownership, device nodes, `trusted.*` xattrs, mounts). Every
//! tmpfs is mounted inside a private mount namespace owned by one thread, so nothing
//! is ever mounted on the host.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::common;
use crate::common_copy::*;
use tmpfsctl::copy::{copy_tree, measure, CopyError, CopyStats};

fn assert_stats(stats: &CopyStats, expected: &Expected) {
    let got = (
        stats.files,
        stats.dirs,
        stats.symlinks,
        stats.specials,
        stats.hardlinks,
    );
    let want = (
        expected.files,
        expected.dirs,
        expected.symlinks,
        expected.specials,
        expected.hardlinks,
    );
    assert_eq!(
        got, want,
        "(files, dirs, symlinks, specials, hardlinks) of {stats:?}"
    );
    // The sparse file adds its data blocks only, not its gigabyte of holes.
    let sparse_data = stats.bytes - expected.dense_bytes;
    assert!((9 * 1024..=1 << 20).contains(&sparse_data), "{stats:?}");
}

#[test]
fn copy_into_a_directory_matches_the_source() {
    let (src, expected) = fixture();
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    let stats = copy_tree(src.path(), dst.path(), None).expect("copy");
    assert_stats(&stats, &expected);
    assert_parity(src.path(), dst.path());

    // Both checks must notice a single changed attribute.
    let victim = dst.path().join("xattr/file");
    xattr::set(&victim, "user.mime_type", b"changed").expect("set xattr");
    let changed = snapshot(dst.path());
    assert_ne!(
        changed[&b"xattr/file"[..]],
        snapshot(src.path())[&b"xattr/file"[..]]
    );
    if let Some(diff) = rsync_differences(src.path(), dst.path()) {
        assert!(diff.contains("xattr/file"), "rsync missed the change: {diff:?}");
    }
}

#[test]
fn copy_into_a_fresh_tmpfs_matches_the_source() {
    let (src, expected) = fixture();
    let mnt = tempfile::tempdir_in("/tmp").expect("tempdir");
    in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(mnt.path(), "size=256m,mode=0700");
        let stats = copy_tree(src.path(), mnt.path(), None).expect("copy");
        assert_stats(&stats, &expected);
        assert_parity(src.path(), mnt.path());
        let size = measure(mnt.path()).expect("measure the copy");
        assert_eq!(size.inodes, expected.inodes());
    });
}

/// A source none of whose pages are cached (a seed at boot) is read with `O_DIRECT`:
/// the copy is exact at every size around the alignment and the chunk, and the disk's
/// page cache is left as it was, holding none of what the tmpfs now does. A file
/// with cached pages is read through the cache, as before.
#[test]
fn a_cold_source_is_copied_exactly_without_filling_the_page_cache() {
    let at = tempfile::tempdir_in("/tmp").expect("tempdir");
    in_private_mount_ns(|| {
        // noatime: the copy's reads must not move the times it compares.
        let disk = common::LoopFs::new(&at.path().join("disk"), 64, "noatime");
        let src = disk.mount_point.join("cache");
        fs::create_dir(&src).unwrap();
        let sizes = [
            1,
            511,
            4095,
            4096,
            4097,
            131_071,
            131_072,
            131_073,
            300_001,
            (1 << 20) + 5,
        ];
        for (i, len) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..*len).map(|b: usize| (b * 31 + i) as u8).collect();
            let mut f = File::create(src.join(format!("f{len}"))).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
        }
        fs::write(src.join("warm"), vec![7u8; 70_000]).unwrap();
        for len in sizes {
            let f = File::open(src.join(format!("f{len}"))).unwrap();
            nix::fcntl::posix_fadvise(&f, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED)
                .expect("drop the file's pages");
            assert_eq!(resident(&src.join(format!("f{len}"))), 0, "f{len} still cached");
        }
        let dst = at.path().join("ram");
        fs::create_dir(&dst).unwrap();
        let _tmpfs = mount_tmpfs(&dst, "size=64m,mode=0700");
        let stats = copy_tree(&src, &dst, None).expect("seed");
        assert_eq!(stats.files, sizes.len() as u64 + 1, "{stats:?}");
        for len in sizes {
            assert_eq!(
                resident(&src.join(format!("f{len}"))),
                0,
                "f{len} was read through the page cache"
            );
        }
        assert!(resident(&src.join("warm")) > 0);
        // Reads every byte of both sides, so after the residency checks.
        assert_in_sync(&src, &dst);
        drop(_tmpfs);
        drop(disk);
    });
}

/// Bytes of `path` in the page cache, as util-linux's `fincore` counts them.
fn resident(path: &Path) -> u64 {
    let out = common::run_tool(
        "fincore",
        &[
            "--bytes".as_ref(),
            "--noheadings".as_ref(),
            "--output".as_ref(),
            "RES".as_ref(),
            path.as_os_str(),
        ],
    );
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("fincore {}: {out:?}", path.display()))
}

#[test]
fn measure_counts_the_fixture() {
    let (src, expected) = fixture();
    let size = measure(src.path()).expect("measure");
    let tree = snapshot(src.path());
    let mut seen = std::collections::HashSet::new();
    let (mut apparent, mut allocated) = (0, 0);
    for (rel, meta) in &tree {
        // Count each hard-linked inode once, through its first name.
        if meta.link_group.as_ref().is_some_and(|first| first != rel) {
            continue;
        }
        assert!(seen.insert(rel));
        apparent += fs::symlink_metadata(src.path().join(OsStr::from_bytes(rel)))
            .expect("stat")
            .size();
        allocated += meta.blocks * 512;
    }
    assert_eq!(size.inodes, expected.inodes());
    assert_eq!(size.inodes, seen.len() as u64);
    assert_eq!(size.apparent, apparent);
    assert_eq!(size.allocated, allocated);
    assert!(size.apparent > SPARSE_SIZE + BIG_SIZE as u64);
    assert!(size.allocated < 64 << 20, "holes are not allocated: {size:?}");
}

#[test]
fn planted_symlinks_in_the_destination_are_not_followed() {
    let src = tempfile::tempdir_in("/tmp").expect("tempdir");
    fs::create_dir(src.path().join("sub")).expect("mkdir");
    fs::write(src.path().join("sub/evil"), b"must stay inside").expect("write");
    fs::write(src.path().join("file"), b"must stay inside").expect("write");
    let outside = tempfile::tempdir_in("/tmp").expect("tempdir");
    fs::write(outside.path().join("marker"), b"untouched").expect("write");
    let before = fs::metadata(outside.path())
        .expect("stat")
        .modified()
        .expect("mtime");

    // A directory name pointing outside.
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    std::os::unix::fs::symlink(outside.path(), dst.path().join("sub")).expect("plant");
    let err = copy_tree(src.path(), dst.path(), None).expect_err("planted directory symlink");
    assert!(
        matches!(&err, CopyError::Destination { op: "create directory", path, source }
            if path == Path::new("sub") && source.raw_os_error() == Some(libc::EEXIST)),
        "{err:?}"
    );
    assert!(err.to_string().contains("`sub`"), "{err}");

    // A dangling file name pointing outside: O_CREAT without O_EXCL would create it.
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    std::os::unix::fs::symlink(outside.path().join("created"), dst.path().join("file")).expect("plant");
    let err = copy_tree(src.path(), dst.path(), None).expect_err("planted file symlink");
    assert!(
        matches!(&err, CopyError::Destination { op: "create file", path, .. } if path == Path::new("file")),
        "{err:?}"
    );

    let names: Vec<_> = fs::read_dir(outside.path())
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![OsString::from("marker")]);
    assert_eq!(
        fs::read(outside.path().join("marker")).expect("read"),
        b"untouched"
    );
    assert_eq!(
        fs::metadata(outside.path())
            .expect("stat")
            .modified()
            .expect("mtime"),
        before
    );
}

#[test]
fn a_full_tmpfs_is_reported_as_no_space_naming_the_file() {
    let src = tempfile::tempdir_in("/tmp").expect("tempdir");
    fs::create_dir(src.path().join("dir")).expect("mkdir");
    fs::write(src.path().join("dir/big file.bin"), noise(4 << 20, 9)).expect("write");
    let mnt = tempfile::tempdir_in("/tmp").expect("tempdir");
    in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(mnt.path(), "size=1m");
        let err = copy_tree(src.path(), mnt.path(), None).expect_err("4 MiB into 1 MiB");
        assert!(err.is_no_space(), "{err:?}");
        assert!(matches!(err, CopyError::Destination { .. }), "{err:?}");
        assert!(err.to_string().contains("`dir/big file.bin`"), "{err}");
    });
}

#[test]
fn other_filesystems_below_the_source_are_left_empty() {
    let src = tempfile::tempdir_in("/tmp").expect("tempdir");
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    fs::write(src.path().join("top.txt"), b"top").expect("write");
    let mnt = src.path().join("mnt");
    fs::create_dir(&mnt).expect("mkdir");
    in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(&mnt, "size=1m,mode=0751");
        fs::write(mnt.join("inside.txt"), b"on another filesystem").expect("write");
        let stats = copy_tree(src.path(), dst.path(), None).expect("copy");
        assert_eq!((stats.files, stats.dirs), (1, 1), "{stats:?}");
        let copied = dst.path().join("mnt");
        assert_eq!(fs::metadata(&copied).expect("stat").mode() & 0o7777, 0o751);
        assert_eq!(fs::read_dir(&copied).expect("read_dir").count(), 0);
        assert_eq!(measure(src.path()).expect("measure").inodes, 2);
    });
}

#[test]
fn progress_reports_running_totals() {
    let src = tempfile::tempdir_in("/tmp").expect("tempdir");
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    for d in 0..5 {
        let dir = src.path().join(format!("d{d}"));
        fs::create_dir(&dir).expect("mkdir");
        for f in 0..600 {
            File::create(dir.join(f.to_string()))
                .expect("create")
                .write_all(b"x")
                .expect("write");
        }
    }
    let mut seen: Vec<CopyStats> = Vec::new();
    let mut record = |stats: &CopyStats| seen.push(stats.clone());
    let stats = copy_tree(src.path(), dst.path(), Some(&mut record)).expect("copy");
    assert_eq!((stats.files, stats.dirs, stats.bytes), (3000, 5, 3000));
    assert!(seen.len() >= 4, "{} reports", seen.len());
    assert!(seen
        .windows(2)
        .all(|w| w[0].files <= w[1].files && w[0].bytes <= w[1].bytes));
    let last = seen.last().expect("reported");
    assert_eq!(
        (last.files, last.dirs, last.bytes),
        (stats.files, stats.dirs, stats.bytes)
    );
}

/// Removes everything below `dir`, leaving `dir`.
fn empty(dir: &Path) {
    for e in fs::read_dir(dir).expect("read_dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_dir() {
            fs::remove_dir_all(e.path()).expect("remove a directory");
        } else {
            fs::remove_file(e.path()).expect("remove");
        }
    }
}

/// The sparse file stayed sparse in `got` (the fixture's is about 9 KiB of data).
fn assert_still_sparse(want: &Tree, got: &Tree, rel: &[u8]) {
    let (want, got) = (want[rel].blocks, got[rel].blocks);
    assert!(got <= want + 128, "{} blocks, the source {want}", got);
}

/// The binary, end to end on the fixture: `apply` seeds the tmpfs with all of it;
/// then in RAM the seeded tree is replaced by a fresh one under another name, so
/// that `down`'s write-back has to delete and create every kind of entry.
#[test]
fn apply_and_down_keep_every_kind_of_entry() {
    let sb = common::Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    build_fixture(&cache);
    let on_disk = snapshot(&cache);
    let spec = sb.one_mount_spec("cache", &cache, "64MiB", "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let top = sb.top(&cache).expect("a mount");
    assert_eq!(
        (top.fstype.as_str(), top.source.as_str()),
        ("tmpfs", "tmpfsctl-cache")
    );
    let seeded = snapshot(&cache);
    assert_same_tree(&on_disk, &seeded);
    assert_same_contents(&sb.state.join("lower/cache"), &cache, &on_disk);
    assert_still_sparse(&on_disk, &seeded, b"sparse.img");

    empty(&cache);
    let ram = cache.join("ram");
    fs::create_dir(&ram).expect("mkdir");
    build_fixture(&ram);
    let in_ram = snapshot(&cache);
    // The fixture's contents are the same on every build: a second one on disk
    // stands for the RAM's after the unmount.
    let reference = sb.path("reference");
    fs::create_dir(&reference).expect("mkdir");
    build_fixture(&reference);
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert!(sb.mounts_at(&cache).is_empty(), "{:?}", sb.mounts());
    let written = snapshot(&cache);
    assert_same_tree(&in_ram, &written);
    assert_same_contents(&reference, &ram, &snapshot(&reference));
    assert_still_sparse(&in_ram, &written, b"ram/sparse.img");
}
