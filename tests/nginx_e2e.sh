#!/usr/bin/env bash
# End-to-end: nginx `proxy_cache` on a tmpfsctl-managed directory, an origin
# (a second nginx server block) and wrk load, all on 127.0.0.1, while
# `tmpfsctl agent` acts on the cache as it fills past `high`:
#
#   phase evict:    action evict    -> zero non-2xx responses, zero socket errors,
#                                      the agent evicted, usage back under high
#   phase fallback: action fallback -> zero non-2xx responses, zero socket errors,
#                                      the cache is on its disk directory and nginx
#                                      keeps caching there
#
# Usage (as root):  bash tests/nginx_e2e.sh [path/to/tmpfsctl]
# Needs the Debian packages nginx and wrk. Runs itself in a private mount
# namespace (unshare --mount --propagation private), is bounded in time
# (E2E_SECONDS per load phase, default 8; the whole script well under 2
# minutes), talks to loopback only, and stops everything it started.
set -euo pipefail

E2E=nginx_e2e E2E_TOOLS="nginx wrk curl"
. "$(dirname "$0")/e2e_lib.sh"
AGENT=
E2E_SPECS=("$WORK/spec.yaml")
E2E_LOGS=(agent.log nginx-error.log wrk-evict.out wrk-fallback.out)

mkdir -p "$WORK/cache"
chown www-data:www-data "$WORK/cache"
chmod 0700 "$WORK/cache"
# 64 KiB objects: every URI is a distinct cache entry of the same file.
e2e_origin_blob 65536
# nginx's own limit is far away: tmpfsctl is what keeps the cache in bounds.
# The origin is slower than the cache (1 MB/s per response), as origins
# are: misses, and with them cache writes, come at up to 16 MB/s.
e2e_nginx_conf "levels=1:2 keys_zone=c:16m max_size=1g inactive=1h use_temp_path=off"
# Random objects out of 4000 (250 MiB in all): the 24 MiB cache keeps filling.
e2e_load_lua 4000

# $1: the watchdog line of the spec
write_spec() {
    cat > "$WORK/spec.yaml" <<EOF
version: 1
mounts:
  - name: e2e-nginx
    path: $WORK/cache
    size: 24MiB
    watchdog: $1
EOF
}

start_agent() {
    "$BIN" agent "$WORK/spec.yaml" --metrics "$WORK/metrics.prom" --interval 500ms \
        >>"$WORK/agent.log" 2>&1 &
    AGENT=$!
    e2e_track "$AGENT"
    for _ in $(seq 100); do
        grep -q 'state="offloaded"} 1' "$WORK/metrics.prom" 2>/dev/null && return 0
        kill -0 "$AGENT" 2>/dev/null || fail "the agent exited"
        sleep 0.1
    done
    fail "the cache was not offloaded"
}

stop_agent() {
    kill -TERM "$AGENT"
    local rc=0
    wait "$AGENT" || rc=$?
    e2e_stop "$AGENT"
    AGENT=
    [ "$rc" = 0 ] || fail "the agent exited with $rc on SIGTERM"
}

metric() { # $1: series; prints its value or 0
    awk -v s="$1" '$1 == s { print $2; found=1 } END { if (!found) print 0 }' "$WORK/metrics.prom"
}

# $1: phase name; runs wrk and checks for zero failed responses
load() {
    e2e_start_load "$1" "$SECS"
    e2e_check_load "$1"
}

log "nginx $(nginx -v 2>&1 | sed 's/.*\///'), proxy 127.0.0.1:$PROXY, origin 127.0.0.1:$ORIGIN, $SECS s per phase"

# --- phase 1: evict ---------------------------------------------------------
write_spec "{ warn: 50%, high: 80%, low: 50%, action: evict }"
start_agent
e2e_start_nginx "http://127.0.0.1:$PROXY/obj/warmup"
[ "$(stat -c %U "$WORK/cache")" = www-data ] || fail "the tmpfs root is not owned by www-data"
load evict
evictions=$(metric 'tmpfsctl_mount_actions_total{name="e2e-nginx",action="evict"}')
evicted=$(metric 'tmpfsctl_mount_evicted_files_total{name="e2e-nginx"}')
log "evict: $evictions evictions, $evicted files evicted"
[ "$evictions" -ge 1 ] || fail "evict: the agent never evicted"
used=$(df --output=pcent "$WORK/cache" | tail -1 | tr -dc 0-9)
[ "$used" -le 85 ] || fail "evict: the cache is at ${used}% after the run"
# Eviction never deletes a file nginx is writing (its temporary files), so
# nginx has nothing to complain about.
bad=$(grep -c '\[crit\]\|\[alert\]\|\[emerg\]' "$WORK/nginx-error.log" || true)
[ "$bad" = 0 ] || fail "evict: nginx logged $bad errors"
stop_agent

# --- phase 2: fallback -----------------------------------------------------------
# The same nginx keeps running: the agent is restarted with the new spec,
# and the full cache is emptied so the load crosses high again.
find "$WORK/cache" -type f -delete
write_spec "{ high: 60%, low: 30%, action: fallback }"
start_agent
load fallback
state=$(metric 'tmpfsctl_mount_state{name="e2e-nginx",state="fallback"}')
[ "$state" = 1 ] || fail "fallback: the mount did not fall back"
findmnt -rn "$WORK/cache" >/dev/null && fail "fallback: the tmpfs is still mounted on the cache"
log "fallback: $(grep -o 'fell back to the disk directory[^;]*' "$WORK/agent.log" | head -1)"
ondisk=$(find "$WORK/cache" -type f | wc -l)
log "fallback: the cache is on its disk directory with $ondisk files written by nginx since"
[ "$ondisk" -gt 0 ] || fail "fallback: nginx cached nothing on the disk directory"
curl -fsS -o /dev/null "http://127.0.0.1:$PROXY/obj/after-fallback" || fail "fallback: request after the run"
"$BIN" status "$WORK/spec.yaml" | grep -q "fell back" || fail "fallback: status does not say so"
stop_agent

# Responses nginx was caching at the moment of the detach were written to a
# temporary file in the tmpfs; moving it into place by name now fails
# (ENOENT: the name is on the disk directory), so nginx logs `crit` and does
# not cache that one response. The client got it in full (checked above).
# Anything else is an error.
inflight=$(grep -c '\[crit\].*(2: No such file or directory) while reading upstream' "$WORK/nginx-error.log" || true)
other=$(grep '\[crit\]\|\[alert\]\|\[emerg\]' "$WORK/nginx-error.log" |
    grep -vc '(2: No such file or directory) while reading upstream' || true)
log "fallback: $inflight nginx messages about in-flight cache files (not cached), $other other errors"
[ "$other" = 0 ] || fail "fallback: nginx logged errors"
log "passed"
echo "nginx_e2e: 2 passed, 0 failed"
