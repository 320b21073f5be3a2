#!/usr/bin/env bash
# End-to-end, "no write lost" with `persist`, deletions on both sides: Apache
# mod_cache_disk (a reverse proxy in front of an nginx origin on 127.0.0.1)
# and htcacheclean, run every half second with a limit below what the load
# caches, share a managed directory with `persist: on-stop`, under wrk load:
#
#   (on disk: Apache caches /pre/*) apply (seeded), Apache caches /ram/*;
#   under load: sync x3, down, 3 s on disk, apply (seeded again), sync, down;
#   load continues on disk
#
# Apache and every htcacheclean run under one `strace -f`: their own
# successful creates, renames and deletions in the cache, replayed from the
# (empty) start, give the exact set of files that must be there at the end.
#
#   1 the replay against the disk directory: lost 0, resurrected 0 (what
#     htcacheclean deleted, in RAM or on disk, stays deleted; what Apache
#     wrote on either side is there)
#   2 Apache, started again on the disk directory, caches there (htcacheclean
#     keeps the cache at 4 MiB: most /pre and /ram entries are cleaned by
#     the end, so their HITs prove nothing)
#   3 zero non-2xx responses and socket errors under load; no write-back
#     temporaries, no held tmpfs, no mount left
#
# Usage (as root):  bash tests/apache_persist.sh [path/to/tmpfsctl]
# Needs apache2 (apache2, htcacheclean), nginx (the origin), wrk, curl,
# strace and python3. Private mount namespace, loopback only, about a
# minute; stops everything it started. E2E_BREAK=drop or copy breaks the
# write-back on purpose (tests/e2e_lib.sh): check 1 then fails.
set -euo pipefail

E2E=apache_persist E2E_TOOLS="apache2 htcacheclean nginx wrk curl strace python3" E2E_TIMEOUT=170
. "$(dirname "$0")/e2e_lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
e2e_persist_spec e2e-apache
E2E_LOGS=(tmpfsctl.log logs/error.log logs/traced.out nginx-error.log wrk-load.out)
E2E_CONNS=8
TRACED=

mkdir -p "$CACHE" "$WORK/logs"
chown www-data:www-data "$CACHE"
chmod 0750 "$CACHE"
e2e_origin_blob 16384
E2E_ORIGIN_RATE=4m E2E_ORIGIN_EXPIRES=1h e2e_nginx_conf ""
e2e_load_lua 1000
mods=/usr/lib/apache2/modules
cat > "$WORK/apache.conf" <<EOF
ServerRoot $WORK
LoadModule mpm_event_module $mods/mod_mpm_event.so
LoadModule authz_core_module $mods/mod_authz_core.so
LoadModule proxy_module $mods/mod_proxy.so
LoadModule proxy_http_module $mods/mod_proxy_http.so
LoadModule cache_module $mods/mod_cache.so
LoadModule cache_disk_module $mods/mod_cache_disk.so
Listen 127.0.0.1:$PROXY
ServerName e2e-apache
User www-data
Group www-data
PidFile $WORK/logs/apache.pid
DefaultRuntimeDir $WORK/logs
Mutex file:$WORK/logs default
ErrorLog $WORK/logs/error.log
LogLevel warn
StartServers 1
ServerLimit 2
ThreadsPerChild 16
MaxRequestWorkers 32
CacheRoot $CACHE
CacheEnable disk /
CacheDirLevels 2
CacheDirLength 1
CacheHeader on
CacheLock off
ProxyPass / http://127.0.0.1:$ORIGIN/
EOF

# Apache and an htcacheclean loop (4 MiB: well below the 16 MiB the load
# caches, so it deletes all the time; $2 if given), all under one strace.
start_traced() {
    strace -f -ttt -qq -o "$WORK/logs/strace.$1" \
        -e trace=open,openat,creat,mknod,mknodat,rename,renameat,renameat2,unlink,unlinkat,link,linkat,symlink,symlinkat \
        bash -c '
            apache2 -DFOREGROUND -f "$1/apache.conf" &
            trap "kill -TERM \$! 2>/dev/null; wait; exit 0" TERM
            while [ ! -e "$1/stop" ] && [ ! -e "$1/stop-traced" ]; do
                htcacheclean -t -p "$2" -l "$3"
                sleep 0.5
            done
            kill -TERM $!; wait' traced "$WORK" "$CACHE" "${2:-4M}" >>"$WORK/logs/traced.out" 2>&1 &
    TRACED=$!
    e2e_track "$TRACED"
    e2e_wait_url "$(e2e_url "warmup/$1")" || fail "apache does not answer"
}
stop_traced() {
    touch "$WORK/stop-traced"
    wait "$TRACED" || e2e_problem "apache or htcacheclean exited with $?"
    e2e_stop "$TRACED"
    TRACED=
    rm -f "$WORK/stop-traced"
}
listing() { (cd "$CACHE" && find . ! -type d -printf '%P\n' | sort); }

log "$(apache2 -v | head -1 | sed 's/.*: //'), proxy 127.0.0.1:$PROXY, origin 127.0.0.1:$ORIGIN"
e2e_start_nginx "http://127.0.0.1:$ORIGIN/warmup"
listing >"$WORK/initial"

# --- on disk: Apache caches /pre/* -----------------------------------------------
start_traced 1
e2e_fetch pre 100 >/dev/null
ondisk=$(e2e_count_files "$CACHE")

# --- apply (seeded), Apache caches /ram/*; under load: sync x3, down, apply, sync, down --
e2e_step apply "$SPEC" "$NAME" "$CACHE"
seeded=$(e2e_count_files "$CACHE")
log "seed: $seeded files in RAM ($ondisk on disk a moment before; htcacheclean works meanwhile)"
e2e_fetch ram 200 >/dev/null
e2e_start_loop load
e2e_persist_cycle "$SPEC" "$NAME" "$CACHE"
e2e_check_loop load
stop_traced

# --- checks, on disk ---------------------------------------------------------------------
e2e_check_on_disk "$CACHE" "at the end"
deletions=$(grep -c 'unlink' "$WORK/logs/strace.1" || true)
log "strace: $(wc -l <"$WORK/logs/strace.1") calls logged, $deletions deletions (htcacheclean and Apache)"
if E2E_WINDOWS=$WORK/apply-windows E2E_DOWNS=$WORK/down-windows python3 "$HERE/e2e_replay.py" "$CACHE" "$WORK/initial" "$WORK/logs/strace.1" >"$WORK/replay.out"; then
    e2e_pass "replay: $(head -1 "$WORK/replay.out")"
else
    cat "$WORK/replay.out" >&2
    e2e_problem "the disk directory is not what Apache and htcacheclean left: $(head -1 "$WORK/replay.out")"
fi

# Apache on the disk directory it was given back: it starts and caches there.
headers=$(find "$CACHE" -name '*.header' | wc -l)
datas=$(find "$CACHE" -name '*.data' | wc -l)
log "entries on disk: $headers .header, $datas .data"
# The cleaner's limit above what is cached: its first pass deleted the fresh
# entry before the second fetch in 2 of 40 runs.
start_traced 2 1G
e2e_fetch final 1 >/dev/null
hit=$(e2e_fetch final 1)
stop_traced
bad=$(grep -c '\[core:crit\]\|\[core:alert\]\|\[core:emerg\]\|AH00052' "$WORK/logs/error.log" || true)
if [ "$bad" = 0 ] && [ "$hit" = 1 ]; then e2e_pass "Apache restarted on disk, caches there, logged no critical error"
else e2e_problem "Apache on disk: $bad critical errors, HIT $hit of 1"; fi
e2e_finish
