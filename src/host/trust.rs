//! Who could change a file: the rule behind refusing a spec, or a state directory,
//! that a user other than root could change (as sshd's `StrictModes`). tmpfsctl runs
//! as root and mounts, copies and deletes where these say; whoever can edit them can
//! make root do that anywhere.
//!
//! A file or directory is root's alone when it is owned by root and writable by
//! neither its group nor others, and so is every directory above it, except that a
//! sticky directory owned by root (like `/tmp`) may be writable by all: nobody but
//! root can rename or remove root's entries there. Symlinks are followed for the
//! check, and the directories holding each link are checked too.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a user other than root could change `path`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} {why}", path.display())]
pub struct Untrusted {
    pub path: PathBuf,
    pub why: String,
}

/// What one path in the chain is to the checked file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The file (or directory) itself.
    Target,
    /// A directory above it: its entries could be replaced.
    Above,
}

/// Who, other than root, could change an entry with this owner and mode, if anyone.
/// Pure, for the tests; the names come from the user and group databases.
fn who(uid: u32, gid: u32, mode: u32, role: Role) -> Option<String> {
    let sticky = mode & libc::S_ISVTX != 0;
    if uid != 0 {
        return Some(format!("is owned by {}, not root", user_name(uid)));
    }
    if role == Role::Above && sticky {
        return None;
    }
    if mode & 0o002 != 0 {
        return Some("is writable by every user".to_string());
    }
    if mode & 0o020 != 0 {
        return Some(format!("is writable by the members of group {}", group_name(gid)));
    }
    None
}

fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(uid.into()) {
        Ok(Some(u)) => format!("uid {uid} ({})", u.name),
        _ => format!("uid {uid}"),
    }
}

fn group_name(gid: u32) -> String {
    match nix::unistd::Group::from_gid(gid.into()) {
        Ok(Some(g)) => format!("{} (gid {gid})", g.name),
        _ => format!("gid {gid}"),
    }
}

fn check(path: &Path, meta: &Metadata, role: Role) -> Result<(), Untrusted> {
    match who(meta.uid(), meta.gid(), meta.mode(), role) {
        Some(why) => Err(Untrusted {
            path: path.to_path_buf(),
            why,
        }),
        None => Ok(()),
    }
}

/// Checks that only root can change `path` (which must exist) and what it leads to.
pub fn only_root_can_change(path: &Path) -> Result<(), Untrusted> {
    let io = |p: &Path, e: std::io::Error| Untrusted {
        path: p.to_path_buf(),
        why: format!("cannot be checked: {e}"),
    };
    let absolute = std::path::absolute(path).map_err(|e| io(path, e))?;
    // The directories holding the name as given: whoever can change them can swap
    // the name (or the link it is) for another.
    if let Some(parent) = absolute.parent() {
        let parent = parent.canonicalize().map_err(|e| io(parent, e))?;
        directories_above(&parent)?;
    }
    let real = absolute.canonicalize().map_err(|e| io(&absolute, e))?;
    let meta = std::fs::metadata(&real).map_err(|e| io(&real, e))?;
    check(&real, &meta, Role::Target)?;
    if let Some(parent) = real.parent() {
        directories_above(parent)?;
    }
    Ok(())
}

/// `dir` (symlinks resolved) and every directory above it, as holding the target.
fn directories_above(dir: &Path) -> Result<(), Untrusted> {
    for d in dir.ancestors() {
        let meta = std::fs::symlink_metadata(d).map_err(|e| Untrusted {
            path: d.to_path_buf(),
            why: format!("cannot be checked: {e}"),
        })?;
        check(d, &meta, Role::Above)?;
    }
    Ok(())
}

/// Checks a directory tmpfsctl keeps as root's own (the state directory): itself
/// (not a symlink) and every directory above it.
pub fn root_directory(dir: &Path) -> Result<(), Untrusted> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| Untrusted {
        path: dir.to_path_buf(),
        why: format!("cannot be checked: {e}"),
    })?;
    if meta.file_type().is_symlink() || !meta.is_dir() {
        return Err(Untrusted {
            path: dir.to_path_buf(),
            why: "is not a directory (a symlink is not followed here)".to_string(),
        });
    }
    check(dir, &meta, Role::Target)?;
    if let Some(parent) = dir.parent() {
        let parent = parent.canonicalize().map_err(|e| Untrusted {
            path: parent.to_path_buf(),
            why: format!("cannot be checked: {e}"),
        })?;
        directories_above(&parent)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    #[test]
    fn the_rule() {
        let target = |uid, mode| who(uid, 0, mode, Role::Target);
        let above = |uid, mode| who(uid, 0, mode, Role::Above);
        assert_eq!(target(0, 0o100644), None);
        assert_eq!(target(0, 0o100600), None);
        assert_eq!(target(0, 0o040700), None);
        assert!(target(1000, 0o100600).unwrap().contains("owned by uid 1000"));
        assert!(target(0, 0o100666).unwrap().contains("every user"));
        assert!(target(0, 0o100664).unwrap().contains("group"));
        // A sticky world-writable file or target directory is still writable.
        assert!(target(0, 0o041777).is_some());
        assert_eq!(above(0, 0o040755), None);
        assert_eq!(above(0, 0o041777), None, "sticky and root's, like /tmp");
        assert!(above(1000, 0o041777).is_some(), "sticky but a user's");
        assert!(above(0, 0o040777).is_some());
        assert!(above(0, 0o040775).is_some());
    }

    #[test]
    fn files_directories_and_links_are_checked_with_what_holds_them() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = d.join("spec.yaml");
        std::fs::write(&f, "x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        only_root_can_change(&f).unwrap();

        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = only_root_can_change(&f).unwrap_err();
        assert_eq!(e.path, f.canonicalize().unwrap());
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();

        // A link in a directory anybody can write to: the link can be swapped.
        let open = d.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        symlink(&f, open.join("link.yaml")).unwrap();
        let e = only_root_can_change(&open.join("link.yaml")).unwrap_err();
        assert_eq!(e.path, open);
        // A link in a root-only directory to a file in an open one.
        std::fs::write(open.join("real.yaml"), "x").unwrap();
        symlink(open.join("real.yaml"), d.join("to-open.yaml")).unwrap();
        let e = only_root_can_change(&d.join("to-open.yaml")).unwrap_err();
        assert_eq!(e.path, open);
        // Sticky and root's: fine for root's own file.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        only_root_can_change(&open.join("real.yaml")).unwrap();

        std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
        let e = only_root_can_change(&f).unwrap_err();
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");

        root_directory(d).unwrap();
        let e = root_directory(&d.join("to-open.yaml")).unwrap_err();
        assert!(e.why.contains("not a directory"), "{e}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::create_dir(open.join("state")).unwrap();
        let e = root_directory(&open.join("state")).unwrap_err();
        assert_eq!(e.path, open);
        assert!(only_root_can_change(&d.join("missing")).is_err());
    }
}
