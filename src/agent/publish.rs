//! The agent: What the agent shows: the systemd status line, metrics, `tmpfsctl status`.

use super::*;

impl Agent {
    pub(super) fn status_line(&self) -> String {
        let count = |s: MountState| self.mounts.iter().filter(|w| w.state == s).count();
        let mut parts = vec![format!("{} offloaded", count(MountState::Offloaded))];
        for s in [
            MountState::Fallback,
            MountState::Degraded,
            MountState::Absent,
            MountState::Foreign,
        ] {
            let n = count(s);
            if n > 0 {
                parts.push(format!("{n} {}", s.name()));
            }
        }
        let fullest = self
            .mounts
            .iter()
            .filter(|w| w.root.is_some())
            .filter_map(|w| w.usage.map(|u| (u.used_pct().max(u.inodes_pct()), w.name())))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let mut s = format!(
            "{}: {}",
            crate::plural::count(self.mounts.len(), "mount", "mounts"),
            parts.join(", ")
        );
        if let Some((p, n)) = fullest {
            s.push_str(&format!("; fullest {n} {p:.0}%"));
        }
        s.push_str(match &self.pressure {
            Some(_) => "; memory pressure",
            None => "; memory ok",
        });
        s
    }

    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            mounts: self
                .mounts
                .iter()
                .map(|w| {
                    let mut m = w.metrics.clone();
                    m.state = w.state;
                    m.usage = w.root.as_ref().and(w.usage);
                    m.compressed = match (w.spec.backend, &w.root) {
                        (crate::spec::Backend::Zram, Some(_)) => {
                            w.zram.and_then(crate::backend::zram::compressed_of)
                        }
                        _ => None,
                    };
                    m.evict_exhausted = w.tracker.exhausted;
                    m.persist_every = match w.spec.persist {
                        Persist::Every(secs) => Some(secs),
                        _ => None,
                    };
                    if w.root.is_none() {
                        m.level = Level::Ok;
                    }
                    m
                })
                .collect(),
            mem: self.mem,
            under_pressure: self.pressure.is_some(),
            fanotify: self.wake.is_some(),
            reloads: self.reloads.clone(),
            start_time: self.start_time,
        }
    }

    /// What makes the metrics file worth rewriting at once: states, levels,
    /// sizes, counters, reloads, pressure. Usage and memory figures alone are
    /// refreshed every [`METRICS_REFRESH`].
    pub(super) fn signature(&self) -> Vec<u64> {
        let mut sig = vec![u64::from(self.pressure.is_some()), u64::from(self.wake.is_some())];
        sig.extend(self.reloads.values());
        for w in &self.mounts {
            sig.push(w.state as u64);
            sig.push(w.tracker.level as u64);
            sig.push(u64::from(w.tracker.exhausted));
            sig.push(w.usage.map(|u| u.size ^ (u.inodes << 1)).unwrap_or(0));
            sig.extend(w.metrics.actions.values());
            sig.extend([
                w.metrics.syncs_ok,
                w.metrics.syncs_failed,
                w.metrics.evicted_files,
            ]);
        }
        sig
    }

    /// What `tmpfsctl status` shows of this agent.
    pub(super) fn agent_status(&self) -> AgentStatus {
        let now_ms = self.alive.now_ms();
        let mounts = self
            .mounts
            .iter()
            .map(|w| {
                let t = &w.tracker;
                let exhausted = t.exhausted.then(|| {
                    format!(
                        "usage stays at or above high and [{}] can free nothing now (files open for writing, or none left); tried again in {}, sooner when usage moves",
                        w.spec.watchdog.actions.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "),
                        describe_ms(t.retry_at_ms.saturating_sub(now_ms).div_ceil(1000) * 1000)
                    )
                });
                let m = &w.metrics;
                (
                    w.spec.name.clone(),
                    AgentMount {
                        level: t.level.name().to_string(),
                        last_action: m.last_action.map(|(action, at)| AgentAction {
                            action: action.to_string(),
                            at,
                            detail: match action {
                                "evict" => format!(
                                    "{} evicted so far",
                                    crate::plural::count(m.evicted_files, "file", "files")
                                ),
                                _ => String::new(),
                            },
                        }),
                        evicted_files: m.evicted_files,
                        evicted_bytes: m.evicted_bytes,
                        exhausted,
                    },
                )
            })
            .collect();
        AgentStatus {
            pid: std::process::id(),
            since: self.start_time,
            updated: unix_now(),
            mounts,
        }
    }

    /// Writes metrics when something changed, and every [`METRICS_REFRESH`]
    /// for the usage and memory figures; updates the systemd status line.
    pub(super) fn publish(&mut self) {
        // Rebuilt only when something it shows changed: an idle agent does not
        // format and compare them every second.
        let mut sig = self.signature();
        sig.extend(self.mounts.iter().map(|w| u64::from(w.tracker.exhausted)));
        sig.extend(self.mounts.iter().filter_map(|w| w.usage.map(|u| u.used >> 20)));
        if self.published_sig.as_ref() != Some(&sig) {
            self.published_sig = Some(sig);
            let status = self.status_line();
            if status != self.status_last {
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Status(&status)]);
                self.status_last = status;
            }
            let st = self.agent_status();
            let key = serde_json::to_string(&st.mounts).unwrap_or_default();
            if self.agent_status_last.as_ref() != Some(&key) {
                if let Err(e) = self.state.write_agent_status(&st) {
                    debug!("{e:#}");
                }
                self.agent_status_last = Some(key);
            }
        }
        let Some(path) = self.metrics_path.clone() else {
            return;
        };
        let sig = self.signature();
        let due = match &self.metrics_last {
            None => true,
            Some((last, at)) => *last != sig || at.elapsed() >= METRICS_REFRESH,
        };
        if !due {
            return;
        }
        let text = metrics::render(&self.snapshot(), Some(unix_now()));
        if let Err(e) = metrics::write(&path, &text) {
            if self.metrics_last.as_ref().is_none_or(|(b, _)| !b.is_empty()) {
                warn!("cannot write metrics to {}: {e}", path.display());
            }
            // Remember the failure (empty signature) so it is logged once,
            // and retried at the next refresh.
            self.metrics_last = Some((Vec::new(), Instant::now()));
            return;
        }
        self.metrics_last = Some((sig, Instant::now()));
    }
}
