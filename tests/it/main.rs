//! The integration tests, in one binary: one module per theme, sharing the
//! fixtures in `common` (the sandbox: a private mount namespace per test
//! thread, the built binary run in it, a loop-device ext4, an application
//! thread) and `common_copy` (a tree with every kind of entry, a metadata
//! walker, an `rsync -n` comparison). Run one theme with
//! `cargo test --test it apply::`.

mod common;
mod common_copy;

mod advise;
mod agent_integration;
mod agent_writeback;
mod apply;
mod bad_specs;
mod boot;
mod cli;
mod copy_parity;
mod crash_phases;
mod diskbench;
mod examples;
mod hostile_copy;
mod hostile_paths;
mod hostile_state;
mod linked_names;
mod no_write_lost;
mod output;
mod overlay;
mod power_cut;
mod progress;
mod residency;
mod respec;
mod schema;
mod seed_window;
mod writeback_crash;
mod writeback_listing;
mod writeback_symlinks;
mod writeback_sync;
mod writeback_tracked;
mod writeback_tracked_races;
mod writeback_trust;
mod zram;
