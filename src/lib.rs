//! tmpfsctl: puts application cache directories into size-limited tmpfs,
//! declaratively and safely.
//!
//! Every command is a view of one pipeline:
//! `spec` (desired) + `observe` (the host, read through `host`) → `plan`
//! (ordered steps, pure) → `execute` → `backend` (each backend's options,
//! mount and remount, through the syscalls in `mount`) → `report`.
//! `apply`, `down`, and the agent's fallback, grow and shrink are each
//! decided by a pure function (`plan`, `down::decide`, `plan::resize`) and
//! carried out by `execute`; `sync` and eviction write through `copy`.
//! `status` and `down` reuse the same observation; `state` is /run/tmpfsctl.

pub mod advise;
pub mod agent;
pub mod backend;
pub mod boot;
pub mod cli;
pub mod copy;
pub mod dirty;
pub mod diskbench;
pub mod down;
pub mod error;
pub mod execute;
pub mod failpoint;
pub mod host;
pub mod keeper;
pub mod logging;
pub mod mount;
pub mod observe;
pub mod out;
pub mod plan;
pub mod plural;
pub mod progress;
pub mod report;
pub mod residency;
pub mod signals;
pub mod spec;
pub mod state;
pub mod status;
pub mod sync;
