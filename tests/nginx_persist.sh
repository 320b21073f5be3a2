#!/usr/bin/env bash
# End-to-end, "no write lost" with `persist`: nginx `proxy_cache` and a
# second application that logs every change it makes (tests/e2e_churn.py:
# files written under a temporary name and renamed into place, replaced,
# deleted, renamed) share one managed directory with `persist: on-stop`,
# under wrk load, while tmpfsctl runs
#
#   apply (seeded from disk), sync x3, down, apply (seeded again), sync, down
#
# with the applications working through all of it. Then, with everything
# stopped and the directory back on disk:
#
#   1 the churn's log replayed gives the exact set of names that must exist:
#     lost 0, resurrected 0, no torn or foreign content (files holding an
#     older version of their own name, the documented stale-view conflict,
#     are counted and shown)
#   2 nginx, started again on the disk directory, answers HIT for every key
#     it cached on disk before the first apply (seeded, written back) and
#     for every key it cached in RAM after it (written back by sync/down)
#   3 zero non-2xx responses and socket errors under load, no nginx error but
#     the known one of a response in flight at a switch; no write-back
#     temporaries, no held tmpfs, no mount left
#
# Usage (as root):  bash tests/nginx_persist.sh [path/to/tmpfsctl]
# Needs nginx, wrk, curl and python3. Private mount namespace, loopback only,
# about 40 s; stops everything it started. E2E_BREAK=drop or copy breaks the
# write-back on purpose (tests/e2e_lib.sh): the checks must then fail.
set -euo pipefail

E2E=nginx_persist E2E_TOOLS="nginx wrk curl python3" E2E_TIMEOUT=150
. "$(dirname "$0")/e2e_lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
e2e_persist_spec e2e-nginxp
E2E_LOGS=(tmpfsctl.log nginx-error.log wrk-load.out churn.out)
CHURN=

mkdir -p "$CACHE/churn"
chown www-data:www-data "$CACHE"
chmod 0755 "$CACHE"
e2e_origin_blob 16384
e2e_nginx_conf "levels=1:2 keys_zone=c:16m max_size=1g inactive=1h use_temp_path=off" "$CACHE/nginx"
e2e_load_lua 3000

churn() { python3 "$HERE/e2e_churn.py" "$@"; }
start_churn() {
    python3 "$HERE/e2e_churn.py" run "$CACHE/churn" "$WORK/churn.log" --seed "$1" >>"$WORK/churn.out" 2>&1 &
    CHURN=$!
    e2e_track "$CHURN"
}
stop_churn() { e2e_stop "$CHURN"; CHURN=; }

log "nginx $(nginx -v 2>&1 | sed 's/.*\///'), proxy 127.0.0.1:$PROXY, tmpfsctl $("$BIN" --version)"

# --- on disk: nginx caches /pre/*, the churn makes its first files --------------
e2e_start_nginx "$(e2e_url warmup)"
e2e_fetch pre 100 >/dev/null
churn run "$CACHE/churn" "$WORK/churn.log" --seconds 1 --seed 1 >>"$WORK/churn.out"
ondisk=$(e2e_count_files "$CACHE")

# --- apply: seeded; nginx caches /ram/* in RAM ------------------------------------
e2e_step apply "$SPEC" "$NAME" "$CACHE"
seeded=$(e2e_count_files "$CACHE")
log "seed: $seeded files in RAM, $ondisk on disk before"
[ "$seeded" = "$ondisk" ] || e2e_problem "the seed copied $seeded of $ondisk files"
hits=$(e2e_fetch pre 100)
log "after apply: $hits of 100 keys cached on disk are HITs from RAM"
if [ "$hits" = 100 ]; then e2e_pass "seeded: every key nginx cached on disk is a HIT from RAM"
else e2e_problem "only $hits of 100 keys cached on disk are HITs after the seed"; fi
e2e_fetch ram 200 >/dev/null

# --- under load: sync x3, down, apply, sync, down ------------------------------------
start_churn 2
e2e_start_loop load
e2e_persist_cycle "$SPEC" "$NAME" "$CACHE"
stop_churn
e2e_check_loop load
kill -QUIT "$NGINX"
wait "$NGINX" || true
e2e_stop "$NGINX"

# --- checks, on disk ----------------------------------------------------------------
e2e_check_on_disk "$CACHE" "at the end"
log "churn: $(grep -h '=' "$WORK/churn.out" | tr '\n' ' ')"
if churn check "$CACHE/churn" "$WORK/churn.log" "$WORK/apply-windows" >"$WORK/churn-check.out"; then
    e2e_pass "churn: $(head -1 "$WORK/churn-check.out")"
else
    cat "$WORK/churn-check.out" >&2
    e2e_problem "churn: the disk directory is not what the application left: $(head -1 "$WORK/churn-check.out")"
fi

e2e_start_nginx "$(e2e_url warmup2)"
pre=$(e2e_fetch pre 100)
ram=$(e2e_fetch ram 200)
log "nginx restarted on disk: $pre of 100 keys cached before the apply and $ram of 200 cached in RAM are HITs"
if [ "$pre" = 100 ] && [ "$ram" = 200 ]; then e2e_pass "nginx on disk: every key cached before the load is a HIT"
else e2e_problem "nginx lost cached keys: pre $pre/100, ram $ram/200 HITs"; fi

inflight=$(grep -c '\[crit\].*(2: No such file or directory) while reading upstream' "$WORK/nginx-error.log" || true)
other=$(grep '\[crit\]\|\[alert\]\|\[emerg\]' "$WORK/nginx-error.log" |
    grep -vc '(2: No such file or directory) while reading upstream' || true)
log "nginx: $inflight responses in flight at a switch (not cached), $other other errors"
if [ "$other" = 0 ]; then e2e_pass "nginx logged no other error"; else e2e_problem "nginx logged $other errors"; fi
e2e_finish
