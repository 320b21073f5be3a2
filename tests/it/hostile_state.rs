//! A hostile neighbour against the state directory and the spec: what another user
//! could change is refused, and nothing is ever mounted or written through a symlink
//! planted in the state directory. Each test in its own private mount namespace.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::common::{self, Sandbox};

fn spec_for(sb: &Sandbox, cache: &Path) -> PathBuf {
    sb.one_mount_spec("cache", cache, "8MiB", "    persist: on-stop\n")
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// No managed tmpfs is mounted anywhere in the sandbox (the state directory's own
/// private binds may stay).
fn assert_nothing_mounted(sb: &Sandbox) {
    let ours: Vec<_> = sb
        .mounts()
        .into_iter()
        .filter(|e| e.source.starts_with("tmpfsctl-"))
        .collect();
    assert!(ours.is_empty(), "{ours:#?}");
}

#[test]
fn a_state_directory_another_user_could_change_is_refused() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_for(&sb, &cache);
    for (what, setup) in [
        ("world-writable", (0o777, None)),
        ("sticky but world-writable", (0o1777, None)),
        ("group-writable", (0o770, None)),
        ("another user's", (0o700, Some(1000))),
    ] {
        let state = sb.path(&format!("state-{}", what.replace(' ', "-")));
        fs::create_dir(&state).unwrap();
        chmod(&state, setup.0);
        if let Some(uid) = setup.1 {
            std::os::unix::fs::chown(&state, Some(uid), None).unwrap();
        }
        let mut c = sb.cmd();
        c.env("TMPFSCTL_STATE_DIR", &state);
        let run = sb.run_with(c, ["apply".as_ref(), spec.as_os_str()]);
        run.code(2)
            .stderr_has("the state directory must be root's alone")
            .stderr_has(&state.display().to_string());
        assert_eq!(
            fs::read_dir(&state).unwrap().count(),
            0,
            "{what}: nothing written in it"
        );
        assert!(
            sb.mounts().is_empty(),
            "{what}: nothing mounted: {:#?}",
            sb.mounts()
        );
    }
    // A directory above it that anybody can change (not sticky).
    let open = sb.path("open");
    fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let mut c = sb.cmd();
    c.env("TMPFSCTL_STATE_DIR", open.join("state"));
    sb.run_with(c, ["apply".as_ref(), spec.as_os_str()])
        .code(2)
        .stderr_has(&format!("{} is writable by every user", open.display()));
    assert_nothing_mounted(&sb);
    // The same under a sticky root-owned directory, like /tmp, is fine; the state
    // directory is made 0700.
    chmod(&open, 0o1777);
    let mut c = sb.cmd();
    c.env("TMPFSCTL_STATE_DIR", open.join("state"));
    sb.run_with(c, ["apply".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(common::mode_of(&open.join("state")), 0o700);
    let mut c = sb.cmd();
    c.env("TMPFSCTL_STATE_DIR", open.join("state"));
    sb.run_with(c, ["down".as_ref(), spec.as_os_str()]).code(0);
}

#[test]
fn symlinks_planted_in_the_state_directory_are_never_followed() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    fs::write(cache.join("page"), "cached").unwrap();
    let spec = spec_for(&sb, &cache);
    // Targets a planted link would lead to: they must stay untouched.
    let victim = sb.path("victim");
    fs::create_dir(&victim).unwrap();
    fs::write(victim.join("keep"), "mine").unwrap();
    let victim_file = sb.path("victim-file");
    fs::write(&victim_file, "precious").unwrap();
    fs::create_dir_all(sb.state.join("mounts")).unwrap();
    chmod(&sb.state, 0o700);
    symlink(&victim, sb.state.join("stage")).unwrap();
    symlink(&victim, sb.state.join("lower")).unwrap();
    symlink(&victim_file, sb.state.join("mounts/cache.json.tmp~")).unwrap();
    symlink(&victim_file, sb.state.join("lock")).unwrap();

    for round in 0..2 {
        let run = sb.run(["apply".as_ref(), spec.as_os_str()]);
        run.code(0);
        assert_eq!(fs::read_to_string(cache.join("page")).unwrap(), "cached");
        assert_eq!(
            sb.mounts_at(&cache).len(),
            1,
            "round {round}: one tmpfs, never stacked"
        );
        assert!(
            !sb.mounts().iter().any(|e| e.mount_point.starts_with(&victim)),
            "round {round}: nothing mounted through the links: {:#?}",
            sb.mounts()
        );
        assert_eq!(fs::read_to_string(&victim_file).unwrap(), "precious");
        assert_eq!(fs::read_dir(&victim).unwrap().count(), 1);
        for d in ["stage", "lower"] {
            let m = fs::symlink_metadata(sb.state.join(d)).unwrap();
            assert!(m.is_dir() && !m.file_type().is_symlink(), "{d} repaired");
        }
    }
    // Links planted at the mount points themselves, while the mount is up.
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    symlink(&victim, sb.state.join("stage/cache")).unwrap();
    symlink(&victim, sb.state.join("held/cache")).unwrap();
    let _ = fs::remove_dir(sb.state.join("lower/cache"));
    symlink(&victim, sb.state.join("lower/cache")).unwrap();
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("new"), "written in RAM").unwrap();
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert!(
        !sb.mounts().iter().any(|e| e.mount_point.starts_with(&victim)),
        "{:#?}",
        sb.mounts()
    );
    assert_eq!(fs::read_dir(&victim).unwrap().count(), 1, "victim untouched");
    assert_eq!(fs::read_to_string(cache.join("new")).unwrap(), "written in RAM");
    assert_nothing_mounted(&sb);
}

#[test]
fn a_spec_another_user_could_change_is_refused() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("cache", 0, 0, 0o755);
    let spec = spec_for(&sb, &cache);
    chmod(sb.path("").as_path(), 0o755);

    chmod(&spec, 0o666);
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(2)
        .stderr_has(&format!("refusing spec {}", spec.display()))
        .stderr_has("is writable by every user");
    sb.run(["validate".as_ref(), spec.as_os_str()]).code(2);
    chmod(&spec, 0o664);
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(2)
        .stderr_has("writable by the members of group");
    chmod(&spec, 0o644);
    std::os::unix::fs::chown(&spec, Some(65534), None).unwrap();
    sb.run(["plan".as_ref(), spec.as_os_str()])
        .code(2)
        .stderr_has("is owned by uid 65534");
    std::os::unix::fs::chown(&spec, Some(0), None).unwrap();
    assert_nothing_mounted(&sb);

    // In a directory anybody can change, directly or through a symlink.
    let open = sb.path("open");
    fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let inside = open.join("cache.yaml");
    fs::copy(&spec, &inside).unwrap();
    sb.run(["apply".as_ref(), inside.as_os_str()])
        .code(2)
        .stderr_has(&format!("{} is writable by every user", open.display()));
    let link = sb.path("link.yaml");
    symlink(&inside, &link).unwrap();
    sb.run(["apply".as_ref(), link.as_os_str()]).code(2);
    assert_nothing_mounted(&sb);
    // Sticky and root's, like /tmp: a root-owned spec there is fine.
    chmod(&open, 0o1777);
    sb.run(["validate".as_ref(), inside.as_os_str()]).code(0);
}
