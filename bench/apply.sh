#!/usr/bin/env bash
# Wall time of `tmpfsctl apply` of a persisted cache (FILES files of 3,000 bytes
# in 50 directories on the disk under /var/tmp) for one or more tmpfsctl builds,
# taking turns within each round, with the seed's own time as apply prints it;
# each apply is undone with `down`. Shows what apply adds to the copy: the mounts
# and, since the seed-window merge (docs/writeback.md, "Seeding"), the merge of
# what changed on disk during the seed. Runs in a private mount namespace.
#
# Usage: sudo BINS="OLD NEW" bench/apply.sh   (env: FILES=20000 RUNS=5)
set -euo pipefail
if [ "${TMPFSCTL_BENCH_INNER:-}" != 1 ]; then
    exec env TMPFSCTL_BENCH_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
FILES=${FILES:-20000}
RUNS=${RUNS:-5}
read -r -a B <<< "${BINS:?set BINS to the tmpfsctl binaries to compare}"
WORK=$(mktemp -d /var/tmp/tmpfsctl-apply-bench-XXXXXX)
export TMPFSCTL_STATE_DIR=$WORK/state
cleanup() {
    "${B[0]}" down "$WORK/spec.yaml" >/dev/null 2>&1 || true
    findmnt -rn -o TARGET | grep "^$WORK" | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
CACHE=$WORK/cache
for d in $(seq 0 49); do
    mkdir -p "$CACHE/d$d"
    for i in $(seq 0 $((FILES / 50 - 1))); do head -c 3000 /dev/zero > "$CACHE/d$d/f$i"; done
done
printf 'version: 1\nmounts:\n  - name: bench\n    path: %s\n    size: 1GiB\n    persist: on-stop\n' "$CACHE" > "$WORK/spec.yaml"
declare -A all
for r in $(seq "$RUNS"); do
    for b in "${B[@]}"; do
        s=$(date +%s%N)
        "$b" apply "$WORK/spec.yaml" > "$WORK/out"
        e=$(date +%s%N)
        ms=$(( (e - s) / 1000000 ))
        all[$b]+="$ms "
        echo "round $r $b: apply ${ms} ms ($(grep -o 'seeded.*' "$WORK/out"))"
        "$b" down "$WORK/spec.yaml" > /dev/null
    done
done
for b in "${B[@]}"; do
    med=$(tr ' ' '\n' <<< "${all[$b]}" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    echo "median $b: $med ms"
done
