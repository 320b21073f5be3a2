//! The agent's write-backs run beside its checks: a long write-back of one mount
//! (held at a failpoint for as long as the test wants) never stops the eviction of
//! another, and a fallback's write-back keeps what the application deleted on disk
//! after the switch deleted.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::agent_integration::{fill_twice_over, wait_offloaded, Agent};
use crate::common::Sandbox;

/// `big`'s watchdog in the fallback tests: it falls back past half its size.
const FALLBACK_PAST_HALF: &str = "    watchdog: { high: 50%, low: 20%, action: fallback }\n";

/// Two mounts: `big`, persisted with `persist_big`, and `vol`, volatile, 8 MiB,
/// evicting at 80%.
fn two_mounts(sb: &Sandbox, persist_big: &str, watchdog_big: &str) -> (PathBuf, PathBuf, PathBuf) {
    let big = sb.cache_dir("big", 0, 0, 0o755);
    let vol = sb.cache_dir("vol", 0, 0, 0o755);
    let spec = sb.path("two.yaml");
    fs::write(
        &spec,
        format!(
            "version: 1\nmounts:\n  - name: big\n    path: {}\n    size: 8MiB\n    persist: {persist_big}\n{watchdog_big}  - name: vol\n    path: {}\n    size: 8MiB\n    watchdog: {{ high: 80%, low: 40%, action: evict }}\n",
            big.display(),
            vol.display()
        ),
    )
    .unwrap();
    (spec, big, vol)
}

/// The agent on `spec` with `TMPFSCTL_FAILPOINT=failpoint`, and the file that lets
/// its failpoint go.
fn start_at(sb: &Sandbox, spec: &Path, failpoint: &str) -> (Agent, PathBuf) {
    let go = sb.path("go");
    let agent = Agent::start(
        sb,
        spec,
        &[],
        &[
            ("TMPFSCTL_FAILPOINT", Path::new(failpoint)),
            ("TMPFSCTL_FAILPOINT_GO", &go),
        ],
    );
    (agent, go)
}

/// Waits until a thread of the agent is held at its failpoint.
fn wait_held(agent: &mut Agent, go: &Path) {
    let held = go.with_extension("held");
    let start = std::time::Instant::now();
    while !held.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the failpoint was never reached\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// While the schedule's write-back of `big` is held, `vol` is filled to twice its
/// size: every write finds room. Before, the write-back ran in the agent's loop and
/// nothing was evicted until it ended.
#[test]
fn a_long_periodic_write_back_does_not_hold_up_the_eviction_of_another_mount() {
    let sb = Sandbox::new();
    let (spec, big, vol) = two_mounts(&sb, "every 10s", "");
    let (mut agent, go) = start_at(&sb, &spec, "hold=after-merge:big");
    wait_offloaded(&mut agent, "big");
    wait_offloaded(&mut agent, "vol");
    fs::write(big.join("kept"), "v1").unwrap();
    wait_held(&mut agent, &go);
    let enospc = fill_twice_over(&vol);
    assert_eq!(
        agent.metrics().actions("big", "sync"),
        0.0,
        "the write-back was not held\n{}",
        agent.log()
    );
    fs::write(&go, "").unwrap();
    agent.wait_for("the write-back", |m| m.actions("big", "sync") >= 1.0);
    assert_eq!(enospc, 0, "writes that found vol full\n{}", agent.log());
    assert!(agent.metrics().actions("vol", "evict") >= 1.0, "{}", agent.log());
    assert_eq!(fs::read_to_string(sb.state.join("lower/big/kept")).unwrap(), "v1");
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}

/// `big` falls back; its write-back is held. The application is on its disk
/// directory at once; there it makes a name the RAM copy has and deletes it again,
/// and deletes a file both sides had. Meanwhile `vol` fills twice over and every
/// write finds room. Once the write-back is let go, the RAM's own file is on disk,
/// and neither deleted name came back: the watch for deletions started before the
/// switch went with the write-back to the worker.
#[test]
fn a_fallback_switches_at_once_and_writes_back_beside_the_checks() {
    let sb = Sandbox::new();
    let (spec, big, vol) = two_mounts(&sb, "on-stop", FALLBACK_PAST_HALF);
    fs::write(big.join("both"), "seeded").unwrap();
    let (mut agent, go) = start_at(&sb, &spec, "hold=before-writeback:big");
    wait_offloaded(&mut agent, "big");
    wait_offloaded(&mut agent, "vol");
    fs::write(big.join("again"), "ram").unwrap();
    fs::write(big.join("ram-only"), "ram").unwrap();
    fs::write(big.join("filler"), vec![1u8; 5 << 20]).unwrap();
    wait_held(&mut agent, &go);
    let top = sb.top(&big);
    assert!(
        top.as_ref().is_none_or(|e| e.fstype != "tmpfs"),
        "still on the tmpfs: {top:?}"
    );
    fs::write(big.join("again"), "disk").unwrap();
    fs::remove_file(big.join("again")).unwrap();
    fs::remove_file(big.join("both")).unwrap();
    let enospc = fill_twice_over(&vol);
    assert!(
        sb.state.join("held/big").exists(),
        "the write-back was not held\n{}",
        agent.log()
    );
    fs::write(&go, "").unwrap();
    agent.wait_for("the write-back", |m| m.actions("big", "sync") >= 1.0);
    assert_eq!(enospc, 0, "writes that found vol full\n{}", agent.log());
    assert!(agent.metrics().actions("vol", "evict") >= 1.0, "{}", agent.log());
    assert_eq!(fs::read_to_string(big.join("ram-only")).unwrap(), "ram");
    assert!(
        !big.join("again").exists(),
        "a name deleted on disk came back\n{}",
        agent.log()
    );
    assert!(
        !big.join("both").exists(),
        "a name deleted on disk came back\n{}",
        agent.log()
    );
    assert_eq!(agent.metrics().state("big"), Some("fallback"));
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}

/// The thread of a fallback's write-back panics: the agent takes that for a failed
/// write-back, lets the state lock go, and retries it; once the cause is gone the
/// RAM copy reaches the disk, and another command gets the lock meanwhile. Before,
/// the loop never learnt that the thread had ended, held the lock for good and never
/// retried (a review helper's probe).
#[test]
fn a_write_back_whose_thread_panics_is_retried_and_lets_the_lock_go() {
    let sb = Sandbox::new();
    let (spec, big, _vol) = two_mounts(&sb, "on-stop", FALLBACK_PAST_HALF);
    let (mut agent, go) = start_at(&sb, &spec, "panic=before-writeback:big");
    wait_offloaded(&mut agent, "big");
    fs::write(big.join("ram"), "ram").unwrap();
    fs::write(big.join("filler"), vec![1u8; 5 << 20]).unwrap();
    agent.wait_for("the fallback", |m| m.state("big") == Some("fallback"));
    let start = std::time::Instant::now();
    while !agent.log().contains("panicked") {
        assert!(start.elapsed() < Duration::from_secs(30), "{}", agent.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let sync = sb.run([
        "sync".as_ref(),
        spec.as_os_str(),
        "vol".as_ref(),
        "--wait".as_ref(),
        "5".as_ref(),
    ]);
    assert_eq!(
        sync.code,
        Some(0),
        "the lock stayed held\n{sync}\n{}",
        agent.log()
    );
    fs::write(&go, "").unwrap();
    agent.wait_for("the retried write-back", |m| m.actions("big", "sync") >= 1.0);
    assert_eq!(fs::read_to_string(big.join("ram")).unwrap(), "ram");
    assert_eq!(agent.stop(), 0, "{}", agent.log());
}
