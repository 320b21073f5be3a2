//! `backend: zram` against real zram devices, each test in its own private
//! mount namespace. A test only ever resets or removes the devices it made
//! itself, or that the binary it ran recorded in the test's own state
//! directory ([`ZramBox`] cleans them up, also when the test fails).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{mode_of, owner_of, Sandbox};

const CONTROL: &str = "/sys/class/zram-control";

/// A sandbox whose zram devices go with it: the mounts first, then each device
/// recorded in its state directory or added by the test, if it is still the
/// same device (its `diskseq`).
struct ZramBox {
    sb: Sandbox,
    own: Vec<(u32, u64)>,
}

fn diskseq(n: u32) -> Option<u64> {
    fs::read_to_string(format!("/sys/block/zram{n}/diskseq"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn remove_device(n: u32, seq: u64) {
    if diskseq(n) == Some(seq) {
        let _ = fs::write(format!("/sys/block/zram{n}/reset"), "1");
        let _ = fs::write(format!("{CONTROL}/hot_remove"), n.to_string());
    }
}

impl ZramBox {
    fn new() -> ZramBox {
        assert!(
            Path::new(CONTROL).exists(),
            "zram is not loaded: `modprobe zram num_devices=0`"
        );
        ZramBox {
            sb: Sandbox::new(),
            own: Vec::new(),
        }
    }

    /// The devices the binary recorded for this sandbox: (number, diskseq, name).
    fn recorded(&self) -> Vec<(u32, u64, String)> {
        let Ok(rd) = fs::read_dir(self.sb.state.join("zram")) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let v: serde_json::Value =
                    serde_json::from_slice(&fs::read(e.path().join("device.json")).ok()?).ok()?;
                Some((
                    v["device"].as_u64()? as u32,
                    v["diskseq"].as_u64()?,
                    v["name"].as_str()?.to_string(),
                ))
            })
            .collect()
    }

    /// A device of the test's own, as somebody else's zram would be.
    fn add_own(&mut self) -> u32 {
        let n: u32 = fs::read_to_string(format!("{CONTROL}/hot_add"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        self.own.push((n, diskseq(n).unwrap()));
        n
    }
}

impl Drop for ZramBox {
    fn drop(&mut self) {
        let mut points: Vec<PathBuf> = self.sb.mounts().into_iter().map(|e| e.mount_point).collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
        }
        for (n, seq, _) in self.recorded() {
            remove_device(n, seq);
        }
        for &(n, seq) in &self.own {
            remove_device(n, seq);
        }
    }
}

/// A text-heavy cache of ~2 MiB, owned by 1234:2345, mode 0750.
fn text_cache(sb: &Sandbox) -> PathBuf {
    let cache = sb.cache_dir("var/cache/app", 1234, 2345, 0o750);
    fs::create_dir(cache.join("sub")).unwrap();
    for i in 0..200 {
        let page = format!(
            "<html><body><p>page {i}</p>{}</body></html>\n",
            "<li>item</li>".repeat(800)
        );
        fs::write(cache.join(format!("sub/p{i}.html")), page).unwrap();
    }
    cache
}

fn zram_spec(sb: &Sandbox, cache: &Path, extra: &str) -> PathBuf {
    sb.one_mount_spec("cache", cache, "32MiB", &format!("    backend: zram\n{extra}"))
}

/// Checks a text_cache applied on zramN: the root's owner and mode and the data
/// from the disk, a second apply that changes nothing, and `status` after a
/// sync (written data reaches the device, compressed, when the page cache
/// writes it back); returns that status.
fn seeded_from_the_disk(sb: &Sandbox, cache: &Path, spec: &Path, n: u32) -> serde_json::Value {
    assert_eq!(
        owner_of(cache),
        (1234, 2345),
        "root owner from the disk directory"
    );
    assert_eq!(mode_of(cache), 0o750, "root mode from the disk directory");
    assert!(fs::read_to_string(cache.join("sub/p7.html"))
        .unwrap()
        .contains("page 7"));
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("changed: no");
    nix::unistd::syncfs(fs::File::open(cache).unwrap()).unwrap();
    let st = sb
        .run(["status", "--format", "json", spec.to_str().unwrap()])
        .code(0)
        .json();
    let m = &st["mounts"][0];
    assert_eq!(m["state"], "offloaded", "{st:#}");
    assert_eq!(m["compressed"]["device"], format!("zram{n}"), "{st:#}");
    st
}

fn gone(n: u32, seq: u64) -> bool {
    diskseq(n) != Some(seq)
}

#[test]
fn zram_apply_mounts_seeded_compressed_ext4_and_down_removes_the_device() {
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let cache = text_cache(sb);
    let spec = zram_spec(
        sb,
        &cache,
        "    compression: lz4\n    options: [nosuid, nodev, noexec]\n",
    );
    sb.run(["plan".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("mount zram tmpfsctl-cache")
        .stdout_has("compression=lz4 fs=ext4 (no journal)");
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("changed: yes");

    let at = sb.mounts_at(&cache);
    assert_eq!(at.len(), 1, "one mount, nothing stacked: {at:#?}");
    let e = &at[0];
    assert_eq!(e.fstype, "ext4");
    assert!(
        e.source.ends_with("/zram/zram") || e.source.contains("/zram/zram"),
        "{e:?}"
    );
    assert!(e.source.ends_with("/tmpfsctl-cache"), "{e:?}");
    for o in ["nosuid", "nodev", "noexec"] {
        assert!(e.has_mount_option(o), "{o}: {e:?}");
    }
    assert!(e.super_options.iter().any(|o| o == "discard"), "{e:?}");
    let recorded = zb.recorded();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let (n, seq, name) = recorded[0].clone();
    assert_eq!(name, "cache");
    assert_eq!(e.dev.1, n, "the mount is on the recorded device");
    let algorithm = fs::read_to_string(format!("/sys/block/zram{n}/comp_algorithm")).unwrap();
    assert!(algorithm.contains("[lz4]"), "{algorithm}");

    assert!(
        !cache.join("lost+found").exists(),
        "mkfs's lost+found is not the application's"
    );
    let st = seeded_from_the_disk(sb, &cache, &spec, n);
    let m = &st["mounts"][0];
    let c = &m["compressed"];
    assert_eq!(c["compression"], "lz4", "{st:#}");
    let (data, ram) = (c["data"].as_u64().unwrap(), c["ram_used"].as_u64().unwrap());
    assert!(data >= 2_000_000 && ram > 0 && ram < data, "{st:#}");
    assert!(c["ratio"].as_f64().unwrap() > 2.0, "{st:#}");
    sb.run(["status".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has(&format!("zram{n} lz4"));

    sb.run(["down".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("unmounted");
    assert!(sb.mounts_at(&cache).is_empty());
    assert!(gone(n, seq), "zram{n} was removed");
    assert!(zb.recorded().is_empty(), "its record went with it");
}

/// `fs: btrfs`: compressed by btrfs itself (zstd), its root a directory named
/// for the mount, which is how the mount table names it as ours (btrfs shows
/// the device's own path as the source).
#[test]
fn zram_btrfs_mounts_a_compressing_directory_named_for_the_mount() {
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let cache = text_cache(sb);
    let spec = zram_spec(
        sb,
        &cache,
        "    fs: btrfs\n    options: [nosuid, nodev, noexec]\n",
    );
    sb.run(["plan".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("fs=btrfs (compress-force=zstd:3)");
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("changed: yes");
    let at = sb.mounts_at(&cache);
    assert_eq!(at.len(), 1, "one mount, nothing stacked: {at:#?}");
    let e = &at[0];
    let (n, seq, _) = zb.recorded()[0].clone();
    assert_eq!(e.fstype, "btrfs");
    assert_eq!(e.source, format!("/dev/zram{n}"), "{e:?}");
    assert_eq!(e.root, Path::new("/tmpfsctl-cache"), "{e:?}");
    for o in ["compress-force=zstd:3", "discard"] {
        assert!(e.super_options.iter().any(|s| s == o), "{o}: {e:?}");
    }
    for o in ["nosuid", "nodev", "noexec"] {
        assert!(e.has_mount_option(o), "{o}: {e:?}");
    }
    assert_eq!(
        fs::read_dir(&cache).unwrap().count(),
        1,
        "only `sub`: nothing of the filesystem's own shows"
    );
    let st = seeded_from_the_disk(sb, &cache, &spec, n);
    let m = &st["mounts"][0];
    // 2.6MiB of pages in 200 files: btrfs's zstd packs them into far less RAM.
    let ram = m["compressed"]["ram_used"].as_u64().unwrap();
    assert!(ram > 0 && ram < 1 << 20, "{st:#}");

    sb.run(["down".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("unmounted");
    assert!(sb.mounts_at(&cache).is_empty());
    assert!(gone(n, seq), "zram{n} was removed");
    assert!(zb.recorded().is_empty());
}

/// What btrfs compresses fits beyond `size`; what does not compress fails the
/// seed with ENOSPC, rolled back with its device.
#[test]
fn zram_btrfs_seeds_compressible_data_beyond_its_size_and_rolls_back_what_does_not_fit() {
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let cache = text_cache(sb);
    // 24 pages of 3MiB each: 72MiB of text for a 64MiB device.
    let page = "<li>item</li>".repeat(242_000);
    for i in 0..24 {
        fs::write(cache.join(format!("big{i}.html")), format!("<p>{i}</p>{page}")).unwrap();
    }
    let spec = sb.one_mount_spec("cache", &cache, "64MiB", "    backend: zram\n    fs: btrfs\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let u = tmpfsctl::host::usage::Usage::of(&cache).unwrap();
    assert!(u.size <= 64 << 20, "{u:?}");
    let apparent: u64 = (0..24)
        .map(|i| fs::metadata(cache.join(format!("big{i}.html"))).unwrap().len())
        .sum();
    assert!(apparent > 64 << 20, "{apparent} bytes seeded into a 64MiB device");
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);

    incompressible(&cache, "r", 40, 2 << 20, 1_000_000);
    let r = sb.run(["apply".as_ref(), spec.as_os_str()]);
    r.code(3).stdout_has("filled up while seeding");
    assert!(sb.mounts_at(&cache).is_empty());
    assert!(zb.recorded().is_empty(), "no device stays recorded");
    assert!(
        fs::metadata(cache.join("r039")).unwrap().len() == 2 << 20,
        "the disk is untouched"
    );
}

#[test]
fn zram_persisted_mount_is_written_back_on_down() {
    for fs in ["ext4", "btrfs"] {
        persisted_mount_is_written_back_on_down(fs);
    }
}

fn persisted_mount_is_written_back_on_down(fs: &str) {
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let cache = text_cache(sb);
    let spec = zram_spec(sb, &cache, &format!("    persist: on-stop\n    fs: {fs}\n"));
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let (n, seq, _) = zb.recorded()[0].clone();
    fs::write(cache.join("new.json"), r#"{"written":"in RAM"}"#).unwrap();
    fs::remove_file(cache.join("sub/p3.html")).unwrap();
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert!(sb.mounts_at(&cache).is_empty());
    assert_eq!(
        fs::read_to_string(cache.join("new.json")).unwrap(),
        r#"{"written":"in RAM"}"#
    );
    assert!(
        !cache.join("sub/p3.html").exists(),
        "the deletion was written back"
    );
    assert!(!cache.join("lost+found").exists());
    assert!(gone(n, seq), "zram{n} was removed after the write-back");
}

#[test]
fn zram_seed_that_does_not_fit_is_rolled_back_with_its_device() {
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let cache = text_cache(sb);
    fs::write(cache.join("big"), vec![1u8; 12 << 20]).unwrap();
    let spec = sb.one_mount_spec("cache", &cache, "8MiB", "    backend: zram\n");
    let before: Vec<String> = zram_names();
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(3)
        .stdout_has("do not fit");
    assert!(sb.mounts_at(&cache).is_empty());
    assert!(zb.recorded().is_empty(), "no device stays recorded");
    // Other tests add devices meanwhile; only ours must not be among the new ones.
    let after = zram_names();
    assert!(
        after.iter().all(|d| before.contains(d) || !is_named_for(sb, d)),
        "{after:?}"
    );
}

fn zram_names() -> Vec<String> {
    fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("zram"))
        .collect()
}

/// Whether a device is mounted through this sandbox's state directory.
fn is_named_for(sb: &Sandbox, dev: &str) -> bool {
    sb.mounts().iter().any(|e| e.source.contains(&format!("/{dev}/")))
}

#[test]
fn zram_device_left_by_a_crash_is_removed_by_the_next_apply() {
    for fs in ["ext4", "btrfs"] {
        device_left_by_a_crash_is_removed_by_the_next_apply(fs);
    }
}

fn device_left_by_a_crash_is_removed_by_the_next_apply(fs: &str) {
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let cache = text_cache(sb);
    let spec = zram_spec(sb, &cache, &format!("    fs: {fs}\n"));
    let mut c = sb.cmd();
    c.env("TMPFSCTL_FAILPOINT", "after-mount-stage");
    let r = sb.run_with(c, ["apply".as_ref(), spec.as_os_str()]);
    assert_eq!(r.signal, Some(9), "{r}");
    let (n, seq, _) = zb.recorded()[0].clone();
    assert!(!gone(n, seq));

    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("detach unfinished tmpfs")
        .stdout_has(&format!("remove zram device zram{n} of `cache`"));
    assert!(gone(n, seq), "the crashed run's zram{n} is gone");
    let now = zb.recorded();
    assert_eq!(now.len(), 1, "{now:?}");
    let e = &sb.mounts_at(&cache)[0];
    match fs {
        "btrfs" => assert_eq!(e.source, format!("/dev/zram{}", now[0].0)),
        _ => assert_eq!(e.dev.1, now[0].0),
    }
}

/// Somebody else's zram with a filesystem, mounted whole where a mount of ours
/// goes, is theirs: neither ext4 through a link of ours nor btrfs with a root
/// directory named for a mount.
#[test]
fn someone_elses_zram_is_never_taken_for_ours() {
    for (fs, mkfs, size) in [("ext4", &["-q"][..], "16M"), ("btrfs", &["-q", "-f"][..], "128M")] {
        someone_elses_zram_with(fs, mkfs, size);
    }
}

fn someone_elses_zram_with(fs: &str, mkfs: &[&str], size: &str) {
    let mut zb = ZramBox::new();
    let n = zb.add_own();
    let sb = &zb.sb;
    let cache = text_cache(sb);
    let node = format!("/dev/zram{n}");
    fs::write(format!("/sys/block/zram{n}/disksize"), size).unwrap();
    let args: Vec<&std::ffi::OsStr> = mkfs.iter().map(|a| a.as_ref()).chain([node.as_ref()]).collect();
    crate::common::run_tool(&format!("mkfs.{fs}"), &args);
    nix::mount::mount(
        Some(node.as_str()),
        &cache,
        Some(fs),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    let spec = zram_spec(sb, &cache, &format!("    fs: {fs}\n"));
    sb.run(["apply".as_ref(), spec.as_os_str()])
        .code(3)
        .stdout_has(&format!("already a mount point ({fs} from {node})"));
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(sb.mounts_at(&cache).len(), 1, "their mount stays");
    assert_eq!(diskseq(n), Some(zb.own[0].1), "their device stays");
    assert!(zb.recorded().is_empty());
}

#[test]
fn zram_compression_this_kernel_lacks_is_refused_with_its_list() {
    let mut zb = ZramBox::new();
    // The kernel's list, from a device of the test's own.
    let n = zb.add_own();
    let offered = fs::read_to_string(format!("/sys/block/zram{n}/comp_algorithm")).unwrap();
    let offered: Vec<String> = offered
        .split_whitespace()
        .map(|w| w.trim_matches(['[', ']']).to_string())
        .collect();
    let known = ["lzo", "lzo-rle", "lz4", "lz4hc", "zstd", "deflate", "842"];
    let Some(missing) = known.iter().find(|k| !offered.iter().any(|o| o == *k)) else {
        eprintln!("this kernel offers every zram algorithm; nothing to refuse");
        return;
    };
    let sb = &zb.sb;
    let cache = text_cache(sb);
    let spec = zram_spec(sb, &cache, &format!("    compression: {missing}\n"));
    let r = sb.run(["apply".as_ref(), spec.as_os_str()]);
    r.code(3)
        .stdout_has(&format!(
            "compression `{missing}` is not available in this kernel"
        ))
        .stdout_has(&format!("it offers: {}", offered.join(", ")));
    assert!(sb.mounts_at(&cache).is_empty());
    assert!(zb.recorded().is_empty(), "the device made for it was removed");
}

/// `seed: overlay` with its upper layer on a zram device: applied without a
/// copy, written back by `down`, and the device removed after it.
#[test]
fn an_overlay_upper_layer_on_zram_is_written_back_and_its_device_removed() {
    for fs in ["ext4", "btrfs"] {
        overlay_upper_layer_on_zram(fs);
    }
}

fn overlay_upper_layer_on_zram(fs: &str) {
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let cache = text_cache(sb);
    let spec = zram_spec(
        sb,
        &cache,
        &format!("    seed: overlay\n    persist: on-stop\n    fs: {fs}\n"),
    );
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(sb.top(&cache).unwrap().fstype, "overlay");
    assert_eq!(sb.top(&sb.state.join("stage/cache")).unwrap().fstype, fs);
    assert_eq!(zb.recorded().len(), 1, "one device made");
    let st = sb.run([
        "status".as_ref(),
        "--format".as_ref(),
        "json".as_ref(),
        spec.as_os_str(),
    ]);
    assert_eq!(st.json()["mounts"][0]["state"], "offloaded", "{st}");
    assert!(st.json()["mounts"][0]["compressed"].is_object(), "{st}");
    fs::write(cache.join("sub/new.html"), "<html>new</html>").unwrap();
    fs::remove_file(cache.join("sub/p7.html")).unwrap();
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(sb.top(&cache), None);
    assert_eq!(
        fs::read_to_string(cache.join("sub/new.html")).unwrap(),
        "<html>new</html>"
    );
    assert!(!cache.join("sub/p7.html").exists());
    assert!(cache.join("sub/p8.html").exists());
    assert!(zb.recorded().is_empty(), "the device made for it was removed");
}

#[test]
fn zram_mounts_boot_through_apply_not_fstab() {
    let sb = Sandbox::new();
    let root = sb.path("root");
    crate::common::root_only_users(&root);
    fs::create_dir_all(root.join("var/cache/app")).unwrap();
    let spec = sb.one_mount_spec(
        "cache",
        Path::new("/var/cache/app"),
        "32MiB",
        "    backend: zram\n",
    );
    let install = |mode: &str| {
        sb.run([
            "boot".as_ref(),
            "install".as_ref(),
            spec.as_os_str(),
            "--mode".as_ref(),
            mode.as_ref(),
            "--root".as_ref(),
            root.as_os_str(),
        ])
    };
    let r = install("fstab");
    assert_ne!(r.code, Some(0), "{r}");
    r.stderr_has("`cache` is a zram mount, which fstab cannot express");
    assert!(!root.join("etc/fstab").exists(), "nothing written");
    install("systemd").code(0).stdout_has("changed: yes");
}

/// `n` files of `size` bytes that do not compress (xorshift output), last used
/// `since` seconds after the epoch and one second apart, oldest first:
/// eviction takes them before anything written since.
fn incompressible(dir: &Path, prefix: &str, n: usize, size: usize, since: u64) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..n {
        let mut data = Vec::with_capacity(size);
        while data.len() < size {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            data.extend_from_slice(&x.to_le_bytes());
        }
        let f = fs::File::create(dir.join(format!("{prefix}{i:03}"))).unwrap();
        std::io::Write::write_all(&mut &f, &data).unwrap();
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(since + i as u64);
        f.set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
            .unwrap();
    }
}

/// A 64MiB zram mount of an empty cache with `extra` lines (its watchdog), and
/// an agent watching it.
fn agent_on_zram(sb: &Sandbox, extra: &str) -> (PathBuf, PathBuf, crate::agent_integration::Agent) {
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    let spec = sb.one_mount_spec("cache", &cache, "64MiB", &format!("    backend: zram\n{extra}"));
    let mut agent = crate::agent_integration::Agent::start(sb, &spec, &[], &[]);
    crate::agent_integration::wait_offloaded(&mut agent, "cache");
    (cache, spec, agent)
}

/// The RAM of the device under the mount `cache`, as the agent exports it.
fn ram_of(m: &crate::agent_integration::Metrics) -> f64 {
    m.get("tmpfsctl_mount_zram_memory_bytes{name=\"cache\"}")
}

#[test]
fn zram_agent_evicts_on_the_devices_ram_not_only_on_fullness() {
    use crate::agent_integration::Agent;
    const MIB: f64 = (1 << 20) as f64;
    let zb = ZramBox::new();
    let sb = &zb.sb;
    // 64MiB of capacity, 3MiB of RAM: the byte thresholds (80%, 95%) stay far off.
    let (cache, spec, mut agent) = agent_on_zram(
        sb,
        "    watchdog: { memory: { high: 3MiB, low: 1536KiB }, action: evict }\n",
    );

    let stored =
        |m: &crate::agent_integration::Metrics| m.get("tmpfsctl_mount_zram_stored_bytes{name=\"cache\"}");

    // 4MiB of text take a fraction of that in RAM: nothing to do.
    let line: String = (0..2000)
        .map(|i| format!("<li>item {i}</li><p>lorem ipsum</p>\n"))
        .collect();
    for i in 0..64 {
        fs::write(cache.join(format!("t{i:02}.html")), &line.as_bytes()[..64 << 10]).unwrap();
    }
    let m = agent.wait_for("the text stored in the device", |m| stored(m) >= 3.9 * MIB);
    assert!(
        ram_of(&m) < 1.5 * MIB,
        "text compresses: {} bytes of RAM",
        ram_of(&m)
    );
    assert_eq!(m.actions("cache", "evict"), 0.0, "{}", agent.log());

    // 4MiB that do not compress take 4MiB of RAM, with the disk only 13% used.
    incompressible(&cache, "r", 128, 32 << 10, 1_000_000);
    let m = agent.wait_for("an eviction on RAM, and the RAM back below high", |m| {
        m.actions("cache", "evict") >= 1.0 && ram_of(m) <= 3.0 * MIB
    });
    let u = tmpfsctl::host::usage::Usage::of(&cache).unwrap();
    assert!(u.used_pct() < 20.0, "eviction was for RAM, not fullness: {u:?}");
    assert!(!cache.join("r000").exists(), "the oldest entries went first");
    let log = agent.log();
    assert!(log.contains("RAM ") && log.contains("(high 3MiB)"), "{log}");
    assert_eq!(m.state("cache"), Some("offloaded"));
    assert_eq!(agent.stop(), 0);

    // What goes is decided by the RAM: with all of it in place before the agent
    // looks (written while it is stopped), the 4MiB that do not compress go and
    // the text, newer and light in RAM, stays, where the bytes alone (RAM 5.7
    // times low) would take 80% of the data.
    let texts = || {
        (0..64)
            .filter(|i| cache.join(format!("t{i:02}.html")).exists())
            .count()
    };
    let kept = texts();
    incompressible(&cache, "s", 128, 32 << 10, 500_000);
    nix::unistd::syncfs(fs::File::open(&cache).unwrap()).unwrap();
    // The first agent's last figures must not pass for the second one's.
    fs::remove_file(sb.path("metrics.prom")).unwrap();
    let mut agent = Agent::start(sb, &spec, &[], &[]);
    let m = agent.wait_for("an eviction on RAM after the restart", |m| {
        m.actions("cache", "evict") >= 1.0 && ram_of(m) <= 1.5 * MIB
    });
    assert_eq!(texts(), kept, "no text file went\n{}", agent.log());
    assert!(
        (0..128).all(|i| !cache.join(format!("s{i:03}")).exists()),
        "every incompressible file went\n{}",
        agent.log()
    );
    assert_eq!(m.state("cache"), Some("offloaded"));
    assert_eq!(agent.stop(), 0);
}

#[test]
fn zram_agent_falls_back_to_disk_on_the_devices_ram() {
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let (cache, spec, mut agent) =
        agent_on_zram(sb, "    watchdog: { memory: { high: 2MiB }, action: fallback }\n");
    let recorded = zb.recorded();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let (n, seq, _) = recorded[0].clone();
    incompressible(&cache, "r", 16, 256 << 10, 1_000_000);
    let m = agent.wait_for("the fallback on RAM", |m| m.state("cache") == Some("fallback"));
    assert_eq!(m.actions("cache", "evict"), 0.0);
    // The application is on its disk directory again; the device went.
    assert!(sb.mounts_at(&cache).is_empty(), "{:?}", sb.mounts_at(&cache));
    assert!(gone(n, seq), "zram{n} was removed by the fallback");
    let st = sb
        .run(["status", "--format", "json", spec.to_str().unwrap()])
        .code(0)
        .json();
    let text = st.to_string();
    assert!(
        text.contains("RAM ") && text.contains("(high 2MiB)"),
        "the reason names the RAM: {st:#}"
    );
    assert_eq!(agent.stop(), 0);
}

/// `held`, a file open on zram`n` after its mount went, keeps the device; once it
/// is closed the agent frees it, with no `down` or `apply`, and says so.
fn freed_once_closed(agent: &crate::agent_integration::Agent, held: fs::File, (n, seq): (u32, u64)) {
    // Past the agent's first tries: the file still holds the filesystem.
    std::thread::sleep(Duration::from_secs(3));
    assert!(!gone(n, seq), "zram{n} went while a file on it was open");
    drop(held);
    // The line comes once the device went.
    let said = format!("remove zram device zram{n} of `cache`");
    let start = Instant::now();
    while !(gone(n, seq) && agent.log().contains(&said)) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "zram{n} was not freed once its last file was closed\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fallback while a process keeps a file open on the device: the mount is
/// detached lazily and its filesystem lives on, so the device (its RAM) cannot go
/// until the file is closed.
#[test]
fn zram_agent_frees_the_device_a_fallback_left_open_once_it_is_closed() {
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let (cache, _spec, mut agent) =
        agent_on_zram(sb, "    watchdog: { memory: { high: 2MiB }, action: fallback }\n");
    let (n, seq, _) = zb.recorded()[0].clone();
    let held = fs::File::create(cache.join("held")).unwrap();
    incompressible(&cache, "r", 16, 256 << 10, 1_000_000);
    agent.wait_for("the fallback on RAM", |m| m.state("cache") == Some("fallback"));
    assert!(sb.mounts_at(&cache).is_empty(), "{:?}", sb.mounts_at(&cache));
    freed_once_closed(&agent, held, (n, seq));
    assert_eq!(agent.stop(), 0);
}

/// The same after the operator's own `down` of a busy mount, with the agent running:
/// the agent sees the mount table change.
#[test]
fn zram_agent_frees_the_device_an_operators_down_left_open() {
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let (cache, spec, mut agent) = agent_on_zram(sb, "");
    let (n, seq, _) = zb.recorded()[0].clone();
    let held = fs::File::create(cache.join("held")).unwrap();
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert!(sb.mounts_at(&cache).is_empty(), "{:?}", sb.mounts_at(&cache));
    freed_once_closed(&agent, held, (n, seq));
    assert_eq!(agent.stop(), 0);
}

/// The agent finds the device under a btrfs (whose mount shows a device number
/// of its own) and acts on its RAM; eviction stops near memory `low`.
#[test]
fn zram_btrfs_agent_evicts_on_the_devices_ram() {
    const MIB: f64 = (1 << 20) as f64;
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let (cache, _, mut agent) = agent_on_zram(
        sb,
        "    fs: btrfs\n    watchdog: { memory: { high: 6MiB, low: 4MiB }, action: evict }\n",
    );

    let log = agent.log();
    assert!(
        log.contains("watching") && !log.contains("fanotify mark failed"),
        "the subvolume is watched, its writes wake the agent: {log}"
    );
    // 8MiB that do not compress, oldest first.
    incompressible(&cache, "r", 256, 32 << 10, 1_000_000);
    let m = agent.wait_for("an eviction on RAM, and the RAM back below high", |m| {
        m.actions("cache", "evict") >= 1.0 && ram_of(m) <= 6.0 * MIB && ram_of(m) > 0.0
    });
    assert!(!cache.join("r000").exists(), "the oldest entries went first");
    let left = (0..256)
        .filter(|i| cache.join(format!("r{i:03}")).exists())
        .count();
    assert!(
        left >= 64,
        "eviction stopped near low, it did not empty the cache: {left} of 256 left\n{}",
        agent.log()
    );
    assert_eq!(m.state("cache"), Some("offloaded"));
    assert_eq!(agent.stop(), 0);
}

/// A `fs: btrfs` mount is marked by the agent's fanotify watch like a tmpfs
/// (its root is a directory of the filesystem's own root, whose fsid fanotify
/// accepts): the change tracker runs, and a write-back reads only what changed.
#[test]
fn zram_btrfs_write_back_reads_only_what_changed_with_the_agent() {
    use crate::agent_integration::{wait_offloaded, Agent};
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let cache = text_cache(sb);
    let spec = zram_spec(sb, &cache, "    fs: btrfs\n    persist: every 1h\n");
    let mut agent = Agent::start(sb, &spec, &[], &[]);
    wait_offloaded(&mut agent, "cache");
    // The first pass after the tracker started reads the whole tree.
    sb.run(["sync".as_ref(), spec.as_os_str()]).code(0);
    fs::create_dir(cache.join("new")).unwrap();
    fs::write(cache.join("new/a.json"), "{}").unwrap();
    fs::remove_file(cache.join("sub/p9.html")).unwrap();
    sb.run(["sync".as_ref(), spec.as_os_str()])
        .code(0)
        .stdout_has("read only what changed");
    let log = agent.log();
    assert!(
        !log.contains("no change tracker") && !log.contains("mark failed"),
        "{log}"
    );
    assert_eq!(agent.stop(), 0);
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(fs::read_to_string(cache.join("new/a.json")).unwrap(), "{}");
    assert!(!cache.join("sub/p9.html").exists());
    assert!(cache.join("sub/p8.html").exists());
}

/// A btrfs subvolume made in the cache is no mount point: its files go with the
/// device. The write-back refuses it by name and keeps the RAM, instead of
/// leaving it empty on disk as it does a mount point.
#[test]
fn zram_btrfs_subvolume_in_the_cache_stops_the_write_back_and_keeps_the_ram() {
    let zb = ZramBox::new();
    let sb = &zb.sb;
    let cache = text_cache(sb);
    let spec = zram_spec(sb, &cache, "    fs: btrfs\n    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    let btrfs = |verb: &str, at: &Path| {
        crate::common::run_tool(
            "btrfs",
            &["-q".as_ref(), "subvolume".as_ref(), verb.as_ref(), at.as_os_str()],
        )
    };
    btrfs("create", &cache.join("vol"));
    fs::write(cache.join("vol/only-in-ram"), "keep me").unwrap();
    let r = sb.run(["down".as_ref(), spec.as_os_str()]);
    assert_ne!(r.code, Some(0), "{r}");
    assert!(
        r.to_string().contains("cannot write back the btrfs subvolume"),
        "{r}"
    );
    // The application is on its disk directory; the RAM copy is held.
    let held = sb.state.join("held/cache");
    assert_eq!(
        fs::read_to_string(held.join("vol/only-in-ram")).ok().as_deref(),
        Some("keep me"),
        "{r}"
    );

    // Its contents moved into a plain directory and the subvolume deleted,
    // `down` writes everything back.
    fs::create_dir(held.join("plain")).unwrap();
    // (A copy: rename(2) does not cross subvolumes.)
    fs::copy(held.join("vol/only-in-ram"), held.join("plain/only-in-ram")).unwrap();
    btrfs("delete", &held.join("vol"));
    sb.run(["down".as_ref(), spec.as_os_str()]).code(0);
    assert!(sb.mounts_at(&cache).is_empty());
    assert_eq!(
        fs::read_to_string(cache.join("plain/only-in-ram")).unwrap(),
        "keep me"
    );
    assert!(!cache.join("vol").exists());
    assert!(zb.recorded().is_empty());
}
