#!/usr/bin/env bash
# Builds the .deb and the .rpm from the release binary and checks them:
# every expected path in both (and the same set in both), lintian with no
# errors, the example conffile valid and mounting nothing, and the .deb
# installed into a container (systemd-nspawn: the host's /usr under a tmpfs overlay,
# a copy of its dpkg database, in a private mount namespace: the host is not
# touched): `tmpfsctl --version` from /usr/bin, `systemd-analyze verify`
# of the installed units. Prints TAP.
#
# Usage: packaging/test-packages.sh   (as root, after `cargo build --release`;
# needs cargo-deb, cargo-generate-rpm, lintian, rpm, cpio, systemd-container)
set -uo pipefail
if [ "${TMPFSCTL_PKG_INNER:-}" != 1 ]; then
    exec env TMPFSCTL_PKG_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
bin=$target/release/tmpfsctl
[ -x "$bin" ] || { echo "Bail out! no release binary at $bin (cargo build --release first)"; exit 1; }
W=$(mktemp -d /var/tmp/tmpfsctl-pkg-XXXXXX)
trap 'rm -rf "$W"' EXIT
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() {
    n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"
    if [ -n "${2:-}" ]; then sed 's/^/#   /' <<<"$2"; fi
}
check() { if eval "$2"; then ok "$1"; else not_ok "$1" "${3:-}"; fi; }

# What both packages must hold (directories aside).
expected=$(sort <<'EOF_LIST'
/usr/bin/tmpfsctl
/usr/sbin/mount.tmpfsctl
/usr/lib/systemd/system/tmpfsctl-apply.service
/usr/lib/systemd/system/tmpfsctl-down.service
/usr/lib/systemd/system/tmpfsctl-agent.service
/usr/share/man/man8/tmpfsctl.8.gz
/usr/share/man/man8/mount.tmpfsctl.8.gz
/usr/share/bash-completion/completions/tmpfsctl
/usr/share/zsh/vendor-completions/_tmpfsctl
/usr/share/fish/vendor_completions.d/tmpfsctl.fish
/etc/tmpfsctl/cache.yaml
/usr/share/doc/tmpfsctl/README.md
/usr/share/doc/tmpfsctl/agent.md
/usr/share/doc/tmpfsctl/boot.md
/usr/share/doc/tmpfsctl/examples/cache.yaml
/usr/share/doc/tmpfsctl/prometheus/tmpfsctl.rules.yml
/usr/share/tmpfsctl/tmpfsctl.schema.json
EOF_LIST
)
# Files of the repository that the packages must carry whole.
for f in docs/*.md; do expected+=$'\n'"/usr/share/doc/tmpfsctl/${f#docs/}"; done
for f in examples/*.yaml; do expected+=$'\n'"/usr/share/doc/tmpfsctl/examples/${f#examples/}"; done
expected=$(sort -u <<<"$expected")

# --- the example spec -------------------------------------------------------
# Validated as root needs a root-owned copy (a checkout may be someone else's).
install -m 0644 -o root -g root packaging/etc/cache.yaml "$W/cache.yaml"
out=$("$bin" validate "$W/cache.yaml" 2>&1); rc=$?
check "packaged /etc/tmpfsctl/cache.yaml validates" '[ $rc -eq 0 ]' "$out"
out=$("$bin" plan "$W/cache.yaml" --format json 2>&1); rc=$?
check "and plans nothing" '[ $rc -eq 0 ] && ! grep -q "\"name\"" <<<"$out"' "$out"

# --- .deb -------------------------------------------------------------------
packaging/gen-assets.sh "$bin" > "$W/gen.log" 2>&1
check "manual page and completions generated" '[ $? -eq 0 ]' "$(cat "$W/gen.log")"
cargo deb --no-build --locked --output "$W/deb" > "$W/deb.log" 2>&1
rc=$?
deb=$(ls "$W"/deb/tmpfsctl_*.deb 2>/dev/null | head -1)
check "cargo deb built a .deb" '[ $rc -eq 0 ] && [ -n "$deb" ]' "$(tail -20 "$W/deb.log")"
deb_files=$(dpkg-deb --contents "$deb" 2>/dev/null | awk '$1 !~ /^d/ {print $6}' | sed 's|^\./|/|' \
    | grep -v "^/usr/share/doc/tmpfsctl/\(copyright\|changelog\.Debian\.gz\)$\|^/usr/share/lintian/overrides/tmpfsctl$" | sort)
missing=$(comm -23 <(echo "$expected") <(echo "$deb_files"))
extra=$(comm -13 <(echo "$expected") <(echo "$deb_files"))
check "dpkg-deb --contents lists every expected path, and nothing else" '[ -z "$missing" ] && [ -z "$extra" ]' \
    "missing: $missing
extra: $extra"
contents=$(dpkg-deb --contents "$deb" 2>&1)
check ".deb has copyright, changelog and its lintian overrides" \
    'grep -q "/usr/share/doc/tmpfsctl/copyright$" <<<"$contents" && grep -q "/usr/share/doc/tmpfsctl/changelog.Debian.gz$" <<<"$contents" &&
     grep -q "/usr/share/lintian/overrides/tmpfsctl$" <<<"$contents"' "$contents"
check "/etc/tmpfsctl/cache.yaml is a conffile" \
    '[ "$(dpkg-deb --info "$deb" conffiles 2>/dev/null)" = /etc/tmpfsctl/cache.yaml ]' "$(dpkg-deb --info "$deb" conffiles 2>&1)"
check "the packaged schema is the binary's own (tmpfsctl schema)" \
    'dpkg-deb --fsys-tarfile "$deb" | tar -xOf - ./usr/share/tmpfsctl/tmpfsctl.schema.json | cmp -s - <("$bin" schema)'
check "the binary is stripped" 'dpkg-deb --fsys-tarfile "$deb" | tar -xOf - ./usr/bin/tmpfsctl > "$W/bin" && ! file "$W/bin" 2>/dev/null | grep -q "not stripped"'
lintian --fail-on error --info "$deb" > "$W/lintian.log" 2>&1
rc=$?
check "lintian: no errors" '[ $rc -eq 0 ] && ! grep -q "^E:" "$W/lintian.log"' "$(cat "$W/lintian.log")"
grep '^[EWI]:' "$W/lintian.log" | sed 's/^/# lintian: /' | head -40

# --- .rpm -------------------------------------------------------------------
mkdir -p "$W/rpm"
cargo generate-rpm --output "$W/rpm/" > "$W/rpm.log" 2>&1
rc=$?
rpmf=$(ls "$W"/rpm/tmpfsctl-*.rpm 2>/dev/null | head -1)
check "cargo generate-rpm built an .rpm" '[ $rc -eq 0 ] && [ -n "$rpmf" ]' "$(tail -20 "$W/rpm.log")"
rpm_files=$(rpm -qlp "$rpmf" 2>/dev/null | sort)
check "rpm -qlp lists the same set as the .deb" '[ -n "$rpm_files" ] && [ "$rpm_files" = "$deb_files" ]' \
    "$(diff <(echo "$deb_files") <(echo "$rpm_files"))"
rpm_bin_size=$(rpm -qp --queryformat '[%{FILENAMES} %{FILESIZES}\n]' "$rpmf" 2>/dev/null | sed -n 's|^/usr/bin/tmpfsctl ||p')
check "rpm: the binary is stripped" '[ "$rpm_bin_size" = "$(stat -c %s "$target/release/pkg/tmpfsctl")" ]' \
    "rpm has $rpm_bin_size bytes, the stripped binary $(stat -c %s "$target/release/pkg/tmpfsctl")"
# What the scriptlets do is checked in the booted container below; here, that
# they name no unit but the agent (an apply or down unit started by a package
# would offload or take down the mounts).
check "rpm: scriptlets reload systemd and touch only the agent's unit" \
    '[ "$(rpm -qp --qf "%{POSTIN}" "$rpmf")" = "if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null 2>&1 || :; fi" ] &&
     [ "$(rpm -qp --scripts "$rpmf" 2>/dev/null | grep -o "tmpfsctl-[a-z]*\.service" | sort -u)" = tmpfsctl-agent.service ]' \
    "$(rpm -qp --scripts "$rpmf" 2>&1)"
rpm -qp --qf '%{PREUN}' "$rpmf" > "$W/rpm-preun" 2>/dev/null
rpm -qp --qf '%{POSTUN}' "$rpmf" > "$W/rpm-postun" 2>/dev/null
check "rpm: /etc/tmpfsctl/cache.yaml is a config file" \
    '[ "$(rpm -qcp "$rpmf" 2>/dev/null)" = /etc/tmpfsctl/cache.yaml ]' "$(rpm -qcp "$rpmf" 2>&1)"
# The rpm's helper is a script (no symlinks in cargo-generate-rpm); the
# container below runs it against the .deb's binary.
(mkdir -p "$W/rpm-root" && cd "$W/rpm-root" && rpm2cpio "$rpmf" | cpio -idm --quiet ./usr/sbin/mount.tmpfsctl) 2>/dev/null
check "rpm: the mount helper is an executable script" '[ -x "$W/rpm-root/usr/sbin/mount.tmpfsctl" ]'

# --- the .deb installed in a container --------------------------------------
# Not booted (that would start the host's own units): a command container as
# in tests/boot-nspawn.sh (the host's /usr on a volatile root), with a tmpfs
# overlay on /usr and a copy of the host's dpkg database, so dpkg writes
# nothing on the host.
cp "$deb" "$W/tmpfsctl.deb"
timeout 300 systemd-nspawn --quiet --directory=/ --volatile=yes --overlay=/usr::/usr --register=no --keep-unit \
    --machine=tmpfsctl-pkg-test --bind-ro="$W/tmpfsctl.deb:/mnt/tmpfsctl.deb" \
    --bind-ro="$W/rpm-root/usr/sbin/mount.tmpfsctl:/mnt/rpm-mount-helper" \
    --bind-ro=/var/lib/dpkg:/mnt/host-dpkg --bind-ro=/etc/passwd --bind-ro=/etc/group --bind-ro=/etc/dpkg \
    --pipe /bin/sh -c '
        set -e
        mkdir -p /var/lib /etc/systemd/system
        cp -a /mnt/host-dpkg /var/lib/dpkg
        dpkg -r tmpfsctl >/dev/null 2>&1 || true
        dpkg -i /mnt/tmpfsctl.deb
        echo "which: $(command -v tmpfsctl)"
        echo "version: $(/usr/bin/tmpfsctl --version)"
        echo "validate: $(/usr/bin/tmpfsctl validate /etc/tmpfsctl/cache.yaml 2>&1 | tr "\n" " ")"
        systemd-analyze verify --man=no /usr/lib/systemd/system/tmpfsctl-apply.service \
            /usr/lib/systemd/system/tmpfsctl-down.service /usr/lib/systemd/system/tmpfsctl-agent.service
        echo "verify: ok"
        # An fstab line of type tmpfsctl goes through the packaged helper.
        mkdir -p /var/tmp/deb-helper /var/tmp/rpm-helper
        chown 12:34 /var/tmp/deb-helper /var/tmp/rpm-helper
        chmod 0710 /var/tmp/deb-helper /var/tmp/rpm-helper
        echo "helper link: $(readlink /usr/sbin/mount.tmpfsctl)"
        mount -t tmpfsctl -o size=1m,nosuid,x-systemd.before=a.service tmpfsctl-deb /var/tmp/deb-helper
        echo "deb helper: $(findmnt -n -o FSTYPE,SOURCE /var/tmp/deb-helper) $(stat -c "%u:%g %a" /var/tmp/deb-helper)"
        /mnt/rpm-mount-helper tmpfsctl-rpm /var/tmp/rpm-helper -o size=1m
        echo "rpm helper: $(findmnt -n -o FSTYPE,SOURCE /var/tmp/rpm-helper) $(stat -c "%u:%g %a" /var/tmp/rpm-helper)"
        umount /var/tmp/deb-helper /var/tmp/rpm-helper
        for u in tmpfsctl-apply tmpfsctl-down tmpfsctl-agent; do
            echo "enabled $u: $(systemctl is-enabled $u.service 2>&1 || true)"
        done
        dpkg -r tmpfsctl >/dev/null
        echo "removed: $([ -e /usr/bin/tmpfsctl ] && echo no || echo yes)"
    ' > "$W/container.log" 2>&1
rc=$?
log=$(cat "$W/container.log")
check "container: dpkg -i of the .deb" '[ $rc -eq 0 ]' "$log"
check "container: tmpfsctl --version runs from /usr/bin" \
    'grep -qx "which: /usr/bin/tmpfsctl" <<<"$log" && grep -qx "version: tmpfsctl $(sed -n "s/^version = \"\(.*\)\"/\1/p" Cargo.toml | head -1)" <<<"$log"' "$log"
check "container: the installed example validates" 'grep -q "^validate: .*valid, 0 mounts" <<<"$log"' "$log"
check "container: systemd-analyze verify of the installed units" 'grep -qx "verify: ok" <<<"$log"' "$log"
check "container: mount -t tmpfsctl runs the .deb's helper, which takes the directory's owner and mode" \
    'grep -qx "helper link: ../bin/tmpfsctl" <<<"$log" && grep -qx "deb helper: tmpfs  *tmpfsctl-deb 12:34 710" <<<"$log"' "$log"
check "container: the .rpm's helper script mounts the same way" 'grep -qx "rpm helper: tmpfs  *tmpfsctl-rpm 12:34 710" <<<"$log"' "$log"
check "container: no unit enabled by the package" \
    '[ "$(grep -c "^enabled .*: disabled$" <<<"$log")" = 3 ]' "$log"
check "container: dpkg -r removes the binary" 'grep -qx "removed: yes" <<<"$log"' "$log"

# --- upgrade and removal with systemd running (a booted container) ---------
# The agent runs the binary it was started with: an upgrade that did not
# restart it would leave the old one watching the mounts (and refusing the
# newer state the new commands write), a removal one whose binary is gone.
# Booted like tests/boot-nspawn.sh, with the host's /usr under a tmpfs overlay;
# a unit runs the steps and powers off.
mkdir -p "$W/units/multi-user.target.wants" "$W/report"
echo 0123456789abcdef0123456789abcdef > "$W/machine-id"
cat > "$W/upgrade-steps" <<'STEPS'
set -x
agent() { echo "$(systemctl is-active tmpfsctl-agent.service) $(systemctl show -P MainPID tmpfsctl-agent.service)"; }
mkdir -p /var/lib
cp -a /mnt/host-dpkg /var/lib/dpkg
dpkg -r tmpfsctl >/dev/null 2>&1 || true
dpkg -i /mnt/tmpfsctl.deb
echo "installed: $(agent)"
systemctl start tmpfsctl-agent.service
echo "started: $(agent)"
dpkg -i /mnt/tmpfsctl.deb
echo "deb upgraded: $(agent)"
sh /mnt/rpm-postun 1
echo "rpm upgraded: $(agent)"
sh /mnt/rpm-preun 0
echo "rpm erased: $(agent)"
systemctl start tmpfsctl-agent.service
echo "started again: $(agent)"
dpkg -r tmpfsctl
echo "deb removed: $(agent)"
STEPS
cat > "$W/units/upgrade-check.service" <<'UNIT'
[Unit]
Description=Install, upgrade and remove tmpfsctl with its agent running, then power off
After=multi-user.target
[Service]
Type=oneshot
StandardOutput=file:/mnt/report/steps.log
StandardError=inherit
ExecStart=/bin/sh /mnt/upgrade-steps
ExecStopPost=/bin/systemctl poweroff
UNIT
ln -sf ../upgrade-check.service "$W/units/multi-user.target.wants/upgrade-check.service"
timeout 180 systemd-nspawn --quiet --boot --directory=/ --volatile=yes --overlay=/usr::/usr --register=no --keep-unit \
    --machine=tmpfsctl-pkg-upgrade \
    --bind-ro="$W/machine-id:/etc/machine-id" \
    --bind-ro="$W/units:/etc/systemd/system" \
    --bind-ro="$W/tmpfsctl.deb:/mnt/tmpfsctl.deb" \
    --bind-ro="$W/rpm-preun:/mnt/rpm-preun" --bind-ro="$W/rpm-postun:/mnt/rpm-postun" \
    --bind-ro="$W/upgrade-steps:/mnt/upgrade-steps" \
    --bind-ro=/var/lib/dpkg:/mnt/host-dpkg --bind-ro=/etc/passwd --bind-ro=/etc/group --bind-ro=/etc/dpkg \
    --bind="$W/report:/mnt/report" > "$W/boot.log" 2>&1
rc=$?
steps=$(cat "$W/report/steps.log" 2>/dev/null)
log="$steps
--- console (last 40 lines)
$(tail -40 "$W/boot.log")"
pid_at() { sed -n "s/^$1: active \([0-9][0-9]*\)$/\1/p" <<<"$steps"; }
check "booted container: ran the steps and powered off" '[ $rc -eq 0 ] && grep -q "^deb removed: " <<<"$steps"' "$log"
check "booted container: installing starts no agent" 'grep -qx "installed: inactive 0" <<<"$steps"' "$log"
check "booted container: a .deb upgrade restarts the running agent" \
    '[ -n "$(pid_at started)" ] && [ -n "$(pid_at "deb upgraded")" ] && [ "$(pid_at started)" != "$(pid_at "deb upgraded")" ]' "$log"
check "booted container: an .rpm upgrade (the old package's %postun) restarts it" \
    '[ -n "$(pid_at "rpm upgraded")" ] && [ "$(pid_at "deb upgraded")" != "$(pid_at "rpm upgraded")" ]' "$log"
check "booted container: an .rpm erase (%preun) stops it" 'grep -qx "rpm erased: inactive 0" <<<"$steps"' "$log"
check "booted container: dpkg -r stops it" \
    '[ -n "$(pid_at "started again")" ] && grep -qx "deb removed: inactive 0" <<<"$steps"' "$log"

echo "1..$n"
echo "# $((n - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
