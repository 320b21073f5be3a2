//! Where a tmpfs may go: an absolute, normalised directory that is no system
//! or SSH directory and, when paths are checked, reached without a symlink.

use std::path::{Component, Path, PathBuf};

use serde_saphyr::Spanned;

use super::{Ctx, Paths, MAX_UNIT_NAME};

/// Directories a tmpfs must never hide. Entries ending in `/` are refused
/// together with everything beneath them; the others only as themselves.
/// Besides these, [`ssh_dir`] refuses SSH key directories wherever they are.
/// The list is in README.md ("Refused paths").
pub const SYSTEM_DIRS: &[&str] = &[
    "/bin/",
    "/boot/",
    "/dev/",
    "/etc/",
    "/lib/",
    "/lib32/",
    "/lib64/",
    "/libx32/",
    "/proc/",
    "/run/",
    "/sbin/",
    "/sys/",
    "/usr/",
    // Package databases: a tmpfs there makes the package manager forget
    // what is installed, or lose it at the next reboot.
    "/var/lib/apt/",
    "/var/lib/dnf/",
    "/var/lib/dpkg/",
    "/var/lib/pacman/",
    "/var/lib/rpm/",
    "/var/lib/yum/",
    // Persistent system state: machine-id seeds, timers, journal cursors.
    "/var/lib/systemd/",
    // Scheduled jobs: crontabs and at jobs.
    "/var/spool/anacron/",
    "/var/spool/at/",
    "/var/spool/cron/",
    "/home",
    "/media",
    "/mnt",
    "/opt",
    "/root",
    "/srv",
    "/tmp",
    "/var",
    "/var/cache",
    "/var/lib",
    "/var/log",
    "/var/spool",
    "/var/tmp",
];

const MAX_PATH_BYTES: usize = 4095;
const MAX_NAME_BYTES: usize = 255;

/// A path a tmpfs may be mounted on, else the problem (reported).
pub(super) fn path(cx: &mut Ctx, field: &str, s: &Spanned<String>, create: bool) -> Option<PathBuf> {
    let p = Path::new(&s.value);
    let checked = refused(&s.value, p, &cx.paths).and_then(|()| match cx.paths.tree() {
        Some(_) => on_disk(&s.value, p, &cx.paths, create),
        None => Ok(()),
    });
    match checked {
        Ok(()) => Some(p.to_path_buf()),
        Err((message, accepted)) => {
            cx.at(s, field, message, Some(accepted));
            None
        }
    }
}

/// What is wrong with a path, and what would be accepted.
type Refusal = (String, &'static str);

const ABS: &str = "an absolute, normalised path to a directory, e.g. /var/cache/nginx";

/// Why the path as written is refused: its form, its length, or what it is.
fn refused(text: &str, p: &Path, paths: &Paths) -> Result<(), Refusal> {
    if !p.is_absolute() {
        return Err((format!("path `{text}` is relative"), ABS));
    }
    let normal = p
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let canonical_text = p.components().collect::<PathBuf>();
    if !normal || canonical_text.as_os_str() != p.as_os_str() {
        return Err((
            format!("path `{text}` is not normalised (`.`, `..`, `//` or a trailing `/`)"),
            ABS,
        ));
    }
    if text.len() > MAX_PATH_BYTES || p.components().any(|c| c.as_os_str().len() > MAX_NAME_BYTES) {
        return Err((
            format!("path `{text}` is too long"),
            "at most 4095 bytes, and at most 255 bytes between slashes (PATH_MAX, NAME_MAX)",
        ));
    }
    let unit = crate::boot::escape::mount_unit(p);
    if unit.len() > MAX_UNIT_NAME {
        return Err((
            format!(
                "path `{text}` is too long for systemd: its mount unit name has {} characters",
                unit.len()
            ),
            "a path whose `systemd-escape --path --suffix=mount` form has at most 255 characters",
        ));
    }
    const ELSEWHERE: &str = "an application cache directory such as /var/cache/nginx";
    if let Some(sys) = system_dir(text) {
        return Err((
            format!(
                "path `{text}` is a system directory ({sys}); a tmpfs there would hide what the system needs"
            ),
            ELSEWHERE,
        ));
    }
    if let Some(why) = ssh_dir(p, paths) {
        return Err((
            format!("path `{text}` is {why}; SSH keys are never managed"),
            ELSEWHERE,
        ));
    }
    Ok(())
}

/// Why the path is refused as it is on disk: a symlink or a file on the way,
/// or a missing directory that is not to be created.
fn on_disk(text: &str, p: &Path, paths: &Paths, create: bool) -> Result<(), Refusal> {
    // Walk the existing prefix with lstat so a symlink anywhere is caught.
    // Under a root, `cur` stays the path inside the tree (what messages
    // show) and `paths.host_path` is where it is looked up.
    let mut cur = PathBuf::from("/");
    for comp in p.components().skip(1) {
        cur.push(comp);
        let here = paths.host_path(&cur);
        match std::fs::symlink_metadata(&here) {
            Ok(md) if md.file_type().is_symlink() => {
                let target = std::fs::read_link(&here)
                    .map(|t| t.display().to_string())
                    .unwrap_or_default();
                return Err((
                    format!(
                        "path `{text}` passes through the symlink `{}` -> `{target}`",
                        cur.display()
                    ),
                    "a path without symlinks: write the resolved path into the spec",
                ));
            }
            Ok(md) if !md.is_dir() => {
                return Err((format!("`{}` is not a directory", cur.display()), ABS));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if create {
                    break;
                }
                let inside = match paths {
                    Paths::Under(root) => format!(" in {}", crate::out::escape(root)),
                    _ => String::new(),
                };
                return Err((
                    format!(
                        "path `{text}` does not exist{inside} (`{}` is missing)",
                        cur.display()
                    ),
                    "an existing directory, or `create: true` to create it",
                ));
            }
            Err(e) => {
                return Err((format!("cannot inspect `{}`: {e}", cur.display()), ABS));
            }
        }
    }
    Ok(())
}

/// Why `path` is an SSH directory or holds one: a tmpfs there would hide (or,
/// seeded, let anyone who can write the cache plant) `authorized_keys`.
/// Home directories are not only under /home (/root, /var/lib/git, ...), so
/// any `.ssh` component is refused, and with `look` a directory that has a
/// `.ssh` entry (a home directory).
fn ssh_dir(path: &Path, paths: &Paths) -> Option<String> {
    if path.components().any(|c| c.as_os_str() == ".ssh") {
        return Some("an SSH directory".into());
    }
    let inner = path.join(".ssh");
    (paths.tree().is_some() && std::fs::symlink_metadata(paths.host_path(&inner)).is_ok())
        .then(|| format!("a home directory: it holds {}", inner.display()))
}

/// Names the system directory `path` is or lies under.
fn system_dir(path: &str) -> Option<String> {
    if path == "/" {
        return Some("/".into());
    }
    SYSTEM_DIRS.iter().find_map(|d| match d.strip_suffix('/') {
        Some(tree) if path == tree => Some(tree.to_string()),
        Some(tree) if path.starts_with(d) => Some(format!("under {tree}")),
        None if path == *d => Some(d.to_string()),
        _ => None,
    })
}

/// The filesystems a `seed: overlay` disk directory may be on: local POSIX
/// filesystems, where overlayfs accepts a lower layer and the write-back can
/// set owners, modes and device numbers. Refused: overlayfs itself (another
/// overlay, or ours over a parent), network and FUSE filesystems (their
/// contents may change behind the overlay's back, which it does not allow),
/// and those without owners (vfat, exfat, ntfs).
/// Their statfs magic numbers, in the order of OVERLAY_LOWER_ACCEPTED.
const OVERLAY_LOWER_FS: &[i64] = &[
    0xEF53,      // ext2, ext3, ext4
    0x5846_5342, // xfs
    0x9123_683E, // btrfs
    0xF2F5_2010, // f2fs
    0xCA45_1A4E, // bcachefs
    0x2FC1_2FC1, // zfs
    0x0102_1994, // tmpfs
];
const OVERLAY_LOWER_ACCEPTED: &str =
    "a directory on ext2/3/4, xfs, btrfs, f2fs, bcachefs, zfs or tmpfs for seed: overlay";

/// Whether the disk directory of a `seed: overlay` mount can be its lower
/// layer (the closest existing directory, for one still to be created). Where
/// the mount's own overlay is in place, its lower layer is the disk directory.
pub(super) fn overlay_lower(cx: &mut Ctx, field: &str, s: &Spanned<String>, p: &Path, name: &str) {
    if cx.paths.tree().is_none() {
        return;
    }
    let mut here = cx.paths.host_path(p);
    if matches!(cx.paths, Paths::Check) {
        let table = crate::host::mountinfo::MountTable::read(Path::new("/proc/self/mountinfo"));
        let ours = table.ok().and_then(|t| {
            let top = t.top_at(p)?;
            crate::backend::overlay::is_ours(top, &crate::spec::source_for(name))
                .then(|| top.super_option("lowerdir").map(PathBuf::from))?
        });
        if let Some(lower) = ours {
            here = lower;
        }
    }
    let st = loop {
        match nix::sys::statfs::statfs(&here) {
            Ok(st) => break st,
            Err(_) if here.pop() => {}
            Err(_) => return,
        }
    };
    let magic = st.filesystem_type().0 as i64;
    if OVERLAY_LOWER_FS.contains(&magic) {
        return;
    }
    let what = if magic == 0x794C_7630 {
        "overlayfs; an overlay cannot be the lower layer of tmpfsctl's".to_string()
    } else {
        format!(
            "a filesystem of type 0x{magic:x}, which overlayfs and the write-back are not known to work with"
        )
    };
    cx.at(
        s,
        field,
        format!("path `{}` of a seed: overlay mount is on {what}", s.value),
        Some(OVERLAY_LOWER_ACCEPTED),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_dirs() {
        for sys in [
            "/",
            "/etc",
            "/etc/nginx",
            "/usr/lib",
            "/proc/1",
            "/run/x",
            "/var",
            "/var/lib",
            "/tmp",
            "/home",
        ] {
            assert!(system_dir(sys).is_some(), "{sys}");
        }
        for ok in [
            "/var/cache/nginx",
            "/tmp/x",
            "/var/lib/php/sessions",
            "/srv/cache",
            "/etcetera",
            "/usrx",
        ] {
            assert!(system_dir(ok).is_none(), "{ok}");
        }
    }
}
