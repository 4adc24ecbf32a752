"""Helpers shared by the bench scripts: building, timing, starting tracers."""
import ctypes
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# BPFSCOPE_BIN=/path/to/bpfscope benches a binary built elsewhere (and
# skips the cargo build).
BIN = os.environ.get("BPFSCOPE_BIN") or os.path.join(ROOT, "target", "release", "bpfscope")
OUT = os.path.join(ROOT, "target", "bench")


def build():
    """Builds bpfscope in release mode (quietly when up to date), unless
    BPFSCOPE_BIN names the binary to bench."""
    if os.environ.get("BPFSCOPE_BIN"):
        if not os.access(BIN, os.X_OK):
            sys.exit(f"bench: BPFSCOPE_BIN={BIN} is not an executable")
    else:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    os.makedirs(OUT, exist_ok=True)


def cc(name, *flags):
    """Compiles bench/workloads/NAME.c into target/bench/NAME."""
    src = os.path.join(ROOT, "bench", "workloads", name + ".c")
    out = os.path.join(OUT, name)
    subprocess.run(["cc", "-O2", "-g", "-o", out, src, *flags], check=True)
    return out


def need(tool, package):
    if subprocess.run(["which", tool], capture_output=True).returncode != 0:
        sys.exit(f"bench: {tool} not found; install {package} (scripts/install-deps does)")


def wall(cmd, runs, env=None):
    """Median wall time in seconds of running cmd to completion."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class Background:
    """A tracer running in the background until stopped with SIGINT."""

    def __init__(self, cmd, ready, timeout=60, stream="stderr", env=None):
        """Starts cmd and waits for `ready` on its stderr (or stdout)."""
        pipe = dict(stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if stream == "stdout":
            pipe = dict(stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.p = subprocess.Popen(cmd, text=True, env=env, **pipe)
        deadline = time.time() + timeout
        for line in getattr(self.p, stream):
            if ready in line:
                break
            if time.time() > deadline:
                self.stop()
                sys.exit(f"bench: {cmd[0]} did not get ready")
        # bpftrace prints its banner just before attaching completes; give both a moment.
        time.sleep(0.5)

    def stop(self):
        self.p.send_signal(signal.SIGINT)
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()


def ratio(a, b):
    return a / b if b else float("inf")


# Profiling benches (profile_overhead.py, symbolize_libc.py, report_large.py).

TMP = OUT


def workload():
    """The 3:1 split workload from the tests, built with frame pointers."""
    out = os.path.join(OUT, "split")
    src = os.path.join(ROOT, "tests", "workloads", "split.c")
    subprocess.run(["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-o", out, src], check=True)
    return out


def need_root():
    if os.geteuid() != 0:
        sys.exit("bench: run as root (BPF and perf need it)")


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
    """A field of /proc/PID/status in KiB (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


# BPF run-time statistics (event_cost.py, run_vs_bpftrace.py).

class Stats:
    """BPF run-time statistics on while held (BPF_ENABLE_STATS): the
    kernel turns them off again when the descriptor closes, however this
    script ends."""

    def __enter__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        attr = (ctypes.c_uint8 * 64)()  # enable_stats.type = BPF_STATS_RUN_TIME (0)
        self.fd = libc.syscall(321, 32, attr, ctypes.sizeof(attr))  # SYS_bpf, BPF_ENABLE_STATS
        if self.fd < 0:
            sys.exit(f"bench: BPF_ENABLE_STATS: {os.strerror(ctypes.get_errno())}")
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def prog_stats(pid):
    """(run_time_ns, run_cnt) summed over the BPF programs a process holds."""
    t = n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        t += int(info.get("run_time_ns", "0"))
        n += int(info.get("run_cnt", "0"))
    return t, n


def stats_over(pid, work):
    """(run time in ns, runs) of the BPF programs pid holds while work()
    runs, with BPF run-time statistics on."""
    with Stats():
        t0, n0 = prog_stats(pid)
        work()
        t1, n1 = prog_stats(pid)
    return t1 - t0, n1 - n0
