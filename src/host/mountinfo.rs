//! /proc/self/mountinfo: which mounts exist, stacked how, with which options.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub id: u32,
    pub parent: u32,
    /// `major:minor` of the filesystem.
    pub dev: (u32, u32),
    /// Path of the mount's root within its filesystem (`/` for a whole tmpfs).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options: rw, nosuid, nodev, noexec, relatime, ...
    pub mount_options: Vec<String>,
    /// Propagation tags such as `shared:1`; empty when private.
    pub optional: Vec<String>,
    pub fstype: String,
    pub source: String,
    /// Superblock options: size=, nr_inodes=, mode=, uid=, huge=, noswap, ...
    pub super_options: Vec<String>,
}

impl MountEntry {
    pub fn has_mount_option(&self, name: &str) -> bool {
        self.mount_options.iter().any(|o| o == name)
    }

    pub fn super_option(&self, key: &str) -> Option<&str> {
        self.super_options.iter().find_map(|o| {
            if o == key {
                Some("")
            } else {
                o.strip_prefix(key)?.strip_prefix('=')
            }
        })
    }

    /// Neither sends nor receives mount propagation (no peer group, no master).
    pub fn is_private(&self) -> bool {
        !self
            .optional
            .iter()
            .any(|t| t.starts_with("shared:") || t.starts_with("master:"))
    }
}

#[derive(Debug, Clone, Default)]
pub struct MountTable {
    pub entries: Vec<MountEntry>,
}

impl MountTable {
    /// Reads a mountinfo file. Paths in it are bytes: anybody who may rename a
    /// directory above a mount point (or mount FUSE) chooses them, so one that
    /// is not UTF-8 must neither fail the read nor lose its bytes. Those bytes
    /// are written in mountinfo's own `\ooo` form, which [`MountTable::parse`]
    /// decodes back; the kernel writes a backslash itself as `\134`, so this
    /// adds no ambiguity.
    pub fn read(path: &Path) -> Result<MountTable> {
        use std::fmt::Write;
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let mut text = String::with_capacity(bytes.len());
        for chunk in bytes.utf8_chunks() {
            text.push_str(chunk.valid());
            for b in chunk.invalid() {
                let _ = write!(text, "\\{b:03o}");
            }
        }
        MountTable::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<MountTable> {
        let entries = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| parse_line(l).with_context(|| format!("line {}: {l:?}", i + 1)))
            .collect::<Result<_>>()?;
        Ok(MountTable { entries })
    }

    /// The visible (topmost) mount at exactly `path`, if `path` is a mount point.
    pub fn top_at(&self, path: &Path) -> Option<&MountEntry> {
        let here: Vec<&MountEntry> = self.entries.iter().filter(|e| e.mount_point == path).collect();
        here.iter()
            .find(|e| !here.iter().any(|o| o.parent == e.id))
            .copied()
    }

    /// All mounts at exactly `path`, bottom first.
    pub fn stack_at(&self, path: &Path) -> Vec<&MountEntry> {
        let here: Vec<&MountEntry> = self.entries.iter().filter(|e| e.mount_point == path).collect();
        let mut ordered = Vec::new();
        let mut cur = here
            .iter()
            .find(|e| !here.iter().any(|o| o.id == e.parent))
            .copied();
        while let Some(e) = cur {
            ordered.push(e);
            cur = here.iter().find(|o| o.parent == e.id).copied();
        }
        ordered
    }
}

fn parse_line(line: &str) -> Result<MountEntry> {
    let (left, right) = line.split_once(" - ").context("missing ` - ` separator")?;
    let l: Vec<&str> = left.split(' ').collect();
    let r: Vec<&str> = right.split(' ').collect();
    if l.len() < 6 || r.len() < 3 {
        bail!("too few fields");
    }
    let (major, minor) = l[2].split_once(':').context("bad major:minor")?;
    Ok(MountEntry {
        id: l[0].parse().context("bad mount id")?,
        parent: l[1].parse().context("bad parent id")?,
        dev: (major.parse()?, minor.parse()?),
        root: unescape(l[3]),
        mount_point: unescape(l[4]),
        mount_options: l[5].split(',').map(str::to_string).collect(),
        optional: l[6..].iter().map(|s| s.to_string()).collect(),
        fstype: r[0].to_string(),
        source: String::from_utf8_lossy(&unescape_bytes(r[1])).into_owned(),
        super_options: r[2].split(',').map(str::to_string).collect(),
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_bytes(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn unescape(s: &str) -> PathBuf {
    PathBuf::from(OsString::from_vec(unescape_bytes(s)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    const SAMPLE: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:39 / /var/cache/nginx rw,nosuid,nodev,relatime shared:20 - tmpfs tmpfsctl-nginx rw,size=524288k,nr_inodes=204800,mode=750,uid=33,gid=33,inode64
41 22 254:0 /var/cache/nginx /run/tmpfsctl/lower/nginx rw,relatime - ext4 /dev/vda rw
50 22 0:45 / /srv/my\\040cache rw,relatime shared:30 - tmpfs tmpfs rw,size=1024k
51 50 0:46 / /srv/my\\040cache rw,nosuid - tmpfs tmpfsctl-x rw,size=2048k,noswap
";

    #[test]
    fn reads_paths_that_are_not_utf8_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mountinfo");
        let mut text = SAMPLE.as_bytes().to_vec();
        text.extend_from_slice(b"60 22 0:50 / /home/u/\xff\x1b\\134x\\040y rw - fuse.x src\xfe rw\n");
        std::fs::write(&file, &text).unwrap();
        let t = MountTable::read(&file).unwrap();
        let e = t.entries.last().unwrap();
        assert_eq!(e.mount_point.as_os_str().as_bytes(), b"/home/u/\xff\x1b\\x y");
        assert_eq!(e.source, "src\u{fffd}");
        assert_eq!(t.entries.len(), 6);
    }

    #[test]
    fn parses_fields_and_escapes() {
        let t = MountTable::parse(SAMPLE).unwrap();
        assert_eq!(t.entries.len(), 5);
        let n = &t.entries[1];
        assert_eq!(n.mount_point, Path::new("/var/cache/nginx"));
        assert_eq!(n.source, "tmpfsctl-nginx");
        assert_eq!(n.dev, (0, 39));
        assert_eq!(n.super_option("size"), Some("524288k"));
        assert_eq!(n.super_option("mode"), Some("750"));
        assert_eq!(n.super_option("huge"), None);
        assert!(n.has_mount_option("nosuid") && !n.has_mount_option("noexec"));
        assert!(!n.is_private());
        let side = &t.entries[2];
        assert_eq!(side.root, Path::new("/var/cache/nginx"));
        assert!(side.is_private());
        assert_eq!(t.entries[4].super_option("noswap"), Some(""));
    }

    #[test]
    fn finds_top_of_a_stack() {
        let t = MountTable::parse(SAMPLE).unwrap();
        let p = Path::new("/srv/my cache");
        assert_eq!(t.top_at(p).unwrap().id, 51);
        let ids: Vec<u32> = t.stack_at(p).iter().map(|e| e.id).collect();
        assert_eq!(ids, [50, 51]);
        assert!(t.top_at(Path::new("/srv")).is_none());
    }

    #[test]
    fn rejects_garbage() {
        assert!(MountTable::parse("1 2 3\n").is_err());
        assert!(MountTable::parse("a b 0:1 / / rw - ext4 x rw\n").is_err());
    }
}
