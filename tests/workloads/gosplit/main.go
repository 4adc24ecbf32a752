// A known 3:1 split between two Go functions (tests/it/runtimes.rs), built
// stripped (-ldflags=-s -w): names come from .gopclntab, and the leaf spin()
// has no frame of its own, which frame pointers alone would lose.
// With a second argument "signals", a goroutine also sends the process
// SIGUSR1 as fast as it can, so that samples land in Go's signal handler
// and its restorer (runtime.sigreturn).
package main

import (
	"fmt"
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
func heavyGo(w *worker) int { return w.spin(3_000_000) }

//go:noinline
func lightGo(w *worker) int { return w.spin(1_000_000) }

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
		t += heavyGo(w)
		t += lightGo(w)
	}
	fmt.Println(t > 0)
}
