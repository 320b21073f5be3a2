//! A hostile user owning a directory above the managed path, racing the commands:
//! it moves that directory away and puts a symlink to another mount, or to a
//! root-owned directory, where the managed path was. `down` and `apply` act only on
//! the mounts they found, never on where a symlink leads. Each test in its own
//! private mount namespace.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::Sandbox;
use crate::no_write_lost::stopped_at;

fn spec(sb: &Sandbox, mounts: &[(&str, &Path)], persist: &str) -> PathBuf {
    let mut yaml = String::from("version: 1\nmounts:\n");
    for (name, path) in mounts {
        yaml.push_str(&format!(
            "  - name: {name}\n    path: {}\n    size: 8MiB\n    persist: {persist}\n",
            path.display()
        ));
    }
    sb.write_spec("cache.yaml", &yaml)
}

/// A root-only tmpfs standing in for any mount of the host's, with a file in it.
fn victim(sb: &Sandbox) -> PathBuf {
    let victim = sb.path("victim");
    fs::create_dir(&victim).unwrap();
    nix::mount::mount(
        Some("victim"),
        &victim,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("mode=0700"),
    )
    .unwrap();
    fs::write(victim.join("s"), "secret").unwrap();
    victim
}

/// `down` stopped after holding the tmpfs (volatile: right before unmounting it);
/// the user moves the managed path's parent away and puts a symlink to another
/// mount where the managed path was. The other mount stays. The tmpfs, moved with
/// the parent, is written back into its disk directory (volatile: `down` fails and
/// leaves it mounted). Before, `down` unmounted (or bound as the held tmpfs, and
/// wrote back) whatever the symlink led to, reported success and forgot the tmpfs
/// (a security review's probe; a plain `down` racing a swapping loop did the same in
/// 11 of 26 runs).
#[test]
fn down_never_unmounts_what_a_symlink_at_the_managed_path_leads_to() {
    for (persist, point) in [("on-stop", "after-hold"), ("none", "before-unmount")] {
        let sb = Sandbox::new();
        let parent = sb.cache_dir("home/u/c", 1000, 1000, 0o755);
        let cache = sb.cache_dir("home/u/c/cache", 1000, 1000, 0o755);
        let victim = victim(&sb);
        let spec = spec(&sb, &[("cache", &cache)], persist);
        sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
        fs::write(cache.join("f"), "the application's").unwrap();
        let moved = sb.path("home/u/c.old");
        let (code, out) = stopped_at(
            &sb,
            "down",
            &spec,
            &format!("stop={point}:cache"),
            &[point],
            |_| {
                fs::rename(&parent, &moved).unwrap();
                fs::create_dir(&parent).unwrap();
                std::os::unix::fs::symlink(&victim, &cache).unwrap();
            },
        );
        assert_eq!(
            fs::read(victim.join("s")).ok().as_deref(),
            Some(&b"secret"[..]),
            "{persist}: the other mount was unmounted\n{out}"
        );
        assert!(
            sb.mounts().iter().any(|e| e.mount_point == victim),
            "{persist}: {out}"
        );
        assert_eq!(
            fs::read(moved.join("cache/f")).ok().as_deref(),
            Some(&b"the application's"[..]),
            "{persist}: {out}"
        );
        let ours = sb.mounts().into_iter().any(|e| e.source.starts_with("tmpfsctl-"));
        if persist == "none" {
            assert!(
                code != 0 && ours,
                "volatile: still mounted, and down failed\n{out}"
            );
        } else {
            assert!(code == 0 && !ours, "written back and unmounted\n{out}");
        }
    }
}

/// `apply` restoring a lost side bind (the tmpfs at its path, nothing at
/// `STATE/lower/NAME`), stopped just before (after another mount's step); the user
/// swaps a symlink to a root-owned directory in at the managed path. The side is not
/// bound there, and the next `sync` writes nothing into it. Before, the side became
/// a bind of the root-owned directory, and `sync` replaced its `passwd` with the
/// user's (a security review's probe).
#[test]
fn apply_never_binds_the_side_to_where_a_symlink_leads() {
    let sb = Sandbox::new();
    let parent = sb.cache_dir("home/u/c", 1000, 1000, 0o755);
    let cache = sb.cache_dir("home/u/c/cache", 1000, 1000, 0o755);
    let first = sb.cache_dir("a", 0, 0, 0o755);
    let etc = sb.cache_dir("etc", 0, 0, 0o755);
    fs::write(etc.join("passwd"), "root's").unwrap();
    sb.run([
        "apply".as_ref(),
        spec(&sb, &[("cache", &cache)], "on-stop").as_os_str(),
    ])
    .code(0);
    // `a` is new to the next `apply`: its steps come first, and stop there.
    let spec = spec(&sb, &[("a", &first), ("cache", &cache)], "on-stop");
    fs::write(cache.join("passwd"), "the user's").unwrap();
    nix::mount::umount2(&sb.path("state/lower/cache"), nix::mount::MntFlags::MNT_DETACH).unwrap();
    let moved = sb.path("home/u/c.real");
    let (_, out) = stopped_at(
        &sb,
        "apply",
        &spec,
        "stop=after-move-into-place:a",
        &["after-move-into-place"],
        |_| {
            fs::rename(&parent, &moved).unwrap();
            fs::create_dir(&parent).unwrap();
            std::os::unix::fs::symlink(&etc, &cache).unwrap();
        },
    );
    fs::remove_file(&cache).unwrap();
    fs::remove_dir(&parent).unwrap();
    fs::rename(&moved, &parent).unwrap();
    let sync = sb.run(["sync".as_ref(), spec.as_os_str()]);
    assert_eq!(
        fs::read_to_string(etc.join("passwd")).unwrap(),
        "root's",
        "{out}\n{sync}"
    );
    assert_eq!(fs::read_dir(&etc).unwrap().count(), 1, "{out}\n{sync}");
}

/// Two managed paths with the same last name under two directories of the user's;
/// `apply` resizes one and is stopped just before (after another mount's step)
/// while the user swaps the two directories. The resize is refused, and neither
/// tmpfs changes size. Before, the resize meant for the first landed on the
/// second's tmpfs (a review helper's probe).
#[test]
fn a_resize_never_lands_on_another_mount_swapped_in() {
    let sb = Sandbox::new();
    let p1 = sb.cache_dir("home/u/c1", 1000, 1000, 0o755);
    let p2 = sb.cache_dir("home/u/c2", 1000, 1000, 0o755);
    let c1 = sb.cache_dir("home/u/c1/cache", 1000, 1000, 0o755);
    let c2 = sb.cache_dir("home/u/c2/cache", 1000, 1000, 0o755);
    let first = sb.cache_dir("a", 0, 0, 0o755);
    sb.run([
        "apply".as_ref(),
        spec(&sb, &[("c1", &c1), ("c2", &c2)], "on-stop").as_os_str(),
    ])
    .code(0);
    let spec = sb.write_spec(
        "cache.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: a\n    path: {}\n    size: 8MiB\n  - name: c1\n    path: {}\n    size: 16MiB\n    persist: on-stop\n  - name: c2\n    path: {}\n    size: 8MiB\n    persist: on-stop\n",
            first.display(),
            c1.display(),
            c2.display()
        ),
    );
    let tmp = sb.path("home/u/tmp");
    let (code, out) = stopped_at(
        &sb,
        "apply",
        &spec,
        "stop=after-move-into-place:a",
        &["after-move-into-place"],
        |_| {
            fs::rename(&p1, &tmp).unwrap();
            fs::rename(&p2, &p1).unwrap();
            fs::rename(&tmp, &p2).unwrap();
        },
    );
    let size = |source: &str| {
        let e = sb.mounts().into_iter().find(|e| e.source == source).unwrap();
        let st = nix::sys::statvfs::statvfs(&e.mount_point).unwrap();
        st.blocks() as u64 * st.fragment_size() as u64
    };
    assert_eq!(size("tmpfsctl-c2"), 8 << 20, "c2's tmpfs was resized\n{out}");
    assert_eq!(size("tmpfsctl-c1"), 8 << 20, "{out}");
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("is no longer the mount of `c1`"), "{out}");
}
