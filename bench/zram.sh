#!/usr/bin/env bash
# `backend: zram` against tmpfs on a text-heavy cache: the RAM the same tree
# takes on each (capacity per byte of RAM), and the time to write it (apply's
# seed) and to read it back (every file once, its page cache dropped first
# with POSIX_FADV_DONTNEED: for zram the read decompresses, for tmpfs the
# pages are the storage and stay).
#
# The tree (on disk, /var/tmp): FILES files, a third each of HTML pages,
# JSON API answers and PHP session files, 1-16 KiB, made of English words
# drawn with their frequencies in the comments and docstrings of Python's
# standard library, with numbers and ids mixed in. RAM is the tmpfs's used blocks (statvfs; its
# pages) and zram's mem_used_total (mm_stat) after a sync, allocator included.
# Each backend is applied with the built tmpfsctl, in a private mount
# namespace and a state directory of its own; `down` removes the zram device
# it made.
#
# Usage: sudo bench/zram.sh            (env: FILES RUNS COMPRESSION)
# Prints, per mount, the medians and their ratio to tmpfs: capacity per byte
# of RAM (higher is better), seed and read time (lower is better).
set -euo pipefail
if [ "${TMPFSCTL_BENCH_INNER:-}" != 1 ]; then
    cd "$(dirname "$0")/.."
    cargo build --release --quiet
    exec env TMPFSCTL_BENCH_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
FILES=${FILES:-30000}
RUNS=${RUNS:-3}
COMPRESSION=${COMPRESSION:-lz4}
BIN=${BIN:-$PWD/target/release/tmpfsctl}
WORK=$(mktemp -d /var/tmp/tmpfsctl-zram-bench-XXXXXX)
cleanup() {
    for s in "$WORK"/*.yaml; do
        [ -e "$s" ] && TMPFSCTL_STATE_DIR="$WORK/state" "$BIN" down "$s" >/dev/null 2>&1 || true
    done
    for d in "$WORK"/state/*; do umount -R -l "$d" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir "$WORK/cache"

python3 - "$WORK/cache" "$FILES" <<'EOF'
import os, random, sys, json
root, n = sys.argv[1], int(sys.argv[2])
rnd = random.Random(1)
# Real words with their real frequencies (Zipf-like), from the English in
# Python's standard library: per 4 KiB page, text compresses as pages do.
import collections, glob, itertools, re
counts = collections.Counter()
for f in sorted(glob.glob("/usr/lib/python3*/*.py"))[:300]:
    counts.update(re.findall(r"[a-z]{2,}", open(f, errors="ignore").read().lower()))
vocab, weights = zip(*counts.most_common(5000))
cum = list(itertools.accumulate(weights))
def words(k):
    return " ".join(rnd.choices(vocab, cum_weights=cum, k=k))
for i in range(n):
    d = os.path.join(root, f"{i % 256:02x}")
    os.makedirs(d, exist_ok=True)
    size = int(1024 * 2 ** rnd.uniform(0, 4))
    kind = i % 3
    if kind == 0:
        body, parts = "", []
        while len(body) < size:
            parts.append(f'<div class="item-{rnd.randint(1, 40)}"><h2>{words(4)}</h2><p>{words(30)}</p><a href="/p/{rnd.randint(1, 10**6)}">{words(2)}</a></div>\n')
            body = "".join(parts)
        text = f"<!DOCTYPE html><html><head><title>{words(5)}</title></head><body>\n{body}</body></html>\n"
    elif kind == 1:
        items = []
        while len(json.dumps(items)) < size:
            items.append({"id": rnd.randint(1, 10**9), "name": words(3), "price": round(rnd.uniform(1, 500), 2),
                          "tags": [rnd.choice(vocab) for _ in range(4)], "description": words(20)})
        text = json.dumps({"status": "ok", "items": items}, indent=1)
    else:
        fields = []
        while sum(map(len, fields)) < size:
            k = rnd.choice(vocab)
            fields.append(f'{k}|s:{rnd.randint(5, 60)}:"{words(rnd.randint(2, 12))}";')
        text = "".join(fields)
    with open(os.path.join(d, f"f{i}.{['html', 'json', 'sess'][kind]}"), "w") as f:
        f.write(text[:size])
EOF
sync -f "$WORK/cache"
data=$(du -s --apparent-size -B1 "$WORK/cache" | cut -f1)
echo "tree: $FILES files, $((data >> 20)) MiB apparent"

drop_and_read() {
    python3 - "$1" <<'EOF'
import os, sys, time
files = [os.path.join(d, f) for d, _, fs in os.walk(sys.argv[1]) for f in fs]
for p in files:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
t = time.perf_counter()
for p in files:
    with open(p, "rb") as f:
        while f.read(1 << 20):
            pass
print(f"{time.perf_counter() - t:.3f}")
EOF
}

median() {
    sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

size=$((data * 3 / 1048576 + 64))MiB
# Three mounts of the same tree: a tmpfs, zram with ext4 (`fs: ext4`, the
# default) and zram with btrfs compressing by itself (`fs: btrfs`); one run of
# each per round, in turn.
VARIANTS="tmpfs zram-ext4 zram-btrfs"
for v in $VARIANTS; do
    case $v in
        tmpfs) extra="    inodes: $((FILES * 2))\n    backend: tmpfs" ;;
        zram-ext4) extra="    inodes: $((FILES * 2))\n    backend: zram\n    compression: $COMPRESSION\n    fs: ext4" ;;
        zram-btrfs) extra="    backend: zram\n    compression: $COMPRESSION\n    fs: btrfs" ;;
    esac
    printf "version: 1\nmax_total: 90%%\nmounts:\n  - name: bench\n    path: %s\n    size: %s\n$extra\n" \
        "$WORK/cache" "$size" > "$WORK/$v.yaml"
done
export TMPFSCTL_STATE_DIR="$WORK/state"
for run in $(seq "$RUNS"); do
    for v in $VARIANTS; do
        seed=$("$BIN" apply --format json "$WORK/$v.yaml" | python3 -c 'import json,sys; print(json.load(sys.stdin)["mounts"][0]["seeded"]["seconds"])')
        sync -f "$WORK/cache"
        ram=$("$BIN" status --format json "$WORK/$v.yaml" | python3 -c '
import json, sys
m = json.load(sys.stdin)["mounts"][0]
print(m["compressed"]["ram_used"] if "compressed" in m else m["usage"]["used"])')
        read=$(drop_and_read "$WORK/cache")
        "$BIN" down "$WORK/$v.yaml" >/dev/null
        echo "$v $run seed ${seed}s read ${read}s ram $((ram >> 10)) KiB" >&2
        echo "$seed" >> "$WORK/$v.seed"
        echo "$read" >> "$WORK/$v.read"
        echo "$ram" >> "$WORK/$v.ram"
    done
done

echo
echo "mount       RAM (MiB)  data/RAM  capacity vs tmpfs  seed (s)  vs tmpfs  read (s)  vs tmpfs   (medians of $RUNS; zram: $COMPRESSION)"
for v in $VARIANTS; do
    awk -v v="$v" -v d="$data" \
        -v ram="$(median < "$WORK/$v.ram")" -v s="$(median < "$WORK/$v.seed")" -v r="$(median < "$WORK/$v.read")" \
        -v tram="$(median < "$WORK/tmpfs.ram")" -v ts="$(median < "$WORK/tmpfs.seed")" -v tr="$(median < "$WORK/tmpfs.read")" \
        'BEGIN { printf "%-11s %9.1f %9.2f %17.2fx %9.2f %8.2fx %9.3f %8.2fx\n", v, ram / 1048576, d / ram, tram / ram, s, s / ts, r, r / tr }'
done
