// A known 3:1 split between two Go functions (tests/it/runtimes.rs), built
// stripped (-ldflags=-s -w): names come from .gopclntab, and the leaf spin()
// has no frame of its own, which frame pointers alone would lose.
package main

import (
	"fmt"
	"os"
	"strconv"
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
	w := &worker{}
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	t := 0
	for time.Now().Before(end) {
		t += heavyGo(w)
		t += lightGo(w)
	}
	fmt.Println(t > 0)
}
