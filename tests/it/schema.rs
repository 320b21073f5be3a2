//! `tmpfsctl schema`: the committed docs/tmpfsctl.schema.json (the examples'
//! `yaml-language-server` modeline points at it) is what the binary prints
//! (TMPFSCTL_BLESS=1 rewrites it, except under CI), and with python's
//! `jsonschema` every example validates and a set of bad specs does not. Python comes from
//! TMPFSCTL_PYTHON (`.ci/run` sets it to its venv, which has jsonschema and
//! PyYAML), else `python3`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common;

fn schema_text() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tmpfsctl"))
        .arg("schema")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/tmpfsctl.schema.json")
}

#[test]
fn committed_schema_is_what_tmpfsctl_schema_prints() {
    let now = schema_text();
    if common::ci::blessing() {
        std::fs::write(committed(), &now).unwrap();
    }
    let file = std::fs::read_to_string(committed()).unwrap_or_default();
    assert!(
        file == now,
        "docs/tmpfsctl.schema.json is out of date: run `TMPFSCTL_BLESS=1 cargo test --test it schema::`"
    );
}

const ONE: &str = "version: 1\nmounts:\n  - name: cache\n    path: /var/cache/app\n    size: 64MiB\n";

fn bad_specs() -> Vec<(&'static str, String)> {
    let with = |extra: &str| format!("{ONE}{extra}");
    vec![
        ("unknown top-level field", format!("boot: systemd\n{ONE}")),
        ("unknown mount field", with("    sise: 1MiB\n")),
        ("missing size", ONE.replace("    size: 64MiB\n", "")),
        (
            "missing name",
            ONE.replace("  - name: cache\n    path", "  - path"),
        ),
        ("missing mounts", "version: 1\n".into()),
        ("missing version", ONE.replace("version: 1\n", "")),
        ("version 2", ONE.replace("version: 1", "version: 2")),
        ("size a list", ONE.replace("size: 64MiB", "size: [64MiB]")),
        ("bad name", ONE.replace("name: cache", "name: Cache")),
        (
            "relative path",
            ONE.replace("path: /var/cache/app", "path: var/cache/app"),
        ),
        ("bad huge", with("    huge: sometimes\n")),
        ("bad seed", with("    seed: clone\n")),
        ("bad on_failure", with("    on_failure: panic\n")),
        ("unknown option", with("    options: [nosuid, ro]\n")),
        ("mode not octal", with("    mode: \"0999\"\n")),
        ("create a string", with("    create: \"true\"\n")),
        ("bad persist", with("    persist: sometimes\n")),
        ("bad before unit", with("    before: [nginx]\n")),
        (
            "unknown action",
            with("    watchdog: { action: [grow, explode] }\n"),
        ),
        ("unknown watchdog field", with("    watchdog: { hihg: 90% }\n")),
        (
            "unknown inodes field",
            with("    watchdog:\n      inodes: { hihg: 90% }\n"),
        ),
        ("threshold without %", with("    watchdog: { high: 95 }\n")),
        ("priority above 100", with("    watchdog: { priority: 101 }\n")),
        (
            "bad evict_group",
            with("    watchdog: { evict_group: everything }\n"),
        ),
        ("unknown agent field", format!("agent:\n  intervall: 1s\n{ONE}")),
        (
            "unknown defaults field",
            format!("defaults:\n  size: 1MiB\n{ONE}"),
        ),
        (
            "unknown default watchdog field",
            format!("defaults:\n  watchdog: {{ hihg: 90% }}\n{ONE}"),
        ),
        (
            "unknown default inodes field",
            format!("defaults:\n  watchdog:\n    inodes: {{ hihg: 90% }}\n{ONE}"),
        ),
        ("null size", ONE.replace("size: 64MiB", "size:")),
    ]
}

#[test]
fn examples_validate_and_bad_specs_fail_against_the_schema() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut good = serde_json::Map::new();
    for e in std::fs::read_dir(&examples).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "yaml") {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            good.insert(name, std::fs::read_to_string(&p).unwrap().into());
        }
    }
    assert!(good.len() >= 7, "{:?}", good.keys());
    good.insert("minimal".into(), ONE.into());
    good.insert("no mounts".into(), "version: 1\nmounts: []\n".into());
    let bad: serde_json::Map<String, serde_json::Value> = bad_specs()
        .into_iter()
        .map(|(n, y)| (n.to_string(), y.into()))
        .collect();
    let schema: serde_json::Value = serde_json::from_str(&schema_text()).unwrap();
    let job = serde_json::json!({ "schema": schema, "good": good, "bad": bad });

    let python = std::env::var("TMPFSCTL_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schema_check.py");
    let mut child = Command::new(&python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{python}: {e} (set TMPFSCTL_PYTHON to a python with jsonschema and PyYAML)")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(job.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("ModuleNotFoundError"),
        "{python} lacks jsonschema or PyYAML (set TMPFSCTL_PYTHON; .ci/run's venv has both):\n{text}"
    );
    assert!(out.status.success(), "{text}");
}

/// The schema is no stricter than the parser: every spec it refuses,
/// `validate` refuses too (in a root where the path exists, so that is not
/// the reason), and the minimal spec passes both.
#[test]
fn the_bad_specs_are_refused_by_validate_too() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("var/cache/app")).unwrap();
    common::root_only_users(&root);
    let validate = |yaml: &str| {
        let p = dir.path().join("s.yaml");
        std::fs::write(&p, yaml).unwrap();
        Command::new(env!("CARGO_BIN_EXE_tmpfsctl"))
            .arg("validate")
            .arg(&p)
            .arg("--root")
            .arg(&root)
            .output()
            .unwrap()
    };
    let ok = validate(ONE);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    for (name, yaml) in bad_specs() {
        let out = validate(&yaml);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
