//! sysv mode: an LSB init script for systems without systemd.

use super::escape::shell_word;
use super::Context;

pub const SCRIPT: &str = "etc/init.d/tmpfsctl";

pub fn script(cx: &Context) -> String {
    // LSB orders scripts, which correspond to services only.
    let lsb: Vec<String> = cx
        .consumers()
        .iter()
        .filter_map(|c| c.strip_suffix(".service"))
        .map(str::to_string)
        .collect();
    let lsb = lsb.join(" ");
    let header = cx.header();
    format!(
        r#"#!/bin/sh
{header}### BEGIN INIT INFO
# Provides:          tmpfsctl
# Required-Start:    $local_fs
# Required-Stop:     $local_fs
# X-Start-Before:    {lsb}
# X-Stop-After:      {lsb}
# Default-Start:     S
# Default-Stop:      0 6
# Short-Description: Put application cache directories into tmpfs
# Description:       Applies the tmpfsctl spec at boot (mount, seed) and takes
#                    the mounts down at shutdown (write-back, unmount).
### END INIT INFO

BIN={bin}
SPEC={spec}

[ -x "$BIN" ] || exit 0
[ -r "$SPEC" ] || exit 0

case "$1" in
    start|reload|force-reload)
        "$BIN" apply "$SPEC"
        rc=$?
        # 3: a mount is degraded and its application runs on disk; boot goes on.
        [ "$rc" -eq 3 ] && exit 0
        exit "$rc"
        ;;
    stop)
        exec "$BIN" down "$SPEC"
        ;;
    restart)
        "$BIN" down "$SPEC" || exit 1
        exec "$0" start
        ;;
    status)
        "$BIN" status "$SPEC" || exit 4
        # LSB: 0 when every mount is offloaded, 3 when any is not.
        if "$BIN" status --format json "$SPEC" |
            grep -Eq '"state": "(absent|degraded|fallback|foreign)"'; then
            exit 3
        fi
        exit 0
        ;;
    *)
        echo "Usage: $0 {{start|stop|restart|reload|force-reload|status}}" >&2
        exit 3
        ;;
esac
"#,
        bin = shell_word(&cx.binary.to_string_lossy()),
        spec = shell_word(&cx.spec_path.to_string_lossy()),
    )
}
