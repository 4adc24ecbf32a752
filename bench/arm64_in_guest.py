#!/usr/bin/env python3
"""bpfscope on arm64, against its peers, inside an arm64 guest.

Run on the host: cross-builds the arm64 binary (scripts/cross-cargo), then
boots Debian's arm64 kernel with tests/guest/run-guest --arch arm64 and
runs the measurements inside it:

    bench/arm64_in_guest.py [--kernel 6.12|6.1] [RUNS]

1. Unwinding (bench/unwind_reach.py, run inside with the arm64 binary):
   the share of user stacks that reach the C runtime's entry on Debian's
   arm64 python3.11, xz and gzip, bpfscope profile against
   perf record --call-graph dwarf (BENCH_SECS, default 3 here).
2. `bpfscope run` against bpftrace 0.17 on three of Debian's tools in
   /usr/sbin (killsnoop, syscount, execsnoop; not opensnoop, whose
   sys_enter_open does not exist on arm64, where only openat does): wall
   time of a complete run
   `TOOL -c /bin/true FILE`, medians of RUNS (default 3), the two tools
   alternating.

The guest runs under TCG emulation (qemu-system-aarch64 on this x86_64
host), which distorts absolute times, and not every operation by the same
factor: only ratios are printed.
"""
import os
import statistics
import subprocess
import sys

from common import BIN, ROOT, ratio, wall

ARM_BIN = os.path.join(ROOT, "target", "aarch64-unknown-linux-gnu", "release", "bpfscope")
TOOLS = ["killsnoop", "syscount", "execsnoop"]


def host(argv):
    kernel = "6.12"
    if argv[:1] == ["--kernel"]:
        kernel, argv = argv[1], argv[2:]
    subprocess.run([os.path.join(ROOT, "scripts", "cross-cargo"), "arm64", "build", "--release",
                    "--locked", "--bin", "bpfscope"], check=True, cwd=ROOT)
    rc = subprocess.run([os.path.join(ROOT, "tests", "guest", "run-guest"), "--arch", "arm64",
                         "--kernel", kernel, "--share", ROOT, "--timeout", "3600",
                         "--env", f"BPFSCOPE_BIN={ARM_BIN}",
                         "--env", f"BENCH_SECS={os.environ.get('BENCH_SECS', '3')}", "--",
                         "python3", os.path.abspath(__file__), "--inside", *argv]).returncode
    sys.exit(rc)


def inside(argv):
    runs = int(argv[0]) if argv else 3
    print(f"kernel {os.uname().release} {os.uname().machine}, TCG emulation: "
          "absolute times are distorted, ratios only", flush=True)
    print("== 1. user stacks reaching the C runtime's entry (bench/unwind_reach.py)", flush=True)
    rc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "unwind_reach.py")]).returncode
    if rc:
        sys.exit(f"bench: unwind_reach.py failed ({rc})")

    print(f"== 2. bpfscope run vs bpftrace, complete run (-c /bin/true), median of {runs}",
          flush=True)
    for tool in TOOLS:
        script = f"/usr/sbin/{tool}.bt"
        ours, theirs = [], []
        for _ in range(runs):
            ours.append(wall([BIN, "run", "-c", "/bin/true", script], 1))
            theirs.append(wall(["bpftrace", "-c", "/bin/true", script], 1))
        o, t = statistics.median(ours), statistics.median(theirs)
        print(f"  {tool:10} bpfscope / bpftrace wall time: {ratio(o, t):6.3f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inside"]:
        inside(sys.argv[2:])
    else:
        host(sys.argv[1:])
