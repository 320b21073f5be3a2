//! Where log lines go: the journal under systemd, else stderr, with host strings
//! escaped like all human output.

use std::path::Path;

/// Logs to the journal under systemd (JOURNAL_STREAM set and journald's
/// socket present), else to stderr. `TMPFSCTL_LOG` filters (default `default`:
/// `info` for the agent, `warn` for the other commands). `queued` (the agent):
/// stderr is written by a thread of its own, through a bounded queue (see
/// [`queue`]).
pub fn init(default: &str, queued: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::prelude::*;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("TMPFSCTL_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
    };
    let journal =
        std::env::var_os("JOURNAL_STREAM").is_some() && Path::new("/run/systemd/journal/socket").exists();
    if journal {
        if let Ok(layer) = tracing_journald::layer() {
            let _ = tracing_subscriber::registry()
                .with(filter())
                .with(
                    layer
                        .with_syslog_identifier("tmpfsctl-agent".into())
                        .with_field_prefix(Some("TMPFSCTL".into())),
                )
                .try_init();
            return;
        }
    }
    let ansi = std::io::stderr().is_terminal();
    if queued && queue::start() {
        let _ = tracing_subscriber::registry()
            .with(filter())
            .with(
                tracing_subscriber::fmt::layer()
                    .fmt_fields(EscapedFields)
                    .with_writer(queue::line)
                    .log_internal_errors(false)
                    .with_target(false)
                    .with_ansi(ansi),
            )
            .try_init();
        return;
    }
    let _ = tracing_subscriber::registry()
        .with(filter())
        .with(
            tracing_subscriber::fmt::layer()
                .fmt_fields(EscapedFields)
                .with_writer(crate::out::stderr)
                .log_internal_errors(false)
                .with_target(false)
                .with_ansi(ansi),
        )
        .try_init();
}

/// Waits until the queued log lines are written, at most `max` (a reader that
/// stopped reading may never take them).
pub fn flush(max: std::time::Duration) {
    queue::flush(max);
}

/// The agent's log lines on stderr go through a bounded queue to a thread that
/// writes them: a pipe whose reader stopped reading blocked the agent in `write`
/// for good, with every eviction and its answer to SIGTERM (a hunting helper's
/// probe). A line that finds the queue full is dropped, and counted in a line of
/// its own once the reader takes lines again.
pub mod queue {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::mpsc::{sync_channel, SyncSender};
    use std::sync::{Arc, OnceLock};
    use std::time::{Duration, Instant};

    /// Lines held for a reader that is behind: a burst of a few seconds.
    const LINES: usize = 4096;

    #[derive(Default)]
    struct Counts {
        pending: AtomicUsize,
        dropped: AtomicU64,
    }

    struct Queue {
        tx: SyncSender<Vec<u8>>,
        counts: Arc<Counts>,
    }

    static QUEUE: OnceLock<Queue> = OnceLock::new();

    /// Starts the writing thread; whether the queue is in place.
    pub fn start() -> bool {
        if QUEUE.get().is_some() {
            return true;
        }
        let (tx, rx) = sync_channel::<Vec<u8>>(LINES);
        let counts = Arc::new(Counts::default());
        let theirs = Arc::clone(&counts);
        let spawned = std::thread::Builder::new().name("log".into()).spawn(move || {
            // Started before the agent blocks its signals (it reads them from a
            // descriptor): one delivered here would end the process.
            let _ = nix::sys::signal::SigSet::all().thread_block();
            for line in rx {
                let _ = std::io::Write::write_all(&mut crate::out::stderr(), &line);
                theirs.pending.fetch_sub(1, Ordering::SeqCst);
                let lost = theirs.dropped.swap(0, Ordering::SeqCst);
                if lost > 0 {
                    let note = format!("tmpfsctl: {lost} log lines dropped: standard error was not read\n");
                    let _ = std::io::Write::write_all(&mut crate::out::stderr(), note.as_bytes());
                }
            }
        });
        spawned.is_ok() && QUEUE.set(Queue { tx, counts }).is_ok()
    }

    /// One log line, queued when the formatter is done with it.
    pub struct Line(Vec<u8>);

    pub fn line() -> Line {
        Line(Vec::with_capacity(160))
    }

    impl std::io::Write for Line {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Drop for Line {
        fn drop(&mut self) {
            let Some(q) = QUEUE.get() else { return };
            if self.0.is_empty() {
                return;
            }
            q.counts.pending.fetch_add(1, Ordering::SeqCst);
            if q.tx.try_send(std::mem::take(&mut self.0)).is_err() {
                q.counts.pending.fetch_sub(1, Ordering::SeqCst);
                q.counts.dropped.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    pub(super) fn flush(max: Duration) {
        let Some(q) = QUEUE.get() else { return };
        let until = Instant::now() + max;
        while q.counts.pending.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The fields of a log line as the default formatter writes them, with the
/// host strings in them (paths, process names, error messages) escaped like
/// all human output ([`crate::out::escape`]): a file name cannot forge a log
/// line or reach the terminal. (The journal stores fields as they are;
/// journalctl shows a field with control characters as blob data.)
struct EscapedFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for EscapedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut plain = String::new();
        tracing_subscriber::fmt::format::DefaultFields::new()
            .format_fields(tracing_subscriber::fmt::format::Writer::new(&mut plain), fields)?;
        writer.write_str(&crate::out::escape(&plain))
    }
}
