#!/usr/bin/env bash
# Where a tracked write-back's time goes: the incremental case of bench/writeback.sh
# (a tree of FILES files on a tmpfs, a change tracker running, PERMILLE/1000 of
# the files rewritten per round), with each round's tracked pass (copybench sync
# asking the tracker, as `tmpfsctl sync` does with the agent running) run under
# the command in WRAP: `perf stat`, `perf record -g -o FILE`, `perf trace -s -o
# FILE`, `strace -f -c -o FILE`. Prints each pass's wall time and its statistics.
# The copy is written where DEST says (default /tmp): a directory on the
# filesystem to profile, such as a mounted loop device.
# Runs in a private mount namespace: the tmpfs is invisible to the host and goes
# away with the script.
#
# Usage: sudo WRAP="perf stat" bench/tracked_profile.sh   (env: FILES RUNS PERMILLE DEST WRAP)
set -euo pipefail
if [ "${TMPFSCTL_BENCH_INNER:-}" != 1 ]; then
    cd "$(dirname "$0")/.."
    cargo build --release --quiet --example copybench
    exec env TMPFSCTL_BENCH_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
FILES=${FILES:-100000}
RUNS=${RUNS:-3}
PERMILLE=${PERMILLE:-10}
DEST=${DEST:-/tmp}
BENCH=${BENCH:-$PWD/target/release/examples/copybench}
read -r -a WRAP <<< "${WRAP:-}"
WORK=$(mktemp -d /tmp/tmpfsctl-profile-XXXXXX)
COPY=$(mktemp -d "$DEST/tmpfsctl-profile-copy-XXXXXX")
TRACKER=
cleanup() {
    [ -n "$TRACKER" ] && kill "$TRACKER" 2>/dev/null
    umount -l "$WORK/src" "$WORK/state" 2>/dev/null || true
    rm -rf "$WORK" "$COPY"
}
trap cleanup EXIT

mkdir "$WORK/src" "$WORK/state"
mount -t tmpfs -o size=16g,mode=0755 tmpfsctl-profile "$WORK/src"
mount -t tmpfs -o size=256m tmpfsctl-profile-state "$WORK/state"
"$BENCH" gen "$WORK/src" "$FILES" 1
# The tracker starts before the copy's first baseline, as the agent's does.
"$BENCH" track "$WORK/src" "$WORK/state/tracker" profile &
TRACKER=$!
sleep 0.5
"$BENCH" sync "$WORK/src" "$COPY" "$WORK/state/base" "$WORK/state/tracker" profile > /dev/null
for ((r = 1; r <= RUNS; r++)); do
    "$BENCH" mutate "$WORK/src" "$PERMILLE" "$((r + 100))" > /dev/null 2>&1
    sync -f "$COPY"
    s=$EPOCHREALTIME
    out=$("${WRAP[@]}" "$BENCH" sync "$WORK/src" "$COPY" "$WORK/state/base" "$WORK/state/tracker" profile)
    e=$EPOCHREALTIME
    grep -q '"tracked":true' <<< "$out" || { echo "the pass was not tracked: $out" >&2; exit 1; }
    echo "round $r: $(( (${e/./} - ${s/./}) / 1000 )) ms: $out"
done
