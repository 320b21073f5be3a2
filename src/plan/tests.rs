use std::path::{Path, PathBuf};

use super::*;
use crate::backend::tmpfs;
use crate::host::meminfo::MemInfo;
use crate::host::mountinfo::MountTable;
use crate::host::usage::Usage;
use crate::observe::{AtPath, Leftover, Observed, SideBind, World};
use crate::spec::{AgentSettings, Atime, Flags, Huge, MountSpec, Seed, Spec};

const PAGE: u64 = 4096;
const SECURE: Flags = Flags {
    nosuid: true,
    nodev: true,
    noexec: false,
    atime: None,
};

fn st() -> State {
    State::new("/run/tmpfsctl")
}

fn mspec() -> MountSpec {
    MountSpec::for_test("nginx", "/var/cache/nginx", 512 << 20)
}

const DISK: RootAttrs = RootAttrs {
    uid: 33,
    gid: 33,
    mode: 0o750,
};

fn on_disk() -> Observed {
    Observed {
        name: "nginx".into(),
        path_exists: true,
        at_path: AtPath::Disk,
        ours_elsewhere: None,
        stage_mounted: false,
        stage_holds_upper: false,
        side: SideBind::Absent,
        disk: Some(DISK),
        record: None,
        nested: None,
    }
}

fn live() -> tmpfs::LiveTmpfs {
    tmpfs::LiveTmpfs {
        dev: (0, 40),
        size: 512 << 20,
        nr_inodes: 100_000,
        huge: Some(Huge::Never),
        noswap: false,
        flags: Flags {
            atime: Some(Atime::Relatime),
            ..SECURE
        },
        root: DISK,
        usage: Usage {
            size: 512 << 20,
            used: 100 << 20,
            inodes: 100_000,
            inodes_used: 5000,
        },
    }
}

fn offloaded(l: tmpfs::LiveTmpfs) -> Observed {
    Observed {
        at_path: AtPath::Ours(Live::Tmpfs(l)),
        side: SideBind::Bound,
        ..on_disk()
    }
}

fn actions(p: &MountPlan) -> Vec<&'static str> {
    p.steps
        .iter()
        .map(|s| match s {
            Step::DetachStage { .. } => "detach-stage",
            Step::DetachSide { .. } => "detach-side",
            Step::CreateDir { .. } => "create-dir",
            Step::BindSide { .. } => "bind-side",
            Step::MountStage { .. } => "mount-stage",
            Step::Seed { .. } => "seed",
            Step::MountOverlay { .. } => "mount-overlay",
            Step::MoveIntoPlace { .. } => "move-into-place",
            Step::Remount { .. } => "remount",
            Step::SetRoot { .. } => "set-root",
            Step::RemoveLeftover { .. } => "remove-leftover",
            Step::PrivateStateDir { .. } => "private-state-dir",
            Step::PrivateSide { .. } => "private-side",
            Step::RestoreSide { .. } => "restore-side",
        })
        .collect()
}

fn run(m: &MountSpec, o: &Observed) -> MountPlan {
    plan_mount(m, o, &st(), PAGE)
}

fn mount_options(p: &MountPlan) -> &tmpfs::TmpfsOptions {
    p.steps
        .iter()
        .find_map(|s| match s {
            Step::MountStage {
                options: backend::MountOptions::Tmpfs(o),
                ..
            }
            | Step::Remount {
                options: backend::MountOptions::Tmpfs(o),
                ..
            } => Some(o),
            _ => None,
        })
        .expect("plan has a mount or remount step")
}

fn refused(p: &MountPlan) -> &str {
    match &p.blocked {
        Some(Blocked::Refused { reason }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn cannot(p: &MountPlan) -> &str {
    match &p.blocked {
        Some(Blocked::CannotOffload { reason }) => reason,
        other => panic!("expected cannot-offload, got {other:?}"),
    }
}

#[test]
fn first_apply_binds_builds_seeds_then_moves() {
    let p = run(&mspec(), &on_disk());
    assert_eq!(
        actions(&p),
        ["bind-side", "mount-stage", "seed", "move-into-place"]
    );
    assert!(p.blocked.is_none());
    assert_eq!(
        p.steps[0],
        Step::BindSide {
            path: "/var/cache/nginx".into(),
            side: "/run/tmpfsctl/lower/nginx".into()
        }
    );
    assert_eq!(
        p.steps[2],
        Step::Seed {
            from: "/run/tmpfsctl/lower/nginx".into(),
            to: "/run/tmpfsctl/stage/nginx".into()
        }
    );
    let o = mount_options(&p);
    assert_eq!(o.root, DISK, "root copied from the on-disk directory");
    assert_eq!(o.flags, SECURE);
    assert_eq!(o.size, 512 << 20);
    assert!(matches!(&p.steps[1], Step::MountStage { source, .. } if source == "tmpfsctl-nginx"));
}

#[test]
fn seed_empty_skips_the_copy() {
    let p = run(
        &MountSpec {
            seed: Seed::Empty,
            ..mspec()
        },
        &on_disk(),
    );
    assert_eq!(actions(&p), ["bind-side", "mount-stage", "move-into-place"]);
}

#[test]
fn spec_owner_group_mode_override_the_disk() {
    let m = MountSpec {
        owner: Some(1000),
        mode: Some(0o700),
        ..mspec()
    };
    let p = run(&m, &on_disk());
    assert_eq!(
        mount_options(&p).root,
        RootAttrs {
            uid: 1000,
            gid: 33,
            mode: 0o700
        }
    );
}

#[test]
fn missing_path_is_created_only_when_asked() {
    let o = Observed {
        path_exists: false,
        disk: None,
        ..on_disk()
    };
    assert!(cannot(&run(&mspec(), &o)).contains("create: true"));
    let p = run(
        &MountSpec {
            create: true,
            group: Some(7),
            ..mspec()
        },
        &o,
    );
    assert_eq!(
        actions(&p),
        [
            "create-dir",
            "bind-side",
            "mount-stage",
            "seed",
            "move-into-place"
        ]
    );
    let want = RootAttrs {
        uid: 0,
        gid: 7,
        mode: 0o755,
    };
    assert_eq!(
        p.steps[0],
        Step::CreateDir {
            path: "/var/cache/nginx".into(),
            root: want
        }
    );
    assert_eq!(mount_options(&p).root, want);
}

#[test]
fn after_a_crash_a_bound_side_path_is_reused() {
    let p = run(
        &mspec(),
        &Observed {
            side: SideBind::Bound,
            ..on_disk()
        },
    );
    assert_eq!(actions(&p), ["mount-stage", "seed", "move-into-place"]);
}

#[test]
fn after_a_crash_a_stale_side_bind_is_replaced() {
    let p = run(
        &mspec(),
        &Observed {
            side: SideBind::Stale,
            ..on_disk()
        },
    );
    assert_eq!(
        actions(&p),
        [
            "detach-side",
            "bind-side",
            "mount-stage",
            "seed",
            "move-into-place"
        ]
    );
}

#[test]
fn after_a_crash_an_unfinished_stage_is_torn_down_first() {
    let p = run(
        &mspec(),
        &Observed {
            stage_mounted: true,
            side: SideBind::Bound,
            ..on_disk()
        },
    );
    assert_eq!(
        actions(&p),
        ["detach-stage", "mount-stage", "seed", "move-into-place"]
    );
}

#[test]
fn foreign_mount_needs_takeover() {
    let o = Observed {
        at_path: AtPath::Foreign {
            fstype: "ext4".into(),
            source: "/dev/sdb1".into(),
        },
        ..on_disk()
    };
    let p = run(&mspec(), &o);
    let why = cannot(&p);
    assert!(
        why.contains("ext4 from /dev/sdb1") && why.contains("takeover: true"),
        "{why}"
    );
    let p = run(
        &MountSpec {
            takeover: true,
            ..mspec()
        },
        &o,
    );
    assert_eq!(
        actions(&p),
        ["bind-side", "mount-stage", "seed", "move-into-place"]
    );
}

#[test]
fn never_stacks_on_another_managed_mount() {
    let o = Observed {
        at_path: AtPath::OtherManaged {
            source: "tmpfsctl-old".into(),
        },
        ..on_disk()
    };
    let p = run(
        &MountSpec {
            takeover: true,
            ..mspec()
        },
        &o,
    );
    assert!(cannot(&p).contains("tmpfsctl-old"));
    assert!(p.steps.is_empty());
}

#[test]
fn ours_mounted_elsewhere_blocks_a_move() {
    let o = Observed {
        ours_elsewhere: Some("/srv/old".into()),
        ..on_disk()
    };
    let p = run(&mspec(), &o);
    assert!(cannot(&p).contains("/srv/old"));
    assert!(p.steps.is_empty());
}

#[test]
fn converged_mount_needs_nothing() {
    let p = run(&mspec(), &offloaded(live()));
    assert!(p.steps.is_empty() && p.blocked.is_none(), "{p:?}");
}

#[test]
fn size_compares_in_whole_pages() {
    let m = MountSpec {
        size: (512 << 20) - 100,
        ..mspec()
    };
    assert!(run(&m, &offloaded(live())).steps.is_empty());
}

#[test]
fn grow_is_an_online_remount_repeating_all_flags() {
    let p = run(
        &MountSpec {
            size: 1 << 30,
            ..mspec()
        },
        &offloaded(live()),
    );
    assert_eq!(actions(&p), ["remount"]);
    let Step::Remount {
        changes,
        options: backend::MountOptions::Tmpfs(options),
        ..
    } = &p.steps[0]
    else {
        unreachable!()
    };
    assert_eq!(
        changes,
        &[Change {
            what: "size",
            from: "512MiB".into(),
            to: "1GiB".into()
        }]
    );
    assert!(options.flags.nosuid && options.flags.nodev);
    assert_eq!(options.nr_inodes, Some(100_000), "the live inode limit is kept");
}

#[test]
fn shrink_above_usage_is_allowed() {
    let p = run(
        &MountSpec {
            size: 256 << 20,
            ..mspec()
        },
        &offloaded(live()),
    );
    assert_eq!(actions(&p), ["remount"]);
}

#[test]
fn shrink_below_usage_is_refused_and_nothing_runs() {
    let p = run(
        &MountSpec {
            size: 64 << 20,
            ..mspec()
        },
        &offloaded(live()),
    );
    let why = refused(&p);
    assert!(
        why.contains("100MiB are in use") && why.contains("at least 100MiB"),
        "{why}"
    );
    assert!(p.steps.is_empty());
}

#[test]
fn inode_limit_below_usage_is_refused() {
    let p = run(
        &MountSpec {
            inodes: Some(1000),
            ..mspec()
        },
        &offloaded(live()),
    );
    assert!(refused(&p).contains("5000 inodes are in use"));
    let p = run(
        &MountSpec {
            inodes: Some(200_000),
            ..mspec()
        },
        &offloaded(live()),
    );
    assert_eq!(actions(&p), ["remount"]);
}

#[test]
fn noswap_cannot_change_online() {
    let p = run(
        &MountSpec {
            noswap: true,
            ..mspec()
        },
        &offloaded(live()),
    );
    assert!(refused(&p).contains("tmpfsctl down"));
}

#[test]
fn flag_changes_are_remounts() {
    let m = MountSpec {
        flags: Flags {
            noexec: true,
            ..SECURE
        },
        ..mspec()
    };
    let p = run(&m, &offloaded(live()));
    let Step::Remount { changes, .. } = &p.steps[0] else {
        panic!("{p:?}")
    };
    assert_eq!(
        changes,
        &[Change {
            what: "noexec",
            from: "off".into(),
            to: "on".into()
        }]
    );
    let m = MountSpec {
        flags: Flags {
            nodev: false,
            ..SECURE
        },
        ..mspec()
    };
    assert_eq!(actions(&run(&m, &offloaded(live()))), ["remount"]);
}

#[test]
fn atime_is_only_managed_when_the_spec_says() {
    let m = MountSpec {
        flags: Flags {
            atime: Some(Atime::Noatime),
            ..SECURE
        },
        ..mspec()
    };
    let p = run(&m, &offloaded(live()));
    let Step::Remount { changes, .. } = &p.steps[0] else {
        panic!("{p:?}")
    };
    assert_eq!(changes[0].what, "atime");
    let m = MountSpec {
        flags: Flags {
            atime: Some(Atime::Relatime),
            ..SECURE
        },
        ..mspec()
    };
    assert!(run(&m, &offloaded(live())).steps.is_empty());
}

#[test]
fn huge_policy_change_is_a_remount() {
    let p = run(
        &MountSpec {
            huge: Huge::WithinSize,
            ..mspec()
        },
        &offloaded(live()),
    );
    let Step::Remount { changes, .. } = &p.steps[0] else {
        panic!("{p:?}")
    };
    assert_eq!(
        changes[0],
        Change {
            what: "huge",
            from: "never".into(),
            to: "within_size".into()
        }
    );
    let other = tmpfs::LiveTmpfs { huge: None, ..live() };
    assert_eq!(actions(&run(&mspec(), &offloaded(other))), ["remount"]);
}

#[test]
fn root_owner_and_mode_follow_spec_then_disk() {
    let p = run(
        &MountSpec {
            mode: Some(0o700),
            ..mspec()
        },
        &offloaded(live()),
    );
    assert_eq!(
        p.steps,
        [Step::SetRoot {
            path: "/var/cache/nginx".into(),
            from: DISK,
            to: RootAttrs { mode: 0o700, ..DISK }
        }]
    );
    let changed_disk = Observed {
        disk: Some(RootAttrs { uid: 1, ..DISK }),
        ..offloaded(live())
    };
    assert_eq!(actions(&run(&mspec(), &changed_disk)), ["set-root"]);
    let unseen_disk = Observed {
        disk: None,
        ..offloaded(tmpfs::LiveTmpfs {
            root: RootAttrs {
                uid: 5,
                gid: 5,
                mode: 0o700,
            },
            ..live()
        })
    };
    assert!(
        run(&mspec(), &unseen_disk).steps.is_empty(),
        "without a view of the disk the root is kept"
    );
}

#[test]
fn whole_plan_cleans_leftovers_and_reports_orphans() {
    let spec = Spec {
        file: PathBuf::from("x.yaml"),
        max_total: u64::MAX,
        mounts: vec![mspec()],
        agent: AgentSettings::default(),
    };
    let world = World {
        table: MountTable::default(),
        mem: MemInfo {
            mem_total: 1 << 34,
            mem_available: 1 << 33,
            shmem: 0,
        },
        page_size: PAGE,
        mounts: vec![offloaded(live())],
        leftovers: vec![Leftover {
            name: "gone".into(),
            path: "/run/tmpfsctl/lower/gone".into(),
            mounted: true,
        }],
        orphans: vec![("old".into(), "/srv/old".into())],
        state_not_private: vec![("/run/tmpfsctl/lower".into(), false)],
    };
    let p = plan(&spec, &world, &st());
    assert!(p.changes());
    assert_eq!(
        p.cleanup,
        [Step::RemoveLeftover {
            path: Path::new("/run/tmpfsctl/lower/gone").into(),
            mounted: true
        }]
    );
    assert_eq!(p.orphans.len(), 1);
    assert!(
        p.prepare.is_empty(),
        "nothing is built, so the state dirs are left alone"
    );
    let world = World {
        leftovers: vec![],
        ..world
    };
    assert!(!plan(&spec, &world, &st()).changes());
    let world = World {
        mounts: vec![on_disk()],
        ..world
    };
    let p = plan(&spec, &world, &st());
    assert_eq!(
        p.prepare,
        [Step::PrivateStateDir {
            dir: "/run/tmpfsctl/lower".into(),
            mounted: false
        }]
    );
}

#[test]
fn descriptions_name_paths_and_values() {
    let p = run(
        &MountSpec {
            inodes: Some(1000),
            ..mspec()
        },
        &on_disk(),
    );
    let d: Vec<String> = p.steps.iter().map(Step::describe).collect();
    assert_eq!(
        d[0],
        "bind /var/cache/nginx to /run/tmpfsctl/lower/nginx (private)"
    );
    assert_eq!(
        d[1],
        "mount tmpfs tmpfsctl-nginx at /run/tmpfsctl/stage/nginx (size=512MiB nr_inodes=1000 huge=never nosuid nodev root 33:33 0750)"
    );
    assert_eq!(d[3], "move /run/tmpfsctl/stage/nginx onto /var/cache/nginx");
}

#[test]
fn a_shared_side_bind_is_made_private_before_anything_is_moved() {
    let p = run(
        &mspec(),
        &Observed {
            side: SideBind::Shared,
            ..on_disk()
        },
    );
    assert_eq!(
        actions(&p),
        ["private-side", "mount-stage", "seed", "move-into-place"]
    );
}

#[test]
fn a_live_mount_gets_its_side_bind_back() {
    let p = run(
        &mspec(),
        &Observed {
            side: SideBind::Absent,
            disk: None,
            ..offloaded(live())
        },
    );
    assert_eq!(actions(&p), ["restore-side"]);
    let p = run(
        &mspec(),
        &Observed {
            side: SideBind::Stale,
            disk: None,
            ..offloaded(live())
        },
    );
    assert_eq!(actions(&p), ["detach-side", "restore-side"]);
    let p = run(
        &mspec(),
        &Observed {
            side: SideBind::Shared,
            ..offloaded(live())
        },
    );
    assert_eq!(actions(&p), ["private-side"]);
}

#[test]
fn an_unseen_disk_never_resets_a_live_root_to_create_defaults() {
    let m = MountSpec {
        create: true,
        ..mspec()
    };
    let o = Observed {
        side: SideBind::Absent,
        disk: None,
        ..offloaded(live())
    };
    assert_eq!(actions(&run(&m, &o)), ["restore-side"], "no set-root to 0:0 0755");
}

#[test]
fn the_agents_resize_is_one_remount_keeping_every_other_option() {
    let from = live().usage;
    let s = resize(&mspec(), DISK, from, 1 << 30, 200_000);
    let Step::Remount {
        path,
        options: backend::MountOptions::Tmpfs(o),
        changes,
    } = &s
    else {
        panic!("{s:?}")
    };
    assert_eq!(path, Path::new("/var/cache/nginx"));
    assert_eq!((o.size, o.nr_inodes), (1 << 30, Some(200_000)));
    assert_eq!((o.flags, o.huge, o.root), (SECURE, Huge::Never, DISK));
    assert_eq!(
        changes.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        ["size 512MiB -> 1GiB", "nr_inodes 100000 -> 200000"]
    );
    let same_inodes = resize(&mspec(), DISK, from, 256 << 20, from.inodes);
    assert_eq!(
        same_inodes.describe(),
        "remount /var/cache/nginx online: size 512MiB -> 256MiB"
    );
}

fn overlay_spec() -> MountSpec {
    MountSpec {
        seed: Seed::Overlay,
        ..mspec()
    }
}

#[test]
fn an_overlay_is_mounted_onto_the_path_without_a_seed_or_a_move() {
    let p = run(&overlay_spec(), &on_disk());
    assert_eq!(actions(&p), ["bind-side", "mount-stage", "mount-overlay"]);
    match p.steps.last() {
        Some(Step::MountOverlay {
            lower,
            stage,
            path,
            root,
            flags,
            ..
        }) => {
            assert_eq!(lower, Path::new("/run/tmpfsctl/lower/nginx"));
            assert_eq!(stage, Path::new("/run/tmpfsctl/stage/nginx"));
            assert_eq!(path, Path::new("/var/cache/nginx"));
            assert_eq!(*root, DISK, "the upper layer's root is the disk directory's");
            assert_eq!(*flags, mspec().flags);
        }
        other => panic!("not an overlay mount: {other:?}"),
    }
}

#[test]
fn an_upper_layer_left_without_its_overlay_is_never_detached() {
    let o = Observed {
        stage_mounted: true,
        stage_holds_upper: true,
        ..on_disk()
    };
    let p = run(&overlay_spec(), &o);
    assert!(p.steps.is_empty(), "{:?}", p.steps);
    assert!(cannot(&p).contains("run `tmpfsctl sync nginx`"), "{p:?}");
}

#[test]
fn switching_a_live_mount_between_copy_and_overlay_is_refused() {
    let p = run(&overlay_spec(), &offloaded(live()));
    assert!(refused(&p).contains("the live mount is a full copy in RAM and the spec asks for an overlay"));
    assert!(p.steps.is_empty());
}
