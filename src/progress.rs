//! Progress of a long seed or write-back. After [`SHOW_AFTER`] it shows: a
//! line kept up to date on a terminal, else a log line every [`LOG_EVERY`]
//! (the journal, under systemd); and from the start a record in the state
//! directory, which `tmpfsctl status` shows while the work runs.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use crate::spec::size::format_bytes;
use crate::state::{unix_now, ProgressRecord, State};

pub const SHOW_AFTER: Duration = Duration::from_secs(2);
pub const LOG_EVERY: Duration = Duration::from_secs(10);
const TERMINAL_EVERY: Duration = Duration::from_millis(200);
const RECORD_EVERY: Duration = Duration::from_secs(1);

pub struct Progress<'a> {
    state: &'a State,
    name: String,
    rec: ProgressRecord,
    started: Instant,
    terminal: bool,
    shown_at: Option<Instant>,
    recorded_at: Option<Instant>,
}

impl<'a> Progress<'a> {
    /// `op`: `seed` or `write-back`. `terminal`: the caller's output is for a
    /// person (the line goes to stderr only when that is a terminal too).
    pub fn new(
        state: &'a State,
        name: &str,
        op: &str,
        terminal: bool,
        entries_total: Option<u64>,
        bytes_total: Option<u64>,
    ) -> Progress<'a> {
        let now = unix_now();
        Progress {
            state,
            name: name.to_string(),
            rec: ProgressRecord {
                op: op.to_string(),
                pid: std::process::id(),
                started: now,
                updated: now,
                entries: 0,
                entries_total,
                bytes: 0,
                bytes_total,
            },
            started: Instant::now(),
            terminal: terminal && std::io::stderr().is_terminal(),
            shown_at: None,
            recorded_at: None,
        }
    }

    /// Times the operation from `at`, where an earlier part of it began (the seed
    /// before the merge that completes it).
    pub fn begun_at(mut self, at: Instant) -> Self {
        self.started = at;
        self
    }

    /// The running totals: entries done and data bytes copied.
    pub fn update(&mut self, entries: u64, bytes: u64) {
        self.rec.entries = entries;
        self.rec.bytes = bytes;
        let now = Instant::now();
        if self.recorded_at.is_none_or(|t| now - t >= RECORD_EVERY) {
            self.recorded_at = Some(now);
            self.rec.updated = unix_now();
            // Only `status` reads it: a full state directory must not stop the work.
            let _ = self.state.write_progress(&self.name, &self.rec);
        }
        if self.started.elapsed() < SHOW_AFTER {
            return;
        }
        let every = if self.terminal { TERMINAL_EVERY } else { LOG_EVERY };
        if self.shown_at.is_some_and(|t| now - t < every) {
            return;
        }
        self.shown_at = Some(now);
        let line = describe(&self.name, &self.rec, self.started.elapsed());
        if self.terminal {
            crate::out::eprint(&format!("\r{line}   "));
        } else if tracing::enabled!(tracing::Level::INFO) {
            tracing::info!(mount = self.name.as_str(), "{line}");
        } else {
            crate::out::eprint(&format!("{line}\n"));
        }
    }
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        if self.terminal && self.shown_at.is_some() {
            crate::out::eprint("\r\x1b[K");
        }
        self.state.clear_progress(&self.name);
    }
}

/// `seeding nginx: 12000 of 20000 entries, 300MiB of 800MiB (37%), 120MiB/s, 3s`.
pub fn describe(name: &str, r: &ProgressRecord, elapsed: Duration) -> String {
    let verb = if r.op == "seed" { "seeding" } else { "writing back" };
    let of = |done: String, total: Option<String>| match total {
        Some(t) => format!("{done} of {t}"),
        None => done,
    };
    let entries = of(r.entries.to_string(), r.entries_total.map(|t| t.to_string()));
    let bytes = of(format_bytes(r.bytes), r.bytes_total.map(format_bytes));
    let pct = r
        .bytes_total
        .filter(|t| *t > 0)
        .map(|t| format!(" ({}%)", (r.bytes.min(t) * 100 / t)))
        .unwrap_or_default();
    let secs = elapsed.as_secs_f64().max(1e-3);
    format!(
        "{verb} {}: {entries} entries, {bytes}{pct}, {}/s, {}s",
        crate::out::escape(name),
        format_bytes((r.bytes as f64 / secs) as u64),
        elapsed.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(op: &str, totals: bool) -> ProgressRecord {
        ProgressRecord {
            op: op.into(),
            pid: 1,
            started: 0,
            updated: 0,
            entries: 12_000,
            entries_total: totals.then_some(20_000),
            bytes: 300 << 20,
            bytes_total: totals.then_some(800 << 20),
        }
    }

    #[test]
    fn lines_name_what_is_done_against_the_totals_known() {
        assert_eq!(
            describe("nginx", &rec("seed", true), Duration::from_secs(3)),
            "seeding nginx: 12000 of 20000 entries, 300MiB of 800MiB (37%), 100MiB/s, 3s"
        );
        assert_eq!(
            describe("c", &rec("write-back", false), Duration::from_secs(10)),
            "writing back c: 12000 entries, 300MiB, 30MiB/s, 10s"
        );
    }
}
