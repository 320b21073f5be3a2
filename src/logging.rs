//! Where log lines go: the journal under systemd, else stderr, with host strings
//! escaped like all human output.

use std::path::Path;

/// Logs to the journal under systemd (JOURNAL_STREAM set and journald's
/// socket present), else to stderr. `TMPFSCTL_LOG` filters (default `default`:
/// `info` for the agent, `warn` for the other commands).
pub fn init(default: &str) {
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
    let _ = tracing_subscriber::registry()
        .with(filter())
        .with(
            tracing_subscriber::fmt::layer()
                .fmt_fields(EscapedFields)
                .with_writer(crate::out::stderr)
                .log_internal_errors(false)
                .with_target(false)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .try_init();
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
