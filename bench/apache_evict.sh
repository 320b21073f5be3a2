#!/usr/bin/env bash
# Apache 2.4 mod_cache_disk on a 32 MiB managed mount with `watchdog: { high: 85%,
# low: 60%, action: evict }`, under `wrk -t2 -c16` over 4,000 objects of 64 KiB: the
# scenario of the agent issue. A caching front (127.0.0.1:18180) proxies an origin
# (127.0.0.1:18181) served by the same Apache; its CacheRoot is the managed mount.
#
# Prints, for one run of SECS seconds: requests and non-2xx answers (wrk), the
# cache's errors in Apache's log (AH00731: could not write, the cache is full;
# AH00708: a data file without its header, an entry split by eviction), children
# that died of a signal, and how often usage was at or above 99% (sampled every
# 50 ms), with the agent's own evictions.
#
# Runs in a private mount namespace: the tmpfs, the state directory and Apache's
# files go away with it. Needs apache2 and wrk (Debian: apt-get install apache2 wrk).
#
# Usage: sudo bench/apache_evict.sh   (env: SECS, default 20; CONNS, default 16;
# LOGS=DIR keeps Apache's error log, the agent's log and wrk's output there)
set -euo pipefail
if [ "${TMPFSCTL_BENCH_INNER:-}" != 1 ]; then
    cd "$(dirname "$0")/.."
    cargo build --release --quiet
    exec env TMPFSCTL_BENCH_INNER=1 unshare --mount --propagation private "$0" "$@"
fi
SECS=${SECS:-20}
CONNS=${CONNS:-16}
BIN=${BIN:-$PWD/target/release/tmpfsctl}
W=$(mktemp -d /tmp/tmpfsctl-apache-bench-XXXXXX)
chmod 755 "$W"
AGENT=""
cleanup() {
    [ -n "$AGENT" ] && kill "$AGENT" 2>/dev/null && wait "$AGENT" 2>/dev/null
    [ -f "$W/run/httpd.pid" ] && kill "$(cat "$W/run/httpd.pid")" 2>/dev/null
    sleep 0.5
    for m in $(findmnt -rn -o TARGET | grep "^$W" | sort -r); do umount -l "$m" 2>/dev/null || true; done
    rm -rf "$W"
}
trap cleanup EXIT

mkdir -p "$W/origin/f" "$W/cache" "$W/run" "$W/logs"
chown www-data:www-data "$W/cache"
for i in $(seq 0 3999); do head -c 65536 /dev/urandom > "$W/origin/f/$i.bin"; done
M=/usr/lib/apache2/modules
cat > "$W/httpd.conf" <<EOF
ServerRoot "$W"
PidFile "$W/run/httpd.pid"
Mutex file:$W/run
DefaultRuntimeDir "$W/run"
User www-data
Group www-data
ErrorLog "$W/logs/error.log"
LogLevel warn
LoadModule mpm_event_module $M/mod_mpm_event.so
LoadModule authz_core_module $M/mod_authz_core.so
LoadModule mime_module $M/mod_mime.so
TypesConfig /etc/mime.types
LoadModule proxy_module $M/mod_proxy.so
LoadModule proxy_http_module $M/mod_proxy_http.so
LoadModule cache_module $M/mod_cache.so
LoadModule cache_disk_module $M/mod_cache_disk.so
ServerName localhost
Listen 127.0.0.1:18180
Listen 127.0.0.1:18181
<VirtualHost 127.0.0.1:18181>
    DocumentRoot "$W/origin"
    <Directory "$W/origin">
        Require all granted
    </Directory>
</VirtualHost>
<VirtualHost 127.0.0.1:18180>
    ProxyPass / http://127.0.0.1:18181/
    CacheEnable disk /
    CacheRoot "$W/cache"
    CacheDirLevels 2
    CacheDirLength 1
    CacheMaxFileSize 1000000
    CacheIgnoreNoLastMod On
    CacheDefaultExpire 3600
    CacheLock off
</VirtualHost>
EOF

cat > "$W/cache.yaml" <<EOF
version: 1
mounts:
  - name: apache
    path: $W/cache
    size: ${SIZE:-32MiB}
    watchdog:
      high: 85%
      low: 60%
      action: evict
EOF
export TMPFSCTL_STATE_DIR=$W/state
"$BIN" apply "$W/cache.yaml" > /dev/null
${AGENT_NICE:+nice -n $AGENT_NICE} "$BIN" agent "$W/cache.yaml" --metrics off > "$W/logs/agent.log" 2>&1 &
AGENT=$!
apache2 -f "$W/httpd.conf" -k start
sleep 1

cat > "$W/random.lua" <<'EOF'
request = function()
    return wrk.format(nil, "/f/" .. math.random(0, 3999) .. ".bin")
end
EOF
sampler() {
    local n=0 full=0 peak=0
    while [ -e "$W/sampling" ]; do
        read -r size used < <(stat -f -c '%b %a' "$W/cache" | awk '{ print $1, $1 - $2 }')
        pct=$(( used * 100 / size ))
        n=$((n + 1))
        ((pct >= 99)) && full=$((full + 1))
        ((pct > peak)) && peak=$pct
        sleep 0.05
    done
    echo "$n $full $peak" > "$W/samples"
}
touch "$W/sampling"
sampler &
SAMPLER=$!
wrk -t2 -c"$CONNS" -d"${SECS}s" -s "$W/random.lua" http://127.0.0.1:18180/ > "$W/wrk.txt" 2>&1 || true
rm -f "$W/sampling"
wait "$SAMPLER"
read -r samples full peak < "$W/samples"

requests=$(awk '/requests in/ { print $1 }' "$W/wrk.txt")
non2xx=$(awk '/Non-2xx/ { print $NF }' "$W/wrk.txt")
errors=$(awk '/Socket errors/ { print }' "$W/wrk.txt")
count() { grep -c "$1" "$W/logs/error.log" || true; }
if [ -n "${LOGS:-}" ]; then
    mkdir -p "$LOGS"
    cp "$W/logs/"* "$W/wrk.txt" "$LOGS/"
fi
echo "apache mod_cache_disk, 32 MiB mount (high 85%, low 60%, evict), wrk -t2 -c$CONNS, ${SECS}s"
echo "  requests:            ${requests:-0}, non-2xx: ${non2xx:-0} ${errors:+($errors)}"
echo "  AH00731 (cache full): $(count AH00731)"
echo "  AH00708 (split):      $(count AH00708)"
echo "  children killed:      $(count 'exit signal')"
echo "  usage >= 99%:         $full of $samples samples (peak $peak%)"
echo "  agent:                $(grep -c 'evicted' "$W/logs/agent.log" || true) eviction lines, $(grep -c WARN "$W/logs/agent.log" || true) warnings"
