//! fstab mode: a marked block of lines of type `tmpfsctl`, edited
//! atomically. mount(8) hands them to `mount.tmpfsctl` (helper.rs), which
//! mounts the tmpfs with the disk directory's owner and mode as they are at
//! boot. fstab can neither seed nor write back; see docs/boot.md.

use super::escape::fstab_field;
use super::Context;

pub const BEGIN: &str = "# BEGIN tmpfsctl";
pub const END: &str = "# END tmpfsctl";

/// The filesystem type of our lines: mount(8) runs `/sbin/mount.tmpfsctl`.
pub const FSTYPE: &str = "tmpfsctl";

/// The block for `cx`. Owner, group and mode appear only where the spec sets
/// them; the helper takes the rest from the directory at boot.
pub fn block(cx: &Context) -> String {
    let mut b = format!(
        "{BEGIN} (written by `tmpfsctl boot install {}`; edits inside are overwritten)\n",
        cx.spec_path.display()
    );
    for m in &cx.spec.mounts {
        let mut o = vec![format!("size={}", m.size)];
        if let Some(n) = m.inodes {
            o.push(format!("nr_inodes={n}"));
        }
        o.push(format!("huge={}", m.huge.name()));
        if let Some(mode) = m.mode {
            o.push(format!("mode={mode:04o}"));
        }
        if let Some(uid) = m.owner {
            o.push(format!("uid={uid}"));
        }
        if let Some(gid) = m.group {
            o.push(format!("gid={gid}"));
        }
        if m.noswap {
            o.push("noswap".into());
        }
        o.extend(m.flags.names().iter().map(|s| s.to_string()));
        if m.create {
            o.push("X-mount.mkdir".into());
        }
        // util-linux 2.39 on: the helper gets the path as written, and refuses a
        // symlink on the way (see `helper::check_target`); older ones ignore it.
        o.push("X-mount.nocanonicalize=target".into());
        o.extend(m.before.iter().map(|c| format!("x-systemd.before={c}")));
        b.push_str(&format!(
            "{} {} {FSTYPE} {} 0 0\n",
            fstab_field(&m.source()),
            fstab_field(&m.path.to_string_lossy()),
            fstab_field(&o.join(","))
        ));
    }
    b.push_str(END);
    b.push('\n');
    b
}

/// `current` with our block replaced by `block` (appended when absent, removed
/// when `block` is empty). Every other byte stays as it was.
pub fn splice(current: &str, block: &str) -> Result<String, String> {
    let begin = find_line(current, BEGIN);
    let end = find_line(current, END);
    match (begin, end) {
        (None, None) => {
            if block.is_empty() {
                return Ok(current.to_string());
            }
            let mut out = current.to_string();
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(block);
            Ok(out)
        }
        (Some(b), Some(e)) if b < e => {
            let end_of_end = current[e..]
                .find('\n')
                .map(|i| e + i + 1)
                .unwrap_or(current.len());
            Ok(format!("{}{}{}", &current[..b], block, &current[end_of_end..]))
        }
        _ => Err(format!(
            "unbalanced `{BEGIN}` / `{END}` markers; fix the file by hand"
        )),
    }
}

/// Byte offset of the line starting with `marker`.
fn find_line(text: &str, marker: &str) -> Option<usize> {
    let mut off = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with(marker) {
            return Some(off);
        }
        off += line.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: &str = "# BEGIN tmpfsctl x\nA\n# END tmpfsctl\n";

    #[test]
    fn appends_replaces_and_removes_keeping_other_lines() {
        let orig = "UUID=1 / ext4 defaults 0 1\n# comment\n";
        let with = splice(orig, BLOCK).unwrap();
        assert_eq!(with, format!("{orig}{BLOCK}"));
        let new_block = "# BEGIN tmpfsctl x\nB\n# END tmpfsctl\n";
        let replaced = splice(&format!("{with}tail\n"), new_block).unwrap();
        assert_eq!(replaced, format!("{orig}{new_block}tail\n"));
        assert_eq!(splice(&replaced, "").unwrap(), format!("{orig}tail\n"));
        assert_eq!(splice(orig, "").unwrap(), orig);
    }

    #[test]
    fn missing_final_newline_is_kept_apart() {
        assert_eq!(splice("a b c", BLOCK).unwrap(), format!("a b c\n{BLOCK}"));
        assert_eq!(splice("", BLOCK).unwrap(), BLOCK);
    }

    #[test]
    fn unbalanced_markers_are_refused() {
        assert!(splice("# BEGIN tmpfsctl\nx\n", BLOCK).is_err());
        assert!(splice("# END tmpfsctl\n# BEGIN tmpfsctl\n", BLOCK).is_err());
    }
}
