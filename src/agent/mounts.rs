//! The agent: Which mounts are watched: the mount table rescanned, the spec reloaded.

use super::*;

impl Agent {
    /// Stops watching mount `i` (before it goes away).
    pub(super) fn unwatch(&mut self, i: usize) {
        self.mounts[i].scanned = None;
        let w = &mut self.mounts[i];
        w.changes = None;
        if let Some(root) = w.root.take() {
            if let Some(wake) = &self.wake {
                wake.remove(root.as_fd());
            }
        }
        w.next_sync = None;
    }

    /// Re-reads the mount table: starts watching mounts that appeared,
    /// stops watching those that went, and refreshes each mount's state.
    pub(super) fn rescan(&mut self) {
        self.last_rescan = Instant::now();
        if crate::backend::any_recorded(&self.state) {
            self.release_at.get_or_insert_with(Instant::now);
        }
        let table = match self.host.mounts() {
            Ok(t) => t,
            Err(e) => {
                warn!("{e:#}");
                return;
            }
        };
        for i in 0..self.mounts.len() {
            let source = self.mounts[i].spec.source();
            let path = self.mounts[i].spec.path.clone();
            let top = table.top_at(&path).cloned();
            let ours = top.as_ref().filter(|e| backend::is_ours(e, &source));
            let held = self.mounts[i].root.is_some();
            let watched = self.mounts[i].mount;
            // Not one under the state directory: that is a take-out's.
            let elsewhere = table
                .entries
                .iter()
                .any(|e| (e.id, e.dev) == watched && !e.mount_point.starts_with(self.state.dir()));
            if held && ours.is_none() && elsewhere {
                // Still mounted, but its path leads elsewhere: a directory above it
                // renamed away (and maybe back soon), or the mount moved. It can
                // still fill, and its held root still evicts; a rename changes no
                // mount, so nothing but the timed rescan would have found it at its
                // path again (a hunting helper's probe: unwatched for up to 30 s).
                let w = &mut self.mounts[i];
                if w.quiet.pass("path elsewhere", Instant::now(), 0, 0) {
                    warn!(
                        mount = w.spec.name.as_str(),
                        "{}: {} no longer leads to its tmpfs (a directory above it renamed, or the mount moved); still watched through its root",
                        w.spec.name,
                        path.display()
                    );
                }
                continue;
            }
            if held && Some(watched) != ours.map(|e| (e.id, e.dev)) {
                info!(
                    mount = self.mounts[i].name(),
                    "{}: {} is no longer the watched tmpfs; stopped watching it",
                    self.mounts[i].name(),
                    path.display()
                );
                self.unwatch(i);
            }
            if self.mounts[i].root.is_none() {
                if let Some(e) = ours {
                    self.watch(i, e);
                }
            }
            let w = &mut self.mounts[i];
            if w.root.is_some() {
                if w.fallback.take().is_some() {
                    self.state.clear_fallback(&w.spec.name);
                }
                w.state = observe::classify(&StateFacts {
                    offloaded: true,
                    ..StateFacts::default()
                });
                continue;
            }
            w.usage = None;
            w.metrics.level = Level::Ok;
            w.fallback = self.state.fallback(&w.spec.name);
            w.state = observe::classify(&StateFacts {
                fallback: w.fallback.is_some(),
                degraded: self.state.degraded(&w.spec.name).is_some(),
                covered: top.is_some(),
                ..StateFacts::default()
            });
        }
    }

    /// Starts watching mount `i`, whose tmpfs `e` is at its path.
    pub(super) fn watch(&mut self, i: usize, e: &crate::host::mountinfo::MountEntry) {
        let path = self.mounts[i].spec.path.clone();
        let root = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                warn!("{}: cannot open {}: {e}", self.mounts[i].name(), path.display());
                return;
            }
        };
        // The mount's own id: a btrfs's files have another device number
        // than the mount table shows.
        if crate::host::procs::mount_id(root.as_fd()) != Some(e.id) {
            return;
        }
        let Ok(dev) = root.metadata().map(|m| m.dev()) else {
            return;
        };
        // overlayfs takes no fanotify mark reporting file handles: polled.
        let overlay = self.mounts[i].spec.seed == spec::Seed::Overlay;
        let marked = match &self.wake {
            Some(_) if overlay => false,
            Some(wake) => wake
                .add(root.as_fd())
                .map_err(|e| {
                    warn!(
                        "{}: fanotify mark failed ({e}); this mount is polled every {}",
                        self.mounts[i].name(),
                        describe_ms(self.interval.as_millis() as u64)
                    )
                })
                .is_ok(),
            None => false,
        };
        let w = &mut self.mounts[i];
        // An overlay's write-back reads its upper layer, which holds only what changed.
        if w.spec.persist != Persist::None && w.spec.seed != spec::Seed::Overlay {
            w.changes = root
                .try_clone()
                .map_err(anyhow::Error::from)
                .and_then(|r| crate::dirty::Running::spawn(&w.spec.name, r, &self.state))
                .map_err(|e| {
                    warn!(
                        "{}: no change tracker ({e:#}); every write-back reads the whole tree",
                        w.spec.name
                    )
                })
                .ok();
        }
        w.usage = Usage::of_fd(&root).ok();
        w.marked = marked;
        w.memory = None;
        w.synced_used = None;
        w.root = Some(root);
        w.dev = dev;
        w.mount = (e.id, e.dev);
        w.zram = backend::zram::device_of(e).filter(|_| w.spec.backend == spec::Backend::Zram);
        w.tracker = Tracker::default();
        if let Persist::Every(secs) = w.spec.persist {
            let last = self.state.last_sync(&w.spec.name).map(|r| r.at);
            let due = decide::sync_due_in(secs, last, unix_now());
            w.next_sync = Some(decide::deadline(Instant::now(), due));
        }
        info!(
            mount = w.name(),
            "{}: watching {} ({} of {} used)",
            w.spec.name,
            w.spec.path.display(),
            w.usage.map(|u| pct(u.used, u.size)).unwrap_or_default(),
            w.usage.map(|u| format_bytes(u.size)).unwrap_or_default()
        );
    }

    /// Re-reads the spec. An invalid spec is logged in full and the one in
    /// force stays; a valid one replaces it and the mounts that changed (or
    /// are new) are applied.
    pub(super) fn reload(&mut self, why: &str, force: bool) {
        if let Err(e) = spec::only_root_can_change(&self.path) {
            error!("reload ({why}): {e}; the spec in force stays");
            *self.reloads.entry("refused").or_insert(0) += 1;
            return;
        }
        let text = match spec::read_text(&self.path) {
            Ok(t) => t,
            Err(e) => {
                error!("reload ({why}): {e}; the spec in force stays");
                *self.reloads.entry("failed").or_insert(0) += 1;
                return;
            }
        };
        if !force && text == self.spec_text {
            return;
        }
        let mem_total = match self.host.meminfo() {
            Ok(m) => m.mem_total,
            Err(e) => {
                error!("reload ({why}): {e:#}; the spec in force stays");
                *self.reloads.entry("failed").or_insert(0) += 1;
                return;
            }
        };
        let new = match spec::parse(&self.path, &text, mem_total) {
            Ok(s) => s,
            Err(e) => {
                error!(
                    "reload ({why}): {} is invalid; the spec in force stays:\n{e}",
                    self.path.display()
                );
                *self.reloads.entry("invalid").or_insert(0) += 1;
                self.spec_text = text;
                return;
            }
        };
        let changed: Vec<String> = new
            .mounts
            .iter()
            .filter(|m| self.spec.mount(&m.name) != Some(*m))
            .map(|m| m.name.clone())
            .collect();
        let mut old: Vec<Watched> = std::mem::take(&mut self.mounts);
        for w in &old {
            if new.mount(w.name()).is_none() {
                warn!(
                    mount = w.name(),
                    "{}: removed from the spec; the agent stops watching it and leaves it as it is (`tmpfsctl down` with the old spec takes it down)",
                    w.name()
                );
            }
        }
        for w in old.iter_mut().filter(|w| new.mount(w.name()).is_none()) {
            if let (Some(wake), Some(root)) = (&self.wake, w.root.take()) {
                wake.remove(root.as_fd());
            }
        }
        for m in &new.mounts {
            // A live mount is written back as it was built, whatever the new
            // spec says of that (the apply below refuses to change it).
            let m = self.state.as_mounted(m);
            let w = match old.iter().position(|w| w.spec.name == m.name) {
                Some(k) => {
                    let mut w = old.swap_remove(k);
                    // Changed in the spec itself: what the record adds (it is gone
                    // after a fallback) is no change.
                    if changed.contains(&m.name) {
                        w.tracker = Tracker::default();
                        if w.fallback.take().is_some() {
                            self.state.clear_fallback(&m.name);
                        }
                        w.metrics.path = m.path.clone();
                    }
                    w.spec = m;
                    w
                }
                None => Watched::new(m, &self.state),
            };
            self.mounts.push(w);
        }
        self.spec = new;
        self.spec_text = text;
        self.settings();
        *self.reloads.entry("ok").or_insert(0) += 1;
        info!(
            "reloaded {} ({why}): {}, {} changed or new{}",
            self.path.display(),
            crate::plural::count(self.mounts.len(), "mount", "mounts"),
            changed.len(),
            if changed.is_empty() {
                String::new()
            } else {
                format!(" ({})", changed.join(", "))
            }
        );
        // A mount whose path changed is still mounted at the old path: plan
        // reports it as blocked (take it down with the old spec first).
        self.apply(&changed, "reload");
        self.check(true);
    }
}
