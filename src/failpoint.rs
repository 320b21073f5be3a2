//! Crash points for the crash-consistency tests: `TMPFSCTL_FAILPOINT=<point>[:<name>]`
//! SIGKILLs this process when it reaches that point (for that mount), as `kill -9`
//! or a power cut would. `TMPFSCTL_FAILPOINT=stop=<point>[,<point>…][:<name>]` stops
//! it at each of those points instead (SIGSTOP), so that a test can act in that
//! window, as an application would, and then let it go on (SIGCONT).
//! `TMPFSCTL_FAILPOINT=hold=<point>[,<point>…][:<name>]` holds only the thread that
//! reaches it, until the file `TMPFSCTL_FAILPOINT_GO` names exists (at most
//! [`HOLD_AT_MOST`]; `<that file>.held` is made as it starts): a long write-back,
//! while the rest of the process goes on (the agent's loop beside its write-back
//! worker). `TMPFSCTL_FAILPOINT=panic=<point>[,<point>…][:<name>]` panics the thread
//! that reaches it for as long as that file does not exist. Unset, each check is
//! one environment lookup.
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
//! of a disk directory the application removed, before it binds the new one;
//! `before-writeback` as the write-back of a held tmpfs starts (`down`'s after its
//! switch, the agent's on its worker); `overlay-placed` (of any mount) each time a
//! `seed: overlay` write-back after its switch has put a file on disk and recorded
//! that; `dir-made` (of any mount) each time a write-back has made a directory on
//! disk and recorded that, before it gives it its owner and mode.

use std::time::{Duration, Instant};

use nix::sys::signal::{raise, Signal};

/// How long a `hold=` point holds its thread when the test never lets it go.
pub const HOLD_AT_MOST: Duration = Duration::from_secs(120);

/// Dies (or stops) here if the tests asked for it.
pub fn hit(point: &str, name: &str) {
    let Some(fp) = std::env::var_os("TMPFSCTL_FAILPOINT") else {
        return;
    };
    let fp = fp.to_string_lossy();
    let (act, fp) = if let Some(rest) = fp.strip_prefix("stop=") {
        (Act::Signal(Signal::SIGSTOP), rest)
    } else if let Some(rest) = fp.strip_prefix("hold=") {
        (Act::Hold, rest)
    } else if let Some(rest) = fp.strip_prefix("panic=") {
        (Act::Panic, rest)
    } else {
        (Act::Signal(Signal::SIGKILL), &*fp)
    };
    let (want, mount) = fp.split_once(':').unwrap_or((fp, name));
    let wanted = match act {
        Act::Signal(Signal::SIGKILL) => want == point,
        _ => want.split(',').any(|w| w == point),
    };
    if !wanted || mount != name {
        return;
    }
    match act {
        Act::Signal(s) => {
            let _ = raise(s);
        }
        Act::Hold => hold(),
        Act::Panic if !go().is_some_and(|g| g.exists()) => panic!("failpoint {point} of `{name}`"),
        Act::Panic => {}
    }
}

enum Act {
    Signal(Signal),
    Hold,
    Panic,
}

/// The file `TMPFSCTL_FAILPOINT_GO` names.
fn go() -> Option<std::path::PathBuf> {
    std::env::var_os("TMPFSCTL_FAILPOINT_GO").map(Into::into)
}

fn hold() {
    let go = go();
    if let Some(g) = &go {
        let mut held = g.clone().into_os_string();
        held.push(".held");
        let _ = std::fs::write(held, b"");
    }
    let start = Instant::now();
    while start.elapsed() < HOLD_AT_MOST && !go.as_ref().is_some_and(|g| g.exists()) {
        std::thread::sleep(Duration::from_millis(20));
    }
}
