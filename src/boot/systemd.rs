//! systemd mode: units rendered for a spec, and drop-ins that order each
//! consumer after them. Pure functions; golden-tested.
//!
//! Three units, so that a failed apply cannot cancel the shutdown write-back
//! of the mounts that did succeed (systemd runs no ExecStop= of a failed unit):
//! - `tmpfsctl-apply.service` mounts and seeds at boot;
//! - `tmpfsctl-down.service` has only ExecStop=: at shutdown it writes
//!   persisted mounts back and unmounts, before systemd unmounts anything;
//! - `tmpfsctl-agent.service` watches the mounts while they run.

use std::path::Path;

use super::escape::{exec_arg, mount_unit, unit_value};
use super::Context;

pub const APPLY_UNIT: &str = "tmpfsctl-apply.service";
pub const DOWN_UNIT: &str = "tmpfsctl-down.service";
pub const AGENT_UNIT: &str = "tmpfsctl-agent.service";
/// What the apply unit starts after; validation keeps these out of `before:`.
pub const APPLY_AFTER: [&str; 2] = ["local-fs.target", "systemd-tmpfiles-setup.service"];

/// The command line of an `Exec*=` setting. systemd expands `$VAR` in the
/// arguments only, never in the executable's path, so `$` is doubled in the
/// spec path alone.
fn exec(cx: &Context, verb: &str) -> String {
    format!(
        "{} {verb} {}",
        unit_value(&cx.binary.to_string_lossy()),
        exec_arg(&cx.spec_path.to_string_lossy())
    )
}

/// `RequiresMountsFor=` the parent of every managed path: the filesystem that
/// holds the disk directory is mounted before, and unmounted after, the unit.
fn parents_mounted(cx: &Context) -> String {
    cx.spec
        .mounts
        .iter()
        .map(|m| {
            let parent = m.path.parent().unwrap_or(Path::new("/"));
            format!("RequiresMountsFor={}\n", unit_value(&parent.to_string_lossy()))
        })
        .collect()
}

/// The apply unit: early (after the local filesystems), before every consumer.
/// The rest of the boot does not wait for seeding; the consumers do.
pub fn apply_unit(cx: &Context) -> String {
    let mut u = cx.header();
    u.push_str("[Unit]\n");
    u.push_str("Description=Put application cache directories into tmpfs (tmpfsctl apply)\n");
    u.push_str("Documentation=file:/usr/share/doc/tmpfsctl/README.md\n");
    u.push_str("DefaultDependencies=no\n");
    u.push_str(&format!("After={}\n", APPLY_AFTER.join(" ")));
    u.push_str("Before=shutdown.target\n");
    u.push_str("Conflicts=shutdown.target\n");
    u.push_str(&parents_mounted(cx));
    let consumers = cx.consumers();
    if !consumers.is_empty() {
        u.push_str(&format!("Before={}\n", consumers.join(" ")));
    }
    u.push_str("\n[Service]\n");
    u.push_str("Type=oneshot\n");
    u.push_str("RemainAfterExit=yes\n");
    u.push_str(&format!("ExecStart={}\n", exec(cx, "apply")));
    u.push_str("# 3: a mount is degraded; its application runs on the disk directory and\n");
    u.push_str("# boot goes on. The reason is in the journal and in `tmpfsctl status`.\n");
    u.push_str("SuccessExitStatus=3\n");
    u.push_str(&format!("TimeoutStartSec={}\n", cx.timeout));
    u.push_str("\n[Install]\n");
    u.push_str("WantedBy=multi-user.target\n");
    u
}

/// The shutdown unit. Started (as a no-op) after apply; stopped before apply
/// and after every consumer and the agent. Ordered after the mount units
/// systemd creates for each tmpfs and side bind, so at shutdown it stops —
/// writes back and unmounts — while both are still mounted.
pub fn down_unit(cx: &Context) -> String {
    let mut u = cx.header();
    u.push_str("[Unit]\n");
    u.push_str("Description=Write tmpfs caches back and unmount them at shutdown (tmpfsctl down)\n");
    u.push_str("Documentation=file:/usr/share/doc/tmpfsctl/README.md\n");
    u.push_str("DefaultDependencies=no\n");
    u.push_str(&format!("After=local-fs.target {APPLY_UNIT}\n"));
    u.push_str("Before=shutdown.target\n");
    u.push_str("Conflicts=shutdown.target\n");
    u.push_str(&parents_mounted(cx));
    for m in &cx.spec.mounts {
        // Escaped unit names contain no whitespace or `%`: written as they are.
        u.push_str(&format!(
            "After={} {}\n",
            mount_unit(&m.path),
            mount_unit(&cx.state.side(&m.name))
        ));
    }
    u.push_str("\n[Service]\n");
    u.push_str("Type=oneshot\n");
    u.push_str("RemainAfterExit=yes\n");
    u.push_str(&format!("ExecStop={}\n", exec(cx, "down")));
    u.push_str(&format!("TimeoutStopSec={}\n", cx.timeout));
    u.push_str("\n[Install]\n");
    u.push_str("WantedBy=multi-user.target\n");
    u
}

/// The agent unit, from the template in systemd/ with this spec and binary.
pub fn agent_unit(cx: &Context) -> String {
    let template = include_str!("../../systemd/tmpfsctl-agent.service");
    let body: String = template
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .filter(|l| !l.starts_with("ConditionPathExists="))
        .map(|l| match l {
            "ExecStart=/usr/bin/tmpfsctl agent /etc/tmpfsctl/cache.yaml" => {
                format!("ExecStart={}\n", exec(cx, "agent"))
            }
            l => format!("{l}\n"),
        })
        .collect();
    format!("{}{body}", cx.header())
}

/// The drop-in for one consumer: it starts after apply and its mounts, and
/// stops before the shutdown write-back.
pub fn consumer_dropin(cx: &Context, consumer: &str) -> String {
    let mut u = cx.header();
    u.push_str("[Unit]\n");
    u.push_str(&format!("Wants={APPLY_UNIT} {DOWN_UNIT}\n"));
    u.push_str(&format!("After={APPLY_UNIT} {DOWN_UNIT}\n"));
    for m in cx
        .spec
        .mounts
        .iter()
        .filter(|m| m.before.iter().any(|b| b == consumer))
    {
        u.push_str(&format!(
            "RequiresMountsFor={}\n",
            unit_value(&m.path.to_string_lossy())
        ));
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{AgentSettings, Spec};

    #[test]
    fn dollars_are_doubled_in_arguments_only() {
        let spec = Spec {
            file: "/x.yaml".into(),
            max_total: 1,
            mounts: vec![],
            agent: AgentSettings::default(),
        };
        let cx = super::super::context(
            &spec,
            "/etc/$a %b.yaml".into(),
            "/opt/$x%y/tmpfsctl".into(),
            "15min".into(),
        )
        .unwrap();
        assert_eq!(
            exec(&cx, "apply"),
            "/opt/$x%%y/tmpfsctl apply \"/etc/$$a %%b.yaml\""
        );
    }
}
