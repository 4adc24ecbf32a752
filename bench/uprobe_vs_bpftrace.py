#!/usr/bin/env python3
"""bpfscope vs bpftrace on user-space probes, in one run.

1. Wall time of a complete run attaching every str* function of libc by
   glob (`count ... --by probe -- /bin/true` vs `bpftrace ... -c /bin/true`).
   bpfscope makes one uprobe_multi link with a cookie per function;
   bpftrace loads one program per match. Target: <= 1/10 of bpftrace's.
2. Nanoseconds added per call of a probed function (uprobe count).
"""
import statistics
import subprocess
import sys

from common import BIN, Background, build, cc, need, ratio, wall

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def main():
    need("bpftrace", "bpftrace")
    build()
    loop = cc("callloop")
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3

    n_ours = len(subprocess.run([BIN, "list", f"uprobe:{LIBC}:str*", "--names"],
                                capture_output=True, text=True, check=True).stdout.split())
    n_bt = len(subprocess.run(["bpftrace", "-l", f"uprobe:{LIBC}:str*"],
                              capture_output=True, text=True, check=True).stdout.split())
    ours = wall([BIN, "count", f"uprobe:{LIBC}:str*", "--by", "probe", "--", "/bin/true"], runs)
    theirs = wall(["bpftrace", "-e", f"uprobe:{LIBC}:str* {{ @[probe] = count(); }}",
                   "-c", "/bin/true"], runs)
    print(f"glob attach of {LIBC}:str*, complete run, median of {runs}:")
    print(f"  bpfscope {ours:8.3f} s  ({n_ours} entry points; aliases share one)")
    print(f"  bpftrace {theirs:8.3f} s  ({n_bt} symbols)")
    print(f"  ratio    {ratio(ours, theirs):8.4f}  (target <= 0.1)")

    n = "2000000"
    per = lambda: float(subprocess.run([loop, n], capture_output=True, text=True, check=True).stdout)
    probe = f"uprobe:{loop}:work"
    base, bs, bt = [], [], []
    for _ in range(5):
        base.append(per())
        t = Background([BIN, "count", probe], "Attached")
        bs.append(per())
        t.stop()
        t = Background(["bpftrace", "-e", f"{probe} {{ @ = count(); }}"], "Attaching", stream="stdout")
        bt.append(per())
        t.stop()
    b = statistics.median(base)
    add_bs = statistics.median(bs) - b
    add_bt = statistics.median(bt) - b
    print(f"uprobe count, per call, median of 5 rounds x {n} calls:")
    print(f"  untraced           {b:8.1f} ns")
    print(f"  bpfscope added     {add_bs:8.1f} ns")
    print(f"  bpftrace added     {add_bt:8.1f} ns")
    print(f"  ratio              {ratio(add_bs, add_bt):8.3f}")


if __name__ == "__main__":
    main()
