//! Files with more than one name around `apply`'s switch and in merges that start
//! again: removing one name changes the inode's ctime, which its other names then
//! show; that change is this process's, never taken for the application's (see
//! `copy::Merge::touched`).

use std::collections::BTreeMap;
use std::fs;

use crate::common::Sandbox;
use crate::no_write_lost::{apply_stopped_at, contents};
use crate::seed_window::{as_at_the_switch, cleaned_dirs, fill, keep_the_merge_busy, spec, Cleaner};

/// A directory the disk deletes right before the switch that holds a file with
/// another name elsewhere (`keep_linked`): the directory should not stay in RAM
/// (visible again) nor come back on disk at `down`.
#[test]
fn a_deleted_directory_with_a_hard_linked_file_goes() {
    let mut failed = Vec::new();
    for nested in [false, true] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        let x = if nested { "p/sub/x" } else { "p/x" };
        fill(&cache, &[(x, "x"), ("p/z", "z"), ("q/keep", "keep")]);
        fs::hard_link(cache.join(x), cache.join("q/y")).unwrap();
        let spec = spec(&sb, &cache);
        let (mut at_switch, mut once_in_place) = (BTreeMap::new(), BTreeMap::new());
        let (code, log) = apply_stopped_at(&sb, &spec, &["before-switch", "after-move-into-place"], |i| {
            if i == 1 {
                once_in_place = contents(&cache);
                return;
            }
            fs::remove_dir_all(cache.join("p")).unwrap();
            at_switch = contents(&cache);
        });
        assert_eq!(code, 0, "{log}");
        let in_ram = contents(&cache);
        let down = sb.run(["down".as_ref(), spec.as_os_str()]);
        down.code(0);
        let on_disk = contents(&cache);
        if in_ram != at_switch || on_disk != at_switch {
            failed.push(format!(
                "nested {nested}: at switch {at_switch:?}\nonce in place {once_in_place:?}\nin RAM after apply {in_ram:?}\non disk after down {on_disk:?}\n{log}\n{down}"
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// Both names of a hard-linked file deleted on disk right before the switch.
#[test]
fn both_names_of_a_linked_file_deleted_right_before_the_switch() {
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    fill(&cache, &[("e/g", "old"), ("e/k", "k"), ("d1/f1", "d1/f1")]);
    fs::hard_link(cache.join("e/g"), cache.join("d1/f0")).unwrap();
    let spec = spec(&sb, &cache);
    let mut at_switch = BTreeMap::new();
    let (code, log) = apply_stopped_at(&sb, &spec, &["before-switch"], |_| {
        fs::remove_file(cache.join("e/g")).unwrap();
        fs::remove_file(cache.join("d1/f0")).unwrap();
        at_switch = contents(&cache);
    });
    assert_eq!(code, 0, "{log}");
    as_at_the_switch(&sb, &spec, &cache, &at_switch, ("", &log));
}

/// `a/g` and `z/f0` are one file. The disk deletes `z/f0` right before the switch
/// (the look after the switch leaves it: another name). The merge after the switch
/// rewrites `a/g` from the disk (its ctime moved with the link count), which gives
/// the RAM inode still at `z/f0` a new ctime; the application removes directories
/// of the tmpfs the merge opens (as the seed window test does), so the merge starts
/// again, without the first pass's note of that inode: `z/f0` passes for the
/// application's change, stays in RAM and comes back on disk at `down`.
#[test]
fn a_restarted_seed_merge_keeps_its_own_unlinks_apart_from_the_applications_changes() {
    const N: usize = 100;
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    fill(&cache, &[("a/g", "linked"), ("z/k", "k")]);
    fs::hard_link(cache.join("a/g"), cache.join("z/f0")).unwrap();
    fs::create_dir(cache.join("big")).unwrap();
    let dirs = cleaned_dirs(&cache, "m", N);
    let spec = spec(&sb, &cache);
    let mut cleaner = None;
    let (code, out) = apply_stopped_at(&sb, &spec, &["before-switch", "seed-switched"], |at| {
        if at == 0 {
            fs::remove_file(cache.join("z/f0")).unwrap();
            keep_the_merge_busy(&cache, 20, &dirs);
            return;
        }
        cleaner = Some(Cleaner::start(&dirs));
    });
    let removed = cleaner.map_or(0, Cleaner::stop);
    assert_eq!(code, 0, "{out}");
    let restarts = out.matches("which starts again").count();
    let in_ram = fs::symlink_metadata(cache.join("z/f0")).is_ok();
    let down = sb.run(["down".as_ref(), spec.as_os_str()]);
    down.code(0);
    let on_disk = fs::symlink_metadata(cache.join("z/f0")).is_ok();
    assert!(
        !in_ram && !on_disk,
        "{removed} removed, {restarts} restarts: z/f0 in RAM after apply {in_ram}, on disk after down {on_disk}\n{out}\n{down}"
    );
}

/// `a/g` and `z/f0` are one file; the disk deletes `z/f0` right before the switch.
#[test]
fn a_linked_name_deleted_right_before_the_switch() {
    let mut failed = Vec::new();
    for (keep, other) in [("a/g", "z/f0"), ("z/g", "a/f0")] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fill(&cache, &[(keep, "linked"), ("z/k", "k"), ("a/k", "k")]);
        fs::hard_link(cache.join(keep), cache.join(other)).unwrap();
        let spec = spec(&sb, &cache);
        let mut at_switch = BTreeMap::new();
        let (code, log) = apply_stopped_at(&sb, &spec, &["before-switch"], |_| {
            fs::remove_file(cache.join(other)).unwrap();
            at_switch = contents(&cache);
        });
        assert_eq!(code, 0, "{log}");
        let in_ram = contents(&cache);
        let down = sb.run(["down".as_ref(), spec.as_os_str()]);
        down.code(0);
        let on_disk = contents(&cache);
        if in_ram != at_switch || on_disk != at_switch {
            failed.push(format!(
                "{other} deleted: at switch {at_switch:?}\nin RAM after apply {in_ram:?}\non disk after down {on_disk:?}\n{log}\n{down}"
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// The write-back of `down`: `a/g` and `z/f0` are one file on both sides. The
/// application rewrites `a/g` (a new file renamed over it) and deletes `z/f0` in
/// RAM, then after the switch to disk removes each disk directory the merge opens
/// (`m…`), so the merge starts again. Its first pass put the new `a/g` in place
/// (an unlink of the disk inode still at `z/f0`, whose ctime moves); a later pass,
/// without that note, takes it for the application's change on disk, later than
/// the RAM's deletion: `z/f0` comes back.
#[test]
fn a_restarted_write_back_keeps_its_own_unlinks_apart_from_the_applications_changes() {
    use crate::no_write_lost::stopped_at;
    use std::os::unix::fs::MetadataExt;
    const N: usize = 100;
    let sb = Sandbox::new();
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    fill(&cache, &[("a/g", "linked"), ("z/k", "k")]);
    fs::hard_link(cache.join("a/g"), cache.join("z/f0")).unwrap();
    let dirs = cleaned_dirs(&cache, "m", N);
    let spec = spec(&sb, &cache);
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    assert_eq!(
        fs::metadata(cache.join("z/f0")).unwrap().nlink(),
        2,
        "linked in RAM"
    );
    // In RAM.
    fs::write(cache.join("a/g.tmp"), "rewritten in RAM").unwrap();
    fs::rename(cache.join("a/g.tmp"), cache.join("a/g")).unwrap();
    fs::remove_file(cache.join("z/f0")).unwrap();
    keep_the_merge_busy(&cache, 20, &dirs);
    let mut cleaner = None;
    let (code, out) = stopped_at(
        &sb,
        "down",
        &spec,
        "stop=after-switch:cache",
        &["after-switch"],
        |_| {
            cleaner = Some(Cleaner::start(&dirs));
        },
    );
    let removed = cleaner.map_or(0, Cleaner::stop);
    let restarts = out.matches("which starts again").count();
    let f0 = fs::symlink_metadata(cache.join("z/f0")).is_ok();
    let g = fs::read_to_string(cache.join("a/g")).ok();
    assert!(
        code == 0 && !f0 && g.as_deref() == Some("rewritten in RAM"),
        "exit {code}, {removed} removed, {restarts} restarts: z/f0 on disk after down {f0}, a/g {g:?}\n{out}"
    );
}

/// A file with two names; the application deletes or renames away one of them in
/// RAM; `down` is killed once its copies are durable, before its removals, and run
/// again. The name stays deleted. Before, the retry took the ctime the killed pass
/// gave the file (unlinking or replacing its name) for the application's change on
/// disk, and brought the name back: 25 of 25 runs (a hunting helper's probe).
#[test]
fn a_linked_name_deleted_in_ram_stays_deleted_after_a_killed_down() {
    for how in ["rm", "mv", "mv over"] {
        let sb = Sandbox::new();
        let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
        fs::create_dir(cache.join("d")).unwrap();
        fs::write(cache.join("a"), "data").unwrap();
        fs::hard_link(cache.join("a"), cache.join("d/b")).unwrap();
        fs::write(cache.join("x"), "other").unwrap();
        let spec = sb.one_mount_spec("cache", &cache, "8MiB", "    persist: on-stop\n");
        sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
        match how {
            "rm" => fs::remove_file(cache.join("d/b")).unwrap(),
            "mv" => fs::rename(cache.join("d/b"), cache.join("d/b2")).unwrap(),
            _ => fs::rename(cache.join("d/b"), cache.join("x")).unwrap(),
        }
        crate::no_write_lost::killed_at(&sb, "down", &spec, "before-removals");
        let down = sb.run(["down".as_ref(), spec.as_os_str()]);
        down.code(0);
        assert!(!cache.join("d/b").exists(), "{how}: d/b came back\n{down}");
        assert_eq!(fs::read_to_string(cache.join("a")).unwrap(), "data", "{how}");
        match how {
            "mv" => assert_eq!(fs::read_to_string(cache.join("d/b2")).unwrap(), "data"),
            "mv over" => assert_eq!(fs::read_to_string(cache.join("x")).unwrap(), "data"),
            _ => assert_eq!(fs::read_to_string(cache.join("x")).unwrap(), "other"),
        }
    }
}

/// A file with two names, one renamed in RAM; `down` killed once its copies are
/// durable; the application then writes the file in place on disk (after the
/// switch); `down` again. The disk's write stays, under both names. Before, the
/// retry took the file's new ctime for the killed pass's own link change (journaled
/// as touched) and wrote the older RAM version over it: 10 of 10 (a hunting
/// helper's probe of the journaled touched inodes).
#[test]
fn a_write_on_disk_into_a_linked_file_a_killed_down_touched_is_kept() {
    let sb = Sandbox::new();
    let (cache, spec) = a_linked_pair_applied(&sb, |_| {});
    fs::rename(cache.join("d/b"), cache.join("d/c")).unwrap();
    crate::no_write_lost::killed_at(&sb, "down", &spec, "after-merge:cache");
    fs::write(cache.join("d/a"), "the application's, on disk").unwrap();
    let down = sb.run(["down".as_ref(), spec.as_os_str()]);
    down.code(0);
    for name in ["d/a", "d/c"] {
        assert_eq!(
            fs::read_to_string(cache.join(name)).ok().as_deref(),
            Some("the application's, on disk"),
            "{name}\n{down}"
        );
    }
    assert!(!cache.join("d/b").exists(), "{down}");
}

/// `d/a` and `d/b` are one file on both sides (in one variant with a third name
/// outside the tree). The application rewrites `d/a` in RAM (a new file renamed over it);
/// after `down`'s switch it removes, renames or links `d/b` on disk, links it and
/// removes that link again, or removes the name outside. The RAM's rewrite reaches the disk: only the disk inode's
/// link count changed, which moves its ctime but not `d/a`'s version. Before, that
/// ctime counted as the disk's later change and the rewrite was lost (8 of 8, a
/// hunting helper's probe).
#[test]
fn a_rewrite_in_ram_survives_a_link_change_of_the_other_name_on_disk() {
    for (k, disk_act) in ["rm", "mv", "ln", "ln and rm", "rm outside"]
        .into_iter()
        .enumerate()
    {
        let sb = Sandbox::new();
        // A third name, outside the cache directory.
        let outside = sb.path("outside");
        let (cache, spec) = a_linked_pair_applied(&sb, |cache| {
            if disk_act == "rm outside" {
                fs::hard_link(cache.join("d/a"), &outside).unwrap();
            }
        });
        fs::write(cache.join("d/.a.tmp"), "rewritten in RAM").unwrap();
        fs::rename(cache.join("d/.a.tmp"), cache.join("d/a")).unwrap();
        let (code, log) = crate::no_write_lost::stopped_at(
            &sb,
            "down",
            &spec,
            "stop=after-switch:cache",
            &["after-switch"],
            |_| match disk_act {
                "rm" => fs::remove_file(cache.join("d/b")).unwrap(),
                "mv" => fs::rename(cache.join("d/b"), cache.join("d/b2")).unwrap(),
                "ln" => fs::hard_link(cache.join("d/b"), cache.join("d/b3")).unwrap(),
                // A link made and removed again (a lock taken by link(2)): the
                // count and the names are as they were, the ctime is not.
                "ln and rm" => {
                    fs::hard_link(cache.join("d/b"), cache.join("d/lock")).unwrap();
                    fs::remove_file(cache.join("d/lock")).unwrap();
                }
                _ => fs::remove_file(&outside).unwrap(),
            },
        );
        assert_eq!(code, 0, "{log}");
        assert_eq!(
            fs::read_to_string(cache.join("d/a")).unwrap(),
            "rewritten in RAM",
            "variant {k} ({disk_act})\n{log}"
        );
        let other = match disk_act {
            "rm" => None,
            "mv" => Some("d/b2"),
            "ln" => Some("d/b3"),
            _ => Some("d/b"),
        };
        if let Some(other) = other {
            assert_eq!(
                fs::read_to_string(cache.join(other)).unwrap(),
                "seed version",
                "variant {k} ({disk_act})\n{log}"
            );
        }
    }
}

/// `d/a` and `d/b` are one file. The RAM deletes `d/a`; after `down`'s switch the
/// application `chown`s it on disk, no name added or removed: that later change
/// stands, and `d/a` stays. A first version of the fix above took any new ctime of
/// a file with several names for a link change, and removed it (a review helper's
/// probe).
#[test]
fn a_chown_on_disk_of_a_linked_file_the_ram_deleted_is_kept() {
    let sb = Sandbox::new();
    let (cache, spec) = a_linked_pair_applied(&sb, |_| {});
    fs::remove_file(cache.join("d/a")).unwrap();
    let (code, log) = crate::no_write_lost::stopped_at(
        &sb,
        "down",
        &spec,
        "stop=after-switch:cache",
        &["after-switch"],
        |_| std::os::unix::fs::chown(cache.join("d/a"), Some(1234), Some(1234)).unwrap(),
    );
    assert_eq!(code, 0, "{log}");
    let md = fs::metadata(cache.join("d/a")).expect("the application's chown was undone");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&md), 1234, "{log}");
}

/// `d/a` and `d/b`, one file, in a persisted cache (after `more` on its directory)
/// that is applied: the cache's path and its spec.
fn a_linked_pair_applied(
    sb: &Sandbox,
    more: impl FnOnce(&std::path::Path),
) -> (std::path::PathBuf, std::path::PathBuf) {
    let cache = sb.cache_dir("var/cache/app", 0, 0, 0o755);
    fs::create_dir(cache.join("d")).unwrap();
    fs::write(cache.join("d/a"), "seed version").unwrap();
    fs::hard_link(cache.join("d/a"), cache.join("d/b")).unwrap();
    more(&cache);
    let spec = sb.one_mount_spec("cache", &cache, "8MiB", "    persist: on-stop\n");
    sb.run(["apply".as_ref(), spec.as_os_str()]).code(0);
    (cache, spec)
}
