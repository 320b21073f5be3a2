#!/usr/bin/env bash
# Usage (as root): unshare --mount --propagation private bash tests/repro/seed_window.sh target/debug/tmpfsctl
# Not run by CI (no_write_lost::writes_during_seeding_are_seen_in_ram_and_their_deletion_sticks
# is): a reproduction of a bug the persisted end-to-end tests found, fixed by
# src/sync/seed_window.rs. Before, files the application wrote on disk while
# `apply` seeded were hidden under the tmpfs (the application did not see them
# while offloaded), and came back at `down` after it deleted them in RAM.
set -eu
BIN=$1
W=$(mktemp -d /tmp/seedwin.XXXXXX); export TMPFSCTL_STATE_DIR=$W/state
D=$W/cache; mkdir -p "$D/big" "$D/w"
for i in $(seq 20000); do echo "$i" > "$D/big/$i"; done     # a seed of ~1 s
printf 'version: 1\nmounts:\n  - name: seedwin\n    path: %s\n    size: 256MiB\n    persist: on-stop\n' "$D" > "$W/spec.yaml"
# the application: a new file every 5 ms, before, during and after the seed
( for i in $(seq 0 399); do echo "v1 $i" > "$D/w/f$i"; sleep 0.005; done ) &
sleep 0.2
"$BIN" apply "$W/spec.yaml" >"$W/apply.out" || { cat "$W/apply.out"; exit 1; }
wait
echo "the application wrote 400 files; it sees $(ls "$D/w" | wc -l) of them in RAM"
# the application rewrites each of its files (rename over) and then deletes it
for i in $(seq 0 399); do echo "v2 $i" > "$D/w/.t"; mv "$D/w/.t" "$D/w/f$i"; rm "$D/w/f$i"; done
echo "after it deleted all 400: $(ls "$D/w" | wc -l) in RAM"
"$BIN" down "$W/spec.yaml" >/dev/null
back=$(ls "$D/w" | wc -l)
echo "after down: $back files on disk (expected 0): $(ls "$D/w" | sort -t f -k2 -n | head -3 | tr '\n' ' ')..."
[ "$back" = 0 ] || echo "the first holds: $(head -1 "$D/w/$(ls "$D/w" | head -1)") (the version written during the seed)"
findmnt -rn -o TARGET | grep "^$W" | sort -r | xargs -r -n1 umount -l; rm -rf "$W"
[ "$back" = 0 ]
