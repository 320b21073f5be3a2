use super::*;

/// One mount at a fresh directory with the given extra mount lines and
/// top-level lines.
fn wd_yaml(d: &tempfile::TempDir, top: &str, extra: &str) -> String {
    format!(
        "version: 1\n{top}mounts:\n  - name: c\n    path: {}\n    size: 100MiB\n{extra}",
        d.path().display()
    )
}

fn one_err(yaml: &str) -> crate::error::Diagnostic {
    let e = parse_err(yaml);
    assert_eq!(e.diagnostics.len(), 1, "{e}");
    e.diagnostics[0].clone()
}

#[test]
fn watchdog_defaults_warn_only_and_agent_defaults() {
    let d = dir();
    let s = parse_ok(&wd_yaml(&d, "", ""));
    let w = &s.mounts[0].watchdog;
    assert_eq!(w.actions, [Action::Warn]);
    assert_eq!(w.bytes, Thresholds::DEFAULT);
    assert_eq!(w.inodes, Thresholds::DEFAULT);
    assert_eq!(
        w.pressure,
        [
            PressureAction::Evict,
            PressureAction::Shrink,
            PressureAction::Fallback
        ],
        "a volatile cache may be evicted under memory pressure"
    );
    assert_eq!((w.max_size, w.reoffload_after, w.priority), (None, None, 50));
    let a = &s.agent;
    assert_eq!(a.interval_ms, 1000);
    assert_eq!(a.metrics, MetricsTarget::Auto);
    assert_eq!(a.min_available, 16 * GIB / 20);
    assert_eq!(a.grow_floor, 16 * GIB / 5);
    assert_eq!((a.max_pressure, a.cooldown_ms), (25.0, 10_000));
    let s = parse_ok(&wd_yaml(&d, "", "    persist: on-stop\n"));
    assert_eq!(
        s.mounts[0].watchdog.pressure,
        [PressureAction::Shrink, PressureAction::Fallback],
        "a persisted mount is never evicted"
    );
}

#[test]
fn watchdog_fields_merge_over_defaults_one_by_one() {
    let d = dir();
    let p = d.path().display();
    let s = parse_ok(&format!(
        "version: 1\ndefaults:\n  watchdog: {{ warn: 80%, high: 95%, low: 70%, action: evict, priority: 10 }}\nmounts:\n  - name: a\n    path: {p}/a\n    size: 100MiB\n    create: true\n  - name: b\n    path: {p}/b\n    size: 100MiB\n    create: true\n    persist: every 15m\n    watchdog: {{ high: 90%, action: fallback, reoffload_after: 10m, inodes: {{ warn: 40%, high: 50%, low: 10% }} }}\n"
    ));
    let (a, b) = (&s.mounts[0].watchdog, &s.mounts[1].watchdog);
    assert_eq!(a.actions, [Action::Evict]);
    assert_eq!(a.priority, 10);
    assert_eq!(b.actions, [Action::Fallback]);
    assert_eq!(
        b.bytes,
        Thresholds {
            warn: 80.0,
            high: 90.0,
            low: 70.0
        }
    );
    assert_eq!(
        b.inodes,
        Thresholds {
            warn: 40.0,
            high: 50.0,
            low: 10.0
        },
        "unset inode thresholds follow the byte thresholds"
    );
    assert_eq!(b.reoffload_after, Some(600));
    assert_eq!(b.priority, 10, "inherited from defaults");
}

#[test]
fn grow_chain_with_step_and_max_size() {
    let d = dir();
    let s = parse_ok(&wd_yaml(
        &d,
        "",
        "    watchdog:\n      action: [grow, evict]\n      max_size: 200MiB\n      grow_step: 10%\n",
    ));
    let w = &s.mounts[0].watchdog;
    assert_eq!(w.actions, [Action::Grow, Action::Evict]);
    assert_eq!(w.max_size, Some(200 << 20));
    assert_eq!(w.grow_step, 10 << 20, "a percentage step is of the mount's size");
    let s = parse_ok(&wd_yaml(
        &d,
        "",
        "    watchdog:\n      action: [grow]\n      max_size: 1%\n",
    ));
    assert_eq!(
        s.mounts[0].watchdog.max_size,
        Some(16 * GIB / 100),
        "max_size % is of RAM"
    );
    assert_eq!(
        s.mounts[0].watchdog.grow_step,
        25 << 20,
        "default step: 25% of size"
    );
}

#[test]
fn agent_settings_parse() {
    let d = dir();
    let s = parse_ok(&wd_yaml(
        &d,
        "agent:\n  interval: 250ms\n  metrics: /tmp/x.prom\n  min_available: 1GiB\n  max_pressure: 12.5%\n  grow_floor: 10%\n  cooldown: 2s\n",
        "",
    ));
    let a = &s.agent;
    assert_eq!(a.interval_ms, 250);
    assert_eq!(a.metrics, MetricsTarget::File("/tmp/x.prom".into()));
    assert_eq!((a.min_available, a.grow_floor), (GIB, 16 * GIB / 10));
    assert_eq!((a.max_pressure, a.cooldown_ms), (12.5, 2000));
    let s = parse_ok(&wd_yaml(&d, "agent:\n  metrics: off\n", ""));
    assert_eq!(s.agent.metrics, MetricsTarget::Off);
}

// Long: one table of cases, each a line, and the loop that checks them.
#[test]
fn bad_watchdog_fields_are_located_and_explained() {
    let d = dir();
    let persisted = "    persist: on-stop\n";
    let zram = "    backend: zram\n";
    let cases: Vec<(String, u64, &str, &str, &str)> = vec![
        // (extra lines, line, the bad token (its last occurrence), field, message part)
        (
            "    watchdog: { high: 95 }\n".into(),
            6,
            "95",
            "mounts[0].watchdog.high",
            "% sign is missing",
        ),
        (
            "    watchdog: { warn: 120% }\n".into(),
            6,
            "120%",
            "mounts[0].watchdog.warn",
            "at most 100%",
        ),
        (
            "    watchdog: { high: 60%, low: 65% }\n".into(),
            6,
            "65%",
            "mounts[0].watchdog.low",
            "low 65% must be below high 60%",
        ),
        (
            "    watchdog: { low: 96% }\n".into(),
            6,
            "96%",
            "mounts[0].watchdog.low",
            "must be below high",
        ),
        (
            "    watchdog: { warn: 99% }\n".into(),
            6,
            "99%",
            "mounts[0].watchdog.warn",
            "above high",
        ),
        (
            "    watchdog: { inodes: { low: 99% } }\n".into(),
            6,
            "99%",
            "mounts[0].watchdog.inodes.low",
            "of the inode limit",
        ),
        (
            "    watchdog: { action: explode }\n".into(),
            6,
            "explode",
            "mounts[0].watchdog.action",
            "invalid action `explode`",
        ),
        (
            "    watchdog: { action: [grow, explode] }\n".into(),
            6,
            "explode",
            "mounts[0].watchdog.action[1]",
            "invalid action `explode`",
        ),
        (
            "    watchdog: { action: [evict, evict] }\n".into(),
            6,
            "evict",
            "mounts[0].watchdog.action[1]",
            "listed twice",
        ),
        (
            "    watchdog: { action: [warn, evict] }\n".into(),
            6,
            "warn",
            "mounts[0].watchdog.action[0]",
            "cannot be combined",
        ),
        (
            "    watchdog: { action: [fallback, evict] }\n".into(),
            6,
            "fallback",
            "mounts[0].watchdog.action[0]",
            "no action can follow",
        ),
        (
            "    watchdog: { action: [] }\n".into(),
            6,
            "[]",
            "mounts[0].watchdog.action",
            "empty action list",
        ),
        (
            format!("{persisted}    watchdog: {{ action: evict }}\n"),
            7,
            "evict",
            "mounts[0].watchdog.action",
            "is persisted",
        ),
        (
            format!("{persisted}    watchdog: {{ pressure: [evict] }}\n"),
            7,
            "evict",
            "mounts[0].watchdog.pressure[0]",
            "is persisted",
        ),
        (
            "    watchdog: { action: grow }\n".into(),
            6,
            "grow",
            "mounts[0].watchdog.action",
            "needs `max_size`",
        ),
        (
            "    watchdog: { action: grow, max_size: 50MiB }\n".into(),
            6,
            "50MiB",
            "mounts[0].watchdog.max_size",
            "not above the mount's size",
        ),
        (
            "    watchdog: { action: grow, max_size: 9GiB }\n".into(),
            6,
            "9GiB",
            "mounts[0].watchdog.max_size",
            "exceeds the RAM budget",
        ),
        (
            "    watchdog: { max_size: 1GiB }\n".into(),
            6,
            "1GiB",
            "mounts[0].watchdog.max_size",
            "no effect without `grow`",
        ),
        (
            "    watchdog: { action: grow, max_size: 1GiB, grow_step: lots }\n".into(),
            6,
            "lots",
            "mounts[0].watchdog.grow_step",
            "invalid grow step",
        ),
        (
            "    watchdog: { action: fallback, reoffload_after: 5s }\n".into(),
            6,
            "5s",
            "mounts[0].watchdog.reoffload_after",
            "at least 10s",
        ),
        (
            "    watchdog: { pressure: none, reoffload_after: 10m }\n".into(),
            6,
            "10m",
            "mounts[0].watchdog.reoffload_after",
            "no effect",
        ),
        (
            "    watchdog: { pressure: [shrink, drop] }\n".into(),
            6,
            "drop",
            "mounts[0].watchdog.pressure[1]",
            "invalid pressure action `drop`",
        ),
        (
            "    watchdog: { priority: 101 }\n".into(),
            6,
            "101",
            "mounts[0].watchdog.priority",
            "invalid priority 101",
        ),
        (
            "    watchdog: { memory: { high: 64MiB } }\n".into(),
            6,
            "64MiB",
            "mounts[0].watchdog.memory.high",
            "mounts[0] is a tmpfs",
        ),
        (
            format!("{zram}    watchdog: {{ memory: {{ high: 200MiB }} }}\n"),
            7,
            "200MiB",
            "mounts[0].watchdog.memory.high",
            "above the mount's size 100MiB",
        ),
        (
            format!("{zram}    watchdog: {{ memory: {{ high: 0% }} }}\n"),
            7,
            "0%",
            "mounts[0].watchdog.memory.high",
            "above 0%",
        ),
        (
            format!("{zram}    watchdog: {{ memory: {{ warn: 10MiB }} }}\n"),
            7,
            "10MiB",
            "mounts[0].watchdog.memory.warn",
            "needs `high`",
        ),
        (
            format!("{zram}    watchdog: {{ memory: {{ high: 40%, low: 60MiB }} }}\n"),
            7,
            "60MiB",
            "mounts[0].watchdog.memory.low",
            "memory low 60MiB must be below memory high 40MiB",
        ),
        (
            format!("{zram}    watchdog: {{ memory: {{ high: 40MiB, warn: 50% }} }}\n"),
            7,
            "50%",
            "mounts[0].watchdog.memory.warn",
            "above memory high",
        ),
        (
            format!("{zram}    watchdog: {{ memory: {{ high: lots }} }}\n"),
            7,
            "lots",
            "mounts[0].watchdog.memory.high",
            "invalid memory threshold `lots`",
        ),
    ];
    for (extra, line, token, field, msg) in cases {
        let yaml = wd_yaml(&d, "", &extra);
        let e = one_err(&yaml);
        let text = yaml.lines().nth(line as usize - 1).unwrap();
        let column = text.rfind(token).unwrap() as u64 + 1;
        assert_eq!(
            (e.line, e.column, e.field.as_str()),
            (line, column, field),
            "{extra}: {e:?}"
        );
        assert!(e.message.contains(msg), "{extra}: {:?} lacks {msg:?}", e.message);
        assert!(e.accepted.is_some(), "{extra}: says what is accepted");
    }
}

#[test]
fn bad_agent_settings_are_located() {
    let d = dir();
    for (top, line, field, msg) in [
        ("agent:\n  interval: 10ms\n", 3, "agent.interval", "out of range"),
        (
            "agent:\n  interval: 1x\n",
            3,
            "agent.interval",
            "unknown duration unit `x`",
        ),
        ("agent:\n  metrics: rel/x.prom\n", 3, "agent.metrics", "absolute"),
        ("agent:\n  metrics: /tmp\n", 3, "agent.metrics", "is a directory"),
        (
            "agent:\n  min_available: 5 apples\n",
            3,
            "agent.min_available",
            "invalid size",
        ),
        ("agent:\n  max_pressure: 20\n", 3, "agent.max_pressure", "% sign"),
        ("agent:\n  cooldown: 2h\n", 3, "agent.cooldown", "out of range"),
    ] {
        let e = one_err(&wd_yaml(&d, top, ""));
        assert_eq!((e.line, e.field.as_str()), (line, field), "{top}: {e:?}");
        assert!(e.message.contains(msg), "{top}: {:?} lacks {msg:?}", e.message);
    }
    let e = parse_err(&wd_yaml(&d, "agent:\n  intervall: 1s\n", ""));
    assert!(
        e.diagnostics[0].message.contains("unknown field `intervall`"),
        "{e}"
    );
}

#[test]
fn a_bad_default_is_reported_once_not_per_mount() {
    let d = dir();
    let p = d.path().display();
    let e = parse_err(&format!(
        "version: 1\ndefaults:\n  watchdog: {{ high: 75%, warn: 80% }}\nmounts:\n  - name: a\n    path: {p}/a\n    size: 1MiB\n    create: true\n  - name: b\n    path: {p}/b\n    size: 1MiB\n    create: true\n"
    ));
    assert_eq!(e.diagnostics.len(), 1, "{e}");
    assert_eq!(e.diagnostics[0].field, "defaults.watchdog.warn");
    assert_eq!(e.diagnostics[0].line, 3);
    // A default that only one mount cannot use is reported at the default
    // for that mount, naming the mount.
    let e = parse_err(&format!(
        "version: 1\ndefaults:\n  watchdog: {{ action: evict }}\nmounts:\n  - name: a\n    path: {p}/a\n    size: 1MiB\n    create: true\n  - name: b\n    path: {p}/b\n    size: 1MiB\n    create: true\n    persist: on-stop\n"
    ));
    assert_eq!(e.diagnostics.len(), 1, "{e}");
    assert_eq!(e.diagnostics[0].field, "defaults.watchdog.action");
    assert!(e.diagnostics[0].message.contains("mounts[1] is persisted"), "{e}");
}

#[test]
fn unset_warn_and_low_follow_a_lower_high() {
    let d = dir();
    let s = parse_ok(&wd_yaml(
        &d,
        "",
        "    watchdog: { high: 60%, inodes: { high: 40% } }\n",
    ));
    let w = &s.mounts[0].watchdog;
    assert_eq!(
        w.bytes,
        Thresholds {
            warn: 60.0,
            high: 60.0,
            low: 45.0
        }
    );
    assert_eq!(
        w.inodes,
        Thresholds {
            warn: 40.0,
            high: 40.0,
            low: 30.0
        }
    );
    let s = parse_ok(&wd_yaml(&d, "", "    watchdog: { high: 90% }\n"));
    assert_eq!(
        s.mounts[0].watchdog.bytes,
        Thresholds {
            warn: 80.0,
            high: 90.0,
            low: 67.5
        }
    );
}

#[test]
fn memory_thresholds_are_sizes_or_shares_of_a_zram_size_and_skip_tmpfs_mounts() {
    let d = dir();
    let p = d.path().display();
    let s = parse_ok(&format!(
        "version: 1\ndefaults:\n  watchdog: {{ memory: {{ high: 50% }}, action: evict }}\nmounts:\n  - name: a\n    path: {p}/a\n    size: 100MiB\n    create: true\n    backend: zram\n  - name: b\n    path: {p}/b\n    size: 100MiB\n    create: true\n  - name: c\n    path: {p}/c\n    size: 100MiB\n    create: true\n    backend: zram\n    watchdog: {{ memory: {{ warn: 20MiB, high: 24MiB, low: 16MiB }} }}\n"
    ));
    let mib = 1u64 << 20;
    assert_eq!(
        s.mounts[0].watchdog.memory,
        Some(MemoryThresholds {
            warn: 50 * mib,
            high: 50 * mib,
            low: 50 * mib / 4 * 3
        }),
        "unset: warn at high, low at 3/4 of it"
    );
    assert_eq!(s.mounts[1].watchdog.memory, None, "a tmpfs inherits none");
    assert_eq!(
        s.mounts[2].watchdog.memory,
        Some(MemoryThresholds {
            warn: 20 * mib,
            high: 24 * mib,
            low: 16 * mib
        })
    );
    assert_eq!(s.mounts[2].watchdog.actions, [Action::Evict]);
}
