"""Two Python threads, each spinning in its own function, and the main
thread blocked in join (tests/it/runtimes.rs): each thread's samples must
carry its own function, found through its own thread state."""
import sys
import threading
import time

def spin_red(end):
    n = 0
    while time.monotonic() < end:
        n += 1
    return n

def spin_blue(end):
    n = 0
    while time.monotonic() < end:
        n += 1
    return n

def main(seconds):
    end = time.monotonic() + seconds
    ts = [threading.Thread(target=f, args=(end,), name=f.__name__) for f in (spin_red, spin_blue)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()

if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)
