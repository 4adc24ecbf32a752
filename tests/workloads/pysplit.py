"""A known 3:1 split between two Python functions (tests/it/runtimes.rs).

heavy() and light() call the same leaf with 3x and 1x the work, so their
shares of the samples are 75% and 25%. The work varies at random from one
round to the next: a fixed round phase-locks with the sampling period. Line
numbers are asserted by the tests: keep the lines where they are.
"""
import random, sys, time

def work(n):
    s = 0
    for i in range(n):
        s += i * i
    return s

def heavy(n):
    return work(3 * n)

def light(n):
    return work(n)

def main(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        heavy(n := random.randrange(5000, 15001))
        light(n)

if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
