#!/usr/bin/env python3
"""`bpfscope top` against `perf top`: CPU time of the tool's process per
refresh, whole system at 99 Hz, refreshed every second, each in a tmux
pane of its own (perf top needs a terminal), while the 3:1 workload keeps
one CPU busy. Rounds alternate the two tools; CPU comes from schedstat of
every thread of the tool. The kernel's side (perf's sample records, the
BPF sampler) is not in these figures.

    bench/top_vs_perf.py [SECONDS] [ROUNDS]      (default 30 s, 2 rounds)
"""

import os
import subprocess
import sys
import time

from common import BIN, build, cpu_seconds, need, need_root, workload


def pane_pid(session):
    out = subprocess.run(["tmux", "list-panes", "-t", session, "-F", "#{pane_pid}"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def measure(name, cmd, secs):
    """CPU seconds per second of a tool run in tmux for `secs` (after a
    2 s start-up that is not counted), and its peak RSS in KiB."""
    session = f"bench-top-{os.getpid()}-{name}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "45",
                    "exec " + " ".join(cmd)], check=True)
    try:
        pid = pane_pid(session)
        time.sleep(2)
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        time.sleep(secs)
        c1, t1 = cpu_seconds(pid), time.perf_counter()
        with open(f"/proc/{pid}/status") as f:
            hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
        return (c1 - c0) / (t1 - t0), hwm
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        time.sleep(1)


def main():
    need_root()
    need("tmux", "tmux")
    need("perf", "linux-perf")
    build()
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    split = workload()
    busy = subprocess.Popen([split, "bench_top", str((secs + 6) * 2 * rounds)])
    try:
        res = {"bpfscope": [], "perf": []}
        for r in range(rounds):
            b = measure("bpfscope", [BIN, "top", "-F", "99", "--interval", "1"], secs)
            p = measure("perf", ["perf", "top", "-F", "99", "-d", "1", "--stdio"], secs)
            res["bpfscope"].append(b)
            res["perf"].append(p)
            print(f"round {r + 1}: bpfscope top {b[0] * 1000:.1f} ms CPU per refresh (peak RSS {b[1] / 1024:.1f} MiB), "
                  f"perf top {p[0] * 1000:.1f} ms (peak RSS {p[1] / 1024:.1f} MiB), ratio {b[0] / p[0]:.2f}")
        with open("/proc/loadavg") as f:
            print(f"load average at the end: {f.read().split()[0]}")
    finally:
        busy.kill()
        busy.wait()


if __name__ == "__main__":
    main()
