#!/bin/sh
# Generates what the packages install but the repository does not hold: the
# manual pages (gzipped, as Debian policy wants) and the bash, zsh and fish
# completions, from the built binary itself, and a stripped copy of the
# binary for the .rpm (cargo-deb strips its own; cargo-generate-rpm does not). They land next to the binary,
# in TARGET/release/pkg/, where Cargo.toml's package metadata expects them
# (cargo-deb and cargo-generate-rpm map `target/release/` to CARGO_TARGET_DIR).
#
# Usage: packaging/gen-assets.sh [TMPFSCTL_BINARY]   (default: the release build)
set -eu
target=${CARGO_TARGET_DIR:-target}
bin=${1:-$target/release/tmpfsctl}
out=$target/release/pkg
mkdir -p "$out"
strip --strip-unneeded --remove-section=.comment --remove-section=.note -o "$out/tmpfsctl" "$bin"
"$bin" manpage > "$out/tmpfsctl.8"
gzip -9n < "$out/tmpfsctl.8" > "$out/tmpfsctl.8.gz"
gzip -9n < "$(dirname "$0")/man/mount.tmpfsctl.8" > "$out/mount.tmpfsctl.8.gz"
"$bin" completions bash > "$out/tmpfsctl.bash"
"$bin" completions zsh > "$out/_tmpfsctl"
"$bin" completions fish > "$out/tmpfsctl.fish"
for f in tmpfsctl tmpfsctl.8.gz mount.tmpfsctl.8.gz tmpfsctl.bash _tmpfsctl tmpfsctl.fish; do
    [ -s "$out/$f" ] || { echo "gen-assets: $out/$f is empty" >&2; exit 1; }
done
echo "gen-assets: stripped binary, manual page and completions in $out"
