#!/usr/bin/env python3
"""How often a sampled user stack is unwound all the way to the program's
entry: bpfscope profile (in-kernel unwinding from .eh_frame tables) vs
perf record --call-graph dwarf (a copy of the user stack unwound later by
perf), on Debian's own binaries, which have no frame pointers.

Three CPU-bound workloads, each profiled at 499 Hz in two separate runs,
once by `bpfscope profile -F 499 -o X.folded -- CMD` and once by
`perf record -F 499 --call-graph dwarf -o X.data -- CMD` (read back with
`perf script`):

  python   /usr/bin/python3.11 -c '<recursive fib in a loop for SECS s>'
  xz       /usr/bin/xz -9 -T1 -c FILE        (stdout to /dev/null)
  gzip     /usr/bin/gzip -9 -c FILE          (stdout to /dev/null)

FILE is text from /usr/share and /usr/lib/python3.11 interleaved with
base64 of seeded random bytes (compressible, but not trivially), made once
into target/bench and sized so each compressor runs about SECS seconds
(xz -9 is some five times slower per byte than gzip -9, so its file is
smaller).

Only the workload's own samples count (comm python3.11, xz or gzip). A
sample "reaches main" when its user frames include any of main,
__libc_start_call_main, __libc_start_main, __libc_start_main_impl or
_start. Debian's python3.11 tail-calls Py_BytesMain from main, so main is
never on its stacks (and xz's and gzip's main are not in their symbol
tables): the C library's start frames are what shows. Samples with no
user frames at all (in the kernel during exec, before the process has a
user stack) count in the total and are printed. bpfscope also samples a
process while exit_group tears its address space down; its user stack is
then `_exit` alone, and perf records no samples there to compare with.

Printed per workload: samples, the share that reaches main for each
tool, and bpfscope/perf (target >= 0.99), plus bpfscope's own loss
accounting (its stderr lines starting with `bpfscope:`) and the most
common stack each tool did not unwind to the entry. perf copies 8 KiB of
stack per sample by default, which deep stacks outgrow; when perf's
share is under 99%, a second perf run with `--call-graph dwarf,65528`
(its largest copy) shows how much of the gap that is.

BENCH_SECS (default 5) sets the length of each workload run.
"""
import base64
import os
import random
import re
import subprocess
import sys
import tempfile
import time

from common import BIN, OUT, build, need, need_root, ratio

SECS = float(os.environ.get("BENCH_SECS", "5"))
HZ = 499
ENTRY = {"main", "__libc_start_call_main", "__libc_start_main", "__libc_start_main_impl", "_start"}
# MiB of input per SECS=5 seconds of compressing.
XZ_MIB = 24
GZIP_MIB = 96

FIB = """
import sys, time
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    fib(20)
"""


def text_files():
    """Text files to build the input from, in a fixed order."""
    found = []
    for top in ("/usr/share", "/usr/lib/python3.11"):
        for d, dirs, names in os.walk(top):
            dirs.sort()
            for n in sorted(names):
                if n.endswith((".py", ".pm", ".pod", ".txt", ".h")) or n == "copyright":
                    found.append(os.path.join(d, n))
    return found


def input_file(mib):
    """target/bench/unwind-input-MIBM.txt, made when missing: each text
    file in turn, about a third of them followed by base64 of random bytes
    half their size; the text repeats if it runs out."""
    path = os.path.join(OUT, f"unwind-input-{mib}M.txt")
    size = mib << 20
    if os.path.exists(path) and os.path.getsize(path) == size:
        return path
    files = text_files()
    if not files:
        sys.exit("bench: no text files under /usr/share to build the input from")
    rnd = random.Random(20261123)
    written = 0
    tmp = path + ".part"
    with open(tmp, "wb") as out:
        while written < size:
            for f in files:
                try:
                    with open(f, "rb") as src:
                        chunk = src.read()
                except OSError:
                    continue
                if rnd.random() < 0.3:
                    chunk += base64.encodebytes(rnd.randbytes(len(chunk) // 2))
                chunk = chunk[: size - written]
                out.write(chunk)
                written += len(chunk)
                if written >= size:
                    break
    os.rename(tmp, path)
    return path


def user_frames_folded(frames):
    """The user frames of a folded stack (comm dropped), outermost first."""
    return [f for f in frames if not f.endswith("_[k]")]


def bpfscope_stacks(folded, comm):
    """[(user frames outermost first, count)] of comm's samples."""
    out = []
    for line in open(folded):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        if frames[0] == comm:
            out.append((user_frames_folded(frames[1:]), int(n)))
    return out


SYMOFF = re.compile(r"\+0x[0-9a-f]+$")


def perf_stacks(data, comm):
    """[(user frames outermost first, 1)] of comm's samples in perf.data.
    A frame line is `\\t ADDR SYM+OFF (DSO)`; kernel frames are those in
    [kernel.kallsyms] or at kernel addresses."""
    text = subprocess.run(["perf", "script", "-i", data], capture_output=True, text=True,
                          check=True).stdout
    out = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").splitlines()
        if not lines or lines[0].split()[:1] != [comm]:
            continue
        frames = []
        for l in lines[1:]:
            addr, _, rest = l.strip().partition(" ")
            sym, _, dso = rest.rpartition(" (")
            if dso.startswith("[kernel") or (len(addr) == 16 and addr.startswith("ffff")):
                continue
            frames.append(SYMOFF.sub("", sym))
        frames.reverse()
        out.append((frames, 1))
    return out


def reach(stacks):
    """(samples, reaching the entry, with no user frames, {stack: count}
    of the ones not reaching it)."""
    total = hit = empty = 0
    misses = {}
    for frames, n in stacks:
        total += n
        if any(f in ENTRY for f in frames):
            hit += n
        elif not frames:
            empty += n
        else:
            key = tuple(frames)
            misses[key] = misses.get(key, 0) + n
    return total, hit, empty, misses


def short(frames, keep=4):
    """A stack for printing: outermost frame, then the innermost few."""
    if len(frames) <= keep + 1:
        return ";".join(frames)
    return ";".join([frames[0], "..."] + list(frames[-keep:]))


def run_bpfscope(cmd, folded):
    """Profiles cmd; the wall time and bpfscope's `bpfscope:` stderr lines."""
    t = time.perf_counter()
    p = subprocess.run([BIN, "profile", "-F", str(HZ), "--duration", "3600", "-o", folded, "--", *cmd],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"bench: bpfscope profile failed ({p.returncode}):\n{p.stderr}")
    return wall, [l for l in p.stderr.splitlines() if l.startswith("bpfscope:")]


def run_perf(cmd, data, callgraph):
    """perf record's wall time and its own summary lines."""
    t = time.perf_counter()
    p = subprocess.run(["perf", "record", "-F", str(HZ), "--call-graph", callgraph, "-o", data, "--", *cmd],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"bench: perf record failed ({p.returncode}):\n{p.stderr}")
    return wall, [l.strip() for l in p.stderr.splitlines() if l.strip()]


def pct(n, d):
    return 100.0 * n / d if d else 0.0


def show_misses(name, result):
    total, hit, empty, misses = result
    missed = total - hit - empty
    if empty:
        print(f"    {name}: {empty} samples with no user frames")
    if missed:
        top = sorted(misses.items(), key=lambda kv: -kv[1])[:2]
        print(f"    {name}: {missed} samples stop short of the entry, most often:")
        for frames, n in top:
            print(f"      {n:5}  {short(frames)}")


def main():
    need_root()
    need("perf", "linux-perf")
    build()
    for tool in ("/usr/bin/python3.11", "/usr/bin/xz", "/usr/bin/gzip"):
        if not os.access(tool, os.X_OK):
            sys.exit(f"bench: {tool} is missing (python3.11, xz-utils, gzip)")
    scale = SECS / 5
    xz_in = input_file(max(1, round(XZ_MIB * scale)))
    gz_in = input_file(max(1, round(GZIP_MIB * scale)))
    workloads = [
        ("python", "python3.11", ["/usr/bin/python3.11", "-c", FIB, str(SECS)],
         f"python3.11 -c '<fib(20) in a loop>' {SECS:g}"),
        ("xz", "xz", ["/usr/bin/xz", "-9", "-T1", "-c", xz_in],
         f"xz -9 -T1 -c {os.path.basename(xz_in)} >/dev/null"),
        ("gzip", "gzip", ["/usr/bin/gzip", "-9", "-c", gz_in],
         f"gzip -9 -c {os.path.basename(gz_in)} >/dev/null"),
    ]
    tmp = tempfile.mkdtemp(dir=OUT)
    rows = []
    print(f"== user stacks reaching the program's entry, {HZ} Hz, one run per tool per workload")
    for label, comm, cmd, desc in workloads:
        folded = os.path.join(tmp, f"{label}.folded")
        data = os.path.join(tmp, f"{label}.perf.data")
        b_wall, b_lines = run_bpfscope(cmd, folded)
        ours = reach(bpfscope_stacks(folded, comm))
        p_wall, p_lines = run_perf(cmd, data, "dwarf")
        theirs = reach(perf_stacks(data, comm))
        os.remove(data)
        big = None
        if pct(theirs[1], theirs[0]) < 99.0:
            big_data = os.path.join(tmp, f"{label}.perf64k.data")
            run_perf(cmd, big_data, "dwarf,65528")
            big = reach(perf_stacks(big_data, comm))
            os.remove(big_data)
        print(f"-- {label}: {desc}  (bpfscope run {b_wall:.1f} s, perf run {p_wall:.1f} s)")
        for l in b_lines:
            print(f"    {l}")
        for l in p_lines:
            if l.startswith("[ perf record: Captured") or "lost" in l.lower():
                print(f"    perf: {l}")
        show_misses("bpfscope", ours)
        show_misses("perf", theirs)
        if big:
            show_misses("perf dwarf,65528", big)
        rows.append((label, ours, theirs, big))

    print()
    print(f"{'workload':10} {'bpfscope':>19} {'perf dwarf':>19} {'bpfscope/perf':>14} {'perf dwarf,65528':>19}")
    for label, ours, theirs, big in rows:
        a, b = pct(ours[1], ours[0]), pct(theirs[1], theirs[0])
        cell = lambda r: f"{pct(r[1], r[0]):6.2f}% of {r[0]:6}"
        bigcell = cell(big) if big else "(not run)"
        print(f"{label:10} {cell(ours):>19} {cell(theirs):>19} {ratio(a, b):14.3f} {bigcell:>19}")
    print("reach share = samples whose user stack contains main, __libc_start_call_main,")
    print("__libc_start_main(_impl) or _start, of the workload process's samples")
    for label, ours, theirs, _ in rows:
        r = ratio(pct(ours[1], ours[0]), pct(theirs[1], theirs[0]))
        print(f"ratio bpfscope/perf reach share, {label}: {r:.3f} (target >= 0.99) {'met' if r >= 0.99 else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
