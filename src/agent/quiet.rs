//! Repeated log lines, summarised. Under churn a mount can cross its thresholds and
//! be evicted many times a second; each kind of line goes out at most once per
//! [`WINDOW`] per mount, and what was held back is logged as one line with counts
//! when the window is over.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub const WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub struct Quiet {
    kinds: BTreeMap<String, Held>,
}

#[derive(Debug, Default)]
struct Held {
    last: Option<Instant>,
    count: u64,
    files: u64,
    bytes: u64,
}

/// Lines of one kind held back over a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub kind: String,
    pub count: u64,
    pub files: u64,
    pub bytes: u64,
}

impl Quiet {
    /// Whether a line of `kind` may go out at `now`; if not, it is counted, with the
    /// files and bytes it reports.
    pub fn pass(&mut self, kind: &str, now: Instant, files: u64, bytes: u64) -> bool {
        let h = self.kinds.entry(kind.to_string()).or_default();
        if h.last.is_none_or(|t| now.duration_since(t) >= WINDOW) {
            h.last = Some(now);
            return true;
        }
        h.count += 1;
        h.files += files;
        h.bytes += bytes;
        false
    }

    /// The lines held back over a whole window, to log at `now` as one each.
    pub fn due(&mut self, now: Instant) -> Vec<Summary> {
        let mut out = Vec::new();
        for (kind, h) in &mut self.kinds {
            if h.count > 0 && h.last.is_some_and(|t| now.duration_since(t) >= WINDOW) {
                out.push(Summary {
                    kind: kind.clone(),
                    count: h.count,
                    files: h.files,
                    bytes: h.bytes,
                });
                *h = Held {
                    last: Some(now),
                    ..Held::default()
                };
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_window_then_a_summary_with_counts() {
        let mut q = Quiet::default();
        let t0 = Instant::now();
        assert!(q.pass("evict", t0, 10, 100));
        for i in 1..250u64 {
            assert!(!q.pass("evict", t0 + Duration::from_millis(i * 12), 2, 20));
        }
        assert!(
            q.pass("level", t0 + Duration::from_millis(5), 0, 0),
            "kinds are apart"
        );
        assert!(q.due(t0 + Duration::from_secs(9)).is_empty());
        let s = q.due(t0 + WINDOW);
        assert_eq!(
            s,
            vec![Summary {
                kind: "evict".into(),
                count: 249,
                files: 498,
                bytes: 4980
            }]
        );
        assert!(q.due(t0 + WINDOW * 3).is_empty(), "nothing held since");
        // After a summary, the next line waits for the next window.
        assert!(!q.pass("evict", t0 + WINDOW + Duration::from_secs(1), 1, 1));
        assert!(q.pass("evict", t0 + WINDOW * 2 + Duration::from_secs(1), 1, 1));
    }
}
