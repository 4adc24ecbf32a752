#!/usr/bin/env python3
"""Share of CPU samples in BPF programs: bpfscope vs perf, same workload, one run each.

A write loop runs on one CPU while a BPF program is hot on every write, in
two cases: `bpfscope count` (a raw_tp program, which sampling sees) and
bpftrace's `tracepoint:syscalls:sys_enter_write` (a classic tracepoint
program: while it runs, the kernel runs no perf_event BPF program, so
bpfscope's second, plain perf sampler takes those samples). bpfscope
records the whole system (`record -F 499`) while `perf record -a -F 499 -g`
does the same; each tool's share of samples whose leaf (innermost) frame is
in a BPF program's JIT code, and whose stack passes through one at all, is
printed, and the difference. Both totals leave out idle and the two tools'
own processes. The two must agree within a point.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from common import BIN, Background, OUT, build, cc, need

SECONDS = 5
SOURCE_LINE = re.compile(r"\.[ch]:\d+(_\[k\])?$")
# The two profilers run at once and see each other; neither counts its own
# process, so both totals leave out both tools.
TOOLS = ("perf", "bpfscope")


def bpfscope_share(folded):
    """(leaf in BPF, anywhere in BPF, total) samples."""
    total = in_bpf = inclusive = 0
    for line in open(folded):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        n = int(n)
        frames = stack.split(";")
        if frames[0] in TOOLS:
            continue
        total += n
        # A BPF frame's source line is a child frame named file:line, the
        # file a .bpf.c or a header its code was inlined from.
        leaf = frames[-1]
        parent = frames[-2] if len(frames) > 1 else ""
        if leaf.startswith("bpf_prog_") or (parent.startswith("bpf_prog_") and SOURCE_LINE.search(leaf)):
            in_bpf += n
        if any(f.startswith("bpf_prog_") for f in frames):
            inclusive += n
    return in_bpf, inclusive, total


def perf_share(data):
    """(leaf in BPF, anywhere in BPF, total) non-idle samples: bpfscope's
    profiler does not sample the idle task, so perf's idle samples (comm
    swapper) are left out of the total to compare like with like. Anywhere
    counts the helpers a program calls (map updates), which BPF run-time
    statistics include."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,ip,sym"],
                         capture_output=True, text=True, check=True).stdout
    total = in_bpf = inclusive = 0
    for block in out.split("\n\n"):
        lines = [l.split() for l in block.strip().splitlines()]
        if not lines or not lines[0] or lines[0][0] == "swapper" or lines[0][0] in TOOLS:
            continue
        frames = [l[-1] for l in lines[1:] if len(l) >= 2]
        total += 1
        if frames and frames[0].startswith("bpf_prog_"):
            in_bpf += 1
        if any(f.startswith("bpf_prog_") for f in frames):
            inclusive += 1
    return in_bpf, inclusive, total


def one_case(label, hot_cmd, ready, stream, loop, tmp):
    rec = os.path.join(tmp, f"{label}.bscope")
    folded = os.path.join(tmp, f"{label}.folded")
    pdata = os.path.join(tmp, f"{label}.perf.data")
    hot = Background(hot_cmd, ready, stream=stream)
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
    ours = bpfscope_share(folded)
    theirs = perf_share(pdata)
    pct = lambda n, d: 100.0 * n / d if d else 0.0
    print(f"{label}: share of non-idle samples in BPF programs, {SECONDS} s at 499 Hz, whole system:")
    for name, (leaf, incl, total) in (("bpfscope", ours), ("perf", theirs)):
        print(f"  {name:8} leaf {pct(leaf, total):6.2f}%  with the helpers it calls {pct(incl, total):6.2f}%  ({total} samples)")
    print(f"  difference: leaf {abs(pct(ours[0], ours[2]) - pct(theirs[0], theirs[2])):5.2f} points, "
          f"with helpers {abs(pct(ours[1], ours[2]) - pct(theirs[1], theirs[2])):5.2f} points")


def main():
    need("perf", "linux-perf")
    build()
    loop = cc("writeloop")
    tmp = tempfile.mkdtemp(dir=OUT)
    one_case("bpfscope count (raw_tp)",
             [BIN, "count", "tracepoint:syscalls:sys_enter_write", "--by", "comm"],
             "Attached", "stderr", loop, tmp)
    if shutil.which("bpftrace"):
        one_case("bpftrace tracepoint:syscalls:sys_enter_write (classic tracepoint)",
                 ["bpftrace", "-e", "tracepoint:syscalls:sys_enter_write { @[comm] = count(); }"],
                 "Attaching", "stdout", loop, tmp)
    else:
        print("SKIP bpftrace case: bpftrace is not installed")


if __name__ == "__main__":
    sys.exit(main())
