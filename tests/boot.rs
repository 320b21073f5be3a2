//! Boot artifacts: golden files for every mode (run with TMPFSCTL_BLESS=1 to
//! rewrite them after an intended change), idempotence, clean removal, and
//! the real systemd tools' verdicts on what is written.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::Sandbox;

const SPEC_PATH: &str = "/etc/tmpfsctl/cache.yaml";
const BINARY: &str = "/usr/bin/tmpfsctl";

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
    if std::env::var_os("TMPFSCTL_BLESS").is_some() {
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
    if std::env::var_os("TMPFSCTL_BLESS").is_some() {
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
        body.contains("What=tmpfsctl-web") && body.contains("Type=tmpfs"),
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
