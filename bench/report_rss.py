#!/usr/bin/env python3
"""Peak resident memory of a whole-system profile's end-of-run
symbolization: `bpfscope record` and `perf record -a -g` sample the
whole system side by side for SECONDS at 99 Hz while processes come and
go (the 3:1 workload, gzip and a shell started over and over, and whatever
else runs: compilers pull in libLLVM's and cc1's large symbol tables),
then `bpfscope report` into folded and JSON output and `perf report
--stdio` run one after the other, each under /usr/bin/time for its peak
RSS. BPFSCOPE_BASE=/path/to/an/older/bpfscope reports the same recording
with that binary too (before/after figures).

    bench/report_rss.py [SECONDS] [ROUNDS]      (default 60 s, 1 round)
"""

import os
import struct
import subprocess
import sys

from common import BIN, OUT, build, need, need_root, workload


def peak_kib(cmd):
    """Peak RSS in KiB and wall seconds of a command run to its end."""
    r = subprocess.run(["/usr/bin/time", "-f", "%M %e", *cmd],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # perf report says "Error:" and exits 0 when it cannot read the data.
    if r.returncode != 0 or "Error:" in r.stderr:
        sys.exit(f"bench: {' '.join(cmd)} failed: {r.stderr[-2000:]}")
    kib, secs = r.stderr.strip().splitlines()[-1].split()
    return int(kib), float(secs)


def without_ksymbol(data):
    """perf 6.1's report stops at this kernel's KSYMBOL records (BPF
    programs and trampolines loaded while recording: "failed to process
    type: 17 [Bad address]", their sample id does not parse), which perf
    record writes even with --no-bpf-event. Each becomes a finished-round
    record of the same size, which report reads as a header alone (it
    flushes its queue early: perf then warns of out-of-order events):
    only the names of BPF code are lost to perf's side."""
    with open(data, "r+b") as f:
        head = f.read(56)
        if head[:8] != b"PERFILE2":
            sys.exit(f"bench: {data} is not a perf.data file")
        off, size = struct.unpack_from("<QQ", head, 40)
        pos, end, n = off, off + size, 0
        while pos + 8 <= end:
            f.seek(pos)
            typ, _misc, rsize = struct.unpack("<IHH", f.read(8))
            if rsize == 0:
                break
            if typ == 17:
                f.seek(pos)
                f.write(struct.pack("<I", 68))
                n += 1
            pos += rsize
    return n


def mib(kib):
    return f"{kib / 1024:.1f} MiB"


def one_round(secs, split, n):
    rec = os.path.join(OUT, f"rss-{n}.bscope")
    data = os.path.join(OUT, f"rss-{n}.perf.data")
    churn = (f"timeout {secs + 8} sh -c 'while :; do gzip -1 -c /usr/bin/* >/dev/null 2>&1; "
             f"sh -c true; ls -R /usr/share >/dev/null 2>&1; done'")
    load = [subprocess.Popen([split, "bench_rss", str(secs + 8)]),
            subprocess.Popen(["sh", "-c", churn])]
    try:
        # --no-bpf-event: perf 6.1's report stops at the first KSYMBOL
        # record of this kernel's BPF programs ("failed to process type: 17").
        perf = subprocess.Popen(["perf", "record", "-F", "99", "-a", "-g", "--no-bpf-event", "-o", data,
                                 "--", "sleep", str(secs)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rec_kib, _ = peak_kib([BIN, "record", "--duration", str(secs), "-o", rec])
        perf.wait()
    finally:
        for p in load:
            p.kill()
            p.wait()
    res = {"record": rec_kib}
    res["report folded"] = peak_kib([BIN, "report", rec, "-o", os.path.join(OUT, "rss.folded")])
    res["report json"] = peak_kib([BIN, "report", rec, "-o", os.path.join(OUT, "rss.json")])
    base = os.environ.get("BPFSCOPE_BASE")
    if base:
        res["base report folded"] = peak_kib([base, "report", rec, "-o", os.path.join(OUT, "rss-base.folded")])
    without_ksymbol(data)
    res["perf report"] = peak_kib(["perf", "report", "-i", data, "--stdio"])
    info = subprocess.run([BIN, "report", rec, "-v", "-o", os.path.join(OUT, "rss.folded")],
                          capture_output=True, text=True).stderr
    files = sum(1 for l in info.splitlines() if "offsets symbolized from" in l)
    samples = next((l.split("(")[1].split()[0] for l in info.splitlines()
                    if l.startswith("Wrote ")), "?")
    perf_kib = res["perf report"][0]
    print(f"round {n}: {samples} samples, {files} files symbolized; "
          f"bpfscope record {mib(rec_kib)} while sampling")
    for k, v in res.items():
        if k == "record":
            continue
        print(f"  {k}: peak RSS {mib(v[0])} ({v[1]:.2f} s), ratio to perf report {v[0] / perf_kib:.2f}")


def main():
    need_root()
    need("perf", "linux-perf")
    build()
    secs = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    split = workload()
    for n in range(1, rounds + 1):
        one_round(secs, split, n)
    with open("/proc/loadavg") as f:
        print(f"load average at the end: {f.read().split()[0]}")


if __name__ == "__main__":
    main()
