#!/usr/bin/env bash
# Seeding (`copy::copy_tree`, what `apply` runs for `seed: copy`) from a disk
# directory into a fresh tmpfs vs `cp -a`, `rsync -aHAX` and `tar | tar`.
# A tree of FILES files (90% 1-8 KiB, 10% 64 KiB-1 MiB log-uniform; about
# 3.7 GiB for 100,000) is generated on disk (/var/tmp); every timed run copies
# it into a new tmpfs. The page cache is warm (one untimed copy first).
# Runs in a private mount namespace; prints medians and ratios.
#
# Usage: sudo bench/seed.sh            (env: FILES RUNS)
set -euo pipefail
if [ "${TMPFSCTL_BENCH_INNER:-}" != 1 ]; then
    cd "$(dirname "$0")/.."
    cargo build --release --quiet --example copybench
    exec env TMPFSCTL_BENCH_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
FILES=${FILES:-100000}
RUNS=${RUNS:-5}
BENCH=${BENCH:-$PWD/target/release/examples/copybench}
WORK=$(mktemp -d /var/tmp/tmpfsctl-seed-bench-XXXXXX)
cleanup() {
    umount -l "$WORK/dst" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir "$WORK/src" "$WORK/dst"
"$BENCH" gen "$WORK/src" "$FILES" 1
sync -f "$WORK/src"

fresh_tmpfs() {
    umount -l "$WORK/dst" 2>/dev/null || true
    mount -t tmpfs -o size=16g,mode=0755 tmpfsctl-seed-bench "$WORK/dst"
}

median() {
    sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

time_us() {
    fresh_tmpfs
    local s=$EPOCHREALTIME
    "$@" > /dev/null
    local e=$EPOCHREALTIME
    echo $(( ${e/./} - ${s/./} ))
}

tar_copy() { tar -C "$WORK/src" -cf - . | tar -C "$WORK/dst" -xf -; }

declare -A cmds=(
    [tmpfsctl]="$BENCH seed $WORK/src $WORK/dst"
    [cp]="cp -a $WORK/src/. $WORK/dst/"
    [rsync]="rsync -aHAX $WORK/src/ $WORK/dst/"
    [tar]="tar_copy"
)
order=(tmpfsctl cp rsync tar)
time_us ${cmds[tmpfsctl]} > /dev/null   # warm the page cache
declare -A med
for tool in "${order[@]}"; do
    t=()
    for ((i = 0; i < RUNS; i++)); do
        t+=("$(time_us ${cmds[$tool]})")
    done
    med[$tool]=$(printf '%s\n' "${t[@]}" | median)
done
du_bytes=$(du -sb "$WORK/src" | cut -f1)
echo "seed $FILES files ($(numfmt --to=iec "$du_bytes")) from disk into a fresh tmpfs, median of $RUNS, page cache warm"
for tool in "${order[@]}"; do
    awk -v n="$tool" -v t="${med[$tool]}" 'BEGIN { printf "%-10s %8.3f s\n", n, t / 1e6 }'
done
awk -v a="${med[tmpfsctl]}" -v c="${med[cp]}" -v r="${med[rsync]}" -v t="${med[tar]}" 'BEGIN {
    printf "ratio tmpfsctl/cp -a:      %.2fx (target <= 0.7x)\n", a / c
    printf "ratio tmpfsctl/rsync -aHAX: %.2fx\n", a / r
    printf "ratio tmpfsctl/tar|tar:    %.2fx (target <= 1.0x)\n", a / t
}'
