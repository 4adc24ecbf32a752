#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Regenerates the offset table in src/profile/python/offsets.rs from each installed CPython's
# own headers (see gen/offsets.c for why the compiler, not a human, computes
# them).
#
# Usage: scripts/python-offsets/gen.sh
set -eu

here=$(cd "$(dirname "$0")" && pwd)
crate=$(dirname "$(dirname "$here")")
pyenv=${PYENV_ROOT:-/root/.pyenv}/versions
versions=${VERSIONS:-"3.9.18 3.10.13 3.11.7 3.12.1 3.13.0"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kvdir=$tmp/kv
mkdir -p "$kvdir"

# Internal headers are needed because _PyRuntimeState, PyInterpreterState and
# _PyInterpreterFrame are only complete types there.
build() { # $1 include dir, $2 output binary
    gcc -O0 -Wall -Werror -I"$1" -I"$1/internal" "$here/offsets.c" -o "$2"
}

: >"$tmp/table.rs"
for v in $versions; do
    mm=${v%.*}
    inc=$pyenv/$v/include/python$mm
    build "$inc" "$tmp/off-$mm"
    "$tmp/off-$mm" kv >"$kvdir/offsets-$mm.txt"
    # The Rust consts in offsets.rs assume one bit layout for all versions;
    # refuse to emit a table if a header disagrees.
    bits=$(grep '^state_' "$kvdir/offsets-$mm.txt" | tr '\n' ' ')
    want="state_kind_shift 2 state_kind_width 3 state_compact_bit 5 state_compact_width 1 state_ascii_bit 6 state_ascii_width 1 "
    if [ "$bits" != "$want" ]; then
        echo "gen.sh: $v unicode state bits differ: $bits" >&2
        exit 1
    fi
    "$tmp/off-$mm" rust >>"$tmp/table.rs"
done

# Splice between the markers so hand-written parts of offsets.rs survive.
rs=$crate/src/profile/python/offsets.rs
awk -v table="$tmp/table.rs" '
    /^\/\/ BEGIN GENERATED/ { print; while ((getline l < table) > 0) print l; skip = 1; next }
    /^\/\/ END GENERATED/   { skip = 0 }
    !skip { print }
' "$rs" >"$tmp/offsets.rs"
cp "$tmp/offsets.rs" "$rs"
echo "gen.sh: wrote table for: $versions"

# Debian ships its own 3.11 build; same minor should mean same layout, but
# distro patches could break that, so compare when its headers are present.
if [ -d /usr/include/python3.11/internal ]; then
    build /usr/include/python3.11 "$tmp/off-deb"
    if "$tmp/off-deb" kv | cmp -s - "$kvdir/offsets-3.11.txt"; then
        echo "gen.sh: /usr/include/python3.11 layout == pyenv 3.11"
    else
        echo "gen.sh: WARNING /usr/include/python3.11 layout differs" >&2
        "$tmp/off-deb" kv | diff - "$kvdir/offsets-3.11.txt" >&2 || true
    fi
fi
