//! systemd mode: the apply unit rendered for a spec, and drop-ins that order
//! each consumer after it. Pure functions; golden-tested.

use std::path::Path;

use super::escape::{exec_arg, mount_unit, unit_value};
use super::Context;

pub const APPLY_UNIT: &str = "tmpfsctl-apply.service";

/// The apply unit for `cx`. It starts early (before sysinit.target, after the
/// local filesystems), before every consumer; at shutdown it stops, writing
/// persisted mounts back, before systemd unmounts the tmpfs or the side bind.
pub fn apply_unit(cx: &Context) -> String {
    let bin = exec_arg(&cx.binary.to_string_lossy());
    let spec = exec_arg(&cx.spec_path.to_string_lossy());
    let mut u = String::new();
    u.push_str(&cx.header());
    u.push_str("[Unit]\n");
    u.push_str("Description=Put application cache directories into tmpfs (tmpfsctl)\n");
    u.push_str("Documentation=file:/usr/share/doc/tmpfsctl/README.md\n");
    u.push_str("DefaultDependencies=no\n");
    u.push_str("After=local-fs.target systemd-tmpfiles-setup.service\n");
    u.push_str("Before=sysinit.target shutdown.target\n");
    u.push_str("Conflicts=shutdown.target\n");
    for m in &cx.spec.mounts {
        let parent = m.path.parent().unwrap_or(Path::new("/"));
        u.push_str(&format!(
            "RequiresMountsFor={}\n",
            unit_value(&parent.to_string_lossy())
        ));
        // Ordered after the mount units systemd creates for the tmpfs and the
        // side bind, so at shutdown this unit (write-back, unmount) stops first.
        // Escaped unit names contain no whitespace or `%`: written as they are.
        u.push_str(&format!(
            "After={} {}\n",
            mount_unit(&m.path),
            mount_unit(&cx.state.lower(&m.name))
        ));
    }
    let consumers = cx.consumers();
    if !consumers.is_empty() {
        u.push_str(&format!("Before={}\n", consumers.join(" ")));
    }
    u.push_str("\n[Service]\n");
    u.push_str("Type=oneshot\n");
    u.push_str("RemainAfterExit=yes\n");
    u.push_str(&format!("ExecStart={bin} apply {spec}\n"));
    u.push_str("# 3: a mount is degraded; its application runs on the disk directory and\n");
    u.push_str("# boot goes on. The reason is in the journal and in `tmpfsctl status`.\n");
    u.push_str("SuccessExitStatus=3\n");
    u.push_str(&format!("ExecStop={bin} down {spec}\n"));
    u.push_str(&format!("TimeoutStartSec={}\n", cx.timeout));
    u.push_str(&format!("TimeoutStopSec={}\n", cx.timeout));
    u.push_str("\n[Install]\n");
    u.push_str("WantedBy=sysinit.target\n");
    u
}

/// The drop-in for one consumer: it waits for apply and for its mounts.
pub fn consumer_dropin(cx: &Context, consumer: &str) -> String {
    let mut u = cx.header();
    u.push_str("[Unit]\n");
    u.push_str(&format!("Wants={APPLY_UNIT}\n"));
    u.push_str(&format!("After={APPLY_UNIT}\n"));
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
