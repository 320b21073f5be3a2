//! The agent: Measuring and deciding: memory, usage, the watchdog and the memory guard.

use super::*;

impl Agent {
    /// Reads MemAvailable and PSI (at most every [`MEM_READ_EVERY`]: a busy
    /// writer's wake-ups do not re-read them each time).
    pub(super) fn read_mem(&mut self) {
        if self.mem_read_at.is_some_and(|t| t.elapsed() < MEM_READ_EVERY) {
            return;
        }
        self.mem_read_at = Some(Instant::now());
        let mi = match self.host.meminfo() {
            Ok(m) => m,
            Err(e) => {
                warn!("{e:#}");
                return;
            }
        };
        let psi = match std::fs::read_to_string(self.host.proc_path("pressure/memory")) {
            Ok(t) => parse_psi(&t),
            Err(e) => {
                if !self.psi_warned {
                    self.psi_warned = true;
                    info!("no PSI ({e}); the memory guard watches MemAvailable only");
                }
                None
            }
        };
        self.mem = Some(MemView {
            mem_total: mi.mem_total,
            mem_available: mi.mem_available,
            psi_some_avg10: psi,
        });
    }

    pub(super) fn measure(&mut self, i: usize) -> Option<Usage> {
        let w = &mut self.mounts[i];
        let root = w.root.as_ref()?;
        match Usage::of_fd(root) {
            Ok(u) => {
                w.usage = Some(u);
                self.measure_memory(i, &u);
                Some(u)
            }
            Err(e) => {
                warn!(mount = w.name(), "{}: {e:#}", w.name());
                None
            }
        }
    }

    /// The RAM of a zram mount with `memory` thresholds, from its device's
    /// `mm_stat`. That figure lags the writes: data reaches the device when the
    /// page cache writes it back (seconds later). Counting what was written
    /// since the last sync as uncompressed gives an upper bound; when that
    /// bound settles the level (below `warn`, or at most `low` once above it)
    /// it is enough, otherwise the mount is synced (syncfs) and the device
    /// read again, so the watchdog acts on the compressed figure itself.
    fn measure_memory(&mut self, i: usize, u: &Usage) {
        let w = &mut self.mounts[i];
        let known = w.memory.take().is_some();
        let Some(t) = w.spec.watchdog.memory else { return };
        let Some(root) = w.root.as_ref() else { return };
        let device = w.zram;
        let read = || device.and_then(backend::zram::compressed_of).map(|c| c.ram_used);
        let Some(ram) = read() else {
            if !known {
                return;
            }
            warn!(
                mount = w.spec.name.as_str(),
                "{}: no zram device under {} to read the RAM of (mm_stat); its memory thresholds wait",
                w.spec.name,
                w.spec.path.display()
            );
            return;
        };
        let pending = w.synced_used.map_or(u.used, |s| u.used.saturating_sub(s));
        let bound = ram.saturating_add(pending);
        if bound < t.warn && (w.tracker.level == Level::Ok || bound <= t.low) {
            w.memory = Some(ram);
            return;
        }
        if let Err(e) = nix::unistd::syncfs(root.as_fd()) {
            warn!(
                mount = w.spec.name.as_str(),
                "{}: syncfs {}: {e}; its RAM figure may lag the writes",
                w.spec.name,
                w.spec.path.display()
            );
        }
        w.synced_used = Some(u.used);
        w.memory = read().or(Some(ram));
    }

    pub(super) fn budget(&self) -> Budget {
        Budget {
            max_total: self.spec.max_total,
            total_size: self
                .mounts
                .iter()
                .filter(|w| w.root.is_some())
                .filter_map(|w| w.usage.map(|u| u.size))
                .sum(),
            grow_floor: self.spec.agent.grow_floor,
            under_pressure: self.pressure.is_some(),
            page_size: self.page_size,
        }
    }

    /// Until the next round: `interval`, or [`QUIET_PERIOD`] while every mount is
    /// quiet and fanotify reports writes: no tmpfs can grow unseen then, and memory
    /// is read that often (half the guard's default cooldown); a PSI trigger, where
    /// the kernel offers one, wakes the agent at once on memory stalls.
    pub(super) fn check_period(&self) -> Duration {
        let quiet = self.wake.is_some()
            && self.pressure.is_none()
            && self
                .mounts
                .iter()
                .all(|w| w.tracker.level == Level::Ok && !w.tracker.exhausted && !w.polled());
        if quiet {
            self.interval.max(QUIET_PERIOD)
        } else {
            self.interval
        }
    }

    /// One round over every mount, then the memory guard. With fanotify, usage only
    /// changes when something is written, which wakes the loop: a quiet round
    /// (`woke` false) looks at memory only, unless a mount is above `warn`, out of
    /// actions, or [`IDLE_MEASURE`] passed since the mounts were last measured
    /// (writes fanotify does not report: shared mappings).
    pub(super) fn check(&mut self, woke: bool) {
        self.read_mem();
        let active = self
            .mounts
            .iter()
            .any(|w| w.tracker.level != Level::Ok || w.tracker.exhausted || w.polled());
        let measure = woke
            || self.wake.is_none()
            || active
            || self.pressure.is_some()
            || self.measured_at.is_none_or(|t| t.elapsed() >= IDLE_MEASURE);
        if measure {
            self.measured_at = Some(Instant::now());
            for i in 0..self.mounts.len() {
                self.measure(i);
            }
        }
        self.update_pressure();
        if measure {
            for i in 0..self.mounts.len() {
                self.check_mount(i);
            }
        }
        self.guard();
        self.summarise();
    }

    /// Logs what [`quiet::Quiet`] held back over a whole window, one line a kind.
    pub(super) fn summarise(&mut self) {
        let now = Instant::now();
        for w in &mut self.mounts {
            let name = w.spec.name.clone();
            let usage = w.usage.map(|u| pct(u.used, u.size)).unwrap_or_default();
            let secs = quiet::WINDOW.as_secs();
            for s in w.quiet.due(now) {
                match s.kind.as_str() {
                    "evict" => info!(
                        mount = name.as_str(),
                        action = "evict",
                        "{name}: {} in the last {secs}s: {} ({}); usage now {usage}",
                        crate::plural::count(s.count, "more eviction", "more evictions"),
                        crate::plural::count(s.files, "file", "files"),
                        format_bytes(s.bytes)
                    ),
                    "evict-none" => warn!(
                        mount = name.as_str(),
                        action = "evict",
                        "{name}: {} more evictions in the last {secs}s found nothing to evict; usage now {usage}",
                        s.count
                    ),
                    transition => info!(
                        mount = name.as_str(),
                        level = w.tracker.level.name(),
                        "{name}: level {transition} {} more times in the last {secs}s; now {} at {usage}",
                        s.count,
                        w.tracker.level.name()
                    ),
                }
            }
        }
    }

    pub(super) fn check_mount(&mut self, i: usize) {
        let Some(mem) = self.mem else { return };
        for _ in 0..MAX_ROUNDS {
            let Some(u) = self.measure(i) else { return };
            let b = self.budget();
            let w = &mut self.mounts[i];
            let wd = w.spec.watchdog.clone();
            let lim = w.limits();
            let now_ms = self.alive.now_ms();
            let w = &mut self.mounts[i];
            let memory = w.memory;
            let v = decide::decide(&wd, &mut w.tracker, &u, memory, lim, &mem, &b, now_ms);
            w.metrics.level = w.tracker.level;
            let name = w.spec.name.clone();
            let now = Instant::now();
            if let Some((from, to)) = v.transition.filter(|(from, to)| {
                w.quiet
                    .pass(&format!("{} -> {}", from.name(), to.name()), now, 0, 0)
            }) {
                let text = format!(
                    "{name}: usage {} of {} ({}), inodes {} of {} ({}){}: level {} -> {}",
                    format_bytes(u.used),
                    format_bytes(u.size),
                    pct(u.used, u.size),
                    u.inodes_used,
                    u.inodes,
                    pct(u.inodes_used, u.inodes),
                    memory_text(memory, &wd),
                    from.name(),
                    to.name()
                );
                if to > from {
                    warn!(mount = name.as_str(), level = to.name(), "{text}");
                } else {
                    info!(mount = name.as_str(), level = to.name(), "{text}");
                }
            }
            for (a, why) in &v.skipped {
                info!(mount = name.as_str(), "{name}: {} skipped: {why}", a.name());
            }
            if let Some(retry_ms) = v.exhausted {
                warn!(
                    mount = name.as_str(),
                    "{name}: usage {} stays at or above high {}% and [{}] can free nothing now (files open for writing, or none left); tried again in {}, sooner when usage moves",
                    pct(u.used, u.size),
                    wd.bytes.high,
                    wd.actions.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "),
                    describe_ms(retry_ms)
                );
            }
            let Some(act) = v.act else { return };
            let cause = if v.early { Cause::Early } else { Cause::Watchdog };
            self.lock_busy = false;
            let done = self.perform(i, &act, &cause);
            if matches!(act, Act::Grow { .. }) && !done && std::mem::take(&mut self.lock_busy) {
                // Another process holds the state lock: for this check only, an
                // eviction later in the chain acts (it needs no lock), never a
                // fallback; the chain stays at grow, which runs once the lock is
                // free (a review helper's probe fell back instead).
                let w = &self.mounts[i];
                let later = w.spec.watchdog.actions.iter().skip(w.tracker.stage + 1);
                if later
                    .take_while(|a| **a != Action::Fallback)
                    .any(|a| *a == Action::Evict)
                {
                    let evict = Act::Evict {
                        target: decide::EvictTarget::low(&wd, &u, memory),
                    };
                    self.perform(i, &evict, &cause);
                }
                return;
            }
            match (&act, done) {
                (Act::Warn | Act::Fallback, _) | (_, false) => return,
                _ => {}
            }
            let Some(after) = self.measure(i) else { return };
            let w = &mut self.mounts[i];
            let freed = !matches!(act, Act::Evict { .. }) || w.last_evicted > 0;
            decide::after_action(&wd, &mut w.tracker, &act, &after, w.memory, freed);
        }
    }

    pub(super) fn update_pressure(&mut self) {
        let Some(mem) = self.mem else { return };
        let now = decide::pressure(&mem, &self.spec.agent);
        match (&self.pressure, &now) {
            (None, Some(why)) => warn!("memory pressure: {why}; the guard acts on the mounts"),
            (Some(_), None) => info!("memory pressure is over"),
            _ => {}
        }
        self.pressure = now;
    }

    /// The memory-pressure guard: at most one action per cooldown.
    pub(super) fn guard(&mut self) {
        let Some(mem) = self.mem else { return };
        let views: Vec<PressureView<'_>> = self
            .mounts
            .iter()
            .enumerate()
            .filter(|(_, w)| w.root.is_some())
            // Its actions wait for its write-back: picked, it held the guard up
            // while other mounts had RAM to give (a review helper's probe).
            .filter(|(_, w)| !self.worker.has(&w.spec.name))
            .filter_map(|(index, w)| {
                Some(PressureView {
                    index,
                    watchdog: &w.spec.watchdog,
                    usage: w.usage?,
                    memory: w.memory,
                    limits: w.limits(),
                })
            })
            .collect();
        let since = self.guard_last.map(|t| t.elapsed().as_millis() as u64);
        let g = decide::guard(&mem, &self.spec.agent, &views, since, self.page_size);
        drop(views);
        match g {
            Guard::Calm => self.guard_exhausted = false,
            Guard::Cooling => {}
            Guard::Exhausted => {
                if !self.guard_exhausted {
                    self.guard_exhausted = true;
                    error!(
                        "memory pressure persists and no mount has anything left to give (see each mount's `watchdog.pressure`)"
                    );
                }
            }
            Guard::Act { index, action, act } => {
                let why = self.pressure.clone().unwrap_or_default();
                self.guard_last = Some(Instant::now());
                self.perform(index, &act, &Cause::Pressure(action, why));
                self.measure(index);
            }
        }
    }
}

/// `, RAM 70MiB (high 64MiB)` for a zram mount with memory thresholds.
pub(super) fn memory_text(memory: Option<u64>, wd: &spec::Watchdog) -> String {
    match (memory, &wd.memory) {
        (Some(m), Some(t)) => format!(", RAM {} (high {})", format_bytes(m), format_bytes(t.high)),
        _ => String::new(),
    }
}
