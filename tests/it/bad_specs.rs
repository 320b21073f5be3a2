//! Every class of bad input: exit 2, a message naming file:line:col and the
//! field, and no change on the host (no mount, no state directory).

use std::fs;
use std::path::Path;

use crate::common::Sandbox;

struct Case {
    name: &'static str,
    yaml: String,
    line: u32,
    field: &'static str,
    message: &'static str,
}

fn case(name: &'static str, yaml: String, line: u32, field: &'static str, message: &'static str) -> Case {
    Case {
        name,
        yaml,
        line,
        field,
        message,
    }
}

/// One mount at `path` with the given extra lines (already indented).
fn one(path: &str, extra: &str) -> String {
    format!("version: 1\nmounts:\n  - name: cache\n    path: {path}\n    size: 8MiB\n{extra}")
}

#[test]
fn bad_specs_exit_2_point_at_the_field_and_change_nothing() {
    let sb = Sandbox::new();
    let ok = sb.cache_dir("cache", 0, 0, 0o755);
    let ok2 = sb.cache_dir("cache2", 0, 0, 0o755);
    let okp = ok.display().to_string();
    std::os::unix::fs::symlink(&ok, sb.path("link")).unwrap();
    std::os::unix::fs::symlink(&sb.root, sb.path("linkdir")).unwrap();
    let link = sb.path("link").display().to_string();
    let through = sb.path("linkdir/cache").display().to_string();
    let missing = sb.path("missing").display().to_string();
    fs::write(sb.path("afile"), "x").unwrap();
    let afile = sb.path("afile").display().to_string();
    let home = sb.cache_dir("home/alice", 0, 0, 0o755);
    fs::create_dir(home.join(".ssh")).unwrap();
    let home = home.display().to_string();
    let two = |a: &str, b: &str, extra_b: &str| {
        format!("version: 1\nmounts:\n  - name: a\n    path: {a}\n    size: 8MiB\n  - name: b\n    path: {b}\n    size: 8MiB\n{extra_b}")
    };

    let cases = vec![
        case("relative path", one("var/cache/x", ""), 4, "mounts[0].path", "is relative"),
        case("root", one("/", ""), 4, "mounts[0].path", "system directory"),
        case("system dir", one("/etc/nginx", ""), 4, "mounts[0].path", "system directory"),
        case("exact /var", one("/var", ""), 4, "mounts[0].path", "system directory"),
        case("not normalised", one(&format!("{okp}/../cache"), ""), 4, "mounts[0].path", "not normalised"),
        case("trailing slash", one(&format!("{okp}/"), ""), 4, "mounts[0].path", "not normalised"),
        case("path is a symlink", one(&link, ""), 4, "mounts[0].path", "passes through the symlink"),
        case("through a symlink", one(&through, ""), 4, "mounts[0].path", "passes through the symlink"),
        case("missing without create", one(&missing, ""), 4, "mounts[0].path", "does not exist"),
        case("path is a file", one(&afile, ""), 4, "mounts[0].path", "is not a directory"),
        case("duplicate names", format!("version: 1\nmounts:\n  - name: a\n    path: {okp}\n    size: 1MiB\n  - name: a\n    path: {}\n    size: 1MiB\n", ok2.display()), 6, "mounts[1].name", "duplicate mount name `a`"),
        case("duplicate paths", two(&okp, &okp, ""), 7, "mounts[1].path", "duplicate path"),
        case("nested paths", two(&sb.root.display().to_string(), &okp, ""), 7, "mounts[1].path", "nested"),
        case("unknown user", one(&okp, "    owner: no-such-user-xyz\n"), 6, "mounts[0].owner", "unknown user `no-such-user-xyz`"),
        case("unknown group", one(&okp, "    group: no-such-group-xyz\n"), 6, "mounts[0].group", "unknown group"),
        case("non-octal mode", one(&okp, "    mode: \"0800\"\n"), 6, "mounts[0].mode", "invalid mode `0800`"),
        case("mode too big", one(&okp, "    mode: \"17777\"\n"), 6, "mounts[0].mode", "invalid mode"),
        case("unknown top-level field", format!("{}mountz: []\n", one(&okp, "")), 6, "mountz", "unknown field `mountz`"),
        case("unknown mount field", one(&okp, "    sise: 1G\n"), 6, "mounts[0].sise", "unknown field `sise`"),
        case("wrong type", one(&okp, "    create: 5\n"), 6, "mounts[0].create", "invalid boolean `5`"),
        case("yes is not a boolean", one(&okp, "    create: yes\n"), 6, "mounts[0].create", "invalid boolean `yes`"),
        case("on is not a boolean", one(&okp, "    noswap: on\n"), 6, "mounts[0].noswap", "invalid boolean `on`"),
        case("size with unknown unit", one(&okp, "").replace("8MiB", "12 parsecs"), 5, "mounts[0].size", "unknown unit `parsecs`"),
        case("ambiguous decimal unit", one(&okp, "").replace("8MiB", "512MB"), 5, "mounts[0].size", "ambiguous"),
        case("zero size", one(&okp, "").replace("8MiB", "0"), 5, "mounts[0].size", "unlimited"),
        case("bad inode count", one(&okp, "    inodes: lots\n"), 6, "mounts[0].inodes", "invalid inode count"),
        case("unknown backend", one(&okp, "    backend: ramfs\n"), 6, "mounts[0].backend", "invalid backend `ramfs`"),
        case("unknown compression", one(&okp, "    backend: zram\n    compression: gzip\n"), 7, "mounts[0].compression", "invalid compression `gzip`"),
        case("compression on tmpfs", one(&okp, "    compression: lz4\n"), 6, "mounts[0].compression", "applies to backend: zram only"),
        case("unknown zram fs", one(&okp, "    backend: zram\n    fs: xfs\n"), 7, "mounts[0].fs", "invalid filesystem `xfs`"),
        case("inodes on btrfs", one(&okp, "    backend: zram\n    fs: btrfs\n    inodes: 5000\n"), 8, "mounts[0].inodes", "makes its inodes as it needs them"),
        case("huge pages on zram", one(&okp, "    backend: zram\n    huge: always\n"), 7, "mounts[0].huge", "a zram mount has no huge pages"),
        case("noswap on zram", one(&okp, "    backend: zram\n    noswap: true\n"), 7, "mounts[0].noswap", "never swapped"),
        case("grow on zram", one(&okp, "    backend: zram\n    watchdog: { action: [grow, evict], max_size: 16MiB }\n"), 7, "mounts[0].watchdog.action", "`grow` cannot work on a zram mount"),
        case("memory thresholds on tmpfs", one(&okp, "    watchdog: { memory: { high: 4MiB } }\n"), 6, "mounts[0].watchdog.memory.high", "is a tmpfs, whose RAM is its usage"),
        case("memory threshold above the zram size", one(&okp, "    backend: zram\n    watchdog: { memory: { high: 16MiB } }\n"), 7, "mounts[0].watchdog.memory.high", "above the mount's size 8MiB"),
        case("unknown default backend", format!("defaults:\n  backend: ramfs\n{}", one(&okp, "")), 2, "defaults.backend", "invalid backend `ramfs`"),
        case("over the RAM budget", two(&okp, &ok2.display().to_string(), "").replace("8MiB", "30%"), 8, "mounts[1].size", "exceeds the RAM budget"),
        case("max_total bad", format!("max_total: lots\n{}", one(&okp, "")), 1, "max_total", "invalid size"),
        case("bad name", one(&okp, "").replace("name: cache", "name: Cache"), 3, "mounts[0].name", "invalid mount name `Cache`"),
        case("bad option", one(&okp, "    options: [nosuid, ro]\n"), 6, "mounts[0].options[1]", "read-only"),
        case("unknown option", one(&okp, "    options: [nosuid, bogus]\n"), 6, "mounts[0].options[1]", "unknown mount option `bogus`"),
        case("conflicting atime", one(&okp, "    options: [noatime, relatime]\n"), 6, "mounts[0].options[1]", "conflicts"),
        case("bad huge", one(&okp, "    huge: sometimes\n"), 6, "mounts[0].huge", "invalid huge page policy `sometimes`"),
        case("bad seed", one(&okp, "    seed: clone\n"), 6, "mounts[0].seed", "invalid seed mode"),
        case("bad on_failure", one(&okp, "    on_failure: panic\n"), 6, "mounts[0].on_failure", "invalid failure policy"),
        case("bad persist", one(&okp, "    persist: every 5\n"), 6, "mounts[0].persist", "needs a unit"),
        case("persist too often", one(&okp, "    persist: every 1s\n"), 6, "mounts[0].persist", "more often than every 10s"),
        case("persist without seed", one(&okp, "    persist: on-stop\n    seed: empty\n"), 6, "mounts[0].persist", "empty tree"),
        case("bad before unit", one(&okp, "    before: [nginx]\n"), 6, "mounts[0].before[0]", "invalid systemd unit name `nginx`"),
        case("bad default", format!("version: 1\ndefaults:\n  huge: big\nmounts:\n  - name: cache\n    path: {okp}\n    size: 8MiB\n"), 3, "defaults.huge", "invalid huge"),
        case("version 2", one(&okp, "").replace("version: 1", "version: 2"), 1, "version", "unsupported spec version 2"),
        case("missing size", format!("version: 1\nmounts:\n  - name: cache\n    path: {okp}\n"), 3, "mounts[0].size", "missing field `size`"),
        case("duplicate key", one(&okp, "    size: 9MiB\n"), 6, "mounts[0].size", "duplicate field `size`"),
        case("yaml syntax", one(&okp, "    options: [nosuid, nodev\n"), 6, "mounts[0].options", "unclosed bracket"),
        case("tab indentation", one(&okp, "\tcreate: true\n"), 5, "mounts[0].size", "found a tab"),
        case("threshold without %", one(&okp, "    watchdog: { high: 95 }\n"), 6, "mounts[0].watchdog.high", "% sign is missing"),
        case("low above high", one(&okp, "    watchdog: { low: 96% }\n"), 6, "mounts[0].watchdog.low", "must be below high"),
        case("inode warn above high", one(&okp, "    watchdog:\n      inodes: { warn: 99% }\n"), 7, "mounts[0].watchdog.inodes.warn", "above high"),
        case("unknown action", one(&okp, "    watchdog: { action: [grow, explode] }\n"), 6, "mounts[0].watchdog.action[1]", "invalid action `explode`"),
        case("evict on a persisted mount", one(&okp, "    persist: on-stop\n    watchdog: { action: evict }\n"), 7, "mounts[0].watchdog.action", "`evict` deletes files"),
        case("fallback not last", one(&okp, "    watchdog: { action: [fallback, grow], max_size: 16MiB }\n"), 6, "mounts[0].watchdog.action[0]", "no action can follow"),
        case("grow without max_size", one(&okp, "    watchdog: { action: grow }\n"), 6, "mounts[0].watchdog.action", "needs `max_size`"),
        case("max_size not above size", one(&okp, "    watchdog: { action: grow, max_size: 4MiB }\n"), 6, "mounts[0].watchdog.max_size", "not above the mount's size"),
        case("reoffload too soon", one(&okp, "    watchdog: { action: fallback, reoffload_after: 1s }\n"), 6, "mounts[0].watchdog.reoffload_after", "at least 10s"),
        case("pressure evict on a persisted mount", one(&okp, "    persist: every 1h\n    watchdog: { pressure: [evict, fallback] }\n"), 7, "mounts[0].watchdog.pressure[0]", "is persisted"),
        case("bad priority", one(&okp, "    watchdog: { priority: 500 }\n"), 6, "mounts[0].watchdog.priority", "invalid priority 500"),
        case("unknown watchdog field", one(&okp, "    watchdog: { hihg: 90% }\n"), 6, "mounts[0].watchdog.hihg", "unknown field `hihg`"),
        case("bad default watchdog", format!("version: 1\ndefaults:\n  watchdog: {{ action: explode }}\nmounts:\n  - name: cache\n    path: {okp}\n    size: 8MiB\n"), 3, "defaults.watchdog.action", "invalid action"),
        case("agent interval too short", format!("agent:\n  interval: 10ms\n{}", one(&okp, "")), 2, "agent.interval", "out of range"),
        case("agent metrics relative", format!("agent:\n  metrics: x.prom\n{}", one(&okp, "")), 2, "agent.metrics", "absolute"),
        case("newline in path", one(&format!("\"{okp}/x\\ny\"\n    create: true"), ""), 4, "mounts[0].path", "control character U+000A"),
        case("escape in path", one(&format!("\"{okp}/\\e[2J\"\n    create: true"), ""), 4, "mounts[0].path", "control character U+001B"),
        case("DEL in unit", one(&okp, "    before: [\"a\\x7f.service\"]\n"), 6, "mounts[0].before[0]", "control character U+007F"),
        case("newline in unit", one(&okp, "    before: [\"a.service\\nExecStartPre=/bin/touch /x\"]\n"), 6, "mounts[0].before[0]", "control character"),
        case("unit starting with @", one(&okp, "    before: [\"@x.service\"]\n"), 6, "mounts[0].before[0]", "invalid systemd unit name"),
        case("empty name", one(&okp, "").replace("name: cache", "name: \"\""), 3, "mounts[0].name", "invalid mount name ``"),
        case("empty path", one("\"\"", ""), 4, "mounts[0].path", "is relative"),
        case("path too long", one(&format!("{okp}/{}", "x".repeat(256)), "    create: true\n"), 4, "mounts[0].path", "too long"),
        case("unit name too long", one(&format!("{okp}/{}", "é".repeat(60)), "    create: true\n"), 4, "mounts[0].path", "too long for systemd"),
        case("root's ssh keys", one("/root/.ssh", ""), 4, "mounts[0].path", "SSH"),
        case("a user's ssh keys", one("/home/alice/.ssh", ""), 4, "mounts[0].path", "SSH"),
        case("ssh keys anywhere", one(&format!("{okp}/.ssh/x"), "    create: true\n"), 4, "mounts[0].path", "an SSH directory"),
        case("a home directory", one(&home, ""), 4, "mounts[0].path", "a home directory"),
        case("dpkg", one("/var/lib/dpkg", ""), 4, "mounts[0].path", "system directory (/var/lib/dpkg)"),
        case("dpkg info", one("/var/lib/dpkg/info", ""), 4, "mounts[0].path", "under /var/lib/dpkg"),
        case("apt lists", one("/var/lib/apt/lists", ""), 4, "mounts[0].path", "under /var/lib/apt"),
        case("rpm", one("/var/lib/rpm", ""), 4, "mounts[0].path", "system directory"),
        case("crontabs", one("/var/spool/cron/crontabs", ""), 4, "mounts[0].path", "under /var/spool/cron"),
        case("systemd state", one("/var/lib/systemd/timers", ""), 4, "mounts[0].path", "under /var/lib/systemd"),
        case("boot", one("/boot/efi", ""), 4, "mounts[0].path", "under /boot"),
        case("persist overflow", one(&okp, "    persist: every 106751991167301d\n"), 6, "mounts[0].persist", "at most every 30d"),
        case("reoffload overflow", one(&okp, "    watchdog: { action: fallback, reoffload_after: 99999999999d }\n"), 6, "mounts[0].watchdog.reoffload_after", "at most 30d"),
        case("gid -1", one(&okp, "    group: 4294967295\n"), 6, "mounts[0].group", "gid 4294967295 is out of range"),
        case("uid beyond 32 bits", one(&okp, "    owner: 4294967296\n"), 6, "mounts[0].owner", "uid 4294967296 is out of range"),
        case("size beyond the bound", format!("max_total: 1024TiB\n{}", one(&okp, "").replace("8MiB", "2000TiB")), 6, "mounts[0].size", "larger than 1024TiB"),
        case("percentage of nothing", one(&okp, "").replace("8MiB", "0.000000000001%"), 5, "mounts[0].size", "unlimited"),
        case("inodes beyond the bound", one(&okp, "    inodes: 99999g\n"), 6, "mounts[0].inodes", "larger than 1024g"),
        case("priority out of range", one(&okp, "    watchdog: { priority: 99999999999999999999999 }\n"), 6, "mounts[0].watchdog.priority", "out of range"),
        case("mount is not a mapping", "version: 1\nmounts:\n  - cache\n".into(), 3, "mounts[0]", "expected a mapping"),
        case("mounts is not a list", "version: 1\nmounts: {a: 1}\n".into(), 2, "mounts", "expected a list of mounts"),
        case("document is a list", "- 1\n".into(), 1, "(document)", "expected a mapping with `version` and `mounts`"),
        case("empty document", "".into(), 1, "(document)", "expected a mapping"),
        case("no mounts field", "version: 1\n".into(), 1, "mounts", "missing field `mounts`"),
        case("deeply nested", format!("version: 1\nmounts: {}{}\n", "[".repeat(300), "]".repeat(300)), 2, "mounts", "too deeply nested"),
        case("nested a little too deep", "version: 1\nmounts: [[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]\n".into(), 2, "mounts", "too deeply nested"),
        case("two documents", format!("{}---\n{}", one(&okp, ""), one(&okp, "")), 7, "version", "a second YAML document"),
        case("own boot unit as consumer", one(&okp, "    before: [tmpfsctl-apply.service]\n"), 6, "mounts[0].before[0]", "cycle"),
        case("local-fs.target as consumer", one(&okp, "    before: [local-fs.target]\n"), 6, "mounts[0].before[0]", "cycle"),
        case("metrics over a system file", format!("agent:\n  metrics: /etc/passwd\n{}", one(&okp, "")), 2, "agent.metrics", "not a .prom file"),
        case("agent unknown field", format!("agent:\n  intervall: 1s\n{}", one(&okp, "")), 2, "agent.intervall", "unknown field `intervall`"),
        case("unknown defaults field", format!("version: 1\ndefaults:\n  sise: 1MiB\nmounts:\n  - name: cache\n    path: {okp}\n    size: 8MiB\n"), 3, "defaults.sise", "unknown field `sise`"),
        case("unknown default watchdog field", format!("version: 1\ndefaults:\n  watchdog: {{ hihg: 90% }}\nmounts:\n  - name: cache\n    path: {okp}\n    size: 8MiB\n"), 3, "defaults.watchdog.hihg", "unknown field `hihg`"),
        case("unknown inodes field", one(&okp, "    watchdog:\n      inodes: { hihg: 90% }\n"), 7, "mounts[0].watchdog.inodes.hihg", "unknown field `hihg`"),
        case("unknown default inodes field", format!("version: 1\ndefaults:\n  watchdog:\n    inodes: {{ hihg: 90% }}\nmounts:\n  - name: cache\n    path: {okp}\n    size: 8MiB\n"), 4, "defaults.watchdog.inodes.hihg", "unknown field `hihg`"),
    ];
    assert!(cases.len() >= 20);

    let mut failures = Vec::new();
    for c in &cases {
        let spec = sb.write_spec("bad.yaml", &c.yaml);
        for cmd in ["validate", "apply", "plan"] {
            let r = sb.run([cmd.as_ref(), spec.as_os_str()]);
            let loc = format!("{}:{}:", spec.display(), c.line);
            let ok = r.code == Some(2)
                && r.stderr.contains(&loc)
                && r.stderr.contains(&format!("field: {}", c.field))
                && r.stderr.contains(c.message)
                && r.stdout.is_empty();
            if !ok {
                failures.push(format!(
                    "case `{}` ({cmd}): want line {} field {} message {:?}\n--- spec\n{}{r}",
                    c.name, c.line, c.field, c.message, c.yaml
                ));
            }
        }
        assert!(
            sb.mounts().is_empty(),
            "case `{}` changed the mount table",
            c.name
        );
        assert!(
            !sb.state.exists(),
            "case `{}` created the state directory",
            c.name
        );
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn unreadable_spec_and_bad_usage_exit_2() {
    let sb = Sandbox::new();
    sb.run(["validate", "/nonexistent/spec.yaml"])
        .code(2)
        .stderr_has("cannot read spec /nonexistent/spec.yaml");
    sb.run(["apply"]).code(2).stderr_has("SPEC");
    sb.run(["frobnicate"])
        .code(2)
        .stderr_has("unrecognized subcommand");
    let spec = sb.write_spec("s.yaml", "version: 1\nmounts: []\n");
    sb.run([
        "plan".as_ref(),
        spec.as_os_str(),
        "--format".as_ref(),
        "xml".as_ref(),
    ])
    .code(2)
    .stderr_has("possible values");
}

#[test]
fn all_problems_are_reported_at_once() {
    let sb = Sandbox::new();
    let spec = sb.write_spec(
        "multi.yaml",
        "version: 1\nmounts:\n  - name: A\n    path: rel\n    size: 1parsec\n",
    );
    let r = sb.run(["validate".as_ref(), spec.as_os_str()]);
    r.code(2)
        .stderr_has("3 errors")
        .stderr_has(":3:")
        .stderr_has(":4:")
        .stderr_has(":5:")
        .stderr_has("nothing was changed");
}

/// The inputs that once passed `validate` and then broke a command (an agent
/// panic, a bare EINVAL, directives injected into a unit) are refused by
/// every command that reads a spec, before it changes anything.
#[test]
fn values_that_broke_commands_are_refused_by_every_command() {
    let sb = Sandbox::new();
    let ok = sb.cache_dir("cache", 0, 0, 0o755).display().to_string();
    let root = sb.path("root");
    let cases = [
        (
            one(&ok, "    persist: every 106751991167301d\n"),
            "mounts[0].persist",
        ),
        (one(&ok, "    group: 4294967295\n"), "mounts[0].group"),
        (
            one(
                &format!("\"{ok}/x\\n[Service]\\nExecStartPre=/bin/touch /owned\""),
                "    create: true\n    before: [nginx.service]\n",
            ),
            "mounts[0].path",
        ),
    ];
    for (yaml, field) in cases {
        let spec = sb.write_spec("s.yaml", &yaml);
        for cmd in [
            &["validate"][..],
            &["plan"],
            &["apply"],
            &["agent"],
            &["status"],
            &["sync"],
            &["down"],
            &["boot", "install", "--root", root.to_str().unwrap()],
        ] {
            // An agent that accepted the spec would run on: bounded.
            let mut c = std::process::Command::new("timeout");
            c.args(["60", env!("CARGO_BIN_EXE_tmpfsctl")])
                .env("TMPFSCTL_STATE_DIR", &sb.state)
                .env_remove("TMPFSCTL_FAILPOINT");
            let mut args: Vec<&std::ffi::OsStr> = vec![cmd[0].as_ref()];
            args.extend(cmd[1..].iter().map(|a| std::ffi::OsStr::new(*a)));
            args.insert(if cmd[0] == "boot" { 2 } else { 1 }, spec.as_os_str());
            sb.run_with(c, args)
                .code(2)
                .stderr_has(&format!("field: {field}"));
        }
        assert!(sb.mounts().is_empty(), "{field}: the mount table changed");
        assert!(!sb.state.exists(), "{field}: the state directory was created");
        assert!(!root.exists(), "{field}: boot install wrote files");
        assert!(!Path::new("/owned").exists());
    }
}

/// One directory reached by two paths (a bind mount) is one directory: two
/// tmpfs over it would hide each other.
#[test]
fn the_same_directory_by_two_paths_is_refused() {
    let sb = Sandbox::new();
    let dir = sb.cache_dir("dir", 0, 0, 0o755);
    let alias = sb.cache_dir("alias", 0, 0, 0o755);
    let status = std::process::Command::new("mount")
        .arg("--bind")
        .arg(&dir)
        .arg(&alias)
        .status()
        .unwrap();
    assert!(status.success());
    let spec = sb.write_spec(
        "s.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: a\n    path: {}\n    size: 1MiB\n  - name: b\n    path: {}\n    size: 1MiB\n",
            dir.display(),
            alias.display()
        ),
    );
    sb.run(["validate".as_ref(), spec.as_os_str()])
        .code(2)
        .stderr_has(":7:")
        .stderr_has("field: mounts[1].path")
        .stderr_has("is the same directory as mounts[0]");
}
