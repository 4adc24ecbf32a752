#!/usr/bin/env python3
"""bpfscope symbolize vs binutils addr2line (batch mode: one process, all
addresses on stdin) on 20,000 offsets in libc, symbolized through
libc6-dbg's separate debug file, in one run. Prints the wall-time ratio
and how often the function names agree.

Offsets are drawn (fixed seed) from inside libc's functions as the debug
file's symbol table lists them. libc's code segment has the same file
offsets and virtual addresses, so both tools get the same numbers:
bpfscope as file offsets by build id (found in /usr/lib/debug/.build-id),
addr2line as addresses in the debug file.
"""

import os
import random
import subprocess
import sys
import time

from common import BIN, TMP, build

N = 20000
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def build_id(path):
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "Build ID:" in line:
            return line.split()[-1]
    sys.exit(f"no build id in {path}")


def functions(debug):
    out = subprocess.run(["nm", "-S", "--defined-only", debug], capture_output=True, text=True).stdout
    funcs = []
    for line in out.splitlines():
        f = line.split()
        if len(f) == 4 and f[2] in "tTiW" and int(f[1], 16) > 0:
            funcs.append((int(f[0], 16), int(f[1], 16)))
    return funcs


def exec_bias(path):
    out = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split()
        # LOAD off vaddr paddr filesz memsz FLAGS... align; "R E" is two words.
        if f and f[0] == "LOAD" and "E" in f[6:-1]:
            return int(f[2], 16) - int(f[1], 16)
    return 0


def timed(cmd, stdin):
    t0 = time.perf_counter()
    out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - t0, out


def main():
    build()
    bid = build_id(LIBC)
    debug = f"/usr/lib/debug/.build-id/{bid[:2]}/{bid[2:]}.debug"
    if not os.path.exists(debug):
        sys.exit(f"libc's debug file {debug} is missing: apt-get install libc6-dbg")
    bias = exec_bias(LIBC)
    rnd = random.Random(42)
    funcs = functions(debug)
    addrs = []
    for _ in range(N):
        start, size = rnd.choice(funcs)
        addrs.append(start + rnd.randrange(size))
    offsets = "\n".join(f"{a - bias:#x}" for a in addrs) + "\n"
    vaddrs = "\n".join(f"{a:#x}" for a in addrs) + "\n"

    # Warm the page cache for both (the debug file is read either way).
    subprocess.run(["cat", debug], stdout=subprocess.DEVNULL)
    ours_t, ours = timed([BIN, "symbolize", "--build-id", bid], offsets)
    a2l_t, a2l = timed(["addr2line", "-f", "-e", debug], vaddrs)
    # With -i and -a, the whole inline chain per address (what bpfscope
    # prints too): its last name is the outer function.
    a2li_t, a2li = timed(["addr2line", "-a", "-f", "-i", "-e", debug], vaddrs)

    # bpfscope prints the innermost function first (as addr2line -f does)
    # and glibc's hidden aliases by their public names (__GI_x as x).
    def public(name):
        return name[5:] if name.startswith("__GI_") and len(name) > 5 else name

    ours_names = []
    for line in ours.splitlines():
        f = line.split()
        ours_names.append(f[1].rsplit("+", 1)[0] if len(f) > 1 and f[1] != "??" else "??")
    a2l_lines = a2l.splitlines()
    inner = [a2l_lines[i] for i in range(0, len(a2l_lines), 2)]
    outer, cur = [], None
    for line in a2li.splitlines():
        if line.startswith("0x"):
            if cur is not None:
                outer.append(cur)
            cur = None
        elif not line.startswith("/") and ":" not in line or line == "??":
            cur = line
    outer.append(cur)

    assert len(ours_names) == N and len(inner) == N and len(outer) == N, (len(ours_names), len(inner), len(outer))
    inner = [public(n) for n in inner]
    outer = [public(n) if n else n for n in outer]
    agree = sum(1 for o, i, x in zip(ours_names, inner, outer) if o in (i, x))
    unknown = sum(1 for o in ours_names if o == "??")
    print(f"{N} libc offsets through libc6-dbg's debug file")
    print(f"bpfscope symbolize (inline chains): {ours_t * 1000:.0f} ms; addr2line -f (batch): {a2l_t * 1000:.0f} ms; addr2line -f -i: {a2li_t * 1000:.0f} ms")
    print(f"ratio wall time bpfscope/addr2line -f -i: {ours_t / a2li_t:.3f} (target <= 0.5); bpfscope/addr2line -f: {ours_t / a2l_t:.3f}")
    print(f"names agreeing with addr2line (its function, or the outer function of its inline chain): {100.0 * agree / N:.2f}% (target >= 98%); ?? from bpfscope: {unknown}")
    with open(os.path.join(TMP, "symbolize-disagree.txt"), "w") as f:
        for a, o, i, x in zip(addrs, ours_names, inner, outer):
            if o not in (i, x):
                f.write(f"{a:#x} bpfscope={o} addr2line={i} outer={x}\n")


if __name__ == "__main__":
    main()
