//! A mount's owner and group: numeric ids, or names looked up on the host or,
//! with `--root`, in the tree's own databases.

use std::path::Path;

use serde_saphyr::Spanned;

use super::{Ctx, Paths};

/// Looks `name` up in a passwd- or group-format file (`name:x:id:...`).
fn id_in_file(file: &Path, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let mut f = l.split(':');
        (f.next() == Some(name))
            .then(|| f.nth(1)?.parse::<u32>().ok())
            .flatten()
    })
}

/// `(uid_t)-1` means "leave unchanged" to chown(2) and is refused by tmpfs's
/// `uid=`/`gid=`: the largest id there is is one below.
const MAX_ID: u64 = u32::MAX as u64 - 1;
const ID_RANGE: &str = "a number from 0 to 4294967294";

/// The two id databases an owner is looked up in.
#[derive(Clone, Copy)]
enum IdDb {
    Passwd,
    Group,
}

impl IdDb {
    /// (file under etc/, what it holds, the numeric form's name)
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            IdDb::Passwd => ("passwd", "user", "uid"),
            IdDb::Group => ("group", "group", "gid"),
        }
    }

    fn lookup_on_host(self, name: &str) -> Option<u32> {
        match self {
            IdDb::Passwd => nix::unistd::User::from_name(name)
                .ok()
                .flatten()
                .map(|u| u.uid.as_raw()),
            IdDb::Group => nix::unistd::Group::from_name(name)
                .ok()
                .flatten()
                .map(|g| g.gid.as_raw()),
        }
    }
}

pub(super) fn user(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<u32> {
    id(cx, field, s, IdDb::Passwd)
}

pub(super) fn group(cx: &mut Ctx, field: &str, s: &Spanned<String>) -> Option<u32> {
    id(cx, field, s, IdDb::Group)
}

/// A numeric id, or a name looked up in `db` on the host (in the tree with `--root`).
fn id(cx: &mut Ctx, field: &str, s: &Spanned<String>, db: IdDb) -> Option<u32> {
    let (file, what, numeric) = db.names();
    if let Ok(n) = s.value.parse::<u64>() {
        return numeric_id(cx, field, s, n, numeric);
    }
    let (found, located) = match &cx.paths {
        Paths::Under(root) => (
            id_in_file(&root.join("etc").join(file), &s.value),
            in_tree(root, file),
        ),
        _ => (db.lookup_on_host(&s.value), String::new()),
    };
    if found.is_none() {
        cx.at(
            s,
            field,
            format!("unknown {what} `{}`{located}", s.value),
            Some(&format!(
                "a {what} name known to the {file} database (getent {file}), or a {numeric}: {ID_RANGE}"
            )),
        );
    }
    found
}

/// " in ROOT/etc/DB", for messages about a tree's databases.
fn in_tree(root: &Path, db: &str) -> String {
    format!(" in {}", crate::out::escape(&root.join("etc").join(db)))
}

fn numeric_id(cx: &mut Ctx, field: &str, s: &Spanned<String>, n: u64, what: &str) -> Option<u32> {
    if n <= MAX_ID {
        return u32::try_from(n).ok();
    }
    cx.at(
        s,
        field,
        format!("{what} {} is out of range", s.value),
        Some(&format!("{ID_RANGE} (4294967295 is the kernel's \"no id\")")),
    );
    None
}
