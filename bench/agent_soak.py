#!/usr/bin/env python3
"""A soak of the always-on agent beside perf record, in one run: both run
for BENCH_SOAK_SECONDS (default 600) on a moderately busy machine where
processes come and go, and every BENCH_SOAK_STEP seconds (default 10) the
bench reads what each costs.

Workload, for the whole run: one CPU-bound process (the 3:1 split
workload, frame pointers) and bench/workloads/churn.c starting
BENCH_SOAK_RATE (default 100) short-lived processes a second (true, ls,
sh -c echo, gzip, cat), so pids keep coming and going. One CPU stays
mostly free: a busy process per CPU would hide the tools' costs.

Under test: `bpfscope agent` at 19 Hz in 60 s windows with 20 metrics
(`count tracepoint:syscalls:sys_enter_X --by comm` over 20 common
syscalls, read every 5 s) from a TOML config, windows written to a data
directory, /metrics scraped every step as a Prometheus would. Beside it:
`perf record -F 19 -a -g`, started together and stopped together.

Every step: each tool's CPU time (user and system of all its threads,
exited ones included: from a cgroup of its own, microseconds, or where
none can be made from /proc/PID/stat's 10 ms ticks), the run time of the
agent's BPF programs (kernel.bpf_stats_enabled, on for the run and
restored after, which itself adds two clock reads to every run; its
programs are the bpfscope_* ones it holds open), RSS,
the agent's open fds and the processes it tracks, perf.data's size and the
processes the churn started. The sampling and metric programs run in the
interrupted or tracing processes' context, so their time is in no
process's own CPU time; it is added to the agent's. perf's kernel side
(NMI stack walks, its ring buffer) has no such counter and is not in its
figure.

Printed: the samples over time, CPU as % of one core over the run
(agent user, system, BPF and total; perf), RSS start/max/end and its
slope over the second half, fds, the ratio agent/perf and the issue's
targets (agent total <= 0.3% of one core, RSS <= 64 MiB after 10
minutes), the agent's own counters from /metrics, and whether the agent
stopped on SIGTERM within 10 s (exit 0) leaving no program loaded.
Written: target/bench/agent_soak.svg (CPU % per interval and RSS over
time, both tools) and target/bench/agent_soak.csv.

Run as root: python3 bench/agent_soak.py (BPFSCOPE_BIN=PATH to bench a
binary built elsewhere; BENCH_SOAK_SECONDS=60 BENCH_SOAK_STEP=5 for a
quick try).
"""

import collections
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from common import BIN, OUT, Background, build, cc, need, need_root, ratio, status_kib, workload

SECS = float(os.environ.get("BENCH_SOAK_SECONDS", "600"))
STEP = float(os.environ.get("BENCH_SOAK_STEP", "10"))
RATE = int(os.environ.get("BENCH_SOAK_RATE", "100"))
HZ = 19
WINDOW = 60
CPU_TARGET = 0.3  # % of one core, agent total
RSS_TARGET_MIB = 64
TICK = os.sysconf("SC_CLK_TCK")
STATS = "/proc/sys/kernel/bpf_stats_enabled"

# 20 syscalls every process makes; spares stand in for any without a
# tracepoint on this kernel.
SYSCALLS = [
    "read", "write", "openat", "close", "mmap", "munmap", "mprotect", "brk", "futex", "clone",
    "clone3", "execve", "wait4", "exit_group", "newfstatat", "rt_sigaction", "rt_sigprocmask",
    "pipe2", "getdents64", "ioctl",
]
SPARES = ["lseek", "pread64", "access", "statx", "readlink", "dup2", "kill", "getpid", "fcntl"]


# -- the workload ------------------------------------------------------------

def tracepoint_dir():
    for d in ("/sys/kernel/tracing/events/syscalls", "/sys/kernel/debug/tracing/events/syscalls"):
        if os.path.isdir(d):
            return d
    sys.exit("bench: no syscalls tracepoints (tracefs not mounted?)")


def syscalls():
    d = tracepoint_dir()
    have = lambda s: os.path.isdir(os.path.join(d, "sys_enter_" + s))
    chosen = [s for s in SYSCALLS if have(s)]
    chosen += [s for s in SPARES if have(s)][: 20 - len(chosen)]
    if len(chosen) < 20:
        sys.exit(f"bench: only {len(chosen)} of the syscall tracepoints wanted exist in {d}")
    return chosen


def write_config(path, listen, names):
    lines = [
        f'listen = "{listen}"',
        "",
        "[profile]",
        f"hz = {HZ}",
        f"window_seconds = {WINDOW}",
        "",
        "[metrics]",
        "interval_seconds = 5",
    ]
    for s in names:
        lines += [
            "",
            "[[metric]]",
            f'name = "sys_{s}"',
            f'spec = "count tracepoint:syscalls:sys_enter_{s} --by comm"',
        ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_group(cmd):
    """A workload process in a process group of its own (killed whole)."""
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def kill_group(p):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def forks_since_boot():
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("processes "):
                return int(line.split()[1])
    return 0


# -- what the tools cost -----------------------------------------------------

def proc_times(pid):
    """User and system CPU seconds of all threads, exited ones included
    (/proc/PID/stat; schedstat would miss threads that have ended, and the
    agent's symbolizing threads end after every window)."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) / TICK, int(rest[12]) / TICK


class CpuGroup:
    """A cgroup of its own for one process, for its CPU time at microsecond
    resolution (all its threads, exited ones included, until and after it
    exits); /proc/PID/stat's 10 ms ticks are 0.1% of a core over a 10 s
    step, a third of the target. cgroup v2 (cpu.stat) or v1 cpuacct; where
    neither can be made, times() is None and /proc/PID/stat is used."""

    def __init__(self, name, pid):
        self.dir = self.kind = None
        for kind, root in self.roots():
            d = os.path.join(root, name)
            try:
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            except OSError:
                with contextlib.suppress(OSError):
                    os.rmdir(d)
                continue
            self.dir, self.kind = d, kind
            break

    @staticmethod
    def roots():
        v2, v1 = [], []
        with open("/proc/mounts") as f:
            for line in f:
                _, mp, fs, opts = line.split()[:4]
                if fs == "cgroup2":
                    v2.append(("v2", mp))
                elif fs == "cgroup" and "cpuacct" in opts.split(","):
                    v1.append(("v1", mp))
        return v2 + v1

    def times(self):
        """User and system CPU seconds since the process moved in."""
        if not self.dir:
            return None
        try:
            if self.kind == "v2":
                with open(os.path.join(self.dir, "cpu.stat")) as f:
                    st = dict(line.split() for line in f)
                return int(st["user_usec"]) / 1e6, int(st["system_usec"]) / 1e6
            read = lambda n: int(open(os.path.join(self.dir, n)).read()) / 1e9
            return read("cpuacct.usage_user"), read("cpuacct.usage_sys")
        except (OSError, KeyError, ValueError):
            return None

    def source(self):
        return {"v2": "cgroup v2 cpu.stat", "v1": "cgroup v1 cpuacct"}.get(self.kind, "/proc/PID/stat")

    def remove(self):
        """Once the process has exited (an empty group can go)."""
        if self.dir:
            with contextlib.suppress(OSError):
                os.rmdir(self.dir)


def cpu_times(pid, group):
    t = group.times() if group else None
    return t if t is not None else proc_times(pid)


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def held_prog_ids(pid):
    """Ids of the BPF programs the process holds open (prog and link fds)."""
    ids = set()
    d = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(d):
        try:
            with open(os.path.join(d, fd)) as f:
                for line in f:
                    if line.startswith("prog_id:"):
                        ids.add(int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
    return ids


def bpf_progs():
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    try:
        return json.loads(out.stdout or "[]")
    except json.JSONDecodeError:
        return []


def ours(prog):
    return prog.get("name", "").startswith("bpfscope")


def scrape(addr, path="/metrics"):
    """Samples of an OpenMetrics page: {(name, ((label, value), ...)): value}."""
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or line.startswith("#"):
            continue
        labels = tuple(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        with contextlib.suppress(ValueError):
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def one(metrics, name):
    return metrics.get((name, ()))


class Agent:
    """The agent under test: started with common.Background (ready on its
    `Listening on` line), its stderr drained from then on (a full pipe
    would stop it) into the last lines kept."""

    def __init__(self, cmd):
        # bpfscope_* programs of other processes already loaded are not its.
        self.foreign = {q["id"] for q in bpf_progs() if ours(q)}
        self.bg = Background(cmd, "Listening on", timeout=180)
        self.p = self.bg.p
        self.lines = collections.deque(maxlen=40)
        if self.p.poll() is not None:
            sys.exit(f"bench: the agent exited ({self.p.returncode}) before it listened; "
                     f"run it by hand: {' '.join(cmd)}")
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()
        # Every BPF program it ever held (by id) and its last run time.
        self.progs = {}
        self.first = None
        self.by_name = False

    def _drain(self):
        for line in self.p.stderr:
            self.lines.append(line.rstrip("\n"))

    def bpf_time(self):
        """Run time in seconds and runs of its programs: the bpfscope_*
        programs it holds open, or if its fds name none, those loaded
        since it started. Programs that went away keep their last figure."""
        held = held_prog_ids(self.p.pid)
        progs = [q for q in bpf_progs() if ours(q)]
        if held:
            mine = [q for q in progs if q["id"] in held]
        else:
            self.by_name = True
            mine = [q for q in progs if q["id"] not in self.foreign]
        for q in mine:
            self.progs[q["id"]] = (q.get("name", ""), q.get("run_time_ns", 0), q.get("run_cnt", 0))
        if self.first is None:
            self.first = dict(self.progs)
        ns = sum(v[1] for v in self.progs.values())
        runs = sum(v[2] for v in self.progs.values())
        return ns / 1e9, runs


def wait_rusage(p, timeout):
    """Waits up to timeout for p to exit; its exit code and total CPU
    seconds (rusage: user + system, all threads, microseconds), or None
    if it is still running."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return p.returncode, ru.ru_utime + ru.ru_stime
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def stop(p, sig, timeout):
    """Stops p with sig, then SIGKILL after timeout (cleanup path)."""
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        p.send_signal(sig)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


@contextlib.contextmanager
def bpf_stats():
    """kernel.bpf_stats_enabled=1 for the block, the old value back after."""
    with open(STATS) as f:
        before = f.read().strip()
    with open(STATS, "w") as f:
        f.write("1")
    try:
        yield
    finally:
        with open(STATS, "w") as f:
            f.write(before)
        print(f"kernel.bpf_stats_enabled restored to {before}")


def on_sigterm(*_):
    raise KeyboardInterrupt


# -- the run -----------------------------------------------------------------

def sample(t, agent, perf, groups, perf_data, countfile, addr, scrapes):
    ut, st = cpu_times(agent.p.pid, groups["agent"])
    bpf, runs = agent.bpf_time()
    put, pst = cpu_times(perf.pid, groups["perf"])
    s = {
        "t": t,
        "agent_user_s": ut,
        "agent_sys_s": st,
        "agent_bpf_s": bpf,
        "agent_bpf_runs": runs,
        "agent_rss_kib": status_kib(agent.p.pid, "VmRSS"),
        "agent_fds": fd_count(agent.p.pid),
        "perf_cpu_s": put + pst,
        "perf_rss_kib": status_kib(perf.pid, "VmRSS"),
        "perf_data_bytes": os.path.getsize(perf_data) if os.path.exists(perf_data) else 0,
        "spawned": read_int(countfile),
        "tracked": "",
        "stacks": "",
    }
    s["agent_cpu_s"] = ut + st + bpf
    # Since the start, for what the tools took to start and to stop.
    s["agent_stat_s"] = sum(proc_times(agent.p.pid))
    s["perf_stat_s"] = sum(proc_times(perf.pid))
    if scrapes:
        try:
            m = scrape(addr)
            s["tracked"] = int(one(m, "bpfscope_agent_processes_tracked") or 0)
            s["stacks"] = int(one(m, "bpfscope_agent_stacks_cached") or 0)
        except OSError:
            scrapes["failed"] += 1
        scrapes["n"] += 1
    return s


def run(stack, tmp):
    names = syscalls()
    split = workload()
    churn = cc("churn")
    gzin = os.path.join(tmp, "gzip.in")
    with open(gzin, "w") as f:
        f.write("".join(f"line {i} of a small file for gzip to compress\n" for i in range(400)))
    countfile = os.path.join(tmp, "churn.count")
    datadir = os.path.join(tmp, "data")
    perf_data = os.path.join(tmp, "perf.data")
    perf_log = os.path.join(tmp, "perf.log")
    cfg = os.path.join(tmp, "agent.toml")
    addr = f"127.0.0.1:{free_port()}"
    write_config(cfg, addr, names)

    forks0 = forks_since_boot()
    busy = start_group([split, "soak_busy", str(int(SECS) + 600)])
    stack.callback(kill_group, busy)
    spawner = start_group([churn, str(RATE), countfile, gzin])
    stack.callback(kill_group, spawner)
    time.sleep(2)

    cmd = [BIN, "agent", "--config", cfg, "--listen", addr, "--profile-hz", str(HZ),
           "--window", str(WINDOW), "--data-dir", datadir]
    print(f"agent: {' '.join(cmd)}")
    print(f"  20 metrics: count tracepoint:syscalls:sys_enter_{{{','.join(names)}}} --by comm")
    # Emptied groups go after both tools have stopped (callbacks run last first).
    groups = {}
    stack.callback(lambda: [g.remove() for g in groups.values()])
    t_start = time.monotonic()
    agent = Agent(cmd)
    t_ready = time.monotonic()
    stack.callback(stop, agent.p, signal.SIGTERM, 10)
    with open(perf_log, "w") as log:
        perf = subprocess.Popen(["perf", "record", "-F", str(HZ), "-a", "-g", "-o", perf_data],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    stack.callback(stop, perf, signal.SIGINT, 120)
    tag = f"bpfscope-soak-{os.getpid()}"
    groups.update(agent=CpuGroup(tag + "-agent", agent.p.pid), perf=CpuGroup(tag + "-perf", perf.pid))
    time.sleep(1)
    if perf.poll() is not None:
        with open(perf_log) as f:
            sys.exit(f"bench: perf record exited ({perf.returncode}): {f.read().strip()}")
    print(f"agent ready in {t_ready - t_start:.1f} s; perf record -F {HZ} -a -g started; "
          f"workload: 1 CPU-bound process + churn at {RATE} processes/s; "
          f"sampling every {STEP:g} s for {SECS:g} s", flush=True)

    scrapes = {"n": 0, "failed": 0}
    samples = []
    t0 = time.monotonic()
    k = 0
    while True:
        if agent.p.poll() is not None or perf.poll() is not None:
            who = "agent" if agent.p.poll() is not None else "perf"
            tail = "\n  ".join(agent.lines) if who == "agent" else open(perf_log).read()
            sys.exit(f"bench: {who} exited during the run\n  {tail}")
        s = sample(time.monotonic() - t0, agent, perf, groups, perf_data, countfile, addr, scrapes)
        samples.append(s)
        if len(samples) > 1:
            a, b = samples[-2], s
            dt = b["t"] - a["t"]
            print(f"  t={b['t']:5.0f}s agent {100 * (b['agent_cpu_s'] - a['agent_cpu_s']) / dt:6.3f}% "
                  f"{b['agent_rss_kib'] / 1024:6.1f} MiB | perf {100 * (b['perf_cpu_s'] - a['perf_cpu_s']) / dt:6.3f}% "
                  f"{b['perf_rss_kib'] / 1024:6.1f} MiB | {b['spawned']} started", flush=True)
        if s["t"] >= SECS - 0.5:
            break
        k += 1
        time.sleep(max(0.0, t0 + min(k * STEP, SECS) - time.monotonic()))

    hwm = status_kib(agent.p.pid, "VmHWM")
    try:
        final = scrape(addr)
    except OSError as e:
        final = {}
        print(f"bench: scraping /metrics at the end failed: {e}")
    forks = forks_since_boot() - forks0
    held = held_prog_ids(agent.p.pid)
    agent_ids = set(agent.progs)
    # Per program over the sampled window: name, run time (ns), runs.
    per_prog = {i: (v[0], v[1] - agent.first.get(i, (0, 0, 0))[1], v[2] - agent.first.get(i, (0, 0, 0))[2])
                for i, v in agent.progs.items()}
    if agent.by_name:
        print("NOTE: the agent's fds named no BPF program; its programs were taken to be the bpfscope_* "
              "ones loaded since it started")

    # Stop both together: the agent with SIGTERM (it must write its window
    # and exit 0 within 10 s), perf with SIGINT (it then finishes its file).
    t_stop = time.monotonic()
    agent.p.send_signal(signal.SIGTERM)
    perf.send_signal(signal.SIGINT)
    a_exit = wait_rusage(agent.p, 10)
    a_stop_s = time.monotonic() - t_stop
    if a_exit is None:
        print("bench: the agent did not exit within 10 s of SIGTERM; killing it")
        stop(agent.p, signal.SIGKILL, 5)
    p_exit = wait_rusage(perf, 120)
    if p_exit is None:
        stop(perf, signal.SIGKILL, 5)
    p_stop_s = time.monotonic() - t_stop
    # CPU taken to stop: from the group (still readable after the exit), or
    # from rusage against /proc/PID/stat at the last step.
    last = samples[-1]
    stop_cpu = {}
    for name, ex in (("agent", a_exit), ("perf", p_exit)):
        t = groups[name].times()
        if t is not None and groups[name].kind:
            base = last[f"{name}_user_s"] + last[f"{name}_sys_s"] if name == "agent" else last["perf_cpu_s"]
            stop_cpu[name] = sum(t) - base
        elif ex is not None:
            stop_cpu[name] = ex[1] - last[f"{name}_stat_s"]
    perf_bytes = os.path.getsize(perf_data) if os.path.exists(perf_data) else 0
    with open(perf_log) as f:
        perf_lines = [l.strip() for l in f if l.startswith("[ perf record") or "lost" in l.lower()]

    # Programs are freed a moment after their last fd closes.
    left = []
    for _ in range(50):
        left = [q for q in bpf_progs() if ours(q)]
        if not left:
            break
        time.sleep(0.1)
    data_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(datadir) for f in fs)
    data_files = sum(len(fs) for _, _, fs in os.walk(datadir))

    return dict(samples=samples, names=names, hwm=hwm, final=final, forks=forks, held=held,
                agent_ids=agent_ids, per_prog=per_prog, a_exit=a_exit, a_stop_s=a_stop_s, p_exit=p_exit,
                p_stop_s=p_stop_s, stop_cpu=stop_cpu, cpu_source=groups["agent"].source(), perf_bytes=perf_bytes, perf_lines=perf_lines, left=left,
                data_bytes=data_bytes, data_files=data_files, lines=list(agent.lines),
                startup_s=t_ready - t_start, scrapes=scrapes)


# -- the report --------------------------------------------------------------

def slope_per_min(points):
    """Least-squares slope of (seconds, KiB) points, in KiB per minute."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return 60.0 * sxy / sxx if sxx else 0.0


def intervals(samples):
    """Per interval (end time): agent total, agent BPF and perf CPU in % of one core."""
    out = []
    for a, b in zip(samples, samples[1:]):
        dt = b["t"] - a["t"]
        out.append((b["t"],
                    100 * (b["agent_cpu_s"] - a["agent_cpu_s"]) / dt,
                    100 * (b["agent_bpf_s"] - a["agent_bpf_s"]) / dt,
                    100 * (b["perf_cpu_s"] - a["perf_cpu_s"]) / dt))
    return out


COLUMNS = ["t", "agent_cpu_s", "agent_user_s", "agent_sys_s", "agent_bpf_s", "agent_bpf_runs",
           "agent_stat_s", "agent_rss_kib", "agent_fds", "tracked", "stacks", "perf_cpu_s", "perf_stat_s",
           "perf_rss_kib",
           "perf_data_bytes", "spawned"]


def write_csv(path, samples):
    with open(path, "w") as f:
        f.write(",".join(COLUMNS) + "\n")
        for s in samples:
            f.write(",".join(f"{s[c]:.3f}" if isinstance(s[c], float) else str(s[c]) for c in COLUMNS) + "\n")


def nice_step(span, n=5):
    """A round tick step (1, 2, 2.5 or 5 times a power of ten) giving about n ticks."""
    raw = span / n if span > 0 else 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5):
        if raw <= m * mag * 1.0000001:
            return m * mag
    return 10 * mag


def fmt(v):
    return f"{v:g}" if abs(v) >= 1 or v == 0 else f"{v:.3g}"


def chart(x0, y0, w, h, title, ylabel, xmax, xunit, series, target=None, ycap=None):
    """An SVG line chart at (x0, y0) of w x h (plot area), series as
    (label, color, dash, [(x, y)...]); target: (label, y) as a dashed line.
    Values above ycap (if given) are drawn at the top edge, labelled."""
    ymax = max([y for _, _, _, pts in series for _, y in pts] + [target[1] if target else 0, 1e-9])
    if ycap is not None:
        ymax = min(ymax, ycap)
    ymax *= 1.15
    ystep = nice_step(ymax)
    ytop = ystep * (int(ymax / ystep) + (0 if ymax % ystep == 0 else 1))
    xstep = nice_step(xmax, 6)
    px = lambda x: x0 + w * x / xmax
    py = lambda y: y0 + h - h * y / ytop
    out = [f'<text x="{x0}" y="{y0 - 12}" font-size="14" font-weight="bold">{title}</text>']
    # Grid and ticks.
    y = 0.0
    while y <= ytop + 1e-12:
        out.append(f'<line x1="{x0}" y1="{py(y):.1f}" x2="{x0 + w}" y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 - 6}" y="{py(y) + 4:.1f}" font-size="11" text-anchor="end">{fmt(y)}</text>')
        y += ystep
    x = 0.0
    while x <= xmax + 1e-9:
        out.append(f'<line x1="{px(x):.1f}" y1="{y0 + h}" x2="{px(x):.1f}" y2="{y0 + h + 4}" stroke="#333"/>')
        out.append(f'<text x="{px(x):.1f}" y="{y0 + h + 17}" font-size="11" text-anchor="middle">{fmt(x)}</text>')
        x += xstep
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" font-size="12" text-anchor="middle">time ({xunit})</text>')
    out.append(f'<text x="{x0 - 48}" y="{y0 + h / 2}" font-size="12" text-anchor="middle" '
               f'transform="rotate(-90 {x0 - 48} {y0 + h / 2})">{ylabel}</text>')
    if target:
        out.append(f'<line x1="{x0}" y1="{py(target[1]):.1f}" x2="{x0 + w}" y2="{py(target[1]):.1f}" '
                   f'stroke="#c00" stroke-dasharray="6 4"/>')
        out.append(f'<text x="{x0 + w - 4}" y="{py(target[1]) - 4:.1f}" font-size="11" fill="#c00" '
                   f'text-anchor="end">{target[0]}</text>')
    for i, (label, color, dash, pts) in enumerate(series):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        if pts:
            d = " ".join(f"{px(x):.1f},{py(min(y, ytop)):.1f}" for x, y in pts)
            for x, y in pts:
                if y > ytop:
                    out.append(f'<text x="{px(x) + 3:.1f}" y="{y0 + 12}" font-size="10" fill="{color}">'
                               f'{y:.3g} (off scale)</text>')
            out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"{extra}/>')
        lx, ly = x0 + 10 + 190 * i, y0 + 16
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 22}" y2="{ly - 4}" stroke="{color}" '
                   f'stroke-width="2"{extra}/>')
        out.append(f'<text x="{lx + 28}" y="{ly}" font-size="12">{label}</text>')
    return out


def write_svg(path, samples, dur, caption):
    minutes = dur >= 180
    scale, unit = (1 / 60, "min") if minutes else (1.0, "s")
    xmax = dur * scale
    iv = intervals(samples)
    w, h, left = 760, 230, 80
    body = ['<rect width="100%" height="100%" fill="white"/>']
    body += chart(left, 50, w, h, f"CPU per {STEP:g} s interval, % of one core", "% of one core", xmax, unit, [
        ("agent (process + BPF)", "#1f5fbf", None, [(t * scale, a) for t, a, _, _ in iv]),
        ("agent BPF programs", "#1f5fbf", "3 3", [(t * scale, b) for t, _, b, _ in iv]),
        ("perf record -F 19 -a -g", "#e07000", None, [(t * scale, p) for t, _, _, p in iv]),
    ], target=(f"target {CPU_TARGET}%", CPU_TARGET),
        # The first interval holds the end of the agent's start; let it go
        # off scale rather than flatten the rest.
        ycap=1.3 * max([a for _, a, _, _ in iv[1:]] + [p for _, _, _, p in iv] + [CPU_TARGET]) if len(iv) > 2 else None)
    body += chart(left, 50 + h + 90, w, h, "Resident memory (VmRSS)", "MiB", xmax, unit, [
        ("agent", "#1f5fbf", None, [(s["t"] * scale, s["agent_rss_kib"] / 1024) for s in samples]),
        ("perf record", "#e07000", None, [(s["t"] * scale, s["perf_rss_kib"] / 1024) for s in samples]),
    ], target=(f"target {RSS_TARGET_MIB} MiB", RSS_TARGET_MIB))
    W, H = left + w + 30, 50 + 2 * h + 90 + 50 + 18 * len(caption)
    for i, line in enumerate(caption):
        body.append(f'<text x="{left}" y="{50 + 2 * h + 90 + 60 + 18 * i}" font-size="12" fill="#333">{line}</text>')
    with open(path, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
                f'viewBox="0 0 {W} {H}" font-family="sans-serif">\n')
        f.write("\n".join(body) + "\n</svg>\n")


def report(r):
    samples = r["samples"]
    first, last = samples[0], samples[-1]
    dur = last["t"] - first["t"]
    if dur <= 0:
        sys.exit("bench: the run was too short to measure")
    pct = lambda key: 100.0 * (last[key] - first[key]) / dur
    mib = lambda kib: kib / 1024

    print(f"\n== samples every {STEP:g} s (CPU: % of one core over the interval before)")
    print(f"{'t s':>6} {'agent%':>7} {'bpf%':>6} {'RSS MiB':>8} {'fds':>5} {'tracked':>8} {'stacks':>7} | "
          f"{'perf%':>7} {'RSS MiB':>8} {'data MiB':>9} | {'started':>8}")
    iv = {t: (a, b, p) for t, a, b, p in intervals(samples)}
    for s in samples:
        a, b, p = iv.get(s["t"], (None, None, None))
        c = lambda v, w: f"{v:{w}.3f}" if v is not None else f"{'-':>{w}}"
        print(f"{s['t']:6.0f} {c(a, 7)} {c(b, 6)} {mib(s['agent_rss_kib']):8.1f} {s['agent_fds']:5} "
              f"{str(s['tracked']):>8} {str(s['stacks']):>7} | {c(p, 7)} {mib(s['perf_rss_kib']):8.1f} "
              f"{s['perf_data_bytes'] / 2**20:9.2f} | {s['spawned']:8}")

    user, sys_, bpf = pct("agent_user_s"), pct("agent_sys_s"), pct("agent_bpf_s")
    total = user + sys_ + bpf
    perf = pct("perf_cpu_s")
    spawned = last["spawned"] - first["spawned"]
    runs = last["agent_bpf_runs"] - first["agent_bpf_runs"]
    print(f"\n== totals over {dur:.0f} s, {spawned} processes started by the churn ({spawned / dur:.0f}/s; "
          f"{r['forks']} forks on the machine from the workload's start)")
    print(f"agent CPU: user {user:.3f}% + system {sys_:.3f}% + BPF {bpf:.3f}% = {total:.3f}% of one core"
          f" (BPF: {runs / dur:.0f} runs/s, {1e9 * (last['agent_bpf_s'] - first['agent_bpf_s']) / max(runs, 1):.0f} ns each)")
    if len(samples) > 2:
        s1 = samples[1]
        d2 = last["t"] - s1["t"]
        print(f"agent CPU from t={s1['t']:.0f} s on (without the end of its start): "
              f"{100 * (last['agent_cpu_s'] - s1['agent_cpu_s']) / d2:.3f}% of one core "
              f"(BPF {100 * (last['agent_bpf_s'] - s1['agent_bpf_s']) / d2:.3f}%)")
    top = sorted(r["per_prog"].items(), key=lambda kv: -kv[1][1])
    by_name = collections.defaultdict(lambda: [0, 0, 0])
    for _, (name, ns, n) in top:
        by_name[name][0] += ns
        by_name[name][1] += n
        by_name[name][2] += 1
    print("agent BPF programs by run time: " + "; ".join(
        f"{name}{f' x{k}' if k > 1 else ''} {100 * ns / 1e9 / dur:.3f}% ({n / dur:.0f} runs/s, {ns / max(n, 1):.0f} ns)"
        for name, (ns, n, k) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:6]))
    print(f"perf CPU:  {perf:.3f}% of one core (its process only; its in-kernel sampling is not counted)")
    print(f"ratio agent total CPU / perf CPU: {ratio(total, perf):.2f}")
    a_end, p_end = r["stop_cpu"].get("agent"), r["stop_cpu"].get("perf")
    print(f"(process CPU time from {r['cpu_source']})")
    print(f"not in the figures above: agent {first['agent_stat_s']:.2f} s CPU to start "
          f"(ready in {r['startup_s']:.1f} s) and "
          + (f"{a_end:.2f} s to stop ({r['a_stop_s']:.1f} s, last window written)" if a_end is not None
             else "an unmeasured stop")
          + f"; perf {first['perf_stat_s']:.2f} s to start and "
          + (f"{p_end:.2f} s to stop ({r['p_stop_s']:.1f} s)" if p_end is not None else "an unmeasured stop"))

    def rss_line(name, key, hwm=None):
        vals = [s[key] for s in samples]
        half = [(s["t"], s[key]) for s in samples if s["t"] >= first["t"] + dur / 2]
        extra = f", peak (VmHWM) {mib(hwm):.1f}" if hwm else ""
        print(f"{name} RSS MiB: start {mib(vals[0]):.1f}, max {mib(max(vals)):.1f}, end {mib(vals[-1]):.1f}"
              f"{extra}; slope over the second half {slope_per_min(half):+.1f} KiB/min")
        return mib(vals[-1]), mib(max(vals))

    a_rss_end, a_rss_max = rss_line("agent", "agent_rss_kib", r["hwm"])
    rss_line("perf ", "perf_rss_kib")
    print(f"agent fds: start {first['agent_fds']}, end {last['agent_fds']}; processes tracked: start "
          f"{first['tracked']}, end {last['tracked']}; stacks cached: end {last['stacks']}")
    print(f"agent data dir: {r['data_files']} files, {r['data_bytes'] / 2**20:.2f} MiB; "
          f"perf.data: {r['perf_bytes'] / 2**20:.2f} MiB")
    if r["scrapes"]["failed"]:
        print(f"NOTE: {r['scrapes']['failed']} of {r['scrapes']['n']} scrapes of /metrics failed")

    print("\n== targets")
    note = "" if dur >= 590 else f" (this run: {dur:.0f} s, the target is for a 10-minute run)"
    ok = total <= CPU_TARGET
    print(f"agent total CPU <= {CPU_TARGET}% of one core: {total:.3f}%: {'PASS' if ok else 'FAIL'}")
    ok = a_rss_end <= RSS_TARGET_MIB
    print(f"agent RSS <= {RSS_TARGET_MIB} MiB at the end{note}: {a_rss_end:.1f} MiB (max {a_rss_max:.1f}): "
          f"{'PASS' if ok else 'FAIL'}")

    print("\n== the agent's own counters (/metrics at the end)")
    m = r["final"]
    if m:
        taken = one(m, "bpfscope_agent_samples_taken_total")
        got = one(m, "bpfscope_agent_samples_total")
        num = lambda v, digits=0: "-" if v is None else f"{v:.{digits}f}"
        print(f"samples_total {num(got)}, samples_taken_total {num(taken)}, "
              f"windows_total {num(one(m, 'bpfscope_agent_windows_total'))}")
        lost = [(dict(l).get("reason", ""), v) for (n, l), v in m.items()
                if n == "bpfscope_agent_samples_lost_total" and v]
        print("samples lost: " + (", ".join(f"{w} {v:.0f}" for w, v in lost) if lost else "none"))
        mlost = [(dict(l), v) for (n, l), v in m.items() if n == "bpfscope_metric_lost_events_total" and v]
        if mlost:
            print("metric events lost: " + ", ".join(f"{l} {v:.0f}" for l, v in mlost))
        cpu = one(m, "bpfscope_agent_cpu_seconds_total")
        bpf_m = sum(v for (n, l), v in m.items()
                    if n == "bpfscope_bpf_prog_run_seconds_total" and dict(l).get("name", "").startswith("bpfscope"))
        print(f"cross-check: agent_cpu_seconds_total {num(cpu, 2)} "
              f"(bench, /proc/PID/stat: {last['agent_stat_s']:.2f} at the last step); "
              f"bpf_prog_run_seconds_total of bpfscope_* {bpf_m:.3f} "
              f"(bench: {last['agent_bpf_s']:.3f})")
    else:
        print("(no /metrics)")

    print("\n== stopping")
    if r["a_exit"] is None:
        print("agent: did not exit within 10 s of SIGTERM (killed): FAIL")
    else:
        code = r["a_exit"][0]
        print(f"agent: exit {code} {r['a_stop_s']:.1f} s after SIGTERM: {'PASS' if code == 0 else 'FAIL'}")
    mine = [q for q in r["left"] if q["id"] in r["agent_ids"]]
    others = [q for q in r["left"] if q["id"] not in r["agent_ids"]]
    progs = lambda qs: ", ".join(f"{q['id']}:{q.get('name')}" for q in qs)
    print(f"agent's BPF programs left loaded: {len(mine)} of the {len(r['agent_ids'])} it held: "
          + ("PASS" if not mine else "FAIL " + progs(mine)))
    if others:
        print(f"NOTE: {len(others)} other bpfscope_* programs are loaded (another bpfscope running?): "
              + progs(others))
    code = r["p_exit"][0] if r["p_exit"] else None
    how = "killed" if code is None else "on SIGINT, as perf does" if code == -signal.SIGINT else f"exit {code}"
    print(f"perf: {how}; " + "; ".join(r["perf_lines"]))
    if r["lines"]:
        print("agent stderr after it listened (last lines):")
        for l in r["lines"][-10:]:
            print(f"  {l}")

    csv, svg = os.path.join(OUT, "agent_soak.csv"), os.path.join(OUT, "agent_soak.svg")
    write_csv(csv, samples)
    caption = [f"bpfscope agent, {HZ} Hz, {WINDOW} s windows, 20 metrics, vs perf record -F {HZ} -a -g; "
               f"{dur:.0f} s, 1 busy process + {spawned / dur:.0f} processes/s started.",
               f"Over the run: agent {total:.3f}% of one core (BPF {bpf:.3f}%), perf {perf:.3f}% (process only); "
               f"agent RSS end {a_rss_end:.1f} MiB."]
    write_svg(svg, samples, dur, caption)
    print(f"\nwrote {svg}\nwrote {csv}")


def main():
    need_root()
    need("perf", "linux-perf")
    need("bpftool", "bpftool")
    build()
    signal.signal(signal.SIGTERM, on_sigterm)
    with contextlib.ExitStack() as stack:
        tmp = tempfile.mkdtemp(prefix="bpfscope-soak-")
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        stack.enter_context(bpf_stats())
        result = run(stack, tmp)
    report(result)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("bench: interrupted (workload, perf and agent stopped, sysctl restored)")
