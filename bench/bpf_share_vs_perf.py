#!/usr/bin/env python3
"""Share of CPU samples in BPF programs: bpfscope vs perf, same workload, one run.

A write loop runs on one CPU while `bpfscope count` keeps a BPF program hot
on every write. bpfscope records the whole system (`record -F 499`) while
`perf record -a -F 499 -g` does the same; each tool's share of samples whose
leaf (innermost) frame is in a BPF program's JIT code is printed, and the
difference. The two must agree within a few points.
"""
import os
import re
import subprocess
import sys
import tempfile

from common import BIN, Background, OUT, build, cc, need

SECONDS = 5
SOURCE_LINE = re.compile(r"\.[ch]:\d+(_\[k\])?$")


def bpfscope_share(folded):
    total = in_bpf = 0
    for line in open(folded):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        n = int(n)
        frames = stack.split(";")
        total += n
        # A BPF frame's source line is a child frame named file:line, the
        # file a .bpf.c or a header its code was inlined from.
        leaf = frames[-1]
        parent = frames[-2] if len(frames) > 1 else ""
        if leaf.startswith("bpf_prog_") or (parent.startswith("bpf_prog_") and SOURCE_LINE.search(leaf)):
            in_bpf += n
    return in_bpf, total


def perf_share(data):
    """Share of non-idle samples whose symbol is a BPF program: bpfscope's
    profiler does not sample the idle task, so perf's idle samples (comm
    swapper) are left out of the total to compare like with like."""
    out = subprocess.run(
        ["perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none", "-n",
         "--sort", "comm,sym", "--percent-limit", "0"],
        capture_output=True, text=True, check=True).stdout
    total = in_bpf = 0
    for line in out.splitlines():
        parts = line.split()
        # overhead%  samples  comm  [k]|[.]  symbol
        if len(parts) < 5 or not parts[0].endswith("%") or not parts[1].isdigit():
            continue
        n, comm, sym = int(parts[1]), parts[2], parts[-1]
        if comm == "swapper":
            continue
        total += n
        if sym.startswith("bpf_prog_"):
            in_bpf += n
    return in_bpf, total


def main():
    need("perf", "linux-perf")
    build()
    loop = cc("writeloop")
    tmp = tempfile.mkdtemp(dir=OUT)
    rec = os.path.join(tmp, "run.bscope")
    folded = os.path.join(tmp, "run.folded")
    pdata = os.path.join(tmp, "perf.data")
    hot = Background([BIN, "count", "tracepoint:syscalls:sys_enter_write", "--by", "comm"], "Attached")
    wl = subprocess.Popen(["sh", "-c", f"for i in $(seq 60); do {loop} 500000; done"],
                          stdout=subprocess.DEVNULL)
    perf = subprocess.Popen(["perf", "record", "-a", "-F", "499", "-g", "-o", pdata, "--",
                             "sleep", str(SECONDS)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([BIN, "record", "-F", "499", "--duration", str(SECONDS), "-o", rec],
                   check=True, stderr=subprocess.DEVNULL)
    perf.wait()
    wl.kill()
    hot.stop()
    subprocess.run([BIN, "report", rec, "-o", folded], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    n_bpf, n_all = bpfscope_share(folded)
    ours = 100.0 * n_bpf / n_all if n_all else 0.0
    p_bpf, p_all = perf_share(pdata)
    theirs = 100.0 * p_bpf / p_all if p_all else 0.0
    print(f"share of non-idle samples in BPF programs (leaf frame), {SECONDS} s at 499 Hz, whole system:")
    print(f"  bpfscope {ours:6.2f}%  ({n_bpf} of {n_all} samples)")
    print(f"  perf     {theirs:6.2f}%  ({p_bpf} of {p_all} samples)")
    print(f"  difference {abs(ours - theirs):5.2f} points (target: a few)")


if __name__ == "__main__":
    sys.exit(main())
