"""A known 3:1 split between two Python functions (tests/it/runtimes.rs).

heavy() and light() call the same leaf with 3x and 1x the work, so their
shares of the samples are 75% and 25%: every iteration costs the same (no
cached small ints, no int past one digit). Rounds are short (under 0.1 ms)
and random, so samples fall on each independently. Keep the lines in place.
"""
import random, sys, time

def work(n):
    s = 0
    for i in range(1000, 1000 + n):
        s ^= i * i
    return s

def heavy(n):
    return work(3 * n)

def light(n):
    return work(n)

def main(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        heavy(n := random.randrange(300, 901))
        light(n)

if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
