//! The agent: Carrying out the watchdog's decisions: evict, grow and shrink, fallback,
//! write-back, re-offload, apply.

use super::*;

impl Agent {
    /// Carries out an action; `false` when it failed (logged).
    pub(super) fn perform(&mut self, i: usize, act: &Act, cause: &Cause) -> bool {
        let name = self.mounts[i].spec.name.clone();
        let by = match cause {
            Cause::Watchdog => "high".to_string(),
            Cause::Early => format!("filling fast: high within {} ms", decide::LEAD_MS),
            Cause::Pressure(a, why) => format!("memory pressure ({why}); guard action {}", a.name()),
        };
        match act {
            Act::Warn => {
                let w = &mut self.mounts[i];
                let u = w.usage.unwrap_or(Usage {
                    size: 0,
                    used: 0,
                    inodes: 0,
                    inodes_used: 0,
                });
                warn!(
                    mount = name.as_str(),
                    action = "warn",
                    "{name}: usage {} bytes, {} inodes{} reached high (bytes {}%, inodes {}%); action warn: nothing else is done",
                    pct(u.used, u.size),
                    pct(u.inodes_used, u.inodes),
                    check::memory_text(w.memory, &w.spec.watchdog),
                    w.spec.watchdog.bytes.high,
                    w.spec.watchdog.inodes.high
                );
                w.metrics.count("warn");
                true
            }
            Act::Evict { target } => self.evict(i, *target, &by),
            Act::Grow { size, nr_inodes } => self.resize(i, *size, *nr_inodes, &by),
            Act::Fallback => self.fallback(i, &by),
        }
    }

    pub(super) fn evict(&mut self, i: usize, target: decide::EvictTarget, by: &str) -> bool {
        if self.mounts[i].spec.seed == crate::spec::Seed::Overlay {
            return self.renew(i, by);
        }
        if self.mounts[i].spec.persist != crate::spec::Persist::None {
            // Validation refuses `evict` on a persisted mount; this one was built
            // persisted (or of another seed) by a spec edited since, whose apply
            // refused the change (`State::as_mounted`): its deletions would reach
            // the disk (a review helper's probe lost 11 of 22 files so).
            warn!(
                mount = %self.mounts[i].spec.name,
                "{}: not evicting: the mount was built persisted, and evict's deletions would reach the disk; take it down and apply the spec again",
                self.mounts[i].spec.name
            );
            return false;
        }
        let started = Instant::now();
        let w = &mut self.mounts[i];
        let name = w.spec.name.clone();
        let Some(root) = w.root.as_ref() else { return false };
        let before = w.usage;
        let memory_before = w.memory;
        let group = w.spec.watchdog.evict_group;
        let device = w.zram;
        // btrfs frees (and discards) what a deletion gave back only when it
        // commits its transaction: before that, neither statvfs nor the
        // device shows the room made. The live filesystem says, not the spec.
        let btrfs = nix::sys::statfs::fstatfs(root.as_fd()).is_ok_and(|s| crate::host::usage::compresses(&s));
        let commit = || {
            if btrfs {
                let _ = nix::unistd::syncfs(root.as_fd());
            }
        };
        // The device holds what was synced when the RAM was measured, and each
        // deleted file gives its RAM back once discarded: read, not estimated.
        // Eviction reads it right after the usage, whose read commits first.
        let ram = || {
            target
                .memory
                .and(device)
                .and_then(backend::zram::compressed_of)
                .map(|c| c.ram_used)
        };
        let res = evict::evict(
            root.as_fd(),
            &self.host,
            target,
            group,
            &|| {
                commit();
                Usage::of_fd(root)
            },
            &ram,
            &mut w.scanned,
        );
        commit();
        let after = Usage::of_fd(root).ok();
        w.usage = after.or(w.usage);
        w.last_evicted = res.as_ref().map_or(0, |r| r.files);
        match res {
            Ok(r) => {
                w.metrics.count("evict");
                w.metrics.evicted_files += r.files;
                w.metrics.evicted_bytes += r.bytes;
                let u = w.usage.unwrap_or(target_usage(&target));
                let msg = format!(
                    "{name}: evicted {} ({}) in {} ms ({by}); usage {} -> {} bytes, inodes {}; target low {}{}{}",
                    crate::plural::count(r.files, "least-recently-used file", "least-recently-used files"),
                    format_bytes(r.bytes),
                    started.elapsed().as_millis(),
                    before.map(|b| pct(b.used, b.size)).unwrap_or_default(),
                    pct(u.used, u.size),
                    pct(u.inodes_used, u.inodes),
                    format_bytes(target.bytes),
                    memory_before
                        .map(|m| format!("; RAM before {}", format_bytes(m)))
                        .unwrap_or_default(),
                    if r.skipped_open > 0 {
                        format!(
                            "; {} open for writing {} kept",
                            crate::plural::count(r.skipped_open, "file", "files"),
                            crate::plural::agree(r.skipped_open, "was", "were")
                        )
                    } else {
                        String::new()
                    }
                );
                let now = Instant::now();
                if r.files == 0 {
                    if w.quiet.pass("evict-none", now, 0, 0) {
                        warn!(
                            mount = name.as_str(),
                            action = "evict",
                            "{msg}: nothing could be evicted"
                        );
                    }
                } else if w.quiet.pass("evict", now, r.files, r.bytes) {
                    info!(mount = name.as_str(), action = "evict", "{msg}");
                }
                true
            }
            Err(e) => {
                error!(
                    mount = name.as_str(),
                    action = "evict",
                    "{name}: eviction failed: {e:#}"
                );
                false
            }
        }
    }

    /// The state lock, if no other process holds it now; `None` (logged once a
    /// minute for each action of a mount) when one does. The loop never waits for
    /// it: a wait there stops every eviction, and the action is tried again at a
    /// later check. While the worker writes back (the agent holds the lock for it),
    /// an action on another mount goes on under it, and one on the mount being
    /// written back waits the same way, unless it is `beside_own`: a remount's new
    /// limits do not change what a write-back of the live tmpfs reads.
    pub(super) fn lock_now(&mut self, i: usize, what: &str, beside_own: bool) -> Option<Lock> {
        let name = self.mounts[i].spec.name.clone();
        let why = if self.worker.holds_lock() {
            if beside_own || !self.worker.has(&name) {
                return Some(Lock::Worker);
            }
            "its write-back is under way".to_string()
        } else {
            match self.state.lock(Duration::ZERO) {
                Ok(l) => return Some(Lock::Own(l)),
                Err(e) => e.to_string(),
            }
        };
        self.lock_busy = true;
        let w = &mut self.mounts[i];
        if w.quiet.pass(&format!("{what} postponed"), Instant::now(), 0, 0) {
            warn!("{name}: {what} postponed: {why}");
        }
        None
    }

    /// Online remount to `size` (grow, or shrink back), with every option.
    ///
    /// The state lock is only tried (see [`Self::lock_now`]): waiting for it here,
    /// the loop evicted nothing while a `down` or `sync` held it, and a growing
    /// mount filled (a hunting helper's probe: 32 of 48 writes met a full mount).
    pub(super) fn resize(&mut self, i: usize, size: u64, nr_inodes: Option<u64>, by: &str) -> bool {
        let _busy = self.alive.busy();
        let Some(_lock) = self.lock_now(i, "resize", true) else {
            return false;
        };
        let w = &mut self.mounts[i];
        let name = w.spec.name.clone();
        let Some(root) = w.root.as_ref() else { return false };
        let Some(before) = w.usage else { return false };
        let kind: &'static str = if size >= before.size { "grow" } else { "shrink" };
        // The held root is the live tmpfs; its owner and mode stay as they
        // are (the kernel ignores them on remount anyway).
        let attrs = match nix::sys::stat::fstat(root.as_fd()) {
            Ok(st) => mount::RootAttrs {
                uid: st.st_uid,
                gid: st.st_gid,
                mode: st.st_mode & 0o7777,
            },
            Err(e) => {
                error!("{name}: {kind} failed: fstat: {e}");
                return false;
            }
        };
        if !still_there(&w.spec.path, w.dev) {
            warn!(
                "{name}: {kind} skipped: {} is no longer the watched tmpfs",
                w.spec.path.display()
            );
            return false;
        }
        let nr_inodes = nr_inodes.or(w.spec.inodes).unwrap_or(before.inodes);
        let step = plan::resize(&w.spec, attrs, before, size, nr_inodes);
        match execute::run_alone(&step, &name, &self.state) {
            Ok(()) => {
                w.metrics.count(kind);
                let after = Usage::of_fd(root).ok();
                w.usage = after.or(w.usage);
                info!(
                    mount = name.as_str(),
                    action = kind,
                    "{name}: {kind} {} -> {} ({by}): {}",
                    format_bytes(before.size),
                    format_bytes(size),
                    step.describe()
                );
                true
            }
            Err(e) => {
                error!(
                    mount = name.as_str(),
                    action = kind,
                    "{name}: {kind} to {} failed: {e:#}",
                    format_bytes(size)
                );
                false
            }
        }
    }

    /// Eviction on a `seed: overlay` mount: its RAM is the upper layer, from which
    /// overlayfs lets no file go while mounted (docs/overlay.md, "Eviction"). So the
    /// whole layer is written back, as `down` does (the application is on its disk
    /// directory meanwhile), and the mount offloaded again with an empty one: what
    /// it wrote is then read from the disk and its page cache.
    pub(super) fn renew(&mut self, i: usize, by: &str) -> bool {
        let started = Instant::now();
        let name = self.mounts[i].spec.name.clone();
        let before = self.mounts[i].usage;
        // `apply` follows at once, which acts only while the worker is idle.
        if !self.worker.idle() {
            self.lock_busy = true;
            let w = &mut self.mounts[i];
            if w.quiet.pass("eviction postponed", Instant::now(), 0, 0) {
                warn!("{name}: eviction postponed: a write-back is under way");
            }
            return false;
        }
        // Released before `apply`, which takes the lock itself.
        let Some((r, _, _)) = self.take_out(i, ("evict", "eviction"), "the upper layer stays", false) else {
            return false;
        };
        if r.result == DownOutcome::Pending {
            // On its disk directory, with the upper layer held for the write-back: as
            // after a fallback, offloaded again once that is done.
            let again = self.interval.as_secs().max(1);
            let rec = FallbackRecord {
                at: unix_now(),
                reason: format!("eviction ({by}): the write-back is pending"),
                reoffload_at: Some(unix_now().saturating_add(again)),
            };
            let _ = self.state.set_fallback(&name, &rec);
            let w = &mut self.mounts[i];
            w.fallback = Some(rec);
            w.state = MountState::Fallback;
            error!(
                mount = name.as_str(),
                action = "evict",
                "{name}: eviction switched to the disk directory, but writing the upper layer back failed: {}; retried, then offloaded again",
                r.reason.unwrap_or_default()
            );
            return false;
        }
        self.apply(std::slice::from_ref(&name), "evict");
        let w = &mut self.mounts[i];
        if w.root.is_none() {
            error!(
                mount = name.as_str(),
                action = "evict",
                "{name}: written back, but not offloaded again: the application stays on its disk directory until the next apply"
            );
            return false;
        }
        w.metrics.count("evict");
        let written: u64 = r
            .syncs
            .iter()
            .filter_map(|s| s.stats.as_ref())
            .map(|s| s.files_written)
            .sum();
        w.metrics.evicted_files += written;
        let freed = match (before, w.usage) {
            (Some(b), Some(a)) => b.used.saturating_sub(a.used),
            _ => 0,
        };
        w.metrics.evicted_bytes += freed;
        // Whether it freed anything, for the watchdog's next step: the layer may have
        // been written back already by a periodic sync, and still freed its RAM.
        w.last_evicted = written.max(u64::from(freed > 0));
        let used = |u: Option<Usage>| u.map_or_else(|| "?".into(), |u| pct(u.used, u.size));
        info!(
            mount = name.as_str(),
            action = "evict",
            "{name}: upper layer written back and started afresh ({by}) in {} ms; usage {} -> {}",
            started.elapsed().as_millis(),
            used(before),
            used(w.usage)
        );
        true
    }

    /// Writes mount `i` back and takes it down as `tmpfsctl down` does (`action`: the
    /// name its write-backs and logs carry, and how a log line calls it), with the
    /// state lock held; the result, with `defer` the write-back left to the caller
    /// (see [`down::switch_one`]), and the guards, or `None` when it was postponed,
    /// failed or was refused (logged; what `stays` then).
    fn take_out(
        &mut self,
        i: usize,
        (action, called): (&str, &str),
        stays: &str,
        defer: bool,
    ) -> Option<(down::DownResult, Option<Handoff>, (Busy, Lock))> {
        let busy = self.alive.busy();
        let name = self.mounts[i].spec.name.clone();
        let lock = self.lock_now(i, called, false)?;
        // Let go of the root first, so an idle mount unmounts cleanly.
        self.unwatch(i);
        let taken = if defer {
            down::switch_one(&self.spec, &name, &self.host, &self.state, action)
        } else {
            down::down_one(&self.spec, &name, &self.host, &self.state, action).map(|r| (r, None))
        };
        let failed = match taken {
            // Nothing switched (an overlay's first pass failed, say): nothing was
            // taken out, and nothing must count as done.
            Ok((r, _)) if matches!(r.result, DownOutcome::Refused | DownOutcome::Failed) => {
                for s in &r.syncs {
                    self.record_sync(i, s);
                }
                let how = if r.result == DownOutcome::Refused {
                    "refused"
                } else {
                    "failed"
                };
                format!("{called} {how}, {stays}: {}", r.reason.unwrap_or_default())
            }
            Ok((r, handoff)) => {
                for s in &r.syncs {
                    self.record_sync(i, s);
                }
                // Its device may outlive the mount for a while.
                self.release_at = Some(Instant::now() + RELEASE_RETRY);
                self.release_every = RELEASE_RETRY;
                return Some((r, handoff, (busy, lock)));
            }
            Err(e) => format!("{called} failed: {e:#}"),
        };
        error!(mount = name.as_str(), action, "{name}: {failed}");
        drop(lock);
        self.rescan();
        None
    }

    /// Takes the mount out of RAM the same way `tmpfsctl down` does; the
    /// application continues on its disk directory at once, and a persisted
    /// mount's RAM copy is written back from where it is held by the worker.
    pub(super) fn fallback(&mut self, i: usize, by: &str) -> bool {
        let name = self.mounts[i].spec.name.clone();
        let usage = self.mounts[i].usage;
        let ram = check::memory_text(self.mounts[i].memory, &self.mounts[i].spec.watchdog);
        let Some((r, handoff, (_busy, lock))) =
            self.take_out(i, ("fallback", "fallback"), "the tmpfs stays", true)
        else {
            return false;
        };
        let w = &mut self.mounts[i];
        let now = unix_now();
        let reoffload_at = w.spec.watchdog.reoffload_after.map(|s| now.saturating_add(s));
        let reason = format!(
            "{by} at {}{ram}",
            usage
                .map(|u| format!("{} used", pct(u.used, u.size)))
                .unwrap_or_default()
        );
        let rec = FallbackRecord {
            at: now,
            reason: reason.clone(),
            reoffload_at,
        };
        let when = match w.spec.watchdog.reoffload_after {
            Some(s) => format!("the agent offloads it again after {s}s"),
            None => "`tmpfsctl apply` (or a change of this mount in the spec) offloads it again".into(),
        };
        let marker = format!("fell back to the disk directory (agent): {reason}; {when}");
        if let Err(e) = self
            .state
            .set_degraded(&name, &marker)
            .and_then(|_| self.state.set_fallback(&name, &rec))
        {
            error!("{name}: recording the fallback: {e:#}");
        }
        w.fallback = Some(rec);
        w.state = MountState::Fallback;
        w.usage = None;
        w.tracker = Tracker::default();
        w.metrics.level = Level::Ok;
        w.metrics.count("fallback");
        let how = match r.result {
            DownOutcome::Detached => format!(
                "detached lazily; {} open files until they close them",
                holders_keep(&r.holders)
            ),
            DownOutcome::Pending if handoff.is_some() => {
                "switched; its RAM copy is being written back".into()
            }
            DownOutcome::Pending => format!(
                "switched, but the write-back is pending: {}",
                r.reason.clone().unwrap_or_default()
            ),
            _ => "unmounted".into(),
        };
        warn!(
            mount = name.as_str(),
            action = "fallback",
            "{name}: fell back to the disk directory ({by}): {how}{}; {when}",
            if r.syncs.is_empty() {
                String::new()
            } else {
                format!(
                    "; written back {}",
                    crate::plural::count(r.syncs.len(), "time", "times")
                )
            }
        );
        if let Some(h) = handoff {
            self.queue_writeback(
                i,
                "fallback",
                Task::Held {
                    watch: Box::new(h.watch),
                },
                lock,
            );
        }
        true
    }

    /// Hands the write-back of mount `i` to the worker, under `lock`.
    pub(super) fn queue_writeback(&mut self, i: usize, by: &'static str, task: Task, lock: Lock) {
        let name = self.mounts[i].spec.name.clone();
        let fallback = self.mounts[i].fallback.clone().zip(self.state.degraded(&name));
        if matches!(task, Task::Scheduled) {
            // Due again once this one ended.
            self.mounts[i].next_sync = None;
        }
        let job = Job {
            name: name.clone(),
            spec: self.spec.clone(),
            host: self.host.clone(),
            state: self.state.clone(),
            by,
            task,
            fallback,
        };
        debug!(mount = name.as_str(), "{name}: write-back ({by}) queued");
        self.worker.push(
            job,
            match lock {
                Lock::Own(l) => Some(l),
                Lock::Worker => None,
            },
        );
    }

    /// What the worker finished: recorded and logged; the schedule goes on. Once it
    /// is idle, an `apply` that waited for it runs.
    pub(super) fn reap_writebacks(&mut self) {
        for f in self.worker.reap() {
            self.writeback_done(f);
        }
        if self.worker.idle() && !self.apply_waiting.is_empty() {
            let names = std::mem::take(&mut self.apply_waiting);
            self.apply(&names, "after the write-backs");
        }
    }

    pub(super) fn writeback_done(&mut self, f: Finished) {
        let name = f.name;
        let Some(i) = self.mounts.iter().position(|w| w.spec.name == name) else {
            info!(
                "{name}: write-back ({}) ended after {:.3}s; no longer in the spec",
                f.by, f.seconds
            );
            return;
        };
        match f.outcome {
            Outcome::Scheduled(res) => {
                match res {
                    Ok(results) => {
                        for s in &results {
                            self.record_sync(i, s);
                        }
                    }
                    Err(e) => error!("{name}: periodic write-back failed: {e:#}"),
                }
                if let Persist::Every(secs) = self.mounts[i].spec.persist {
                    self.mounts[i].next_sync = Some(decide::deadline(Instant::now(), secs));
                }
            }
            Outcome::Held(res) => self.held_writeback_done(i, &name, f.by, f.fallback, *res),
        }
    }

    fn held_writeback_done(
        &mut self,
        i: usize,
        name: &str,
        by: &str,
        fallback: Option<(FallbackRecord, String)>,
        res: Result<(SyncResult, DownOutcome)>,
    ) {
        match res {
            Ok((s, outcome)) if s.result == SyncOutcome::Synced => {
                // Its clean-up forgot the mount, the fallback's marker with it; the
                // fallback stays in force (`status`, the re-offload). Forgotten, the
                // mount was never offloaded again (a hunting helper's probe).
                if let Some((rec, marker)) = fallback {
                    if let Err(e) = self
                        .state
                        .set_degraded(name, &marker)
                        .and_then(|_| self.state.set_fallback(name, &rec))
                    {
                        error!("{name}: recording the fallback again: {e:#}");
                    }
                    // A rescan since the clean-up (its unmount changed the table) found none.
                    let w = &mut self.mounts[i];
                    if w.root.is_none() {
                        w.fallback = Some(rec);
                        w.state = MountState::Fallback;
                    }
                }
                self.record_sync(i, &s);
                let how = match outcome {
                    DownOutcome::Detached => "detached lazily",
                    _ => "unmounted",
                };
                info!(
                    mount = name,
                    "{name}: the RAM copy the {} left is written back; its tmpfs {how}",
                    if by == "fallback" { "fallback" } else { "take-out" }
                );
                self.release_at = Some(Instant::now() + RELEASE_RETRY);
                self.release_every = RELEASE_RETRY;
            }
            Ok((s, _)) => {
                self.record_sync(i, &s);
                warn!(
                    mount = name,
                    "{name}: the RAM copy stays held at {} for the next try (the agent's, once an interval; `tmpfsctl down` or `sync`)",
                    self.state.held(name).display(),
                );
            }
            Err(e) => error!(
                mount = name,
                "{name}: writing back the held RAM copy failed: {e:#}; it stays for the next try"
            ),
        }
    }

    pub(super) fn record_sync(&mut self, i: usize, s: &SyncResult) {
        let w = &mut self.mounts[i];
        match s.result {
            SyncOutcome::Synced => {
                w.metrics.syncs_ok += 1;
                w.metrics.count("sync");
            }
            SyncOutcome::Failed => w.metrics.syncs_failed += 1,
            SyncOutcome::Skipped => return,
        }
        w.metrics.last_sync = Some((unix_now(), s.seconds, s.result == SyncOutcome::Synced));
        match s.result {
            SyncOutcome::Failed => error!(
                mount = s.name.as_str(),
                action = "sync",
                "{}: write-back failed after {:.3}s: {}",
                s.name,
                s.seconds,
                s.reason.clone().unwrap_or_default()
            ),
            _ => info!(
                mount = s.name.as_str(),
                action = "sync",
                "{}: written back in {:.3}s",
                s.name,
                s.seconds
            ),
        }
    }

    /// `persist: every <d>`: write back when due, on the worker.
    pub(super) fn periodic_syncs(&mut self) {
        let now = Instant::now();
        for i in 0..self.mounts.len() {
            let w = &self.mounts[i];
            // An overlay is not watched (no root held) but written back all the same.
            let overlay = w.spec.seed == crate::spec::Seed::Overlay && w.state == MountState::Offloaded;
            if (w.root.is_none() && !overlay) || w.next_sync.is_none_or(|t| t > now) {
                continue;
            }
            if !matches!(w.spec.persist, Persist::Every(_)) {
                continue;
            }
            match self.lock_now(i, "periodic write-back", false) {
                Some(lock) => self.queue_writeback(i, "schedule", Task::Scheduled, lock),
                None => {
                    self.mounts[i].next_sync =
                        Some(Instant::now() + self.interval.max(Duration::from_secs(5)));
                }
            }
        }
    }

    /// Frees the devices no mount uses any more, once the kernel lets them go. A
    /// take-out (`down`'s) detaches a busy mount lazily: its filesystem, and the
    /// device's RAM, live on until the last file open there is closed, or a
    /// `sync` of the whole host that holds it ends; `down` then keeps the device
    /// (and says so), and tried only once, its RAM stayed held until the next
    /// `down` or `apply`, long after the fallback that was to give it back. Tried
    /// after the agent's own take-outs, at start, and whenever the mount table is
    /// read again while devices are recorded (a `down` or `sync` of the operator's
    /// may have left one), then again while one is left, after [`RELEASE_RETRY`]
    /// at first and twice as long each time, up to [`RELEASE_RETRY_MAX`] (a
    /// device mounted in another mount namespace stays for as long as that
    /// mount); each try is a few system calls under the state lock, and waits
    /// for nothing.
    pub(super) fn release_devices(&mut self) {
        if self.release_at.is_none_or(|t| Instant::now() < t) {
            return;
        }
        // Never beside an `apply`, `down` or `bench`: a device they are building has
        // no mount yet.
        let done = match self.state.lock(Duration::ZERO) {
            Ok(_lock) => match crate::backend::release_unused_now(&self.state) {
                Ok(r) => {
                    for freed in &r.freed {
                        info!("{freed}");
                    }
                    for held in &r.held {
                        debug!("{held}");
                    }
                    r.held.is_empty()
                }
                Err(e) => {
                    debug!("freeing unused devices: {e:#}");
                    false
                }
            },
            Err(e) => {
                debug!("freeing unused devices: {e}");
                false
            }
        };
        if done {
            self.release_at = None;
            self.release_every = RELEASE_RETRY;
        } else {
            self.release_at = Some(Instant::now() + self.release_every);
            self.release_every = (self.release_every * 2).min(RELEASE_RETRY_MAX);
        }
    }

    pub(super) fn next_reoffload(&self) -> Option<Instant> {
        let now = unix_now();
        self.mounts
            .iter()
            .filter(|w| w.root.is_none())
            .filter_map(|w| w.fallback.as_ref()?.reoffload_at)
            .map(|at| decide::deadline(Instant::now(), at.saturating_sub(now)))
            .min()
    }

    pub(super) fn reoffloads(&mut self) {
        let now = unix_now();
        let due: Vec<String> = self
            .mounts
            .iter()
            .filter(|w| w.root.is_none())
            .filter(|w| {
                w.fallback
                    .as_ref()
                    .and_then(|f| f.reoffload_at)
                    .is_some_and(|t| t <= now)
            })
            .map(|w| w.spec.name.clone())
            .collect();
        for name in due {
            let Some(i) = self.mounts.iter().position(|w| w.spec.name == name) else {
                continue;
            };
            if let Some(why) = &self.pressure {
                // Not now; look again in one interval.
                debug!("{name}: re-offload postponed: {why}");
                if let Some(f) = self.mounts[i].fallback.as_mut() {
                    f.reoffload_at = Some(now.saturating_add(self.interval.as_secs().max(1)));
                }
                continue;
            }
            if let Some(why) = self.queue_pending_writeback(i, true) {
                warn!(
                    mount = name.as_str(),
                    "{name}: not re-offloaded: the write-back of its last tmpfs is still pending ({why}); next try in {}s",
                    self.interval.as_secs().max(1)
                );
                if let Some(f) = self.mounts[i].fallback.as_mut() {
                    f.reoffload_at = Some(now.saturating_add(self.interval.as_secs().max(1)));
                }
                continue;
            }
            if !self.worker.idle() {
                // `apply` acts only while the worker is idle; looked at again in one interval.
                debug!(
                    "{name}: re-offload waits for the write-back of {}",
                    self.worker.current().unwrap_or("another mount")
                );
                if let Some(f) = self.mounts[i].fallback.as_mut() {
                    f.reoffload_at = Some(now.saturating_add(self.interval.as_secs().max(1)));
                }
                continue;
            }
            if let Some(why) = self.too_full_to_reoffload(i) {
                let w = &mut self.mounts[i];
                let again = w.spec.watchdog.reoffload_after.unwrap_or(600);
                warn!(
                    mount = name.as_str(),
                    "{name}: not re-offloaded: {why}; it would fall back again at once. Next try in {again}s"
                );
                if let Some(f) = w.fallback.as_mut() {
                    f.reoffload_at = Some(now.saturating_add(again));
                    let rec = f.clone();
                    let _ = self.state.set_fallback(&name, &rec);
                }
                continue;
            }
            info!(
                mount = name.as_str(),
                "{name}: re-offloading (reoffload_after elapsed)"
            );
            self.apply(std::slice::from_ref(&name), "re-offload");
            let w = &mut self.mounts[i];
            if w.root.is_some() {
                w.metrics.count("reoffload");
                info!(mount = name.as_str(), action = "reoffload", "{name}: back in RAM");
            } else if let Some(f) = w.fallback.as_mut() {
                let again = w.spec.watchdog.reoffload_after.unwrap_or(600);
                f.reoffload_at = Some(unix_now().saturating_add(again));
                warn!(
                    mount = name.as_str(),
                    "{name}: re-offload did not succeed; next try in {again}s"
                );
                let rec = f.clone();
                let _ = self.state.set_fallback(&name, &rec);
            }
        }
    }

    /// Retries, once an interval, the write-back of every held tmpfs: one left by a
    /// take-out killed after its switch (this agent's before a restart, or a
    /// `down`'s), whose fallback record was never written, and one a fallback left
    /// pending (a full disk). Before, only the re-offload retried, once due and only
    /// with `reoffload_after`, and the application's data stayed in RAM only until a
    /// `down` (hunting helpers' probes: still pending 25 s after a restart, and 30 s
    /// after the disk had room again).
    pub(super) fn pending_writebacks(&mut self) {
        if self.pending_at.is_none_or(|t| Instant::now() < t) {
            return;
        }
        self.pending_at = Some(Instant::now() + self.interval.max(Duration::from_secs(1)));
        for i in 0..self.mounts.len() {
            if self.mounts[i].spec.persist != Persist::None {
                // Not waiting for the lock: its holder (`down`, another agent) is
                // likely writing this back; the loop must not stall meanwhile.
                self.queue_pending_writeback(i, false);
            }
        }
    }

    /// Hands the write-back of the tmpfs a take-out of mount `i` left held to the
    /// worker, if one is held and not queued yet: why the mount is still pending,
    /// or `None` when nothing is. The state lock is only tried; busy, the
    /// write-back counts as pending if `busy_pending`, else it is left to the
    /// lock's holder, likely at work on it, and to the next try.
    pub(super) fn queue_pending_writeback(&mut self, i: usize, busy_pending: bool) -> Option<String> {
        let name = self.mounts[i].spec.name.clone();
        let under_way = || Some("its write-back is under way".to_string());
        if self.worker.has(&name) {
            return under_way();
        }
        let held = |a: &Self| {
            a.host
                .mounts()
                .is_ok_and(|table| sync::held(&table, &a.mounts[i].spec, &a.state))
        };
        if !held(self) {
            return None;
        }
        let lock = if self.worker.holds_lock() {
            Lock::Worker
        } else {
            match self.state.lock(Duration::ZERO) {
                Ok(l) => Lock::Own(l),
                Err(e) if busy_pending => return Some(e.to_string()),
                Err(e) => {
                    debug!("{name}: pending write-back not retried now: {e}");
                    return None;
                }
            }
        };
        // A `down` that held the lock may have finished it meanwhile.
        if !held(self) {
            return None;
        }
        self.queue_writeback(
            i,
            "retry",
            Task::Held {
                watch: Box::new(None),
            },
            lock,
        );
        under_way()
    }

    /// Seeding mount `i` again would put it at or above `high` (its disk
    /// directory grew while it was on disk): why, or `None` when it fits.
    pub(super) fn too_full_to_reoffload(&self, i: usize) -> Option<String> {
        let m = &self.mounts[i].spec;
        if m.seed != crate::spec::Seed::Copy {
            return None;
        }
        let need = match crate::copy::measure(&m.path) {
            Ok(n) => n,
            Err(e) => return Some(format!("cannot measure {}: {e}", m.path.display())),
        };
        let room = (m.size as f64 * m.watchdog.bytes.high / 100.0) as u64;
        let inode_room = m
            .inodes
            .map(|n| (n as f64 * m.watchdog.inodes.high / 100.0) as u64);
        if need.allocated >= room || inode_room.is_some_and(|r| need.inodes >= r) {
            return Some(format!(
                "its disk directory holds {} in {}, at or above high ({}% of {})",
                format_bytes(need.allocated),
                crate::plural::count(need.inodes, "file", "files"),
                m.watchdog.bytes.high,
                format_bytes(m.size)
            ));
        }
        None
    }

    /// observe → plan → execute for `names` (a subset of the spec), like
    /// `apply`. Sizes the agent grew (within `max_size`) are kept.
    pub(super) fn apply(&mut self, names: &[String], why: &str) {
        if names.is_empty() {
            self.rescan();
            return;
        }
        if !self.worker.idle() {
            // It would wait for the lock the agent holds for its own write-back.
            info!("{why}: {} waits for the write-backs under way", names.join(", "));
            for n in names {
                if !self.apply_waiting.contains(n) {
                    self.apply_waiting.push(n.clone());
                }
            }
            return;
        }
        let res = (|| -> Result<execute::ApplyReport> {
            let _busy = self.alive.busy();
            let _lock = self.state.lock(self.opts.wait)?;
            let world = observe::observe(&self.spec, &self.host, &self.state)?;
            let mut spec = self.spec.clone();
            for (m, o) in spec.mounts.iter_mut().zip(&world.mounts) {
                keep_growth(m, &o.at_path, self.page_size);
            }
            let full = plan::plan(&spec, &world, &self.state);
            let pick: Vec<usize> = (0..spec.mounts.len())
                .filter(|&k| names.contains(&spec.mounts[k].name))
                .collect();
            let sub_spec = Spec {
                mounts: pick.iter().map(|&k| spec.mounts[k].clone()).collect(),
                ..spec.clone()
            };
            let sub_plan = Plan {
                prepare: full.prepare.clone(),
                mounts: pick.iter().map(|&k| full.mounts[k].clone()).collect(),
                cleanup: full.cleanup.clone(),
                orphans: full.orphans.clone(),
            };
            execute::apply(
                &sub_spec,
                &sub_plan,
                &self.state,
                &execute::ApplyOptions { progress: false },
            )
        })();
        match res {
            Ok(r) => {
                for s in &r.host_steps {
                    info!("{why}: host: {s}");
                }
                for m in &r.mounts {
                    let steps = if m.steps.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", m.steps.join("; "))
                    };
                    let reason = m.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
                    match m.result {
                        execute::Outcome::Unchanged => debug!("{why}: {} unchanged", m.name),
                        execute::Outcome::Changed => {
                            info!(mount = m.name.as_str(), "{why}: {} changed{steps}", m.name)
                        }
                        other => warn!(
                            mount = m.name.as_str(),
                            "{why}: {} {}{reason}",
                            m.name,
                            serde_json::to_value(other)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_default()
                        ),
                    }
                }
                for (name, path) in &r.orphans {
                    warn!("managed tmpfs `{name}` at {} is not in the spec; the agent leaves it alone (`tmpfsctl down SPEC {name}` takes it down)", path.display());
                }
            }
            Err(e) => error!("{why}: apply failed: {e:#}"),
        }
        // As built now: a re-offload records the spec's seed, backend and persist.
        for n in names {
            if let (Some(m), Some(w)) = (
                self.spec.mount(n),
                self.mounts.iter_mut().find(|w| w.spec.name == *n),
            ) {
                w.spec = self.state.as_mounted(m);
            }
        }
        self.rescan();
    }
}
