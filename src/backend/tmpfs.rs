//! The tmpfs backend: its mount options, how they are written for the
//! kernel, how a live tmpfs of ours is read back from mountinfo and
//! statvfs, and which changes it takes online.

use std::path::Path;

use nix::errno::Errno;
use nix::mount::MsFlags;
use serde::Serialize;

use super::Change;
use crate::host::mountinfo::MountEntry;
use crate::host::usage::Usage;
use crate::mount::RootAttrs;
use crate::spec::size::format_bytes;
use crate::spec::{Flags, Huge, MountSpec};

pub const FSTYPE: &str = "tmpfs";

/// Everything a tmpfs is mounted with. Remounts repeat all of it, because a
/// bare MS_REMOUNT resets nosuid/nodev/noexec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TmpfsOptions {
    pub size: u64,
    pub nr_inodes: Option<u64>,
    pub huge: Huge,
    pub noswap: bool,
    pub flags: Flags,
    pub root: RootAttrs,
}

impl TmpfsOptions {
    /// The options `m` asks for, with `root` as the tmpfs root.
    pub fn desired(m: &MountSpec, root: RootAttrs) -> TmpfsOptions {
        TmpfsOptions {
            size: m.size,
            nr_inodes: m.inodes,
            huge: m.huge,
            noswap: m.noswap,
            flags: m.flags,
            root,
        }
    }

    fn ms_flags(&self) -> MsFlags {
        super::ms_flags(self.flags)
    }

    /// The data string. The root's uid/gid/mode only matter at mount time
    /// (the kernel ignores them for the root on remount), and `noswap` can
    /// only be set at mount time but must be repeated on remount.
    pub fn data(&self, remount: bool) -> String {
        let mut d = format!("size={}", self.size);
        if let Some(n) = self.nr_inodes {
            d.push_str(&format!(",nr_inodes={n}"));
        }
        d.push_str(&format!(",huge={}", self.huge.name()));
        if !remount {
            let r = self.root;
            d.push_str(&format!(",mode={:o},uid={},gid={}", r.mode, r.uid, r.gid));
        }
        if self.noswap {
            d.push_str(",noswap");
        }
        d
    }

    pub fn describe(&self) -> String {
        let mut parts = vec![format!("size={}", format_bytes(self.size))];
        if let Some(n) = self.nr_inodes {
            parts.push(format!("nr_inodes={n}"));
        }
        parts.push(format!("huge={}", self.huge.name()));
        if self.noswap {
            parts.push("noswap".into());
        }
        parts.extend(self.flags.names().iter().map(|s| s.to_string()));
        parts.push(format!("root {}", self.root.describe()));
        parts.join(" ")
    }
}

pub fn mount(source: &str, target: &Path, o: &TmpfsOptions) -> anyhow::Result<()> {
    crate::mount::mount_fs(source, target, FSTYPE, o.ms_flags(), &o.data(false))
}

pub fn remount(target: &Path, o: &TmpfsOptions) -> Result<(), Errno> {
    crate::mount::remount(target, o.ms_flags(), &o.data(true))
}

/// Whether `e` is a tmpfs mounted with `source`.
pub fn is_ours(e: &MountEntry, source: &str) -> bool {
    e.fstype == FSTYPE && e.source == source
}

/// A live tmpfs of ours as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveTmpfs {
    pub dev: (u32, u32),
    /// TmpfsOptions as they are now; `size` and `nr_inodes` from statvfs.
    pub size: u64,
    pub nr_inodes: u64,
    /// `None` when the kernel reports a policy tmpfsctl does not set (deny, force).
    pub huge: Option<Huge>,
    pub noswap: bool,
    pub flags: Flags,
    pub root: RootAttrs,
    pub usage: Usage,
}

impl LiveTmpfs {
    /// Reads the tmpfs `e` mounted at `path`; `None` when it cannot be seen.
    pub fn read(e: &MountEntry, path: &Path) -> Option<LiveTmpfs> {
        let usage = Usage::of(path).ok()?;
        let root = RootAttrs::of(path).ok()?;
        let huge = match e.super_option("huge") {
            None => Some(Huge::Never),
            Some(h) => Huge::ALL.iter().find(|(n, _)| *n == h).map(|(_, v)| *v),
        };
        Some(LiveTmpfs {
            dev: e.dev,
            size: usage.size,
            nr_inodes: usage.inodes,
            huge,
            noswap: e.super_option("noswap").is_some(),
            flags: super::flags_of(e),
            root,
            usage,
        })
    }
}

/// What it takes to bring the live tmpfs to `m` online: nothing, a remount
/// with these options and changes, or a refusal saying why not.
pub fn online(
    m: &MountSpec,
    live: &LiveTmpfs,
    root: RootAttrs,
    page_size: u64,
) -> Result<Option<(TmpfsOptions, Vec<Change>)>, String> {
    let mut changes = Vec::new();
    let want_size = m.size.div_ceil(page_size) * page_size;
    if want_size != live.size {
        changes.push(Change::new(
            "size",
            format_bytes(live.size),
            format_bytes(want_size),
        ));
    }
    if let Some(n) = m.inodes {
        if n != live.nr_inodes {
            changes.push(Change::new(
                "nr_inodes",
                live.nr_inodes.to_string(),
                n.to_string(),
            ));
        }
    }
    if live.huge != Some(m.huge) {
        let from = live.huge.map(|h| h.name()).unwrap_or("other");
        changes.push(Change::new("huge", from, m.huge.name()));
    }
    changes.extend(super::flag_changes(live.flags, m.flags));

    if m.noswap != live.noswap {
        return Err(format!(
            "noswap can only be set when the tmpfs is mounted (now {}, spec {}); run `tmpfsctl down` then `apply`",
            super::onoff(live.noswap),
            super::onoff(m.noswap)
        ));
    }
    if want_size < live.usage.used && want_size != live.size {
        return Err(format!(
            "cannot shrink {} to {}: {} are in use; free space or choose a size of at least {}",
            m.path.display(),
            format_bytes(want_size),
            format_bytes(live.usage.used),
            format_bytes(live.usage.used.div_ceil(page_size) * page_size)
        ));
    }
    if let Some(n) = m.inodes {
        if n < live.usage.inodes_used {
            return Err(format!(
                "cannot lower nr_inodes of {} to {n}: {} in use",
                m.path.display(),
                crate::plural::count(live.usage.inodes_used, "inode is", "inodes are")
            ));
        }
    }
    if changes.is_empty() {
        return Ok(None);
    }
    let mut options = TmpfsOptions::desired(m, root);
    // Keep the live mount's own limits for what the spec leaves unset.
    options.nr_inodes = m.inodes.or(Some(live.nr_inodes));
    Ok(Some((options, changes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Atime;

    fn opts() -> TmpfsOptions {
        TmpfsOptions {
            size: 512 << 20,
            nr_inodes: Some(1000),
            huge: Huge::Never,
            noswap: false,
            flags: Flags {
                nosuid: true,
                nodev: true,
                noexec: false,
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
    fn data_sets_root_only_at_mount_time() {
        let o = opts();
        assert_eq!(
            o.data(false),
            "size=536870912,nr_inodes=1000,huge=never,mode=750,uid=33,gid=34"
        );
        assert_eq!(o.data(true), "size=536870912,nr_inodes=1000,huge=never");
        let o = TmpfsOptions {
            nr_inodes: None,
            noswap: true,
            huge: Huge::WithinSize,
            ..opts()
        };
        assert_eq!(o.data(true), "size=536870912,huge=within_size,noswap");
    }

    #[test]
    fn remount_flags_repeat_every_security_flag() {
        let mut o = opts();
        o.flags.noexec = true;
        o.flags.atime = Some(Atime::Noatime);
        let f = o.ms_flags();
        assert!(f.contains(MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_NOATIME));
    }
}
