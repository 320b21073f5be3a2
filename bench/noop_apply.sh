#!/usr/bin/env bash
# No-op `apply` of a 50-mount spec vs `findmnt --json` on the same host.
# Runs in a private mount namespace (nothing reaches the host's mount table).
# Prints medians of RUNS runs each and the ratio. Usage: bench/noop_apply.sh [RUNS]
set -euo pipefail
if [ "${TMPFSCTL_BENCH_INNER:-}" != 1 ]; then
    cd "$(dirname "$0")/.."
    cargo build --release --quiet
    exec env TMPFSCTL_BENCH_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
RUNS=${1:-101}
BIN=${BIN:-$PWD/target/release/tmpfsctl}
WORK=$(mktemp -d /tmp/tmpfsctl-bench-XXXXXX)
export TMPFSCTL_STATE_DIR=$WORK/state
cleanup() {
    findmnt -rn -o TARGET | grep "^$WORK/" | sort -r | xargs -r -n1 umount -l
    rm -rf "$WORK"
}
trap cleanup EXIT

{
    echo "version: 1"
    echo "mounts:"
    for i in $(seq -w 1 50); do
        mkdir -p "$WORK/cache/$i"
        echo "$i" > "$WORK/cache/$i/file"
        printf '  - name: m%s\n    path: %s\n    size: 4MiB\n' "$i" "$WORK/cache/$i"
    done
} > "$WORK/spec.yaml"
"$BIN" apply "$WORK/spec.yaml" > /dev/null
"$BIN" apply "$WORK/spec.yaml" | grep -q "changed: no"

# median wall time in microseconds of RUNS executions of "$@"
median_us() {
    local times=() i s e
    for ((i = 0; i < RUNS; i++)); do
        s=$EPOCHREALTIME
        "$@" > /dev/null
        e=$EPOCHREALTIME
        times+=($(( (${e/./} - ${s/./}) )))
    done
    printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (RUNS + 1) / 2 ))p"
}

mounts=$(wc -l < /proc/self/mountinfo)
apply_us=$(median_us "$BIN" apply "$WORK/spec.yaml")
findmnt_us=$(median_us findmnt --json)
echo "mount table: $mounts entries; spec: 50 mounts; $RUNS runs each (median)"
printf '%-34s %8d us\n' "tmpfsctl apply (no-op, 50 mounts)" "$apply_us" "findmnt --json" "$findmnt_us"
awk -v a="$apply_us" -v f="$findmnt_us" 'BEGIN { printf "ratio apply/findmnt: %.2fx (target <= 3x)\n", a / f }'
