//! zram devices: created through /sys/class/zram-control, configured
//! through /sys/block/zramN, and recorded under `STATE/zram/zramN/` before
//! anything else is done with them. Only a recorded device whose kernel
//! sequence number (`diskseq`) is still the recorded one is ever reset or
//! removed: a swap device, zram-generator's or another tool's devices are
//! never touched, even when one of them took over a number we gave back.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::host::mountinfo::MountTable;
use crate::state::State;

const CONTROL: &str = "/sys/class/zram-control";
const RECORD: &str = "device.json";

/// A device tmpfsctl made, as `STATE/zram/zramN/device.json` records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceRecord {
    /// The mount it was made for.
    pub name: String,
    /// N of /dev/zramN, as hot_add returned it.
    pub device: u32,
    /// The block device's sequence number, unique since boot: a number
    /// reused by a later hot_add has another one.
    pub diskseq: u64,
}

impl DeviceRecord {
    pub fn sys(&self) -> PathBuf {
        sys(self.device)
    }

    pub fn dev_node(&self) -> PathBuf {
        PathBuf::from(format!("/dev/zram{}", self.device))
    }

    /// The device's directory in the state: the record, and the symlink the
    /// filesystem is mounted through.
    pub fn dir(&self, state: &State) -> PathBuf {
        state.zram_root().join(format!("zram{}", self.device))
    }

    /// Whether /sys/block/zramN is still the device this record describes.
    fn still_ours(&self) -> bool {
        read(&self.sys().join("diskseq")).is_ok_and(|s| s.trim().parse() == Ok(self.diskseq))
    }

    /// `major:minor` of the device, as mountinfo shows a filesystem on it.
    fn dev(&self) -> Result<(u32, u32)> {
        let text = read(&self.sys().join("dev"))?;
        let (maj, min) = text
            .trim()
            .split_once(':')
            .context("no `:` in the device number")?;
        Ok((maj.parse()?, min.parse()?))
    }
}

pub fn sys(n: u32) -> PathBuf {
    PathBuf::from(format!("/sys/block/zram{n}"))
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    fs::write(path, value)
}

/// Adds a device and records it as `name`'s before returning it.
pub fn create(state: &State, name: &str) -> Result<DeviceRecord> {
    let control = Path::new(CONTROL);
    if !control.exists() {
        bail!(
            "zram is not available ({CONTROL} is missing): load the module with `modprobe zram num_devices=0` (0: no device is made that tmpfsctl does not own)"
        );
    }
    // Everything that can wait is done before the device exists: a kill between
    // its hot_add and its record leaves a device nothing will remove.
    state.ensure_dirs()?;
    let root = state.zram_root();
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let added = read(&control.join("hot_add"))?;
    let device: u32 = added
        .trim()
        .parse()
        .with_context(|| format!("{CONTROL}/hot_add answered `{}`", added.trim()))?;
    let diskseq = read(&sys(device).join("diskseq"))
        .and_then(|s| Ok(s.trim().parse::<u64>()?))
        .with_context(|| format!("the sequence number of zram{device}"));
    let rec = match diskseq {
        Ok(diskseq) => DeviceRecord {
            name: name.to_string(),
            device,
            diskseq,
        },
        Err(e) => {
            // Unrecorded, it could never be told from someone else's later.
            let _ = write(&control.join("hot_remove"), &device.to_string());
            return Err(e);
        }
    };
    if let Err(e) = save(state, &rec) {
        let _ = write(&control.join("hot_remove"), &device.to_string());
        return Err(e);
    }
    Ok(rec)
}

/// Without an fsync: a device does not outlive the kernel, and a record must be in
/// place within microseconds of its hot_add (with two fsyncs, an `apply` killed in
/// its first milliseconds left a device unrecorded in 17 of 150 tries: a hunting
/// helper's probe).
fn save(state: &State, rec: &DeviceRecord) -> Result<()> {
    let dir = rec.dir(state);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_vec_pretty(rec).expect("a DeviceRecord always serialises");
    crate::state::write_quick(&dir.join(RECORD), &json)
}

/// Sets the algorithm (before the size: the kernel takes it only then) and
/// the size. An algorithm this kernel lacks is refused with the ones it has.
pub fn configure(rec: &DeviceRecord, compression: Option<&str>, size: u64) -> Result<()> {
    let sys = rec.sys();
    if let Some(c) = compression {
        let path = sys.join("comp_algorithm");
        if let Err(e) = write(&path, c) {
            let offered = read(&path)
                .map(|t| algorithms(&t).1.join(", "))
                .unwrap_or_default();
            bail!(
                "compression `{c}` is not available in this kernel ({e} from {}); it offers: {offered}",
                path.display()
            );
        }
    }
    let path = sys.join("disksize");
    write(&path, &size.to_string()).with_context(|| format!("writing {size} to {}", path.display()))
}

/// The algorithm in use and every one offered, from `comp_algorithm`
/// (`lzo [lz4] zstd`).
pub fn algorithms(text: &str) -> (Option<String>, Vec<String>) {
    let mut current = None;
    let all = text
        .split_whitespace()
        .map(|w| match w.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
            Some(inner) => {
                current = Some(inner.to_string());
                inner.to_string()
            }
            None => w.to_string(),
        })
        .collect();
    (current, all)
}

/// The device node of `rec`, checked to be that device: mkfs writes to it.
pub fn node(rec: &DeviceRecord) -> Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let node = rec.dev_node();
    let md = fs::metadata(&node).with_context(|| format!("stat {}", node.display()))?;
    let (maj, min) = rec.dev()?;
    let rdev = md.rdev();
    let found = (
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    );
    if !md.file_type().is_block_device() || found != (maj, min) {
        bail!(
            "{} is not the block device {maj}:{min} of zram{}",
            node.display(),
            rec.device
        );
    }
    Ok(node)
}

/// The symlink to the device named after the mount's `source`: mount(2)
/// keeps the path it is given as the mount's source, so the mount table says
/// whose filesystem this is (`STATE/zram/zramN/tmpfsctl-NAME`).
pub fn link(state: &State, rec: &DeviceRecord, source: &str) -> Result<PathBuf> {
    let link = rec.dir(state).join(source);
    match fs::remove_file(&link) {
        Err(e) if e.kind() != ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", link.display()))
        }
        _ => {}
    }
    std::os::unix::fs::symlink(rec.dev_node(), &link)
        .with_context(|| format!("symlink {} -> {}", link.display(), rec.dev_node().display()))?;
    Ok(link)
}

/// The recorded devices; unreadable records are skipped (and stay).
pub fn records(state: &State) -> Vec<DeviceRecord> {
    let Ok(rd) = fs::read_dir(state.zram_root()) else {
        return Vec::new();
    };
    let mut out: Vec<DeviceRecord> = rd
        .flatten()
        .filter_map(|e| {
            let text = crate::copy::baseline::read_nofollow(&e.path().join(RECORD)).ok()?;
            serde_json::from_slice(&text).ok()
        })
        .collect();
    out.sort_by_key(|r| r.device);
    out
}

/// Resets and removes the device, then forgets it. A record whose device is
/// gone, or is somebody else's by now, is only forgotten.
pub fn remove(state: &State, rec: &DeviceRecord) -> Result<()> {
    remove_within(state, rec, RESET_PATIENCE)
}

/// [`remove`], waiting up to `patience` for the device to be closed.
fn remove_within(state: &State, rec: &DeviceRecord, patience: std::time::Duration) -> Result<()> {
    if rec.still_ours() {
        let reset = rec.sys().join("reset");
        reset_when_closed(&reset, rec.device, patience).map_err(|e| {
            let why = if e.raw_os_error() == Some(libc::EBUSY) {
                "still open (a mount of it was detached while busy, or it is mounted in another mount namespace); once it is free, the agent removes it (it tries again from time to time), or a later `down` or `apply` does".to_string()
            } else {
                e.to_string()
            };
            anyhow::anyhow!("resetting zram{} ({}): {why}", rec.device, reset.display())
        })?;
        let remove = Path::new(CONTROL).join("hot_remove");
        write(&remove, &rec.device.to_string())
            .with_context(|| format!("writing {} to {}", rec.device, remove.display()))?;
    }
    let dir = rec.dir(state);
    fs::remove_dir_all(&dir).or_else(|e| match e.kind() {
        ErrorKind::NotFound => Ok(()),
        _ => Err(e).with_context(|| format!("removing {}", dir.display())),
    })
}

/// How long a reset waits for a device to be closed. Right after an unmount
/// others open it for a moment: udev probes a block device a writer closed
/// (blkid), and btrfs-progs and blkid read every device's superblock.
pub const RESET_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Resets zramN, again while it is busy (EBUSY) for up to `patience`: not
/// when a filesystem on it still lives (a mount detached while busy), which
/// holds it until its last user goes.
fn reset_when_closed(reset: &Path, n: u32, patience: std::time::Duration) -> std::io::Result<()> {
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(5);
    loop {
        match write(reset, "1") {
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < patience && !fs_lives_on(n) =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(200));
            }
            r => return r,
        }
    }
}

/// Whether an ext4 or a btrfs is still alive on zramN (mounted, if only
/// detached): each shows in sysfs while it is.
fn fs_lives_on(n: u32) -> bool {
    let dev = format!("zram{n}");
    Path::new("/sys/fs/ext4").join(&dev).exists()
        || fs::read_dir("/sys/fs/btrfs")
            .is_ok_and(|d| d.flatten().any(|e| e.path().join("devices").join(&dev).exists()))
}

/// Whether any device is recorded.
pub fn any_recorded(state: &State) -> bool {
    fs::read_dir(state.zram_root()).is_ok_and(|mut d| d.next().is_some())
}

/// See `backend::release_unused`: the recorded devices with no filesystem
/// mounted in this mount namespace are removed, each reset waiting up to
/// `patience` for others to close it. One the kernel still holds open stays
/// recorded.
pub fn release_unused(state: &State, patience: std::time::Duration) -> Result<crate::backend::Released> {
    let mut done = crate::backend::Released::default();
    let recs = records(state);
    if recs.is_empty() {
        return Ok(done);
    }
    let table = MountTable::read(Path::new("/proc/thread-self/mountinfo"))?;
    for rec in recs {
        // btrfs shows a device number of its own, and the device by its path.
        let on = |e: &crate::host::mountinfo::MountEntry, d| {
            e.dev == d || super::btrfs_device(e) == Some(rec.device)
        };
        let mounted = rec.still_ours() && rec.dev().is_ok_and(|d| table.entries.iter().any(|e| on(e, d)));
        if mounted {
            continue;
        }
        match remove_within(state, &rec, patience) {
            Ok(()) => done
                .freed
                .push(format!("remove zram device zram{} of `{}`", rec.device, rec.name)),
            Err(e) => done.held.push(format!("{}: {e:#}", rec.name)),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithms_name_the_current_one_and_all() {
        let (cur, all) = algorithms("lzo [lzo-rle] lz4 zstd \n");
        assert_eq!(cur.as_deref(), Some("lzo-rle"));
        assert_eq!(all, ["lzo", "lzo-rle", "lz4", "zstd"]);
        assert_eq!(algorithms("").0, None);
    }

    #[test]
    fn records_are_read_back_and_removed_without_touching_a_device() {
        let dir = tempfile::tempdir().unwrap();
        let st = State::new(dir.path());
        // No zram device has this sequence number: remove only forgets it.
        let rec = DeviceRecord {
            name: "c".into(),
            device: 4000,
            diskseq: u64::MAX,
        };
        save(&st, &rec).unwrap();
        assert_eq!(records(&st), std::slice::from_ref(&rec));
        remove(&st, &rec).unwrap();
        assert!(records(&st).is_empty());
    }
}
