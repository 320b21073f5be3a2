#!/usr/bin/env bash
# Peak memory (VmHWM, from `/usr/bin/time -v`) of the seed and the write-back over a
# tree of FILES files of SIZE bytes (100 files a directory, 10 directories a group),
# through examples/copybench:
#   - seed: `copybench seed` from the "disk" (a tmpfs) into a fresh tmpfs;
#   - full sync: `copybench sync` of that tmpfs into an empty directory (on another
#     tmpfs), no baseline, saving the new one;
#   - no-op sync: the same again, against that saved baseline, nothing changed;
#   - tracked no-op sync: the same with a change tracker (as `tmpfsctl sync` with the
#     agent running), if fanotify is available (TRACKED=0 skips it).
# Everything lives on tmpfs in a private mount namespace (gone with the script): a
# file of 100 bytes takes a page, so 1,000,000 of them take about 4 GiB per copy,
# two copies at a time. Prints the peak RSS in MiB, the seconds and the CPU seconds
# of each run.
#
# Usage: sudo bench/memory.sh    (env: FILES=1000000 SIZE=100 TRACKED=1; BENCH=binary
# to measure another build of copybench)
set -euo pipefail
if [ "${TMPFSCTL_BENCH_INNER:-}" != 1 ]; then
    cd "$(dirname "$0")/.."
    cargo build --release --quiet --example copybench
    exec env TMPFSCTL_BENCH_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
FILES=${FILES:-1000000}
SIZE=${SIZE:-100}
TRACKED=${TRACKED:-1}
BENCH=${BENCH:-${CARGO_TARGET_DIR:-$PWD/target}/release/examples/copybench}
WORK=$(mktemp -d /tmp/tmpfsctl-mem-bench-XXXXXX)
TRACKER=""
cleanup() {
    if [ -n "$TRACKER" ]; then
        kill "$TRACKER" 2>/dev/null || true
        wait "$TRACKER" 2>/dev/null || true
    fi
    for m in disk ram dst state; do umount -l "$WORK/$m" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir "$WORK/disk" "$WORK/ram" "$WORK/dst" "$WORK/state"
mount -t tmpfs -o size=16g,mode=0755 tmpfsctl-mem-disk "$WORK/disk"
mount -t tmpfs -o size=16g,mode=0755 tmpfsctl-mem-ram "$WORK/ram"
mount -t tmpfs -o size=1g tmpfsctl-mem-state "$WORK/state"
"$BENCH" gen "$WORK/disk" "$FILES" 1 "$SIZE"

# Runs "$@" under /usr/bin/time -v; prints "LABEL: PEAK MiB, SECONDS s, CPU s" (the
# CPU time, user and system, suffers less than the wall time from other work on the
# host).
peak() {
    local label=$1
    shift
    local out rss secs cpu
    out=$(/usr/bin/time -v "$@" 2>&1 >"$WORK/stdout") || { echo "$out" >&2; exit 1; }
    rss=$(awk -F': ' '/Maximum resident set size/ { print $2 }' <<< "$out")
    cpu=$(awk -F': ' '/(User|System) time \(seconds\)/ { s += $2 } END { print s }' <<< "$out")
    secs=$(head -1 "$WORK/stdout")
    printf '%-18s %7.1f MiB  %6.2f s  %6.2f s CPU\n' "$label:" "$(bc -l <<< "$rss / 1024")" "$secs" "$cpu"
}

peak seed "$BENCH" seed "$WORK/disk" "$WORK/ram"
# The disk copy is no longer needed: the write-back goes to a third tmpfs.
umount "$WORK/disk"
mount -t tmpfs -o size=16g,mode=0755 tmpfsctl-mem-dst "$WORK/dst"
if [ "$TRACKED" = 1 ]; then
    # Started before the first baseline is taken, as the agent's is.
    "$BENCH" track "$WORK/ram" "$WORK/state/tracker" bench &
    TRACKER=$!
    sleep 0.5
fi
BASE=$WORK/state/mem.base
peak "full sync" "$BENCH" sync "$WORK/ram" "$WORK/dst" "$BASE"
printf '%-18s %7.1f MiB\n' "baseline file:" "$(bc -l <<< "$(stat -c %s "$BASE") / 1048576")"
peak "no-op sync" "$BENCH" sync "$WORK/ram" "$WORK/dst" "$BASE"
if [ "$TRACKED" = 1 ]; then
    peak "tracked no-op" "$BENCH" sync "$WORK/ram" "$WORK/dst" "$BASE" "$WORK/state/tracker" bench
    grep -q '"tracked":true' "$WORK/stdout" || echo "(the tracked pass was not tracked: $(tail -1 "$WORK/stdout"))"
fi
