#!/usr/bin/env python3
"""Checks Prometheus expositions with the reference parsers, for the agent's tests.

Reads requests from stdin, each a line "FORMAT LENGTH" (FORMAT: om for
OpenMetrics 1.0, text for the 0.0.4 text format) followed by LENGTH bytes
of exposition; answers each with one line: "ok" or "error: WHY".
OpenMetrics goes through prometheus_client's OpenMetrics parser, the text
format through prometheus_client's text parser and `promtool check metrics`
(strict: any lint finding is an error).
"""
import subprocess
import sys

try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
    from prometheus_client.parser import text_string_to_metric_families as parse_text
except ImportError:
    print("error: prometheus_client is not installed (scripts/install-deps installs it)", flush=True)
    sys.exit(1)


def check(fmt, text):
    if fmt == "om":
        list(parse_om(text))
        return
    list(parse_text(text))
    p = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
    out = (p.stdout + p.stderr).decode().strip()
    if p.returncode != 0 or out:
        raise ValueError(f"promtool: {out}")


def main():
    inp = sys.stdin.buffer
    while True:
        line = inp.readline()
        if not line:
            return
        fmt, n = line.decode().split()
        text = inp.read(int(n)).decode()
        try:
            check(fmt, text)
            print("ok", flush=True)
        except Exception as e:  # any refusal is the answer
            print("error: " + " ".join(str(e).split()), flush=True)


main()
