//! The zram backend: a compressed RAM block device carrying an ext4 without
//! a journal, or a btrfs compressing with zstd by itself. What it holds takes
//! the RAM of its compressed size (`mm_stat`), so a compressible cache fits
//! in less memory than on a tmpfs.
//!
//! The mount table names a mount of ours, as it does a tmpfs's `tmpfsctl-NAME`,
//! so a zram mounted by anybody else is never taken for ours:
//! - ext4: the source is the symlink `STATE/zram/zramN/tmpfsctl-NAME` (see
//!   [`device::link`]); mount(2) keeps the path it was given.
//! - btrfs shows the device's own path (`/dev/zramN`: it resolves links and
//!   renames the device at every scan), so what is mounted is the directory
//!   `tmpfsctl-NAME` of the filesystem, which the mount table shows as the
//!   mount's root.

mod device;

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use nix::errno::Errno;
use serde::Serialize;

use super::Change;
use crate::host::mountinfo::MountEntry;
use crate::host::usage::Usage;
use crate::mount::RootAttrs;
use crate::spec::size::format_bytes;
use crate::spec::{Flags, MountSpec, ZramFs, SOURCE_PREFIX};
use crate::state::State;

pub use device::{any_recorded, release_unused, RESET_PATIENCE};

/// The backend's name, as `plan` shows it.
pub const NAME: &str = "zram";

/// The mount data: freed blocks are discarded, which
/// gives their compressed pages back to the kernel (without it, deleted files
/// keep their RAM). btrfs compresses everything it writes with zstd at its
/// default level, even what its first bytes make look incompressible.
/// Synchronous discard: btrfs's `discard=async` waits minutes before it gives
/// freed blocks back, and the agent's eviction needs the RAM back at once.
fn data(fs: ZramFs) -> &'static str {
    match fs {
        ZramFs::Ext4 => "discard",
        ZramFs::Btrfs => "compress-force=zstd:3,discard",
    }
}

/// Everything a zram mount is made with. Size, inodes, compression and
/// filesystem are fixed when the device is made; only the flags change online.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ZramOptions {
    /// The device's size (`disksize`): what it can hold uncompressed.
    pub size: u64,
    /// mkfs's inode count; `None`: its default for the size.
    pub nr_inodes: Option<u64>,
    /// `None`: the kernel's default algorithm.
    pub compression: Option<String>,
    pub fs: ZramFs,
    pub flags: Flags,
    pub root: RootAttrs,
}

impl ZramOptions {
    pub fn desired(m: &MountSpec, root: RootAttrs) -> ZramOptions {
        ZramOptions {
            size: m.size,
            nr_inodes: m.inodes,
            compression: m.compression.clone(),
            fs: m.fs,
            flags: m.flags,
            root,
        }
    }

    pub fn describe(&self) -> String {
        let mut parts = vec![
            format!("size={}", format_bytes(self.size)),
            format!(
                "compression={}",
                self.compression.as_deref().unwrap_or("kernel-default")
            ),
            match self.fs {
                ZramFs::Ext4 => "fs=ext4 (no journal)".to_string(),
                ZramFs::Btrfs => "fs=btrfs (compress-force=zstd:3)".to_string(),
            },
        ];
        if let Some(n) = self.nr_inodes {
            parts.push(format!("inodes={n}"));
        }
        parts.extend(self.flags.names().iter().map(|s| s.to_string()));
        parts.push(format!("root {}", self.root.describe()));
        parts.join(" ")
    }

    /// mkfs's arguments for the device `node`.
    fn mkfs_args(&self, node: &Path) -> Vec<String> {
        match self.fs {
            ZramFs::Ext4 => self.mkfs_ext4_args(node),
            ZramFs::Btrfs => [
                "-q",
                "-f",
                // Data and metadata share their block groups: a full cache
                // meets ENOSPC when its size is used, not when one kind's
                // groups are (unshared, a 64MiB one took 37MiB of files).
                "--mixed",
                // One copy of everything: a second one costs RAM, and RAM
                // does not lose blocks.
                "-m",
                "single",
                "-d",
                "single",
                // A new zram device holds nothing to discard.
                "--nodiscard",
                "-L",
                "tmpfsctl",
            ]
            .iter()
            .map(|a| a.to_string())
            .chain([node.display().to_string()])
            .collect(),
        }
    }

    fn mkfs_ext4_args(&self, node: &Path) -> Vec<String> {
        let r = self.root;
        let mut args = vec![
            "-q".to_string(),
            "-F".into(),
            // Every block is written once, and nothing survives a reboot anyway.
            "-O".into(),
            "^has_journal".into(),
            // No blocks kept for root: the cache may use all of `size`.
            "-m".into(),
            "0".into(),
            // Nanosecond timestamps (an older mke2fs gives a small filesystem 128-byte
            // inodes, whose times keep whole seconds): what changed after a moment
            // must have a later ctime than it.
            "-I".into(),
            "256".into(),
            // Initialised now, not by a kernel thread writing in the background.
            "-E".into(),
            format!("root_owner={}:{},lazy_itable_init=0", r.uid, r.gid),
            "-L".into(),
            "tmpfsctl".into(),
        ];
        if let Some(n) = self.nr_inodes {
            args.extend(["-N".into(), n.to_string()]);
        }
        args.push(node.display().to_string());
        args
    }
}

/// Makes a device for `source` (`tmpfsctl-NAME`), its filesystem, and mounts
/// it at `target` with the root as the options say. On failure the device is
/// removed again.
pub fn mount(source: &str, target: &Path, o: &ZramOptions, state: &State) -> Result<()> {
    make(source, target, o, state).map(drop)
}

fn make(source: &str, target: &Path, o: &ZramOptions, state: &State) -> Result<device::DeviceRecord> {
    let name = source
        .strip_prefix(SOURCE_PREFIX)
        .with_context(|| format!("`{source}` is not a source of tmpfsctl's"))?;
    let rec = device::create(state, name)?;
    match build(&rec, source, target, o, state) {
        Ok(()) => Ok(rec),
        Err(e) => Err(match device::remove(state, &rec) {
            Ok(()) => e,
            Err(re) => e.context(format!("and removing zram{} failed: {re:#}", rec.device)),
        }),
    }
}

/// A zram filesystem for a measurement (`tmpfsctl bench --backend zram`),
/// made as `apply` makes one, in the caller's (private) mount namespace. Its
/// device is recorded like a mount's, so one left by a killed run is removed
/// by the next `apply` or `down`; dropping it unmounts and removes it.
pub struct Scratch {
    rec: device::DeviceRecord,
    target: std::path::PathBuf,
    state: State,
}

impl Scratch {
    pub fn new(source: &str, target: &Path, o: &ZramOptions, state: &State) -> Result<Scratch> {
        // Between its record and its mount a device is in use by nobody the kernel
        // knows of: an agent freeing unused devices must not take it meanwhile.
        let _lock = state
            .lock(std::time::Duration::from_secs(10))
            .context("waiting for the state lock to make a zram device")?;
        Ok(Scratch {
            rec: make(source, target, o, state)?,
            target: target.to_path_buf(),
            state: state.clone(),
        })
    }

    /// What the device holds now, and the RAM it takes.
    pub fn compressed(&self) -> Result<Compressed> {
        let path = self.rec.sys().join("mm_stat");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let mm = MmStat::parse(&text)
            .with_context(|| format!("{}: unexpected `{}`", path.display(), text.trim()))?;
        let algorithm = std::fs::read_to_string(self.rec.sys().join("comp_algorithm")).unwrap_or_default();
        Ok(Compressed::new(
            self.rec.device,
            device::algorithms(&algorithm).0,
            mm,
        ))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        crate::mount::unmount_or_detach(&self.target);
        if let Err(e) = device::remove(&self.state, &self.rec) {
            tracing::warn!("{e:#}");
        }
    }
}

fn build(
    rec: &device::DeviceRecord,
    source: &str,
    target: &Path,
    o: &ZramOptions,
    state: &State,
) -> Result<()> {
    device::configure(rec, o.compression.as_deref(), o.size)?;
    let node = device::node(rec)?;
    run(&format!("mkfs.{}", o.fs.name()), &o.mkfs_args(&node), o.fs)?;
    let flags = super::ms_flags(o.flags);
    match o.fs {
        ZramFs::Ext4 => {
            let link = device::link(state, rec, source)?;
            crate::mount::mount_fs(&link.to_string_lossy(), target, o.fs.name(), flags, data(o.fs))?;
        }
        ZramFs::Btrfs => {
            // The mount's root is a directory of the filesystem's own root,
            // named for the mount: its files keep the filesystem's fsid, which
            // fanotify needs to mark the filesystem (a subvolume has its own).
            crate::mount::mount_fs(&node.to_string_lossy(), target, o.fs.name(), flags, data(o.fs))?;
            let root = target.join(source);
            let tree = std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&root)
                .with_context(|| format!("creating {}", root.display()))
                .and_then(|()| crate::mount::clone_tree(&root));
            // Lazily: a process that wandered into the staging point must
            // not keep the whole filesystem mounted in the mount's place.
            crate::mount::detach(target)?;
            crate::mount::attach_tree(tree?, target)?;
        }
    }
    finish_root(target, o.fs, o.root).inspect_err(|_| crate::mount::unmount_or_detach(target))
}

/// Runs a tool of the filesystem's package.
fn run(tool: &str, args: &[String], fs: ZramFs) -> Result<()> {
    let package = match fs {
        ZramFs::Ext4 => "e2fsprogs",
        ZramFs::Btrfs => "btrfs-progs",
    };
    let out = Command::new(tool)
        .args(args)
        .output()
        .with_context(|| format!("running {tool} ({package}) {}", args.join(" ")))?;
    if !out.status.success() {
        anyhow::bail!(
            "{tool} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The root as the spec says, without ext4's `lost+found`: the cache is the
/// application's directory, and a write-back would copy it to the disk.
fn finish_root(target: &Path, fs: ZramFs, root: RootAttrs) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if fs == ZramFs::Ext4 {
        let lost = target.join("lost+found");
        std::fs::remove_dir(&lost).with_context(|| format!("removing {}", lost.display()))?;
    }
    std::os::unix::fs::chown(target, Some(root.uid), Some(root.gid))
        .with_context(|| format!("chown {}:{} {}", root.uid, root.gid, target.display()))?;
    std::fs::set_permissions(target, std::fs::Permissions::from_mode(root.mode))
        .with_context(|| format!("chmod {:04o} {}", root.mode, target.display()))
}

pub fn remount(target: &Path, o: &ZramOptions) -> Result<(), Errno> {
    crate::mount::remount(target, super::ms_flags(o.flags), data(o.fs))
}

/// The `tmpfsctl-NAME` of a zram mount of ours: from its source
/// `…/zram/zramN/tmpfsctl-NAME` (ext4), or from its root, the directory
/// `/tmpfsctl-NAME` of `/dev/zramN` (btrfs); `None` for any other mount.
pub fn source_of(e: &MountEntry) -> Option<&str> {
    if e.fstype == ZramFs::Btrfs.name() {
        let source = e.root.to_str()?.strip_prefix('/')?;
        let one = !source.contains('/') && source.starts_with(SOURCE_PREFIX);
        return (one && btrfs_device(e).is_some()).then_some(source);
    }
    if e.fstype != ZramFs::Ext4.name() {
        return None;
    }
    let (dir, source) = e.source.rsplit_once('/')?;
    let (parent, dev) = dir.rsplit_once('/')?;
    let numbered = dev
        .strip_prefix("zram")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    (numbered && parent.ends_with("/zram") && source.starts_with(SOURCE_PREFIX)).then_some(source)
}

pub fn is_ours(e: &MountEntry, source: &str) -> bool {
    source_of(e) == Some(source)
}

/// N of the `/dev/zramN` a btrfs mount shows as its source.
fn btrfs_device(e: &MountEntry) -> Option<u32> {
    let n = e.source.strip_prefix("/dev/zram")?;
    n.bytes().all(|b| b.is_ascii_digit()).then(|| n.parse().ok())?
}

/// N of /dev/zramN, the device under the zram mount `e`. ext4's mount shows
/// the device's number; btrfs's is a number of its own (and its files'
/// another again), so its source names the device.
pub fn device_of(e: &MountEntry) -> Option<u32> {
    if e.fstype == ZramFs::Btrfs.name() {
        return btrfs_device(e);
    }
    number_of(e.dev)
}

/// A live zram mount of ours as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveZram {
    pub dev: (u32, u32),
    /// N of /dev/zramN.
    pub device: u32,
    /// `disksize`.
    pub size: u64,
    pub compression: Option<String>,
    pub fs: String,
    pub flags: Flags,
    pub root: RootAttrs,
    pub usage: Usage,
    pub mm: MmStat,
}

impl LiveZram {
    /// Reads the zram mount `e` at `path`; `None` when it cannot be seen.
    pub fn read(e: &MountEntry, path: &Path) -> Option<LiveZram> {
        let device = device_of(e)?;
        let sys = device::sys(device);
        let text = |f: &str| std::fs::read_to_string(sys.join(f)).ok();
        Some(LiveZram {
            dev: e.dev,
            device,
            size: text("disksize")?.trim().parse().ok()?,
            compression: device::algorithms(&text("comp_algorithm")?).0,
            fs: e.fstype.clone(),
            flags: super::flags_of(e),
            root: RootAttrs::of(path).ok()?,
            usage: Usage::of(path).ok()?,
            mm: MmStat::parse(&text("mm_stat")?)?,
        })
    }

    pub fn compressed(&self) -> Compressed {
        Compressed::new(self.device, self.compression.clone(), self.mm)
    }
}

/// N of the zram device `major:minor`.
fn number_of(dev: (u32, u32)) -> Option<u32> {
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{}:{}", dev.0, dev.1)).ok()?;
    sys.file_name()?.to_str()?.strip_prefix("zram")?.parse().ok()
}

/// What /dev/zramN holds now (the agent's metrics); `None` when there is no
/// such device.
pub fn compressed_of(device: u32) -> Option<Compressed> {
    let sys = device::sys(device);
    let text = |f: &str| std::fs::read_to_string(sys.join(f)).ok();
    let mm = MmStat::parse(&text("mm_stat")?)?;
    Some(Compressed::new(
        device,
        device::algorithms(&text("comp_algorithm")?).0,
        mm,
    ))
}

/// The first fields of /sys/block/zramN/mm_stat (Documentation/admin-guide/blockdev/zram.rst).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MmStat {
    /// Uncompressed bytes stored.
    pub orig_data_size: u64,
    /// Their compressed size.
    pub compr_data_size: u64,
    /// RAM taken, allocator overhead included: the real cost.
    pub mem_used_total: u64,
}

impl MmStat {
    pub fn parse(text: &str) -> Option<MmStat> {
        let mut f = text.split_whitespace().map(|w| w.parse::<u64>());
        Some(MmStat {
            orig_data_size: f.next()?.ok()?,
            compr_data_size: f.next()?.ok()?,
            mem_used_total: f.next()?.ok()?,
        })
    }
}

/// What `status` and the metrics show of a compressed mount.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Compressed {
    pub device: String,
    pub compression: Option<String>,
    /// Bytes stored, uncompressed.
    pub data: u64,
    /// Their compressed size.
    pub compressed: u64,
    /// RAM taken: what the mount really costs.
    pub ram_used: u64,
    /// `data / ram_used`, two decimals; `None` while nothing is stored.
    pub ratio: Option<f64>,
}

impl Compressed {
    fn new(device: u32, compression: Option<String>, mm: MmStat) -> Compressed {
        Compressed {
            device: format!("zram{device}"),
            compression,
            data: mm.orig_data_size,
            compressed: mm.compr_data_size,
            ram_used: mm.mem_used_total,
            // Nothing stored, nothing compressed: no ratio rather than 0 or inf.
            ratio: (mm.mem_used_total > 0)
                .then(|| (mm.orig_data_size as f64 / mm.mem_used_total as f64 * 100.0).round() / 100.0),
        }
    }
}

/// What it takes to bring the live mount to `m` online: a remount for the
/// flags, or a refusal when what the device was made with changed.
pub fn online(
    m: &MountSpec,
    live: &LiveZram,
    root: RootAttrs,
    page_size: u64,
) -> Result<Option<(ZramOptions, Vec<Change>)>, String> {
    let fixed = |what: &str, now: String, want: String| {
        format!(
            "the zram device of {} was made with {what} {now}, the spec says {want}; a device cannot change that: `tmpfsctl down {}`, then `apply`",
            m.path.display(),
            m.name
        )
    };
    // The kernel rounds disksize up to whole pages.
    let want_size = m.size.div_ceil(page_size) * page_size;
    if want_size != live.size {
        return Err(fixed("size", format_bytes(live.size), format_bytes(want_size)));
    }
    if let Some(c) = m
        .compression
        .as_ref()
        .filter(|c| live.compression.as_ref() != Some(*c))
    {
        let now = live
            .compression
            .clone()
            .unwrap_or_else(|| "an unknown algorithm".into());
        return Err(fixed("compression", now, c.clone()));
    }
    if live.fs != m.fs.name() {
        return Err(fixed("fs", live.fs.clone(), m.fs.name().into()));
    }
    // mkfs rounds the inode count up to whole groups: only fewer than asked is a change.
    if let Some(n) = m.inodes.filter(|n| *n > live.usage.inodes) {
        return Err(fixed("inodes", live.usage.inodes.to_string(), n.to_string()));
    }
    let changes = super::flag_changes(live.flags, m.flags);
    Ok((!changes.is_empty()).then(|| (ZramOptions::desired(m, root), changes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::mountinfo::MountTable;

    #[test]
    fn mm_stat_gives_data_compressed_and_ram() {
        let mm = MmStat::parse(
            "   73728      913    86016        0    86016        7        0        0        0\n",
        )
        .unwrap();
        assert_eq!(
            mm,
            MmStat {
                orig_data_size: 73728,
                compr_data_size: 913,
                mem_used_total: 86016
            }
        );
        assert_eq!(MmStat::parse("1 2"), None);
        assert_eq!(MmStat::parse("1 x 3"), None);
    }

    #[test]
    fn only_a_mount_through_our_link_is_ours() {
        let t = MountTable::parse(
            "\
40 22 253:1 / /c rw,nosuid,nodev - ext4 /run/tmpfsctl/zram/zram1/tmpfsctl-c rw,discard
41 22 253:0 / /d rw - ext4 /dev/zram0 rw
42 22 253:2 / /e rw - xfs /run/tmpfsctl/zram/zram2/tmpfsctl-e rw
43 22 253:3 / /f rw - ext4 /run/tmpfsctl/zram/zramx/tmpfsctl-f rw
44 22 0:40 / /g rw - tmpfs tmpfsctl-g rw
45 22 0:41 /tmpfsctl-h /h rw - btrfs /dev/zram4 rw,compress-force=zstd:3,discard,subvolid=256,subvol=/tmpfsctl-h
46 22 0:42 / /i rw - btrfs /dev/zram5 rw,subvolid=5,subvol=/
47 22 0:43 /tmpfsctl-j /j rw - btrfs /dev/sda1 rw
48 22 0:44 /a/tmpfsctl-k /k rw - btrfs /dev/zram6 rw
49 22 0:45 /tmpfsctl-l /l rw - ext4 /dev/zram7 rw
50 22 0:46 /cache /m rw - btrfs /dev/zram8 rw
51 22 0:47 /tmpfsctl-n /n rw - btrfs /dev/zram9x rw
",
        )
        .unwrap();
        let e = |id: u32| t.entries.iter().find(|e| e.id == id).unwrap();
        assert!(is_ours(e(40), "tmpfsctl-c"));
        assert_eq!(crate::backend::managed_name(e(40)), Some("c"));
        assert!(!is_ours(e(40), "tmpfsctl-d"));
        assert!(is_ours(e(45), "tmpfsctl-h"));
        assert_eq!(crate::backend::managed_name(e(45)), Some("h"));
        assert_eq!(device_of(e(45)), Some(4));
        for id in [41, 42, 43, 44, 46, 47, 48, 49, 50, 51] {
            assert_eq!(source_of(e(id)), None, "{:?}", e(id));
        }
        assert_eq!(crate::backend::managed_name(e(44)), Some("g"));
    }

    fn opts() -> ZramOptions {
        ZramOptions {
            size: 64 << 20,
            nr_inodes: Some(5000),
            compression: Some("lz4".into()),
            fs: ZramFs::Ext4,
            flags: Flags {
                nosuid: true,
                nodev: true,
                noexec: true,
                atime: None,
            },
            root: RootAttrs {
                uid: 33,
                gid: 34,
                mode: 0o750,
            },
        }
    }

    #[test]
    fn mkfs_makes_ext4_without_a_journal_owned_as_the_root() {
        let args = opts().mkfs_args(Path::new("/dev/zram3")).join(" ");
        assert_eq!(
            args,
            "-q -F -O ^has_journal -m 0 -I 256 -E root_owner=33:34,lazy_itable_init=0 -L tmpfsctl -N 5000 /dev/zram3"
        );
    }

    #[test]
    fn mkfs_makes_btrfs_with_shared_groups_and_one_copy() {
        let o = ZramOptions {
            fs: ZramFs::Btrfs,
            nr_inodes: None,
            ..opts()
        };
        assert_eq!(
            o.mkfs_args(Path::new("/dev/zram3")).join(" "),
            "-q -f --mixed -m single -d single --nodiscard -L tmpfsctl /dev/zram3"
        );
        assert!(
            o.describe().contains("fs=btrfs (compress-force=zstd:3)"),
            "{}",
            o.describe()
        );
        assert_eq!(data(ZramFs::Btrfs), "compress-force=zstd:3,discard");
    }

    fn live() -> LiveZram {
        LiveZram {
            dev: (253, 1),
            device: 1,
            size: 64 << 20,
            compression: Some("lz4".into()),
            fs: "ext4".into(),
            flags: Flags {
                nosuid: true,
                nodev: true,
                noexec: false,
                atime: Some(crate::spec::Atime::Relatime),
            },
            root: opts().root,
            usage: Usage {
                size: 60 << 20,
                used: 1 << 20,
                inodes: 16384,
                inodes_used: 11,
            },
            mm: MmStat {
                orig_data_size: 3000,
                compr_data_size: 1000,
                mem_used_total: 1500,
            },
        }
    }

    fn spec() -> MountSpec {
        MountSpec {
            backend: crate::spec::Backend::Zram,
            compression: Some("lz4".into()),
            ..MountSpec::for_test("c", "/c", 64 << 20)
        }
    }

    #[test]
    fn only_flags_change_online() {
        let root = opts().root;
        assert_eq!(online(&spec(), &live(), root, 4096), Ok(None));
        let mut m = spec();
        m.flags.noexec = true;
        let (o, changes) = online(&m, &live(), root, 4096).unwrap().unwrap();
        assert!(o.flags.noexec);
        assert_eq!(changes, [Change::new("noexec", "off", "on")]);
        for (m, why) in [
            (
                MountSpec {
                    size: 128 << 20,
                    ..spec()
                },
                "made with size 64MiB",
            ),
            (
                MountSpec {
                    compression: Some("zstd".into()),
                    ..spec()
                },
                "compression lz4",
            ),
            (
                MountSpec {
                    inodes: Some(20000),
                    ..spec()
                },
                "inodes 16384",
            ),
        ] {
            let err = online(&m, &live(), root, 4096).unwrap_err();
            assert!(err.contains(why) && err.contains("tmpfsctl down c"), "{err}");
        }
    }

    #[test]
    fn the_ratio_is_data_over_ram_used() {
        let c = live().compressed();
        assert_eq!(
            (c.device.as_str(), c.ram_used, c.ratio),
            ("zram1", 1500, Some(2.0))
        );
        let mut l = live();
        l.mm = MmStat {
            orig_data_size: 0,
            compr_data_size: 0,
            mem_used_total: 0,
        };
        assert_eq!(l.compressed().ratio, None);
    }
}
