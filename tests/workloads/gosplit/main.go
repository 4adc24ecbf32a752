// A known 3:1 split between two Go functions (tests/it/runtimes.rs), built
// stripped (-ldflags=-s -w): names come from .gopclntab, and the leaf spin()
// has no frame of its own, which frame pointers alone would lose.
// With a second argument "signals", a goroutine also sends the process
// SIGUSR1 as fast as it can, so that samples land in Go's signal handler
// and its restorer (runtime.sigreturn). A round's work varies at random:
// fixed rounds phase-lock with the sampling period and skew the split.
package main

import (
	"fmt"
	"math/rand"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

type worker struct{ n int }

//go:noinline
func (w *worker) spin(n int) int {
	s := 0
	for i := 0; i < n; i++ {
		s += i * i % 7
	}
	return s
}

//go:noinline
func heavyGo(w *worker, n int) int { return w.spin(3 * n) }

//go:noinline
func lightGo(w *worker, n int) int { return w.spin(n) }

func main() {
	secs := 2.0
	if len(os.Args) > 1 {
		secs, _ = strconv.ParseFloat(os.Args[1], 64)
	}
	if len(os.Args) > 2 && os.Args[2] == "signals" {
		c := make(chan os.Signal, 1024)
		signal.Notify(c, syscall.SIGUSR1)
		go func() {
			for range c {
			}
		}()
		go func() {
			for {
				syscall.Kill(os.Getpid(), syscall.SIGUSR1)
			}
		}()
	}
	w := &worker{}
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	t := 0
	for time.Now().Before(end) {
		n := 500_000 + rand.Intn(1_000_001)
		t += heavyGo(w, n)
		t += lightGo(w, n)
	}
	fmt.Println(t > 0)
}
