#!/usr/bin/env python3
"""`bpfscope diff` of two recordings of more than 100,000 samples each
(whole system at 4999 Hz for 11 s, the 3:1 workload then the 3:3 one on
both CPUs among whatever else runs), into the table and into a
differential flame graph, against `perf diff` of two `perf record -a -g`
files taken over the same seconds. Target: under 1 s.

    bench/diff_large.py [RUNS]      (default 2 timed runs of each)
"""

import os
import subprocess
import sys
import time

from common import BIN, OUT, build, need, need_root, workload
from report_rss import without_ksymbol

SECS = 11


def record(split, name, args):
    rec = os.path.join(OUT, f"diff-{name}.bscope")
    data = os.path.join(OUT, f"diff-{name}.perf.data")
    load = [subprocess.Popen([split, f"bench_{name}", str(SECS + 3), *args]) for _ in range(2)]
    try:
        perf = subprocess.Popen(["perf", "record", "-F", "4999", "-a", "-g", "--no-bpf-event",
                                 "-o", data, "--", "sleep", str(SECS)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = subprocess.run([BIN, "record", "-F", "4999", "--duration", str(SECS), "-o", rec],
                           capture_output=True, text=True)
        perf.wait()
        if r.returncode != 0:
            sys.exit(f"bench: bpfscope record failed: {r.stderr}")
    finally:
        for p in load:
            p.kill()
            p.wait()
    without_ksymbol(data)
    samples = next((l.split("(")[1].split()[0] for l in r.stderr.splitlines()
                    if l.startswith("Wrote ")), "?")
    return rec, data, samples


def timed(cmd, runs):
    best = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        best.append(time.perf_counter() - t0)
        if r.returncode != 0 or "Error:" in r.stderr:
            sys.exit(f"bench: {' '.join(cmd)} failed: {r.stderr[-2000:]}")
    return best


def main():
    need_root()
    need("perf", "linux-perf")
    build()
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    split = workload()
    base, base_data, n1 = record(split, "base", [])
    new, new_data, n2 = record(split, "new", ["beta", "3"])
    print(f"recordings: {n1} and {n2} samples")
    table = timed([BIN, "diff", base, new], runs)
    svg = timed([BIN, "diff", base, new, "-o", os.path.join(OUT, "diff.svg")], runs)
    perf = timed(["perf", "diff", base_data, new_data], runs)
    fmt = lambda ts: ", ".join(f"{t * 1000:.0f} ms" for t in ts)
    print(f"bpfscope diff (table): {fmt(table)}")
    print(f"bpfscope diff -o diff.svg: {fmt(svg)}")
    print(f"perf diff: {fmt(perf)}")
    worst = max(table + svg)
    print(f"ratio slowest bpfscope diff / 1 s target: {worst:.2f}; to perf diff's fastest: "
          f"{worst / min(perf):.2f}")
    with open("/proc/loadavg") as f:
        print(f"load average at the end: {f.read().split()[0]}")


if __name__ == "__main__":
    main()
