#!/usr/bin/env python3
"""bpfscope vs bpftrace on the same one-liner, in one run.

1. Wall time of a complete run: `count sys_enter_write --by comm -- /bin/true`
   against `bpftrace -e '...' -c /bin/true` (median of runs).
2. Nanoseconds added per write(2) while each tool counts writes by comm,
   system-wide: rounds of base / bpfscope / bpftrace, medians.
Targets: wall time <= 1/4 of bpftrace's; added cost <= 1/2 of bpftrace's.
"""
import statistics
import subprocess
import sys

from common import BIN, Background, build, cc, need, ratio, wall

PROBE = "tracepoint:syscalls:sys_enter_write"
BT_PROG = "tracepoint:syscalls:sys_enter_write { @[comm] = count(); }"


def main():
    need("bpftrace", "bpftrace")
    build()
    loop = cc("writeloop")
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10

    ours = wall([BIN, "count", PROBE, "--by", "comm", "--", "/bin/true"], runs)
    theirs = wall(["bpftrace", "-e", BT_PROG, "-c", "/bin/true"], runs)
    print(f"complete one-liner (-- /bin/true), median of {runs}:")
    print(f"  bpfscope {ours * 1e3:8.1f} ms")
    print(f"  bpftrace {theirs * 1e3:8.1f} ms")
    print(f"  ratio    {ratio(ours, theirs):8.3f}  (target <= 0.25)")

    n = "2000000"
    per = lambda: float(subprocess.run([loop, n], capture_output=True, text=True, check=True).stdout)
    base, bs, bt = [], [], []
    for _ in range(5):
        base.append(per())
        t = Background([BIN, "count", PROBE, "--by", "comm"], "Attached")
        bs.append(per())
        t.stop()
        base.append(per())
        t = Background(["bpftrace", "-e", BT_PROG], "Attaching", stream="stdout")
        bt.append(per())
        t.stop()
    b = statistics.median(base)
    add_bs = statistics.median(bs) - b
    add_bt = statistics.median(bt) - b
    print(f"write(2) cost, median of 5 rounds x {n} writes:")
    print(f"  untraced           {b:8.1f} ns")
    print(f"  bpfscope added     {add_bs:8.1f} ns")
    print(f"  bpftrace added     {add_bt:8.1f} ns")
    print(f"  ratio              {ratio(add_bs, add_bt):8.3f}  (target <= 0.5)")


if __name__ == "__main__":
    main()
