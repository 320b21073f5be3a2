#!/bin/sh
# Checks the alerting rules: syntax (`promtool check rules`), every tmpfsctl_*
# metric they use is one the agent exports (src/agent/metrics.rs), and the unit
# tests (`promtool test rules`: each alert fires, a healthy host fires none).
set -eu
cd "$(dirname "$0")"
command -v promtool >/dev/null || { echo "promtool missing (apt-get install prometheus)" >&2; exit 1; }
promtool check rules tmpfsctl.rules.yml
missing=
for m in $(grep -v '^ *#' tmpfsctl.rules.yml | grep -o 'tmpfsctl_[a-z0-9_]*' | sort -u); do
    grep -q "\"$m\"" ../../src/agent/metrics.rs || missing="$missing $m"
done
if [ -n "$missing" ]; then
    echo "tmpfsctl.rules.yml uses metrics the agent does not export:$missing" >&2
    exit 1
fi
echo "  every metric the rules use is exported by src/agent/metrics.rs"
promtool test rules tmpfsctl.rules.test.yml
