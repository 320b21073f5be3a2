# Shared set-up of the end-to-end scripts (tests/*_e2e.sh, tests/nginx_advise.sh,
# tests/*_persist.sh): sourced, never run. The script sets E2E (its name, for
# messages) and E2E_TOOLS (the commands it needs), then sources this file with
# its own arguments:
#
#   E2E=nginx_e2e E2E_TOOLS="nginx wrk curl"
#   . "$(dirname "$0")/e2e_lib.sh"
#
# This re-runs the script in a private mount namespace (unshare --mount
# --propagation private) under a time limit, and sets BIN (the tmpfsctl
# binary: $1, $TMPFSCTL or target/debug/tmpfsctl), SECS (E2E_SECONDS, default
# 8), WORK (a fresh directory under /tmp, removed at exit), TMPFSCTL_STATE_DIR
# (WORK/state), PROXY and ORIGIN (loopback ports from the PID, so that two runs
# do not collide). At exit every process in E2E_PIDS is stopped (SIGTERM, or
# the signal in E2E_SIG_<pid>), e2e_cleanup_hook runs if the script defines
# it, every spec in E2E_SPECS is taken down and whatever is still mounted
# below WORK is detached.

if [ -z "${TMPFSCTL_E2E_NS:-}" ]; then
    exec env TMPFSCTL_E2E_NS=1 timeout --kill-after=10 "${E2E_TIMEOUT:-180}" \
        unshare --mount --propagation private bash "$0" "$@"
fi

BIN=$(realpath "${1:-${TMPFSCTL:-target/debug/tmpfsctl}}")
SECS=${E2E_SECONDS:-8}
for tool in $E2E_TOOLS; do
    command -v "$tool" >/dev/null || { echo "$E2E: $tool is not installed" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "$E2E: no tmpfsctl binary at $BIN (cargo build first)" >&2; exit 1; }

WORK=$(mktemp -d "/tmp/tmpfsctl-$E2E.XXXXXX")
export TMPFSCTL_STATE_DIR=$WORK/state
# Ports from the PID, so two runs on one machine do not collide: a pair, an even
# port and the next (runs started together have PIDs one apart; with one port
# per PID, one run's origin was the other's proxy), the next free pair where one
# is taken; below the kernel's ephemeral range (ip_local_port_range, 32768 and
# up by default), which the load's own client sockets take ports from.
low=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
PROXY=$((10000 + 2 * ($$ % ((low - 10002) / 2))))
for _ in $(seq 100); do
    command -v ss >/dev/null || break
    [ -z "$(ss -Htln "( sport = :$PROXY or sport = :$((PROXY + 1)) )")" ] && break
    PROXY=$((PROXY + 2 < low - 1 ? PROXY + 2 : 10000))
done
ORIGIN=$((PROXY + 1))
E2E_PIDS=()
E2E_SPECS=()
# Log files shown (their last 40 lines) when a check fails, relative to WORK.
E2E_LOGS=()
E2E_START=$(date +%s)

log() { printf '%s %s: %s\n' "$(date +%T.%3N)" "$E2E" "$*"; }

# $1: pid; started in the background by the caller, stopped at exit
e2e_track() { E2E_PIDS+=("$1"); }

# $1: pid, [$2: signal, TERM]: stops it now and forgets it; never fails
e2e_stop() {
    local pid=$1 sig=${2:-TERM} p rest=()
    { kill -"$sig" "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; } || true
    for p in "${E2E_PIDS[@]}"; do [ "$p" = "$pid" ] || rest+=("$p"); done
    E2E_PIDS=("${rest[@]}")
    return 0
}

e2e_cleanup() {
    set +e
    local i pid
    touch "$WORK/stop"
    for ((i = ${#E2E_PIDS[@]} - 1; i >= 0; i--)); do
        pid=${E2E_PIDS[i]}
        { kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; } || true
    done
    declare -F e2e_cleanup_hook >/dev/null && e2e_cleanup_hook
    for spec in "${E2E_SPECS[@]}"; do
        [ -f "$spec" ] && "$BIN" down "$spec" >/dev/null 2>&1
    done
    # Anything still mounted below WORK (the namespace dies with us anyway).
    findmnt -rn -o TARGET | grep "^$WORK" | sort -r | xargs -r -n1 umount -l 2>/dev/null
    # A zram device a failed `down` left (E2E_BACKEND=zram-*): only one
    # recorded in this run's state, and only while it is still that device.
    local rec n seq
    for rec in "$TMPFSCTL_STATE_DIR"/zram/zram*/device.json; do
        [ -f "$rec" ] || continue
        n=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["device"])' "$rec")
        seq=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["diskseq"])' "$rec")
        if [ "$(cat "/sys/block/zram$n/diskseq" 2>/dev/null)" = "$seq" ]; then
            echo 1 >"/sys/block/zram$n/reset" && echo "$n" >/sys/class/zram-control/hot_remove
        fi
    done
    # E2E_KEEP=DIR: a copy of everything (logs, the disk directory) for a post-mortem.
    [ -n "${E2E_KEEP:-}" ] && cp -a "$WORK" "$E2E_KEEP" && echo "$E2E: kept a copy in $E2E_KEEP" >&2
    rm -rf "$WORK"
}
trap e2e_cleanup EXIT

fail() {
    echo "$E2E: FAILED: $*" >&2
    local f
    for f in "${E2E_LOGS[@]}"; do
        [ -f "$WORK/$f" ] && { echo "--- $f (last 40 lines)" >&2; tail -n 40 "$WORK/$f" >&2; }
    done
    exit 1
}

# A failed check that does not stop the run: the rest still runs and counts,
# and e2e_finish reports it and exits 1.
E2E_PROBLEMS=()
E2E_PASSED=0
e2e_problem() {
    echo "$E2E: FAILED: $*" >&2
    E2E_PROBLEMS+=("$*")
}
e2e_pass() { E2E_PASSED=$((E2E_PASSED + 1)); log "ok: $*"; }
e2e_finish() {
    local p
    log "done in $(e2e_elapsed) s"
    if [ "${#E2E_PROBLEMS[@]}" != 0 ]; then
        for p in "${E2E_PROBLEMS[@]}"; do echo "$E2E: not ok: $p"; done
        echo "$E2E: $E2E_PASSED passed, ${#E2E_PROBLEMS[@]} failed"
        exit 1
    fi
    echo "$E2E: $E2E_PASSED passed, 0 failed"
}

# Seconds since the script started.
e2e_elapsed() { echo $(($(date +%s) - E2E_START)); }

# An origin and a caching proxy for nginx, or the origin alone.
#   $1: the proxy_cache_path arguments after the path ("" for the origin alone)
#   $2: the cache path (default WORK/cache)
# The origin serves one file, WORK/origin/blob, under every URI, at 1 MB/s a
# response (an origin is slower than the cache; E2E_ORIGIN_RATE), with
# `expires E2E_ORIGIN_EXPIRES` when that is set (Squid and Apache need a
# lifetime from the origin; nginx's proxy_cache_valid gives its own).
e2e_nginx_conf() {
    local cache_args=$1 cache=${2:-$WORK/cache} proxy=
    mkdir -p "$WORK/tmp" "$WORK/origin"
    chown www-data:www-data "$WORK/tmp"
    chmod 0755 "$WORK"
    if [ -n "$cache_args" ]; then
        proxy="
    proxy_cache_path $cache $cache_args;
    server {
        listen 127.0.0.1:$PROXY;
        location / {
            proxy_pass http://127.0.0.1:$ORIGIN;
            proxy_cache c;
            proxy_cache_key \$uri;
            proxy_cache_valid 200 1h;
            add_header X-Cache \$upstream_cache_status;
        }
    }"
    fi
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
    server {
        listen 127.0.0.1:$ORIGIN;
        root $WORK/origin;
        limit_rate ${E2E_ORIGIN_RATE:-1m};${E2E_ORIGIN_EXPIRES:+
        expires $E2E_ORIGIN_EXPIRES;}
        location / { try_files /blob =404; }
    }$proxy
}
EOF
}

# $1: bytes of the origin's object
e2e_origin_blob() {
    mkdir -p "$WORK/origin"
    head -c "$1" /dev/urandom > "$WORK/origin/blob"
    chmod -R a+rX "$WORK/origin"
}

# Starts nginx with WORK/nginx.conf (NGINX: its pid) and waits until $1 (a
# URL) answers.
e2e_start_nginx() {
    nginx -p "$WORK" -c "$WORK/nginx.conf" &
    NGINX=$!
    e2e_track "$NGINX"
    e2e_wait_url "$1" || fail "nginx does not answer $1"
}

# $1: URL; waits up to 10 s for a 2xx
e2e_wait_url() {
    for _ in $(seq 100); do
        curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# wrk's script: random objects /obj/1 .. /obj/$1.
e2e_load_lua() {
    cat > "$WORK/load.lua" <<EOF
math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
request = function()
    return wrk.format("GET", "/obj/" .. math.random(1, $1))
end
EOF
}

# $1: phase name, $2: seconds, [$3: URL, default the proxy]: wrk in the background (WRK: its pid)
e2e_start_load() {
    wrk -t2 -c"${E2E_CONNS:-16}" -d"$2s" --timeout 5s -s "$WORK/load.lua" "${3:-http://127.0.0.1:$PROXY/}" \
        >"$WORK/wrk-$1.out" 2>&1 &
    WRK=$!
    e2e_track "$WRK"
}

# $1: phase name; waits for wrk and checks for zero failed responses
e2e_check_load() {
    wait "$WRK" || fail "$1: wrk failed"
    e2e_stop "$WRK"
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

# Load until stopped, for phases whose length is not known in advance: wrk
# runs of 2 s one after the other until e2e_check_loop. $1: phase name
e2e_start_loop() {
    local name=$1
    (
        i=0
        while [ ! -e "$WORK/stop" ] && [ ! -e "$WORK/stop-$name" ]; do
            wrk -t2 -c"${E2E_CONNS:-16}" -d2s --timeout 5s -s "$WORK/load.lua" "${2:-http://127.0.0.1:$PROXY/}" \
                >"$WORK/wrk-$name.$i.out" 2>&1 || echo "wrk failed" >>"$WORK/wrk-$name.$i.out"
            i=$((i + 1))
        done
    ) &
    WRK=$!
    e2e_track "$WRK"
}

# $1: phase name; stops the loop and checks for zero failed responses
e2e_check_loop() {
    touch "$WORK/stop-$1"
    wait "$WRK" || true
    e2e_stop "$WRK"
    WRK=
    cat "$WORK/wrk-$1".*.out >"$WORK/wrk-$1.out"
    local out=$WORK/wrk-$1.out runs total non2xx sockerr
    runs=$(ls "$WORK/wrk-$1".*.out | wc -l)
    total=$(awk '/requests in/ { n += $1 } END { print n + 0 }' "$out")
    non2xx=$(awk -F': ' '/Non-2xx or 3xx responses/ { n += $2 } END { print n + 0 }' "$out")
    sockerr=$(grep -o 'Socket errors:.*' "$out" | sort | uniq -c | tr '\n' ';' || true)
    log "$1: $total requests in $runs wrk runs, non-2xx: $non2xx, ${sockerr:-no socket errors}"
    local n=${#E2E_PROBLEMS[@]}
    grep -q 'wrk failed' "$out" && e2e_problem "$1: wrk failed"
    [ "$total" -gt 100 ] || e2e_problem "$1: too few requests ($total)"
    [ "$non2xx" = 0 ] || e2e_problem "$1: $non2xx non-2xx responses"
    [ -z "$sockerr" ] || e2e_problem "$1: $sockerr"
    [ "${#E2E_PROBLEMS[@]}" != "$n" ] || e2e_pass "$1: every response 2xx, no socket error"
}

# --- persisted mounts -------------------------------------------------------

# $1: mount name: SPEC (WORK/spec.yaml, taken down at exit), NAME and CACHE
# (WORK/cache, the managed directory, created) for a 256 MiB mount with
# persist: on-stop; a tmpfs, or with E2E_BACKEND=zram-ext4 or zram-btrfs a
# zram device with that filesystem
e2e_persist_spec() {
    SPEC=$WORK/spec.yaml
    NAME=$1
    CACHE=$WORK/cache
    E2E_SPECS=("$SPEC")
    mkdir -p "$CACHE"
    printf 'version: 1\nmounts:\n  - name: %s\n    path: %s\n    size: 256MiB\n    persist: on-stop\n' \
        "$NAME" "$CACHE" >"$SPEC"
    case ${E2E_BACKEND:-tmpfs} in
        tmpfs) ;;
        zram-ext4 | zram-btrfs)
            printf '    backend: zram\n    fs: %s\n' "${E2E_BACKEND#zram-}" >>"$SPEC" ;;
        *) fail "E2E_BACKEND=$E2E_BACKEND: tmpfs, zram-ext4 or zram-btrfs" ;;
    esac
}

# The write-back under test can be broken on purpose, to see that the checks
# catch what it would do (E2E_BREAK, never set in CI):
#   drop  `sync` does nothing and `down` detaches the tmpfs without writing
#         it back: what the application wrote in RAM is lost
#   copy  `sync` does nothing and `down` copies the RAM over the disk (cp -a,
#         a mirror without deletions) and detaches it: what the application
#         deleted comes back
# $1: sync|down, $2: spec, $3: mount name, $4: managed path
e2e_tmpfsctl() {
    local cmd=$1 spec=$2 name=$3 path=$4
    case "${E2E_BREAK:-}:$cmd" in
    drop:sync | copy:sync) log "E2E_BREAK=$E2E_BREAK: sync skipped" ;;
    drop:down)
        log "E2E_BREAK=drop: the tmpfs is detached without a write-back"
        umount -l "$path"
        ;;
    copy:down)
        log "E2E_BREAK=copy: the RAM is copied over the disk, then detached"
        cp -a "$path/." "$TMPFSCTL_STATE_DIR/lower/$name/"
        umount -l "$path"
        ;;
    *) "$BIN" "$cmd" "$spec" >>"$WORK/tmpfsctl.log" 2>&1 ;;
    esac
}

# $1: directory; the write-back's temporaries (.tmpfsctl-wb.*) left in it
e2e_temporaries() {
    # The application removes directories meanwhile: what vanishes is not a temporary.
    { find "$1" -name '.tmpfsctl-wb.*' 2>/dev/null || true; } | wc -l
}

# $1: managed path, $2: when; a problem unless it is the disk directory again
# (no tmpfs on it, nothing held, no write-back temporaries)
e2e_check_on_disk() {
    local path=$1 n=${#E2E_PROBLEMS[@]} tmp
    [ "$(findmnt -rn -o FSTYPE --mountpoint "$path" || true)" = "" ] ||
        e2e_problem "$2: $path is still a mount point: $(findmnt -rn --mountpoint "$path")"
    if findmnt -rn -o TARGET | grep -q "^$TMPFSCTL_STATE_DIR/held/"; then
        e2e_problem "$2: a held tmpfs is left: $(findmnt -rn -o TARGET | grep "^$TMPFSCTL_STATE_DIR/held/")"
    fi
    tmp=$(e2e_temporaries "$path")
    [ "$tmp" = 0 ] || e2e_problem "$2: $tmp write-back temporaries (.tmpfsctl-wb.*) left in $path"
    [ "${#E2E_PROBLEMS[@]}" != "$n" ] || e2e_pass "$2: on its disk directory, nothing held, no write-back temporaries"
}

# $1: apply|sync|down, $2: spec, $3: mount name, $4: managed path: runs it
# (through e2e_tmpfsctl), logs how long it took, and records a problem if it
# failed (with E2E_BREAK set it only logs: the checks at the end are what
# must fail). A failed apply is tried again, up to 5 times, so that the
# phases after it still run in RAM, and a failed down up to 3 times; the
# failure stays recorded.
e2e_step() {
    local t0 rc=0 ms try=1 started
    while :; do
        t0=$(date +%s%N)
        started=$(date -d @"${t0:0:10}.${t0:10:3}" +%T.%3N)
        rc=0
        if [ "$1" = apply ]; then
            "$BIN" apply "$2" >>"$WORK/tmpfsctl.log" 2>&1 || rc=$?
        else
            e2e_tmpfsctl "$@" || rc=$?
        fi
        ms=$((($(date +%s%N) - t0) / 1000000))
        log "tmpfsctl $1: exit $rc in $ms ms (started $started)"
        # When each apply ran (its seed among it), for the checks to say which
        # differences a write during a seed explains.
        [ "$1" != apply ] || echo "$started $(date +%T.%3N)" >>"$WORK/apply-windows"
        # And each down: between its switch and the end of its merge the
        # application sees the disk's older entries (docs/writeback.md).
        [ "$1" != down ] || echo "$started $(date +%T.%3N)" >>"$WORK/down-windows"
        [ "$rc" = 0 ] || [ -n "${E2E_BREAK:-}" ] ||
            e2e_problem "tmpfsctl $1 (started $started) exited with $rc: $(grep -o 'reason: .*\|WRITE-BACK PENDING.*\|error: .*' "$WORK/tmpfsctl.log" | tail -1)"
        # A failed apply is tried again (up to 5 times), and so is a failed
        # down (up to 3: WRITE-BACK PENDING is retried by down, as documented).
        [ "$rc" != 0 ] && [ -z "${E2E_BREAK:-}" ] &&
            { { [ "$1" = apply ] && [ "$try" -lt 5 ]; } || { [ "$1" = down ] && [ "$try" -lt 3 ]; }; } || break
        try=$((try + 1))
        sleep 0.2
    done
    local want=tmpfs
    case ${E2E_BACKEND:-tmpfs} in zram-*) want=${E2E_BACKEND#zram-} ;; esac
    if [ "$1" = apply ] && [ -z "${E2E_BREAK:-}" ] &&
        [ "$(findmnt -rn -o FSTYPE --mountpoint "$4")" != "$want" ]; then
        e2e_problem "apply: $4 is not on $want after $try attempts"
    fi
    return 0
}

# $1: directory; the number of files below it
e2e_count_files() { { find "$1" -type f 2>/dev/null || true; } | wc -l; }

# $1: path: the URL of /PATH on the proxy
e2e_url() { echo "http://127.0.0.1:$PROXY/$1"; }

# $1: prefix, $2: count: fetches /PREFIX/1 .. /PREFIX/COUNT through the proxy;
# prints how many were HITs (`X-Cache: HIT`, which nginx, Squid and Apache's
# CacheHeader all send)
e2e_fetch() {
    local i hits=0
    for i in $(seq "$2"); do
        curl -fsS -o /dev/null -D - "$(e2e_url "$1/$i")" | grep -qi '^X-Cache: HIT' && hits=$((hits + 1))
    done
    echo "$hits"
}

# The phases every persisted end-to-end test runs while its application
# works under load: sync x3, down, 3 s on disk, apply (seeded again), sync,
# down, 2 s on disk. $1: spec, $2: mount name, $3: managed path
e2e_persist_cycle() {
    local i
    sleep 2
    for i in 1 2 3; do
        e2e_step sync "$@"
        sleep 1.5
    done
    e2e_step down "$@"
    [ -n "${E2E_BREAK:-}" ] || e2e_check_on_disk "$3" "after the first down"
    sleep 3
    e2e_step apply "$@"
    sleep 2
    e2e_step sync "$@"
    sleep 2
    e2e_step down "$@"
    sleep 2
}
