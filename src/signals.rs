//! SIGINT, SIGTERM and SIGHUP during a run of `bench` or `advise`: a flag their
//! loops check, so that `bench` cleans up and `advise` reports what it has
//! before the exit. SIGTERM and SIGHUP during `down`: noted, and the write-back
//! goes on.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

const SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// While alive, SIGINT/SIGTERM/SIGHUP only set a flag the loops check, so
/// cleanup runs; the previous dispositions come back on drop.
pub struct SignalGuard(Vec<(Signal, SigAction)>);

impl SignalGuard {
    pub(crate) fn install() -> Result<SignalGuard> {
        Self::install_for(&SIGNALS)
    }

    /// For `signals` only.
    pub(crate) fn install_for(signals: &[Signal]) -> Result<SignalGuard> {
        INTERRUPTED.store(false, Ordering::SeqCst);
        let act = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        let mut old = Vec::new();
        for &s in signals {
            // SAFETY: the handler only stores to an atomic (async-signal-safe).
            let prev = unsafe { sigaction(s, &act) }.with_context(|| format!("installing a {s} handler"))?;
            old.push((s, prev));
        }
        Ok(SignalGuard(old))
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (s, prev) in &self.0 {
            // SAFETY: restores the disposition that was there before.
            let _ = unsafe { sigaction(*s, prev) };
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

pub fn check_interrupt() -> Result<()> {
    if interrupted() {
        return Err(Interrupted.into());
    }
    Ok(())
}
