#!/usr/bin/env bash
# A real boot: systemd as PID 1 in systemd-nspawn (the host's own /usr on a
# volatile root), with tmpfsctl's units from `boot install`. Proves ordering,
# seeding, shutdown write-back and fstab mode. Prints TAP.
#
# Usage: tests/boot-nspawn.sh [TMPFSCTL_BINARY]   (as root; needs systemd-container)
set -uo pipefail
if [ "${TMPFSCTL_NSPAWN_INNER:-}" != 1 ]; then
    # Private mount namespace: nothing the test mounts can reach the host.
    exec env TMPFSCTL_NSPAWN_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
cd "$(dirname "$0")/.."
BIN=${1:-target/debug/tmpfsctl}
[ -x "$BIN" ] || { echo "Bail out! no tmpfsctl binary at $BIN (cargo build first)"; exit 1; }
command -v systemd-nspawn >/dev/null || { echo "Bail out! systemd-nspawn missing (apt-get install systemd-container)"; exit 1; }

# Under /var/tmp (not /tmp, where the container mounts a tmpfs): the disk
# directory is bound at the same path inside, so the spec is valid on both.
W=$(mktemp -d /var/tmp/tmpfsctl-boot-XXXXXX)
trap 'rm -rf "$W"' EXIT
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() {
    n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"
    if [ -n "${2:-}" ]; then sed 's/^/#   /' <<<"$2"; fi
}
check() { if eval "$2"; then ok "$1"; else not_ok "$1" "${3:-}"; block_failed=1; fi; }
# After a failed check in a boot: the container's journal, once.
journal() {
    if [ "${block_failed:-0}" = 1 ]; then
        echo "# --- container journal (last 60 lines of $1)"
        sed 's/\x1b\[[0-9;]*m//g' "$1" | tail -n 60 | sed 's/^/# /'
    fi
    block_failed=0
}

# A write-back is claimed only for a file that lived in RAM: the cache was
# our tmpfs while the container ran, and the disk directory under it (seen
# through the side bind) did not have the file then. Without that, a boot
# that never mounted would pass: the consumer writes straight to the disk.
written_back() {
    grep -q "^tmpfs  *tmpfsctl-cache " "$W/disk/report.mount" 2>/dev/null &&
        [ "$(cat "$W/disk/report.lower" 2>/dev/null)" = sub ] &&
        [ "$(cat "$W/disk/cache/from-boot" 2>/dev/null)" = written-during-boot ]
}
written_back_evidence() {
    for f in report.mount report.lower cache/from-boot; do
        echo "$f: $(cat "$W/disk/$f" 2>&1)"
    done
}

# The disk the container keeps across its poweroff, and the cache in it.
mkdir -p "$W/disk/cache/sub" "$W/opt"
echo seeded > "$W/disk/cache/sub/from-disk"
chown -R 1234:2345 "$W/disk/cache"
chmod 0750 "$W/disk/cache"
cp "$BIN" "$W/opt/tmpfsctl"
echo 0123456789abcdef0123456789abcdef > "$W/machine-id"
cat > "$W/cache.yaml" <<'YAML'
version: 1
mounts:
  - name: cache
    path: @DISK@/cache
    size: 16MiB
    persist: on-stop
    before: [consumer.service]
YAML
sed -i "s|@DISK@|$W/disk|" "$W/cache.yaml"

boot() { # boot ROOT_WITH_ETC LOG: boots, runs the checker, powers off
    timeout 120 systemd-nspawn --quiet --boot --directory=/ --volatile=yes --register=no --keep-unit \
        --machine=tmpfsctl-boot-test \
        --bind-ro="$W/machine-id:/etc/machine-id" \
        --bind-ro="$1/etc/systemd/system:/etc/systemd/system" \
        --bind-ro="$W/cache.yaml:/etc/tmpfsctl/cache.yaml" \
        --bind-ro="$W/opt:/opt/tmpfsctl" \
        --bind="$W/disk:$W/disk" \
        "${@:3}" > "$2" 2>&1
}

# --- systemd mode ---------------------------------------------------------
R=$W/systemd-root
# boot install --root checks the spec in the root: the image has the disk
# directory too.
mkdir -p "$R$W/disk/cache"
"$BIN" boot install "$W/cache.yaml" --root "$R" --binary /opt/tmpfsctl/tmpfsctl \
    --spec-path /etc/tmpfsctl/cache.yaml > "$W/install.log" 2>&1
rc=$?
check "boot install (systemd mode)" '[ $rc -eq 0 ]' "$(cat "$W/install.log")"
U=$R/etc/systemd/system
cat > "$U/consumer.service" <<'UNIT'
[Unit]
Description=An application using the cache
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'findmnt -n -o FSTYPE @D@/cache > @D@/consumer-saw; echo written-during-boot > @D@/cache/from-boot'
[Install]
WantedBy=multi-user.target
UNIT
cat > "$U/checker.service" <<'UNIT'
[Unit]
Description=Collect what the test asserts, then power off
After=multi-user.target consumer.service
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'o=@D@/report; findmnt -n -o FSTYPE,SOURCE,SIZE @D@/cache > $o.mount; stat -c "%%u:%%g %%a" @D@/cache > $o.root; cat @D@/cache/sub/from-disk > $o.seeded; for u in tmpfsctl-apply consumer; do systemctl show -P ExecMainExitTimestampMonotonic -P ExecMainStartTimestampMonotonic $u > $o.$u; done; ls -A /run/tmpfsctl/lower/cache > $o.lower; systemctl is-active tmpfsctl-apply > $o.active; systemctl is-active tmpfsctl-agent > $o.agent; systemctl is-active tmpfsctl-down > $o.down; systemctl show -P After tmpfsctl-down > $o.down-after; systemctl --no-pager --failed --plain > $o.failed; systemctl poweroff'
[Install]
WantedBy=multi-user.target
UNIT
sed -i "s|@D@|$W/disk|g" "$U/consumer.service" "$U/checker.service"
mkdir -p "$U/multi-user.target.wants"
ln -sf ../consumer.service "$U/multi-user.target.wants/consumer.service"
ln -sf ../checker.service "$U/multi-user.target.wants/checker.service"

boot "$R" "$W/console-systemd.log" systemd.journald.forward_to_console=1
rc=$?
check "container booted and powered off cleanly" '[ $rc -eq 0 ]' 
check "managed path is our tmpfs, 16MiB" 'grep -q "^tmpfs  *tmpfsctl-cache  *16M" "$W/disk/report.mount"' "$(cat "$W/disk/report.mount" 2>&1)"
check "tmpfs root has the disk directory's owner and mode" '[ "$(cat "$W/disk/report.root" 2>/dev/null)" = "1234:2345 750" ]' "$(cat "$W/disk/report.root" 2>&1)"
check "tmpfs was seeded from the disk directory" '[ "$(cat "$W/disk/report.seeded" 2>/dev/null)" = seeded ]'
check "apply unit is active" '[ "$(cat "$W/disk/report.active" 2>/dev/null)" = active ]'
check "agent is active" '[ "$(cat "$W/disk/report.agent" 2>/dev/null)" = active ]'
check "shutdown unit is active" '[ "$(cat "$W/disk/report.down" 2>/dev/null)" = active ]'
# `systemctl show` quotes names with backslashes and doubles them.
cache_unit=$(systemd-escape --path "$W/disk/cache" | sed 's/\\/\\\\/g').mount
check "shutdown unit is ordered after the tmpfs and side-bind mount units" \
    'grep -qF "$cache_unit" "$W/disk/report.down-after" && grep -qF run-tmpfsctl-lower-cache.mount "$W/disk/report.down-after"' \
    "$(cat "$W/disk/report.down-after" 2>&1)"

apply_done=$(sed -n 1p "$W/disk/report.tmpfsctl-apply" 2>/dev/null)
consumer_start=$(sed -n 2p "$W/disk/report.consumer" 2>/dev/null)
check "consumer started after apply finished ($apply_done < $consumer_start)" \
    '[ -n "$apply_done" ] && [ -n "$consumer_start" ] && [ "$apply_done" -lt "$consumer_start" ]'
check "consumer saw the tmpfs" '[ "$(cat "$W/disk/consumer-saw" 2>/dev/null)" = tmpfs ]'
check "data written during the boot into the tmpfs reached the disk at poweroff" written_back "$(written_back_evidence)"
# systemd-machine-id-commit fails by design with a bound machine-id.
check "no failed units" '[ -f "$W/disk/report.failed" ] && ! grep -v machine-id-commit "$W/disk/report.failed" | grep -q "\.service\|\.mount"' "$(cat "$W/disk/report.failed" 2>&1)"
journal "$W/console-systemd.log"

# --- a failed apply does not cancel the shutdown write-back ----------------
rm -f "$W/disk/report."* "$W/disk/consumer-saw" "$W/disk/cache/from-boot"
mkdir -p "$W/disk/big"
head -c 8M /dev/zero > "$W/disk/big/too-big"
cp "$W/cache.yaml" "$W/cache.yaml.good"
cat >> "$W/cache.yaml" <<YAML
  - name: big
    path: $W/disk/big
    size: 4MiB
    on_failure: fail
YAML
mkdir -p "$R$W/disk/big"
"$BIN" boot install "$W/cache.yaml" --root "$R" --binary /opt/tmpfsctl/tmpfsctl \
    --spec-path /etc/tmpfsctl/cache.yaml > "$W/install.log" 2>&1
boot "$R" "$W/console-failed.log" systemd.journald.forward_to_console=1
rc=$?
check "container with a failing apply booted" '[ $rc -eq 0 ]'
check "apply failed as the spec asks (on_failure: fail)" '[ "$(cat "$W/disk/report.active" 2>/dev/null)" = failed ]' "$(cat "$W/disk/report.active" 2>&1)"
check "the mount that succeeded was still written back at poweroff" written_back "$(written_back_evidence)"
journal "$W/console-failed.log"
cp "$W/cache.yaml.good" "$W/cache.yaml"

# --- fstab mode -----------------------------------------------------------
# mount(8) hands the lines to /sbin/mount.tmpfsctl, which `boot install`
# links to the binary; an overlay adds it to the host's /usr/sbin inside.
rm -f "$W/disk/report."* "$W/disk/consumer-saw"
F=$W/fstab-root
mkdir -p "$F/etc/systemd/system/multi-user.target.wants" "$F$W/disk/cache"
"$BIN" boot install "$W/cache.yaml" --mode fstab --root "$F" --binary /opt/tmpfsctl/tmpfsctl > "$W/install-fstab.log" 2>&1
rc=$?
check "boot install (fstab mode)" '[ $rc -eq 0 ] && grep -q "^tmpfsctl-cache $W/disk/cache tmpfsctl " "$F/etc/fstab" && [ "$(readlink "$F/sbin/mount.tmpfsctl")" = /opt/tmpfsctl/tmpfsctl ]' "$(cat "$W/install-fstab.log" "$F/etc/fstab" 2>&1)"
# After the install: the boot, not the install, reads the owner and mode.
chown 1111:2222 "$W/disk/cache"
chmod 0770 "$W/disk/cache"
cp "$U/checker.service" "$F/etc/systemd/system/"
ln -sf ../checker.service "$F/etc/systemd/system/multi-user.target.wants/checker.service"
boot "$F" "$W/console-fstab.log" --bind-ro="$F/etc/fstab:/etc/fstab" --overlay-ro="/usr/sbin:$F/sbin:/usr/sbin"
rc=$?
check "fstab mode: container booted" '[ $rc -eq 0 ]'
check "fstab mode: path is a 16MiB tmpfs at boot" 'grep -q "^tmpfs  *tmpfsctl-cache  *16M" "$W/disk/report.mount"' "$(cat "$W/disk/report.mount" 2>&1)"
check "fstab mode: tmpfs root has the owner and mode the directory had at boot" '[ "$(cat "$W/disk/report.root" 2>/dev/null)" = "1111:2222 770" ]' "$(cat "$W/disk/report.root" 2>&1)"
check "fstab mode: no failed units" '[ -f "$W/disk/report.failed" ] && ! grep -v machine-id-commit "$W/disk/report.failed" | grep -q "\.service\|\.mount"' "$(cat "$W/disk/report.failed" 2>&1)"
journal "$W/console-fstab.log"

echo "1..$n"
echo "# $((n - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
