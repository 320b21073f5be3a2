//! A directory read while it changes is no snapshot: tmpfs lists names a second time
//! when the application renames entries during the read (hundreds at once, unchanged
//! ones among them). The write-back must take such a name once. Taking the repeat for
//! a name of its own, it found the disk lacking it and recorded it as deleted there;
//! once the application deleted the name in RAM, the next pass kept the disk's copy
//! (`crash_phases::kill_9_in_every_phase_of_sync` brought back 197 names so, now and
//! then, under load).
//!
//! The race is made deterministic with a source whose listing always names an entry
//! twice: an ext4 image (linear directories, no metadata checksums) whose directory
//! block is edited so that two entries carry one name. Needs root (loop mounts).

use std::fs;
use std::path::Path;

use crate::common::{disk_tempdir, run_tool, LoopFs};
use crate::common_copy::{in_private_mount_ns, plain_pass};
use tmpfsctl::copy::baseline::Mark;
use tmpfsctl::copy::{copy_tree, Baseline, Synced};

const TWICE: &str = "listed-twice.1";
/// Renamed to [`TWICE`] in the image: the same length, so only its bytes change.
const OTHER: &str = "listed-twice.2";

fn pass(src: &Path, dst: &Path, base: &Baseline) -> Synced {
    plain_pass(src, dst, base).expect("write-back")
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    names.sort();
    names
}

#[test]
fn a_name_listed_twice_is_merged_once_and_its_deletion_written_back() {
    let tmp = disk_tempdir("tmpfsctl-listing-");
    let image = tmp.path().join("ram.img");
    let (ram, disk, emptied) = (
        tmp.path().join("ram"),
        tmp.path().join("disk"),
        tmp.path().join("emptied"),
    );
    for d in [&ram, &disk, &emptied] {
        fs::create_dir(d).unwrap();
    }
    fs::File::create(&image).unwrap().set_len(8 << 20).unwrap();
    run_tool(
        "mkfs.ext4",
        &["-q", "-F", "-O", "^dir_index,^metadata_csum"]
            .map(AsRef::as_ref)
            .into_iter()
            .chain([image.as_os_str()])
            .collect::<Vec<_>>(),
    );
    in_private_mount_ns(|| {
        // Both sides hold the name and agree on it.
        let agreed = {
            let _ram = LoopFs::mount_copy(&image, &ram);
            fs::write(ram.join(TWICE), "kept in RAM").unwrap();
            fs::write(ram.join(OTHER), "another entry").unwrap();
            pass(&ram, &disk, &Baseline::none()).baseline
        };
        assert!(matches!(agreed.get(TWICE.as_bytes()), Some(Mark::Entry(_))));
        let mut bytes = fs::read(&image).unwrap();
        let at: Vec<usize> = bytes
            .windows(OTHER.len())
            .enumerate()
            .filter(|(_, w)| *w == OTHER.as_bytes())
            .map(|(i, _)| i)
            .collect();
        assert!(!at.is_empty(), "{OTHER} not found in the image");
        for i in at {
            bytes[i..i + TWICE.len()].copy_from_slice(TWICE.as_bytes());
        }
        fs::write(&image, bytes).unwrap();

        // The RAM side lists the name twice; it did not change since the baseline.
        let next = {
            let _ram = LoopFs::mount_copy(&image, &ram);
            let listed = names(&ram);
            assert_eq!(
                listed.iter().filter(|n| *n == TWICE).count(),
                2,
                "the image does not list {TWICE} twice: {listed:?}"
            );
            // A seed from such a directory copies the name once.
            let seeded = tmp.path().join("seeded");
            fs::create_dir(&seeded).unwrap();
            copy_tree(&ram, &seeded, None).expect("a seed of a directory listing a name twice");
            assert_eq!(names(&seeded), [TWICE, "lost+found"]);
            pass(&ram, &disk, &agreed).baseline
        };
        assert!(
            matches!(next.get(TWICE.as_bytes()), Some(Mark::Entry(_))),
            "both sides hold {TWICE}, recorded as {:?}",
            next.get(TWICE.as_bytes())
        );
        assert_eq!(fs::read_to_string(disk.join(TWICE)).unwrap(), "kept in RAM");

        // The application deletes it (and everything else) in RAM: gone from disk too.
        pass(&emptied, &disk, &next);
        assert_eq!(names(&disk), Vec::<String>::new(), "resurrected on disk");
    });
}
