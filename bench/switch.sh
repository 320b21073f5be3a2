#!/usr/bin/env bash
# Fallback/down switch time: from `down`'s decision until the managed path shows
# the disk directory, for a persisted mount holding FILES files (default 20000)
# that all changed in RAM (so the write-back after the switch has work to do).
# Prints each round's switch_ms (measured by tmpfsctl around the two mount calls)
# and the whole `down`'s wall time, then medians.
# Usage (root): bench/switch.sh [FILES] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${1:-20000}
ROUNDS=${2:-5}
cargo build --release --quiet
BIN=$PWD/target/release/tmpfsctl
exec unshare -m --propagation private bash -s "$BIN" "$FILES" "$ROUNDS" <<'INNER'
set -euo pipefail
BIN=$1 FILES=$2 ROUNDS=$3
work=$(mktemp -d /var/tmp/tmpfsctl-switch.XXXXXX)
trap 'for m in held lower stage run; do umount -l "$work/state/$m" 2>/dev/null || true; done; rm -rf "$work"' EXIT
export TMPFSCTL_STATE_DIR=$work/state
cache=$work/cache
mkdir -p "$cache"
for ((i = 0; i < FILES; i++)); do
    d=$cache/d$((i % 100)); [ -d "$d" ] || mkdir "$d"
    printf 'seeded %d\n' "$i" > "$d/f$i"
done
cat > "$work/spec.yaml" <<YAML
version: 1
mounts:
  - name: cache
    path: $cache
    size: 512MiB
    persist: on-stop
YAML
switch=() wall=()
for ((r = 1; r <= ROUNDS; r++)); do
    "$BIN" apply "$work/spec.yaml" >/dev/null
    for ((i = 0; i < FILES; i++)); do printf 'ram %d %d\n' "$r" "$i" > "$cache/d$((i % 100))/f$i"; done
    start=$(date +%s%N)
    out=$("$BIN" down "$work/spec.yaml" --format json)
    end=$(date +%s%N)
    s=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["switch_ms"])')
    w=$(( (end - start) / 1000000 ))
    echo "round $r: switch ${s} ms, whole down ${w} ms"
    switch+=("$s") wall+=("$w")
    grep -q "ram $r 7" "$cache/d7/f7"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "median switch: $(median "${switch[@]}") ms (goal: at most 20 ms), median down: $(median "${wall[@]}") ms, $FILES files"
INNER
