#!/usr/bin/env python3
"""Kernel function probes, bpfscope vs bpftrace, inside a guest kernel.

Run on the host: builds, then boots the kernel with tests/guest/run-guest
and runs the measurements inside it (this host refuses kprobes and fentry):

    bench/kfunc_in_guest.py [--kernel 6.12] [RUNS]

1. Wall time of a complete run attaching every vfs_* function by glob
   (`count 'kprobe:vfs_*' --by probe -- /bin/true` vs bpftrace's
   `kprobe:vfs_* { @[probe] = count(); }` with -c /bin/true), and the
   same with fentry (bpftrace: kfunc).
2. Time added per getppid(2) while counting its kernel function through
   fentry vs through a kprobe (bpfscope, and bpftrace's kfunc vs kprobe).

The guest runs under TCG emulation, which distorts absolute times (and
not every operation by the same factor): only ratios are printed.
"""
import os
import statistics
import subprocess
import sys

from common import BIN, OUT, ROOT, Background, build, cc, ratio, wall

FUNC = "__do_sys_getppid"


def host(argv):
    kernel = "6.12"
    if argv[:1] == ["--kernel"]:
        kernel, argv = argv[1], argv[2:]
    build()
    cc("getppidloop")
    py = "/usr/bin/python3"
    rc = subprocess.run([os.path.join(ROOT, "tests", "guest", "run-guest"), "--kernel", kernel,
                         "--share", ROOT, "--timeout", "1800", "--",
                         py, os.path.abspath(__file__), "--inside", *argv]).returncode
    sys.exit(rc)


def per_call(loop, n):
    return float(subprocess.run([loop, str(n)], capture_output=True, text=True, check=True).stdout)


def inside(argv):
    runs = int(argv[0]) if argv else 3
    print(f"kernel {os.uname().release}, TCG emulation: absolute times are distorted, ratios only")

    glob = [
        ("kprobe:vfs_*", [BIN, "count", "kprobe:vfs_*", "--by", "probe", "--", "/bin/true"],
         ["bpftrace", "-e", "kprobe:vfs_* { @[probe] = count(); }", "-c", "/bin/true"]),
        ("fentry:vfs_*", [BIN, "count", "fentry:vfs_*", "--by", "probe", "--", "/bin/true"],
         ["bpftrace", "-e", "kfunc:vfs_* { @[probe] = count(); }", "-c", "/bin/true"]),
    ]
    n_bt = len(subprocess.run(["bpftrace", "-l", "kprobe:vfs_*"], capture_output=True,
                              text=True, check=True).stdout.split())
    n_ours = len(subprocess.run([BIN, "list", "kprobe:vfs_*", "--names"], capture_output=True,
                                text=True, check=True).stdout.split())
    print(f"glob attach, complete run (-- /bin/true), median of {runs}; {n_ours} functions "
          f"for bpfscope, {n_bt} for bpftrace:")
    for name, ours_cmd, bt_cmd in glob:
        ours = wall(ours_cmd, runs)
        theirs = wall(bt_cmd, runs)
        print(f"  {name:14} bpfscope / bpftrace wall time: {ratio(ours, theirs):6.3f}")

    loop = os.path.join(OUT, "getppidloop")
    n = 200000
    base, fe, kp, bt_fe, bt_kp = [], [], [], [], []
    env_k = dict(os.environ, BPFSCOPE_KFUNC_VIA="kprobe")
    env_f = dict(os.environ, BPFSCOPE_KFUNC_VIA="fentry")
    for _ in range(runs):
        base.append(per_call(loop, n))
        for env, out in ((env_f, fe), (env_k, kp)):
            t = Background([BIN, "count", f"kprobe:{FUNC}"], "Attached", env=env)
            out.append(per_call(loop, n))
            t.stop()
        for kind, out in (("kfunc", bt_fe), ("kprobe", bt_kp)):
            t = Background(["bpftrace", "-e", f"{kind}:{FUNC} {{ @ = count(); }}"], "Attaching",
                           stream="stdout")
            out.append(per_call(loop, n))
            t.stop()
    b = statistics.median(base)
    add = {k: statistics.median(v) - b for k, v in
           (("fe", fe), ("kp", kp), ("bt_fe", bt_fe), ("bt_kp", bt_kp))}
    print(f"count of {FUNC} per getppid(2), added time, medians of {runs} rounds x {n} calls:")
    print(f"  bpfscope fentry / bpfscope kprobe : {ratio(add['fe'], add['kp']):6.3f}")
    print(f"  bpftrace kfunc  / bpftrace kprobe : {ratio(add['bt_fe'], add['bt_kp']):6.3f}")
    print(f"  bpfscope fentry / bpftrace kfunc  : {ratio(add['fe'], add['bt_fe']):6.3f}")
    print(f"  bpfscope kprobe / bpftrace kprobe : {ratio(add['kp'], add['bt_kp']):6.3f}")
    print(f"  added by bpfscope fentry / untraced call: {ratio(add['fe'], b):6.3f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inside"]:
        inside(sys.argv[2:])
    else:
        host(sys.argv[1:])
