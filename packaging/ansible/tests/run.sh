#!/usr/bin/env bash
# Tests of the Ansible collection tmpfsctl.offload, run for real (TAP).
#
#   packaging/ansible/tests/run.sh TMPFSCTL_BINARY
#
# Needs root, and ansible-playbook and ansible-lint on PATH or in
# $ANSIBLE_VENV/bin (.ci/run makes that venv). Playbooks run with
# `-i localhost, -c local` inside a private mount namespace, on a throwaway
# cache directory and state directory, with `boot: none`: no unit, no host
# path and no host mount is touched. The collection is used from the tree.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
collections=$(cd "$here/.." && pwd)           # holds ansible_collections/
collection=$collections/ansible_collections/tmpfsctl/offload

if [ "${1:-}" != --inner ]; then
    bin=${1:?usage: run.sh TMPFSCTL_BINARY}
    bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
    [ "$(id -u)" = 0 ] || { echo "run.sh: needs root" >&2; exit 1; }
    before=$(findmnt -rn -t tmpfs -o TARGET,SOURCE | sort)
    # A root-owned directory in sticky /tmp: tmpfsctl trusts specs below it.
    tdir=$(mktemp -d /tmp/tmpfsctl-ansible.XXXXXX)
    chmod 0755 "$tdir"
    unshare --mount --propagation private bash "$0" --inner "$bin" "$tdir"
    rc=$?
    rm -rf "$tdir"
    after=$(findmnt -rn -t tmpfs -o TARGET,SOURCE | sort)
    if [ "$before" != "$after" ]; then
        echo "run.sh: the host's tmpfs mount table changed" >&2
        exit 1
    fi
    exit $rc
fi

bin=$2
tdir=$3
if [ -n "${ANSIBLE_VENV:-}" ]; then
    PATH=$ANSIBLE_VENV/bin:$PATH
fi
py=$(dirname "$(command -v ansible-playbook)")/python3
[ -x "$py" ] || py=python3

export ANSIBLE_COLLECTIONS_PATH=$collections
export ANSIBLE_HOME=$tdir/ansible-home
export ANSIBLE_LOCAL_TEMP=$tdir/ansible-tmp
export ANSIBLE_REMOTE_TEMP=$tdir/ansible-tmp
export ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 ANSIBLE_RETRY_FILES_ENABLED=0
export ANSIBLE_DEPRECATION_WARNINGS=0 ANSIBLE_STDOUT_CALLBACK=default
export ANSIBLE_COLLECTIONS_ON_ANSIBLE_VERSION_MISMATCH=ignore

app=$tdir/app/cache
spec=$tdir/etc/cache.yaml
mkdir -p "$app"
echo "cold data" > "$app/seed.txt"

n=0 pass=0 fail=0
ok() { n=$((n + 1)); pass=$((pass + 1)); echo "ok $n - $1"; }
not_ok() {
    n=$((n + 1)); fail=$((fail + 1)); echo "not ok $n - $1"
    [ -n "${2:-}" ] && sed 's/^/#   /' "$2" | tail -40
}
check() { # check DESCRIPTION LOG COMMAND...
    local d=$1 log=$2; shift 2
    if "$@"; then ok "$d"; else not_ok "$d" "$log"; fi
}

play() { # play LOG PLAYBOOK [ansible-playbook options...]
    local log=$1 book=$2; shift 2
    ansible-playbook -i localhost, -c local "$here/$book" \
        -e ansible_python_interpreter="$py" \
        -e tmpfsctl_test_dir="$tdir" -e tmpfsctl_test_binary="$bin" "$@" >"$log" 2>&1
}
changed() { grep -Eo 'changed=[0-9]+' "$1" | tail -1 | cut -d= -f2; }
mounted() { findmnt -rn -M "$app" -o FSTYPE,SOURCE | grep -qx 'tmpfs tmpfsctl-app'; }
table() { findmnt -rn -o TARGET,SOURCE,FSTYPE,OPTIONS | sort; }
size_is() { findmnt -rn -M "$app" -o OPTIONS | tr , '\n' | grep -qx "size=$1"; }

echo "TAP version 13"

# ansible-lint on the collection (offline: no Galaxy).
log=$tdir/lint.log
(cd "$collection" && ansible-lint --offline --nocolor >"$log" 2>&1)
check "ansible-lint on the collection is clean" "$log" test $? = 0

# 1. First run: the role writes the spec, applies it: changed.
log=$tdir/first.log
play "$log" role.yml
check "first run succeeds" "$log" test $? = 0
check "first run reports changed" "$log" test "$(changed "$log")" -ge 1
check "the cache directory is a tmpfsctl tmpfs" "$log" mounted
check "the tmpfs is seeded from disk" "$log" grep -qx "cold data" "$app/seed.txt"
check "the spec file is root-owned 0644" "$log" test "$(stat -c %u:%g:%a "$spec")" = 0:0:644
check "16MiB as the spec says" "$log" size_is 16384k

# 2. Second run: nothing to do.
log=$tdir/second.log
play "$log" role.yml
check "second run succeeds" "$log" test $? = 0
check "second run reports changed=0" "$log" test "$(changed "$log")" = 0

# Data the application writes into RAM (must survive `state: absent`).
echo "written in RAM" > "$app/hot.txt"

# 3. A spec change in check mode: changed reported, nothing touched.
table_before=$(table)
spec_before=$(sha256sum "$spec")
log=$tdir/check.log
play "$log" role.yml -e tmpfsctl_test_size=32MiB --check
check "--check with a changed spec succeeds" "$log" test $? = 0
check "--check reports changed" "$log" test "$(changed "$log")" -ge 1
check "--check leaves the mount table unchanged" "$log" test "$table_before" = "$(table)"
check "--check leaves the spec file unchanged" "$log" test "$spec_before" = "$(sha256sum "$spec")"

# 4. --diff shows the spec change and the plan.
log=$tdir/diff.log
play "$log" role.yml -e tmpfsctl_test_size=32MiB --check --diff
check "--check --diff succeeds" "$log" test $? = 0
check "--diff shows the spec file's change" "$log" \
    grep -Eq '^\+ +size: 32MiB' "$log"
check "--diff shows the old size removed" "$log" grep -Eq '^- +size: 16MiB' "$log"
check "--diff shows the plan (online remount)" "$log" grep -q 'remount .* online: size 16MiB -> 32MiB' "$log"
check "--check --diff changed nothing" "$log" test "$table_before" = "$(table)"

# 5. The change for real: an online remount that keeps the data.
log=$tdir/grow.log
play "$log" role.yml -e tmpfsctl_test_size=32MiB --diff
check "applying the changed spec succeeds" "$log" test $? = 0
check "it reports changed" "$log" test "$(changed "$log")" -ge 1
check "the tmpfs is 32MiB now" "$log" size_is 32768k
check "the data in RAM survived the remount" "$log" grep -qx "written in RAM" "$app/hot.txt"
log=$tdir/grow2.log
play "$log" role.yml -e tmpfsctl_test_size=32MiB
check "and once more: changed=0" "$log" test "$(changed "$log")" = 0

# 6. A bad spec fails the task with tmpfsctl's file:line message and
# changes nothing.
table_before=$(table)
spec_before=$(sha256sum "$spec")
log=$tdir/bad.log
play "$log" module.yml -e "{\"tmpfsctl_test_spec\": \"{\\\"version\\\": 1, \\\"mounts\\\": [{\\\"name\\\": \\\"app\\\", \\\"path\\\": \\\"$app\\\", \\\"size\\\": \\\"12 parsecs\\\"}]}\"}"
check "a bad spec fails the play" "$log" test $? != 0
check "the failure names the spec file with line and column" "$log" \
    grep -Eq "$spec:[0-9]+:[0-9]+" "$log"
check "the failure says what is wrong" "$log" grep -q 'invalid size `12 parsecs`' "$log"
check "the task failed with tmpfsctl validate's exit 2" "$log" \
    grep -q 'FAILED! => .*"msg": "tmpfsctl validate failed (exit 2): error: invalid size' "$log"
check "the bad spec was not written" "$log" test "$spec_before" = "$(sha256sum "$spec")"
check "the bad spec changed no mount" "$log" test "$table_before" = "$(table)"

# 7. Degraded is a warning by default, a failure with fail_on_degraded.
mkdir -p "$tdir/app/big"
head -c 3000000 /dev/zero > "$tdir/app/big/blob"
degraded_spec="{\"tmpfsctl_test_spec\": \"{\\\"version\\\": 1, \\\"mounts\\\": [{\\\"name\\\": \\\"app\\\", \\\"path\\\": \\\"$app\\\", \\\"size\\\": \\\"32MiB\\\", \\\"mode\\\": \\\"0750\\\", \\\"options\\\": [\\\"nosuid\\\", \\\"nodev\\\", \\\"noatime\\\"], \\\"persist\\\": \\\"on-stop\\\"}, {\\\"name\\\": \\\"big\\\", \\\"path\\\": \\\"$tdir/app/big\\\", \\\"size\\\": \\\"1MiB\\\"}]}\"}"
log=$tdir/degraded.log
play "$log" module.yml -e "$degraded_spec"
check "a degraded mount is not a failed task" "$log" test $? = 0
check "it is a warning naming the mount" "$log" grep -q '\[WARNING\]: tmpfsctl apply: not fully converged (exit 3): big degraded' "$log"
check "degraded lists its name" "$log" grep -Eq '"degraded": \[' "$log"
log=$tdir/degraded-fail.log
play "$log" module.yml -e "$degraded_spec" -e tmpfsctl_test_fail_on_degraded=true
check "fail_on_degraded: true fails the task" "$log" test $? != 0
check "with tmpfsctl's reason and the degraded names" "$log" \
    grep -Eq 'FAILED! => .*"degraded": \["big"\].*"msg": "tmpfsctl apply: not fully converged \(exit 3\): big degraded: .*do not fit' "$log"
check "the app mount is still in place" "$log" mounted

# 8. state: absent: the directory is back on disk with the data written in
# RAM, nothing is mounted, the spec file is gone.
log=$tdir/absent.log
play "$log" role.yml -e tmpfsctl_test_state=absent -e tmpfsctl_test_size=32MiB
check "state: absent succeeds" "$log" test $? = 0
check "state: absent reports changed" "$log" test "$(changed "$log")" -ge 1
check "nothing is mounted on the cache directory" "$log" bash -c "! findmnt -rn -M '$app' >/dev/null"
check "no tmpfsctl tmpfs is left in the namespace" "$log" bash -c "! findmnt -rn -t tmpfs -o SOURCE | grep -q '^tmpfsctl-'"
check "the data written in RAM is on disk" "$log" grep -qx "written in RAM" "$app/hot.txt"
check "the original data is on disk" "$log" grep -qx "cold data" "$app/seed.txt"
check "the spec file is removed" "$log" test ! -e "$spec"
log=$tdir/absent2.log
play "$log" role.yml -e tmpfsctl_test_state=absent
check "state: absent again: changed=0" "$log" test "$(changed "$log")" = 0

echo "1..$n"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
