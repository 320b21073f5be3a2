#!/usr/bin/env bash
# End-to-end: `tmpfsctl advise` on nginx `proxy_cache` under wrk load (the
# setup of nginx_e2e.sh: an origin and a proxy on 127.0.0.1, 64 KiB objects),
# with the cache still on its disk directory and nginx's own `max_size` making
# its cache manager expire entries, as a configured cache does:
#
#   advise --format json  -> it saw nginx create, write, rename and delete;
#                            the advised size is at least the cache's peak, the
#                            room above high holds the peak write rate for twice
#                            the agent's reaction time, action evict
#   advise --spec         -> `tmpfsctl validate` accepts it
#   apply it, the agent   -> the same load: zero non-2xx responses, zero socket
#                            errors, no nginx errors in that phase but one
#                            kind: an entry gone before nginx's cache manager
#                            or a worker looked (the agent evicted it, or nginx
#                            raced with itself, as it does on disk when over its
#                            max_size), which nginx logs as `unlink()` or
#                            `stat() ... failed (2: No such file or directory)`;
#                            counted and shown
#
# Usage (as root):  bash tests/nginx_advise.sh [path/to/tmpfsctl]
# Needs nginx, wrk, curl and jq. Runs itself in a private mount namespace,
# E2E_SECONDS (default 8) per watch and load phase, loopback only; stops
# everything it started. The figures are printed, never compared with a speed.
set -euo pipefail

E2E=nginx_advise E2E_TOOLS="nginx wrk curl jq"
. "$(dirname "$0")/e2e_lib.sh"
AGENT=
E2E_SPECS=("$WORK/spec.yaml")
E2E_LOGS=(agent.log nginx-error.log wrk-watch.out wrk-offloaded.out advise.err)

mkdir -p "$WORK/cache"
chown www-data:www-data "$WORK/cache"
chmod 0700 "$WORK/cache"
e2e_origin_blob 65536
# A cache nginx keeps at 16 MiB itself: its cache manager deletes the least
# recently used entries above that.
e2e_nginx_conf "levels=1:2 keys_zone=c:16m max_size=16m inactive=1h use_temp_path=off"
e2e_load_lua 4000

log "nginx $(nginx -v 2>&1 | sed 's/.*\///'), proxy 127.0.0.1:$PROXY, $SECS s per phase"
e2e_start_nginx "http://127.0.0.1:$PROXY/obj/warmup"

# --- watch: the cache on its disk directory -------------------------------------
# nginx's cache manager first looks at the cache's size about 10 s after the
# start, later on a loaded machine: the watch begins once it is at work, when an
# entry the cache had 3 s into the load is gone. wrk runs until both watches are
# done and then stops on SIGINT, printing its figures.
e2e_start_load watch $((2 * SECS + 90))
sleep 3
# Cache entries only (their names are 32 hex digits), not nginx's temporaries.
find "$WORK/cache" -type f -regextype posix-extended -regex '.*/[0-9a-f]{32}' >"$WORK/early-files"
[ -s "$WORK/early-files" ] || fail "nginx cached nothing in the first 3 s of the load"
# It removes in bursts, about 10 s apart, as long as the cache is above
# max_size: the watch has to start within the first.
polls=0
while xargs -d '\n' stat -c %i <"$WORK/early-files" >/dev/null 2>&1; do
    [ "$polls" -lt 300 ] || fail "nginx's cache manager removed nothing in 60 s"
    sleep 0.2
    polls=$((polls + 1))
done
log "watch: nginx's cache manager at work after $((3 + polls / 5)) s of load"
"$BIN" advise "$WORK/cache" --for "${SECS}s" --format json >"$WORK/advise.json" 2>"$WORK/advise.err" ||
    fail "advise exited with $?"
"$BIN" advise "$WORK/cache" --for "${SECS}s" --spec >"$WORK/spec.yaml" 2>>"$WORK/advise.err" ||
    fail "advise --spec exited with $?"
kill -INT "$WRK"
e2e_check_load watch

j() { jq -r "$1" "$WORK/advise.json"; }
log "watch: $(j '.activity.total | "\(.creates) creates, \(.writes) files written, \(.renames) renames, \(.deletes) deletes, \(.bytes_written) bytes"') in $(j '.seconds | floor') s"
log "watch: tree peak $(j .tree.peak_bytes) bytes, $(j .tree.peak_inodes) inodes; peak 1 s $(j .activity.peak_1s.bytes_written) bytes"
log "advice: $(j '.advice.entry | "size \(.size), inodes \(.inodes), high \(.high)%, low \(.low)%, action \(.action | join(",")), persist \(.persist)"')"
[ "$(j .activity.total.creates)" -gt 0 ] || fail "advise saw no creates"
[ "$(j .activity.total.bytes_written)" -gt 0 ] || fail "advise saw no bytes written"
[ "$(j .activity.total.deletes)" -gt 0 ] || fail "advise saw no deletes (nginx's cache manager)"
[ "$(j .advice.entry.size)" -ge "$(j .tree.peak_bytes)" ] || fail "the advised size is below the cache's peak"
# The room above high holds the peak second's writes for 2 × 15 ms.
room_ok=$(jq '(.advice.entry.size * (100 - .advice.entry.high) / 100) >= (.activity.peak_1s.bytes_written * 0.03)' "$WORK/advise.json")
[ "$room_ok" = true ] || fail "the room above high is too small for the peak write rate"
[ "$(j '.advice.entry.action | join(",")')" = evict ] || fail "nginx's cache is volatile: evict expected"
"$BIN" validate "$WORK/spec.yaml" >/dev/null || fail "validate refused the advised spec: $(cat "$WORK/spec.yaml")"
log "spec: valid"

# --- the advised mount under the agent, same load ---------------------------------
seen=$(wc -l <"$WORK/nginx-error.log")
"$BIN" apply "$WORK/spec.yaml" >/dev/null || fail "apply of the advised spec"
[ "$(findmnt -rn -o FSTYPE "$WORK/cache")" = tmpfs ] || fail "the cache is not on tmpfs"
"$BIN" agent "$WORK/spec.yaml" --metrics off --interval 500ms >>"$WORK/agent.log" 2>&1 &
AGENT=$!
e2e_track "$AGENT"
e2e_start_load offloaded "$SECS"
e2e_check_load offloaded
kill -0 "$AGENT" 2>/dev/null || fail "the agent exited"
gone='\(unlink\|stat\)() .* failed (2: No such file or directory)'
tail -n +$((seen + 1)) "$WORK/nginx-error.log" >"$WORK/nginx-offloaded.log"
both=$(grep -c "\[crit\].*$gone" "$WORK/nginx-offloaded.log" || true)
bad=$(grep '\[crit\]\|\[alert\]\|\[emerg\]' "$WORK/nginx-offloaded.log" | grep -vc "$gone" || true)
log "offloaded: $both entries gone before nginx looked, $bad other nginx errors"
[ "$bad" = 0 ] || fail "nginx logged $bad errors"
log "offloaded: $(df --output=used,size -B1 "$WORK/cache" | tail -1 | awk '{ printf "%d of %d bytes used", $1, $2 }')"
log "passed"
echo "nginx_advise: 1 passed, 0 failed"
