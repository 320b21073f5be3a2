//! A tracked pass states only the RAM files its tracker named (see
//! `docs/writeback.md`, "Only the RAM directories that changed are read"). What a
//! name does not tell: a file written through a name it no longer has, and what
//! the application does between the tracker's answer and the pass's listings.
//! Each test counts what the RAM wrote against what the disk holds.
//!
//! Needs root: the tmpfs is mounted in a private mount namespace.

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::common_copy::*;
use crate::writeback_tracked::pass_then;
use tmpfsctl::copy::{Baseline, Synced};
use tmpfsctl::dirty::ChangeTracker;

fn pass(src: &Path, dst: &Path, base: &Baseline, tracker: Option<&mut ChangeTracker>) -> Synced {
    pass_then(src, dst, base, tracker, || {})
}

fn start(src: &Path) -> ChangeTracker {
    ChangeTracker::start(fs::File::open(src).unwrap()).expect("fanotify with FAN_REPORT_DFID_NAME")
}

/// Writes `f` after the pass that wrote `at`'s first version back, then requires
/// the disk's `at` to be the RAM's after a tracked pass, a second one, and a full
/// one: the write is neither late nor lost for good.
fn written_through_an_old_name_arrives(
    src: &Path,
    dst: &Path,
    at: &str,
    f: fs::File,
    tracker: &mut ChangeTracker,
    base: Baseline,
) {
    tracker.drain();
    tick();
    let done = pass(src, dst, &base, Some(&mut *tracker));
    assert_eq!(fs::read_to_string(dst.join(at)).unwrap(), "version 1");
    tick();
    f.write_all_at(b"version 2, longer", 0).unwrap();
    drop(f);
    tick();
    let done = pass(src, dst, &done.baseline, Some(&mut *tracker));
    let ram = fs::read_to_string(src.join(at)).unwrap();
    assert_eq!(ram, "version 2, longer");
    let after_tracked = fs::read_to_string(dst.join(at)).unwrap();
    tick();
    let again = pass(src, dst, &done.baseline, Some(&mut *tracker));
    let after_second = fs::read_to_string(dst.join(at)).unwrap();
    pass(src, dst, &again.baseline, None);
    let after_full = fs::read_to_string(dst.join(at)).unwrap();
    assert_eq!(
        [after_tracked.as_str(), after_second.as_str(), after_full.as_str()],
        [ram.as_str(); 3],
        "{at} on disk after a tracked pass, a second one and a full one"
    );
}

/// fanotify reports a write under the name the writer opened the file by. Here that
/// name was unlinked in an earlier pass's interval; the file's other name, in the
/// same directory or in another one, is where the change shows.
#[test]
fn a_write_through_an_unlinked_name_reaches_the_file_s_other_name() {
    for (other, touch_other_dir) in [("d/b", false), ("e/b", false), ("e/b", true)] {
        with_trees(|src, dst| {
            for d in ["d", "e"] {
                fs::create_dir(src.join(d)).unwrap();
            }
            fs::write(src.join("d/a"), "version 1").unwrap();
            fs::write(src.join("e/c"), "other").unwrap();
            let mut tracker = start(src);
            tick();
            let base = pass(src, dst, &Baseline::none(), None).baseline;
            tick();
            fs::hard_link(src.join("d/a"), src.join(other)).unwrap();
            let f = fs::OpenOptions::new().write(true).open(src.join("d/a")).unwrap();
            fs::remove_file(src.join("d/a")).unwrap();
            if touch_other_dir {
                // The other directory changes by name too.
                fs::write(src.join("e/c"), "other, rewritten").unwrap();
            }
            tick();
            written_through_an_old_name_arrives(src, dst, other, f, &mut tracker, base);
        });
    }
}

/// A file made with `O_TMPFILE` and linked into place: written again through its
/// descriptor, fanotify names the unnamed file's dentry (`#INO`), not the link.
#[test]
fn a_write_through_an_o_tmpfile_descriptor_reaches_its_link() {
    with_trees(|src, dst| {
        fs::create_dir(src.join("d")).unwrap();
        fs::write(src.join("d/c"), "other").unwrap();
        let mut tracker = start(src);
        tick();
        let base = pass(src, dst, &Baseline::none(), None).baseline;
        tick();
        let mut f = fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(src.join("d"))
            .unwrap();
        f.write_all(b"version 1").unwrap();
        nix::unistd::linkat(
            nix::fcntl::AT_FDCWD,
            format!("/proc/self/fd/{}", f.as_raw_fd()).as_str(),
            nix::fcntl::AT_FDCWD,
            &src.join("d/final"),
            nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
        )
        .unwrap();
        tick();
        written_through_an_old_name_arrives(src, dst, "d/final", f, &mut tracker, base);
    });
}

/// Writes `files` (path, contents), makes a first pass with a tracker running,
/// changes `d` by name, and makes a tracked pass during which `meanwhile` runs
/// right after the tracker's answer. Then some name of `names` on disk must hold
/// the contents that start with `moved`.
fn after_the_answer(
    files: &[(&str, &str)],
    meanwhile: impl FnOnce(&Path) + Send,
    names: &[&str],
    moved: &str,
) {
    with_trees(|src, dst| {
        for (path, contents) in files {
            fs::create_dir_all(src.join(path).parent().unwrap()).unwrap();
            fs::write(src.join(path), contents).unwrap();
        }
        let mut tracker = start(src);
        tick();
        let base = pass(src, dst, &Baseline::none(), None).baseline;
        tick();
        fs::write(src.join("d/other"), "x").unwrap();
        tick();
        pass_then(src, dst, &base, Some(&mut tracker), || meanwhile(src));
        let on_disk: Vec<_> = names
            .iter()
            .filter_map(|p| fs::read_to_string(dst.join(p)).ok())
            .collect();
        assert!(
            on_disk.iter().any(|s| s.starts_with(moved)),
            "after the pass, no disk name holds {moved}'s data: {on_disk:?}"
        );
    });
}

/// A rename over an existing file after the tracker answered: the pass must not
/// delete the old name on disk and keep the target's old version, which would leave
/// the renamed data on no disk name until the next pass.
#[test]
fn a_rename_over_a_file_after_the_answer_keeps_the_data_on_disk() {
    after_the_answer(
        &[("d/g", "G: the data that moves"), ("d/f", "F: old")],
        |src| fs::rename(src.join("d/g"), src.join("d/f")).unwrap(),
        &["d/g", "d/f"],
        "G:",
    );
}

/// A directory moved over another after the tracker answered: its files are not the
/// old directory's at that path, and the pass must not take them for those while it
/// removes the moved directory's old path on disk.
#[test]
fn a_directory_moved_over_another_after_the_answer_keeps_its_data_on_disk() {
    after_the_answer(
        &[("d/f", "old d"), ("m/f", "M: the data that moves")],
        |src| {
            fs::rename(src.join("d"), src.join("d2")).unwrap();
            fs::rename(src.join("m"), src.join("d")).unwrap();
        },
        &["m/f", "d/f", "d2/f"],
        "M:",
    );
}

/// A file, and a directory, moved after the tracker answered from a directory the
/// pass reads into one below a directory it skips (a move two levels down leaves
/// that one's ctime as it was): the pass removes nothing and a whole pass follows,
/// which writes them at their new paths. Before, the pass removed the old name and
/// never wrote the new one, and the data was on no disk name until the next pass (a
/// hunting helper's probe, 3 of 3).
#[test]
fn a_move_into_an_unread_directory_after_the_answer_keeps_the_data_on_disk() {
    for (moved, data) in [("d/f", "F:"), ("d/s", "S:")] {
        let to = format!("A/B/{}", &moved[2..]);
        after_the_answer(
            &[
                ("d/f", "F: a file that moves"),
                ("d/s/in", "S: in a directory that moves"),
                ("A/B/g", "G"),
            ],
            |src| fs::rename(src.join(moved), src.join(&to)).unwrap(),
            &["d/f", "d/s/in", "A/B/f", "A/B/s/in"],
            data,
        );
    }
}

/// Two directories swapped after the tracker answered, each with a subdirectory `c`
/// the answer says nothing of (as at the paths before), where a file rewritten in
/// place before the answer now lies below the other name: every directory changed
/// after the answer is read as a whole, so the rewrite is written where it is now,
/// not left to a skip of `e/c` while `d/c/f` goes (a hunting helper's probe, 3 of 3).
#[test]
fn directories_swapped_after_the_answer_keep_a_rewrite_below_them_on_disk() {
    for by_exchange in [false, true] {
        with_trees(|src, dst| {
            for d in ["d/c", "e/c"] {
                fs::create_dir_all(src.join(d)).unwrap();
            }
            fs::write(src.join("d/c/f"), "F v1").unwrap();
            fs::write(src.join("e/c/g"), "G").unwrap();
            let mut tracker = start(src);
            tick();
            let base = pass(src, dst, &Baseline::none(), None).baseline;
            tick();
            fs::OpenOptions::new()
                .write(true)
                .open(src.join("d/c/f"))
                .unwrap()
                .write_all_at(b"F v2", 0)
                .unwrap();
            tick();
            pass_then(src, dst, &base, Some(&mut tracker), || {
                if by_exchange {
                    nix::fcntl::renameat2(
                        nix::fcntl::AT_FDCWD,
                        &src.join("d"),
                        nix::fcntl::AT_FDCWD,
                        &src.join("e"),
                        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                    )
                    .unwrap();
                } else {
                    fs::rename(src.join("d"), src.join("t")).unwrap();
                    fs::rename(src.join("e"), src.join("d")).unwrap();
                    fs::rename(src.join("t"), src.join("e")).unwrap();
                }
            });
            assert_eq!(
                fs::read_to_string(dst.join("e/c/f")).ok().as_deref(),
                Some("F v2"),
                "exchange: {by_exchange}"
            );
        });
    }
}

/// A file moved after the tracker answered into a directory below one the pass
/// skips, and a new file put at its old name: the pass replaces the disk's file
/// there, which is the moved file's data, and removes nothing. That counts as
/// much as a removal: a whole pass follows, which writes the moved file at its
/// new path (before, the data was on no disk name until the next pass: a review
/// helper's probe, 3 of 3).
#[test]
fn a_move_into_an_unread_directory_and_a_new_file_at_the_old_name_keeps_the_data_on_disk() {
    after_the_answer(
        &[("d/f", "F: a file that moves"), ("S/a/b/g", "G")],
        |src| {
            fs::write(src.join("d/f.new"), "a new file").unwrap();
            fs::rename(src.join("d/f"), src.join("S/a/b/f")).unwrap();
            fs::rename(src.join("d/f.new"), src.join("d/f")).unwrap();
        },
        &["d/f", "S/a/b/f"],
        "F:",
    );
}
