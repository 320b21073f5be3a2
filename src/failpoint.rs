//! Crash points for the crash-consistency tests: `TMPFSCTL_FAILPOINT=<point>[:<name>]`
//! SIGKILLs this process when it reaches that point (for that mount), as `kill -9`
//! or a power cut would. Unset, each check is one environment lookup.
//!
//! Points: `after-<action>` after each step of `apply` (see [`crate::execute`]);
//! `after-hold`, `after-switch` in the switch to disk; `after-merge`,
//! `after-baseline` in a write-back; `after-release` once a held copy is unmounted.

/// Dies here if the tests asked for it.
pub fn hit(point: &str, name: &str) {
    let Some(fp) = std::env::var_os("TMPFSCTL_FAILPOINT") else {
        return;
    };
    let fp = fp.to_string_lossy();
    let (want, mount) = fp.split_once(':').unwrap_or((&fp, name));
    if want == point && mount == name {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
