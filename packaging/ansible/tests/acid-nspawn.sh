#!/usr/bin/env bash
# The acid test of the Ansible collection (TAP): the role runs inside a
# container with systemd as PID 1 (systemd-nspawn on the host's /usr, as
# tests/boot-nspawn.sh), with `boot: systemd`; the container is rebooted; the
# mount is there after the boot, the consumer started after it, and the data
# written into RAM before the reboot survived.
#
#   ANSIBLE_VENV=... packaging/ansible/tests/acid-nspawn.sh TMPFSCTL_BINARY
#
# As root; needs systemd-container. The venv must be made from a python
# under /usr (the container sees the host's /usr only).
set -uo pipefail
if [ "${TMPFSCTL_ACID_INNER:-}" != 1 ]; then
    exec env TMPFSCTL_ACID_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
collections=$(cd "$here/.." && pwd)
BIN=${1:?usage: acid-nspawn.sh TMPFSCTL_BINARY}
VENV=${ANSIBLE_VENV:?set ANSIBLE_VENV}
VENV=$(cd "$VENV" && pwd)
echo "TAP version 13"
# Under CI a skip would pass without anything having been checked.
skip() {
    if [ -n "${CI:-}" ]; then echo "Bail out! $1 (required when CI is set)"; exit 1; fi
    echo "1..0 # SKIP $1"; exit 0
}
command -v systemd-nspawn >/dev/null || skip "systemd-nspawn missing (apt-get install systemd-container)"
case $(readlink -f "$VENV/bin/python3") in
    /usr/*) ;;
    *) skip "the venv's python is not under /usr (make the venv with /usr/bin/python3)" ;;
esac

W=$(mktemp -d /var/tmp/tmpfsctl-acid-XXXXXX)
chmod 0755 "$W"
[ -n "${TMPFSCTL_ACID_KEEP:-}" ] || trap 'rm -rf "$W"' EXIT   # TMPFSCTL_ACID_KEEP=1 keeps logs
D=$W/disk C=$W/ctl U=$W/etc-systemd E=$W/etc-tmpfsctl
mkdir -p "$D/cache" "$C" "$U/multi-user.target.wants" "$E" "$W/opt"
echo seeded > "$D/cache/from-disk"
cp "$BIN" "$W/opt/tmpfsctl"
echo 0123456789abcdef0123456789abcdef > "$W/machine-id"
printf '{"tmpfsctl_test_disk": "%s", "ansible_python_interpreter": "%s"}\n' "$D" "$VENV/bin/python3" > "$C/vars.json"
# The third run adds a watchdog: the module starts the agent, and the
# handler sends it SIGHUP for the changed spec.
printf '{"tmpfsctl_mounts": [{"name": "cache", "path": "%s/cache", "size": "16MiB", "persist": "on-stop", "before": ["consumer.service"], "watchdog": {"high": "90%%", "action": "fallback"}}]}\n' "$D" > "$C/vars3.json"

n=0 fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; [ -n "${2:-}" ] && sed 's/^/#   /' <<<"$2"; }
check() { if eval "$2"; then ok "$1"; else not_ok "$1" "${3:-}"; fi; }

cat > "$U/consumer.service" <<'UNIT'
[Unit]
Description=An application using the cache
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'findmnt -n -o FSTYPE @D@/cache > @C@/consumer-saw'
[Install]
WantedBy=multi-user.target
UNIT
cat > "$U/ansible-run.service" <<'UNIT'
[Unit]
Description=Run the tmpfsctl role twice, write into the cache, power off
After=multi-user.target consumer.service
[Service]
Type=oneshot
Environment=HOME=/root LANG=C.UTF-8 LC_ALL=C.UTF-8 ANSIBLE_COLLECTIONS_PATH=@COLL@ ANSIBLE_HOME=/var/tmp/ah ANSIBLE_LOCAL_TEMP=/var/tmp/al ANSIBLE_REMOTE_TEMP=/var/tmp/ar ANSIBLE_NOCOLOR=1 ANSIBLE_RETRY_FILES_ENABLED=0
ExecStart=/bin/sh -c 'for i in 1 2; do @VENV@/bin/ansible-playbook -i localhost, -c local @COLL@/tests/acid.yml -e @@C@/vars.json > @C@/ansible$$i.log 2>&1; echo $$? > @C@/ansible$$i.rc; done; findmnt -n -o FSTYPE,SOURCE @D@/cache > @C@/mount1; @VENV@/bin/ansible-playbook -i localhost, -c local @COLL@/tests/acid.yml -e @@C@/vars.json -e @@C@/vars3.json > @C@/ansible3.log 2>&1; echo $$? > @C@/ansible3.rc; sleep 1; systemctl is-active tmpfsctl-agent > @C@/agent1; journalctl --no-pager -u tmpfsctl-agent > @C@/agent-journal 2>&1; systemctl is-active tmpfsctl-down > @C@/down1; echo written-before-reboot > @D@/cache/before-reboot; systemctl poweroff'
UNIT
cat > "$U/checker.service" <<'UNIT'
[Unit]
Description=Collect what the test asserts, take everything down with the role (state absent), power off
After=multi-user.target consumer.service
[Service]
Type=oneshot
Environment=HOME=/root LANG=C.UTF-8 LC_ALL=C.UTF-8 ANSIBLE_COLLECTIONS_PATH=@COLL@ ANSIBLE_HOME=/var/tmp/ah ANSIBLE_LOCAL_TEMP=/var/tmp/al ANSIBLE_REMOTE_TEMP=/var/tmp/ar ANSIBLE_NOCOLOR=1 ANSIBLE_RETRY_FILES_ENABLED=0
ExecStart=/bin/sh -c 'findmnt -n -o FSTYPE,SOURCE,SIZE @D@/cache > @C@/mount2; cat @D@/cache/before-reboot > @C@/data2; for u in tmpfsctl-apply consumer; do systemctl show -P ExecMainExitTimestampMonotonic -P ExecMainStartTimestampMonotonic $$u > @C@/$$u; done; systemctl is-active tmpfsctl-agent > @C@/agent2; echo written-after-reboot > @D@/cache/after-reboot; @VENV@/bin/ansible-playbook -i localhost, -c local @COLL@/tests/acid.yml -e @@C@/vars.json -e tmpfsctl_state=absent > @C@/absent.log 2>&1; echo $$? > @C@/absent.rc; findmnt -rn -t tmpfs -o SOURCE > @C@/mount3; for u in tmpfsctl-apply tmpfsctl-down tmpfsctl-agent; do systemctl is-active $$u; done > @C@/units3; systemctl poweroff'
UNIT
sed -i -e "s|@D@|$D|g" -e "s|@C@|$C|g" -e "s|@COLL@|$collections|g" -e "s|@VENV@|$VENV|g" \
    "$U/consumer.service" "$U/ansible-run.service" "$U/checker.service"
ln -sf ../consumer.service "$U/multi-user.target.wants/consumer.service"
ln -sf ../ansible-run.service "$U/multi-user.target.wants/ansible-run.service"

boot() { # boot LOG
    timeout 300 systemd-nspawn --quiet --boot --directory=/ --volatile=yes --register=no --keep-unit \
        --machine=tmpfsctl-acid-test \
        --bind-ro="$W/machine-id:/etc/machine-id" \
        --bind="$U:/etc/systemd/system" \
        --bind="$E:/etc/tmpfsctl" \
        --bind-ro="$W/opt:/opt/tmpfsctl" \
        --bind="$D:$D" --bind="$C:$C" \
        --bind-ro="$collections:$collections" \
        --bind-ro="$VENV:$VENV" \
        systemd.journald.forward_to_console=1 > "$1" 2>&1
}
tail_of() { sed 's/\x1b\[[0-9;]*m//g' "$1" 2>/dev/null | tail -n 40; }

# --- first boot: the role runs (twice), data is written into RAM ----------
boot "$W/console1.log"
rc=$?
check "first boot: the container booted and powered off" '[ $rc -eq 0 ]' "$(tail_of "$W/console1.log")"
check "the role succeeded" '[ "$(cat "$C/ansible1.rc" 2>/dev/null)" = 0 ]' "$(tail_of "$C/ansible1.log")"
check "the first run reported changed" 'grep -Eq "changed=[1-9]" "$C/ansible1.log"' "$(tail_of "$C/ansible1.log")"
check "the second run reported changed=0" 'grep -q "changed=0" "$C/ansible2.log" && [ "$(cat "$C/ansible2.rc" 2>/dev/null)" = 0 ]' "$(tail_of "$C/ansible2.log")"
check "the cache was our tmpfs right after the role" 'grep -q "^tmpfs  *tmpfsctl-cache" "$C/mount1"' "$(cat "$C/mount1" 2>&1)"
check "the shutdown unit was active before the reboot" '[ "$(cat "$C/down1" 2>/dev/null)" = active ]' "$(cat "$C/down1" 2>&1)"
check "a changed spec with a watchdog: the role succeeded" '[ "$(cat "$C/ansible3.rc" 2>/dev/null)" = 0 ] && grep -Eq "changed=[1-9]" "$C/ansible3.log"' "$(tail_of "$C/ansible3.log")"
check "the module started the agent" '[ "$(cat "$C/agent1" 2>/dev/null)" = active ]' "$(cat "$C/agent1" 2>&1)"
check "the handler reloaded the agent with SIGHUP" 'grep -q "reloaded .*(SIGHUP)" "$C/agent-journal"' "$(grep -A3 RUNNING "$C/ansible3.log"; tail -n 20 "$C/agent-journal")"
check "the boot units are installed" '[ -f "$U/tmpfsctl-apply.service" ] && [ -L "$U/multi-user.target.wants/tmpfsctl-apply.service" ] && [ -f "$U/consumer.service.d/50-tmpfsctl.conf" ]'
check "the data written into RAM was written back at poweroff" '[ "$(cat "$D/cache/before-reboot" 2>/dev/null)" = written-before-reboot ]'

# --- the reboot -------------------------------------------------------------
rm -f "$U/multi-user.target.wants/ansible-run.service" "$C/consumer-saw"
ln -sf ../checker.service "$U/multi-user.target.wants/checker.service"
boot "$W/console2.log"
rc=$?
check "after the reboot: the container booted and powered off" '[ $rc -eq 0 ]' "$(tail_of "$W/console2.log")"
check "the mount is there after the boot, 16MiB" 'grep -q "^tmpfs  *tmpfsctl-cache  *16M" "$C/mount2"' "$(cat "$C/mount2" 2>&1; tail_of "$W/console2.log")"
check "the data written before the reboot is in the tmpfs" '[ "$(cat "$C/data2" 2>/dev/null)" = written-before-reboot ]'
apply_done=$(sed -n 1p "$C/tmpfsctl-apply" 2>/dev/null)
consumer_start=$(sed -n 2p "$C/consumer" 2>/dev/null)
check "the consumer started after apply finished ($apply_done < $consumer_start)" \
    '[ -n "$apply_done" ] && [ -n "$consumer_start" ] && [ "$apply_done" -lt "$consumer_start" ]'
check "the consumer saw the tmpfs" '[ "$(cat "$C/consumer-saw" 2>/dev/null)" = tmpfs ]'
check "the data is still on disk after the second poweroff" '[ "$(cat "$D/cache/before-reboot" 2>/dev/null)" = written-before-reboot ]'

check "the agent was active after the reboot" '[ "$(cat "$C/agent2" 2>/dev/null)" = active ]' "$(cat "$C/agent2" 2>&1)"

# --- state: absent, on the running systemd host -----------------------------
check "state: absent succeeded and reported changed" '[ "$(cat "$C/absent.rc" 2>/dev/null)" = 0 ] && grep -Eq "changed=[1-9]" "$C/absent.log"' "$(tail_of "$C/absent.log")"
check "no tmpfsctl tmpfs was left mounted" '[ -f "$C/mount3" ] && ! grep -q "^tmpfsctl-" "$C/mount3"' "$(cat "$C/mount3" 2>&1)"
check "the apply, down and agent units were stopped" '[ "$(cat "$C/units3" 2>/dev/null | sort -u)" = inactive ]' "$(cat "$C/units3" 2>&1)"
check "the boot units, drop-in and manifest are removed" '! ls "$U" | grep -q "^tmpfsctl-" && [ ! -e "$U/consumer.service.d/50-tmpfsctl.conf" ] && [ ! -e "$E/boot.manifest" ]' "$(ls -R "$U" "$E")"
check "the spec file is removed" '[ ! -e "$E/cache.yaml" ]'
check "the data written into RAM after the reboot is on disk" '[ "$(cat "$D/cache/after-reboot" 2>/dev/null)" = written-after-reboot ]'

echo "1..$n"
echo "# $((n - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
