//! The agent: write-backs on a thread of their own.
//!
//! A write-back of a large tree takes seconds: 60,000 files took 10–30 s on a
//! loaded machine. Run in the loop, it held up the checks of every other mount,
//! and a volatile mount filling meanwhile met ENOSPC. So the loop hands its
//! write-backs (the schedule's, the one after a fallback's switch, one left
//! pending) to the worker, which runs them one at a time in the order given, and
//! goes on measuring, evicting and growing; it learns of each one's end through a
//! pipe it polls.
//!
//! The state lock: the agent holds it from the first write-back queued until the
//! last one ended, so no `down`, `sync` or `apply` of another process acts
//! meanwhile. Under it the loop goes on acting on the other mounts (a grow, a
//! shrink, a fallback's switch, whose write-back is queued): a write-back touches
//! its own mount's records only. An action on a mount being written back waits,
//! as for a lock another process holds; so does what acts on several mounts at
//! once (`apply`, a re-offload, freeing devices), until the worker is idle.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{Context, Result};
use nix::fcntl::{Flock, OFlag};

use crate::down::DownOutcome;
use crate::host::deletions::Deletions;
use crate::host::Host;
use crate::spec::Spec;
use crate::state::{FallbackRecord, State};
use crate::sync::{self, SyncResult};

/// What is written back.
pub(super) enum Task {
    /// The live tmpfs (`persist: every`).
    Scheduled,
    /// The held tmpfs a take-out switched away from: right after the agent's
    /// fallback (with the watch for deletions on disk started before its switch),
    /// or left pending.
    Held { watch: Box<Option<Deletions>> },
}

pub(super) struct Job {
    pub name: String,
    /// The spec in force when the job was queued.
    pub spec: Spec,
    pub host: Host,
    pub state: State,
    /// Recorded with the write-back (`schedule`, `fallback`, `retry`).
    pub by: &'static str,
    pub task: Task,
    /// The fallback in force and its marker: a held tmpfs's write-back forgets the
    /// mount, and them with it, when it succeeds; they are recorded again.
    pub fallback: Option<(FallbackRecord, String)>,
}

pub(super) enum Outcome {
    Scheduled(Result<Vec<SyncResult>>),
    Held(Box<Result<(SyncResult, DownOutcome)>>),
}

pub(super) struct Finished {
    pub name: String,
    pub by: &'static str,
    pub fallback: Option<(FallbackRecord, String)>,
    pub outcome: Outcome,
    pub seconds: f64,
}

impl Finished {
    pub fn succeeded(&self) -> bool {
        match &self.outcome {
            Outcome::Scheduled(r) => r
                .as_ref()
                .is_ok_and(|rs| rs.iter().all(|s| s.result != sync::SyncOutcome::Failed)),
            Outcome::Held(r) => r
                .as_ref()
                .as_ref()
                .is_ok_and(|(s, _)| s.result == sync::SyncOutcome::Synced),
        }
    }
}

struct Running {
    name: String,
    by: &'static str,
    held: bool,
    fallback: Option<(FallbackRecord, String)>,
    started: Instant,
    thread: JoinHandle<Outcome>,
}

pub(super) struct Worker {
    queue: VecDeque<Job>,
    running: Option<Running>,
    /// Write-backs that could not start (no thread for them): handed back at the
    /// next [`Worker::reap`], as failed.
    unstarted: Vec<Finished>,
    lock: Option<Flock<File>>,
    ended_r: OwnedFd,
    ended_w: Arc<OwnedFd>,
}

impl Worker {
    pub fn new() -> Result<Worker> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .context("creating the write-back worker's pipe")?;
        Ok(Worker {
            queue: VecDeque::new(),
            running: None,
            unstarted: Vec::new(),
            lock: None,
            ended_r: r,
            ended_w: Arc::new(w),
        })
    }

    /// Readable once a write-back ended.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.ended_r.as_fd()
    }

    pub fn idle(&self) -> bool {
        self.running.is_none() && self.queue.is_empty()
    }

    /// Mount `name` is being written back, or queued to be.
    pub fn has(&self, name: &str) -> bool {
        self.running.as_ref().is_some_and(|r| r.name == name) || self.queue.iter().any(|j| j.name == name)
    }

    /// The agent holds the state lock for the worker.
    pub fn holds_lock(&self) -> bool {
        self.lock.is_some()
    }

    /// The mount being written back.
    pub fn current(&self) -> Option<&str> {
        self.running.as_ref().map(|r| r.name.as_str())
    }

    /// Queues `job`; `lock` is the state lock when the worker does not hold it yet.
    pub fn push(&mut self, job: Job, lock: Option<Flock<File>>) {
        if self.lock.is_none() {
            self.lock = lock;
        }
        assert!(
            self.lock.is_some(),
            "a write-back is queued only with the state lock held"
        );
        self.queue.push_back(job);
        if self.running.is_none() {
            self.start_next();
        }
    }

    fn start_next(&mut self) {
        let Some(job) = self.queue.pop_front() else {
            self.lock = None;
            return;
        };
        let ended = Arc::clone(&self.ended_w);
        let (name, by, fallback) = (job.name.clone(), job.by, job.fallback.clone());
        let held = matches!(job.task, Task::Held { .. });
        let spawned = std::thread::Builder::new()
            .name(format!("write-back {name}"))
            .spawn(move || {
                // Written when the thread ends, also by a panic: the loop then joins
                // it and takes the panic for a failed write-back, retried. Without
                // it, the loop never learnt of the end, and held the lock for good
                // (a review helper's probe).
                let _ended = Ended(ended);
                run(job)
            });
        match spawned {
            Ok(thread) => {
                self.running = Some(Running {
                    name,
                    by,
                    held,
                    fallback,
                    started: Instant::now(),
                    thread,
                })
            }
            Err(e) => {
                // Handed back as failed, so its mount's schedule goes on (a review
                // helper's probe: dropped, the schedule stopped for good).
                let e = anyhow::anyhow!("no thread for the write-back: {e}");
                self.unstarted.push(Finished {
                    name,
                    by,
                    fallback,
                    outcome: if held {
                        Outcome::Held(Box::new(Err(e)))
                    } else {
                        Outcome::Scheduled(Err(e))
                    },
                    seconds: 0.0,
                });
                let _ = nix::unistd::write(self.ended_w.as_fd(), b"x");
                self.start_next();
            }
        }
    }

    /// The write-back that ended since the last call, if one did; the next one
    /// starts, and the lock goes once none is left.
    pub fn reap(&mut self) -> Vec<Finished> {
        let mut buf = [0u8; 8];
        let mut ended = 0;
        while let Ok(n @ 1..) = nix::unistd::read(&self.ended_r, &mut buf) {
            ended += n;
        }
        // One runs at a time, and its last act is that byte: the join waits
        // for its return at most.
        let mut done = std::mem::take(&mut self.unstarted);
        if ended > done.len() {
            if let Some(r) = self.running.take() {
                done.push(finished(r));
                self.start_next();
            }
        }
        done
    }

    /// Waits for every write-back queued (at stop), and lets the lock go.
    pub fn finish_all(&mut self) -> Vec<Finished> {
        let mut done = std::mem::take(&mut self.unstarted);
        while let Some(r) = self.running.take() {
            done.push(finished(r));
            self.start_next();
        }
        self.lock = None;
        done
    }
}

/// Writes a byte to the loop's pipe when dropped: the end of a write-back's thread.
struct Ended(Arc<OwnedFd>);

impl Drop for Ended {
    fn drop(&mut self) {
        // The loop polls the other end; a full pipe already wakes it.
        let _ = nix::unistd::write(self.0.as_fd(), b"x");
    }
}

fn finished(r: Running) -> Finished {
    let seconds = r.started.elapsed().as_secs_f64();
    let outcome = r.thread.join().unwrap_or_else(|_| {
        let e = anyhow::anyhow!("the write-back's thread panicked");
        if r.held {
            Outcome::Held(Box::new(Err(e)))
        } else {
            Outcome::Scheduled(Err(e))
        }
    });
    Finished {
        name: r.name,
        by: r.by,
        fallback: r.fallback,
        outcome,
        seconds,
    }
}

fn run(job: Job) -> Outcome {
    let Job {
        name,
        spec,
        host,
        state,
        by,
        task,
        ..
    } = job;
    match task {
        Task::Scheduled => Outcome::Scheduled(sync::sync(
            &spec,
            std::slice::from_ref(&name),
            &host,
            &state,
            by,
            false,
        )),
        Task::Held { watch } => Outcome::Held(Box::new(match spec.mount(&name) {
            Some(m) => sync::finish_writeback(m, &host, &state, *watch, by),
            None => Err(anyhow::anyhow!("`{name}` is no longer in the spec")),
        })),
    }
}
