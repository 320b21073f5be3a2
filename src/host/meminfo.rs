//! /proc/meminfo: the RAM figures sizes and budgets are measured against.

use anyhow::{bail, Result};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemInfo {
    pub mem_total: u64,
    pub mem_available: u64,
    /// Shared memory, which includes every tmpfs page.
    pub shmem: u64,
}

impl MemInfo {
    pub fn parse(text: &str) -> Result<MemInfo> {
        let field = |key: &str| -> Option<u64> {
            text.lines().find_map(|l| {
                let rest = l.strip_prefix(key)?.strip_prefix(':')?;
                let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                Some(kib * 1024)
            })
        };
        let (Some(mem_total), Some(mem_available), Some(shmem)) =
            (field("MemTotal"), field("MemAvailable"), field("Shmem"))
        else {
            bail!("MemTotal, MemAvailable or Shmem missing");
        };
        Ok(MemInfo {
            mem_total,
            mem_available,
            shmem,
        })
    }
}

/// Bytes waiting to be written to some disk, `Dirty` plus `Writeback` of
/// /proc/meminfo's `text`; `None` if either is missing.
pub fn unwritten(text: &str) -> Option<u64> {
    let field = |key: &str| -> Option<u64> {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
        })
    };
    Some((field("Dirty")? + field("Writeback")?) * 1024)
}

/// [`unwritten`] of this host's /proc/meminfo.
pub fn unwritten_now() -> Option<u64> {
    unwritten(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritten_is_dirty_plus_writeback() {
        let text = "Dirty:              1204 kB\nWriteback:            12 kB\nWritebackTmp:        7 kB\n";
        assert_eq!(unwritten(text), Some(1216 * 1024));
        assert_eq!(unwritten("Dirty: 5 kB\n"), None);
        assert_eq!(unwritten("WritebackTmp: 5 kB\nDirty: 5 kB\n"), None);
    }

    #[test]
    fn parses_kib_fields() {
        let text = "MemTotal:       24684092 kB\nMemFree:        1 kB\nMemAvailable:   23000000 kB\nShmem:              8804 kB\n";
        let m = MemInfo::parse(text).unwrap();
        assert_eq!(m.mem_total, 24684092 * 1024);
        assert_eq!(m.mem_available, 23000000 * 1024);
        assert_eq!(m.shmem, 8804 * 1024);
    }

    #[test]
    fn missing_field_is_an_error() {
        assert!(MemInfo::parse("MemTotal: 1 kB\n").is_err());
        assert!(MemInfo::parse("ShmemHugePages: 0 kB\nMemTotal: 1 kB\nMemAvailable: 1 kB\n").is_err());
    }
}
