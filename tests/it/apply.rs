//! apply / plan / status / down against the real kernel, each test in its
//! own private mount namespace (see common/mod.rs).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::common::{mode_of, owner_of, Sandbox};
use tmpfsctl::host::usage::Usage;

fn spec_for(sb: &Sandbox, cache: &Path, extra: &str) -> PathBuf {
    sb.one_mount_spec("cache", cache, "8MiB", extra)
}

/// A cache directory owned by a non-root user, mode 0700, with some files.
fn seeded_cache(sb: &Sandbox) -> PathBuf {
    let cache = sb.cache_dir("var/cache/app", 1234, 2345, 0o700);
    fs::create_dir(cache.join("sub")).unwrap();
    fs::write(cache.join("sub/page.html"), "cached page").unwrap();
    fs::write(cache.join("index"), vec![7u8; 100_000]).unwrap();
    cache
}

fn assert_offloaded(sb: &Sandbox, cache: &Path) {
    let at = sb.mounts_at(cache);
    assert_eq!(
        at.len(),
        1,
        "exactly one mount at {} (no stacking): {at:#?}",
        cache.display()
    );
    assert_eq!(at[0].fstype, "tmpfs");
    assert_eq!(at[0].source, "tmpfsctl-cache");
    assert!(
        at[0].has_mount_option("nosuid") && at[0].has_mount_option("nodev"),
        "{at:#?}"
    );
    let lower = sb.state.join("lower/cache");
    let lowers = sb.mounts_at(&lower);
    assert_eq!(lowers.len(), 1, "one side bind: {lowers:#?}");
    assert!(lowers[0].is_private());
    assert!(
        sb.mounts_at(&sb.state.join("stage/cache")).is_empty(),
        "nothing left at the staging point"
    );
}

#[test]
fn first_apply_mounts_seeds_and_copies_owner_and_mode() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("changed: yes");
    assert_offloaded(&sb, &cache);
    assert_eq!(
        owner_of(&cache),
        (1234, 2345),
        "tmpfs root owner copied from the disk directory"
    );
    assert_eq!(
        mode_of(&cache),
        0o700,
        "tmpfs root mode copied (not the 1777 tmpfs default)"
    );
    assert_eq!(
        fs::read_to_string(cache.join("sub/page.html")).unwrap(),
        "cached page"
    );
    assert_eq!(owner_of(&cache.join("sub")), (0, 0));
    let u = Usage::of(&cache).unwrap();
    assert_eq!(u.size, 8 << 20);
    assert!(u.used >= 100_000, "seeded bytes are in RAM: {u:?}");
    // The disk directory stays reachable under the side path.
    assert!(sb.state.join("lower/cache/index").exists());
}

#[test]
fn second_apply_changes_nothing_and_says_so() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let before = sb.mounts();
    let r = sb.run([
        "apply".as_ref(),
        spec.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    r.code(0);
    let j = r.json();
    assert_eq!(j["changed"], false, "{r}");
    assert_eq!(j["mounts"][0]["result"], "unchanged", "{r}");
    assert_eq!(sb.mounts(), before, "mount table unchanged by a no-op apply");
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("changed: no");
    sb.run(["plan".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("No changes");
}

#[test]
fn plan_shows_steps_and_changes_nothing() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    let r = sb.run(["plan".as_ref(), spec.as_os_str()]);
    r.code(0)
        .stdout_has("bind ")
        .stdout_has("mount tmpfs tmpfsctl-cache")
        .stdout_has("copy contents")
        .stdout_has("move ");
    assert!(sb.mounts().is_empty(), "plan mounted something\n{r}");
    let j = sb
        .run([
            "plan".as_ref(),
            spec.as_os_str(),
            "--format".as_ref(),
            "json".as_ref(),
        ])
        .json();
    assert_eq!(j["changed"], true);
    let actions: Vec<&str> = j["plan"]["mounts"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["bind-side", "mount-stage", "seed", "move-into-place"]);
}

/// The grow's remount, read back from mountinfo: a remount that left out a
/// flag (MS_REMOUNT resets the ones it is not given) or an option shows
/// there whatever the options builder meant to pass.
#[test]
fn grow_is_online_and_keeps_contents_and_flags() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(
        &sb,
        &cache,
        "    options: [nosuid, nodev, noexec, noatime]\n    inodes: 1000\n    huge: within_size\n",
    );
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("written-in-ram"), "keep me").unwrap();
    let dev_before = sb.top(&cache).unwrap().dev;
    let spec = sb.write_spec(
        "cache.yaml",
        &fs::read_to_string(&spec).unwrap().replace("8MiB", "16MiB"),
    );
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("remount")
        .stdout_has("size 8MiB -> 16MiB");
    assert_eq!(Usage::of(&cache).unwrap().size, 16 << 20);
    assert_eq!(
        fs::read_to_string(cache.join("written-in-ram")).unwrap(),
        "keep me"
    );
    let top = sb.top(&cache).unwrap();
    assert_eq!(top.dev, dev_before, "same tmpfs, not a new one");
    for f in ["nosuid", "nodev", "noexec", "noatime"] {
        assert!(top.has_mount_option(f), "{f} lost in the remount: {top:?}");
    }
    for (key, want) in [
        ("size", "16384k"),
        ("nr_inodes", "1000"),
        ("huge", "within_size"),
        ("uid", "1234"),
        ("gid", "2345"),
        ("mode", "700"),
    ] {
        assert_eq!(
            top.super_option(key),
            Some(want),
            "{key} after the remount: {top:?}"
        );
    }
    assert_offloaded(&sb, &cache);
}

#[test]
fn shrink_below_usage_is_refused_and_the_mount_stays() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("big"), vec![1u8; 6 << 20]).unwrap();
    let spec = sb.write_spec(
        "cache.yaml",
        &fs::read_to_string(&spec).unwrap().replace("8MiB", "4MiB"),
    );
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(3)
        .stdout_has("REFUSED")
        .stdout_has("cannot shrink");
    assert_eq!(Usage::of(&cache).unwrap().size, 8 << 20);
    assert_eq!(fs::metadata(cache.join("big")).unwrap().len(), 6 << 20);
    assert_offloaded(&sb, &cache);
}

#[test]
fn option_change_keeps_nosuid_and_nodev() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let spec = spec_for(&sb, &cache, "    options: [nosuid, nodev, noexec, noatime]\n");
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("noexec off -> on");
    let top = sb.top(&cache).unwrap();
    for o in ["nosuid", "nodev", "noexec", "noatime"] {
        assert!(top.has_mount_option(o), "{o} missing: {top:?}");
    }
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("changed: no");
}

#[test]
fn spec_owner_group_mode_win_and_changes_fix_the_root() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(
        &sb,
        &cache,
        "    owner: \"42\"\n    group: nogroup\n    mode: \"0750\"\n",
    );
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let nogroup = nix::unistd::Group::from_name("nogroup")
        .unwrap()
        .unwrap()
        .gid
        .as_raw();
    assert_eq!(owner_of(&cache), (42, nogroup));
    assert_eq!(mode_of(&cache), 0o750);
    let spec = spec_for(
        &sb,
        &cache,
        "    owner: \"42\"\n    group: nogroup\n    mode: \"0770\"\n",
    );
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("set root");
    assert_eq!(mode_of(&cache), 0o770);
}

#[test]
fn foreign_mount_is_refused_unless_takeover() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    nix::mount::mount(
        Some("someone-else"),
        &cache,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    let spec = spec_for(&sb, &cache, "");
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(3)
        .stdout_has("DEGRADED")
        .stdout_has("takeover: true");
    assert_eq!(sb.top(&cache).unwrap().source, "someone-else");
    assert!(
        sb.mounts_at(&sb.state.join("lower/cache")).is_empty(),
        "no side bind leaked"
    );
    let st = sb
        .run([
            "status".as_ref(),
            spec.as_os_str(),
            "--format".as_ref(),
            "json".as_ref(),
        ])
        .json();
    assert_eq!(st["mounts"][0]["state"], "foreign");

    let spec = spec_for(&sb, &cache, "    takeover: true\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(sb.top(&cache).unwrap().source, "tmpfsctl-cache");
}

#[test]
fn missing_directory_is_created_with_create_true() {
    let sb = Sandbox::new();
    let cache = sb.path("srv/new/cache");
    let spec = spec_for(&sb, &cache, "    create: true\n    mode: \"0710\"\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(sb.top(&cache).unwrap().source, "tmpfsctl-cache");
    assert_eq!(mode_of(&cache), 0o710);
    assert_eq!(
        mode_of(&sb.state.join("lower/cache")),
        0o710,
        "the disk directory got the same mode"
    );
}

#[test]
fn seed_that_does_not_fit_degrades_and_rolls_back() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    fs::write(cache.join("huge"), vec![3u8; 12 << 20]).unwrap();
    let spec = spec_for(&sb, &cache, "");
    let r = sb.run(["apply".as_ref(), spec.as_os_str()]);
    r.code(3)
        .stdout_has("DEGRADED")
        .stdout_has("do not fit")
        // It was tried and rolled back: never reported as "no change".
        .stdout_has("changed: yes");
    assert!(
        sb.mounts().is_empty()
            || sb
                .mounts()
                .iter()
                .all(|e| e.mount_point.starts_with(&sb.state) && !e.mount_point.ends_with("cache")),
        "rolled back\n{r}"
    );
    assert!(sb.top(&cache).is_none());
    assert_eq!(
        fs::metadata(cache.join("huge")).unwrap().len(),
        12 << 20,
        "disk directory untouched"
    );
    let st = sb
        .run([
            "status".as_ref(),
            spec.as_os_str(),
            "--format".as_ref(),
            "json".as_ref(),
        ])
        .json();
    assert_eq!(st["mounts"][0]["state"], "degraded");
    assert!(st["mounts"][0]["reason"].as_str().unwrap().contains("do not fit"));
}

#[test]
fn on_failure_fail_stops_at_the_first_failure() {
    let sb = Sandbox::new();
    let a = seeded_cache(&sb);
    fs::write(a.join("huge"), vec![3u8; 12 << 20]).unwrap();
    let b = sb.cache_dir("var/cache/b", 0, 0, 0o755);
    let spec = sb.write_spec(
        "two.yaml",
        &format!(
            "version: 1\ndefaults:\n  on_failure: fail\nmounts:\n  - name: a\n    path: {}\n    size: 8MiB\n  - name: b\n    path: {}\n    size: 8MiB\n",
            a.display(),
            b.display()
        ),
    );
    let r = sb.run([
        "apply".as_ref(),
        spec.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    r.code(1);
    let j = r.json();
    assert_eq!(j["mounts"][0]["result"], "failed");
    assert_eq!(j["mounts"][1]["result"], "skipped");
    assert!(
        sb.mounts()
            .iter()
            .all(|e| e.source != "tmpfsctl-a" && e.source != "tmpfsctl-b"),
        "{r}"
    );
}

#[test]
fn seed_empty_hides_nothing_it_does_not_need() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "    seed: empty\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(fs::read_dir(&cache).unwrap().count(), 0, "empty tmpfs");
    assert!(sb.state.join("lower/cache/sub/page.html").exists());
}

fn holder(file: &Path) -> Child {
    let c = Command::new("sh")
        .arg("-c")
        .arg("exec 3<\"$1\"; echo ready; exec sleep 600 <&3")
        .arg("sh")
        .arg(file)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c
}

#[test]
fn down_while_a_process_holds_a_file_detaches_and_names_it() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    fs::write(cache.join("on-disk-only"), "disk").unwrap();
    let spec = spec_for(&sb, &cache, "");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("in-ram-only"), "ram").unwrap();
    let mut h = holder(&cache.join("in-ram-only"));
    let mut ready = [0u8; 6];
    h.stdout.as_mut().unwrap().read_exact(&mut ready).unwrap();
    let r = sb.run(["down".as_ref(), spec.as_os_str()]);
    let _ = h.kill();
    let _ = h.wait();
    r.code(0)
        .stdout_has("detached lazily")
        .stdout_has(&format!("pid {}", h.id()))
        .stdout_has("(sleep)");
    assert!(sb.top(&cache).is_none(), "{r}");
    assert!(
        cache.join("on-disk-only").exists(),
        "the application sees its disk directory again"
    );
    assert!(!cache.join("in-ram-only").exists());
    assert!(
        sb.mounts_at(&sb.state.join("lower/cache")).is_empty(),
        "side bind removed\n{r}"
    );
    sb.run(["status".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("absent");
}

#[test]
fn down_of_an_idle_mount_unmounts_cleanly() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    sb.run(["down".as_ref(), spec.as_os_str(), "cache".as_ref()])
        .code(0)
        .stdout_has("unmounted");
    assert!(sb
        .mounts()
        .iter()
        .all(|e| !e.source.starts_with("tmpfsctl-")
            && !e.mount_point.starts_with(sb.state.join("lower/cache"))));
    sb.run(["down".as_ref(), spec.as_os_str(), "nosuch".as_ref()])
        .code(2)
        .stderr_has("known names: cache");
    // Not mounted any more: the path is the spec's, never `-`.
    sb.run(["down".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has(&format!("cache  {}: not mounted", cache.display()));
    sb.run(["validate".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("valid, 1 mount\n");
    sb.run(["plan".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("of 1 mount up to date");
}

#[test]
fn sync_writes_ram_back_to_disk_and_propagates_deletions() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "    persist: every 15m\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("new-in-ram"), "fresh").unwrap();
    fs::write(cache.join("sub/page.html"), "updated page").unwrap();
    fs::remove_file(cache.join("index")).unwrap();
    let lower = sb.state.join("lower/cache");
    assert!(
        !lower.join("new-in-ram").exists(),
        "nothing written back before sync"
    );
    let r = sb.run([
        "sync".as_ref(),
        spec.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    r.code(0);
    assert_eq!(r.json()[0]["result"], "synced", "{r}");
    assert_eq!(fs::read_to_string(lower.join("new-in-ram")).unwrap(), "fresh");
    assert_eq!(
        fs::read_to_string(lower.join("sub/page.html")).unwrap(),
        "updated page"
    );
    assert!(!lower.join("index").exists(), "deletion propagated");
    assert_eq!(owner_of(&lower), (1234, 2345), "disk root keeps its owner");
    let j = sb
        .run([
            "status".as_ref(),
            spec.as_os_str(),
            "--format".as_ref(),
            "json".as_ref(),
        ])
        .json();
    assert_eq!(j["mounts"][0]["last_sync"]["ok"], true);
    sb.run(["status".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("last write-back (sync)");
}

#[test]
fn sync_skips_volatile_mounts_and_rejects_unknown_names() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("ram-only"), "x").unwrap();
    sb.run(["sync".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("nothing to write back");
    sb.run(["sync".as_ref(), spec.as_os_str(), "cache".as_ref()])
        .code(0)
        .stdout_has("persist: none");
    assert!(!sb.state.join("lower/cache/ram-only").exists());
    sb.run(["sync".as_ref(), spec.as_os_str(), "nosuch".as_ref()])
        .code(2)
        .stderr_has("known names: cache");
}

#[test]
fn down_writes_a_persisted_mount_back_before_unmounting() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("made-in-ram"), "keep").unwrap();
    fs::remove_file(cache.join("index")).unwrap();
    sb.run(["down".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("synced")
        .stdout_has("unmounted");
    assert!(sb.top(&cache).is_none());
    assert_eq!(
        fs::read_to_string(cache.join("made-in-ram")).unwrap(),
        "keep",
        "data reached the disk"
    );
    assert!(!cache.join("index").exists());
    assert_eq!(mode_of(&cache), 0o700);
}

#[test]
fn down_of_a_busy_persisted_mount_syncs_detaches_and_syncs_again() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("held"), "held file").unwrap();
    let mut h = holder(&cache.join("held"));
    let mut ready = [0u8; 6];
    h.stdout.as_mut().unwrap().read_exact(&mut ready).unwrap();
    let r = sb.run([
        "down".as_ref(),
        spec.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    let _ = h.kill();
    let _ = h.wait();
    r.code(0);
    let j = r.json();
    assert_eq!(j[0]["result"], "detached", "{r}");
    // Switched first, then one write-back from where the tmpfs is held.
    assert_eq!(j[0]["syncs"].as_array().unwrap().len(), 1, "{r}");
    assert!(j[0]["switch_ms"].as_f64().unwrap() < 1000.0, "{r}");
    assert_eq!(fs::read_to_string(cache.join("held")).unwrap(), "held file");
    assert!(sb.mounts().iter().all(|e| e.source != "tmpfsctl-cache"), "{r}");
}

#[test]
fn down_keeps_the_tmpfs_when_write_back_fails() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("unsaved"), "precious").unwrap();
    // The disk turns read-only: write-back must fail and nothing be lost.
    let lower = sb.state.join("lower/cache");
    use nix::mount::{mount, MsFlags};
    mount(
        None::<&str>,
        &lower,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .unwrap();
    // The application is back on its disk directory at once; the RAM copy is held
    // until its write-back succeeds.
    sb.run(["down".as_ref(), spec.as_os_str()])
        .code(1)
        .stdout_has("WRITE-BACK PENDING")
        .stdout_has("writing the RAM copy back failed");
    assert!(sb.top(&cache).is_none_or(|e| e.source != "tmpfsctl-cache"));
    assert!(!cache.join("unsaved").exists());
    let held = sb.state.join("held/cache");
    assert_eq!(sb.top(&held).unwrap().source, "tmpfsctl-cache");
    assert_eq!(fs::read_to_string(held.join("unsaved")).unwrap(), "precious");
    let j = sb
        .run([
            "status".as_ref(),
            spec.as_os_str(),
            "--format".as_ref(),
            "json".as_ref(),
        ])
        .json();
    assert_eq!(j["mounts"][0]["state"], "writeback-pending");
    assert_eq!(j["mounts"][0]["last_sync"]["ok"], false);
    // apply does not offload it again over a pending write-back.
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(3)
        .stdout_has("waits at");
    // The disk is writable again: a second `down` finishes the write-back.
    mount(
        None::<&str>,
        &lower,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    sb.run(["down".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("unmounted");
    assert_eq!(fs::read_to_string(cache.join("unsaved")).unwrap(), "precious");
    assert!(sb.mounts().iter().all(|e| e.source != "tmpfsctl-cache"));
}

#[test]
fn status_reports_state_usage_and_memory() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    sb.run(["status".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("absent");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let j = sb
        .run([
            "status".as_ref(),
            spec.as_os_str(),
            "--format".as_ref(),
            "json".as_ref(),
        ])
        .json();
    let m = &j["mounts"][0];
    assert_eq!(m["state"], "offloaded");
    assert_eq!(m["usage"]["size"], 8 << 20);
    assert!(m["usage"]["used"].as_u64().unwrap() >= 100_000);
    assert!(m["usage"]["inodes_used"].as_u64().unwrap() >= 3);
    assert!(j["memory"]["mem_total"].as_u64().unwrap() > 0);
    assert!(j["memory"]["managed_used"].as_u64().unwrap() >= 100_000);
    let r = sb.run(["status"]);
    r.code(0)
        .stdout_has("cache")
        .stdout_has("offloaded")
        .stdout_has("memory: total");
}

#[test]
fn a_concurrent_run_waits_then_fails_clearly() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    let state = tmpfsctl::state::State::new(&sb.state);
    let _held = state.lock(std::time::Duration::ZERO).unwrap();
    sb.run([
        "--wait".as_ref(),
        "1".as_ref(),
        "apply".as_ref(),
        spec.as_os_str(),
    ])
    .code(4)
    .stderr_has("another tmpfsctl");
    assert!(sb.top(&cache).is_none());
}

#[test]
fn state_dir_on_a_shared_mount_still_works() {
    // Hosts run with / shared (systemd); a mount can only be moved out of a
    // non-shared parent, and side binds must not propagate.
    let sb = Sandbox::new();
    share_sandbox(&sb);
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("private mount");
    assert_offloaded(&sb, &cache);
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("changed: no");
}

/// kill -9 right after each step, then a fresh apply must converge: one
/// tmpfs at the path, one side bind, nothing at the staging point.
#[test]
fn kill_9_after_any_step_then_reapply_converges() {
    for action in [
        "private-state-dir",
        "bind-side",
        "mount-stage",
        "seed",
        "move-into-place",
    ] {
        let sb = Sandbox::new();
        let cache = seeded_cache(&sb);
        let spec = spec_for(&sb, &cache, "");
        let mut c = sb.cmd();
        c.env(
            "TMPFSCTL_FAILPOINT",
            if action == "private-state-dir" {
                format!("after-{action}")
            } else {
                format!("after-{action}:cache")
            },
        );
        let r = sb.run_with(c, ["apply".as_ref(), spec.as_os_str()]);
        assert_eq!(r.signal, Some(9), "failpoint after-{action} did not fire\n{r}");
        let r = sb.run(["apply".as_ref(), spec.as_os_str()]);
        r.code(0);
        assert_offloaded(&sb, &cache);
        assert_eq!(
            fs::read_to_string(cache.join("sub/page.html")).unwrap(),
            "cached page",
            "after {action}"
        );
        sb.run(["apply".as_ref(), spec.as_os_str()])
            .code(0)
            .stdout_has("changed: no");
        sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
        let left: Vec<_> = sb
            .mounts()
            .into_iter()
            .filter(|e| {
                e.source.starts_with("tmpfsctl-") || e.mount_point.starts_with(sb.state.join("lower/cache"))
            })
            .collect();
        assert!(left.is_empty(), "after {action}: leftovers {left:#?}");
    }
}

#[test]
fn leftovers_of_removed_names_are_cleaned() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    let mut c = sb.cmd();
    c.env("TMPFSCTL_FAILPOINT", "after-mount-stage:cache");
    assert_eq!(
        sb.run_with(c, ["apply".as_ref(), spec.as_os_str()]).signal,
        Some(9)
    );
    let other = sb.cache_dir("var/cache/other", 0, 0, 0o755);
    let spec = sb.write_spec(
        "other.yaml",
        &format!(
            "version: 1\nmounts:\n  - name: other\n    path: {}\n    size: 4MiB\n",
            other.display()
        ),
    );
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("leftover");
    assert!(sb.mounts_at(&sb.state.join("lower/cache")).is_empty());
    assert!(sb.mounts_at(&sb.state.join("stage/cache")).is_empty());
}

/// Shares the sandbox root like a systemd host (`/` shared), so binds of
/// managed paths join peer groups unless made private.
fn share_sandbox(sb: &Sandbox) {
    use nix::mount::{mount, MsFlags};
    mount(
        Some(&sb.root),
        &sb.root,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    mount(
        None::<&str>,
        &sb.root,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .unwrap();
}

#[test]
fn a_shared_side_bind_left_by_a_crash_is_made_private_before_the_move() {
    let sb = Sandbox::new();
    share_sandbox(&sb);
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    // The state a kill between bind(2) and the make-private leaves behind:
    // the state directories are private mounts already (an apply made them
    // first), the side bind joined the shared source's peer group.
    use nix::mount::{mount, MsFlags};
    for d in ["lower", "stage"] {
        let d = sb.state.join(d);
        fs::create_dir_all(&d).unwrap();
        mount(Some(&d), &d, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
        mount(None::<&str>, &d, None::<&str>, MsFlags::MS_PRIVATE, None::<&str>).unwrap();
    }
    let lower = sb.state.join("lower/cache");
    fs::create_dir_all(&lower).unwrap();
    mount(Some(&cache), &lower, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
    assert!(!sb.top(&lower).unwrap().is_private());
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("make side bind");
    assert_offloaded(&sb, &cache);
    assert!(
        sb.state.join("lower/cache/index").exists(),
        "the side bind shows the disk, not the tmpfs"
    );
}

#[test]
fn a_lost_side_bind_under_a_live_mount_is_restored() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "    persist: on-stop\n    create: true\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("only-in-ram"), "x").unwrap();
    let lower = sb.state.join("lower/cache");
    nix::mount::umount2(&lower, nix::mount::MntFlags::MNT_DETACH).unwrap();
    // Without the side bind, write-back has nowhere safe to go.
    sb.run(["sync".as_ref(), spec.as_os_str()])
        .code(1)
        .stdout_has("not reachable");
    sb.run(["down".as_ref(), spec.as_os_str()])
        .code(1)
        .stdout_has("REFUSED")
        .stdout_has("not reachable");
    assert_eq!(
        sb.top(&cache).unwrap().source,
        "tmpfsctl-cache",
        "nothing unmounted"
    );
    // apply puts it back, and leaves the root as it was (not the `create` defaults).
    sb.run(["plan".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("restore side bind")
        .stdout_has_not("set root");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    assert_offloaded(&sb, &cache);
    assert_eq!((owner_of(&cache), mode_of(&cache)), ((1234, 2345), 0o700));
    assert!(lower.join("index").exists());
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(
        fs::read_to_string(cache.join("only-in-ram")).unwrap(),
        "x",
        "written back"
    );
}

#[test]
fn down_refuses_when_another_mount_covers_the_tmpfs() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    fs::write(cache.join("precious"), "data").unwrap();
    nix::mount::mount(
        Some("legacy"),
        &cache,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    sb.run(["down".as_ref(), spec.as_os_str()])
        .code(1)
        .stdout_has("covered by another mount");
    assert_eq!(
        sb.top(&cache).unwrap().source,
        "legacy",
        "the foreign mount was not touched"
    );
    assert!(
        sb.state.join("lower/cache/index").exists(),
        "the disk copy was not wiped"
    );
    nix::mount::umount2(&cache, nix::mount::MntFlags::empty()).unwrap();
    assert_eq!(fs::read_to_string(cache.join("precious")).unwrap(), "data");
}

#[test]
fn a_bind_of_the_tmpfs_elsewhere_is_not_a_second_copy() {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = spec_for(&sb, &cache, "");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let jail = sb.path("jail/cache");
    fs::create_dir_all(&jail).unwrap();
    nix::mount::mount(
        Some(&cache),
        &jail,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("changed: no");
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert!(
        sb.top(&cache).is_none(),
        "the tmpfs at the spec's path was taken down"
    );
}

/// A process creating `f0`, `f1`, … (each holding its number) in `dir`, a few
/// thousand a second (a pause every 50, so it still runs after `down`'s detach),
/// until `stop` exists or it made `max`; then it prints how many it made.
fn file_maker(dir: &Path, stop: &Path, max: u32) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(r#"i=0; while [ ! -e "$2" ] && [ $i -lt $3 ]; do echo $i > "$1/f$i" || exit 1; i=$((i+1)); if [ $((i % 50)) -eq 0 ]; then sleep 0.01; fi; done; echo $i"#)
        .arg("sh")
        .arg(dir)
        .arg(stop)
        .arg(max.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `down` of a persisted mount while a process keeps creating files in it, first in
/// RAM, then (after the detach) on disk: every file it made must be on disk with its
/// contents, whichever side it was created on. `held`: another process keeps a file
/// of the tmpfs open, so the mount is busy.
fn down_loses_no_file_made_meanwhile(held: bool) {
    let sb = Sandbox::new();
    let cache = seeded_cache(&sb);
    let spec = sb.one_mount_spec("cache", &cache, "256MiB", "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let mut h = held.then(|| {
        fs::write(cache.join("held"), "held file").unwrap();
        let mut h = holder(&cache.join("held"));
        let mut ready = [0u8; 6];
        h.stdout.as_mut().unwrap().read_exact(&mut ready).unwrap();
        h
    });
    let stop = sb.path("stop-making");
    // 40000 small files fit the tmpfs (a page each).
    let mut maker = file_maker(&cache, &stop, 40_000);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let r = sb.run([
        "down".as_ref(),
        spec.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    // Some more on disk, after the down.
    std::thread::sleep(std::time::Duration::from_millis(100));
    fs::write(&stop, "").unwrap();
    let mut made = String::new();
    maker.stdout.take().unwrap().read_to_string(&mut made).unwrap();
    let status = maker.wait().unwrap();
    if let Some(h) = h.as_mut() {
        let _ = h.kill();
        let _ = h.wait();
    }
    r.code(0);
    assert!(status.success(), "the file maker failed\n{r}");
    let made: u32 = made.trim().parse().unwrap();
    let j = r.json();
    let want = if held { "detached" } else { "unmounted" };
    if held {
        assert_eq!(j[0]["result"], want, "{r}");
    }
    assert!(sb.top(&cache).is_none_or(|t| t.source != "tmpfsctl-cache"));
    let lost: Vec<u32> = (0..made)
        .filter(|i| fs::read_to_string(cache.join(format!("f{i}"))).ok() != Some(format!("{i}\n")))
        .collect();
    assert!(
        lost.is_empty(),
        "made {made}; {} lost or wrong after down, first {:?}\n{r}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    assert_eq!(
        fs::read_to_string(cache.join("sub/page.html")).unwrap(),
        "cached page"
    );
    if held {
        assert_eq!(fs::read_to_string(cache.join("held")).unwrap(), "held file");
    }
    eprintln!("made {made}; second pass: {}", j[0]["syncs"][1]["stats"]);
}

#[test]
fn down_of_a_persisted_mount_loses_no_file_created_during_it() {
    down_loses_no_file_made_meanwhile(false);
}

#[test]
fn down_of_a_busy_persisted_mount_loses_no_file_created_during_or_after_the_detach() {
    down_loses_no_file_made_meanwhile(true);
}
