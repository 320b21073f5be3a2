use super::*;
use crate::copy::ops::*;
use nix::sys::stat::UtimensatFlags;
use nix::sys::time::TimeSpec;
use nix::unistd::Whence;
use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

fn open_file(path: &Path) -> File {
    File::open(path).expect("open test file")
}

fn create_file(path: &Path) -> File {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .expect("create test file")
}

fn sparse_fixture(dir: &Path) -> (PathBuf, Vec<(u64, Vec<u8>)>, u64) {
    let path = dir.join("sparse");
    let file = create_file(&path);
    let size = 64 * 1024 * 1024 + 100;
    let chunks = vec![
        (0, vec![b'a'; 4096]),
        (8 * 1024 * 1024, vec![b'b'; 10_000]),
        (size - 100, vec![b'c'; 100]),
    ];
    for (offset, data) in &chunks {
        file.write_all_at(data, *offset).expect("write sparse chunk");
    }
    file.set_len(size).expect("extend sparse file");
    (path, chunks, size)
}

fn copy_one(src: &Path, dst: &Path, try_copy_file_range: bool) -> CopyStats {
    let (src_file, dst_file) = (open_file(src), create_file(dst));
    let st = stat::fstat(&src_file).expect("stat source");
    let mut transfer = Transfer::default();
    transfer.no_copy_file_range = !try_copy_file_range;
    let mut stats = CopyStats::default();
    transfer
        .copy_data(&src_file, &dst_file, &st, &mut |n| stats.bytes += n)
        .map_err(|f| f.at(PathBuf::from("sparse")))
        .expect("copy data");
    stats
}

fn assert_sparse_copy(try_copy_file_range: bool) {
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let (src, chunks, size) = sparse_fixture(dir.path());
    let dst = dir.path().join("copy");
    let stats = copy_one(&src, &dst, try_copy_file_range);
    let data_len: usize = chunks.iter().map(|(_, d)| d.len()).sum();
    assert_eq!(fs::metadata(&dst).expect("stat copy").len(), size);
    let copied = open_file(&dst);
    for (offset, data) in &chunks {
        let mut back = vec![0; data.len()];
        copied.read_exact_at(&mut back, *offset).expect("read back chunk");
        assert_eq!(&back, data, "chunk at {offset}");
    }
    let mut hole = vec![1; 4096];
    copied
        .read_exact_at(&mut hole, 4 * 1024 * 1024)
        .expect("read hole");
    assert!(hole.iter().all(|&b| b == 0));
    // Only the data ranges (rounded to the filesystem's blocks) were copied.
    assert!(
        stats.bytes >= data_len as u64 && stats.bytes < 1024 * 1024,
        "{stats:?}"
    );
    let allocated = fs::metadata(&dst).expect("stat copy").blocks() * 512;
    assert!(allocated < 1024 * 1024, "copy allocates {allocated} bytes");
    let hole_at = seek(&copied, 4096 * 2, Whence::SeekHole).expect("SEEK_HOLE");
    assert!(hole_at < 8 * 1024 * 1024, "first hole at {hole_at}");
}

#[test]
fn copy_sparse_file_with_copy_file_range_keeps_holes() {
    assert_sparse_copy(true);
}

#[test]
fn copy_sparse_file_with_read_write_keeps_holes() {
    assert_sparse_copy(false);
}

#[test]
fn copy_dense_file_both_ways_is_exact() {
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let src = dir.path().join("dense");
    // Not a multiple of the buffer, to cover the short final chunk.
    let data: Vec<u8> = (0..COPY_BUF * 3 + 12_345).map(|i| (i * 31 % 251) as u8).collect();
    fs::write(&src, &data).expect("write dense file");
    for (i, try_cfr) in [true, false].into_iter().enumerate() {
        let dst = dir.path().join(format!("copy{i}"));
        let stats = copy_one(&src, &dst, try_cfr);
        assert_eq!(fs::read(&dst).expect("read copy"), data);
        assert_eq!(stats.bytes, data.len() as u64);
    }
}

/// ext4 (/tmp) to tmpfs (/dev/shm) is refused with EXDEV; the copy must fall back
/// and stop trying, while a real error (EBADF for an append-only destination) is
/// reported against the copy.
#[test]
fn refused_copy_file_range_falls_back_and_real_errors_abort() {
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let shm = tempfile::tempdir_in("/dev/shm").expect("tempdir on tmpfs");
    let src = dir.path().join("src");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    fs::write(&src, &data).expect("write");
    let src_dev = fs::metadata(&src).expect("stat").dev();
    assert_ne!(
        src_dev,
        fs::metadata(shm.path()).expect("stat").dev(),
        "needs two filesystems"
    );
    let dst = shm.path().join("dst");
    let stats = copy_one(&src, &dst, true);
    assert_eq!(fs::read(&dst).expect("read copy"), data);
    assert_eq!(stats.bytes, data.len() as u64);

    let appending = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.path().join("appending"))
        .expect("open");
    let mut transfer = Transfer::default();
    let err = transfer
        .copy_range(&open_file(&src), &appending, 0, 5, &mut |_| {})
        .map_err(|f| f.at(PathBuf::from("appending")))
        .expect_err("append-only destination is an error");
    assert!(
        matches!(
            err,
            CopyError::Destination {
                op: "copy data into",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        !transfer.no_copy_file_range,
        "a real error must not disable copy_file_range"
    );
}

/// A file shorter than its stat said (it shrank meanwhile): the copy ends at its
/// real end, and the short count does not turn copy_file_range off for good.
#[test]
fn a_source_that_shrank_ends_the_copy_early() {
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let src = dir.path().join("src");
    fs::write(&src, b"only eleven").expect("write");
    let dst = create_file(&dir.path().join("dst"));
    let mut transfer = Transfer::default();
    let mut bytes = 0;
    transfer
        .copy_range(&open_file(&src), &dst, 0, 4096, &mut |n| bytes += n)
        .map_err(|f| f.at(PathBuf::from("src")))
        .expect("copy");
    assert_eq!(bytes, 11);
    assert!(!transfer.no_copy_file_range);
    assert_eq!(fs::read(dir.path().join("dst")).expect("read"), b"only eleven");
}

/// Links whose first copy is in the same directory, an ancestor, a finished
/// sibling subtree and a deeper directory all resolve, and records are dropped once
/// every name was seen.
#[test]
fn hard_links_resolve_from_any_directory() {
    let src = tempfile::tempdir_in("/tmp").expect("tempdir");
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    let s = src.path();
    for dir in ["a/deep/er", "b/c", "z"] {
        fs::create_dir_all(s.join(dir)).expect("mkdir");
    }
    fs::write(s.join("a/deep/er/f"), b"one").expect("write");
    for link in ["a/deep/er/g", "a/h", "b/c/i", "z/j", "k"] {
        fs::hard_link(s.join("a/deep/er/f"), s.join(link)).expect("link");
    }
    fs::write(s.join("b/pair1"), b"two").expect("write");
    fs::hard_link(s.join("b/pair1"), s.join("b/c/pair2")).expect("link");
    // One name outside the tree: its record must survive, without harm.
    fs::write(s.join("z/outside-linked"), b"three").expect("write");
    let outside = tempfile::tempdir_in("/tmp").expect("tempdir");
    fs::hard_link(s.join("z/outside-linked"), outside.path().join("o")).expect("link");

    let src_fd = open_root(s).expect("open src");
    let dst_fd = open_root(dst.path()).expect("open dst");
    let root_dev = stat::fstat(&src_fd).expect("stat").st_dev;
    let mut copier = Copier::new(root_dev, false, None);
    copier.run(src_fd, dst_fd).expect("copy");

    let d = dst.path();
    let ino = |p: &str| fs::symlink_metadata(d.join(p)).expect("stat copy").ino();
    let first = ino("a/deep/er/f");
    for link in ["a/deep/er/g", "a/h", "b/c/i", "z/j", "k"] {
        assert_eq!(ino(link), first, "{link}");
    }
    assert_eq!(fs::symlink_metadata(d.join("k")).expect("stat").nlink(), 6);
    assert_eq!(ino("b/pair1"), ino("b/c/pair2"));
    assert_ne!(ino("b/pair1"), first);
    assert_eq!(fs::read(d.join("z/j")).expect("read"), b"one");
    assert_eq!(copier.reporter.stats.hardlinks, 6);
    assert_eq!(copier.reporter.stats.files, 3);
    let left: Vec<_> = copier.links.values().map(|f| f.path.to_vec()).collect();
    assert_eq!(left, vec![b"z/outside-linked".to_vec()]);
}

#[test]
fn errors_name_the_relative_path_and_side() {
    let src = tempfile::tempdir_in("/tmp").expect("tempdir");
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    let name = OsString::from_vec(b"d\xff/x y".to_vec());
    fs::create_dir(src.path().join(OsString::from_vec(b"d\xff".to_vec()))).expect("mkdir");
    fs::write(src.path().join(&name), b"data").expect("write");
    fs::create_dir(dst.path().join(OsString::from_vec(b"d\xff".to_vec()))).expect("mkdir");
    let err = copy_tree(src.path(), dst.path(), None).expect_err("existing directory");
    let CopyError::Destination { op, path, source } = &err else {
        panic!("expected a destination error, got {err:?}");
    };
    assert_eq!(
        (*op, source.raw_os_error()),
        ("create directory", Some(libc::EEXIST))
    );
    assert_eq!(path.as_os_str().as_bytes(), b"d\xff");
    assert_eq!(err.to_string(), "cannot create directory `d\u{fffd}` in the copy");
    assert!(!err.is_no_space());
    let missing = copy_tree(&src.path().join("nope"), dst.path(), None).expect_err("missing source");
    assert!(
        matches!(&missing, CopyError::Source { op: "open directory", path, .. } if path == Path::new("."))
    );
}

#[test]
fn directory_metadata_is_applied_after_contents() {
    let src = tempfile::tempdir_in("/tmp").expect("tempdir");
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    let ro = src.path().join("ro");
    fs::create_dir(&ro).expect("mkdir");
    fs::write(ro.join("inside"), b"x").expect("write");
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).expect("chmod");
    let when = TimeSpec::new(1_234_567_890, 123_456_789);
    stat::utimensat(
        fcntl::AT_FDCWD,
        &ro,
        &when,
        &when,
        UtimensatFlags::NoFollowSymlink,
    )
    .expect("utimens");
    copy_tree(src.path(), dst.path(), None).expect("copy");
    let meta = fs::metadata(dst.path().join("ro")).expect("stat copy");
    assert_eq!(meta.mode() & 0o7777, 0o555);
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_234_567_890, 123_456_789));
    assert_eq!(fs::read(dst.path().join("ro/inside")).expect("read"), b"x");
}
