//! Crash points for the crash-consistency tests: `TMPFSCTL_FAILPOINT=<point>[:<name>]`
//! SIGKILLs this process when it reaches that point (for that mount), as `kill -9`
//! or a power cut would. `TMPFSCTL_FAILPOINT=stop=<point>[,<point>…][:<name>]` stops
//! it at each of those points instead (SIGSTOP), so that a test can act in that
//! window, as an application would, and then let it go on (SIGCONT). Unset, each
//! check is one environment lookup.
//!
//! Points: `after-<action>` after each step of `apply` (see [`crate::execute`]) and
//! `before-switch` right before a seeded tmpfs goes in place (its last look for what
//! the disk deleted meanwhile done), `seed-switched` right after, before what the
//! disk deleted since that look is dropped; `after-hold`, `after-switch` in the switch to
//! disk, `before-unmount` before a volatile mount's; `after-merge`, `after-baseline` in a write-back; `after-release` once a held
//! copy is unmounted; `before-removals` (of any mount: give no name) in a write-back
//! once its copies are durable, before it removes what the RAM deleted;
//! `seed-dir-dropped` (of any mount) once `apply` emptied, right after the switch, a
//! directory the disk deleted in the last moment before it; `seed-merged` once
//! `apply` merged into the tmpfs what the application wrote on disk during the seed,
//! before it records that; `side-detached` once a write-back took away the side bind
//! of a disk directory the application removed, before it binds the new one.

use nix::sys::signal::{raise, Signal};

/// Dies (or stops) here if the tests asked for it.
pub fn hit(point: &str, name: &str) {
    let Some(fp) = std::env::var_os("TMPFSCTL_FAILPOINT") else {
        return;
    };
    let fp = fp.to_string_lossy();
    let (signal, fp) = match fp.strip_prefix("stop=") {
        Some(rest) => (Signal::SIGSTOP, rest),
        None => (Signal::SIGKILL, &*fp),
    };
    let (want, mount) = fp.split_once(':').unwrap_or((fp, name));
    let wanted = match signal {
        Signal::SIGSTOP => want.split(',').any(|w| w == point),
        _ => want == point,
    };
    if wanted && mount == name {
        let _ = raise(signal);
    }
}
