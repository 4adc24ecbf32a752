#!/usr/bin/env python3
"""`bpfscope run` (bpftrace-language scripts on the precompiled in-kernel
interpreter, no compiler) vs bpftrace 0.17 on Debian's own tools in
/usr/sbin, in one run. Every figure is taken for both tools in the same
run, runs of the two interleaved, and printed with the ratio
bpfscope/bpftrace.

1. Start and complete run of the 17 tools both can run here: opensnoop,
   execsnoop, killsnoop, statsnoop, setuids, syncsnoop, syscount,
   pidpersec, bitesize, naptime, gethostlatency, cpuwalk, writeback,
   runqlat, tcpdrop, ssllatency and sslsnoop. runqlat.bt does not compile under bpftrace 0.17 here (its
   `#include <linux/sched.h>`), so both tools run a copy in
   target/bench/runqlat.bt without the #include and with TASK_RUNNING
   replaced by 0.
   - start to first event: from just before exec to the moment BEGIN's
     first line (the header every one of these tools prints; the bench
     takes it from the script's first printf in BEGIN) is read after
     "Attaching N probes..." from the tool's stdout, an unbuffered pipe
     read as it arrives: the tool is ready. Then SIGINT; the tool must
     exit 0. bpftrace runs BEGIN before it attaches the other probes, so
     its header is always the first line after "Attaching"; runs where
     other lines (events) came between are counted and printed, and the
     time is still that of BEGIN's line.
   - complete run: wall time of `TOOL -c /bin/true FILE` from just before
     exec to exit (both print their maps and exit when the command does).
   BENCH_RUNS runs each (default 5), the two tools alternating, medians.
   Sanity: exit 0, and BEGIN's line after "Attaching" in every run.
   bpftrace 0.17 loses a SIGINT that arrives while it is not in
   epoll_wait (it then runs on), so it gets another SIGINT every second
   until it exits (counted and printed); bpfscope must stop on the first.
   Target: bpfscope <= 1/4 of bpftrace.
2. Cost added per event of opensnoop.bt, runqlat.bt (the copy) and
   syscount.bt: a fixed workload pinned to CPU 0 timed alone, then with
   one tool at a time attached (the tool pinned to CPU 1, its stdout to a
   file, started when BEGIN's header appears), rounds of alone / tool A /
   alone / tool B (A and B swapped every round), BENCH_RUNS rounds,
   medians; added cost = (time with tool - time alone) / events.
   - opensnoop: bench/workloads/openloop.c, N open(2) of a missing file
     (N openat syscalls, each an enter and an exit event and one printed
     line; events = N open calls). Sanity: all N lines of the workload's
     pid with ERR 2 and the path appear in the tool's output. A run where
     fewer appear but the tool reported the rest lost (its reader fell
     behind: bpftrace "Lost N events", bpfscope "lost N records") is
     dropped and counted; a figure needs half the runs. An unreported
     shortfall over 0.1% fails the tool (a smaller one is printed).
   - syscount: bench/workloads/getppidloop.c, N getppid(2) (events = N
     raw_syscalls:sys_enter). Sanity: @syscall[110] and
     @process[getppidloop] >= N.
   - runqlat: bench/workloads/pingpong.c, a parent and child passing a
     byte over two pipes N times, both on CPU 0. Events are counted from
     the workload's own getrusage: every context switch of the pair
     (voluntary + involuntary, both processes) is a sched_switch, and
     every voluntary switch (a block in read) ends with one sched_wakeup,
     so events = 2 * nvcsw + nivcsw (about 4 a round trip; the tool's
     own and other processes' events on CPU 0 are not counted). Sanity:
     the @usecs histogram holds at least 90% of the pair's switches.
   Then one more run of each tool with BPF run-time statistics on
   (BPF_ENABLE_STATS): ns per run of the tool's programs, the less noisy
   figure where the workload's own time varies (the ping-pong).
   Target: bpfscope's added cost per event <= bpftrace's (issue 28:
   <= 0.5 x bpftrace's).
3. Memory and size: peak RSS of each tool over the opensnoop runs of 2
   (/proc/PID/status VmHWM sampled every 10 ms until the exit; not
   wait4's ru_maxrss, which carries the forking Python's RSS across
   exec), medians; installed size: bpfscope's release binary against
   bpftrace's `dpkg -L bpftrace` files plus the LLVM and clang libraries
   it loads (from `ldd /usr/bin/bpftrace`), printed separately; the other
   libraries bpftrace loads and bpfscope does not are listed, not added.

Results also go to target/bench/run_vs_bpftrace.csv. Run as root:
python3 bench/run_vs_bpftrace.py (BPFSCOPE_BIN=PATH benches a binary built
elsewhere, BENCH_RUNS=N; BENCH_TOOLS=runqlat,syscount limits sections 1
and 2 to those tools; BPFSCOPE_SCRIPT_VM=1 keeps bpfscope's probes on the
script machine instead of compiling them, for a before/after comparison).
Tools still running are stopped on an error or Ctrl-C.
"""
import csv
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from common import BIN, OUT, build, cc, cpu_seconds, need, need_root, ratio, stats_over

RUNS = int(os.environ.get("BENCH_RUNS", "5"))
BPFTRACE = shutil.which("bpftrace") or "/usr/bin/bpftrace"
SBIN = "/usr/sbin"
TOOLS = ["opensnoop", "execsnoop", "killsnoop", "statsnoop", "setuids", "syncsnoop", "syscount",
         "pidpersec", "bitesize", "naptime", "gethostlatency", "cpuwalk", "writeback", "runqlat",
         # Run since bpfscope skips, as bpftrace does, the attach points of a
         # list that nothing matches (libcrypto's functions this OpenSSL lacks).
         "tcpdrop", "ssllatency", "sslsnoop"]
if os.environ.get("BENCH_TOOLS"):
    TOOLS = [t for t in TOOLS if t in os.environ["BENCH_TOOLS"].split(",")]
WORK_CPU, TOOL_CPU = 0, 1
N_OPENS, N_GETPPID, N_ROUNDTRIPS = 300_000, 3_000_000, 100_000
MISSING = "/nonexistent/bpfscope-openloop"
READY_TIMEOUT, STOP_TIMEOUT, RUN_TIMEOUT = 60, 30, 60

LIVE = {}  # pid -> (Popen, pidfd) of tools and workloads not yet reaped


class Failed(Exception):
    pass


def pin(cpu):
    return (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None


def spawn(argv, cpu=None, **kw):
    p = subprocess.Popen(argv, preexec_fn=pin(cpu), **kw)
    LIVE[p.pid] = (p, os.pidfd_open(p.pid))
    return p


def reap(p, timeout):
    """Waits for p to exit (at most timeout s; then SIGKILL) and reaps it.
    Returns (exit status or None if it had to be killed, time of exit,
    rusage). The pidfd makes the wait exact and the kill safe from pid
    reuse."""
    _, fd = LIVE[p.pid]
    hung = not select.select([fd], [], [], timeout)[0]
    t = time.perf_counter()
    if hung:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    _, status, ru = os.wait4(p.pid, 0)
    del LIVE[p.pid]
    os.close(fd)
    p.returncode = os.waitstatus_to_exitcode(status)
    return (None if hung else p.returncode), t, ru


def cleanup():
    for pid, (p, fd) in list(LIVE.items()):
        try:
            signal.pidfd_send_signal(fd, signal.SIGINT)
        except ProcessLookupError:
            pass
    deadline = time.time() + 5
    for pid, (p, fd) in list(LIVE.items()):
        if not select.select([fd], [], [], max(0.0, deadline - time.time()))[0]:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        os.wait4(pid, 0)
        os.close(fd)
        del LIVE[pid]


def tail(path, n=3):
    try:
        with open(path, errors="replace") as f:
            lines = [l.strip() for l in f if l.strip() and "RLIMIT_MEMLOCK" not in l]
        return " | ".join(lines[-n:])
    except OSError:
        return ""


def argv(tool, script, cmd=None):
    c = ["-c", cmd] if cmd else []
    if tool == "bpfscope":
        return [BIN, "run", *c, script]
    return [BPFTRACE, *c, script]


def expected_begin(script):
    """The first line BEGIN prints, from the script's first printf in BEGIN
    (a literal format with literal arguments), or None."""
    with open(script) as f:
        src = f.read()
    m = re.search(r"^BEGIN\s*\{(.*?)^\}", src, re.M | re.S)
    lit = r'"((?:[^"\\]|\\.)*)"'
    m = m and re.search(rf"printf\(\s*{lit}((?:\s*,\s*{lit})*)\s*\)", m.group(1))
    if not m:
        return None
    unesc = lambda x: x.encode().decode("unicode_escape")
    args = tuple(unesc(a) for a in re.findall(lit, m.group(2)))
    try:
        return (unesc(m.group(1)) % args).split("\n")[0]
    except (TypeError, ValueError):
        return None


def after_attaching(lines, begin):
    """(index of BEGIN's line, whether other lines came between it and
    "Attaching N probes..."), or None while it is not there. Without a known
    BEGIN line, the first line after "Attaching"."""
    for i, l in enumerate(lines):
        if l.startswith("Attaching ") and "probe" in l:
            for j in range(i + 1, len(lines)):
                if begin is None or lines[j] == begin:
                    return j, j > i + 1
            return None
    return None


# bpftrace 0.17 loses a SIGINT that arrives while it is not waiting in
# epoll_wait (its poll loop looks at the signal's flag only on EINTR) and
# then runs on; a user presses Ctrl-C again. So bpftrace gets another SIGINT
# after each second it spent idle without exiting (counted); bpfscope must
# stop on the first.
RESENT = {"bpfscope": 0, "bpftrace": 0}
STOPS = {"bpfscope": 0, "bpftrace": 0}
LATE = {"bpfscope": [], "bpftrace": []}  # (tool, run kind) where lines came before BEGIN's


def interrupt(p, tool):
    """SIGINT and the wait for the exit. Returns (exit status, or None when
    it had to be killed after STOP_TIMEOUT; rusage)."""
    _, fd = LIVE[p.pid]
    STOPS[tool] += 1
    p.send_signal(signal.SIGINT)
    deadline = time.perf_counter() + STOP_TIMEOUT
    used = cpu_seconds(p.pid)
    while tool == "bpftrace" and time.perf_counter() < deadline and not select.select([fd], [], [], 1.0)[0]:
        # Only when it was idle (< 5 ms of CPU) for the second: a SIGINT
        # while it drains its buffers after the first cuts the draining short.
        now = cpu_seconds(p.pid)
        if now - used < 0.005:
            signal.pidfd_send_signal(fd, signal.SIGINT)
            RESENT[tool] += 1
        used = now
    rc, _, ru = reap(p, max(0.0, deadline - time.perf_counter()))
    return rc, ru


def stop_error(rc):
    return f"exit {rc} after SIGINT" if rc is not None else f"did not exit within {STOP_TIMEOUT} s of SIGINT (killed)"


# 1. Start to first event, complete run.

def ready_run(tool, name, script, begin, errf):
    """Seconds from exec to BEGIN's first line on stdout; then SIGINT and
    the exit."""
    t0 = time.perf_counter()
    p = spawn(argv(tool, script), stdout=subprocess.PIPE, stderr=errf, bufsize=0)
    fd, buf, lines, t_ready, deadline = p.stdout.fileno(), b"", [], None, t0 + READY_TIMEOUT
    try:
        while t_ready is None:
            left = deadline - time.perf_counter()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise Failed(f"no BEGIN line {begin!r} after 'Attaching' within {READY_TIMEOUT} s")
            d = os.read(fd, 65536)
            t = time.perf_counter()
            if not d:
                raise Failed(f"exited before BEGIN's output: {tail(errf.name)}")
            buf += d
            *done, buf = buf.split(b"\n")
            lines += [l.decode(errors="replace") for l in done]
            found = after_attaching(lines, begin)
            if found:
                t_ready = t
                if found[1]:
                    LATE[tool].append(f"{name} (start)")
        # Whatever comes after (events, maps) is read and dropped while the tool stops.
        drain = threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(fd, 65536), b"")], daemon=True)
        drain.start()
        rc, _ = interrupt(p, tool)
        drain.join(5)
        if rc != 0:
            raise Failed(stop_error(rc))
    finally:
        if p.pid in LIVE:
            interrupt(p, tool)
        p.stdout.close()
    return t_ready - t0


def complete_run(tool, name, script, begin, errf):
    """Seconds from exec to exit of `TOOL -c /bin/true SCRIPT`."""
    with tempfile.TemporaryFile("w+", dir=OUT) as out:
        t0 = time.perf_counter()
        p = spawn(argv(tool, script, "/bin/true"), stdout=out, stderr=errf)
        rc, t, _ = reap(p, RUN_TIMEOUT)
        if rc is None:
            raise Failed(f"-c /bin/true did not end within {RUN_TIMEOUT} s (killed)")
        out.seek(0)
        lines = out.read().split("\n")
    if rc != 0:
        raise Failed(f"-c /bin/true: exit {rc}: {tail(errf.name)}")
    found = after_attaching(lines, begin)
    if not found:
        raise Failed(f"-c /bin/true: no 'Attaching' line followed by BEGIN's {begin!r}")
    if found[1]:
        LATE[tool].append(f"{name} (-c)")
    return t - t0


def startup(scripts):
    rows = []
    for name, script in scripts:
        begin = expected_begin(script)
        res = {t: {"ready": [], "complete": [], "fail": None} for t in ("bpfscope", "bpftrace")}
        for i in range(RUNS):
            order = ("bpfscope", "bpftrace") if i % 2 == 0 else ("bpftrace", "bpfscope")
            for tool in order:
                r = res[tool]
                if r["fail"]:
                    continue
                with tempfile.NamedTemporaryFile("w+", dir=OUT, prefix=f"{tool}-{name}-", suffix=".err") as errf:
                    try:
                        r["ready"].append(ready_run(tool, name, script, begin, errf))
                        r["complete"].append(complete_run(tool, name, script, begin, errf))
                    except Failed as e:
                        r["fail"] = str(e)
        row = {"tool": name}
        for kind in ("ready", "complete"):
            for t in ("bpfscope", "bpftrace"):
                r = res[t]
                row[f"{kind}_{t}"] = None if r["fail"] else statistics.median(r[kind])
            a, b = row[f"{kind}_bpfscope"], row[f"{kind}_bpftrace"]
            row[f"{kind}_ratio"] = ratio(a, b) if a is not None and b is not None else None
        row["fail_bpfscope"], row["fail_bpftrace"] = res["bpfscope"]["fail"], res["bpftrace"]["fail"]
        rows.append(row)
        print_startup_row(row)
    return rows


def ms(x):
    return f"{x * 1e3:8.1f}" if x is not None else f"{'FAIL':>8}"


def rt(x):
    return f"{x:6.3f}" if x is not None else f"{'-':>6}"


def print_startup_row(r):
    print(f"{r['tool'] + '.bt':<18} {ms(r['ready_bpfscope'])} {ms(r['ready_bpftrace'])} {rt(r['ready_ratio'])}"
          f"   {ms(r['complete_bpfscope'])} {ms(r['complete_bpftrace'])} {rt(r['complete_ratio'])}", flush=True)
    for t in ("bpfscope", "bpftrace"):
        if r[f"fail_{t}"]:
            print(f"    {t} FAILED: {r[f'fail_{t}']}", flush=True)


# 2. Cost added per event.

class Attached:
    """A tool running one script in the background on TOOL_CPU, stdout to a
    file, ready once BEGIN's first line is in the file."""

    def __init__(self, tool, name, script, begin):
        self.tool = tool
        self.out = tempfile.NamedTemporaryFile("w+", dir=OUT, prefix=f"{tool}-{name}-", suffix=".out")
        self.err = tempfile.NamedTemporaryFile("w+", dir=OUT, prefix=f"{tool}-{name}-", suffix=".err")
        self.p = spawn(argv(tool, script), cpu=TOOL_CPU, stdout=self.out, stderr=self.err)
        self.rss = PeakRss(self.p.pid)
        deadline = time.time() + READY_TIMEOUT
        while True:
            with open(self.out.name, errors="replace") as f:
                found = after_attaching(f.read().split("\n")[:-1], begin)
            if found:
                if found[1]:
                    LATE[tool].append(f"{name} (cost run)")
                break
            if self.p.poll() is not None or time.time() > deadline:
                self.close()
                raise Failed(f"no BEGIN output: {tail(self.err.name)}")
            time.sleep(0.005)
        time.sleep(0.2)

    def stop(self):
        """SIGINT; returns (stdout, stderr, peak RSS in KiB)."""
        rc, _ = interrupt(self.p, self.tool)
        hwm = self.rss.stop()
        with open(self.out.name, errors="replace") as f:
            text = f.read()
        with open(self.err.name, errors="replace") as f:
            err = f.read()
        last = tail(self.err.name)
        self.close()
        if rc != 0:
            raise Failed(stop_error(rc) + (f": {last}" if last else ""))
        return text, err, hwm

    def close(self):
        if self.p.pid in LIVE:
            interrupt(self.p, self.tool)
        if self.rss.is_alive():
            self.rss.stop()
        self.out.close()
        self.err.close()


class PeakRss(threading.Thread):
    """VmHWM of a process read every 10 ms until stop(), through a
    /proc/PID directory fd (which fails, rather than reading another
    process, once the pid is reaped and reused). getrusage's ru_maxrss is
    not used: Linux carries the forking process's peak RSS (here Python's,
    tens of MiB) into the child across exec."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.dirfd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
        self.peak, self.done = 0, threading.Event()
        self.start()

    def read(self):
        try:
            with open("status", opener=lambda p, f: os.open(p, f, dir_fd=self.dirfd)) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def run(self):
        while not self.done.is_set():
            self.peak = max(self.peak, self.read())
            self.done.wait(0.01)

    def stop(self):
        self.done.set()
        self.join()
        os.close(self.dirfd)
        return self.peak


def run_workload(cmd):
    """Runs the workload on WORK_CPU; returns (pid, its stdout fields as floats)."""
    p = spawn(cmd, cpu=WORK_CPU, stdout=subprocess.PIPE, text=True)
    out = p.stdout.read()
    rc, _, _ = reap(p, 300)
    p.stdout.close()
    if rc != 0:
        raise Failed(f"workload {cmd} exit {rc}")
    return p.pid, [float(x) for x in out.split()]


class Dropped(Exception):
    """A run whose tool reported losing events (its reader fell behind): not
    counted, and counted as dropped."""


def check_opensnoop(text, err, pid, n, fields):
    pat = re.compile(rf"^{pid}\s+openloop\s+-1\s+2\s+{re.escape(MISSING)}$", re.M)
    seen = len(pat.findall(text))
    # bpftrace: "Lost N events" on stdout; bpfscope: "lost N records" on stderr.
    lost = sum(int(x) for x in re.findall(r"\b[Ll]ost (\d+) (?:events|records)", text + "\n" + err))
    if seen == n:
        return f"{seen}/{n} opens printed"
    if seen + lost >= n:
        raise Dropped(f"{seen}/{n} opens printed, {lost} events reported lost")
    if seen >= 0.999 * n:
        return f"{seen}/{n} opens printed, {n - seen} missing without a loss report"
    raise Failed(f"{seen} of the workload's {n} opens in the output, {lost} reported lost")


def check_syscount(text, err, pid, n, fields):
    sc = re.search(r"^@syscall\[110\]: (\d+)$", text, re.M)
    pr = re.search(r"^@process\[getppidloop\]: (\d+)$", text, re.M)
    if not sc or not pr or int(sc.group(1)) < n or int(pr.group(1)) < n:
        raise Failed(f"syscount counted {sc and sc.group(0)!r}, {pr and pr.group(0)!r} for {n} getppid calls")
    return f"@syscall[110] {sc.group(1)}, @process[getppidloop] {pr.group(1)}"


def check_runqlat(text, err, pid, n, fields):
    hist = sum(int(m.group(1)) for m in re.finditer(r"^\[[^\]\n]*[\])] +(\d+) \|", text, re.M))
    switches = fields[1] + fields[2]
    if hist < 0.9 * switches:
        raise Failed(f"@usecs holds {hist} latencies for {switches:.0f} switches of the pair")
    return f"@usecs {hist} for {switches:.0f} switches"


def events_pingpong(fields, n):
    return (2 * fields[1] + fields[2]) / n


def overhead(cases):
    rows, rss = [], {"bpfscope": [], "bpftrace": []}
    for c in cases:
        base, add = [], {"bpfscope": [], "bpftrace": []}
        per_iter = {"bpfscope": [], "bpftrace": [], "base": []}
        fail, notes = {"bpfscope": None, "bpftrace": None}, {"bpfscope": "", "bpftrace": ""}
        dropped, short = {"bpfscope": [], "bpftrace": []}, {"bpfscope": [], "bpftrace": []}
        for i in range(RUNS):
            order = ("bpfscope", "bpftrace") if i % 2 == 0 else ("bpftrace", "bpfscope")
            for tool in order:
                _, f = run_workload(c["cmd"])
                base.append(f[0])
                per_iter["base"].append(c["events"](f, c["n"]))
                if fail[tool]:
                    continue
                try:
                    a = Attached(tool, c["name"], c["script"], expected_begin(c["script"]))
                    try:
                        pid, f = run_workload(c["cmd"])
                    finally:
                        text, err, hwm = a.stop()
                    if c["name"] == "opensnoop":
                        rss[tool].append(hwm)
                    notes[tool] = c["check"](text, err, pid, c["n"], f)
                    if "missing" in notes[tool]:
                        short[tool].append(notes[tool])
                    add[tool].append(f[0])
                    per_iter[tool].append(c["events"](f, c["n"]))
                except Dropped as e:
                    dropped[tool].append(str(e))
                except Failed as e:
                    fail[tool] = str(e)
        # Runs with BPF run-time statistics on (they add their own clock
        # reads, so not in the timed rounds): ns per program run, the
        # median of RUNS runs each, alternating.
        runs = {"bpfscope": [], "bpftrace": []}
        for i in range(RUNS):
            for tool in ("bpfscope", "bpftrace") if i % 2 == 0 else ("bpftrace", "bpfscope"):
                if fail[tool]:
                    continue
                try:
                    x = stats_run(tool, c["name"], c["script"], c["cmd"])
                    if x is not None:
                        runs[tool].append(x)
                except (Dropped, Failed):
                    pass
        per_run = {t: statistics.median(v) for t, v in runs.items() if v}
        b = statistics.median(base)
        row = {"tool": c["name"], "workload": c["what"], "untraced_ns": b,
               "events_per_iter": statistics.median(per_iter["base"]),
               "run_bpfscope": per_run.get("bpfscope"), "run_bpftrace": per_run.get("bpftrace")}
        for t in ("bpfscope", "bpftrace"):
            if short[t]:
                notes[t] += f"; runs with events missing: {'; '.join(short[t])}"
            if dropped[t]:
                notes[t] += f"; {len(dropped[t])} of {RUNS} runs dropped ({'; '.join(dropped[t])})"
                if len(add[t]) < (RUNS + 1) // 2 and not fail[t]:
                    fail[t] = f"only {len(add[t])} of {RUNS} runs without lost events: {'; '.join(dropped[t])}"
            if fail[t]:
                row[f"added_{t}"] = None
            else:
                row[f"added_{t}"] = (statistics.median(add[t]) - b) / statistics.median(per_iter[t])
            row[f"fail_{t}"], row[f"note_{t}"] = fail[t], notes[t]
        a, bb = row["added_bpfscope"], row["added_bpftrace"]
        row["ratio"] = ratio(a, bb) if a is not None and bb is not None else None
        rows.append(row)
        print_overhead_row(row)
        for label, tool, script in c.get("floors", []):
            added, per = [], []
            for _ in range(RUNS):
                _, f0 = run_workload(c["cmd"])
                a = Attached(tool, c["name"] + "-floor", script, expected_begin(script))
                try:
                    _, f = run_workload(c["cmd"])
                finally:
                    a.stop()
                added.append((f[0] - f0[0]) / c["events"](f, c["n"]))
                x = stats_run(tool, c["name"] + "-floor", script, c["cmd"])
                if x is not None:
                    per.append(x)
            row[f"floor {label}"] = (statistics.median(added), statistics.median(per) if per else None)
            print(f"    floor, {label}: {statistics.median(added):.1f} ns added per event"
                  + (f" ({statistics.median(per):.1f} per run)" if per else ""), flush=True)
    return rows, rss


def stats_run(tool, name, script, cmd):
    """ns per program run of the tool's programs over one workload run."""
    a = Attached(tool, name, script, expected_begin(script))
    try:
        dt, dn = stats_over(a.p.pid, lambda: run_workload(cmd))
    finally:
        a.stop()
    return dt / dn if dn > 0 else None


NOTES = []


def print_stop_notes(section):
    for t in ("bpfscope", "bpftrace"):
        notes = []
        if RESENT[t]:
            notes.append(f"{t} did not stop on the first SIGINT: {RESENT[t]} more SIGINTs in {STOPS[t]} stops")
        if LATE[t]:
            notes.append(f"{t} printed other lines between 'Attaching' and BEGIN's in {len(LATE[t])} run(s): "
                         + ", ".join(LATE[t]))
        for n in notes:
            print(f"  note: {n}")
            NOTES.append((section, n))
        RESENT[t], STOPS[t], LATE[t] = 0, 0, []


def ns(x):
    return f"{x:9.1f}" if x is not None else f"{'FAIL':>9}"


def print_overhead_row(r):
    print(f"{r['tool'] + '.bt':<13} {r['workload']:<30} {r['events_per_iter']:6.2f} {r['untraced_ns']:9.1f}"
          f" {ns(r['added_bpfscope'])} {ns(r['added_bpftrace'])} {rt(r['ratio'])}", flush=True)
    rb, rt_ = r.get("run_bpfscope"), r.get("run_bpftrace")
    print(f"    BPF run time, ns per program run (statistics on, median of {RUNS} runs each):"
          f" bpfscope {ns(rb).strip()},"
          f" bpftrace {ns(rt_).strip()}"
          + (f", ratio {rb / rt_:.3f}" if rb is not None and rt_ else ""), flush=True)
    for t in ("bpfscope", "bpftrace"):
        if r[f"fail_{t}"]:
            print(f"    {t} FAILED: {r[f'fail_{t}']}", flush=True)
        else:
            print(f"    {t}: {r[f'note_{t}']}", flush=True)


# 3. Size.

def file_size(path):
    return os.path.getsize(path) if os.path.isfile(path) and not os.path.islink(path) else 0


def ldd(path):
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    libs = {}
    for m in re.finditer(r"^\s*(\S+) => (/\S+)", out, re.M):
        libs[m.group(1)] = os.path.realpath(m.group(2))
    return libs


def sizes():
    files = subprocess.run(["dpkg", "-L", "bpftrace"], capture_output=True, text=True, check=True).stdout.split("\n")
    pkg = sum(file_size(f) for f in files if f)
    theirs, ours = ldd(BPFTRACE), ldd(BIN)
    llvm = {n: p for n, p in theirs.items() if re.match(r"lib(LLVM|clang)", n)}
    other = {n: p for n, p in theirs.items() if n not in llvm and n not in ours}
    return {
        "bin": os.path.getsize(BIN), "pkg": pkg,
        "llvm": [(n, os.path.getsize(p)) for n, p in sorted(llvm.items())],
        "other": [(n, os.path.getsize(p)) for n, p in sorted(other.items())],
        "ours_libs": sorted(ours), "ours_shared": all(n in theirs for n in ours),
    }


def mib(b):
    return b / (1 << 20)


def main():
    need_root()
    need("bpftrace", "bpftrace")
    build()
    openloop, getppidloop, pingpong = cc("openloop"), cc("getppidloop"), cc("pingpong")
    runqlat = os.path.join(OUT, "runqlat.bt")
    with open(os.path.join(SBIN, "runqlat.bt")) as f:
        src = f.read()
    with open(runqlat, "w") as f:
        f.write(re.sub(r"^#include .*\n", "", src, flags=re.M).replace("TASK_RUNNING", "0"))
    scripts = [(t, runqlat if t == "runqlat" else os.path.join(SBIN, t + ".bt")) for t in TOOLS]
    # runqlat.bt's floor: empty programs on its three tracepoints.
    empty_classic = os.path.join(OUT, "runqlat_floor.bt")
    with open(empty_classic, "w") as f:
        f.write('BEGIN {\n  printf("floor\\n");\n}\n'
                "tracepoint:sched:sched_wakeup, tracepoint:sched:sched_wakeup_new,"
                " tracepoint:sched:sched_switch { }\n")
    version = subprocess.run([BPFTRACE, "--version"], capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"machine: kernel {os.uname().release}, {os.cpu_count()} CPUs ({cpu}); {version}; BENCH_RUNS={RUNS}")
    print(f"bpfscope: {BIN}")
    print("runqlat.bt: both tools run a copy without its #include and with TASK_RUNNING as 0 "
          "(bpftrace 0.17 cannot compile the original here)")

    print(f"\n1. start to first event (BEGIN's first line) and complete run (-c /bin/true), ms, median of {RUNS}")
    print(f"{'tool':<18} {'bpfscope':>8} {'bpftrace':>8} {'ratio':>6}   {'bpfscope':>8} {'bpftrace':>8} {'ratio':>6}")
    print(f"{'':<18} {'--- start to first event ---':>24}   {'------ complete run ------':>24}")
    start_rows = startup(scripts)
    print_stop_notes("start")

    print(f"\n2. cost added per event, workload on CPU {WORK_CPU}, tool on CPU {TOOL_CPU}, medians of {RUNS} rounds")
    print(f"{'tool':<13} {'workload':<30} {'ev/it':>6} {'alone ns':>9} {'bpfscope':>9} {'bpftrace':>9} {'ratio':>6}")
    print(f"{'':<13} {'':<30} {'':>6} {'per iter':>9} {'-- ns added per event --':>19}")
    cases = [
        {"name": "opensnoop", "script": os.path.join(SBIN, "opensnoop.bt"), "n": N_OPENS,
         "what": f"{N_OPENS} open(2), missing file", "cmd": [openloop, str(N_OPENS), MISSING],
         "events": lambda f, n: 1.0, "check": check_opensnoop},
        {"name": "runqlat", "script": runqlat, "n": N_ROUNDTRIPS,
         "what": f"{N_ROUNDTRIPS} pipe round trips", "cmd": [pingpong, str(N_ROUNDTRIPS)],
         "events": events_pingpong, "check": check_runqlat,
         "floors": [("empty classic tracepoint programs (bpftrace, body {})", "bpftrace", empty_classic),
                    ("bpfscope's entry alone (raw tracepoints, empty body)", "bpfscope", empty_classic)]},
        {"name": "syscount", "script": os.path.join(SBIN, "syscount.bt"), "n": N_GETPPID,
         "what": f"{N_GETPPID} getppid(2)", "cmd": [getppidloop, str(N_GETPPID)],
         "events": lambda f, n: 1.0, "check": check_syscount},
    ]
    cases = [c for c in cases if c["name"] in TOOLS]
    cost_rows, rss = overhead(cases)
    print_stop_notes("added_cost_per_event")

    print("\n3. memory and size")
    rs = {t: statistics.median(rss[t]) for t in ("bpfscope", "bpftrace") if rss[t]}
    if len(rs) == 2:
        print(f"peak RSS (VmHWM), opensnoop.bt over {N_OPENS} opens, median of {len(rss['bpfscope'])}/"
              f"{len(rss['bpftrace'])} runs: bpfscope {rs['bpfscope'] / 1024:.1f} MiB,"
              f" bpftrace {rs['bpftrace'] / 1024:.1f} MiB, ratio {ratio(rs['bpfscope'], rs['bpftrace']):.3f}")
    else:
        print("peak RSS: FAIL (no opensnoop run for "
              + ", ".join(t for t in ("bpfscope", "bpftrace") if t not in rs) + ")")
    sz = sizes()
    llvm = sum(s for _, s in sz["llvm"])
    theirs = sz["pkg"] + llvm
    print(f"installed: bpfscope binary {mib(sz['bin']):.1f} MiB (shared libraries: {', '.join(sz['ours_libs'])}"
          + (", all also loaded by bpftrace)" if sz["ours_shared"] else ")"))
    print(f"           bpftrace package files (dpkg -L) {mib(sz['pkg']):.1f} MiB"
          f" + LLVM/clang libraries {mib(llvm):.1f} MiB ("
          + ", ".join(f"{n} {mib(s):.1f}" for n, s in sz["llvm"]) + f") = {mib(theirs):.1f} MiB;"
          f" ratio {ratio(sz['bin'], theirs):.3f}")
    print("           not counted, other libraries only bpftrace loads: "
          + ", ".join(f"{n} {mib(s):.1f}" for n, s in sz["other"])
          + f" = {mib(sum(s for _, s in sz['other'])):.1f} MiB")

    print("\ntargets:")
    for kind, label in (("ready", "start to first event"), ("complete", "complete run")):
        rr = [r[f"{kind}_ratio"] for r in start_rows]
        ok = [x for x in rr if x is not None and x <= 0.25]
        print(f"  {label} <= 0.25 of bpftrace: met for {len(ok)} of {len(rr)} tools"
              + (f" (ratios {min(x for x in rr if x is not None):.3f}-{max(x for x in rr if x is not None):.3f},"
                 f" median {statistics.median(x for x in rr if x is not None):.3f})" if any(x is not None for x in rr) else "")
              + (f"; not met: {', '.join(r['tool'] for r in start_rows if r[f'{kind}_ratio'] is None or r[f'{kind}_ratio'] > 0.25)}"
                 if len(ok) < len(rr) else ""))
    for r in cost_rows:
        met = r["ratio"] is not None and r["ratio"] <= 1
        print(f"  {r['tool']}.bt cost per event <= bpftrace's: {'met' if met else 'not met'}"
              f" ({'ratio ' + format(r['ratio'], '.3f') if r['ratio'] is not None else 'a tool failed'})")
        half = r["ratio"] is not None and r["ratio"] <= 0.5
        print(f"  {r['tool']}.bt cost per event <= 0.5 x bpftrace's: {'met' if half else 'not met'}")

    path = os.path.join(OUT, "run_vs_bpftrace.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["section", "item", "unit", "bpfscope", "bpftrace", "ratio", "target", "met", "note"])
        num = lambda x, k=1: "" if x is None else f"{x * k:.4f}"
        for r in start_rows:
            note = "; ".join(f"{t} failed: {r[f'fail_{t}']}" for t in ("bpfscope", "bpftrace") if r[f"fail_{t}"])
            for kind, label in (("ready", "start_to_first_event"), ("complete", "complete_run")):
                x = r[f"{kind}_ratio"]
                w.writerow([label, r["tool"] + ".bt", "ms", num(r[f"{kind}_bpfscope"], 1e3),
                            num(r[f"{kind}_bpftrace"], 1e3), num(x), "<=0.25",
                            "" if x is None else ("yes" if x <= 0.25 else "no"), note])
        for r in cost_rows:
            note = "; ".join(f"{t}: {r[f'fail_{t}'] or r[f'note_{t}']}" for t in ("bpfscope", "bpftrace"))
            note = f"{r['workload']}, {r['events_per_iter']:.2f} events/iteration, alone {r['untraced_ns']:.1f} ns/iteration; " + note
            w.writerow(["added_cost_per_event", r["tool"] + ".bt", "ns", num(r["added_bpfscope"]),
                        num(r["added_bpftrace"]), num(r["ratio"]), "<=1",
                        "" if r["ratio"] is None else ("yes" if r["ratio"] <= 1 else "no"), note])
        if len(rs) == 2:
            w.writerow(["peak_rss", "opensnoop.bt VmHWM", "KiB", rs["bpfscope"], rs["bpftrace"],
                        num(ratio(rs["bpfscope"], rs["bpftrace"])), "", "",
                        f"{N_OPENS} opens, sampled every 10 ms until exit"])
        w.writerow(["installed", "binary vs package + LLVM/clang", "bytes", sz["bin"], theirs,
                    num(ratio(sz["bin"], theirs)), "", "", f"package files {sz['pkg']}, LLVM/clang {llvm}"])
        w.writerow(["installed", "bpftrace package files (dpkg -L)", "bytes", "", sz["pkg"], "", "", "", ""])
        for n, s in sz["llvm"]:
            w.writerow(["installed", n, "bytes", "", s, "", "", "", "LLVM/clang, counted"])
        for n, s in sz["other"]:
            w.writerow(["installed", n, "bytes", "", s, "", "", "", "only bpftrace loads it, not counted"])
        for section, n in NOTES:
            w.writerow([section, "note", "", "", "", "", "", "", n])
    print(f"\nwrote {path}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("\nbench: interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        cleanup()
