#!/usr/bin/env python3
"""JIT frames named from Node's perf map: bpfscope profile against perf
record + perf script, on the same script, in one run.

node runs tests/workloads/jssplit.js (3:1 between heavyJs and lightJs)
with --perf-basic-prof --interpreted-frames-native-stack, once under each
profiler at 499 Hz. For each: the samples whose leaf is JavaScript code
(named `JS:...` from the map, or an unnamed address in anonymous memory),
the share of those named, and heavyJs's share of the samples under either
function. Target: >= 95% named.
"""
import os
import re
import subprocess
import sys

from common import BIN, OUT, ROOT, build, need, need_root

SCRIPT = os.path.join(ROOT, "tests", "workloads", "jssplit.js")
NODE = ["node", "--perf-basic-prof", "--interpreted-frames-native-stack",
        "--logfile=/dev/null", "--no-logfile-per-isolate", SCRIPT, "4"]


def ours():
    out = os.path.join(OUT, "jit.folded")
    subprocess.run([BIN, "profile", "-F", "499", "--user-only", "-o", out, "--", *NODE],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stacks = []
    for line in open(out):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        if frames[0] == "node":
            stacks.append((frames[1:], int(n)))
    return stacks


def perfs():
    data = os.path.join(OUT, "jit.perf.data")
    subprocess.run(["perf", "record", "-F", "499", "-g", "-o", data, "--", *NODE],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    text = subprocess.run(["perf", "script", "-i", data, "-F", "comm,ip,sym,dso"],
                          check=True, capture_output=True, text=True).stdout
    stacks, cur, comm = [], [], None
    for line in text.splitlines():
        if not line.strip():
            if cur and comm == "node":
                stacks.append((list(reversed(cur)), 1))
            cur, comm = [], None
            continue
        if not line.startswith((" ", "\t")):
            comm = line.split()[0]
            continue
        m = re.match(r"\s*[0-9a-f]+\s+(.*)\s+\((.*)\)\s*$", line)
        if not m:
            continue
        sym, dso = m.group(1).strip(), m.group(2)
        if sym.startswith("[unknown]") and ("perf-" in dso or dso == "[unknown]" or "anon" in dso):
            sym = "[unknown]"
        cur.append(sym)
    if cur and comm == "node":
        stacks.append((list(reversed(cur)), 1))
    os.remove(data)
    return stacks


def summary(stacks):
    named = unknown = heavy = light = 0
    for frames, n in stacks:
        leaf = frames[-1] if frames else ""
        if leaf.startswith("JS:"):
            named += n
        elif leaf == "[unknown]":
            unknown += n
        if any(f.startswith("JS:~heavyJs ") or f.startswith("JS:^heavyJs ") or f.startswith("JS:*heavyJs ") for f in frames):
            heavy += n
        elif any(f.startswith("JS:~lightJs ") or f.startswith("JS:^lightJs ") or f.startswith("JS:*lightJs ") for f in frames):
            light += n
    return named, unknown, heavy, light


def main():
    need_root()
    need("perf", "linux-perf")
    need("node", "nodejs")
    build()
    rows = {"bpfscope": summary(ours()), "perf": summary(perfs())}
    print("== node --perf-basic-prof, jssplit.js, 499 Hz, 4 s: samples with a JavaScript leaf")
    for name, (named, unknown, heavy, light) in rows.items():
        js = named + unknown
        print(f"  {name:9} {named:5} of {js:5} named ({100 * named / max(js, 1):5.1f}%); "
              f"heavyJs share {100 * heavy / max(heavy + light, 1):5.1f}% ({heavy} vs {light})")
    ours_named = rows["bpfscope"][0] / max(rows["bpfscope"][0] + rows["bpfscope"][1], 1)
    print(f"  target >= 95% named: {100 * ours_named:.1f}%: {'met' if ours_named >= 0.95 else 'NOT met'}")
    for f in os.listdir("/tmp"):
        if f.startswith("perf-") and f.endswith(".map"):
            try:
                if "jssplit.js" in open(os.path.join("/tmp", f), errors="replace").read():
                    os.remove(os.path.join("/tmp", f))
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
