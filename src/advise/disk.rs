//! The block device under DIR: its write counters in `/proc/diskstats`, read at
//! the start and the end of the watch. The device is the one whose numbers are
//! DIR's filesystem's `st_dev`: a partition or a whole disk, a loop or dm device.
//! A filesystem without one (tmpfs, btrfs's anonymous devices, NFS) has none.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

/// Bytes per sector in /proc/diskstats, whatever the device's own sector size.
const SECTOR: u64 = 512;

/// One device's cumulative write counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counters {
    pub name: String,
    pub write_ops: u64,
    pub write_sectors: u64,
}

/// What the device wrote over the watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Written {
    pub device: String,
    /// Completed write requests (merged ones count once).
    pub write_ops: u64,
    pub write_bytes: u64,
}

impl Written {
    pub fn between(start: &Counters, end: &Counters) -> Written {
        Written {
            device: end.name.clone(),
            write_ops: end.write_ops.saturating_sub(start.write_ops),
            write_bytes: end.write_sectors.saturating_sub(start.write_sectors) * SECTOR,
        }
    }
}

/// The counters of the device `major:minor` in a diskstats text: fields 1–3 are
/// major, minor and name; the 8th is writes completed, the 10th sectors written.
pub fn parse(text: &str, major: u64, minor: u64) -> Option<Counters> {
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 || f[0].parse() != Ok(major) || f[1].parse() != Ok(minor) {
            return None;
        }
        Some(Counters {
            name: f[2].to_string(),
            write_ops: f[7].parse().ok()?,
            write_sectors: f[9].parse().ok()?,
        })
    })
}

/// The counters of `dev` (an `st_dev`) from `diskstats` (normally
/// /proc/diskstats); `None` when no device has its numbers.
pub fn read(diskstats: &Path, dev: u64) -> Result<Option<Counters>> {
    let text =
        std::fs::read_to_string(diskstats).with_context(|| format!("reading {}", diskstats.display()))?;
    Ok(parse(&text, libc::major(dev) as u64, libc::minor(dev) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &str = "\
 253       0 vda 45907 12395 3358706 23125 301716 187393 12874712 531245 0 278864 611043 0 0 0 0 46417 56672
   7       0 loop0 60 0 2328 11 0 0 0 0 0 40 11 0 0 0 0 0 0
   8       1 sda1 10 0 80 1 7 2 64 3
";

    #[test]
    fn a_device_is_found_by_its_numbers() {
        assert_eq!(
            parse(STATS, 253, 0),
            Some(Counters {
                name: "vda".into(),
                write_ops: 301716,
                write_sectors: 12874712
            })
        );
        assert_eq!(parse(STATS, 8, 1).map(|c| c.write_ops), Some(7));
        assert_eq!(parse(STATS, 0, 42), None);
        assert_eq!(parse("253 0 vda 1 2", 253, 0), None);
    }

    #[test]
    fn what_was_written_is_the_difference_in_bytes() {
        let a = parse(STATS, 253, 0).unwrap();
        let mut b = a.clone();
        b.write_ops += 10;
        b.write_sectors += 16;
        assert_eq!(
            Written::between(&a, &b),
            Written {
                device: "vda".into(),
                write_ops: 10,
                write_bytes: 8192
            }
        );
    }

    #[test]
    fn a_fixture_file_is_read_through_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("diskstats");
        std::fs::write(&p, STATS).unwrap();
        let dev = libc::makedev(7, 0);
        assert_eq!(read(&p, dev).unwrap().map(|c| c.name), Some("loop0".into()));
        assert!(read(&dir.path().join("missing"), dev).is_err());
    }
}
