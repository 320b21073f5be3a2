use std::path::Path;

use super::measure::side;
use super::rows::median;
use super::*;

fn room() -> HostRoom {
    HostRoom {
        on_tmpfs: None,
        disk_free: 100 << 30,
        disk_inodes_free: Some(1 << 20),
        mem_available: 20 << 30,
    }
}

#[test]
fn sizes_are_whole_mib_and_at_least_one() {
    assert_eq!(parse_bench_size("256MiB"), Ok(256 << 20));
    assert_eq!(parse_bench_size("1G"), Ok(1 << 30));
    assert_eq!(parse_bench_size("1536k"), Ok(1 << 20));
    assert!(parse_bench_size("512k").unwrap_err().contains("1MiB"));
    assert!(parse_bench_size("10%").unwrap_err().contains("percentage"));
    assert!(parse_bench_size("1GB").unwrap_err().contains("ambiguous"));
    assert!(parse_cap("0").is_err());
    assert_eq!(parse_cap("2.5"), Ok(2.5));
}

#[test]
fn room_enough_means_no_refusal() {
    assert!(refusals(Path::new("/var/tmp"), 256 << 20, &room()).is_empty());
}

#[test]
fn every_refusal_is_reported_at_once() {
    let r = HostRoom {
        on_tmpfs: Some("tmpfs"),
        disk_free: 16 << 20,
        disk_inodes_free: Some(10),
        mem_available: 100 << 20,
    };
    let why = refusals(Path::new("/dev/shm"), 64 << 20, &r);
    assert_eq!(why.len(), 4, "{why:#?}");
    assert!(why[0].contains("/dev/shm is on tmpfs"));
    assert!(why[1].contains("16MiB free") && why[1].contains("needs 192MiB"));
    assert!(why[2].contains("free inodes"));
    assert!(why[3].contains("MemAvailable is 100MiB") && why[3].contains("384MiB"));
}

#[test]
fn inode_check_skipped_when_not_reported() {
    let r = HostRoom {
        disk_inodes_free: None,
        ..room()
    };
    assert!(refusals(Path::new("/x"), 1 << 20, &r).is_empty());
}

#[test]
fn small_file_counts_are_bounded_by_size() {
    assert_eq!(small_counts(256 << 20), (20_000, 2_000));
    assert_eq!(small_counts(8 << 20), (2048, 2000));
    assert_eq!(small_counts(1 << 20), (256, 256));
}

#[test]
fn scatter_visits_each_index_once() {
    for n in [1u64, 2, 7, 64, 2048, 65536, 1000] {
        let mut seen: Vec<u64> = Scatter::new(n, 0x5eed).take(n as usize).collect();
        seen.sort();
        assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
    }
    assert_eq!(Scatter::new(0, 1).next(), None);
    let first: Vec<u64> = Scatter::new(65536, 0).take(3).collect();
    assert!(first[1].abs_diff(first[0]) > 1000, "{first:?}");
}

#[test]
fn median_run_carries_all_runs() {
    let run = |v: f64| side(|_| v, 1, 1, 1.0, false);
    let m = median(vec![run(5.0), run(1.0), run(3.0)]);
    assert_eq!(m.value, 3.0);
    assert_eq!(m.runs, vec![5.0, 1.0, 3.0]);
    assert_eq!(median(vec![run(2.0)]).runs, vec![2.0]);
}

#[test]
fn significant_digits() {
    assert_eq!(fmt_sig(0.5), "0.50");
    assert_eq!(fmt_sig(5.25), "5.25");
    assert_eq!(fmt_sig(812.4), "812");
    assert_eq!(fmt_sig(4321.0), "4321");
    assert_eq!(fmt_sig(48_200.0), "48.2k");
    assert_eq!(fmt_sig(1_234_000.0), "1.23M");
}

#[test]
fn human_table_is_aligned() {
    let s = Side {
        value: 100.0,
        runs: vec![100.0],
        ops: 1,
        bytes: 1,
        seconds: 1.0,
        latency_us: 1.0,
        capped: false,
        cached_before_pct: None,
    };
    let rep = BenchReport {
        disk_dir: "/var/tmp".into(),
        filesystem: None,
        size: 8 << 20,
        time_cap_seconds: 3.0,
        runs: 1,
        small_files: 1,
        small_files_fsync: 1,
        host: HostInfo {
            cpus: 2,
            mem_total: 1 << 30,
            mem_available: 1 << 30,
            kernel: "6.18".into(),
        },
        rows: vec![
            Row {
                id: "a".into(),
                name: "short".into(),
                unit: "MiB/s",
                disk: s.clone(),
                tmpfs: Side {
                    value: 2500.0,
                    ..s.clone()
                },
                ratio: 25.0,
            },
            Row {
                id: "b".into(),
                name: "a longer name".into(),
                unit: "files/s",
                disk: Side {
                    capped: true,
                    ..s.clone()
                },
                tmpfs: s.clone(),
                ratio: 1.0,
            },
        ],
        notes: vec![],
        seconds: 1.0,
    };
    let out = human(&rep);
    let table: Vec<&str> = out.lines().skip(3).collect();
    assert_eq!(table.len(), 3, "{out}");
    let widths: Vec<usize> = table.iter().map(|l| l.chars().count()).collect();
    assert!(widths.iter().all(|w| *w == widths[0]), "{out}");
    assert!(table[2].contains("100 files/s*"), "{out}");
    assert!(table[1].ends_with("25.0×"), "{out}");
    assert!(table[1].contains("2.44 GiB/s"), "{out}");
}
