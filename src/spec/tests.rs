use std::path::Path;

use super::load::MAX_SPEC_BYTES;
use super::*;
use crate::error::SpecError;

/// The `watchdog:` and `agent:` sections.
mod watchdog;

const GIB: u64 = 1 << 30;

fn parse_ok(yaml: &str) -> Spec {
    parse(Path::new("t.yaml"), yaml, 16 * GIB).unwrap_or_else(|e| panic!("{e}"))
}

fn parse_err(yaml: &str) -> SpecError {
    parse(Path::new("t.yaml"), yaml, 16 * GIB).expect_err("spec should be invalid")
}

fn dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tmpfsctl-spec-")
        .tempdir_in("/tmp")
        .unwrap()
}

#[test]
fn minimal_spec_gets_secure_defaults() {
    let d = dir();
    let s = parse_ok(&format!(
        "version: 1\nmounts:\n  - name: c\n    path: {}\n    size: 10%\n",
        d.path().display()
    ));
    let m = &s.mounts[0];
    assert_eq!(m.size, 16 * GIB / 10);
    assert_eq!(
        m.flags,
        Flags {
            nosuid: true,
            nodev: true,
            noexec: false,
            atime: None
        }
    );
    assert_eq!(
        (m.huge, m.seed, m.persist, m.on_failure),
        (Huge::Never, Seed::Copy, Persist::None, OnFailure::KeepDisk)
    );
    assert_eq!((m.owner, m.group, m.mode, m.inodes), (None, None, None, None));
    assert!(!m.create && !m.takeover && !m.noswap);
    assert_eq!(s.max_total, 8 * GIB, "default budget is 50% of MemTotal");
    assert_eq!(m.source(), "tmpfsctl-c");
    assert_eq!(m.backend, Backend::Tmpfs);
}

#[test]
fn backend_is_read_from_the_mount_or_the_defaults() {
    let d = dir();
    let s = parse_ok(&format!(
        "version: 1\ndefaults:\n  backend: tmpfs\nmounts:\n  - name: c\n    path: {}\n    size: 1MiB\n    backend: tmpfs\n",
        d.path().display()
    ));
    assert_eq!(s.mounts[0].backend, Backend::Tmpfs);
}

#[test]
fn zram_takes_compression_and_fs_and_ignores_inherited_tmpfs_options() {
    let d = dir();
    let p = d.path().display();
    let s = parse_ok(&format!(
        "version: 1\ndefaults:\n  backend: zram\n  huge: always\n  noswap: true\nmounts:\n  - name: a\n    path: {p}/a\n    size: 1MiB\n    create: true\n    compression: zstd\n    fs: ext4\n  - name: b\n    path: {p}/b\n    size: 1MiB\n    create: true\n"
    ));
    let (a, b) = (&s.mounts[0], &s.mounts[1]);
    assert_eq!(
        (a.backend, a.compression.as_deref(), a.fs),
        (Backend::Zram, Some("zstd"), ZramFs::Ext4)
    );
    assert_eq!(
        (b.backend, b.compression.as_deref(), b.fs),
        (Backend::Zram, None, ZramFs::Ext4)
    );
}

#[test]
fn defaults_apply_and_mounts_override_them() {
    let d = dir();
    let p = d.path().display();
    let s = parse_ok(&format!(
        "version: 1\nmax_total: 2GiB\ndefaults:\n  options: [noexec]\n  huge: within_size\n  noswap: true\n  seed: empty\n  on_failure: fail\nmounts:\n  - name: a\n    path: {p}/a\n    size: 1G\n    create: true\n  - name: b\n    path: {p}/b\n    size: 1G\n    create: true\n    options: [nosuid, strictatime]\n    huge: never\n    noswap: false\n    seed: copy\n    persist: every 1h30m\n    on_failure: keep-disk\n    inodes: 2k\n    mode: \"0750\"\n    owner: root\n    group: \"0\"\n    before: [nginx.service, php-fpm.socket]\n"
    ));
    let (a, b) = (&s.mounts[0], &s.mounts[1]);
    assert_eq!(s.max_total, 2 * GIB);
    assert_eq!(
        a.flags,
        Flags {
            noexec: true,
            ..Flags::default()
        }
    );
    assert_eq!(
        (a.huge, a.noswap, a.seed, a.on_failure),
        (Huge::WithinSize, true, Seed::Empty, OnFailure::Fail)
    );
    assert_eq!(
        b.flags,
        Flags {
            nosuid: true,
            atime: Some(Atime::Strictatime),
            ..Flags::default()
        }
    );
    assert_eq!(
        (b.huge, b.noswap, b.seed, b.on_failure),
        (Huge::Never, false, Seed::Copy, OnFailure::KeepDisk)
    );
    assert_eq!(b.persist, Persist::Every(5400));
    assert_eq!(
        (b.inodes, b.mode, b.owner, b.group),
        (Some(2048), Some(0o750), Some(0), Some(0))
    );
    assert_eq!(b.before, ["nginx.service", "php-fpm.socket"]);
}

#[test]
fn budget_counts_the_sum_of_all_sizes() {
    let d = dir();
    let p = d.path().display();
    let yaml = |a: &str, b: &str| {
        format!("version: 1\nmounts:\n  - name: a\n    path: {p}/a\n    size: {a}\n    create: true\n  - name: b\n    path: {p}/b\n    size: {b}\n    create: true\n")
    };
    parse_ok(&yaml("4G", "4G"));
    let e = parse_err(&yaml("4G", "5G"));
    assert_eq!(e.diagnostics.len(), 1);
    assert_eq!(e.diagnostics[0].field, "mounts[1].size");
    assert!(e.diagnostics[0].message.contains("total size 9GiB"), "{e}");
}

#[test]
fn yaml_11_booleans_and_wrong_types_are_refused() {
    let d = dir();
    for (value, line) in [("yes", 6), ("on", 6), ("1", 6), ("no", 6)] {
        let e = parse_err(&format!(
            "version: 1\nmounts:\n  - name: a\n    path: {}\n    size: 1G\n    takeover: {value}\n",
            d.path().display()
        ));
        assert_eq!(e.diagnostics[0].line, line, "{value}: {e}");
    }
}

#[test]
fn diagnostics_are_sorted_and_all_reported() {
    let e = parse_err("version: 3\nmounts:\n  - name: A\n    path: x\n    size: 0\n    mode: \"9\"\n");
    let lines: Vec<u64> = e.diagnostics.iter().map(|d| d.line).collect();
    assert_eq!(lines, [1, 3, 4, 5, 6]);
    let fields: Vec<&str> = e.diagnostics.iter().map(|d| d.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "version",
            "mounts[0].name",
            "mounts[0].path",
            "mounts[0].size",
            "mounts[0].mode"
        ]
    );
}

#[test]
fn carets_cover_the_bad_value() {
    let e = parse_err("version: 1\nmounts:\n  - name: BadName\n    path: /x\n    size: 1G\n");
    let d = e
        .diagnostics
        .iter()
        .find(|d| d.field == "mounts[0].name")
        .unwrap();
    assert_eq!((d.line, d.column, d.width), (3, 11, 7));
}

#[test]
fn an_empty_mount_list_is_valid_and_a_missing_one_is_not() {
    // The packaged /etc/tmpfsctl/cache.yaml: valid, mounts nothing.
    assert!(parse_ok("version: 1\nmounts: []\n").mounts.is_empty());
    let e = parse_err("version: 1\n");
    assert!(e.to_string().contains("missing field `mounts`"), "{e}");
}

#[test]
fn unknown_fields_name_the_field() {
    let e = parse_err("version: 1\nmounts: []\nboot: systemd\n");
    let d = e.diagnostics.iter().find(|d| d.field == "boot").unwrap();
    assert_eq!(d.line, 3);
    assert!(d.message.contains("unknown field `boot`"), "{e}");
    assert!(d.accepted.as_ref().unwrap().contains("mounts"), "{e}");
}

fn fields_of(e: &SpecError) -> Vec<(u64, &str)> {
    e.diagnostics.iter().map(|d| (d.line, d.field.as_str())).collect()
}

#[test]
fn every_missing_unknown_and_mistyped_field_is_reported_with_its_path() {
    let d = dir();
    let p = d.path().display();
    let e = parse_err(&format!(
        "mounts:\n  - name: a\n    path: {p}\n  - path: {p}/b\n    sise: 1G\n    create: yes\n    options: nosuid\n    watchdog: {{ hihg: 90%, priority: high }}\n  - just a string\n  - name: c\n    size:\nagent: {{ intervall: 1s }}\n",
    ));
    assert_eq!(
        fields_of(&e),
        [
            (1, "version"),
            (2, "mounts[0].size"),
            (4, "mounts[1].name"),
            (4, "mounts[1].size"),
            // `create: yes` is no boolean, so the missing directory counts.
            (4, "mounts[1].path"),
            (5, "mounts[1].sise"),
            (6, "mounts[1].create"),
            (7, "mounts[1].options"),
            (8, "mounts[1].watchdog.hihg"),
            (8, "mounts[1].watchdog.priority"),
            (9, "mounts[2]"),
            (10, "mounts[3].path"),
            (11, "mounts[3].size"),
            (12, "agent.intervall"),
        ],
        "{e}"
    );
    let msg = |f: &str| {
        e.diagnostics
            .iter()
            .find(|d| d.field == f)
            .map(|d| d.message.clone())
            .unwrap()
    };
    assert_eq!(msg("version"), "missing field `version`");
    assert_eq!(msg("mounts[0].size"), "missing field `size`");
    assert_eq!(msg("mounts[3].size"), "`size` has no value");
    assert_eq!(msg("mounts[1].sise"), "unknown field `sise`");
    assert_eq!(msg("mounts[1].create"), "invalid boolean `yes`");
    assert!(msg("mounts[1].options").contains("expected a list"), "{e}");
    assert!(msg("mounts[1].watchdog.priority").contains("expected a whole number, found text `high`"));
    assert!(msg("mounts[2]").contains("expected a mapping"), "{e}");
}

#[test]
fn duplicate_keys_are_reported_with_the_rest() {
    let d = dir();
    let e = parse_err(&format!(
        "version: 1\nmounts:\n  - name: a\n    path: {}\n    size: 1MiB\n    size: 2MiB\n    mode: \"9\"\n",
        d.path().display()
    ));
    assert_eq!(
        fields_of(&e),
        [(6, "mounts[0].size"), (7, "mounts[0].mode")],
        "{e}"
    );
    assert!(e.diagnostics[0]
        .message
        .contains("duplicate field `size` (first at line 5)"));
}

#[test]
fn control_characters_are_refused_in_every_value() {
    let d = dir();
    let p = d.path().display();
    for (value, field, line) in [
        (
            format!("path: \"{p}/x\\ny\"\n    create: true"),
            "mounts[0].path",
            4,
        ),
        (
            format!("path: \"{p}/x\\u007fy\"\n    create: true"),
            "mounts[0].path",
            4,
        ),
        (
            format!("path: \"{p}/x\\u0085y\"\n    create: true"),
            "mounts[0].path",
            4,
        ),
        (
            format!("path: \"{p}/x\\ty\"\n    create: true"),
            "mounts[0].path",
            4,
        ),
        (
            format!("path: {p}\n    before: [\"a.service\\n[Service]\"]"),
            "mounts[0].before[0]",
            5,
        ),
        (
            format!("path: {p}\n    owner: \"root\\e[2J\""),
            "mounts[0].owner",
            5,
        ),
    ] {
        let e = parse_err(&format!(
            "version: 1\nmounts:\n  - name: a\n    {value}\n    size: 1MiB\n"
        ));
        assert_eq!(fields_of(&e), [(line, field)], "{value}: {e}");
        assert!(e.diagnostics[0].message.contains("control character"), "{e}");
        assert!(
            !e.to_string().contains(|c: char| c.is_control() && c != '\n'),
            "{e}"
        );
    }
    let e = parse_err("version: 1\nmounts:\n  - name: \"a\\nb\"\n    path: /var/cache/x\n    size: 1M\n");
    assert_eq!(e.diagnostics[0].field, "mounts[0].name");
    let shown = e.to_string();
    assert!(
        shown.contains(r"`a\nb` contains the control character U+000A"),
        "{shown}"
    );
}

#[test]
fn a_spec_that_is_not_utf8_is_located() {
    let d = dir();
    let f = d.path().join("bin.yaml");
    std::fs::write(&f, b"version: 1\nmounts:\n  - name: a\xff\n").unwrap();
    let Err(SpecLoadError::Invalid(e)) = load(&f, 16 * GIB) else {
        panic!("not UTF-8 must be invalid input");
    };
    assert_eq!((e.diagnostics[0].line, e.diagnostics[0].column), (3, 12), "{e}");
    assert!(e.to_string().contains("not UTF-8 text: byte 0xff"), "{e}");
}

#[test]
fn thousands_of_problems_are_all_counted_and_shown_capped() {
    let d = dir();
    let mut yaml = format!(
        "version: 1\nmounts:\n  - name: a\n    path: {}\n    size: 1MiB\n",
        d.path().display()
    );
    for k in 0..5000 {
        yaml.push_str(&format!("    k{k}: 1\n"));
    }
    let e = parse_err(&yaml);
    assert_eq!(e.diagnostics.len(), 5000);
    let shown = e.to_string();
    assert_eq!(shown.matches("error: unknown field").count(), 100);
    assert!(shown.contains("4900 more problems not shown"), "{shown}");
    assert!(shown.ends_with("5000 errors in t.yaml; nothing was changed\n"));
}

#[test]
fn a_huge_spec_file_is_refused_unread() {
    let d = dir();
    let f = d.path().join("huge.yaml");
    std::fs::write(&f, vec![b'#'; (MAX_SPEC_BYTES + 1) as usize]).unwrap();
    let Err(SpecLoadError::Read { source, .. }) = load(&f, 16 * GIB) else {
        panic!("a spec over the bound must be refused");
    };
    assert!(source.to_string().contains("larger than 1MiB"), "{source}");
}

#[test]
fn values_validate_accepts_are_bounded() {
    let d = dir();
    let p = d.path().display();
    let one = |extra: &str| {
        format!(
            "version: 1\nmax_total: 1024TiB\nmounts:\n  - name: a\n    path: {p}\n    size: 1MiB\n{extra}"
        )
    };
    for (extra, field, msg) in [
        (
            "    persist: every 106751991167301d\n",
            "mounts[0].persist",
            "at most every 30d",
        ),
        (
            "    persist: every 213503982334602d\n",
            "mounts[0].persist",
            "duration too long",
        ),
        (
            "    persist: every 31d\n",
            "mounts[0].persist",
            "at most every 30d",
        ),
        (
            "    group: \"4294967295\"\n",
            "mounts[0].group",
            "gid 4294967295 is out of range",
        ),
        (
            "    owner: 99999999999\n",
            "mounts[0].owner",
            "uid 99999999999 is out of range",
        ),
        ("    inodes: 1025g\n", "mounts[0].inodes", "larger than 1024g"),
        (
            "    watchdog: { action: fallback, reoffload_after: 31d }\n",
            "mounts[0].watchdog.reoffload_after",
            "at most 30d",
        ),
        (
            "    watchdog: { priority: 4294967297 }\n",
            "mounts[0].watchdog.priority",
            "invalid priority",
        ),
        (
            "    watchdog: { priority: -1 }\n",
            "mounts[0].watchdog.priority",
            "invalid priority -1",
        ),
    ] {
        let e = parse_err(&one(extra));
        assert_eq!(e.diagnostics.len(), 1, "{extra}: {e}");
        assert_eq!(e.diagnostics[0].field, field, "{extra}: {e}");
        assert!(e.diagnostics[0].message.contains(msg), "{extra}: {e}");
    }
    let e = parse_err(&one("").replace("1024TiB", "1025TiB"));
    assert!(e.diagnostics[0].message.contains("larger than 1024TiB"), "{e}");
    let e = parse_err(&one("").replace("1MiB", "0.0000000001%"));
    assert!(e.diagnostics[0].message.contains("unlimited"), "{e}");
    let s = parse_ok(&one(
        "    persist: every 30d\n    group: \"4294967294\"\n    inodes: 1024g\n",
    ));
    assert_eq!(s.mounts[0].persist, Persist::Every(30 * 86_400));
    assert_eq!(s.mounts[0].group, Some(u32::MAX - 1));
}

#[test]
fn deep_nesting_and_alias_bombs_are_errors_not_crashes() {
    let deep = format!(
        "version: 1\nmounts: {}{}\n",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    parse_err(&deep);
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 0..12 {
        bomb.push_str(&format!(
            "b{i}: &b{i} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n",
            p = if i == 0 {
                "a".to_string()
            } else {
                format!("b{}", i - 1)
            }
        ));
    }
    parse_err(&bomb);
}
