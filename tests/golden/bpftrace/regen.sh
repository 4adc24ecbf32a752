#!/bin/sh
# Re-records the goldens with the bpftrace installed (v0.17.0 made these):
# NAME.out is bpftrace's stdout, NAME.json.out its stdout with -f json.
# Needs root. Stacks and addresses differ between runs, so a re-recorded
# stack golden needs the frames in its test updated too.
cd "$(dirname "$0")" || exit 1
for bt in ${1:-*.bt}; do
  name=${bt%.bt}
  bpftrace "$bt" > "$name.out" 2> "/tmp/$name.err" || { echo "$bt failed:"; grep -v RLIMIT "/tmp/$name.err"; }
  bpftrace -f json "$bt" > "$name.json.out" 2>/dev/null
done
