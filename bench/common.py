"""Helpers shared by the bench scripts: paths, building, the workload."""

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "bpfscope")
TMP = os.environ.get("BENCH_TMP", "/tmp/bpfscope-bench")


def build():
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    os.makedirs(TMP, exist_ok=True)


def workload():
    """The 3:1 split workload from the tests, built with frame pointers."""
    out = os.path.join(TMP, "split")
    src = os.path.join(ROOT, "tests", "workloads", "split.c")
    subprocess.run(
        ["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-o", out, src], check=True
    )
    return out


def need_root():
    if os.geteuid() != 0:
        print("bench: run as root (BPF and perf need it)", file=sys.stderr)
        sys.exit(2)


def cpu_seconds(pid):
    """CPU time of all threads of a process, in seconds, from schedstat
    (nanosecond resolution, unlike the tick-based utime/stime)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / 1e9


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def wait_for(pred, timeout=30.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False
