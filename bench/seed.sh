#!/usr/bin/env bash
# Seeding (`copy::copy_tree`, what `apply` runs for `seed: copy`) from a disk
# directory into a fresh tmpfs vs `cp -a`, `rsync -aHAX` and `tar | tar`.
# A tree of FILES files (90% 1-8 KiB, 10% 64 KiB-1 MiB log-uniform; about
# 3.7 GiB for 100,000) is generated on disk (/var/tmp); every timed run copies
# it into a new tmpfs. The tools take turns within each round (the first
# rotates). The page cache is warm (one untimed copy first), or with COLD=1
# dropped before every run (`echo 3 > /proc/sys/vm/drop_caches`: the whole
# host's page cache), and then the disk's sequential read rate (a 1 GiB file
# read with O_DIRECT) is measured in the same run for comparison.
# Runs in a private mount namespace; prints medians and ratios.
#
# Usage: sudo bench/seed.sh            (env: FILES RUNS COLD)
set -euo pipefail
if [ "${TMPFSCTL_BENCH_INNER:-}" != 1 ]; then
    cd "$(dirname "$0")/.."
    cargo build --release --quiet --example copybench
    exec env TMPFSCTL_BENCH_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
FILES=${FILES:-100000}
RUNS=${RUNS:-5}
COLD=${COLD:-0}
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
drop() { if [ "$COLD" = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi; }
[ "$COLD" = 1 ] || time_us ${cmds[tmpfsctl]} > /dev/null   # warm the page cache
declare -A runs
for ((i = 0; i < RUNS; i++)); do
    for ((k = 0; k < ${#order[@]}; k++)); do
        tool=${order[$(( (i + k) % ${#order[@]} ))]}
        drop
        runs[$tool]+="$(time_us ${cmds[$tool]}) "
    done
done
declare -A med
for tool in "${order[@]}"; do
    med[$tool]=$(printf '%s\n' ${runs[$tool]} | median)
done
du_bytes=$(du -sb "$WORK/src" | cut -f1)
cache=$([ "$COLD" = 1 ] && echo "page cache dropped before each run" || echo "page cache warm")
echo "seed $FILES files ($(numfmt --to=iec "$du_bytes")) from disk into a fresh tmpfs, median of $RUNS, $cache"
for tool in "${order[@]}"; do
    awk -v n="$tool" -v t="${med[$tool]}" -v r="${runs[$tool]}" 'BEGIN { printf "%-10s %8.3f s   (runs, us: %s)\n", n, t / 1e6, r }'
done
awk -v a="${med[tmpfsctl]}" -v c="${med[cp]}" -v r="${med[rsync]}" -v t="${med[tar]}" -v b="$du_bytes" 'BEGIN {
    printf "ratio tmpfsctl/cp -a:      %.2fx\n", a / c
    printf "ratio tmpfsctl/rsync -aHAX: %.2fx\n", a / r
    printf "ratio tmpfsctl/tar|tar:    %.2fx\n", a / t
    printf "tmpfsctl rate:             %.0f MB/s\n", b / a
}'
if [ "$COLD" = 1 ]; then
    head -c 1G /dev/urandom > "$WORK/seq"
    sync -f "$WORK/seq"
    drop
    s=$EPOCHREALTIME
    dd if="$WORK/seq" of=/dev/null bs=4M iflag=direct status=none
    e=$EPOCHREALTIME
    awk -v us=$(( ${e/./} - ${s/./} )) -v a="${med[tmpfsctl]}" -v b="$du_bytes" 'BEGIN {
        seq = 1073741824 / us
        printf "disk sequential read (1 GiB, O_DIRECT): %.0f MB/s; tmpfsctl seeds at %.0f%% of it\n", seq, 100 * (b / a) / seq
    }'
fi
