use super::*;

const T0: Time = (100, 0);
const SINCE: Time = (200, 0);
const T1: Time = (300, 0);
const T2: Time = (400, 0);
const T3: Time = (500, 0);

fn file(ino: u64, ctime: Time) -> Sig {
    Sig {
        ino,
        mode: libc::S_IFREG | 0o644,
        size: 5,
        mtime: (50, 7),
        ctime,
    }
}

fn dir(ino: u64, ctime: Time) -> Sig {
    Sig {
        mode: libc::S_IFDIR | 0o755,
        ..file(ino, ctime)
    }
}

fn d(mark: Option<Mark>, ram: Ram, disk: Disk, ram_del: Time, disk_del: Time) -> Decision {
    decide(mark.as_ref(), Some(SINCE), ram, true, disk, ram_del, disk_del)
}

fn v(verdict: Verdict) -> Decision {
    Decision {
        verdict,
        conflict: false,
    }
}

fn c(verdict: Verdict) -> Decision {
    Decision {
        verdict,
        conflict: true,
    }
}

#[test]
fn in_no_baseline_nothing_is_deleted_and_the_newer_wins() {
    let (ram_new, ram_old) = (Ram::Present(T2), Ram::Present(T0));
    let disk = Disk::Present(file(1, T1));
    assert_eq!(d(None, ram_new, Disk::Absent, T0, T0), v(Verdict::Ram));
    assert_eq!(d(None, Ram::Absent, disk, T2, T0), v(Verdict::Disk(None)));
    assert_eq!(d(None, ram_new, disk, T0, T0), v(Verdict::Ram));
    assert_eq!(d(None, ram_old, disk, T0, T0), v(Verdict::Disk(None)));
    assert_eq!(d(None, Ram::Absent, Disk::Absent, T0, T0), v(Verdict::Gone));
    // No baseline at all behaves the same.
    let none = decide(None, None, Ram::Absent, true, disk, T2, T0);
    assert_eq!(none, v(Verdict::Disk(None)));
}

/// The disk's newer version won last time while the RAM kept its older one: the
/// RAM's stays lost until the RAM changes it again.
#[test]
fn a_version_that_lost_to_the_disk_stays_lost_until_it_changes() {
    let won = Some(Mark::DiskWon(file(1, T1)));
    // Even where the RAM's ctime is after the baseline's time (the record may come
    // from an interrupted pass's journal): older than the disk's version.
    let unchanged = Ram::Present((250, 0));
    let disk = Disk::Present(file(1, T1));
    assert_eq!(d(won, unchanged, disk, T0, T0), v(Verdict::Disk(None)));
    // The application deleted the disk's version: the RAM's does not come back.
    assert_eq!(
        d(won, unchanged, Disk::Absent, T0, T2),
        v(Verdict::Disk(Some(T2)))
    );
    assert_eq!(d(won, Ram::Absent, disk, T0, T0), v(Verdict::Disk(None)));
    // Deleted in RAM after the disk's version: deleted on disk.
    assert_eq!(d(won, Ram::Absent, disk, T2, T0), v(Verdict::Ram));
    // A disk version older than the RAM's that lost to it (a directory moved in
    // on disk keeps its files' ctimes): the RAM unchanged since the baseline still
    // follows the disk.
    let older = Some(Mark::DiskWon(file(1, T0)));
    let ram_before_baseline = Ram::Present((150, 0));
    assert_eq!(
        d(older, ram_before_baseline, Disk::Present(file(1, T0)), T0, T0),
        v(Verdict::Disk(None))
    );
    assert_eq!(
        d(older, Ram::Present(T2), Disk::Present(file(1, T0)), T0, T0),
        v(Verdict::Ram)
    );
    // Unless a RAM directory above it moved: the entry may be new at this path.
    let moved = decide(
        older.as_ref(),
        Some(SINCE),
        ram_before_baseline,
        false,
        Disk::Present(file(1, T0)),
        T0,
        T0,
    );
    assert_eq!(moved, v(Verdict::Ram));
    // Changed in RAM since, the disk unchanged: the RAM's change goes to disk.
    assert_eq!(d(won, Ram::Present(T2), disk, T0, T0), v(Verdict::Ram));
    // Both changed: the later change wins.
    let newer_disk = Disk::Present(file(2, T3));
    assert_eq!(
        d(won, Ram::Present(T2), newer_disk, T0, T0),
        c(Verdict::Disk(None))
    );
}

#[test]
fn an_unchanged_disk_follows_the_ram() {
    let base = Some(Mark::Entry(file(1, T0)));
    let disk = Disk::Present(file(1, T0));
    for ram in [Ram::Present(T0), Ram::Present(T2), Ram::Absent] {
        assert_eq!(d(base, ram, disk, T2, T0), v(Verdict::Ram), "{ram:?}");
    }
}

#[test]
fn an_unchanged_ram_follows_the_disk_and_a_disk_deletion_is_remembered() {
    let base = Some(Mark::Entry(file(1, T0)));
    let ram = Ram::Present(T0);
    let changed = [
        file(2, T0),
        file(1, T1),
        Sig {
            size: 9,
            ..file(1, T0)
        },
        Sig {
            mode: libc::S_IFREG | 0o600,
            ..file(1, T0)
        },
        dir(1, T0),
    ];
    for now in changed {
        assert_eq!(
            d(base, ram, Disk::Present(now), T0, T0),
            v(Verdict::Disk(None)),
            "{now:?}"
        );
    }
    assert_eq!(d(base, ram, Disk::Absent, T0, T1), v(Verdict::Disk(Some(T1))));
}

#[test]
fn both_changed_the_later_wins_the_disk_on_a_tie() {
    let base = Some(Mark::Entry(file(1, T0)));
    let disk_t1 = Disk::Present(file(2, T1));
    assert_eq!(d(base, Ram::Present(T2), disk_t1, T0, T0), c(Verdict::Ram));
    assert_eq!(
        d(base, Ram::Present(SINCE), disk_t1, T0, T0),
        c(Verdict::Disk(None))
    );
    assert_eq!(d(base, Ram::Present(T1), disk_t1, T0, T0), c(Verdict::Disk(None)));
    // RAM rewrote it, the disk deleted it: the later of the two.
    assert_eq!(d(base, Ram::Present(T2), Disk::Absent, T0, T1), c(Verdict::Ram));
    assert_eq!(
        d(base, Ram::Present(T1), Disk::Absent, T0, T2),
        c(Verdict::Disk(Some(T2)))
    );
    // RAM deleted it, the disk rewrote it.
    assert_eq!(d(base, Ram::Absent, disk_t1, T2, T0), c(Verdict::Ram));
    assert_eq!(d(base, Ram::Absent, disk_t1, T0, T0), c(Verdict::Disk(None)));
    // Both deleted it.
    assert_eq!(d(base, Ram::Absent, Disk::Absent, T1, T1), v(Verdict::Gone));
}

#[test]
fn a_directory_is_unchanged_while_it_is_the_same_inode() {
    let base = Some(Mark::Entry(dir(1, T0)));
    let later = Disk::Present(dir(1, T2));
    assert_eq!(d(base, Ram::Present(T0), later, T0, T0), v(Verdict::Ram));
    assert_eq!(d(base, Ram::Absent, later, T1, T0), v(Verdict::Ram));
    let replaced = Disk::Present(dir(7, T1));
    assert_eq!(
        d(base, Ram::Present(T0), replaced, T0, T0),
        v(Verdict::Disk(None))
    );
}

#[test]
fn a_remembered_deletion_holds_until_the_ram_writes_the_name_again() {
    let base = Some(Mark::Deleted(T1));
    assert_eq!(
        d(base, Ram::Present(T0), Disk::Absent, T0, T2),
        v(Verdict::Disk(Some(T1)))
    );
    assert_eq!(d(base, Ram::Present(T2), Disk::Absent, T0, T0), c(Verdict::Ram));
    assert_eq!(
        d(base, Ram::Present((250, 0)), Disk::Absent, T0, T0),
        c(Verdict::Disk(Some(T1)))
    );
    let back = Disk::Present(file(3, T1));
    assert_eq!(d(base, Ram::Present(T0), back, T0, T0), v(Verdict::Disk(None)));
    assert_eq!(d(base, Ram::Present(T2), back, T0, T0), c(Verdict::Ram));
    // Made again on disk, deleted in RAM: the later of the two.
    assert_eq!(d(base, Ram::Absent, back, T2, T0), c(Verdict::Ram));
    assert_eq!(d(base, Ram::Absent, back, T0, T0), c(Verdict::Disk(None)));
    assert_eq!(d(base, Ram::Absent, Disk::Absent, T2, T0), v(Verdict::Gone));
}

#[test]
fn encoding_round_trips_and_damage_is_detected() {
    let mut b = Baseline {
        taken: Some((1_700_000_000, 123)),
        listed_after: Some((1_700_000_001, 7)),
        ..Baseline::none()
    };
    b.marks.insert(b"a", Mark::Entry(file(1, T0)));
    b.marks.insert(b"a/b\xff\n", Mark::Entry(dir(2, T1)));
    b.marks.insert(b"z", Mark::Deleted(T2));
    b.marks.insert(b"zz", Mark::DiskWon(file(3, T1)));
    let data = b.encode();
    assert_eq!(Baseline::decode(&data).unwrap(), b);
    assert_eq!(
        Baseline::decode(&Baseline::none().encode()).unwrap(),
        Baseline::none()
    );
    for cut in [0, 5, data.len() - 1] {
        assert!(matches!(
            Baseline::decode(&data[..cut]),
            Err(BaselineError::Corrupt(_))
        ));
    }
    let mut flipped = data.clone();
    flipped[40] ^= 1;
    assert!(matches!(
        Baseline::decode(&flipped),
        Err(BaselineError::Corrupt(_))
    ));
    let mut newer = data[..data.len() - 8].to_vec();
    newer[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&(FORMAT + 1).to_le_bytes());
    let sum = sum64(&newer);
    newer.extend_from_slice(&sum.to_le_bytes());
    let err = Baseline::decode(&newer).unwrap_err();
    assert!(matches!(err, BaselineError::Newer(n) if n == FORMAT + 1), "{err}");
    assert!(err.to_string().contains("newer than this tmpfsctl"));
}

/// `b` as an older format wrote it: without `listed_after`, and before format 3
/// with the bytewise checksum.
fn encode_old(b: &Baseline, format: u32) -> Vec<u8> {
    let data = b.encode();
    let mut old = data[..data.len() - 8].to_vec();
    old[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&format.to_le_bytes());
    // Magic, format, then `taken` (a flag and two i64): `listed_after` follows.
    let at = MAGIC.len() + 4 + 17;
    old.drain(at..at + 17);
    let sum = if format >= 3 { sum64(&old) } else { fnv1a(&old) };
    old.extend_from_slice(&sum.to_le_bytes());
    old
}

#[test]
fn a_format_3_baseline_is_read_with_no_directory_trusted() {
    let mut b = Baseline {
        taken: Some(T1),
        listed_after: Some(T2),
        ..Baseline::none()
    };
    b.marks.insert(b"d", Mark::Entry(dir(9, T0)));
    let read = Baseline::decode(&encode_old(&b, 3)).unwrap();
    assert_eq!(read.listed_after, None);
    assert_eq!((read.taken, read.marks.clone()), (b.taken, b.marks.clone()));
    assert!(b.unchanged_dir(b"d", &dir(9, T0)));
    assert!(!read.unchanged_dir(b"d", &dir(9, T0)));
}

#[test]
fn a_directory_record_is_trusted_only_when_read_after_its_ctime_and_equal() {
    let mut b = Baseline {
        taken: Some(T0),
        listed_after: Some(T1),
        ..Baseline::none()
    };
    b.marks.insert(b"old", Mark::Entry(dir(1, T0)));
    b.marks.insert(b"recent", Mark::Entry(dir(2, T1)));
    b.marks.insert(b"file", Mark::Entry(file(3, T0)));
    b.marks.insert(b"gone", Mark::Deleted(T0));
    assert!(b.unchanged_dir(b"old", &dir(1, T0)));
    // Changed in the tick it was read in: a later change could keep that ctime.
    assert!(!b.unchanged_dir(b"recent", &dir(2, T1)));
    assert!(!b.unchanged_dir(b"old", &dir(1, T1)), "names changed since");
    assert!(!b.unchanged_dir(b"old", &dir(4, T0)), "another directory");
    let mut bigger = dir(1, T0);
    bigger.size += 4096;
    assert!(!b.unchanged_dir(b"old", &bigger));
    assert!(!b.unchanged_dir(b"file", &file(3, T0)));
    assert!(!b.unchanged_dir(b"gone", &dir(1, T0)));
    assert!(!b.unchanged_dir(b"unknown", &dir(1, T0)));
}

#[test]
fn by_dir_holds_the_records_and_names_under_each_directory() {
    let mut b = Baseline::none();
    b.marks.insert(b"a", Mark::Entry(dir(1, T0)));
    b.marks.insert(b"a/x", Mark::Entry(file(2, T0)));
    b.marks.insert(b"a/y", Mark::DiskWon(file(3, T0)));
    b.marks.insert(b"a/gone", Mark::Deleted(T0));
    b.marks.insert(b"a/y/z", Mark::Entry(file(4, T0)));
    b.marks.insert(b"top", Mark::Entry(file(5, T0)));
    let by_dir = b.marks.by_dir();
    let names = |d: &[u8]| by_dir.names(d).collect::<Vec<_>>();
    assert_eq!(names(b""), [&b"a"[..], b"top"]);
    assert_eq!(names(b"a"), [&b"x"[..], b"y"]);
    assert_eq!(names(b"a/y"), [&b"z"[..]]);
    assert_eq!(names(b"a/x"), [&b""[..]; 0]);
    let records: Vec<_> = by_dir.records(b"a").map(|(p, _)| p).collect();
    assert_eq!(records, [&b"a/x"[..], b"a/y", b"a/gone"]);
}

#[test]
fn a_format_2_baseline_with_its_bytewise_checksum_is_still_read() {
    let mut b = Baseline {
        taken: Some(T1),
        ..Baseline::none()
    };
    b.marks.insert(b"d/f", Mark::Entry(file(9, T0)));
    let mut old = encode_old(&b, 2);
    assert_eq!(Baseline::decode(&old).unwrap(), b);
    let wrong = sum64(&old[..old.len() - 8]);
    old.truncate(old.len() - 8);
    old.extend_from_slice(&wrong.to_le_bytes());
    assert!(matches!(
        Baseline::decode(&old),
        Err(BaselineError::Corrupt("checksum mismatch"))
    ));
}

#[test]
fn a_record_count_beyond_the_data_is_damage() {
    let mut data = Baseline::none().encode();
    data.truncate(data.len() - 8);
    let at = data.len() - 8;
    data[at..].copy_from_slice(&u64::MAX.to_le_bytes());
    let sum = sum64(&data);
    data.extend_from_slice(&sum.to_le_bytes());
    assert!(matches!(
        Baseline::decode(&data),
        Err(BaselineError::Corrupt("record count"))
    ));
}

#[test]
fn the_checksum_sees_any_change_of_one_word_and_the_length() {
    let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    let sum = sum64(&data);
    for i in (0..data.len()).step_by(7) {
        let mut d = data.clone();
        d[i] ^= 0x10;
        assert_ne!(sum64(&d), sum, "byte {i}");
    }
    assert_ne!(sum64(&data[..999]), sum);
    assert_ne!(sum64(&[0]), sum64(&[0, 0]));
}

#[test]
fn below_lists_exactly_the_subtree() {
    let mut b = Baseline::none();
    for p in ["a", "a/x", "a/y/z", "a-b", "a0", "ab", "b"] {
        b.marks.insert(p.as_bytes(), Mark::Deleted(T0));
    }
    let mut got: Vec<_> = b.below(b"a").map(|(p, _)| p.to_vec()).collect();
    got.sort();
    assert_eq!(got, vec![b"a/x".to_vec(), b"a/y/z".to_vec()]);
}

#[test]
fn saved_durably_and_loaded_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m");
    assert!(Baseline::load(&path).unwrap().is_none());
    let mut b = Baseline::none();
    b.taken = Some(T1);
    b.save(&path).unwrap();
    b.marks.insert(b"f", Mark::Deleted(T0));
    b.save(&path).unwrap();
    assert_eq!(Baseline::load(&path).unwrap(), Some(b));
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary left"
    );
}

#[test]
fn the_checksum_fed_in_pieces_is_the_checksum_of_the_whole() {
    let data: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(37)).collect();
    for len in [0, 1, 7, 8, 9, 64, 100] {
        for cuts in [&[][..], &[1], &[3, 5], &[7, 9, 16, 17]] {
            let mut sum = Sum64::new(len as u64);
            let mut at = 0;
            for &c in cuts.iter().filter(|&&c| c <= len) {
                sum.update(&data[at..c]);
                at = c;
            }
            sum.update(&data[at..len]);
            assert_eq!(sum.finish(), sum64(&data[..len]), "{len} {cuts:?}");
        }
    }
}

#[test]
fn records_across_the_pieces_read_are_read_whole() {
    let mut b = Baseline {
        taken: Some(T1),
        ..Baseline::none()
    };
    for i in 0..5000u64 {
        b.marks
            .insert(format!("d{}/f{i}", i % 7).as_bytes(), Mark::Entry(file(i, T0)));
        if i == 2500 {
            b.marks.insert(&vec![b'x'; 100_000], Mark::Deleted(T2));
        }
    }
    let data = b.encode();
    assert!(data.len() > 4 << 16);
    assert_eq!(Baseline::decode(&data).unwrap(), b);
}
