#!/usr/bin/env python3
"""What a --filter costs at load time: bpfscope against bpftrace 0.17.

For 1, 2, 4, 8, 16 and 32 terms (a mix of numeric comparisons on fields and
builtins, string equality and prefix globs, negations, && and ||), both
tools run the same predicate on sys_enter_write to completion around
/bin/true (median wall time of runs), and each reports the instructions its
verifier processed: bpfscope's -v line, bpftrace's -v verifier log.
bpftrace 0.17 has no globs in predicates: a prefix glob `"ab*"` becomes
strncmp(comm, "ab", 2) == 0, the same test.
Target: 32 terms load well under 100 ms.
"""
import re
import subprocess
import sys

from common import BIN, build, need, need_root, ratio, wall

PROBE = "tracepoint:syscalls:sys_enter_write"
COUNTS = [1, 2, 4, 8, 16, 32]


def terms(n):
    """n terms as (bpfscope, bpftrace) pairs: none matches, so every one is evaluated."""
    out = []
    for i in range(n):
        k = i % 4
        if k == 0:
            out.append((f"pid == {1000000 + i}", f"pid == {1000000 + i}"))
        elif k == 1:
            out.append((f'comm == "nomatch{i}"', f'comm == "nomatch{i}"'))
        elif k == 2:
            out.append((f'comm == "zq{i}*"', f'strncmp(comm, "zq{i}", {len(str(i)) + 2}) == 0'))
        else:
            out.append((f"!(count != {900000 + i})", f"!(args->count != {900000 + i})"))
    return out


def predicate(n):
    t = terms(n)
    # Pairs of terms joined by && inside an || chain: both connectives, parentheses.
    ours, theirs = [], []
    for j in range(0, n, 2):
        a, b = t[j], t[j + 1] if j + 1 < n else None
        if b:
            ours.append(f"({a[0]} && {b[0]})")
            theirs.append(f"({a[1]} && {b[1]})")
        else:
            ours.append(a[0])
            theirs.append(a[1])
    return " || ".join(ours), " || ".join(theirs)


def ours_verifier(filt):
    p = subprocess.run([BIN, "count", PROBE, "-v", "--filter", filt, "--", "/bin/true"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None, None, p.stderr.strip().splitlines()[-1]
    m = re.search(r"loaded in ([\d.]+) ms; verifier processed: bpfscope_sysin (\d+) insns", p.stderr)
    return (float(m.group(1)), int(m.group(2)), None) if m else (None, None, "no -v load line")


def bt_prog(pred):
    return f"{PROBE} /{pred}/ {{ @ = count(); }}"


def theirs_verifier(pred):
    p = subprocess.run(["bpftrace", "-v", "-e", bt_prog(pred), "-c", "/bin/true"],
                       capture_output=True, text=True)
    found = re.findall(r"processed (\d+) insns", p.stdout + p.stderr)
    return max(map(int, found)) if found else None


def main():
    need_root()
    need("bpftrace", "bpftrace")
    build()
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print(f"load cost of a filter on sys_enter_write; complete runs around /bin/true, median of {runs}")
    print(f"{'terms':>5} {'bpfscope':>10} {'bpftrace':>10} {'ratio':>7}   "
          f"{'load ms':>8} {'insns':>7} {'bt insns':>9}")
    for n in COUNTS:
        ours, theirs = predicate(n)
        load_ms, insns, err = ours_verifier(ours)
        if err:
            print(f"{n:>5} bpfscope failed: {err}")
            continue
        a = wall([BIN, "count", PROBE, "--filter", ours, "--", "/bin/true"], runs)
        b = wall(["bpftrace", "-e", bt_prog(theirs), "-c", "/bin/true"], runs)
        bt_insns = theirs_verifier(theirs)
        print(f"{n:>5} {a * 1e3:8.1f}ms {b * 1e3:8.1f}ms {ratio(a, b):7.3f}   "
              f"{load_ms:8.1f} {insns:>7} {bt_insns if bt_insns is not None else '?':>9}")


if __name__ == "__main__":
    main()
