//! A spec edited while its mounts are live: `apply` refuses what it cannot
//! change on a live mount, and `down`, `sync` and the agent write a live mount
//! back as it was built, whatever the edited spec says (a review helper's
//! probes: `persist: none` dropped everything written while it was persisted;
//! a changed `seed` wrote an overlay back as a copy, bringing back what the
//! application deleted; a mount of another spec inside a live one was taken
//! along unwritten).

use std::fs;
use std::path::Path;

use crate::common::Sandbox;

/// A disk directory with two files the seed copies.
fn disk_dir(sb: &Sandbox, rel: &str) -> std::path::PathBuf {
    let cache = sb.cache_dir(rel, 0, 0, 0o755);
    fs::write(cache.join("kept"), "seeded").unwrap();
    fs::write(cache.join("deleted"), "seeded").unwrap();
    cache
}

/// `FILE.yaml`: a spec of its own with the one persisted mount `name` at `path`.
fn own_spec(sb: &Sandbox, file: &str, name: &str, path: &Path) -> std::path::PathBuf {
    sb.write_spec(
        &format!("{file}.yaml"),
        &format!(
            "version: 1\nmounts:\n  - name: {name}\n    path: {}\n    size: 8MiB\n    persist: on-stop\n",
            path.display()
        ),
    )
}

/// What the application does in RAM: one file written, one seeded deleted.
fn write_in_ram(cache: &Path) {
    fs::write(cache.join("new"), "written in RAM").unwrap();
    fs::remove_file(cache.join("deleted")).unwrap();
}

fn assert_written_back(sb: &Sandbox, cache: &Path) {
    assert!(sb.mounts_at(cache).is_empty(), "{:#?}", sb.mounts_at(cache));
    assert_eq!(fs::read_to_string(cache.join("new")).unwrap(), "written in RAM");
    assert_eq!(fs::read_to_string(cache.join("kept")).unwrap(), "seeded");
    assert!(!cache.join("deleted").exists(), "a name deleted in RAM came back");
}

#[test]
fn a_mount_built_persisted_is_written_back_after_the_spec_says_none() {
    let sb = Sandbox::new();
    let cache = disk_dir(&sb, "var/cache/app");
    let spec = sb.one_mount_spec("cache", &cache, "8MiB", "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    write_in_ram(&cache);
    // With a size change too: a plan with steps rewrote the record, and its
    // `none` then stood for the mount.
    let spec = sb.one_mount_spec("cache", &cache, "16MiB", "    persist: none\n");
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(3)
        .stdout_has("built with `persist: on-stop` and the spec asks for `persist: none`");
    assert_eq!(
        sb.top(&cache).unwrap().source,
        "tmpfsctl-cache",
        "the refused apply left the mount"
    );
    sb.run(["sync".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(
        fs::read_to_string(sb.state.join("lower/cache/new")).unwrap(),
        "written in RAM",
        "sync writes back a mount built persisted"
    );
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert_written_back(&sb, &cache);
}

#[test]
fn a_mount_built_volatile_is_not_made_persisted_by_an_apply() {
    let sb = Sandbox::new();
    let cache = disk_dir(&sb, "var/cache/app");
    let spec = sb.one_mount_spec("cache", &cache, "8MiB", "    persist: none\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let spec = sb.one_mount_spec("cache", &cache, "8MiB", "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(3)
        .stdout_has("built with `persist: none` and the spec asks for `persist: on-stop`")
        .stdout_has("which discards its contents");
    // `down` with the new spec discards it, as it was built: what a volatile
    // cache deleted (its `evict`) must not reach the disk (a review helper's
    // probe: 18 of 22 files deleted on disk).
    write_in_ram(&cache);
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert!(sb.mounts_at(&cache).is_empty());
    assert_eq!(fs::read_to_string(cache.join("deleted")).unwrap(), "seeded");
    assert!(!cache.join("new").exists());
}

/// Both ways: an overlay with the spec now saying copy (before, written back as a
/// copy: every seeded file the application deleted came back), and a copy with
/// the spec now saying overlay (before, `down` failed for good).
#[test]
fn a_live_mount_is_written_back_as_built_after_the_spec_changes_its_seed() {
    let overlay = "    seed: overlay\n    persist: on-stop\n";
    let copy = "    persist: on-stop\n";
    for (built, now, says) in [
        (
            overlay,
            copy,
            "the live mount is an overlay and the spec asks for a full copy in RAM",
        ),
        (
            copy,
            overlay,
            "the live mount is a full copy in RAM and the spec asks for an overlay",
        ),
    ] {
        let sb = Sandbox::new();
        let cache = disk_dir(&sb, "var/cache/app");
        let spec = sb.one_mount_spec("cache", &cache, "8MiB", built);
        sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
        write_in_ram(&cache);
        let spec = sb.one_mount_spec("cache", &cache, "8MiB", now);
        sb.run(["apply".as_ref(), spec.as_os_str()])
            .code(3)
            .stdout_has(says);
        // As `apply` advises: `down`, with the spec as it is now.
        sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
        assert_written_back(&sb, &cache);
    }
}

#[test]
fn a_backend_change_is_refused_on_a_live_mount() {
    let sb = Sandbox::new();
    let cache = disk_dir(&sb, "var/cache/app");
    let spec = sb.one_mount_spec("cache", &cache, "64MiB", "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    write_in_ram(&cache);
    let before = sb.mounts();
    let spec = sb.one_mount_spec(
        "cache",
        &cache,
        "64MiB",
        "    persist: on-stop\n    backend: zram\n",
    );
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(3)
        .stdout_has("the live mount is on tmpfs and the spec asks for zram");
    assert_eq!(
        sb.mounts(),
        before,
        "a refused backend change touched the mount table"
    );
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert_written_back(&sb, &cache);
}

#[test]
fn a_mount_of_another_spec_inside_or_above_the_path_is_refused() {
    let sb = Sandbox::new();
    let outer = disk_dir(&sb, "disk/a");
    let inner = disk_dir(&sb, "disk/a/d1");
    let outer_spec = own_spec(&sb, "outer", "ra", &outer);
    let inner_spec = own_spec(&sb, "inner", "rc", &inner);
    sb.run(["apply".as_ref(), outer_spec.as_os_str()]).code(0);
    sb.run(["apply".as_ref(), inner_spec.as_os_str()])
        .code(3)
        .stdout_has("where `ra` of another spec is mounted");
    assert!(sb.mounts_at(&inner).is_empty(), "rc was mounted inside ra");
    sb.run(["down".as_ref(), outer_spec.as_os_str()]).code(0);

    sb.run(["apply".as_ref(), inner_spec.as_os_str()]).code(0);
    sb.run(["apply".as_ref(), outer_spec.as_os_str()])
        .code(3)
        .stdout_has("holds `rc`, a mount of another spec");
    assert!(sb.mounts_at(&outer).is_empty(), "ra was mounted over rc");
    sb.run(["down".as_ref(), inner_spec.as_os_str()]).code(0);
}

#[test]
fn down_refuses_a_mount_that_holds_one_of_another_spec() {
    let sb = Sandbox::new();
    let outer = disk_dir(&sb, "disk/a");
    let spec = sb.one_mount_spec("ra", &outer, "8MiB", "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    // As an older tmpfsctl let another spec mount it, inside the live tmpfs.
    let inner = outer.join("d1");
    fs::create_dir(&inner).unwrap();
    let made = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfsctl-rc"])
        .arg(&inner)
        .status()
        .unwrap();
    assert!(made.success());
    fs::write(
        sb.state.join("mounts/rc.json"),
        format!(
            r#"{{"name":"rc","path":"{}","persist":"on-stop","applied_at":0}}"#,
            inner.display()
        ),
    )
    .unwrap();
    fs::write(inner.join("f"), "rc's").unwrap();
    sb.run(["down".as_ref(), spec.as_os_str()])
        .code(1)
        .stdout_has("holds `rc`, a mount of another spec");
    assert_eq!(sb.top(&outer).unwrap().source, "tmpfsctl-ra", "ra was taken down");
    assert_eq!(fs::read_to_string(inner.join("f")).unwrap(), "rc's");
}

/// A record a killed `down` left (the mount gone) must not stand for the next
/// build, of another seed, were that `apply` killed before its end: the
/// record is written before the first mount (a review helper's probe: `down`
/// took the tmpfs for an overlay, and failed for good).
#[test]
fn a_record_left_by_a_killed_down_does_not_stand_for_the_next_build() {
    let sb = Sandbox::new();
    let cache = disk_dir(&sb, "var/cache/app");
    let spec = sb.one_mount_spec(
        "cache",
        &cache,
        "8MiB",
        "    seed: overlay\n    persist: on-stop\n",
    );
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    crate::no_write_lost::killed_at(&sb, "down", &spec, "after-release:cache");
    assert!(sb.mounts_at(&cache).is_empty());
    let spec = sb.one_mount_spec("cache", &cache, "8MiB", "    persist: on-stop\n");
    crate::no_write_lost::killed_at(&sb, "apply", &spec, "after-move-into-place:cache");
    assert_eq!(sb.top(&cache).unwrap().fstype, "tmpfs");
    write_in_ram(&cache);
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert_written_back(&sb, &cache);
}

/// A bind of another spec's tmpfs inside a mount (a chroot's, a build's) is no
/// mount of its own: it goes with the mount it is in, and its data stays at
/// its path (a review helper's probe: `down` refused, and following its advice
/// went round in a circle).
#[test]
fn a_bind_of_another_specs_tmpfs_inside_a_mount_does_not_stop_its_down() {
    for first_apt in [false, true] {
        let sb = Sandbox::new();
        let apt = disk_dir(&sb, "var/cache/apt");
        let build = disk_dir(&sb, "srv/build");
        let apt_spec = own_spec(&sb, "apt", "apt", &apt);
        let build_spec = own_spec(&sb, "build", "build", &build);
        sb.run(["apply".as_ref(), apt_spec.as_os_str()]).code(0);
        sb.run(["apply".as_ref(), build_spec.as_os_str()]).code(0);
        fs::create_dir(build.join("aptc")).unwrap();
        let bound = std::process::Command::new("mount")
            .arg("--bind")
            .arg(&apt)
            .arg(build.join("aptc"))
            .status()
            .unwrap();
        assert!(bound.success());
        write_in_ram(&build);
        write_in_ram(&apt);
        // Whichever goes down first: the bind left after `apt` went is nobody's.
        if first_apt {
            sb.run(["down".as_ref(), apt_spec.as_os_str()]).code(0);
            sb.run(["down".as_ref(), build_spec.as_os_str()]).code(0);
        } else {
            sb.run(["down".as_ref(), build_spec.as_os_str()]).code(0);
            sb.run(["down".as_ref(), apt_spec.as_os_str()]).code(0);
        }
        assert_written_back(&sb, &build);
        assert_written_back(&sb, &apt);
    }
}

/// A managed mount whose parent was renamed (`status`: moved) still counts as
/// one: a mount of another spec over it would hide it.
#[test]
fn a_moved_mount_of_another_spec_still_counts_as_nested() {
    let sb = Sandbox::new();
    let outer = sb.path("disk/a");
    let inner = disk_dir(&sb, "disk/a/p/y");
    let inner_spec = own_spec(&sb, "inner", "y", &inner);
    sb.run(["apply".as_ref(), inner_spec.as_os_str()]).code(0);
    fs::rename(outer.join("p"), outer.join("q")).unwrap();
    let outer_spec = own_spec(&sb, "outer", "x", &outer);
    sb.run(["apply".as_ref(), outer_spec.as_os_str()])
        .code(3)
        .stdout_has("holds `y`, a mount of another spec");
    assert!(sb.mounts_at(&outer).is_empty());
}
