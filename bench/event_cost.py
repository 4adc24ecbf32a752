#!/usr/bin/env python3
"""What one traced event costs, where bpfscope's time goes, against the
floors and bpftrace, on the same events.

Events: umask(2) in a loop (bench/workloads/umaskloop.c, masks 0..0777 in
turn, BENCH_CALLS calls, default 2,000,000): a syscall as cheap as
getppid, with an argument for histograms and field keys to read.

For each configuration, in rounds (BENCH_ROUNDS, default 3), medians:
- wall: ns added per umask against the untraced loop, paired: each round
  runs it untraced, traced and untraced again, and sets the traced run
  against the mean of the two around it (the range of the rounds is
  printed beside the median), BPF statistics off;
- run: BPF run-time statistics (BPF_ENABLE_STATS, held only while the loop
  runs), ns per run of the tool's programs, read from their fdinfo.
  bpfscope's raw tracepoint runs for every syscall of the machine; `share`
  is the part of its runs that were the loop's umasks.

Configurations:
- floors: an empty raw tracepoint program on sys_enter (bpfscope's own
  program stopped at its entry, BPFSCOPE_BENCH_STAGE=entry) and an empty
  classic tracepoint program on sys_enter_umask (bpftrace, body `{}`);
- each shape (keyless count, count by pid, by comm, by a field, log2
  histogram of a field, count by comm filtered by comm), with bpfscope
  stopped after each stage of its path (BPFSCOPE_BENCH_STAGE: dispatch,
  config, target, filter, key) and run to the end, keyed shapes also
  without the per-CPU key cache (BPFSCOPE_KEY_CACHE=0), and bpftrace's
  program of the same shape.

Printed per shape: bpfscope and bpftrace, ns added per event and ns per
run, and the ratios against the targets: bpfscope's added cost <= 1.3 x
the empty raw tracepoint program's, and <= 0.5 x bpftrace's. A target
below this machine's floor (0.5 x bpftrace under the empty raw
tracepoint's cost) is printed with the floor's figure.

Scripts (`bpfscope run`, SCRIPTS below): `@[comm] = count()` filtered
by comm, a runqlat-shaped pair (a timestamp per thread at sys_enter_umask,
`hist(nsecs - @s[tid])` and `delete` at sys_exit_umask: two events per
call, the figures are per call; as written, and with `END { clear(@s); }`
as bpftrace's own tools write it: both keep @s in each thread's own
storage in bpfscope, as written only where the kernel gives descriptors
of threads, 6.9+, to read it by at the end) and syscount.bt's probe (two
counts on
raw_syscalls:sys_enter, every syscall of the machine), each three ways:
bpfscope with its probes compiled to BPF (the default), on the script
machine (BPFSCOPE_SCRIPT_VM=1), and bpftrace; the ratio printed is the
compiled one's to bpftrace's (target <= 0.5).

Sched events (SCHED below; BENCH_SCHED=0 skips them): verbs on
sched_switch over two processes yielding to each other on CPU 0
(bench/workloads/yieldloop.c, BENCH_YIELDS yields each, default 200,000:
a switch per yield, nothing else), and wakeup-to-switch latency over a
pipe ping-pong on CPU 0 (pingpong.c, BENCH_TRIPS round trips, default
100,000: two wakeups and two switches each; its wall-clock figures vary
by hundreds of ns between runs, its ns per run do not). Per event of the
probes: bpfscope by default (the raw tracepoint, fields read through the
tasks its arguments point to), bpfscope on the general path
(BPFSCOPE_GENERIC=1: the classic tracepoint and its record) and
bpftrace, against floors on the same tracepoints: bpfscope's entry alone
on the raw tracepoints and empty classic tracepoint programs (bpftrace).
The three take their rounds in turn (a round of each, then the next), so
that the machine's drift falls on all three alike.

BPFSCOPE_GENERIC=1 makes bpfscope take its general path for every shape
(the path before the specialized ones), for a before/after comparison;
BENCH_STAGES=0 skips the breakdown; BENCH_VERBS=0 or BENCH_SCRIPTS=0 skip
the verbs' shapes or the scripts; arguments name the shapes to run.
"""
import os
import statistics
import subprocess
import sys
import time

from common import BIN, Background, build, cc, need, need_root, ratio, stats_over

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
CALLS = int(os.environ.get("BENCH_CALLS", "2000000"))
STAGES = os.environ.get("BENCH_STAGES", "1") != "0"
PROBE = "tracepoint:syscalls:sys_enter_umask"
COMM = "umaskloop"

# name: (bpfscope arguments after the probe, bpftrace body, bpftrace predicate)
SHAPES = {
    "count": ([], "@ = count();", ""),
    "count --by pid": (["--by", "pid"], "@[pid] = count();", ""),
    "count --by comm": (["--by", "comm"], "@[comm] = count();", ""),
    "count --by mask": (["--by", "mask"], "@[args->mask] = count();", ""),
    "hist --value mask": (["--value", "mask"], "@ = hist(args->mask);", ""),
    "count --by comm, filter comm": (
        ["--by", "comm", "--filter", f'comm == "{COMM}"'],
        "@[comm] = count();",
        f'/comm == "{COMM}"/',
    ),
}
BREAKDOWN = ["dispatch", "config", "target", "filter", "key"]
EXIT = "tracepoint:syscalls:sys_exit_umask"
# name: script (run by both tools as written)
SCRIPTS = {
    "run: @[comm] = count(), filter comm": f'{PROBE} /comm == "{COMM}"/ {{ @[comm] = count(); }}',
    "run: runqlat-shaped pair": (f"{PROBE} {{ @s[tid] = nsecs; }} "
                                 f"{EXIT} /@s[tid]/ {{ @h = hist(nsecs - @s[tid]); delete(@s[tid]); }}"),
    # As bpftrace's tools write it (runqlat.bt, opensnoop.bt...): cleared at
    # END, so @s lives in each thread's own storage in bpfscope on any
    # kernel (as written, only where user space can read it at the end).
    "run: runqlat-shaped pair, cleared at END": (
        f"{PROBE} {{ @s[tid] = nsecs; }} "
        f"{EXIT} /@s[tid]/ {{ @h = hist(nsecs - @s[tid]); delete(@s[tid]); }} "
        "END { clear(@s); }"),
    "run: syscount.bt's probe": ("tracepoint:raw_syscalls:sys_enter "
                                 "{ @syscall[args->id] = count(); @process[comm] = count(); }"),
}
# Sched verbs: (bpfscope arguments, bpftrace program, probes, workload).
SWITCH, WAKEUP = "tracepoint:sched:sched_switch", "tracepoint:sched:sched_wakeup"
SCHED = {
    "sched_switch: count --by next_comm": (
        ["count", SWITCH, "--by", "next_comm"],
        f"{SWITCH} {{ @[args->next_comm] = count(); }}", [SWITCH], "yieldloop"),
    "sched_switch: count --by next_pid,next_prio, filter prev_prio": (
        ["count", SWITCH, "--by", "next_pid,next_prio", "--filter", "prev_prio >= 100"],
        f"{SWITCH} /args->prev_prio >= 100/ {{ @[args->next_pid, args->next_prio] = count(); }}",
        [SWITCH], "yieldloop"),
    "wakeup to switch: latency --match pid=next_pid": (
        ["latency", WAKEUP, SWITCH, "--match", "pid=next_pid"],
        f"{WAKEUP} {{ @q[args->pid] = nsecs; }} "
        f"{SWITCH} /@q[args->next_pid]/ {{ @ = hist(nsecs - @q[args->next_pid]); "
        "delete(@q[args->next_pid]); }",
        [WAKEUP, SWITCH], "pingpong"),
}
ITERS = {"yieldloop": int(os.environ.get("BENCH_YIELDS", "200000")),
         "pingpong": int(os.environ.get("BENCH_TRIPS", "100000"))}
# Round trips vary more than umask calls: at least 5 rounds.
SCHED_ROUNDS = max(ROUNDS, 5)
RUN_SCHED = os.environ.get("BENCH_SCHED", "1") != "0"
VERBS = os.environ.get("BENCH_VERBS", "1") != "0"
RUN_SCRIPTS = os.environ.get("BENCH_SCRIPTS", "1") != "0"


def verb(shape):
    return "hist" if shape.startswith("hist") else "count"


def per_call(loop):
    out = subprocess.run([loop, str(CALLS)], capture_output=True, text=True, check=True)
    return float(out.stdout)


def start_bpfscope(args, stage=None, cache=True, generic=False):
    env = dict(os.environ)
    env.pop("BPFSCOPE_BENCH_STAGE", None)
    if stage:
        env["BPFSCOPE_BENCH_STAGE"] = stage
    if not cache:
        env["BPFSCOPE_KEY_CACHE"] = "0"
    if generic:
        env["BPFSCOPE_GENERIC"] = "1"
    return Background([BIN, *args], "Attached", env=env)


def start_script(script, vm):
    """bpfscope run on a script: compiled probes, or (vm) the script machine alone."""
    env = dict(os.environ)
    env.pop("BPFSCOPE_BENCH_STAGE", None)
    env["BPFSCOPE_SCRIPT_VM"] = "1" if vm else "0"
    return Background([BIN, "run", "-e", script], "Attaching", env=env, stream="stdout")


def start_bpftrace(prog):
    return Background(["bpftrace", "-e", prog], "Attaching", stream="stdout")


def one_round(once, start):
    """One paired round: the workload untraced, traced, untraced again.
    Returns the ns added per event (the traced run against the mean of the
    two around it), ns per program run, and the share of runs that were
    the workload's events. once() runs the workload and gives (ns per
    event, events).

    Paired because this machine's speed drifts by more than the costs
    measured (an untraced yield took 1306 ns, then 901 ns a minute later):
    medians of unpaired runs gave negative costs."""
    before = once()[0]
    t = start()
    try:
        traced = once()[0]
        got = []
        dt, runs = stats_over(t.p.pid, lambda: got.append(once()))
    finally:
        t.stop()
    after = once()[0]
    if not runs:
        sys.exit(f"bench: no program of pid {t.p.pid} ran")
    return traced - (before + after) / 2, dt / runs, got[0][1] / runs


def summary(rounds):
    """Medians over rounds of one_round(): ns added per event, ns per
    program run, share, and the range of the rounds' ns added."""
    added = [r[0] for r in rounds]
    return (statistics.median(added), statistics.median(r[1] for r in rounds),
            statistics.median(r[2] for r in rounds), (min(added), max(added)))


def measure_over(once, start, rounds):
    """summary() of `rounds` rounds of one configuration."""
    return summary([one_round(once, start) for _ in range(rounds)])


def measure(loop, start, rounds):
    """measure_over() per call of the syscall loop."""
    return measure_over(lambda: (per_call(loop), CALLS), start, rounds)


def iterations(prog):
    """A sched workload's iterations: each of yieldloop's two processes
    yields ITERS times; pingpong makes ITERS round trips."""
    n = ITERS[os.path.basename(prog)]
    return 2 * n if prog.endswith("yieldloop") else n


def sched_iter(prog, probes):
    """ns per iteration of a sched workload on CPU 0 (a yield, a round
    trip), and the events of `probes` per iteration: the workload's own
    count of its context switches, per probe (a wakeup for each switch
    in the ping-pong)."""
    out = subprocess.run(["taskset", "-c", "0", prog, str(ITERS[os.path.basename(prog)])],
                         capture_output=True, text=True, check=True).stdout.split()
    ns, switches = float(out[0]), (float(out[1]) + float(out[2])) / iterations(prog)
    return ns, switches * len(probes)


def sched_once(prog, probes):
    """once() for one_round(): ns per event of `probes` in a sched workload, and the events."""
    def once():
        ns, events = sched_iter(prog, probes)
        return ns / events, events * iterations(prog)
    return once


def measure_sched(prog, probes, start, rounds):
    """measure_over() per event of `probes` in a sched workload."""
    return measure_over(sched_once(prog, probes), start, rounds)


def measure_sched_together(prog, probes, starts, rounds):
    """measure_sched() of several configurations (name: start), their
    rounds interleaved (a round of each in turn): the drift of this
    machine's speed over minutes then falls on all of them alike, where
    all rounds of one configuration before the next set them apart."""
    once = sched_once(prog, probes)
    got = {name: [] for name in starts}
    for _ in range(rounds):
        for name, start in starts.items():
            got[name].append(one_round(once, start))
    return {name: summary(rs) for name, rs in got.items()}


def sched_section():
    """The sched verbs against their floors and bpftrace."""
    progs = {w: cc(w) for w in ITERS}
    floors, rows = {}, []
    for name, (args, bt, probes, work) in SCHED.items():
        prog = progs[work]
        key = (tuple(probes), work)
        if key not in floors:
            print(f"floors on {', '.join(probes)}, {work}:")
            raw = measure_sched(prog, probes, lambda: start_bpfscope(["count", *probes], "entry"),
                                SCHED_ROUNDS)
            row("bpfscope's entry alone (raw tracepoints)", raw)
            classic = measure_sched(prog, probes,
                                    lambda: start_bpftrace(", ".join(probes) + " { }"), SCHED_ROUNDS)
            row("empty classic tracepoint programs (bpftrace)", classic)
            floors[key] = (raw, classic)
        raw, classic = floors[key]
        print(f"{name}:")
        m = measure_sched_together(prog, probes, {
            "ours": lambda: start_bpfscope(args),
            "general": lambda: start_bpfscope(args, generic=True),
            "bpftrace": lambda: start_bpftrace(bt),
        }, SCHED_ROUNDS)
        ours, gen, theirs = m["ours"], m["general"], m["bpftrace"]
        row("bpfscope (raw tracepoint, through the tasks)", ours, raw[0])
        row("bpfscope, general path (classic, the record)", gen, raw[0])
        row("bpftrace", theirs, raw[0])
        rows.append((name, ours, gen, theirs, raw, classic))
    print(f"== sched verbs, ns added per event (ns per run), on CPU 0: {ITERS['yieldloop']:,} "
          f"yields by each of two processes, {ITERS['pingpong']:,} pipe round trips")
    print(f"  {'shape':58} {'bpfscope':>16} {'classic path':>16} {'bpftrace':>16}  "
          f"{'/bpftrace':>9} {'/raw floor':>10}  floors: raw, classic")
    for name, o, g, t, r, c in rows:
        print(f"  {name:58} {o[0]:6.1f} ({o[1]:6.1f}) {g[0]:6.1f} ({g[1]:6.1f}) "
              f"{t[0]:6.1f} ({t[1]:6.1f})  {ratio(o[0], t[0]):9.2f} {ratio(o[0], r[0]):10.2f}"
              f"  {r[0]:.1f} ({r[1]:.1f}), {c[0]:.1f} ({c[1]:.1f})")


def row(label, m, floor=None):
    added, run, share, (lo, hi) = m
    extra = f"  {added / floor:5.2f} x floor" if floor else ""
    print(f"  {label:44} {added:7.1f} ns added ({lo:6.1f} .. {hi:6.1f})  {run:7.1f} ns/run  "
          f"share {share:4.2f}{extra}", flush=True)


def main():
    need_root()
    need("bpftrace", "bpftrace")
    build()
    loop = cc("umaskloop")
    shapes = [s for s in SHAPES if VERBS and (not sys.argv[1:] or s in sys.argv[1:])]
    scripts = [s for s in SCRIPTS if RUN_SCRIPTS and (not sys.argv[1:] or s in sys.argv[1:])]
    for s in sys.argv[1:]:
        if s not in SHAPES and s not in SCRIPTS:
            sys.exit(f"bench: unknown shape {s!r}; one of: {', '.join([*SHAPES, *SCRIPTS])}")
    path = "general path (BPFSCOPE_GENERIC=1)" if os.environ.get("BPFSCOPE_GENERIC") else \
        "specialized paths"
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"== {CALLS:,} umask(2) calls, medians of {ROUNDS} rounds; bpfscope: {path}; "
          f"load {load}")

    print("floors:")
    raw = measure(loop, lambda: start_bpfscope(["count", PROBE], "entry"), ROUNDS)
    row("empty raw tracepoint program (sys_enter)", raw)
    classic = measure(loop, lambda: start_bpftrace(f"{PROBE} {{}}"), ROUNDS)
    row("empty classic tracepoint program (bpftrace)", classic)
    floor = raw[0]

    summary = []
    for shape in shapes:
        args, body, pred = SHAPES[shape]
        full = [verb(shape), PROBE, *args]
        print(f"{shape}:")
        if STAGES:
            for stage in BREAKDOWN:
                m = measure(loop, lambda st=stage: start_bpfscope(full, st), ROUNDS)
                row(f"bpfscope, stopped after {stage}", m, floor)
        ours = measure(loop, lambda: start_bpfscope(full), ROUNDS)
        row("bpfscope", ours, floor)
        if "--by" in args:
            # The same without the per-CPU key cache: the hash map for every event.
            m = measure(loop, lambda: start_bpfscope(full, cache=False), ROUNDS)
            row("bpfscope without the key cache", m, floor)
        theirs = measure(loop, lambda: start_bpftrace(f"{PROBE} {pred} {{ {body} }}"), ROUNDS)
        row("bpftrace", theirs, floor)
        summary.append((shape, ours, theirs))

    runs = []
    for name in scripts:
        script = SCRIPTS[name]
        print(f"{name}:")
        compiled = measure(loop, lambda: start_script(script, False), ROUNDS)
        row("bpfscope run, compiled", compiled, floor)
        machine = measure(loop, lambda: start_script(script, True), ROUNDS)
        row("bpfscope run, script machine", machine, floor)
        theirs = measure(loop, lambda: start_bpftrace(script), ROUNDS)
        row("bpftrace", theirs, floor)
        runs.append((name, compiled, machine, theirs))

    if RUN_SCHED and not sys.argv[1:]:
        sched_section()

    print(f"== ns added per event (ns per run); floor: empty raw tracepoint {floor:.1f} "
          f"({raw[1]:.1f}), empty classic tracepoint {classic[0]:.1f} ({classic[1]:.1f})")
    print(f"  {'shape':30} {'bpfscope':>16} {'bpftrace':>16}  {'/floor':>6} {'/bpftrace':>9}"
          f"  targets (<= 1.3, <= 0.5)")
    for shape, ours, theirs in summary:
        r_floor = ratio(ours[0], floor)
        r_bt = ratio(ours[0], theirs[0])
        note = ""
        half = 0.5 * theirs[0]
        if half < floor:
            note = f"  0.5 x bpftrace = {half:.1f} ns is under the floor ({floor:.1f} ns)"
        print(f"  {shape:30} {ours[0]:6.1f} ({ours[1]:6.1f}) {theirs[0]:6.1f} ({theirs[1]:6.1f})"
              f"  {r_floor:6.2f} {r_bt:9.2f}{note}")

    if runs:
        print(f"== scripts, ns added per umask call (ns per program run); floor: empty raw "
              f"tracepoint {floor:.1f} ({raw[1]:.1f}), empty classic tracepoint {classic[0]:.1f} "
              f"({classic[1]:.1f})")
        print(f"  {'script':36} {'compiled':>16} {'machine':>16} {'bpftrace':>16}  "
              f"{'/bpftrace':>9} (target <= 0.5)  machine/bpftrace")
        for name, c, m, t in runs:
            note = ""
            if 0.5 * t[0] < floor:
                note = f"  0.5 x bpftrace = {0.5 * t[0]:.1f} ns is under the floor ({floor:.1f} ns)"
            print(f"  {name:36} {c[0]:6.1f} ({c[1]:6.1f}) {m[0]:6.1f} ({m[1]:6.1f}) "
                  f"{t[0]:6.1f} ({t[1]:6.1f})  {ratio(c[0], t[0]):9.2f}  "
                  f"{ratio(m[0], t[0]):27.2f}{note}")


if __name__ == "__main__":
    sys.exit(main())
