//! Exit statuses and spec diagnostics rendered rustc-style (file:line:col, caret).

use std::fmt;
use std::path::{Path, PathBuf};

use crate::out::escape;

/// Process exit statuses; documented in README.md ("Exit status"). Errors
/// map to them in one place, `cli::describe_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ExitCode {
    /// Converged (apply), valid (validate), or nothing to report.
    Ok = 0,
    /// An operation failed: a mount with `on_failure: fail`, an I/O error, a refused `down`.
    Failed = 1,
    /// Bad input: invalid spec or command line. Nothing on the host was changed.
    BadInput = 2,
    /// Not fully converged: some mounts are degraded (application on its disk
    /// directory) or a change was refused; the rest were applied.
    Degraded = 3,
    /// Another tmpfsctl held the lock for longer than `--wait`.
    Busy = 4,
    /// `bench` stopped by SIGINT, SIGTERM or SIGHUP, after cleaning up (128 + SIGINT).
    Interrupted = 130,
}

impl ExitCode {
    pub fn code(self) -> i32 {
        self as i32
    }

    /// `Failed` when `failed`, else `Ok`.
    pub fn failed_if(failed: bool) -> ExitCode {
        if failed {
            ExitCode::Failed
        } else {
            ExitCode::Ok
        }
    }
}

/// A mount name on the command line that the spec does not have (and that no
/// managed tmpfs carries): bad input, exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("no mount named `{name}` in {}; known names: {}", file.display(), known.join(", "))]
pub struct UnknownName {
    pub name: String,
    pub file: PathBuf,
    pub known: Vec<String>,
}

impl UnknownName {
    pub fn check<'a>(
        spec: &crate::spec::Spec,
        names: impl IntoIterator<Item = &'a String>,
        also: impl Fn(&str) -> bool,
    ) -> Result<(), UnknownName> {
        for n in names {
            if spec.mount(n).is_none() && !also(n) {
                return Err(UnknownName {
                    name: n.clone(),
                    file: spec.file.clone(),
                    known: spec.mounts.iter().map(|m| m.name.clone()).collect(),
                });
            }
        }
        Ok(())
    }
}

/// A command-line value that cannot be used (not a spec, not a mount name):
/// bad input, exit status 2, nothing changed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// One problem in a spec, located at a YAML node.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    pub line: u64,
    pub column: u64,
    /// Characters to underline; at least one.
    pub width: usize,
    /// Dotted field path such as `mounts[1].size`.
    pub field: String,
    pub message: String,
    /// What the field accepts, when that helps.
    pub accepted: Option<String>,
}

/// An invalid spec: every problem found, with the text needed to show them.
#[derive(Debug)]
pub struct SpecError {
    pub file: PathBuf,
    pub source_text: String,
    pub diagnostics: Vec<Diagnostic>,
}

impl SpecError {
    pub fn single(file: &Path, source_text: &str, diagnostic: Diagnostic) -> Self {
        SpecError {
            file: file.to_path_buf(),
            source_text: source_text.to_string(),
            diagnostics: vec![diagnostic],
        }
    }
}

/// Problems shown in full; a longer list ends with their count.
const MAX_SHOWN: usize = 100;

/// Characters of a source line shown around the problem.
const SNIPPET_BEFORE: usize = 40;
const SNIPPET_AFTER: usize = 80;

/// The part of `line` shown for a problem at `column` (1-based, characters)
/// `width` characters wide, control characters escaped, with the caret's
/// padding and width measured on what is shown.
fn snippet(line: &str, column: u64, width: usize) -> (String, usize, usize) {
    let chars: Vec<char> = line.chars().collect();
    let at = (column.saturating_sub(1) as usize).min(chars.len());
    let start = at.saturating_sub(SNIPPET_BEFORE);
    let token_end = at.saturating_add(width.max(1)).min(chars.len());
    let end = token_end.max(at).saturating_add(SNIPPET_AFTER).min(chars.len());
    let text = |from: usize, to: usize| {
        let part: String = chars[from..to.max(from)].iter().collect();
        escape(&part).into_owned()
    };
    let lead = if start > 0 { "…" } else { "" };
    let tail = if end < chars.len() { "…" } else { "" };
    let before = text(start, at);
    let token = text(at, token_end.min(end));
    let shown = format!("{lead}{before}{token}{}{tail}", text(token_end.min(end), end));
    let pad = lead.chars().count() + before.chars().count();
    (shown, pad, token.chars().count().max(1))
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<&str> = self.source_text.lines().collect();
        let file = escape(&self.file).into_owned();
        for (i, d) in self.diagnostics.iter().take(MAX_SHOWN).enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            writeln!(f, "error: {}", escape(&d.message))?;
            let gutter = d.line.to_string().len();
            writeln!(f, "{:gutter$}--> {file}:{}:{}", "", d.line, d.column)?;
            if let Some(text) = d.line.checked_sub(1).and_then(|l| lines.get(l as usize)) {
                let (shown, pad, width) = snippet(text, d.column, d.width);
                writeln!(f, "{:gutter$} |", "")?;
                writeln!(f, "{} | {shown}", d.line)?;
                writeln!(f, "{:gutter$} | {:pad$}{}", "", "", "^".repeat(width))?;
            }
            writeln!(f, "{:gutter$} = field: {}", "", escape(&d.field))?;
            if let Some(acc) = &d.accepted {
                writeln!(f, "{:gutter$} = accepted: {}", "", acc)?;
            }
        }
        if let Some(more) = self.diagnostics.len().checked_sub(MAX_SHOWN).filter(|n| *n > 0) {
            writeln!(
                f,
                "\n… {} not shown",
                crate::plural::count(more, "more problem", "more problems")
            )?;
        }
        if self.diagnostics.len() > 1 {
            writeln!(
                f,
                "\n{} errors in {file}; nothing was changed",
                self.diagnostics.len(),
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for SpecError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_location_snippet_caret_field_and_accepted() {
        let err = SpecError::single(
            Path::new("cache.yaml"),
            "version: 1\nmounts:\n  - size: 12 parsecs\n",
            Diagnostic {
                line: 3,
                column: 11,
                width: 10,
                field: "mounts[0].size".into(),
                message: "invalid size `12 parsecs`: unknown unit `parsecs`".into(),
                accepted: Some("512MiB".into()),
            },
        );
        let want = "\
error: invalid size `12 parsecs`: unknown unit `parsecs`
 --> cache.yaml:3:11
  |
3 |   - size: 12 parsecs
  |           ^^^^^^^^^^
  = field: mounts[0].size
  = accepted: 512MiB
";
        assert_eq!(err.to_string(), want);
    }

    #[test]
    fn long_lines_are_cropped_and_controls_escaped() {
        let line = format!("{}\u{1b}[2Jbad{}", "x".repeat(100), "y".repeat(200));
        let (shown, pad, width) = snippet(&line, 101, 4);
        assert_eq!(
            shown,
            format!("…{}\\x1b[2Jbad{}…", "x".repeat(40), "y".repeat(77))
        );
        assert_eq!((pad, width), (41, 7));
        assert_eq!(snippet("a: b", 4, 1), ("a: b".to_string(), 3, 1));
        assert_eq!(snippet("a:", 9, 3), ("a:".to_string(), 2, 1));
    }
}
