//! Command-line surface that needs no mounts: help, version, man page,
//! completions.

use std::process::Command;

fn tmpfsctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tmpfsctl"))
        .args(args)
        .output()
        .unwrap();
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(out.stdout),
        text(out.stderr),
    )
}

#[test]
fn help_lists_every_command() {
    let (code, out, _) = tmpfsctl(&["--help"]);
    assert_eq!(code, 0);
    for c in [
        "validate",
        "plan",
        "apply",
        "status",
        "sync",
        "down",
        "boot",
        "bench",
        "residency",
    ] {
        assert!(out.contains(c), "--help lacks {c}:\n{out}");
    }
    let (code, out, _) = tmpfsctl(&["--version"]);
    assert_eq!(
        (code, out.trim()),
        (0, concat!("tmpfsctl ", env!("CARGO_PKG_VERSION")))
    );
}

#[test]
fn manual_page_is_roff_in_section_8() {
    let (code, out, err) = tmpfsctl(&["manpage"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(".TH tmpfsctl 8"), "{out}");
    assert!(out.contains("apply"));
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef tmpfsctl"),
        ("fish", "complete -c tmpfsctl"),
    ] {
        let (code, out, err) = tmpfsctl(&["completions", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(out.contains(marker), "{shell} completions lack {marker:?}");
    }
    let (code, _, err) = tmpfsctl(&["completions", "tcsh"]);
    assert_eq!(code, 2);
    assert!(err.contains("possible values"), "{err}");
}
