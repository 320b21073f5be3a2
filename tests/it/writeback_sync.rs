//! `sync_tree` must leave the on-disk tree equal to the tmpfs (checked with the
//! metadata walker of `common_copy` and `rsync -aHAXn --delete`), writing only what
//! changed: every round below changes one thing and checks the statistics and which
//! destination inodes were replaced.
//!
//! Needs root. The source is a tmpfs mounted in a private mount namespace; the
//! destination a directory under /tmp.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::common_copy::*;
use nix::sys::stat::{utimensat, UtimensatFlags};
use nix::sys::time::TimeSpec;
use tmpfsctl::copy::{SyncStats, TEMP_PREFIX};

/// A fixture on a fresh tmpfs (`src`) and an empty directory under /tmp (`dst`), in a
/// private mount namespace.
fn with_fixture(test: impl FnOnce(&Path, &Path, &Expected) + Send) {
    let mnt = tempfile::tempdir_in("/tmp").expect("tempdir");
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(mnt.path(), "size=2g,mode=0755");
        let expected = build_fixture(mnt.path());
        test(mnt.path(), dst.path(), &expected);
    });
}

fn sync(src: &Path, dst: &Path) -> SyncStats {
    mirror(src, dst, None).expect("sync")
}

/// Every source entry is counted once, in exactly one of these.
fn entries_counted(stats: &SyncStats) -> u64 {
    stats.files_written
        + stats.metadata_updated
        + stats.dirs_created
        + stats.links_written
        + stats.specials_written
        + stats.unchanged
}

/// The counters besides `unchanged` and `bytes_written`, for compact comparisons:
/// (files, metadata, deleted, dirs, links, specials, temps).
fn written(stats: &SyncStats) -> [u64; 7] {
    [
        stats.files_written,
        stats.metadata_updated,
        stats.deleted,
        stats.dirs_created,
        stats.links_written,
        stats.specials_written,
        stats.temp_removed,
    ]
}

fn path(root: &Path, rel: &[u8]) -> PathBuf {
    root.join(OsStr::from_bytes(rel))
}

/// Sets atime (in the future, out of relatime's reach) and mtime of an entry.
fn set_times(p: &Path, mtime_s: i64, mtime_ns: i64) {
    let atime = TimeSpec::new(4_000_000_000, 5);
    let mtime = TimeSpec::new(mtime_s, mtime_ns);
    utimensat(
        nix::fcntl::AT_FDCWD,
        p,
        &atime,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    )
    .expect("utimens");
}

/// Paths whose destination inode was replaced, created or removed by one sync.
fn replaced(before: &std::collections::BTreeMap<Vec<u8>, (u64, u32)>, dst: &Path) -> BTreeSet<String> {
    let after = inodes(dst);
    let mut changed = BTreeSet::new();
    for (rel, ino) in before {
        if after.get(rel) != Some(ino) {
            changed.insert(String::from_utf8_lossy(rel).into_owned());
        }
    }
    for rel in after.keys().filter(|rel| !before.contains_key(*rel)) {
        changed.insert(String::from_utf8_lossy(rel).into_owned());
    }
    changed
}

/// One incremental round: what it changes in the source, the counters it expects
/// (`[files, metadata, deleted, dirs, links, specials, temps]`) and the destination
/// paths whose inode it replaces, creates or removes (`dir/**`: all below `dir`).
struct Round {
    what: &'static str,
    change: fn(&Path),
    counters: [u64; 7],
    replaced: &'static [&'static str],
}

/// Applies the round's change, syncs, and checks that the trees agree and that the
/// counters and replaced inodes are the expected ones.
fn run_round(src: &Path, dst: &Path, round: &Round) {
    let what = round.what;
    (round.change)(src);
    let before = inodes(dst);
    let stats = sync(src, dst);
    let (src_tree, _) = assert_in_sync(src, dst);
    assert_eq!(written(&stats), round.counters, "{what}: {stats:?}");
    assert_eq!(
        entries_counted(&stats),
        src_tree.len() as u64,
        "{what}: {stats:?}"
    );
    let mut want = BTreeSet::new();
    for pattern in round.replaced {
        match pattern.strip_suffix("/**") {
            Some(dir) => want.extend(
                before
                    .keys()
                    .map(|rel| String::from_utf8_lossy(rel).into_owned())
                    .filter(|rel| rel.starts_with(&format!("{dir}/"))),
            ),
            None => {
                want.insert(pattern.to_string());
            }
        }
    }
    assert_eq!(replaced(&before, dst), want, "{what}: replaced inodes");
}

#[test]
fn first_sync_copies_everything_and_a_second_one_writes_nothing() {
    with_fixture(|src, dst, expected| {
        let mut reports = 0;
        let mut count = |_: &SyncStats| reports += 1;
        let stats = mirror(src, dst, Some(&mut count)).expect("first sync");
        assert!(reports >= 1);
        assert_parity(src, dst);
        assert_eq!(stats.files_written, expected.files, "{stats:?}");
        assert_eq!(stats.dirs_created, expected.dirs, "{stats:?}");
        assert_eq!(
            stats.links_written,
            expected.symlinks + expected.hardlinks,
            "{stats:?}"
        );
        assert_eq!(stats.specials_written, expected.specials, "{stats:?}");
        assert_eq!(
            (
                stats.unchanged,
                stats.metadata_updated,
                stats.deleted,
                stats.temp_removed
            ),
            (0, 0, 0, 0)
        );
        // The sparse gigabyte is written as its data blocks only.
        assert!(
            stats.bytes_written >= expected.dense_bytes
                && stats.bytes_written < expected.dense_bytes + (1 << 20),
            "{stats:?}"
        );

        let before = inodes(dst);
        let dst_times: Vec<_> = before
            .keys()
            .map(|rel| fs::symlink_metadata(path(dst, rel)).expect("stat").ctime_nsec())
            .collect();
        let again = sync(src, dst);
        assert_eq!(written(&again), [0; 7], "{again:?}");
        assert_eq!(again.bytes_written, 0);
        assert_eq!(again.unchanged, entries_counted(&stats), "{again:?}");
        assert_eq!(inodes(dst), before, "a no-op sync must not replace anything");
        let after_times: Vec<_> = before
            .keys()
            .map(|rel| fs::symlink_metadata(path(dst, rel)).expect("stat").ctime_nsec())
            .collect();
        assert_eq!(after_times, dst_times, "a no-op sync must not touch any inode");
        assert_parity(src, dst);
    });
}

fn symlink(target: &str, at: &Path) {
    std::os::unix::fs::symlink(target, at).expect("symlink");
    set_times(at, 1_600_000_000, 3);
}

/// Every round changes one thing; a directory whose names change in the source has a
/// new mtime there, hence a metadata update on disk.
const ROUNDS: &[Round] = &[
    Round {
        what: "same size, new mtime",
        change: |s| {
            fs::write(s.join("plain.txt"), b"PLAIN TEXT\n").expect("write");
            set_times(&s.join("plain.txt"), 1_700_000_000, 1);
        },
        counters: [1, 0, 0, 0, 0, 0, 0],
        replaced: &["plain.txt"],
    },
    Round {
        what: "mtime differs by one nanosecond",
        change: |s| set_times(&s.join("plain.txt"), 1_700_000_000, 2),
        counters: [1, 0, 0, 0, 0, 0, 0],
        replaced: &["plain.txt"],
    },
    Round {
        what: "append",
        change: |s| {
            let mut f = OpenOptions::new()
                .append(true)
                .open(s.join("big.bin"))
                .expect("open");
            f.write_all(b"appended").expect("append");
        },
        counters: [1, 0, 0, 0, 0, 0, 0],
        replaced: &["big.bin"],
    },
    Round {
        what: "chmod only, letting no one more in",
        change: |s| {
            fs::set_permissions(s.join("bin/sgid"), fs::Permissions::from_mode(0o700)).expect("chmod")
        },
        counters: [0, 1, 0, 0, 0, 0, 0],
        replaced: &[],
    },
    // Nothing tells the RAM file is the one copied from the disk inode (a user's
    // own of the same size and mtime would look the same): written anew.
    Round {
        what: "chmod only, letting more in",
        change: |s| {
            fs::set_permissions(s.join("bin/sgid"), fs::Permissions::from_mode(0o750)).expect("chmod")
        },
        counters: [1, 0, 0, 0, 0, 0, 0],
        replaced: &["bin/sgid"],
    },
    Round {
        what: "chown only",
        change: |s| std::os::unix::fs::lchown(s.join("plain.txt"), Some(4321), Some(5432)).expect("chown"),
        counters: [1, 0, 0, 0, 0, 0, 0],
        replaced: &["plain.txt"],
    },
    Round {
        what: "xattr changed and removed",
        change: |s| {
            xattr::set(s.join("xattr/file"), "user.mime_type", b"text/changed").expect("set");
            xattr::remove(s.join("xattr/file"), "user.binary").expect("remove");
        },
        counters: [0, 1, 0, 0, 0, 0, 0],
        replaced: &[],
    },
    Round {
        what: "directory xattr and mode",
        change: |s| {
            xattr::set(s.join("xattr/dir"), "user.dir", b"changed").expect("set");
            fs::set_permissions(s.join("sticky"), fs::Permissions::from_mode(0o1770)).expect("chmod");
        },
        counters: [0, 2, 0, 0, 0, 0, 0],
        replaced: &[],
    },
    Round {
        what: "symlink retargeted",
        change: |s| {
            fs::remove_file(s.join("links/dangling")).expect("rm");
            symlink("elsewhere", &s.join("links/dangling"));
        },
        counters: [0, 1, 0, 0, 1, 0, 0],
        replaced: &["links/dangling"],
    },
    Round {
        what: "symlink owner only",
        change: |s| std::os::unix::fs::lchown(s.join("links/abs"), Some(77), Some(88)).expect("chown"),
        counters: [0, 0, 0, 0, 1, 0, 0],
        replaced: &["links/abs"],
    },
    Round {
        what: "delete a file",
        change: |s| fs::remove_file(s.join("names/with space")).expect("rm"),
        counters: [0, 1, 1, 0, 0, 0, 0],
        replaced: &["names/with space"],
    },
    Round {
        what: "delete a directory tree (40 levels, a file and a hard link)",
        change: |s| fs::remove_dir_all(s.join("deep")).expect("rm -r"),
        counters: [0, 0, 43, 0, 0, 0, 0],
        replaced: &["deep", "deep/**"],
    },
    Round {
        what: "rename",
        change: |s| fs::rename(s.join("shared/doc"), s.join("shared/renamed")).expect("rename"),
        counters: [1, 1, 1, 0, 0, 0, 0],
        replaced: &["shared/doc", "shared/renamed"],
    },
    Round {
        what: "file to directory",
        change: |s| {
            fs::remove_file(s.join("empty")).expect("rm");
            fs::create_dir(s.join("empty")).expect("mkdir");
            fs::write(s.join("empty/inside"), b"now a directory").expect("write");
            set_times(&s.join("empty/inside"), 1_600_000_000, 4);
            set_times(&s.join("empty"), 1_600_000_000, 5);
        },
        counters: [1, 0, 1, 1, 0, 0, 0],
        replaced: &["empty", "empty/inside"],
    },
    Round {
        what: "directory to symlink",
        change: |s| {
            fs::remove_dir_all(s.join("private")).expect("rm -r");
            symlink("sticky", &s.join("private"));
        },
        counters: [0, 0, 2, 0, 1, 0, 0],
        replaced: &["private", "private/secret"],
    },
    Round {
        what: "symlink to FIFO",
        change: |s| {
            fs::remove_file(s.join("links/rel")).expect("rm");
            nix::unistd::mkfifo(
                &s.join("links/rel"),
                nix::sys::stat::Mode::from_bits_truncate(0o600),
            )
            .expect("mkfifo");
            set_times(&s.join("links/rel"), 1_600_000_000, 7);
        },
        counters: [0, 1, 0, 0, 0, 1, 0],
        replaced: &["links/rel"],
    },
    Round {
        what: "new hard link to an existing pair",
        change: |s| fs::hard_link(s.join("hard/a"), s.join("hard/c")).expect("link"),
        counters: [0, 1, 0, 0, 1, 0, 0],
        replaced: &["hard/c"],
    },
    Round {
        what: "hard link broken",
        change: |s| {
            let b = s.join("hard/b");
            let md = fs::metadata(&b).expect("stat");
            fs::remove_file(&b).expect("rm");
            fs::write(&b, b"pair").expect("write");
            fs::set_permissions(&b, fs::Permissions::from_mode(md.mode() & 0o7777)).expect("chmod");
            set_times(&b, md.mtime(), md.mtime_nsec());
        },
        counters: [1, 1, 0, 0, 0, 0, 0],
        replaced: &["hard/b"],
    },
    Round {
        // Never changed in place: written anew, the other name linked to it.
        what: "metadata of a hard-linked file",
        change: |s| fs::set_permissions(s.join("hard/a"), fs::Permissions::from_mode(0o604)).expect("chmod"),
        counters: [1, 0, 0, 0, 1, 0, 0],
        replaced: &["hard/a", "hard/c"],
    },
    Round {
        what: "nothing",
        change: |_| {},
        counters: [0; 7],
        replaced: &[],
    },
];

#[test]
fn incremental_changes_are_synced_and_nothing_else() {
    with_fixture(|src, dst, _| {
        sync(src, dst);
        assert_in_sync(src, dst);
        for round in ROUNDS {
            run_round(src, dst, round);
            if round.what == "hard link broken" {
                let d = fs::symlink_metadata(dst.join("hard/a")).expect("stat");
                assert_eq!(d.nlink(), 2);
                assert_eq!(
                    d.ino(),
                    fs::symlink_metadata(dst.join("hard/c")).expect("stat").ino()
                );
            }
        }
    });
}

#[test]
fn leftover_temporaries_are_removed_and_reserved_names_skipped() {
    with_fixture(|src, dst, _| {
        sync(src, dst);
        let temp = |dir: &str, rest: &str| dst.join(dir).join(format!("{TEMP_PREFIX}{rest}"));
        fs::write(temp("", "0123456789abcdef"), b"half").expect("write");
        fs::create_dir(temp("readonly", "fedcba9876543210")).expect("mkdir");
        fs::write(temp("readonly", "fedcba9876543210").join("x"), b"x").expect("write");
        std::os::unix::fs::symlink("/etc/passwd", temp("links", "00000000000000ff")).expect("symlink");
        // A barrier the tracker left in the RAM root is never written back.
        fs::write(src.join(format!("{TEMP_PREFIX}barrier.1.2.3")), b"").expect("write");

        let stats = sync(src, dst);
        assert_eq!(stats.temp_removed, 3, "{stats:?}");
        // Planting them changed the mtimes of the two directories that held them.
        assert_eq!(written(&stats), [0, 2, 0, 0, 0, 0, 3], "{stats:?}");
        let left: Vec<_> = inodes(dst)
            .into_keys()
            .filter(|rel| {
                rel.split(|&b| b == b'/')
                    .any(|c| c.starts_with(TEMP_PREFIX.as_bytes()))
            })
            .collect();
        assert!(left.is_empty(), "left: {left:?}");
        fs::remove_file(src.join(format!("{TEMP_PREFIX}barrier.1.2.3"))).expect("rm");
        assert_parity(src, dst);
    });
}

#[test]
fn other_filesystems_below_the_source_are_not_entered_nor_emptied() {
    let src = tempfile::tempdir_in("/tmp").expect("tempdir");
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    fs::write(src.path().join("top.txt"), b"top").expect("write");
    fs::create_dir(src.path().join("mnt")).expect("mkdir");
    fs::create_dir(dst.path().join("mnt")).expect("mkdir");
    fs::write(dst.path().join("mnt/on-disk"), b"stays").expect("write");
    in_private_mount_ns(|| {
        let mnt = src.path().join("mnt");
        let _tmpfs = mount_tmpfs(&mnt, "size=1m,mode=0751");
        fs::write(mnt.join("inside.txt"), b"on another filesystem").expect("write");
        let stats = sync(src.path(), dst.path());
        assert_eq!((stats.files_written, stats.metadata_updated), (1, 1), "{stats:?}");
        assert_eq!(
            fs::metadata(dst.path().join("mnt")).expect("stat").mode() & 0o7777,
            0o751
        );
        assert_eq!(fs::read(dst.path().join("mnt/on-disk")).expect("read"), b"stays");
        assert!(!dst.path().join("mnt/inside.txt").exists());
    });
}

#[test]
fn an_entry_that_cannot_be_replaced_fails_the_sync_naming_it() {
    let src = tempfile::tempdir_in("/tmp").expect("tempdir");
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    fs::create_dir(src.path().join("d")).expect("mkdir");
    fs::write(src.path().join("d/f"), b"x").expect("write");
    // A regular file in the destination where a directory must go, made immutable:
    // the sync cannot remove it and must say where.
    File::create(dst.path().join("d")).expect("create");
    let chattr = std::process::Command::new("chattr")
        .arg("+i")
        .arg(dst.path().join("d"))
        .status();
    if !chattr.is_ok_and(|s| s.success()) {
        ci::missing(
            "chattr +i in /tmp (chattr, and a filesystem with immutable files)",
            "apt-get install e2fsprogs",
        );
        return;
    }
    let err = mirror(src.path(), dst.path(), None).expect_err("immutable entry");
    let _ = std::process::Command::new("chattr")
        .arg("-i")
        .arg(dst.path().join("d"))
        .status();
    assert!(err.to_string().contains("`d`"), "{err}");
    assert!(err.to_string().contains("in the copy"), "{err}");
    // Once removable, the next sync converges.
    sync(src.path(), dst.path());
    assert_in_sync(src.path(), dst.path());
}

#[test]
fn a_full_destination_fails_naming_the_file_and_leaves_no_temporary() {
    let src = tempfile::tempdir_in("/tmp").expect("tempdir");
    let dst = tempfile::tempdir_in("/tmp").expect("tempdir");
    fs::create_dir(src.path().join("dir")).expect("mkdir");
    fs::write(src.path().join("dir/a small one"), b"fits").expect("write");
    fs::write(src.path().join("dir/big file.bin"), noise(4 << 20, 3)).expect("write");
    in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(dst.path(), "size=1m");
        let err = mirror(src.path(), dst.path(), None).expect_err("4 MiB into 1 MiB");
        assert!(err.is_no_space(), "{err:?}");
        assert!(err.to_string().contains("`dir/big file.bin`"), "{err}");
        let left: Vec<_> = inodes(dst.path())
            .into_keys()
            .filter(|rel| {
                rel.windows(TEMP_PREFIX.len())
                    .any(|w| w == TEMP_PREFIX.as_bytes())
            })
            .collect();
        assert!(left.is_empty(), "temporaries left: {left:?}");
        // Nothing half-written: the small file, written first, is complete if it is
        // there at all (its rename may have been dropped after the error).
        if let Ok(small) = fs::read(dst.path().join("dir/a small one")) {
            assert_eq!(small, b"fits");
        }
        assert!(!dst.path().join("dir/big file.bin").exists());
    });
}

/// The merge into a seed's fresh copy (`Merge::copied`), as `apply` runs it once the
/// tmpfs is in place: a copy of a disk file that changed after the seed copied it
/// gives way to the disk's version even when the copy's ctime is the later one (the
/// copy finished in the tick of the change, or its filesystem keeps finer times);
/// a copy the application changed in RAM since the switch stays, and so does the
/// copy of a file the disk did not change, and a copy the application moved to
/// another path (with its directory) in RAM since.
#[test]
fn a_seed_copy_gives_way_to_a_later_disk_change_whatever_its_ctime() {
    use tmpfsctl::copy::baseline::{now_after_tick, Mark, Sig};
    use tmpfsctl::copy::{sync_tree, Baseline, Merge};
    let disk = tempfile::tempdir_in("/tmp").expect("tempdir");
    let ram = tempfile::tempdir_in("/tmp").expect("tempdir");
    in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(ram.path(), "size=16m");
        let (disk, ram) = (disk.path(), ram.path());
        let names = [
            "changed",
            "unchanged",
            "changed on both sides",
            "cur/idx",
            "next/idx",
        ];
        for d in ["cur", "next"] {
            fs::create_dir(disk.join(d)).expect("mkdir");
            fs::create_dir(ram.join(d)).expect("mkdir");
        }
        let mut copied = Baseline::none();
        let mut mtimes = Vec::new();
        for (i, n) in names.iter().enumerate() {
            fs::write(disk.join(n), format!("{n}: 1")).expect("write");
            let f = fs::File::options().write(true).open(disk.join(n)).expect("open");
            let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i as u64);
            f.set_modified(mtime).expect("set mtime");
            mtimes.push(mtime);
            let st = nix::sys::stat::stat(&disk.join(n)).expect("stat");
            copied.marks.insert(n.as_bytes(), Mark::Entry(Sig::of(&st)));
        }
        let seed_started = now_after_tick();
        // The application replaces three of them on disk (a temporary renamed over
        // each), after the seed read them and before it wrote its copies.
        for n in [names[0], names[2], names[3]] {
            fs::write(disk.join("new"), format!("{n}: 2")).expect("write");
            fs::rename(disk.join("new"), disk.join(n)).expect("rename");
        }
        tick();
        // The seed's copies: the content it read, with the mtime it read.
        for (n, mtime) in names.iter().zip(&mtimes) {
            fs::write(ram.join(n), format!("{n}: 1")).expect("write");
            let f = fs::File::options().write(true).open(ram.join(n)).expect("open");
            f.set_modified(*mtime).expect("set mtime");
        }
        copied.taken = Some(now_after_tick());
        // In place now. The application's change in RAM is the newest of all; and it
        // replaces `cur` by `next` there (its copy keeps its ctime at its new path).
        fs::write(ram.join(names[2]), format!("{}: 3", names[2])).expect("write");
        fs::remove_dir_all(ram.join("cur")).expect("rm");
        fs::rename(ram.join("next"), ram.join("cur")).expect("rename");
        let copy_ino = fs::metadata(ram.join(names[1])).expect("stat").ino();
        let base = Baseline {
            taken: Some(seed_started),
            ..Baseline::none()
        };
        sync_tree(
            disk,
            ram,
            Merge {
                base: &base,
                journal: None,
                deletions: None,
                dirty: None,
                barriers: None,
                copied: Some(&copied),
                touched: None,
            },
            None,
        )
        .expect("the merge into the seed's copy");
        let read = |n: &str| fs::read_to_string(ram.join(n)).expect("read");
        assert_eq!(read(names[0]), "changed: 2", "the seed's outdated copy stayed");
        assert_eq!(read(names[1]), "unchanged: 1");
        assert_eq!(
            fs::metadata(ram.join(names[1])).expect("stat").ino(),
            copy_ino,
            "a copy of what the disk did not change was replaced"
        );
        assert_eq!(
            read(names[2]),
            "changed on both sides: 3",
            "the application's change in RAM was lost"
        );
        assert_eq!(
            read("cur/idx"),
            "next/idx: 1",
            "the copy the application moved in RAM was overwritten"
        );
    });
}

/// The disk fills up while a pass writes: a worker's copy fails, and the walk may
/// have gone on by then, past the name a file the RAM moved across directories had
/// on disk (or stopped before its new name). The pass then removes what the RAM
/// deleted, to make room for the next, but not that name: the data stays on some
/// disk name (else it would be in RAM only until a later pass succeeds, and a power
/// cut would lose it). Both orders: the new name walked before the old one, and
/// after it, past the file that does not fit.
#[test]
fn a_full_disk_keeps_the_data_of_a_file_moved_across_directories() {
    for (from, to) in [("z_old/big", "a_new/zbig"), ("a_old/big", "z_new/big")] {
        let ram = tempfile::tempdir_in("/tmp").expect("tempdir");
        let disk_at = tempfile::tempdir_in("/tmp").expect("tempdir");
        crate::common::in_private_mount_ns(|| {
            let _tmpfs = mount_tmpfs(ram.path(), "size=64m,mode=0755");
            let disk = crate::common::LoopFs::new(disk_at.path(), 24, "defaults");
            let (src, dst) = (ram.path(), disk.mount_point.join("cache"));
            fs::create_dir(&dst).unwrap();
            for d in [
                "m_mid",
                from.split('/').next().unwrap(),
                to.split('/').next().unwrap(),
            ] {
                fs::create_dir_all(src.join(d)).unwrap();
            }
            for i in 0..16 {
                fs::write(src.join(format!("m_mid/f{i:02}")), noise(64 << 10, i)).unwrap();
            }
            fs::write(src.join(from), noise(1 << 20, 99)).unwrap();
            for i in 0..100 {
                fs::write(src.join(format!("m_mid/i{i:02}")), "i").unwrap();
            }
            let base = plain_pass(src, &dst, &tmpfsctl::copy::Baseline::none())
                .expect("first pass")
                .baseline;
            fill_leaving(&disk.mount_point, 2 << 20);
            tick();
            // Many copies for the workers, one that cannot fit, and the move.
            for i in 0..16 {
                fs::write(src.join(format!("m_mid/f{i:02}")), noise(64 << 10, 100 + i)).unwrap();
            }
            fs::write(src.join("m_mid/huge"), noise(6 << 20, 7)).unwrap();
            for i in 0..100 {
                fs::write(src.join(format!("m_mid/i{i:02}")), "j").unwrap();
            }
            fs::rename(src.join(from), src.join(to)).unwrap();
            tick();
            assert!(
                plain_pass(src, &dst, &base).is_err(),
                "the disk was full: the pass must fail"
            );
            let want = noise(1 << 20, 99);
            let held: Vec<_> = [from, to]
                .into_iter()
                .filter(|p| fs::read(dst.join(p)).ok().as_ref() == Some(&want))
                .collect();
            assert!(
                !held.is_empty(),
                "{from} -> {to}: after the failed pass no disk name holds the moved file's data"
            );
        });
    }
}

/// Fills the filesystem at `mount` with a file, leaving `room` bytes free.
fn fill_leaving(mount: &Path, room: u64) {
    let free = nix::sys::statvfs::statvfs(mount).unwrap();
    let avail = free.blocks_available() * free.fragment_size();
    fs::write(mount.join("filler"), vec![7u8; (avail - room) as usize]).unwrap();
}

/// A disk with room for a few new copies beside the old ones, not for all: a pass
/// that rewrites every file still succeeds, as it did one file at a time. The workers
/// write several copies before putting any in place, each holding the room of the
/// old file and the new until then; on a nearly full disk they hold at most their
/// share of the room left, one file at a time here (without that, 3 of 3 runs failed
/// with ENOSPC).
#[test]
fn rewriting_every_file_on_a_nearly_full_disk_succeeds() {
    let ram = tempfile::tempdir_in("/tmp").expect("tempdir");
    let disk_at = tempfile::tempdir_in("/tmp").expect("tempdir");
    crate::common::in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(ram.path(), "size=256m,mode=0755");
        let disk = crate::common::LoopFs::new(disk_at.path(), 256, "defaults");
        let (src, dst) = (ram.path(), disk.mount_point.join("cache"));
        fs::create_dir(&dst).unwrap();
        for i in 0..64 {
            fs::write(src.join(format!("f{i:02}")), noise(1 << 20, i)).unwrap();
        }
        let base = plain_pass(src, &dst, &tmpfsctl::copy::Baseline::none())
            .expect("first pass")
            .baseline;
        fill_leaving(&disk.mount_point, 16 << 20);
        tick();
        for i in 0..64 {
            fs::write(src.join(format!("f{i:02}")), noise(1 << 20, 100 + i)).unwrap();
        }
        tick();
        let done = plain_pass(src, &dst, &base).expect("the pass fits one file at a time");
        assert_eq!(done.stats.files_written, 64);
        for i in 0..64 {
            assert!(
                fs::read(dst.join(format!("f{i:02}"))).unwrap() == noise(1 << 20, 100 + i),
                "f{i:02} on disk is not the RAM's"
            );
        }
    });
}

/// A disk directory removed and made again by root after the RAM's last change of
/// it, closed (0700) with a file of its own, which gets the old one's inode number
/// (a fresh ext4 hands the freed one out again): it is not the directory the
/// baseline records there, and its owner and mode stay, though the RAM changed its
/// own directory since the baseline. Before, it got the RAM's owner and mode, and
/// its file became readable to others (a review helper's probe, 3 of 3).
#[test]
fn a_directory_made_again_with_its_inode_number_keeps_its_owner_and_mode() {
    let ram = tempfile::tempdir_in("/tmp").expect("tempdir");
    let disk_at = tempfile::tempdir_in("/tmp").expect("tempdir");
    crate::common::in_private_mount_ns(|| {
        let _tmpfs = mount_tmpfs(ram.path(), "size=16m,mode=0755");
        let disk = crate::common::LoopFs::new(disk_at.path(), 32, "defaults");
        let (src, dst) = (ram.path(), disk.mount_point.join("cache"));
        fs::create_dir(&dst).unwrap();
        fs::create_dir(src.join("D")).unwrap();
        fs::write(src.join("D/f"), "f").unwrap();
        std::os::unix::fs::chown(src.join("D"), Some(1000), Some(1000)).unwrap();
        let base = plain_pass(src, &dst, &tmpfsctl::copy::Baseline::none())
            .expect("first pass")
            .baseline;
        tick();
        fs::write(src.join("D/g"), "a later change of the RAM's directory").unwrap();
        tick();
        let was = fs::metadata(dst.join("D")).unwrap().ino();
        fs::remove_dir_all(dst.join("D")).unwrap();
        // Made again until it gets the old number (at once, on a fresh ext4).
        let made_again = (0..16).any(|_| {
            let _ = fs::remove_dir(dst.join("D"));
            fs::DirBuilder::new().mode(0o700).create(dst.join("D")).unwrap();
            fs::metadata(dst.join("D")).unwrap().ino() == was
        });
        assert!(made_again, "the case needs the inode number handed out again");
        fs::write(dst.join("D/private"), "root's").unwrap();
        plain_pass(src, &dst, &base).expect("second pass");
        let md = fs::metadata(dst.join("D")).unwrap();
        assert_eq!((md.uid(), md.gid(), md.mode() & 0o7777), (0, 0, 0o700));
    });
}
