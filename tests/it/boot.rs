//! Boot artifacts: golden files for every mode (run with TMPFSCTL_BLESS=1 to
//! rewrite them after an intended change; refused under CI), idempotence, clean removal, and
//! the real systemd tools' verdicts on what is written.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{self, Sandbox};

const SPEC_PATH: &str = "/etc/tmpfsctl/cache.yaml";
const BINARY: &str = "/usr/bin/tmpfsctl";

/// `boot install --root` checks the spec in the root: the directories a
/// test manages on this host (where the installed units or script run) are
/// made in the root too.
fn mirror(root: &Path, dirs: &[&Path]) {
    for d in dirs {
        fs::create_dir_all(root.join(d.strip_prefix("/").unwrap())).unwrap();
    }
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn install(sb: &Sandbox, root: &Path, mode: &str) -> common::Run {
    let spec = golden_dir().join("spec.yaml");
    sb.run([
        "boot".as_ref(),
        "install".as_ref(),
        spec.as_os_str(),
        "--mode".as_ref(),
        mode.as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
        "--binary".as_ref(),
        BINARY.as_ref(),
        "--spec-path".as_ref(),
        SPEC_PATH.as_ref(),
    ])
}

/// Every file and symlink under `root`: path → content or `-> target`.
fn tree(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                out.insert(rel, format!("-> {}", fs::read_link(&p).unwrap().display()));
            } else if ft.is_dir() {
                out.insert(rel.join(""), "(dir)".into());
                stack.push(p);
            } else {
                out.insert(rel, fs::read_to_string(&p).unwrap());
            }
        }
    }
    out
}

/// Compares `root` with tests/golden/<name>/ (manifest excluded), or writes
/// the golden tree when TMPFSCTL_BLESS is set.
fn assert_golden(root: &Path, name: &str, skip: &[&str]) {
    let golden = golden_dir().join(name);
    let got: BTreeMap<PathBuf, String> = tree(root)
        .into_iter()
        .filter(|(p, _)| !skip.iter().any(|s| p.starts_with(s)))
        .collect();
    if common::ci::blessing() {
        let _ = fs::remove_dir_all(&golden);
        for (p, content) in &got {
            let dst = golden.join(p);
            if content == "(dir)" {
                fs::create_dir_all(&dst).unwrap();
            } else if let Some(t) = content.strip_prefix("-> ") {
                fs::create_dir_all(dst.parent().unwrap()).unwrap();
                std::os::unix::fs::symlink(t, &dst).unwrap();
            } else {
                fs::create_dir_all(dst.parent().unwrap()).unwrap();
                fs::write(&dst, content).unwrap();
            }
        }
        return;
    }
    let want = tree(&golden);
    for (p, w) in &want {
        let g = got
            .get(p)
            .unwrap_or_else(|| panic!("missing {} (golden {name})", p.display()));
        assert_eq!(g, w, "{} differs from tests/golden/{name}", p.display());
    }
    let extra: Vec<_> = got.keys().filter(|p| !want.contains_key(*p)).collect();
    assert!(extra.is_empty(), "unexpected files: {extra:?}");
}

#[test]
fn systemd_mode_matches_golden_and_is_idempotent() {
    let sb = Sandbox::new();
    let root = sb.path("root");
    install(&sb, &root, "systemd").code(0).stdout_has("changed: yes");
    assert_golden(&root, "systemd", &["etc/tmpfsctl"]);
    install(&sb, &root, "systemd").code(0).stdout_has("changed: no");
    sb.run([
        "boot".as_ref(),
        "remove".as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
    ])
    .code(0);
    let left: Vec<_> = tree(&root).into_iter().filter(|(_, c)| c != "(dir)").collect();
    assert!(left.is_empty(), "remove left files: {left:?}");
}

#[test]
fn sysv_mode_matches_golden() {
    let sb = Sandbox::new();
    let root = sb.path("root");
    install(&sb, &root, "sysv").code(0);
    assert_golden(&root, "sysv", &["etc/tmpfsctl"]);
    let out = Command::new("sh")
        .arg("-n")
        .arg(root.join("etc/init.d/tmpfsctl"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sh -n: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn fstab_mode_edits_only_its_block_atomically_with_a_backup() {
    let sb = Sandbox::new();
    let root = sb.path("root");
    fs::create_dir_all(root.join("etc")).unwrap();
    let orig = fs::read(golden_dir().join("fstab.orig")).unwrap();
    fs::write(root.join("etc/fstab"), &orig).unwrap();
    install(&sb, &root, "fstab").code(0).stdout_has("cannot seed");
    let got = fs::read_to_string(root.join("etc/fstab")).unwrap();
    let want_path = golden_dir().join("fstab.expected");
    if common::ci::blessing() {
        fs::write(&want_path, &got).unwrap();
    }
    assert_eq!(got, fs::read_to_string(&want_path).unwrap());
    assert!(
        got.as_bytes().starts_with(&orig),
        "the lines before the block are byte-identical"
    );
    assert_eq!(
        fs::read(root.join("etc/fstab.tmpfsctl~")).unwrap(),
        orig,
        "backup of the previous fstab"
    );
    install(&sb, &root, "fstab").code(0).stdout_has("changed: no");
    sb.run([
        "boot".as_ref(),
        "remove".as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
    ])
    .code(0);
    assert_eq!(
        fs::read(root.join("etc/fstab")).unwrap(),
        orig,
        "remove restores fstab byte for byte"
    );
}

#[test]
fn switching_modes_removes_the_other_modes_artifacts() {
    let sb = Sandbox::new();
    let root = sb.path("root");
    install(&sb, &root, "systemd").code(0);
    install(&sb, &root, "sysv").code(0).stdout_has("removed");
    assert!(!root.join("etc/systemd/system/tmpfsctl-apply.service").exists());
    assert!(root.join("etc/init.d/tmpfsctl").exists());
}

#[test]
fn unit_names_match_the_real_systemd_escape() {
    let paths = [
        "/var/cache/nginx",
        "/srv/my-app/cache dir",
        "/srv/café/x",
        "/srv/.hidden/a_b:c",
        "/a//b/",
        "/",
    ];
    for p in paths {
        let out = Command::new("systemd-escape")
            .arg("--path")
            .arg(p)
            .output()
            .expect("systemd-escape");
        let want = String::from_utf8(out.stdout).unwrap().trim_end().to_string();
        assert_eq!(
            tmpfsctl::boot::escape::unit_name_of_path(Path::new(p)),
            want,
            "{p}"
        );
    }
}

#[test]
fn systemd_analyze_verify_accepts_the_units() {
    let sb = Sandbox::new();
    let root = sb.path("root");
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    fs::copy(env!("CARGO_BIN_EXE_tmpfsctl"), root.join("usr/bin/tmpfsctl")).unwrap();
    install(&sb, &root, "systemd").code(0);
    // The distribution's units (sysinit.target, local-fs.target, ...).
    fs::create_dir_all(root.join("usr/lib/systemd")).unwrap();
    let cp = Command::new("cp")
        .arg("-a")
        .arg("/lib/systemd/system")
        .arg(root.join("usr/lib/systemd/"))
        .status()
        .unwrap();
    assert!(cp.success());
    // Stand-ins for the consumers the drop-ins extend.
    for c in ["nginx.service", "php8.2-fpm.service"] {
        fs::write(
            root.join("etc/systemd/system").join(c),
            "[Service]\nExecStart=/usr/bin/tmpfsctl --version\n",
        )
        .unwrap();
    }
    add_system_binaries(&root);
    verify(
        &root,
        &[
            "tmpfsctl-apply.service",
            "tmpfsctl-down.service",
            "tmpfsctl-agent.service",
            "nginx.service",
            "php8.2-fpm.service",
        ],
    );

    // The packaged units in systemd/, where a package installs them.
    let pkg = sb.path("pkg");
    fs::create_dir_all(pkg.join("usr/bin")).unwrap();
    fs::create_dir_all(pkg.join("usr/lib/systemd")).unwrap();
    fs::copy(env!("CARGO_BIN_EXE_tmpfsctl"), pkg.join("usr/bin/tmpfsctl")).unwrap();
    let cp = Command::new("cp")
        .arg("-a")
        .arg("/lib/systemd/system")
        .arg(pkg.join("usr/lib/systemd/"))
        .status()
        .unwrap();
    assert!(cp.success());
    let units = [
        "tmpfsctl-apply.service",
        "tmpfsctl-down.service",
        "tmpfsctl-agent.service",
    ];
    for unit in units {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd").join(unit);
        fs::copy(src, pkg.join("usr/lib/systemd/system").join(unit)).unwrap();
    }
    add_system_binaries(&pkg);
    verify(&pkg, &units);
}

/// What the units execute besides tmpfsctl, as a merged-/usr system has it.
fn add_system_binaries(root: &Path) {
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    fs::copy("/bin/kill", root.join("usr/bin/kill")).unwrap();
    std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
}

/// Stdout and stderr of a finished command, together.
fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `systemd-analyze verify` exits 0 and prints nothing (it reports unknown
/// keys without failing, so both are checked).
fn verify(root: &Path, units: &[&str]) {
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", root.display()))
        .args(units)
        .output()
        .unwrap();
    let text = output_text(&out);
    assert!(
        out.status.success() && text.trim().is_empty(),
        "systemd-analyze verify {units:?}:\n{text}"
    );
}

#[test]
fn fstab_lines_pass_findmnt_verify_and_the_fstab_generator() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("srv/my cache-dir", 0, 0, 0o750);
    let spec = sb.write_spec(
        "spec.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: web\n    path: {}\n    size: 16MiB\n    owner: root\n    group: root\n    mode: \"0750\"\n    before: [nginx.service]\n",
            cache.display()
        ),
    );
    let root = sb.path("root");
    fs::create_dir_all(root.join("etc")).unwrap();
    mirror(&root, &[&cache]);
    common::root_only_users(&root);
    sb.run([
        "boot".as_ref(),
        "install".as_ref(),
        spec.as_os_str(),
        "--mode".as_ref(),
        "fstab".as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
    ])
    .code(0);
    let fstab = root.join("etc/fstab");
    let out = Command::new("findmnt")
        .arg("--verify")
        .arg("--tab-file")
        .arg(&fstab)
        .output()
        .unwrap();
    assert!(out.status.success(), "findmnt --verify:\n{}", output_text(&out));

    let gen_out = sb.path("gen");
    fs::create_dir_all(&gen_out).unwrap();
    let out = Command::new("/lib/systemd/system-generators/systemd-fstab-generator")
        .args([&gen_out, &gen_out, &gen_out])
        .env("SYSTEMD_FSTAB", &fstab)
        .env("SYSTEMD_LOG_LEVEL", "notice")
        .env("SYSTEMD_PROC_CMDLINE", "")
        .output()
        .unwrap();
    let text = output_text(&out);
    assert!(
        out.status.success() && text.trim().is_empty(),
        "generator said:\n{text}"
    );
    let unit = gen_out.join(tmpfsctl::boot::escape::mount_unit(&cache));
    let body = fs::read_to_string(&unit).unwrap_or_else(|e| panic!("{}: {e}", unit.display()));
    assert!(
        body.contains("What=tmpfsctl-web") && body.contains("Type=tmpfsctl"),
        "{body}"
    );
    assert!(body.contains("Before=nginx.service"), "{body}");
}

#[test]
fn sysv_script_starts_reports_and_stops_with_lsb_codes() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o750);
    fs::write(cache.join("seeded"), "disk").unwrap();
    let spec = sb.write_spec(
        "spec.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: app\n    path: {}\n    size: 8MiB\n",
            cache.display()
        ),
    );
    let root = sb.path("root");
    mirror(&root, &[&cache]);
    sb.run([
        "boot".as_ref(),
        "install".as_ref(),
        spec.as_os_str(),
        "--mode".as_ref(),
        "sysv".as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
        "--binary".as_ref(),
        env!("CARGO_BIN_EXE_tmpfsctl").as_ref(),
    ])
    .code(0);
    let script = root.join("etc/init.d/tmpfsctl");
    let rc = |action: &str| {
        let out = Command::new("sh")
            .arg(&script)
            .arg(action)
            .env("TMPFSCTL_STATE_DIR", &sb.state)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(rc("status").0, 3, "not running before start");
    let (code, out) = rc("start");
    assert_eq!(code, 0, "{out}");
    assert_eq!(sb.top(&cache).unwrap().source, "tmpfsctl-app");
    assert_eq!(rc("status").0, 0);
    let (code, out) = rc("stop");
    assert_eq!(code, 0, "{out}");
    assert!(sb.top(&cache).is_none());
    assert_eq!(rc("status").0, 3);
}

/// Directory names that mean something to a unit file, a shell or systemd's
/// specifier and variable expansion, each the parent of one managed path.
const HOSTILE_DIRS: &[&str] = &[
    "sp ace  two",
    "q\"uote",
    "s'ingle'",
    "back\\slash",
    "trail\\",
    "lit\\x2dral",
    "per%cent%n%%",
    "dol$lar${HOME}$$",
    "semi;colon",
    ";",
    "#hash",
    "-dash",
    ".dot",
    "café 日本",
    "a=b,c",
];

/// `systemd-escape ARGS… VALUE`, trimmed.
fn systemd_escape(args: &[&str], value: &str) -> String {
    let out = Command::new("systemd-escape")
        .args(args)
        .arg("--")
        .arg(value)
        .output()
        .expect("systemd-escape");
    assert!(
        out.status.success(),
        "systemd-escape {args:?} {value:?}: {}",
        output_text(&out)
    );
    String::from_utf8(out.stdout).unwrap().trim_end().to_string()
}

/// YAML double-quoted form of `s`.
fn yaml_quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

#[test]
fn hostile_strings_round_trip_through_the_units() {
    let sb = Sandbox::new();
    let base = sb.path("m");
    let managed: Vec<PathBuf> = HOSTILE_DIRS.iter().map(|d| base.join(d).join("c")).collect();
    // Valid unit names that still need care: an escape sequence, an instance
    // of a template with one, a template itself. (Not a colon, although valid:
    // `systemd-analyze verify` cannot load a unit file named with one.)
    let consumers = [
        "my\\x2dapp.service",
        "tpl@a\\x20b.service",
        "tpl@.service",
        "web.target",
    ];
    let mut yaml = String::from("version: 1\nmounts:\n");
    for (i, p) in managed.iter().enumerate() {
        yaml.push_str(&format!(
            "  - name: m{i}\n    path: {}\n    size: 1MiB\n    create: true\n    before: [{}]\n",
            yaml_quoted(&p.display().to_string()),
            yaml_quoted(consumers[i % consumers.len()])
        ));
    }
    let spec = sb.write_spec("spec.yaml", &yaml);
    let spec_path = "/etc/tmpfsctl/my \"spec\" 'x' %n %% $HOME ${X} \\ ;.yaml";
    let binary = "/opt/t mp/%n%%/$HOME;x/é/tmpfsctl";
    let root = sb.path("root");
    sb.run([
        "boot".as_ref(),
        "install".as_ref(),
        spec.as_os_str(),
        "--root".as_ref(),
        root.as_os_str(),
        "--binary".as_ref(),
        binary.as_ref(),
        "--spec-path".as_ref(),
        spec_path.as_ref(),
    ])
    .code(0);

    // Our unit names are systemd's, both ways.
    for p in &managed {
        let text = p.display().to_string();
        let ours = tmpfsctl::boot::escape::mount_unit(p);
        assert_eq!(
            ours,
            systemd_escape(&["--path", "--suffix=mount"], &text),
            "{text}"
        );
        let name = tmpfsctl::boot::escape::unit_name_of_path(p);
        assert_eq!(systemd_escape(&["--unescape", "--path"], &name), text, "{name}");
    }

    fs::create_dir_all(root.join("usr/lib/systemd")).unwrap();
    let cp = Command::new("cp")
        .arg("-a")
        .arg("/lib/systemd/system")
        .arg(root.join("usr/lib/systemd/"))
        .status()
        .unwrap();
    assert!(cp.success());
    add_system_binaries(&root);
    // systemd checks that an Exec*= executable exists: it finds this copy only
    // when it read the path back exactly.
    let bin_in_root = root.join(binary.trim_start_matches('/'));
    fs::create_dir_all(bin_in_root.parent().unwrap()).unwrap();
    fs::copy(env!("CARGO_BIN_EXE_tmpfsctl"), &bin_in_root).unwrap();
    let unit_dir = root.join("etc/systemd/system");
    for c in consumers {
        let body = if c.ends_with(".target") {
            "[Unit]\nDescription=stand-in\n"
        } else {
            "[Service]\nExecStart=/usr/bin/kill -0 1\n"
        };
        fs::write(unit_dir.join(c), body).unwrap();
    }
    // A mount unit for every path `RequiresMountsFor=` names (parent in the
    // tmpfsctl units, the path itself in the drop-ins), with a wrong Where=:
    // systemd loads it, and says so, only when it read the path back exactly.
    let mut want = std::collections::BTreeSet::new();
    for p in &managed {
        for q in [p.as_path(), p.parent().unwrap()] {
            let unit = tmpfsctl::boot::escape::mount_unit(q);
            fs::write(
                unit_dir.join(&unit),
                "[Mount]\nWhat=tmpfs\nWhere=/nowhere\nType=tmpfs\n",
            )
            .unwrap();
            want.insert(format!(
                "{unit}: Where= setting doesn't match unit name. Refusing."
            ));
        }
    }
    let mut units = vec![
        "tmpfsctl-apply.service",
        "tmpfsctl-down.service",
        "tmpfsctl-agent.service",
    ];
    units.extend(consumers);
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", root.display()))
        .args(&units)
        .output()
        .unwrap();
    let text = output_text(&out);
    let got: std::collections::BTreeSet<String> = text.lines().map(str::to_string).collect();
    assert_eq!(got, want, "systemd-analyze verify {units:?}:\n{text}");

    // One line per setting: nothing from the spec or the command line began a
    // line of its own.
    for c in consumers {
        let dropin = fs::read_to_string(unit_dir.join(format!("{c}.d/50-tmpfsctl.conf"))).unwrap();
        let ours = dropin
            .lines()
            .filter(|l| l.starts_with("RequiresMountsFor="))
            .count();
        let want = managed
            .iter()
            .enumerate()
            .filter(|(i, _)| consumers[i % consumers.len()] == c)
            .count();
        assert_eq!(ours, want, "{c}:\n{dropin}");
        assert_eq!(dropin.lines().count(), 4 + want, "{c}:\n{dropin}");
    }
}

/// fstab mode escapes by fstab's rules: the real libmount and fstab
/// generator read back every hostile path (the generator names each mount
/// unit after the path it read).
#[test]
fn hostile_paths_round_trip_through_fstab() {
    let sb = Sandbox::new();
    // Existing directories: findmnt checks that each target is there.
    let managed: Vec<PathBuf> = HOSTILE_DIRS
        .iter()
        .map(|d| sb.cache_dir(&format!("m/{d}"), 0, 0, 0o755))
        .collect();
    let mut yaml = String::from("version: 1\nmounts:\n");
    for (i, p) in managed.iter().enumerate() {
        yaml.push_str(&format!(
            "  - name: m{i}\n    path: {}\n    size: 1MiB\n    owner: root\n    group: root\n    mode: \"0755\"\n    before: [\"my\\\\x2dapp.service\", \"tpl@a.service\"]\n",
            yaml_quoted(&p.display().to_string())
        ));
    }
    let spec = sb.write_spec("spec.yaml", &yaml);
    let root = sb.path("root");
    fs::create_dir_all(root.join("etc")).unwrap();
    mirror(&root, &managed.iter().map(PathBuf::as_path).collect::<Vec<_>>());
    common::root_only_users(&root);
    sb.run([
        "boot".as_ref(),
        "install".as_ref(),
        spec.as_os_str(),
        "--mode".as_ref(),
        "fstab".as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
        "--spec-path".as_ref(),
        "/etc/tmpfsctl/a #b.yaml".as_ref(),
    ])
    .code(0);
    let fstab = root.join("etc/fstab");
    let out = Command::new("findmnt")
        .arg("--verify")
        .arg("--tab-file")
        .arg(&fstab)
        .output()
        .unwrap();
    assert!(out.status.success(), "findmnt --verify:\n{}", output_text(&out));
    let gen_out = sb.path("gen");
    fs::create_dir_all(&gen_out).unwrap();
    let out = Command::new("/lib/systemd/system-generators/systemd-fstab-generator")
        .args([&gen_out, &gen_out, &gen_out])
        .env("SYSTEMD_FSTAB", &fstab)
        .env("SYSTEMD_LOG_LEVEL", "notice")
        .env("SYSTEMD_PROC_CMDLINE", "")
        .output()
        .unwrap();
    let text = output_text(&out);
    assert!(
        out.status.success() && text.trim().is_empty(),
        "generator said:\n{text}"
    );
    mount_all_through_the_helper(&sb, &fstab);
    for (i, p) in managed.iter().enumerate() {
        let top = sb
            .top(p)
            .unwrap_or_else(|| panic!("nothing mounted at {}", p.display()));
        assert_eq!(
            (top.fstype.as_str(), top.source.as_str()),
            ("tmpfs", format!("tmpfsctl-m{i}").as_str())
        );
    }
    for p in &managed {
        let unit = systemd_escape(&["--path", "--suffix=mount"], &p.display().to_string());
        let body = fs::read_to_string(gen_out.join(&unit)).unwrap_or_else(|e| panic!("{unit}: {e}"));
        assert!(body.contains("Type=tmpfsctl"), "{unit}:\n{body}");
        assert!(
            body.contains("Before=my\\x2dapp.service tpl@a.service\n"),
            "{unit}:\n{body}"
        );
    }
}

/// `mount -a` of `fstab` by the real mount(8), which runs `mount.tmpfsctl`.
fn mount_all_through_the_helper(sb: &Sandbox, fstab: &Path) {
    provide_mount_helper(sb);
    let out = Command::new("mount")
        .args(["-a", "-T"])
        .arg(fstab)
        .output()
        .unwrap();
    assert!(out.status.success(), "mount -a:\n{}", output_text(&out));
}

/// mount(8) runs helpers from /sbin only. In this thread's private
/// namespace an overlay on /usr/sbin (/sbin links there) adds
/// `mount.tmpfsctl`, the built binary, as the packages install it.
fn provide_mount_helper(sb: &Sandbox) {
    let (upper, work) = (sb.path("sbin-upper"), sb.path("sbin-work"));
    fs::create_dir_all(&upper).unwrap();
    fs::create_dir_all(&work).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tmpfsctl"), upper.join("mount.tmpfsctl")).unwrap();
    let data = format!(
        "lowerdir=/usr/sbin,upperdir={},workdir={}",
        upper.display(),
        work.display()
    );
    nix::mount::mount(
        Some("overlay"),
        "/usr/sbin",
        Some("overlay"),
        nix::mount::MsFlags::empty(),
        Some(data.as_str()),
    )
    .expect("overlay on /usr/sbin in the test's namespace");
    assert!(
        Path::new("/sbin/mount.tmpfsctl").exists(),
        "/sbin is not /usr/sbin here"
    );
}

/// fstab mode fixes nothing about the root at install time: mount(8) runs
/// the helper at boot, which reads the directory's owner and mode then.
#[test]
fn fstab_mode_takes_the_owner_and_mode_at_mount_time() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 1234, 2345, 0o750);
    let fresh = sb.path("fresh/dir");
    let spec = sb.write_spec(
        "spec.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: c\n    path: {}\n    size: 4MiB\n  - name: f\n    path: {}\n    size: 4MiB\n    create: true\n    mode: \"0700\"\n",
            cache.display(),
            fresh.display()
        ),
    );
    let root = sb.path("root");
    mirror(&root, &[&cache]);
    let install = || {
        sb.run([
            "boot".as_ref(),
            "install".as_ref(),
            spec.as_os_str(),
            "--mode".as_ref(),
            "fstab".as_ref(),
            "--root".as_ref(),
            root.as_os_str(),
        ])
    };
    install().code(0);
    let fstab = root.join("etc/fstab");
    let text = fs::read_to_string(&fstab).unwrap();
    assert!(!text.contains("uid=") && !text.contains("gid="), "{text}");
    assert_eq!(
        fs::read_link(root.join("sbin/mount.tmpfsctl")).unwrap(),
        Path::new(env!("CARGO_BIN_EXE_tmpfsctl")),
        "install links the helper where the root has none"
    );

    // The operator changes the directory after the install.
    std::os::unix::fs::chown(&cache, Some(4321), Some(5432)).unwrap();
    fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o2770)).unwrap();
    mount_all_through_the_helper(&sb, &fstab);
    let top = sb.top(&cache).expect("the cache is mounted");
    assert_eq!(
        (top.fstype.as_str(), top.source.as_str()),
        ("tmpfs", "tmpfsctl-c")
    );
    assert_eq!(common::owner_of(&cache), (4321, 5432));
    assert_eq!(common::mode_of(&cache), 0o2770);
    let top = sb
        .top(&fresh)
        .expect("the missing directory was made and mounted");
    assert_eq!(top.source, "tmpfsctl-f");
    assert_eq!(
        (common::owner_of(&fresh), common::mode_of(&fresh)),
        ((0, 0), 0o700)
    );

    // A remount through mount(8) keeps the root as the boot made it.
    let out = Command::new("mount")
        .args(["-T"])
        .arg(&fstab)
        .args(["-o", "remount,size=8m"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "remount:\n{}", output_text(&out));
    let opts = sb.top(&cache).unwrap().super_options;
    assert!(
        opts.iter().any(|o| o == "size=8192k") && opts.iter().any(|o| o == "uid=4321"),
        "{opts:?}"
    );

    sb.run([
        "boot".as_ref(),
        "remove".as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
    ])
    .code(0);
    assert!(
        fs::symlink_metadata(root.join("sbin/mount.tmpfsctl")).is_err(),
        "remove takes the link away"
    );

    // A helper the root already has (the package's) is neither replaced nor removed.
    fs::write(root.join("sbin/mount.tmpfsctl"), "#!/bin/sh\n").unwrap();
    install().code(0);
    sb.run([
        "boot".as_ref(),
        "remove".as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
    ])
    .code(0);
    assert_eq!(
        fs::read_to_string(root.join("sbin/mount.tmpfsctl")).unwrap(),
        "#!/bin/sh\n"
    );
}

#[test]
fn boot_install_refuses_what_a_unit_file_cannot_hold() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = sb.write_spec(
        "spec.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: c\n    path: {}\n    size: 1MiB\n    before: [nginx.service]\n",
            cache.display()
        ),
    );
    let root = sb.path("root");
    mirror(&root, &[&cache]);
    let install = |extra: &[&std::ffi::OsStr]| {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "boot".as_ref(),
            "install".as_ref(),
            spec.as_os_str(),
            "--root".as_ref(),
            root.as_os_str(),
        ];
        args.extend_from_slice(extra);
        sb.run(args)
    };
    use std::os::unix::ffi::OsStrExt;
    let not_utf8 = std::ffi::OsStr::from_bytes(b"/etc/tmpfsctl/\xff.yaml");
    for (flag, value, says) in [
        (
            "--spec-path",
            std::ffi::OsStr::new("/etc/x\n[Service]\nExecStartPre=/bin/touch /owned\n.yaml"),
            "control character U+000A",
        ),
        (
            "--spec-path",
            std::ffi::OsStr::new("etc/cache.yaml"),
            "not an absolute path",
        ),
        ("--spec-path", not_utf8, "not UTF-8"),
        (
            "--binary",
            std::ffi::OsStr::new("/usr/bin/tmpfs\"ctl"),
            "quotes or backslashes",
        ),
        (
            "--binary",
            std::ffi::OsStr::new("/usr/bin/tmpfs\\ctl"),
            "quotes or backslashes",
        ),
        (
            "--binary",
            std::ffi::OsStr::new("/usr/bin/\u{1b}[2Jtmpfsctl"),
            "control character U+001B",
        ),
        (
            "--timeout",
            std::ffi::OsStr::new("15min\nExecStartPre=/bin/touch /owned"),
            "--timeout",
        ),
        (
            "--timeout",
            std::ffi::OsStr::new("15 parsecs"),
            "unknown unit `parsecs`",
        ),
        ("--timeout", std::ffi::OsStr::new(""), "empty"),
    ] {
        let r = install(&[flag.as_ref(), value]);
        r.code(2).stderr_has(says);
        assert!(!r.stderr.contains('\u{1b}'), "{r}");
        assert!(!root.join("etc").exists(), "{flag} {value:?} wrote files");
    }
    // What is accepted is what systemd accepts; a stop timeout past the 30
    // minutes a shutdown may take, as systemd reads it, is noted.
    for t in [
        "15min", "1h 30min", "1.5h", "900", "infinity", "2d3h", "500ms", "30min", "30min 1s",
    ] {
        let r = install(&["--timeout".as_ref(), t.as_ref()]);
        r.code(0);
        let out = Command::new("systemd-analyze")
            .args(["timespan", t])
            .output()
            .unwrap();
        let text = output_text(&out);
        assert!(out.status.success(), "systemd-analyze timespan {t}: {text}");
        let usec: Option<u64> = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("μs:"))
            .and_then(|v| v.trim().parse().ok());
        let past = usec.is_none_or(|u| u > 30 * 60 * 1_000_000);
        assert_eq!(
            r.stdout.contains("force the reboot or power-off after 30min"),
            past,
            "{t} ({usec:?} us): {r}"
        );
    }
}

/// A user owning a directory above a managed path puts a symlink to a root-owned
/// directory in its place before a boot. mount(8) resolves it before it runs the
/// helper, which finds the path it was passed is not the one its fstab line names
/// and mounts nothing. Before, a tmpfs (the user's, with `owner:`) covered the
/// root-owned directory (a security review's probe).
#[test]
fn the_fstab_helper_never_mounts_where_a_symlink_leads() {
    let sb = Sandbox::new();
    let parent = sb.cache_dir("home/u/c", 1000, 1000, 0o755);
    let cache = sb.cache_dir("home/u/c/cache", 1000, 1000, 0o755);
    let etc = sb.cache_dir("etc", 0, 0, 0o755);
    fs::write(etc.join("passwd"), "root's").unwrap();
    let spec = sb.write_spec(
        "spec.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: c\n    path: {}\n    size: 4MiB\n    owner: 1000\n",
            cache.display()
        ),
    );
    let root = sb.path("root");
    mirror(&root, &[&cache]);
    sb.run([
        "boot".as_ref(),
        "install".as_ref(),
        spec.as_os_str(),
        "--mode".as_ref(),
        "fstab".as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
    ])
    .code(0);
    // mount(8) and the helper both read this namespace's /etc/fstab.
    nix::mount::mount(
        Some(&root.join("etc/fstab")),
        "/etc/fstab",
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    provide_mount_helper(&sb);
    fs::remove_dir(&cache).unwrap();
    std::os::unix::fs::symlink(&etc, &cache).unwrap();
    let out = Command::new("mount").arg("-a").output().unwrap();
    let text = output_text(&out);
    assert!(
        sb.top(&etc).is_none(),
        "mounted over the symlink's target:\n{text}"
    );
    assert_eq!(fs::read_to_string(etc.join("passwd")).unwrap(), "root's");
    assert!(
        !out.status.success() && text.contains("a symlink on the way was followed"),
        "{text}"
    );
    // With the symlink gone, the same boot mounts the directory.
    fs::remove_file(&cache).unwrap();
    fs::create_dir(&cache).unwrap();
    let out = Command::new("mount").arg("-a").output().unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(sb.top(&cache).map(|t| t.source), Some("tmpfsctl-c".to_string()));
    let _ = parent;
}
