#!/usr/bin/env bash
# Benchmarks of `tmpfsctl agent` (figures in docs/agent.md):
#
#   reaction  time from the write that crosses `high` to the eviction being
#             done, median (and p90, max) of TRIALS trials, with fanotify
#             wake-up and with polling alone (--no-fanotify, interval 1s)
#   idle      CPU (/proc/PID/task/*/schedstat) and RSS of an agent watching 20
#             idle mounts for IDLE_SECS (60) s, metrics off (IDLE_METRICS=PATH: on)
#   churn     a writer of 64 KiB files at RATE (100) MB/s into a 64 MiB mount with
#             evict (high 85%, low 60%) for CHURN_SECS (30) s: writes that failed
#             (ENOSPC), peak usage, and the time usage stayed at or above high each
#             time it got there (p50, p99, max): the agent's reaction under load
#
# Usage (as root): bash bench/agent_bench.sh [reaction|idle|churn|all] [path/to/tmpfsctl]
# Default binary: target/release/tmpfsctl (build it with `cargo build --release`).
# Needs python3 (timing, log parsing). Runs itself in a private mount
# namespace; cleans up after itself.
set -euo pipefail

if [ -z "${TMPFSCTL_BENCH_NS:-}" ]; then
    exec env TMPFSCTL_BENCH_NS=1 unshare --mount --propagation private bash "$0" "$@"
fi

WHAT=${1:-all}
BIN=$(realpath "${2:-${TMPFSCTL:-target/release/tmpfsctl}}")
TRIALS=${TRIALS:-25}
IDLE_SECS=${IDLE_SECS:-60}
[ -x "$BIN" ] || { echo "no tmpfsctl binary at $BIN" >&2; exit 1; }
WORK=$(mktemp -d /tmp/tmpfsctl-bench.XXXXXX)
export TMPFSCTL_STATE_DIR=$WORK/state
AGENT=
cleanup() {
    set +e
    [ -n "$AGENT" ] && kill -TERM "$AGENT" 2>/dev/null && wait "$AGENT" 2>/dev/null
    findmnt -rn -o TARGET | grep "^$WORK" | sort -r | xargs -r -n1 umount -l 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "tmpfsctl agent benchmark: $(uname -r), $(nproc) CPUs, binary $BIN"

reaction() { # $1: label, $2...: extra agent flags
    local label=$1
    shift
    rm -rf "${WORK:?}/r" && mkdir -p "$WORK/r/cache"
    cat > "$WORK/r/spec.yaml" <<EOF
version: 1
mounts:
  - name: bench
    path: $WORK/r/cache
    size: 64MiB
    watchdog: { warn: 60%, high: 80%, low: 50%, action: evict }
EOF
    "$BIN" agent "$WORK/r/spec.yaml" --metrics off "$@" >"$WORK/r/agent.log" 2>&1 &
    AGENT=$!
    for _ in $(seq 100); do
        grep -q "watching" "$WORK/r/agent.log" && break
        sleep 0.05
    done
    python3 - "$WORK/r/cache" "$WORK/r/agent.log" "$TRIALS" "$label" <<'EOF'
import os, sys, time, datetime, statistics, random
cache, log, trials, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
MIB = 1 << 20

def used():
    s = os.statvfs(cache)
    return (s.f_blocks - s.f_bfree) * s.f_frsize, s.f_blocks * s.f_frsize

def evictions():
    with open(log) as f:
        return [l for l in f if "evicted" in l]

def stamp(line):
    # 2026-11-30T12:07:22.072736Z
    t = line.split()[0].rstrip("Z")
    return datetime.datetime.fromisoformat(t).replace(tzinfo=datetime.timezone.utc).timestamp()

n = 0
out = []
for trial in range(trials):
    u, size = used()
    # Fill to 2 MiB below high (80%) without crossing it.
    while u + MIB <= size * 0.80 - 2 * MIB:
        with open(os.path.join(cache, f"p{n:06d}"), "wb") as f:
            f.write(b"\x01" * MIB)
        n += 1
        u, size = used()
    # Let the agent settle; with polling, land anywhere in its interval.
    time.sleep(0.3 if "poll" not in label else 0.3 + random.random())
    before = len(evictions())
    data = b"\x02" * (3 * MIB)
    t0 = time.time()
    with open(os.path.join(cache, f"x{n:06d}"), "wb") as f:
        f.write(data)           # this write crosses high
    n += 1
    deadline = t0 + 10
    while len(evictions()) == before:
        if time.time() > deadline:
            sys.exit(f"{label}: no eviction within 10 s")
        time.sleep(0.001)
    t1 = stamp(evictions()[before])
    out.append((t1 - t0) * 1000)

out.sort()
p90 = out[int(len(out) * 0.9) - 1]
print(f"{label}: {len(out)} trials, reaction median {statistics.median(out):.1f} ms, "
      f"p90 {p90:.1f} ms, min {out[0]:.1f} ms, max {out[-1]:.1f} ms")
EOF
    kill -TERM "$AGENT"; wait "$AGENT" || true; AGENT=
    "$BIN" down "$WORK/r/spec.yaml" >/dev/null 2>&1 || true
}

idle() {
    mkdir -p "$WORK/i"
    {
        echo "version: 1"
        echo "mounts:"
        for k in $(seq -w 1 20); do
            mkdir -p "$WORK/i/c$k"
            head -c 100000 /dev/urandom > "$WORK/i/c$k/seeded"
            printf '  - name: c%s\n    path: %s\n    size: 4MiB\n' "$k" "$WORK/i/c$k"
            printf '    watchdog: { high: 90%%, low: 50%%, action: evict }\n'
        done
    } > "$WORK/i/spec.yaml"
    "$BIN" agent "$WORK/i/spec.yaml" --metrics "${IDLE_METRICS:-off}" >"$WORK/i/agent.log" 2>&1 &
    AGENT=$!
    sleep 5 # start-up (20 applies) is not idle time
    python3 - "$AGENT" "$IDLE_SECS" <<'EOF'
import glob, os, sys, time
pid, secs = sys.argv[1], int(sys.argv[2])
def cpu():
    # Nanoseconds on a CPU, per thread, from the scheduler: short bursts between
    # two ticks count too (utime/stime ticks miss them).
    return sum(int(open(t).read().split()[0]) for t in glob.glob(f"/proc/{pid}/task/*/schedstat")) / 1e9
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1]) / 1024
c0, t0 = cpu(), time.time()
peak = rss()
for _ in range(secs):
    time.sleep(1)
    peak = max(peak, rss())
c1, t1 = cpu(), time.time()
print(f"idle, 20 mounts, {t1 - t0:.0f} s: CPU {100 * (c1 - c0) / (t1 - t0):.3f}% "
      f"({(c1 - c0) * 1000:.0f} ms of CPU), RSS {rss():.1f} MiB (peak {peak:.1f} MiB)")
EOF
    grep -c ": watching /" "$WORK/i/agent.log" | xargs -I{} echo "(the agent watched {} mounts)"
    kill -TERM "$AGENT"; wait "$AGENT" || true; AGENT=
    "$BIN" down "$WORK/i/spec.yaml" >/dev/null 2>&1 || true
}

churn() {
    rm -rf "${WORK:?}/c" && mkdir -p "$WORK/c/cache"
    cat > "$WORK/c/spec.yaml" <<EOF
version: 1
mounts:
  - name: churn
    path: $WORK/c/cache
    size: 64MiB
    watchdog: { high: 85%, low: 60%, action: evict }
EOF
    "$BIN" agent "$WORK/c/spec.yaml" --metrics off >"$WORK/c/agent.log" 2>&1 &
    AGENT=$!
    for _ in $(seq 100); do
        grep -q ": watching /" "$WORK/c/agent.log" && break
        sleep 0.05
    done
    python3 - "$WORK/c/cache" "${RATE:-100}" "${CHURN_SECS:-30}" <<'EOF'
import os, sys, time, threading
cache, rate, secs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
CHUNK = b"\x07" * (64 << 10)
per_file = len(CHUNK) / (rate * 1e6)
stop = False
samples = []  # (time, used fraction), every ~0.5 ms

def watch():
    while not stop:
        s = os.statvfs(cache)
        samples.append((time.monotonic(), (s.f_blocks - s.f_bfree) / s.f_blocks))
        time.sleep(0.0005)

t = threading.Thread(target=watch)
t.start()
written = failed = n = 0
start = time.monotonic()
while time.monotonic() - start < secs:
    due = start + n * per_file
    now = time.monotonic()
    if due > now:
        time.sleep(due - now)
    try:
        with open(os.path.join(cache, f"o{n:08d}"), "wb") as f:
            f.write(CHUNK)
        written += 1
    except OSError:
        failed += 1
    n += 1
elapsed = time.monotonic() - start
stop = True
t.join()
spells, above = [], None
for ts, u in samples:
    if u >= 0.85 and above is None:
        above = ts
    elif u < 0.85 and above is not None:
        spells.append((ts - above) * 1000)
        above = None
peak = max(u for _, u in samples)
spells.sort()
def q(p):
    return spells[min(len(spells) - 1, int(len(spells) * p))] if spells else float("nan")
print(f"churn: {written} files of 64 KiB in {elapsed:.1f} s ({written * len(CHUNK) / elapsed / 1e6:.0f} MB/s), "
      f"{failed} writes failed (ENOSPC), peak usage {100 * peak:.1f}%")
if spells:
    print(f"churn: {len(spells)} times at or above high 85%; time there: p50 {q(0.5):.1f} ms, "
          f"p99 {q(0.99):.1f} ms, max {spells[-1]:.1f} ms")
else:
    print("churn: never at or above high 85% (evicted early enough every time)")
EOF
    echo "(agent log: $(grep -c . "$WORK/c/agent.log") lines, $(grep -c evict "$WORK/c/agent.log") about evictions)"
    kill -TERM "$AGENT"; wait "$AGENT" || true; AGENT=
    "$BIN" down "$WORK/c/spec.yaml" >/dev/null 2>&1 || true
}

case $WHAT in
reaction)
    reaction "fanotify wake-up"
    reaction "polling alone (interval 1s)" --no-fanotify --interval 1s
    ;;
idle) idle ;;
churn) churn ;;
all)
    reaction "fanotify wake-up"
    reaction "polling alone (interval 1s)" --no-fanotify --interval 1s
    idle
    churn
    ;;
*) echo "usage: $0 [reaction|idle|churn|all] [tmpfsctl]" >&2; exit 2 ;;
esac
