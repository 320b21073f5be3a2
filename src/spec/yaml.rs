//! The YAML tree a spec is read from, and its own errors placed for the
//! operator: line, column, the token's width and the field it is in.

use super::raw;
use crate::error::Diagnostic;

/// The YAML tree; only errors of YAML itself (syntax, resource budgets)
/// stop here.
pub(super) fn node_from_yaml(text: &str) -> Result<raw::S<raw::Node>, Diagnostic> {
    let opts = serde_saphyr::options! {
        strict_booleans: true,
        legacy_octal_numbers: false,
        // Reported with every other problem by `raw::read`.
        duplicate_keys: serde_saphyr::options::DuplicateKeyPolicy::PassThrough,
        // A spec nests 6 deep and has a few dozen nodes per mount; tighter
        // than the defaults so that alias bombs fail fast.
        budget: serde_saphyr::budget! {
            max_depth: 16,
            max_nodes: 100_000,
        },
    };
    serde_saphyr::from_str_with_options(text, opts).map_err(|e| {
        let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((1, 1));
        let message = e.without_snippet().to_string();
        Diagnostic {
            line,
            column,
            width: token_width(text, line, column),
            field: field_of_yaml_error(text, line, column),
            message: yaml_message(&message),
            accepted: None,
        }
    })
}

/// Width of the token starting at line:column, for the caret.
fn token_width(text: &str, line: u64, column: u64) -> usize {
    text.lines()
        .nth(line.saturating_sub(1) as usize)
        .map(|l| {
            l.chars()
                .skip(column.saturating_sub(1) as usize)
                .take_while(|c| !c.is_whitespace() && *c != ',' && *c != ']')
                .count()
        })
        .unwrap_or(1)
        .max(1)
}

/// saphyr's message carries its own location suffix; ours is in the header.
fn yaml_message(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message);
    let first = match first.rfind(" at line ") {
        Some(i) => &first[..i],
        None => first,
    };
    if first.starts_with("budget breached") || first.starts_with("recursion limit") {
        format!("the YAML is too large or too deeply nested for a spec ({first})")
    } else if first.starts_with("multiple YAML documents") {
        "a second YAML document starts here; a spec is one document".to_string()
    } else {
        first.to_string()
    }
}

/// Best-effort field path for a YAML-level error (`mounts[0].watchdog.high`): the
/// key on that line, then the keys and list items it is indented under in block
/// style. Flow style and other odd layouts give a shorter path, never a wrong key.
fn field_of_yaml_error(text: &str, line: u64, column: u64) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let at = line.saturating_sub(1) as usize;
    let Some(l) = lines.get(at) else {
        return "(document)".into();
    };
    let upto: String = l.chars().take(column.saturating_sub(1) as usize).collect();
    let key_part = if upto.contains(':') { upto.as_str() } else { l };
    let key = key_part
        .trim_start()
        .trim_start_matches("- ")
        .split(':')
        .next()
        .unwrap_or("")
        .trim();
    if key.is_empty() {
        return "(document)".into();
    }
    let mut parts = vec![key.to_string()];
    let here = BlockLine::of(l);
    // The indent of the keys of the mapping being climbed out of, and the list item
    // it is (its dash's indent, and how many items precede it), if it is one.
    let mut target = here.key_indent;
    let mut item = here.dash.then_some((here.lead, 0usize));
    for l in lines[..at].iter().rev() {
        let b = BlockLine::of(l);
        if b.blank {
            continue;
        }
        let parent = match item {
            Some((dash, ref mut before)) => {
                if b.dash && b.lead == dash {
                    *before += 1;
                    continue;
                }
                if b.lead > dash {
                    continue;
                }
                let Some(k) = b.key else { break };
                format!("{k}[{before}]")
            }
            None => {
                if b.key_indent == target && b.dash {
                    item = Some((b.lead, 0));
                    continue;
                }
                if b.key_indent >= target {
                    continue;
                }
                let Some(k) = b.key else { break };
                k.to_string()
            }
        };
        parts.push(parent);
        target = b.key_indent;
        item = b.dash.then_some((b.lead, 0));
    }
    parts.reverse();
    parts.join(".")
}

/// A line of block-style YAML as [`field_of_yaml_error`] climbs through it.
struct BlockLine<'a> {
    blank: bool,
    /// Spaces before its first character.
    lead: usize,
    /// It starts a list item (`- `).
    dash: bool,
    /// Where its key (or value) starts: after the dash, if any.
    key_indent: usize,
    /// The key it opens, if it has one.
    key: Option<&'a str>,
}

impl<'a> BlockLine<'a> {
    fn of(l: &'a str) -> Self {
        let rest = l.trim_start_matches(' ');
        let lead = l.len() - rest.len();
        let (dash, body) = match rest.strip_prefix("- ") {
            Some(b) => (true, b.trim_start_matches(' ')),
            None => (rest == "-", rest),
        };
        let key_indent = l.len() - body.len();
        let key = body
            .split_once(':')
            .map(|(k, _)| k.trim())
            .filter(|k| !k.is_empty() && !k.starts_with(['#', '{', '[', '"', '\'']));
        BlockLine {
            blank: rest.is_empty() || rest.starts_with('#'),
            lead,
            dash,
            key_indent,
            key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_yaml_error_is_placed_by_its_full_field_path() {
        let at = |text: &str, line: u64| field_of_yaml_error(text, line, 1);
        let spec = "version: 1\nmounts:\n  - name: a\n    size: 1m\n  - name: b\n    watchdog:\n      # why\n\n      high: [1\n    size: 2m\n";
        assert_eq!(at(spec, 9), "mounts[1].watchdog.high");
        assert_eq!(at(spec, 10), "mounts[1].size");
        assert_eq!(at(spec, 5), "mounts[1].name");
        assert_eq!(at(spec, 4), "mounts[0].size");
        assert_eq!(at(spec, 1), "version");
        // A list at the same indent as its key, and nested lists.
        let flat = "mounts:\n- name: a\n- name: b\n  before:\n    - x.service\n    - y: [\n";
        assert_eq!(at(flat, 3), "mounts[1].name");
        assert_eq!(at(flat, 6), "mounts[1].before[1].y");
        assert_eq!(at("mounts: [\n", 1), "mounts");
        assert_eq!(at("", 3), "(document)");
    }
}
