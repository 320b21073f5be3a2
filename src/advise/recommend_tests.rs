use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A busy volatile cache: 60 MiB steady, 200 files/s of 16 KiB, as many deleted.
fn cache() -> Figures {
    Figures {
        seconds: 600.0,
        bytes_start: 60 * MIB,
        bytes_end: 60 * MIB,
        bytes_peak: 60 * MIB,
        inodes_start: 4000,
        inodes_end: 4000,
        inodes_peak: 4100,
        median_file: 16 << 10,
        creates: 120_000,
        writes: 120_000,
        deletes: 120_000,
        renames: 0,
        bytes_written: 120_000 * (16 << 10),
        peak_bytes_per_sec: 4 * MIB,
        resident_end: Some(50.0),
        device: None,
        mem_total: 16 * GIB,
        in_ram: false,
        overflows: 0,
        interrupted: false,
    }
}

fn reason<'a>(a: &'a Advice, field: &str) -> &'a str {
    &a.reasons.iter().find(|r| r.field == field).unwrap().why
}

#[test]
fn a_volatile_cache_gets_evict_and_its_peak_at_three_quarters() {
    let a = recommend("/var/cache/nginx", &cache());
    let e = &a.entry;
    assert_eq!(e.name, "nginx");
    assert_eq!(e.size, 80 * MIB);
    assert_eq!((e.high, e.low), (90, 75));
    assert_eq!(e.action, vec!["evict"]);
    assert_eq!((e.persist, e.huge, e.max_size), ("none", "never", None));
    assert_eq!(e.inodes, 8200u64.div_ceil(1024) * 1024);
    assert!(reason(&a, "size").contains("peaked at 60MiB"), "{a:?}");
    assert!(reason(&a, "action").contains("deleted 120000"));
    assert!(reason(&a, "high").contains("15 ms"));
    assert!(a.warnings.is_empty(), "{:?}", a.warnings);
    for field in ["size", "inodes", "huge", "persist", "high", "low", "action"] {
        assert_eq!(
            a.reasons.iter().filter(|r| r.field == field).count(),
            1,
            "{field}"
        );
    }
}

#[test]
fn a_fast_writer_lowers_high_then_raises_the_size() {
    // 500 MiB/s × 30 ms = 15 MiB above high: 80 MiB × (100 − 81)% ≥ 15 MiB.
    let f = Figures {
        peak_bytes_per_sec: 500 * MIB,
        ..cache()
    };
    let a = recommend("/c", &f);
    assert_eq!((a.entry.size, a.entry.high, a.entry.low), (80 * MIB, 81, 66));
    // 2 GiB/s × 30 ms = 61.4 MiB: even 20% of 80 MiB is too little.
    let f = Figures {
        peak_bytes_per_sec: 2 * GIB,
        ..cache()
    };
    let a = recommend("/c", &f);
    assert_eq!(a.entry.high, 80);
    assert_eq!(a.entry.size, 308 * MIB);
    assert!(reason(&a, "size").contains("raised"), "{a:?}");
}

#[test]
fn a_growing_tree_without_deletions_grows_then_falls_back_and_is_persisted() {
    let f = Figures {
        bytes_start: 50 * MIB,
        bytes_end: 60 * MIB,
        bytes_peak: 60 * MIB,
        deletes: 0,
        seconds: 3600.0,
        ..cache()
    };
    let a = recommend("/srv/app/state", &f);
    // 60 MiB + as long again as the watch (an hour) at 10 MiB/h = 70 MiB, at 75%:
    // 93.3 → 94 MiB.
    assert_eq!(a.entry.size, 94 * MIB);
    assert_eq!(a.entry.action, vec!["grow", "fallback"]);
    assert_eq!(a.entry.max_size, Some(188 * MIB));
    assert_eq!(a.entry.persist, "every 15m");
    assert!(reason(&a, "size").contains("grew"));
    assert!(a
        .warnings
        .iter()
        .any(|w| w.contains("cap the application's own cache")));
}

#[test]
fn a_steady_tree_without_deletions_falls_back() {
    let a = recommend(
        "/srv/x",
        &Figures {
            deletes: 0,
            ..cache()
        },
    );
    assert_eq!(a.entry.action, vec!["fallback"]);
    assert_eq!((a.entry.persist, a.entry.max_size), ("every 15m", None));
}

#[test]
fn growth_that_would_not_fit_the_budget_falls_back_instead_of_growing() {
    let f = Figures {
        bytes_start: 0,
        bytes_end: GIB,
        bytes_peak: GIB,
        deletes: 0,
        seconds: 3600.0,
        mem_total: 4 * GIB,
        ..cache()
    };
    let a = recommend("/srv/x", &f);
    assert_eq!(a.entry.action, vec!["fallback"]);
    assert!(
        a.warnings.iter().any(|w| w.contains("RAM budget")),
        "{:?}",
        a.warnings
    );
}

#[test]
fn large_files_get_within_size_huge_pages() {
    let a = recommend(
        "/c",
        &Figures {
            median_file: 8 * MIB,
            ..cache()
        },
    );
    assert_eq!(a.entry.huge, "within_size");
    let a = recommend(
        "/c",
        &Figures {
            median_file: 2 * MIB - 1,
            ..cache()
        },
    );
    assert_eq!(a.entry.huge, "never");
}

#[test]
fn the_saving_is_per_hour_with_the_device_share_when_known() {
    let a = recommend("/c", &cache());
    assert_eq!(a.saving.bytes_per_hour, 120_000 * (16 << 10) * 6);
    assert_eq!(a.saving.file_ops_per_hour, 360_000 * 6);
    assert_eq!(a.saving.device_write_ops_per_hour, None);
    // The device wrote twice what DIR's files grew by: half its requests are DIR's.
    let f = Figures {
        device: Some((60_000, 2 * 120_000 * (16 << 10))),
        ..cache()
    };
    let a = recommend("/c", &f);
    assert_eq!(a.saving.dir_share_of_device_bytes, Some(0.5));
    assert_eq!(a.saving.device_write_ops_per_hour, Some(180_000));
    // More than the device wrote (not yet written back): all of it, no more.
    let f = Figures {
        device: Some((600, 4096)),
        ..cache()
    };
    let a = recommend("/c", &f);
    assert_eq!(a.saving.dir_share_of_device_bytes, Some(1.0));
    assert_eq!(a.saving.device_write_ops_per_hour, Some(3600));
    let f = Figures {
        device: Some((0, 0)),
        ..cache()
    };
    assert_eq!(recommend("/c", &f).saving.device_write_ops_per_hour, None);
}

#[test]
fn warnings_say_when_offload_is_unlikely_to_pay() {
    let has = |f: &Figures, text: &str| recommend("/c", f).warnings.iter().any(|w| w.contains(text));
    let idle = Figures {
        creates: 0,
        writes: 0,
        deletes: 0,
        renames: 0,
        bytes_written: 0,
        ..cache()
    };
    assert!(has(&idle, "nothing was created"));
    let hot_reads = Figures {
        creates: 10,
        writes: 10,
        deletes: 10,
        bytes_written: 10 << 10,
        resident_end: Some(97.0),
        ..cache()
    };
    assert!(has(&hot_reads, "unlikely to pay: 97%"));
    assert!(!has(
        &Figures {
            resident_end: Some(50.0),
            ..hot_reads.clone()
        },
        "unlikely"
    ));
    assert!(!has(
        &Figures {
            resident_end: None,
            ..hot_reads
        },
        "unlikely"
    ));
    assert!(!has(
        &Figures {
            resident_end: Some(97.0),
            ..cache()
        },
        "unlikely"
    ));
    assert!(has(
        &Figures {
            in_ram: true,
            ..cache()
        },
        "tmpfs or ramfs already"
    ));
    assert!(has(
        &Figures {
            overflows: 3,
            ..cache()
        },
        "overflowed 3 times"
    ));
    assert!(has(
        &Figures {
            seconds: 5.0,
            ..cache()
        },
        "watched for 5 s only"
    ));
    assert!(has(
        &Figures {
            interrupted: true,
            ..cache()
        },
        "10 minutes"
    ));
    assert!(has(
        &Figures {
            mem_total: 100 * MIB,
            ..cache()
        },
        "RAM budget"
    ));
}

#[test]
fn names_come_from_the_last_component() {
    assert_eq!(name_for("/var/cache/nginx"), "nginx");
    assert_eq!(name_for("/var/lib/php/Sessions.d/"), "sessions-d");
    assert_eq!(name_for("/"), "cache");
    assert_eq!(name_for("/x/..."), "cache");
    assert_eq!(name_for("/x/-v"), "v");
    assert_eq!(name_for("/x/__tmp"), "tmp");
    assert_eq!(name_for(&format!("/{}", "a".repeat(60))).len(), 48);
}

/// Over a grid of sizes, rates and growths: the entry always keeps the rules the
/// spec and the agent need.
#[test]
fn every_recommendation_keeps_the_invariants() {
    let sizes = [0, 1, 4096, 3 * MIB, 100 * MIB, 5 * GIB, 300 * GIB];
    let rates = [0, 1 << 10, MIB, 100 * MIB, 2 * GIB, 20 * GIB];
    for &peak in &sizes {
        for &start in &sizes {
            for &rate in &rates {
                for deletes in [0, 5] {
                    let f = Figures {
                        bytes_start: start.min(peak),
                        bytes_end: peak,
                        bytes_peak: peak,
                        inodes_peak: peak / 4096,
                        inodes_end: peak / 4096,
                        peak_bytes_per_sec: rate,
                        bytes_written: rate * 10,
                        deletes,
                        ..cache()
                    };
                    let a = recommend("/srv/c", &f);
                    let e = &a.entry;
                    let ctx = format!("{f:?} -> {e:?}");
                    assert!(e.size >= MIN_SIZE && e.size % MIB == 0, "{ctx}");
                    assert!(e.size as f64 * PEAK_SHARE >= peak as f64 - 1.0, "{ctx}");
                    assert!((HIGH_MIN..=HIGH_MAX).contains(&e.high) && e.low < e.high, "{ctx}");
                    let room = rate as f64 * REACTION_SECS * REACTION_FACTOR;
                    assert!(e.size as f64 * f64::from(100 - e.high) / 100.0 >= room, "{ctx}");
                    assert!(e.inodes >= MIN_INODES && e.inodes >= 2 * f.inodes_peak, "{ctx}");
                    assert_eq!(e.action.contains(&"evict"), e.persist == "none", "{ctx}");
                    if let Some(max) = e.max_size {
                        assert!(max > e.size && max <= f.mem_total / 2, "{ctx}");
                    }
                    assert_eq!(a.reasons.len(), 7, "{ctx}");
                }
            }
        }
    }
}
