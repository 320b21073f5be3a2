#!/usr/bin/env bash
# `seed: overlay`: how long `apply` takes on a large cache (nothing is copied:
# a side bind, a tmpfs and the overlay, whatever the size of the tree), against
# `seed: copy` on the same tree; then the upper layer's size under churn, with
# a write-back every SYNC_EVERY seconds, and again (EVICT=1, the default) with
# the agent's watchdog evicting the upper layer (written back, started afresh)
# past EVICT_HIGH% of an UPPER_SIZE tmpfs.
#
# The tree (on disk, /var/tmp): FILES files of random data in 256
# directories, TOTAL_MIB in all. `apply` is timed as a whole process (fork,
# spec, observe, plan, mounts, records) RUNS times, each after a `down`.
# Churn: for CHURN seconds a writer rewrites random existing files (each a
# copy-up into RAM), creates new ones and deletes some, through the overlay,
# RATE operations a second; the upper layer's use (`status --format json`)
# is printed every second. A write the full tmpfs refuses is counted.
# Each run is in a private mount namespace with a state directory of its own.
#
# Usage: sudo bench/overlay.sh     (env: FILES TOTAL_MIB RUNS CHURN RATE SYNC_EVERY
#                                   EVICT UPPER_SIZE EVICT_HIGH EVICT_LOW BIN)
set -euo pipefail
if [ "${TMPFSCTL_BENCH_INNER:-}" != 1 ]; then
    cd "$(dirname "$0")/.."
    [ -n "${BIN:-}" ] || cargo build --release --quiet
    exec env TMPFSCTL_BENCH_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
FILES=${FILES:-100000}
TOTAL_MIB=${TOTAL_MIB:-2048}
RUNS=${RUNS:-5}
CHURN=${CHURN:-30}
RATE=${RATE:-300}
SYNC_EVERY=${SYNC_EVERY:-5}
EVICT=${EVICT:-1}
UPPER_SIZE=${UPPER_SIZE:-128MiB}
EVICT_HIGH=${EVICT_HIGH:-70}
EVICT_LOW=${EVICT_LOW:-20}
BIN=${BIN:-$PWD/target/release/tmpfsctl}
WORK=$(mktemp -d /var/tmp/tmpfsctl-overlay-bench-XXXXXX)
export TMPFSCTL_STATE_DIR="$WORK/state"
cleanup() {
    [ -z "${agent:-}" ] || kill "$agent" 2>/dev/null || true
    for s in "$WORK"/*.yaml; do
        [ -e "$s" ] && "$BIN" down "$s" >/dev/null 2>&1 || true
    done
    for d in "$WORK"/state/*; do umount -R -l "$d" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir "$WORK/cache"

python3 - "$WORK/cache" "$FILES" "$TOTAL_MIB" <<'EOF'
import os, sys
root, files, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) << 20
each = total // files
block = os.urandom(1 << 20)
for d in range(256):
    os.mkdir(os.path.join(root, "%02x" % d))
for i in range(files):
    off = (i * 7919) % ((1 << 20) - each) if each < (1 << 20) else 0
    with open(os.path.join(root, "%02x" % (i % 256), "f%06d" % i), "wb") as f:
        f.write(block[off:off + each])
EOF
sync
echo "tree: $FILES files, $(du -sh "$WORK/cache" | cut -f1) in 256 directories; $(uname -r)"

spec() { # name seed size [a line more]
    cat >"$WORK/$1.yaml" <<EOF
version: 1
mounts:
  - name: $1
    path: $WORK/cache
    size: $3
    seed: $2
    persist: on-stop
${4:-}
EOF
    echo "$WORK/$1.yaml"
}
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

ov=$(spec ov overlay 1GiB)
times=()
for _ in $(seq "$RUNS"); do
    t=$(date +%s%N)
    "$BIN" apply "$ov" >/dev/null
    times+=("$(ms "$t")")
    "$BIN" down "$ov" >/dev/null
done
echo "apply, seed: overlay: ${times[*]} ms"

if [ "${COPY:-1}" = 1 ]; then
    cp=$(spec cp copy "$(( TOTAL_MIB * 2 ))MiB")
    t=$(date +%s%N)
    "$BIN" apply "$cp" >/dev/null
    echo "apply, seed: copy (once, for comparison): $(ms "$t") ms"
    "$BIN" down "$cp" >/dev/null
fi

cat >"$WORK/churn.py" <<'EOF'
import errno, json, os, random, subprocess, sys, time
root, files, churn, binary, spec, every, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], float(sys.argv[6]), float(sys.argv[7])
# Another sequence per phase: the second would find deleted what the first deleted.
rnd = random.Random(1 + int(every))
data = os.urandom(64 << 10)
def used():
    s = json.loads(subprocess.run([binary, "status", "--format", "json", spec], capture_output=True, check=True).stdout)
    # Absent for the moment of an eviction's switch.
    return (s["mounts"][0].get("usage") or {}).get("used", 0)
# every 0: no write-backs here (the agent evicts).
start = time.time(); next_tick = start + 1; next_sync = start + every if every > 0 else float("inf")
peak = 0
ops = rewrites = creates = deletes = full = 0
print("  s  upper used   ops  (rewrites/creates/deletes/refused as full so far)")
while time.time() - start < churn:
    time.sleep(max(0.0, start + ops / rate - time.time()))
    i = rnd.randrange(files); p = os.path.join(root, "%02x" % (i % 256), "f%06d" % i)
    r = rnd.random()
    try:
        if r < 0.6:
            with open(p, "r+b") as f:
                f.write(data[: rnd.randrange(1, 4096)]); rewrites += 1
        elif r < 0.9:
            with open(p + ".n%d" % ops, "wb") as f:
                f.write(data[: rnd.randrange(1, 64 << 10)]); creates += 1
        else:
            os.unlink(p); deletes += 1
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        full += 1
    ops += 1
    now = time.time()
    if now >= next_sync:
        t = time.time()
        r = json.loads(subprocess.run([binary, "sync", "--format", "json", spec], capture_output=True, check=True).stdout)[0]["stats"]
        print("     sync: %.2f s, %d files (%.1f MiB) written, %d removed" % (time.time() - t, r["files_written"], r["bytes_written"] / 2**20, r["deleted"]))
        next_sync = time.time() + every
    if now >= next_tick:
        u = used(); peak = max(peak, u)
        print("%3d  %8.1f MiB  %6d  (%d/%d/%d/%d)" % (now - start, u / 2**20, ops, rewrites, creates, deletes, full))
        next_tick = start + int(now - start) + 1
print("upper layer at most %.1f MiB (sampled each second); %d writes refused as full" % (peak / 2**20, full))
EOF
"$BIN" apply "$ov" >/dev/null
echo "churn, a write-back every ${SYNC_EVERY}s:"
python3 "$WORK/churn.py" "$WORK/cache" "$FILES" "$CHURN" "$BIN" "$ov" "$SYNC_EVERY" "$RATE"
t=$(date +%s%N)
"$BIN" down "$ov" >/dev/null
echo "down after churn (final write-back, switch, unmount): $(ms "$t") ms"

[ "$EVICT" = 1 ] || exit 0
ev=$(spec ev overlay "$UPPER_SIZE" "    watchdog: { high: $EVICT_HIGH%, low: $EVICT_LOW%, action: evict }")
"$BIN" apply "$ev" >/dev/null
"$BIN" agent "$ev" --metrics "$WORK/metrics.prom" --interval 200ms 2>"$WORK/agent.log" &
agent=$!
echo "churn, the agent evicting past $EVICT_HIGH% of $UPPER_SIZE (down to $EVICT_LOW%):"
python3 "$WORK/churn.py" "$WORK/cache" "$FILES" "$CHURN" "$BIN" "$ev" 0 "$RATE"
kill "$agent"
wait "$agent" || true
agent=
grep -o 'upper layer written back and started afresh.*' "$WORK/agent.log" | sed 's/ mount=.*//; s/^/  agent: /' || true
t=$(date +%s%N)
"$BIN" down "$ev" >/dev/null
echo "down after churn: $(ms "$t") ms"
