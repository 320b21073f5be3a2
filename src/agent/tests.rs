use super::*;

#[test]
fn holders_of_a_detached_mount_read_right() {
    use crate::host::procs::Holder;
    let h = |command: &str, pid| Holder {
        pid,
        command: command.into(),
        uses: 1,
    };
    assert_eq!(holders_keep(&[]), "processes keep their");
    assert_eq!(holders_keep(&[h("squid", 768)]), "squid (768) keeps its");
    assert_eq!(holders_keep(&[h("a", 1), h("b", 2)]), "a (1), b (2) keep their");
}

#[test]
fn psi_some_avg10() {
    let t =
        "some avg10=12.34 avg60=1.00 avg300=0.00 total=123\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=1\n";
    assert_eq!(parse_psi(t), Some(12.34));
    assert_eq!(parse_psi("full avg10=1.00\n"), None);
    assert_eq!(parse_psi(""), None);
}

#[test]
fn fallback_records_count_only_with_the_degraded_marker() {
    let d = tempfile::tempdir().unwrap();
    let st = State::new(d.path());
    st.ensure_dirs().unwrap();
    let rec = FallbackRecord {
        at: 1,
        reason: "high".into(),
        reoffload_at: Some(61),
    };
    st.set_fallback("a", &rec).unwrap();
    assert_eq!(st.fallback("a"), None, "apply or down cleared the marker");
    st.set_degraded("a", "fell back").unwrap();
    assert_eq!(st.fallback("a"), Some(rec));
    st.clear_fallback("a");
    assert_eq!(st.fallback("a"), None);
}

#[test]
fn growth_within_max_size_is_kept_by_the_agents_apply() {
    use crate::backend::{tmpfs, Live};
    let mut m = crate::spec::MountSpec {
        name: "c".into(),
        path: "/x".into(),
        backend: Default::default(),
        compression: None,
        fs: crate::spec::ZramFs::Ext4,
        size: 100 << 20,
        inodes: Some(1000),
        owner: None,
        group: None,
        mode: None,
        create: false,
        takeover: false,
        flags: Default::default(),
        huge: crate::spec::Huge::Never,
        noswap: false,
        seed: crate::spec::Seed::Copy,
        persist: Persist::None,
        on_failure: crate::spec::OnFailure::KeepDisk,
        before: vec![],
        watchdog: crate::spec::Watchdog {
            actions: vec![Action::Grow],
            max_size: Some(200 << 20),
            ..Default::default()
        },
    };
    let live = |size: u64| {
        AtPath::Ours(Live::Tmpfs(tmpfs::LiveTmpfs {
            dev: (0, 1),
            size,
            nr_inodes: 1500,
            huge: None,
            noswap: false,
            flags: Default::default(),
            root: mount::RootAttrs {
                uid: 0,
                gid: 0,
                mode: 0o755,
            },
            usage: Usage {
                size,
                used: 0,
                inodes: 1500,
                inodes_used: 0,
            },
        }))
    };
    let mut grown = m.clone();
    keep_growth(&mut grown, &live(150 << 20), 4096);
    assert_eq!((grown.size, grown.inodes), (150 << 20, Some(1500)));
    let mut beyond = m.clone();
    keep_growth(&mut beyond, &live(300 << 20), 4096);
    assert_eq!(beyond.size, 100 << 20, "beyond max_size: back to the spec");
    m.watchdog.actions = vec![Action::Evict];
    let mut no_grow = m.clone();
    keep_growth(&mut no_grow, &live(150 << 20), 4096);
    assert_eq!(no_grow.size, 100 << 20);
}
