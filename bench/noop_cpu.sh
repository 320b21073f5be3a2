#!/usr/bin/env bash
# CPU time (user + system) and peak RSS of no-op write-backs, one build of
# examples/copybench against another: each binary gets its own identical tree of
# FILES files of 100 bytes on its own tmpfs, its own change tracker and its own
# destination (a tmpfs), is given a first write-back, and then N rounds of a no-op
# pass reading the whole tree and a tracked one are timed, the binaries alternating
# within each round. CPU time suffers less than wall time from other work on the
# host. Runs in a private mount namespace: nothing stays mounted.
#
# Usage: sudo BENCHES="OLD NEW" bench/noop_cpu.sh   (env: FILES=300000 N=5)
set -euo pipefail
if [ "${TMPFSCTL_BENCH_INNER:-}" != 1 ]; then
    exec env TMPFSCTL_BENCH_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
FILES=${FILES:-300000}
N=${N:-5}
read -r -a B <<< "${BENCHES:?set BENCHES to the copybench binaries to compare}"
WORK=$(mktemp -d /tmp/tmpfsctl-noop-cpu-XXXXXX)
TRACKERS=()
cleanup() {
    for p in "${TRACKERS[@]}"; do kill "$p" 2>/dev/null || true; done
    for i in "${!B[@]}"; do umount -l "$WORK/ram$i" "$WORK/dst$i" 2>/dev/null || true; done
    umount -l "$WORK/state" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir "$WORK/state"
mount -t tmpfs -o size=1g tmpfsctl-cpu-state "$WORK/state"
for i in "${!B[@]}"; do
    mkdir "$WORK/ram$i" "$WORK/dst$i"
    mount -t tmpfs -o size=8g tmpfsctl-cpu-ram "$WORK/ram$i"
    mount -t tmpfs -o size=8g tmpfsctl-cpu-dst "$WORK/dst$i"
    "${B[$i]}" gen "$WORK/ram$i" "$FILES" 1 100 > /dev/null
    # Started before the first baseline is taken, as the agent's is.
    "${B[$i]}" track "$WORK/ram$i" "$WORK/state/tracker$i" "bench$i" &
    TRACKERS+=($!)
done
sleep 1
for i in "${!B[@]}"; do
    "${B[$i]}" sync "$WORK/ram$i" "$WORK/dst$i" "$WORK/state/$i.base" > /dev/null
done
# One pass of binary $1, "whole" or "tracked": wall, user and system seconds, peak KiB.
pass() {
    local i=$1 kind=$2 times tracker=()
    [ "$kind" = tracked ] && tracker=("$WORK/state/tracker$i" "bench$i")
    times=$(/usr/bin/time -f "%e %U %S %M" "${B[$i]}" sync "$WORK/ram$i" "$WORK/dst$i" \
        "$WORK/state/$i.base" "${tracker[@]}" 2>&1 > "$WORK/stdout")
    echo "$kind $i $times $(grep -o '"tracked":[a-z]*' "$WORK/stdout")"
}
for ((r = 0; r < N; r++)); do
    for kind in whole tracked; do
        for j in "${!B[@]}"; do pass $(((j + r) % ${#B[@]})) "$kind"; done
    done
done > "$WORK/runs"
for kind in whole tracked; do
    for i in "${!B[@]}"; do
        runs=$(grep "^$kind $i " "$WORK/runs")
        grep -q '"tracked":false' <<< "$runs" && [ "$kind" = tracked ] &&
            echo "($kind ${B[$i]}: a pass was not tracked)"
        echo "$kind ${B[$i]}:"
        echo "  CPU s:  $(awk '{ print $4 + $5 }' <<< "$runs" | sort -n | tr '\n' ' ')"
        echo "  wall s: $(awk '{ print $3 }' <<< "$runs" | sort -n | tr '\n' ' ')"
        echo "  KiB:    $(awk '{ print $6 }' <<< "$runs" | sort -n | tr '\n' ' ')"
    done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
