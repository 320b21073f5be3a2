//! The top-level `agent:` settings.

use std::path::{Component, Path, PathBuf};

use serde_saphyr::Spanned;

use super::{percent, Ctx};
use crate::spec::duration::parse_duration_ms;
use crate::spec::raw::RawAgent;
use crate::spec::size::{self, SIZE_ACCEPTED};
use crate::spec::{AgentSettings, MetricsTarget};

const INTERVAL_ACCEPTED: &str = "a duration from 100ms to 1h, e.g. 1s, 500ms, 2s";
const COOLDOWN_ACCEPTED: &str = "a duration from 100ms to 1h, e.g. 10s";
const METRICS_ACCEPTED: &str =
    "off, or an absolute path to a .prom file such as /var/lib/prometheus/node-exporter/tmpfsctl.prom";

pub(super) fn agent(cx: &mut Ctx, raw: Option<&RawAgent>, mem_total: u64) -> AgentSettings {
    let mut a = AgentSettings::defaults(mem_total);
    let Some(raw) = raw else {
        return a;
    };
    let duration = |cx: &mut Ctx, s: &Spanned<String>, field: &str, accepted: &str| -> Option<u64> {
        match parse_duration_ms(&s.value) {
            Ok(ms) if (100..=3_600_000).contains(&ms) => Some(ms),
            Ok(_) => {
                cx.at(
                    s,
                    field,
                    format!("invalid {field} `{}`: out of range", s.value),
                    Some(accepted),
                );
                None
            }
            Err(why) => {
                cx.at(
                    s,
                    field,
                    format!("invalid {field} `{}`: {why}", s.value),
                    Some(accepted),
                );
                None
            }
        }
    };
    let ram_size = |cx: &mut Ctx, s: &Spanned<String>, field: &str| -> Option<u64> {
        match size::parse_size(&s.value) {
            Ok(lit) => Some(lit.resolve(mem_total)),
            Err(why) => {
                cx.at(
                    s,
                    field,
                    format!("invalid size `{}`: {why}", s.value),
                    Some(SIZE_ACCEPTED),
                );
                None
            }
        }
    };
    if let Some(s) = &raw.interval {
        a.interval_ms = duration(cx, s, "agent.interval", INTERVAL_ACCEPTED).unwrap_or(a.interval_ms);
    }
    if let Some(s) = &raw.cooldown {
        a.cooldown_ms = duration(cx, s, "agent.cooldown", COOLDOWN_ACCEPTED).unwrap_or(a.cooldown_ms);
    }
    if let Some(s) = &raw.min_available {
        a.min_available = ram_size(cx, s, "agent.min_available").unwrap_or(a.min_available);
    }
    if let Some(s) = &raw.grow_floor {
        a.grow_floor = ram_size(cx, s, "agent.grow_floor").unwrap_or(a.grow_floor);
    }
    if let Some(s) = &raw.max_pressure {
        a.max_pressure = percent(cx, "agent.max_pressure", s).unwrap_or(a.max_pressure);
    }
    if let Some(s) = &raw.metrics {
        a.metrics = match metrics_target(&s.value) {
            Ok(t) => t,
            Err(why) => {
                cx.at(s, "agent.metrics", why, Some(METRICS_ACCEPTED));
                a.metrics
            }
        };
    }
    a
}

/// `off` or an absolute, normalised path to a `.prom` file. The textfile
/// collector reads nothing else, and the suffix keeps a slip of the pen from
/// making the agent (root) overwrite some other file with metrics.
pub fn metrics_target(text: &str) -> Result<MetricsTarget, String> {
    if text == "off" {
        return Ok(MetricsTarget::Off);
    }
    if text.contains(char::is_control) {
        return Err(format!(
            "invalid metrics path `{}`: it contains control characters",
            crate::out::escape(text)
        ));
    }
    let p = Path::new(text);
    let normal = p
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !p.is_absolute() || !normal || p.components().collect::<PathBuf>().as_os_str() != p.as_os_str() {
        return Err(format!(
            "invalid metrics path `{text}`: not an absolute, normalised path"
        ));
    }
    if p.is_dir() {
        return Err(format!(
            "invalid metrics path `{text}`: it is a directory; name the file"
        ));
    }
    if !p
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.len() > ".prom".len() && n.ends_with(".prom"))
    {
        return Err(format!(
            "invalid metrics path `{text}`: not a .prom file (the textfile collector reads only those)"
        ));
    }
    Ok(MetricsTarget::File(p.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_targets() {
        assert_eq!(metrics_target("off"), Ok(MetricsTarget::Off));
        assert_eq!(
            metrics_target("/x/y.prom"),
            Ok(MetricsTarget::File("/x/y.prom".into()))
        );
        for bad in [
            "x.prom",
            "/x/../y.prom",
            "/x//y",
            "/",
            "/tmp",
            "/etc/passwd",
            "/x/.prom",
            "/x/y.prom\n",
        ] {
            assert!(metrics_target(bad).is_err(), "{bad}");
        }
    }
}
