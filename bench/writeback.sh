#!/usr/bin/env bash
# Write-back (`copy::sync_tree`, through examples/copybench) vs cp -a / rsync -aHAX.
#
# A tree of FILES files (90% 1-8 KiB, 10% 64 KiB-1 MiB log-uniform: about 3.7 GiB
# for 100,000) on a tmpfs, synced to an ext4 (or whatever /tmp is) directory:
#   - full first sync into an empty directory: FULL_RUNS rounds, in each of which
#     copybench sync, cp -a, rsync -aHAX, and cp -a followed by `sync -f` take turns
#     (cp and rsync do not fsync; the write-back makes every file and directory it
#     writes durable); every run's copy stays until the end (needs FULL_RUNS x 4 x
#     the tree free on disk); then the floor of any durable copy: the tree's bytes
#     written by dd with direct I/O at the disk's sequential rate;
#   - incremental: RUNS rounds, each rewriting PERMILLE/1000 of the files in the
#     tmpfs, then timing copybench sync (reading the whole tree), copybench sync
#     asking a change tracker (as `tmpfsctl sync` does with the agent running),
#     rsync -aHAX --delete, and two tools told the rewritten files' names, with
#     no walk and nothing made durable (what copying just the changes costs on
#     this disk, with no tool's bookkeeping): rsync -aHAX --files-from (each file
#     written beside and renamed over, as the write-back does) and tar -T | tar -x
#     (each file unlinked and written again in place), the latter also as two
#     pipelines side by side, each given every other name (what the changes cost
#     with every CPU of this 2-CPU host busy), each on its own copy (the order
#     rotates per round); plus RUNS no-op syncs of each.
# The dirty pages of the previous command are flushed (`sync -f`) before each timed
# command, so no command pays for another's writeback; the page cache stays warm.
# Runs in a private mount namespace: the tmpfs is invisible to the host and goes
# away with the script. Prints medians and ratios.
#
# The copies are written where DEST says (default /tmp): a directory on the
# filesystem to measure, such as a fresh one on a loop device.
#
# Usage: sudo bench/writeback.sh   (env: FILES RUNS FULL_RUNS PERMILLE DEST;
# FULL_RUNS=0 skips the full copies)
set -euo pipefail
if [ "${TMPFSCTL_BENCH_INNER:-}" != 1 ]; then
    cd "$(dirname "$0")/.."
    cargo build --release --quiet --example copybench
    exec env TMPFSCTL_BENCH_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
FILES=${FILES:-100000}
RUNS=${RUNS:-5}
FULL_RUNS=${FULL_RUNS:-3}
PERMILLE=${PERMILLE:-10}
BENCH=${BENCH:-$PWD/target/release/examples/copybench}
DEST=${DEST:-/tmp}
WORK=$(mktemp -d "$DEST/tmpfsctl-wb-bench-XXXXXX")
cleanup() {
    umount -l "$WORK/src" 2>/dev/null || true
    umount -l "$WORK/state" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

mkdir "$WORK/src"
mount -t tmpfs -o size=16g,mode=0755 tmpfsctl-bench "$WORK/src"
"$BENCH" gen "$WORK/src" "$FILES" 1
SRC=$WORK/src

# "WALL CPU" of "$@" in microseconds, after flushing what earlier commands left
# dirty (no command pays for another's writeback), CPU being the user and system
# time of the command and its children (bash's `time`: from the kernel's exact run
# time, not sampled ticks). A copy that leaves its data to the kernel's flusher threads
# (cp, rsync) does not count their work; the write-back starts its own writeback.
time_cpu_us() {
    sync -f "$WORK"
    local s=$EPOCHREALTIME e cpu u sy TIMEFORMAT='%3U %3S'
    cpu=$({ time "$@" > /dev/null 2> "$WORK/stderr"; } 2>&1) || { cat "$WORK/stderr" >&2; return 1; }
    e=$EPOCHREALTIME
    read -r u sy <<< "$cpu"
    echo "$(( ${e/./} - ${s/./} )) $(( 10#${u/./} * 1000 + 10#${sy/./} * 1000 ))"
}

# The wall time alone.
time_us() {
    local t
    t=$(time_cpu_us "$@")
    echo "${t% *}"
}

median() {
    sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

# Every full run writes into a directory of its own, and they are all removed only
# when the script ends: on an ext4 without a journal (this host's), the inode
# allocator skips every inode freed in the last 60-360 s, reading its inode-table
# block each time (ext4's find_inode_bit/recently_deleted), so a run that followed
# the deletion of the previous run's 20,000 files paid up to several times the
# system time for its own creates, whichever tool it was.
cp_and_flush() {
    cp -a "$SRC/." "$1/"
    sync -f "$1"
}

declare -A full
full_tools=(sync cp rsync cp_sync)
if ((FULL_RUNS > 0)); then
    need=$(( $(du -sk "$SRC" | cut -f1) * ${#full_tools[@]} * FULL_RUNS ))
    have=$(df -k --output=avail "$WORK" | tail -1)
    ((need < have)) || { echo "the full runs need $need KiB free under $WORK, there are $have" >&2; exit 1; }
fi
declare -A full_runs full_cpu
for ((r = 0; r < FULL_RUNS; r++)); do
    # The tools take turns, the first rotating with the round.
    for ((k = 0; k < ${#full_tools[@]}; k++)); do
        tool=${full_tools[$(( (r + k) % ${#full_tools[@]} ))]}
        dst=$WORK/full.$r.$tool
        mkdir "$dst"
        case $tool in
        sync) t=$(time_cpu_us "$BENCH" sync "$SRC" "$dst") ;;
        cp) t=$(time_cpu_us cp -a "$SRC/." "$dst/") ;;
        rsync) t=$(time_cpu_us rsync -aHAX "$SRC/" "$dst/") ;;
        cp_sync) t=$(time_cpu_us cp_and_flush "$dst") ;;
        esac
        full_runs[$tool]+="${t% *} " full_cpu[$tool]+="${t#* } "
    done
done
declare -A full_cpu_median
if ((FULL_RUNS > 0)); then
    for tool in "${full_tools[@]}"; do
        full[$tool]=$(printf '%s\n' ${full_runs[$tool]} | median)
        full_cpu_median[$tool]=$(printf '%s\n' ${full_cpu[$tool]} | median)
    done
    # The floor of any durable copy: the tree's bytes written in one stream with
    # direct I/O and flushed, at the disk's sequential rate (one file, so its
    # deletion does not skew what follows).
    tree_mib=$(( $(du -sm "$SRC" | cut -f1) ))
    sync -f "$WORK"
    floor_s=$EPOCHREALTIME
    dd if=/dev/zero of="$WORK/floor" bs=4M count=$(( (tree_mib + 3) / 4 )) oflag=direct conv=fsync status=none
    floor_e=$EPOCHREALTIME
    rm -f "$WORK/floor"
    floor=$(( ${floor_e/./} - ${floor_s/./} ))
fi

# Two copies for the incremental rounds, each made by the tool that maintains it.
# The baseline and journal live where tmpfsctl keeps them by default: in its state
# directory under /run, a tmpfs.
mkdir "$WORK/ours" "$WORK/tracked" "$WORK/theirs" "$WORK/listed" "$WORK/tarred" "$WORK/tarred2" "$WORK/state"
mount -t tmpfs -o size=256m tmpfsctl-bench-state "$WORK/state"
BASE=$WORK/state/ours.base
TBASE=$WORK/state/tracked.base
# The change tracker starts before the tracked copy's first baseline, as the
# agent's does before a mount's first write-back.
"$BENCH" track "$SRC" "$WORK/state/tracker" bench &
TRACKER=$!
trap 'kill $TRACKER 2>/dev/null; cleanup' EXIT
sleep 0.5
"$BENCH" sync "$SRC" "$WORK/ours" "$BASE" > /dev/null
"$BENCH" sync "$SRC" "$WORK/tracked" "$TBASE" "$WORK/state/tracker" bench > /dev/null
rsync -aHAX "$SRC/" "$WORK/theirs/"
rsync -aHAX "$SRC/" "$WORK/listed/"
rsync -aHAX "$SRC/" "$WORK/tarred/"
rsync -aHAX "$SRC/" "$WORK/tarred2/"
: > "$WORK/changed"
: > "$WORK/changed.0"
: > "$WORK/changed.1"
full_sync() { "$BENCH" sync "$SRC" "$WORK/ours" "$BASE"; }
tracked_sync() {
    local out
    out=$("$BENCH" sync "$SRC" "$WORK/tracked" "$TBASE" "$WORK/state/tracker" bench)
    # A pass that fell back to reading everything would measure the wrong thing.
    grep -q '"tracked":true' <<< "$out" || { echo "tracked pass was not tracked: $out" >&2; exit 1; }
}
rsync_sync() { rsync -aHAX --delete "$SRC/" "$WORK/theirs/"; }
listed_sync() { rsync -aHAX --from0 --files-from="$WORK/changed" "$SRC/" "$WORK/listed/"; }
tarred_sync() {
    tar -C "$SRC" --null -T "$WORK/changed" -cf - | tar -C "$WORK/tarred" --xattrs --acls -xpf -
}
tarred2_sync() {
    tar -C "$SRC" --null -T "$WORK/changed.0" -cf - | tar -C "$WORK/tarred2" --xattrs --acls -xpf - &
    tar -C "$SRC" --null -T "$WORK/changed.1" -cf - | tar -C "$WORK/tarred2" --xattrs --acls -xpf -
    wait
}
# One round: the six tools, the first rotating with the round.
tools=(full tracked rsync listed tarred tarred2)
round() {
    local r=$1 k t
    for ((k = 0; k < ${#tools[@]}; k++)); do
        t=${tools[$(( (r + k) % ${#tools[@]} ))]}
        case $t in
        full) t_full=$(time_us full_sync) ;;
        tracked) t_tracked=$(time_us tracked_sync) ;;
        rsync) t_rsync=$(time_us rsync_sync) ;;
        listed) t_listed=$(time_us listed_sync) ;;
        tarred) t_tarred=$(time_us tarred_sync) ;;
        tarred2) t_tarred2=$(time_us tarred2_sync) ;;
        esac
    done
}
# Warm-up, and the no-op cost.
noop_sync=() noop_tracked=() noop_rsync=()
for ((r = 0; r <= RUNS; r++)); do
    round "$r"
    if ((r > 0)); then
        noop_sync+=("$t_full") noop_tracked+=("$t_tracked") noop_rsync+=("$t_rsync")
    fi
done
incr_sync=() incr_tracked=() incr_rsync=() incr_listed=() incr_tarred=() incr_tarred2=()
changed=""
for ((r = 1; r <= RUNS; r++)); do
    changed+="$("$BENCH" mutate "$SRC" "$PERMILLE" "$((r + 100))" "$WORK/changed" 2>&1); "
    awk -v RS='\0' -v ORS='\0' 'NR % 2 == 1' "$WORK/changed" > "$WORK/changed.0"
    awk -v RS='\0' -v ORS='\0' 'NR % 2 == 0' "$WORK/changed" > "$WORK/changed.1"
    round "$r"
    incr_sync+=("$t_full") incr_tracked+=("$t_tracked") incr_rsync+=("$t_rsync") incr_listed+=("$t_listed") incr_tarred+=("$t_tarred") incr_tarred2+=("$t_tarred2")
done

ms() { awk -v u="$1" 'BEGIN { printf "%9.1f ms", u / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
m_noop_sync=$(printf '%s\n' "${noop_sync[@]}" | median)
m_noop_tracked=$(printf '%s\n' "${noop_tracked[@]}" | median)
m_noop_rsync=$(printf '%s\n' "${noop_rsync[@]}" | median)
m_incr_sync=$(printf '%s\n' "${incr_sync[@]}" | median)
m_incr_tracked=$(printf '%s\n' "${incr_tracked[@]}" | median)
m_incr_rsync=$(printf '%s\n' "${incr_rsync[@]}" | median)
m_incr_listed=$(printf '%s\n' "${incr_listed[@]}" | median)
m_incr_tarred=$(printf '%s\n' "${incr_tarred[@]}" | median)
m_incr_tarred2=$(printf '%s\n' "${incr_tarred2[@]}" | median)

echo "tree: $(find "$SRC" -type f | wc -l) files, $(du -sh "$SRC" | cut -f1) on tmpfs -> $(findmnt -no FSTYPE -T "$WORK") under $WORK"
echo "incremental rounds: ${changed%; }"
echo
if ((FULL_RUNS > 0)); then
    echo "full first sync (median of $FULL_RUNS):"
    echo "  copybench sync (all made durable)  $(ms "${full[sync]}")"
    echo "  cp -a                               $(ms "${full[cp]}")   sync/cp:        $(ratio "${full[sync]}" "${full[cp]}")"
    echo "  rsync -aHAX                         $(ms "${full[rsync]}")   sync/rsync:     $(ratio "${full[sync]}" "${full[rsync]}")"
    echo "  cp -a; sync -f                      $(ms "${full[cp_sync]}")   sync/(cp+sync): $(ratio "${full[sync]}" "${full[cp_sync]}")"
    echo "  the tree's bytes at the disk's sequential write rate (dd oflag=direct, $tree_mib MiB):"
    echo "                                      $(ms "$floor")   floor/cp:       $(ratio "$floor" "${full[cp]}")"
    echo "  CPU (user + system; median):        sync $(ms "${full_cpu_median[sync]}"), cp -a $(ms "${full_cpu_median[cp]}")"
    echo "  a copy at 0.5x cp -a on $(nproc) CPUs has at most $(ms $(( ${full[cp]} / 2 * $(nproc) ))) of CPU"
    for tool in "${full_tools[@]}"; do echo "  raw (us) $tool: wall ${full_runs[$tool]}; CPU ${full_cpu[$tool]}"; done
    echo
fi
echo "no change (median of $RUNS):"
echo "  copybench sync, whole tree          $(ms "$m_noop_sync")   ratio: $(ratio "$m_noop_sync" "$m_noop_rsync")"
echo "  copybench sync, tracked             $(ms "$m_noop_tracked")   ratio: $(ratio "$m_noop_tracked" "$m_noop_rsync") (goal <= 0.05x)"
echo "  rsync -aHAX --delete                $(ms "$m_noop_rsync")"
echo
echo "incremental, $PERMILLE/1000 of the files rewritten (median of $RUNS):"
echo "  copybench sync, whole tree          $(ms "$m_incr_sync")   ratio: $(ratio "$m_incr_sync" "$m_incr_rsync")"
echo "  copybench sync, tracked             $(ms "$m_incr_tracked")   ratio: $(ratio "$m_incr_tracked" "$m_incr_rsync") (goal <= 0.1x)"
echo "  rsync -aHAX --delete                $(ms "$m_incr_rsync")"
echo "  told the rewritten files' names, nothing made durable:"
echo "  rsync -aHAX --files-from            $(ms "$m_incr_listed")   ratio: $(ratio "$m_incr_listed" "$m_incr_rsync")"
echo "  tar -T | tar -x                     $(ms "$m_incr_tarred")   ratio: $(ratio "$m_incr_tarred" "$m_incr_rsync")"
echo "  the same, two pipelines side by side $(ms "$m_incr_tarred2")   ratio: $(ratio "$m_incr_tarred2" "$m_incr_rsync")"
echo
echo "raw (us): incr whole ${incr_sync[*]}; incr tracked ${incr_tracked[*]}; incr rsync ${incr_rsync[*]}; incr listed ${incr_listed[*]}; incr tar ${incr_tarred[*]}; incr tar x2 ${incr_tarred2[*]}"
echo "raw (us): no-op whole ${noop_sync[*]}; no-op tracked ${noop_tracked[*]}; no-op rsync ${noop_rsync[*]}"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the host skews both sides)"
failed=0
# Every copy must equal the source afterwards. Checked after the figures are out: a
# difference fails the script and puts them in doubt, but they are there to compare.
for copy in ours tracked listed tarred tarred2; do
    # tar, told only files, leaves their directories' times as its writes left them.
    omit=()
    [[ "$copy" = tarred* ]] && omit=(--omit-dir-times)
    diff=$(rsync -aHAXn "${omit[@]}" --itemize-changes --delete "$SRC/" "$WORK/$copy/" | grep -v '^\.d\.\.t\.\.\.\.\.\. \./$' || true)
    if [ -n "$diff" ]; then
        echo "the write-back copy $copy differs from the source:" >&2
        echo "$diff" | head >&2
        failed=1
    fi
done
exit "$failed"
