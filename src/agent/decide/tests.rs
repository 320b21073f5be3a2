use super::*;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn wd(actions: &[Action]) -> Watchdog {
    Watchdog {
        actions: actions.to_vec(),
        grow_step: 25 * MIB,
        max_size: actions.contains(&Action::Grow).then_some(200 * MIB),
        ..Watchdog::default()
    }
}

fn usage(size: u64, used: u64) -> Usage {
    Usage {
        size,
        used,
        inodes: 10_000,
        inodes_used: 10,
    }
}

fn mem(avail: u64) -> MemView {
    MemView {
        mem_total: 16 * GIB,
        mem_available: avail,
        psi_some_avg10: Some(0.0),
    }
}

fn budget() -> Budget {
    Budget {
        max_total: 8 * GIB,
        total_size: 100 * MIB,
        grow_floor: GIB,
        under_pressure: false,
        page_size: 4096,
    }
}

const LIM: Limits = Limits {
    spec_size: 100 * MIB,
    spec_inodes: None,
};

fn check(w: &Watchdog, t: &mut Tracker, size: u64, used: u64) -> Assessment {
    check_at(w, t, size, used, 0)
}

fn check_at(w: &Watchdog, t: &mut Tracker, size: u64, used: u64, now_ms: u64) -> Assessment {
    decide(
        w,
        t,
        &usage(size, used),
        None,
        LIM,
        &mem(8 * GIB),
        &budget(),
        now_ms,
    )
}

#[test]
fn levels_rise_at_thresholds_and_fall_only_at_low() {
    let w = wd(&[Action::Warn]);
    let mut t = Tracker::default();
    let trace: Vec<(u64, Level)> = [10, 79, 80, 90, 75, 71, 70, 79, 95, 90, 80, 71, 70, 60]
        .iter()
        .map(|&pct| {
            check(&w, &mut t, 100 * MIB, pct * MIB);
            (pct, t.level)
        })
        .collect();
    use Level::*;
    let want = [
        (10, Ok),
        (79, Ok),
        (80, Warn),
        (90, Warn),
        (75, Warn),
        (71, Warn),
        (70, Ok),
        (79, Ok),
        (95, High),
        (90, High),
        (80, High),
        (71, High),
        (70, Ok),
        (60, Ok),
    ];
    assert_eq!(trace, want);
}

#[test]
fn transitions_are_reported_once() {
    let w = wd(&[Action::Warn]);
    let mut t = Tracker::default();
    assert_eq!(
        check(&w, &mut t, 100 * MIB, 85 * MIB).transition,
        Some((Level::Ok, Level::Warn))
    );
    assert_eq!(check(&w, &mut t, 100 * MIB, 86 * MIB).transition, None);
    let v = check(&w, &mut t, 100 * MIB, 96 * MIB);
    assert_eq!(v.transition, Some((Level::Warn, Level::High)));
    assert_eq!(v.act, Some(Act::Warn), "warn action at high");
    assert_eq!(
        check(&w, &mut t, 100 * MIB, 97 * MIB).act,
        None,
        "once per excursion"
    );
    check(&w, &mut t, 100 * MIB, 50 * MIB);
    assert_eq!(
        check(&w, &mut t, 100 * MIB, 96 * MIB).act,
        Some(Act::Warn),
        "re-armed at low"
    );
}

#[test]
fn inodes_count_like_bytes() {
    let w = wd(&[Action::Evict]);
    let mut t = Tracker::default();
    let u = Usage {
        size: 100 * MIB,
        used: MIB,
        inodes: 1000,
        inodes_used: 960,
    };
    let v = decide(&w, &mut t, &u, None, LIM, &mem(8 * GIB), &budget(), 0);
    assert_eq!(t.level, Level::High);
    let Some(Act::Evict { target }) = v.act else {
        panic!("{v:?}")
    };
    assert_eq!(target.inodes, 700);
    assert_eq!(target.need(&u, None), (0, 260));
}

#[test]
fn evict_targets_low_and_hands_over_when_it_cannot_reach_below_high() {
    let w = wd(&[Action::Evict, Action::Fallback]);
    let mut t = Tracker::default();
    let v = check(&w, &mut t, 100 * MIB, 96 * MIB);
    let Some(act @ Act::Evict { target }) = v.act else {
        panic!("{v:?}")
    };
    assert_eq!(target.bytes, 70 * MIB);
    // Everything left was open for writing: still at 96%.
    after_action(&w, &mut t, &act, &usage(100 * MIB, 96 * MIB), None, false);
    assert_eq!(check(&w, &mut t, 100 * MIB, 96 * MIB).act, Some(Act::Fallback));
}

/// A zram mount 30% full whose device takes `ram` of RAM, against memory
/// thresholds warn 40MiB, high 48MiB, low 32MiB.
fn check_ram(w: &Watchdog, t: &mut Tracker, ram: u64) -> Assessment {
    decide(
        w,
        t,
        &usage(100 * MIB, 30 * MIB),
        Some(ram),
        LIM,
        &mem(8 * GIB),
        &budget(),
        0,
    )
}

#[test]
fn memory_thresholds_count_like_bytes_and_evict_their_share() {
    let w = Watchdog {
        memory: Some(MemoryThresholds {
            warn: 40 * MIB,
            high: 48 * MIB,
            low: 32 * MIB,
        }),
        ..wd(&[Action::Evict, Action::Fallback])
    };
    let mut t = Tracker::default();
    assert_eq!(check_ram(&w, &mut t, 39 * MIB).transition, None);
    assert_eq!(
        check_ram(&w, &mut t, 40 * MIB).transition,
        Some((Level::Ok, Level::Warn))
    );
    let v = check_ram(&w, &mut t, 60 * MIB);
    assert_eq!(v.transition, Some((Level::Warn, Level::High)));
    let Some(act @ Act::Evict { target }) = v.act else {
        panic!("{v:?}")
    };
    // 30MiB of data take 60MiB of RAM; low is 32MiB: 28/60 of the data go.
    assert_eq!(target.memory, Some(32 * MIB));
    assert_eq!(
        target.need(&usage(100 * MIB, 30 * MIB), Some(60 * MIB)),
        (14 * MIB, 0)
    );
    assert_eq!(target.need(&usage(100 * MIB, 16 * MIB), Some(32 * MIB)), (0, 0));
    // Still above high in RAM after freeing nothing: the next action.
    after_action(
        &w,
        &mut t,
        &act,
        &usage(100 * MIB, 30 * MIB),
        Some(60 * MIB),
        false,
    );
    assert_eq!(check_ram(&w, &mut t, 60 * MIB).act, Some(Act::Fallback));
    // Hysteresis: below high but above low stays high; at low it is over.
    let mut t = Tracker::default();
    check_ram(&w, &mut t, 48 * MIB);
    assert_eq!(check_ram(&w, &mut t, 33 * MIB).transition, None);
    assert_eq!(
        check_ram(&w, &mut t, 32 * MIB).transition,
        Some((Level::High, Level::Ok))
    );
    // Without a RAM figure (not read) memory counts for nothing.
    let mut t = Tracker::default();
    let v = decide(
        &w,
        &mut t,
        &usage(100 * MIB, 30 * MIB),
        None,
        LIM,
        &mem(8 * GIB),
        &budget(),
        0,
    );
    assert_eq!((v.transition, v.act), (None, None));
    // A tmpfs-style watchdog without memory thresholds ignores a figure.
    let plain = wd(&[Action::Evict]);
    assert_eq!(check_ram(&plain, &mut Tracker::default(), GIB).act, None);
}

#[test]
fn a_partial_eviction_keeps_the_stage() {
    let w = wd(&[Action::Evict, Action::Fallback]);
    let mut t = Tracker::default();
    let v = check(&w, &mut t, 100 * MIB, 96 * MIB);
    after_action(
        &w,
        &mut t,
        v.act.as_ref().unwrap(),
        &usage(100 * MIB, 80 * MIB),
        None,
        true,
    );
    assert_eq!(t.stage, 0);
    assert!(matches!(
        check(&w, &mut t, 100 * MIB, 95 * MIB).act,
        Some(Act::Evict { .. })
    ));
}

#[test]
fn grow_steps_up_to_max_size_then_the_next_action() {
    let w = wd(&[Action::Grow, Action::Evict]);
    let mut t = Tracker::default();
    let mut size = 100 * MIB;
    let mut sizes = Vec::new();
    for _ in 0..6 {
        let v = check(&w, &mut t, size, size / 100 * 96);
        match v.act {
            Some(Act::Grow { size: s, nr_inodes }) => {
                assert_eq!(nr_inodes, None, "inodes unset in the spec stay the kernel's");
                size = s;
                sizes.push(s / MIB);
            }
            Some(Act::Evict { .. }) => {
                assert_eq!(v.skipped.len(), 1, "{v:?}");
                assert!(v.skipped[0].1.contains("max_size"), "{v:?}");
                sizes.push(0);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(sizes, [125, 150, 175, 200, 0]);
}

#[test]
fn grow_stays_within_memory_budget_and_pressure() {
    let w = wd(&[Action::Grow]);
    let u = usage(100 * MIB, 96 * MIB);
    let ok = grow_size(&w, &u, LIM, &mem(8 * GIB), &budget());
    assert_eq!(ok, Ok((125 * MIB, None)));
    let low_mem = grow_size(&w, &u, LIM, &mem(GIB + 10 * MIB), &budget());
    assert!(low_mem.unwrap_err().contains("grow floor"));
    let b = Budget {
        total_size: 8 * GIB - MIB,
        ..budget()
    };
    assert!(grow_size(&w, &u, LIM, &mem(8 * GIB), &b)
        .unwrap_err()
        .contains("max_total"));
    let b = Budget {
        under_pressure: true,
        ..budget()
    };
    assert!(grow_size(&w, &u, LIM, &mem(8 * GIB), &b)
        .unwrap_err()
        .contains("pressure"));
    // The last step stops at max_size.
    let u = usage(190 * MIB, 189 * MIB);
    assert_eq!(
        grow_size(&w, &u, LIM, &mem(8 * GIB), &budget()),
        Ok((200 * MIB, None))
    );
}

#[test]
fn grow_keeps_the_inode_ratio_a_spec_set() {
    let w = wd(&[Action::Grow]);
    let u = Usage {
        size: 100 * MIB,
        used: 10 * MIB,
        inodes: 1000,
        inodes_used: 990,
    };
    let lim = Limits {
        spec_size: 100 * MIB,
        spec_inodes: Some(1000),
    };
    assert_eq!(
        grow_size(&w, &u, lim, &mem(8 * GIB), &budget()),
        Ok((125 * MIB, Some(1250)))
    );
}

#[test]
fn a_chain_that_runs_out_is_reported_once_and_rearms_at_low() {
    let w = wd(&[Action::Grow]);
    let mut t = Tracker::default();
    let v = check(&w, &mut t, 200 * MIB, 199 * MIB);
    assert!(v.exhausted.is_some() && v.act.is_none(), "{v:?}");
    assert!(check(&w, &mut t, 200 * MIB, 199 * MIB).exhausted.is_none());
    check(&w, &mut t, 200 * MIB, 10 * MIB);
    assert_eq!(
        t,
        Tracker {
            level: Level::Ok,
            last: Some((0, 10 * MIB)),
            ..Tracker::default()
        }
    );
}

/// A writer that would cross `high` before an eviction could finish gets one
/// started early: at 200 MiB/s, checked every 5 ms, well before `high`.
#[test]
fn a_fast_writer_is_met_by_an_eviction_before_high() {
    let w = wd(&[Action::Evict]);
    let mut t = Tracker::default();
    let high = (w.bytes.high * MIB as f64) as u64;
    let mut first = None;
    for step in 0..100u64 {
        let used = 50 * MIB + step * MIB;
        let v = check_at(&w, &mut t, 100 * MIB, used, step * 5);
        if v.act.is_some() {
            assert!(matches!(v.act, Some(Act::Evict { .. })) && v.early, "{v:?}");
            first = Some(used);
            break;
        }
    }
    let first = first.expect("an eviction before the mount fills");
    assert!(first < high, "evicted at {first}, high {high}");
    assert!(first as f64 > w.bytes.low * MIB as f64);
    // 200 MiB/s for LEAD_MS: 8 MiB ahead, give or take the averaging.
    assert!(
        high - first <= 9 * MIB,
        "not absurdly early: {}",
        (high - first) / MIB
    );
}

#[test]
fn a_slow_or_stale_writer_waits_for_high() {
    let w = wd(&[Action::Evict]);
    let high = (w.bytes.high * MIB as f64) as u64;
    // 1 MiB/s, checked every 10 ms.
    let mut t = Tracker::default();
    for step in 0..100u64 {
        let used = high - 2 * MIB + step * 10 * KIB;
        assert!(check_at(&w, &mut t, 100 * MIB, used, step * 10).act.is_none());
    }
    // Fast, but the samples are seconds apart: no rate.
    let mut t = Tracker::default();
    for step in 0..5u64 {
        let used = high - 5 * MIB + step * MIB;
        assert!(check_at(&w, &mut t, 100 * MIB, used, step * 2_000).act.is_none());
        assert_eq!(t.growth, 0);
    }
    // Fast, but the chain starts with `warn`: nothing early.
    let w = wd(&[Action::Warn, Action::Evict]);
    let mut t = Tracker::default();
    for step in 0..8u64 {
        let used = high - 8 * MIB + step * MIB;
        assert!(check_at(&w, &mut t, 100 * MIB, used, step * 5).act.is_none());
    }
}

/// Apache refills what an eviction freed within milliseconds: as long as each
/// eviction frees something, the last action of the chain evicts again.
#[test]
fn the_last_eviction_repeats_while_it_frees_something() {
    let w = wd(&[Action::Evict]);
    let mut t = Tracker::default();
    for round in 0..50 {
        let v = check_at(&w, &mut t, 100 * MIB, 96 * MIB, round * 75);
        let act = v.act.clone().unwrap_or_else(|| panic!("round {round}: {v:?}"));
        assert!(matches!(act, Act::Evict { .. }));
        // Freed down to 70%, refilled to 96% before the agent looked again.
        after_action(&w, &mut t, &act, &usage(100 * MIB, 96 * MIB), None, true);
        assert!(!t.exhausted);
    }
}

/// Nothing evictable (every file open for writing): the chain runs out, and is
/// tried again after a growing wait, or sooner once usage moves; never for good.
#[test]
fn a_chain_with_nothing_to_free_backs_off_and_tries_again() {
    let w = wd(&[Action::Evict]);
    let mut t = Tracker::default();
    let mut now = 0;
    let mut retries = Vec::new();
    for _ in 0..8 {
        let v = check_at(&w, &mut t, 100 * MIB, 96 * MIB, now);
        let act = v.act.expect("an eviction is tried");
        after_action(&w, &mut t, &act, &usage(100 * MIB, 96 * MIB), None, false);
        let v = check_at(&w, &mut t, 100 * MIB, 96 * MIB, now);
        assert!(v.act.is_none());
        retries.push(t.retry_at_ms - now);
        // Not before it is due, when nothing moved.
        let due = t.retry_at_ms;
        assert!(check_at(&w, &mut t, 100 * MIB, 96 * MIB, due - 1).act.is_none());
        now = t.retry_at_ms;
    }
    assert_eq!(
        retries,
        [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000]
    );
    // Usage moved by 1% or more: tried again soon, not at the end of the wait.
    let v = check_at(&w, &mut t, 100 * MIB, 96 * MIB, now);
    after_action(
        &w,
        &mut t,
        v.act.as_ref().unwrap(),
        &usage(100 * MIB, 96 * MIB),
        None,
        false,
    );
    check_at(&w, &mut t, 100 * MIB, 96 * MIB, now);
    let soon = now + RETRY_MOVED_MS;
    assert!(check_at(&w, &mut t, 100 * MIB, 98 * MIB, soon - 1).act.is_none());
    let v = check_at(&w, &mut t, 100 * MIB, 98 * MIB, soon);
    assert!(matches!(v.act, Some(Act::Evict { .. })), "{v:?}");
    // Once something was freed, the wait starts over.
    after_action(
        &w,
        &mut t,
        v.act.as_ref().unwrap(),
        &usage(100 * MIB, 70 * MIB),
        None,
        true,
    );
    assert_eq!(t.backoff_ms, 0);
}

#[test]
fn shrink_gives_back_growth_but_keeps_room_for_the_contents() {
    let w = wd(&[Action::Grow]);
    let page = 4096;
    assert_eq!(
        shrink_size(&w, &usage(200 * MIB, 10 * MIB), LIM, page),
        Some((100 * MIB, None))
    );
    // 150 MiB in use must stay below high (95%).
    let (size, _) = shrink_size(&w, &usage(200 * MIB, 150 * MIB), LIM, page).unwrap();
    assert!(size > 157 * MIB && size < 158 * MIB, "{size}");
    assert_eq!(
        shrink_size(&w, &usage(100 * MIB, 10 * MIB), LIM, page),
        None,
        "never below spec"
    );
    assert_eq!(shrink_size(&w, &usage(200 * MIB, 195 * MIB), LIM, page), None);
}

#[test]
fn evictions_are_least_recently_used_first_until_enough() {
    let f = |last_use, bytes, frees_inode, entry| Candidate {
        last_use,
        bytes,
        frees_inode,
        entry,
        busy: false,
    };
    let c = [
        f(30, 10, true, 0),
        f(10, 10, true, 1),
        f(20, 0, false, 2),
        f(40, 100, true, 3),
    ];
    assert_eq!(pick_evictions(&c, 15, 0), [1, 2, 0]);
    assert_eq!(pick_evictions(&c, 0, 0), Vec::<usize>::new());
    assert_eq!(pick_evictions(&c, 0, 2), [1, 2, 0]);
    assert_eq!(pick_evictions(&c, 1000, 0), [1, 2, 0, 3], "all there is");
}

/// Apache's `X.header` and `X.data` go together, header first, and only when
/// neither is open for writing; the entry was used when either was.
#[test]
fn entries_go_whole_smaller_files_first_and_never_with_a_busy_member() {
    let f = |last_use, bytes, entry, busy| Candidate {
        last_use,
        bytes,
        frees_inode: true,
        entry,
        busy,
    };
    let c = [
        f(10, 65536, 0, false), // A.data, old
        f(50, 300, 0, false),   // A.header, read recently: A is recent
        f(20, 65536, 1, false), // B.data
        f(20, 280, 1, false),   // B.header
        f(5, 65536, 2, false),  // C.data, oldest
        f(5, 300, 2, true),     // C.header, being written
    ];
    assert_eq!(
        pick_evictions(&c, 1, 0),
        [3, 2],
        "B whole, header first; C is busy"
    );
    assert_eq!(pick_evictions(&c, 70_000, 0), [3, 2, 1, 0]);
    assert_eq!(pick_evictions(&c, u64::MAX, 0), [3, 2, 1, 0], "never C");
}

fn settings() -> AgentSettings {
    AgentSettings {
        min_available: GIB,
        max_pressure: 20.0,
        cooldown_ms: 10_000,
        ..AgentSettings::default()
    }
}

#[test]
fn pressure_from_mem_available_or_psi() {
    let s = settings();
    assert_eq!(pressure(&mem(2 * GIB), &s), None);
    assert!(pressure(&mem(GIB - 1), &s).unwrap().contains("MemAvailable"));
    let psi = MemView {
        psi_some_avg10: Some(20.5),
        ..mem(2 * GIB)
    };
    assert!(pressure(&psi, &s).unwrap().contains("PSI"));
    let no_psi = MemView {
        psi_some_avg10: None,
        ..mem(2 * GIB)
    };
    assert_eq!(pressure(&no_psi, &s), None);
}

#[test]
fn guard_goes_gentlest_first_lowest_priority_first_with_cooldown() {
    use PressureAction::*;
    let vol = Watchdog {
        pressure: vec![Evict, Shrink, Fallback],
        priority: 50,
        ..wd(&[Action::Evict])
    };
    let grown = Watchdog {
        pressure: vec![Shrink, Fallback],
        priority: 10,
        ..wd(&[Action::Grow])
    };
    let keep = Watchdog {
        pressure: vec![],
        priority: 0,
        ..wd(&[Action::Warn])
    };
    let views = |vol_used: u64, grown_size: u64| {
        vec![
            PressureView {
                index: 0,
                watchdog: &keep,
                usage: usage(100 * MIB, 99 * MIB),
                memory: None,
                limits: LIM,
            },
            PressureView {
                index: 1,
                watchdog: &vol,
                usage: usage(100 * MIB, vol_used),
                memory: None,
                limits: LIM,
            },
            PressureView {
                index: 2,
                watchdog: &grown,
                usage: usage(grown_size, 10 * MIB),
                memory: None,
                limits: LIM,
            },
        ]
    };
    let s = settings();
    let short = mem(GIB / 2);
    assert_eq!(
        guard(&mem(4 * GIB), &s, &views(90 * MIB, 200 * MIB), None, 4096),
        Guard::Calm
    );
    assert_eq!(
        guard(&short, &s, &views(90 * MIB, 200 * MIB), Some(5000), 4096),
        Guard::Cooling
    );
    // Evicting the volatile cache comes before shrinking the lower-priority one.
    let g = guard(&short, &s, &views(90 * MIB, 200 * MIB), Some(10_000), 4096);
    assert!(
        matches!(
            g,
            Guard::Act {
                index: 1,
                action: Evict,
                ..
            }
        ),
        "{g:?}"
    );
    // Nothing left to evict: shrink the grown mount.
    let g = guard(&short, &s, &views(70 * MIB, 200 * MIB), None, 4096);
    assert_eq!(
        g,
        Guard::Act {
            index: 2,
            action: Shrink,
            act: Act::Grow {
                size: 100 * MIB,
                nr_inodes: None
            }
        }
    );
    // Nothing to shrink: fall back, priority 10 before priority 50.
    let g = guard(&short, &s, &views(70 * MIB, 100 * MIB), None, 4096);
    assert!(
        matches!(
            g,
            Guard::Act {
                index: 2,
                action: Fallback,
                ..
            }
        ),
        "{g:?}"
    );
    let g = guard(&short, &s, &views(70 * MIB, 100 * MIB)[..2], None, 4096);
    assert!(
        matches!(
            g,
            Guard::Act {
                index: 1,
                action: Fallback,
                ..
            }
        ),
        "{g:?}"
    );
    assert_eq!(
        guard(&short, &s, &views(70 * MIB, 100 * MIB)[..1], None, 4096),
        Guard::Exhausted
    );
}

#[test]
fn equal_priorities_act_on_the_later_mount_first() {
    let a = Watchdog::default();
    let v = |index| PressureView {
        index,
        watchdog: &a,
        usage: usage(100 * MIB, 10 * MIB),
        memory: None,
        limits: LIM,
    };
    let g = guard(&mem(0), &settings(), &[v(0), v(1), v(2)], None, 4096);
    assert!(matches!(g, Guard::Act { index: 2, .. }), "{g:?}");
}

#[test]
fn periodic_sync_is_due_a_period_after_the_last() {
    assert_eq!(sync_due_in(900, None, 1000), 900);
    assert_eq!(sync_due_in(900, Some(1000), 1100), 800);
    assert_eq!(sync_due_in(900, Some(1000), 5000), 0);
    assert_eq!(
        sync_due_in(900, Some(u64::MAX), 5000),
        900,
        "a record from the future waits one period"
    );
    assert_eq!(sync_due_in(u64::MAX, Some(u64::MAX), 0), u64::MAX);
}

#[test]
fn deadlines_are_capped_not_overflowed() {
    let now = Instant::now();
    assert_eq!(deadline(now, 10), now + Duration::from_secs(10));
    assert_eq!(deadline(now, u64::MAX), now + Duration::from_secs(FAR_SECS));
}
