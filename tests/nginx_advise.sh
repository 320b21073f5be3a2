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

if [ -z "${TMPFSCTL_E2E_NS:-}" ]; then
    exec env TMPFSCTL_E2E_NS=1 timeout --kill-after=10 180 \
        unshare --mount --propagation private bash "$0" "$@"
fi

BIN=$(realpath "${1:-${TMPFSCTL:-target/debug/tmpfsctl}}")
SECS=${E2E_SECONDS:-8}
for tool in nginx wrk curl jq; do
    command -v "$tool" >/dev/null || { echo "nginx_advise: $tool is not installed" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "nginx_advise: no tmpfsctl binary at $BIN (cargo build first)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/tmpfsctl-advise.XXXXXX)
export TMPFSCTL_STATE_DIR=$WORK/state
PROXY=$((20000 + $$ % 20000))
ORIGIN=$((PROXY + 1))
AGENT=
NGINX=
WRK=

log() { printf '%s nginx_advise: %s\n' "$(date +%T)" "$*"; }

cleanup() {
    set +e
    [ -n "$WRK" ] && kill "$WRK" 2>/dev/null && wait "$WRK" 2>/dev/null
    [ -n "$AGENT" ] && kill -TERM "$AGENT" 2>/dev/null && wait "$AGENT" 2>/dev/null
    [ -n "$NGINX" ] && kill -QUIT "$NGINX" 2>/dev/null && wait "$NGINX" 2>/dev/null
    [ -f "$WORK/spec.yaml" ] && "$BIN" down "$WORK/spec.yaml" >/dev/null 2>&1
    findmnt -rn -o TARGET | grep "^$WORK" | sort -r | xargs -r -n1 umount -l 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
    echo "nginx_advise: FAILED: $*" >&2
    for f in agent.log nginx-error.log wrk.out advise.err; do
        [ -f "$WORK/$f" ] && { echo "--- $f (last 40 lines)" >&2; tail -n 40 "$WORK/$f" >&2; }
    done
    exit 1
}

mkdir -p "$WORK"/{cache,origin,tmp,logs}
chown www-data:www-data "$WORK/cache" "$WORK/tmp"
chmod 0700 "$WORK/cache"
chmod 0755 "$WORK"
head -c 65536 /dev/urandom > "$WORK/origin/blob"
chmod -R a+rX "$WORK/origin"

cat > "$WORK/nginx.conf" <<EOF
user www-data;
worker_processes 2;
daemon off;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $WORK/tmp/body;
    proxy_temp_path $WORK/tmp/proxy;
    fastcgi_temp_path $WORK/tmp/fastcgi;
    uwsgi_temp_path $WORK/tmp/uwsgi;
    scgi_temp_path $WORK/tmp/scgi;
    # A cache nginx keeps at 16 MiB itself: its cache manager deletes the least
    # recently used entries above that.
    proxy_cache_path $WORK/cache levels=1:2 keys_zone=c:16m max_size=16m inactive=1h use_temp_path=off;
    server {
        listen 127.0.0.1:$ORIGIN;
        root $WORK/origin;
        limit_rate 1m;
        location / { try_files /blob =404; }
    }
    server {
        listen 127.0.0.1:$PROXY;
        location / {
            proxy_pass http://127.0.0.1:$ORIGIN;
            proxy_cache c;
            proxy_cache_key \$uri;
            proxy_cache_valid 200 1h;
        }
    }
}
EOF

cat > "$WORK/load.lua" <<'EOF'
math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
request = function()
    return wrk.format("GET", "/obj/" .. math.random(1, 4000))
end
EOF

# $1: phase name, $2: seconds; wrk in the background
start_load() {
    wrk -t2 -c16 -d"$2s" --timeout 5s -s "$WORK/load.lua" "http://127.0.0.1:$PROXY/" \
        >"$WORK/wrk-$1.out" 2>&1 &
    WRK=$!
}

# $1: phase name; waits for wrk and checks for zero failed responses
check_load() {
    wait "$WRK" || fail "$1: wrk failed"
    WRK=
    local out=$WORK/wrk-$1.out total non2xx sockerr
    total=$(awk '/requests in/ { print $1 }' "$out")
    non2xx=$(awk -F': ' '/Non-2xx or 3xx responses/ { print $2 }' "$out")
    sockerr=$(grep -o 'Socket errors:.*' "$out" || true)
    log "$1: $total requests, non-2xx: ${non2xx:-0}, ${sockerr:-no socket errors}"
    [ "${total:-0}" -gt 100 ] || fail "$1: too few requests ($total)"
    [ -z "$non2xx" ] || fail "$1: $non2xx non-2xx responses"
    [ -z "$sockerr" ] || fail "$1: $sockerr"
}

log "nginx $(nginx -v 2>&1 | sed 's/.*\///'), proxy 127.0.0.1:$PROXY, $SECS s per phase"
nginx -p "$WORK" -c "$WORK/nginx.conf" &
NGINX=$!
for _ in $(seq 50); do
    curl -fsS -o /dev/null "http://127.0.0.1:$PROXY/obj/warmup" 2>/dev/null && break
    sleep 0.1
done

# --- watch: the cache on its disk directory -------------------------------------
# nginx's cache manager first looks at the cache's size 10 s after the start:
# the watch begins once it is at work.
start_load watch $((2 * SECS + 16))
sleep 12
"$BIN" advise "$WORK/cache" --for "${SECS}s" --format json >"$WORK/advise.json" 2>"$WORK/advise.err" ||
    fail "advise exited with $?"
"$BIN" advise "$WORK/cache" --for "${SECS}s" --spec >"$WORK/spec.yaml" 2>>"$WORK/advise.err" ||
    fail "advise --spec exited with $?"
check_load watch

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
start_load offloaded "$SECS"
check_load offloaded
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
