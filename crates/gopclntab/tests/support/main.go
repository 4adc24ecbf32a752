// Test program for the gosym tests: a hot loop, a call chain, a method, a
// closure and two levels of inlining.
package main

import (
	"fmt"
	"os"
	"strconv"
)

type Acc struct{ sum uint64 }

//go:noinline
func (a *Acc) Add(v uint64) { a.sum += v*v ^ (v >> 3) }

// Get is small enough to be inlined into its callers.
func (a *Acc) Get() uint64 { return a.sum }

//go:noinline
func hot(n int) uint64 {
	var s uint64
	for i := 0; i < n; i++ {
		s += uint64(i) * 2654435761
		s ^= s >> 7
	}
	return s
}

//go:noinline
func outer(n int) uint64 { return inner(n) + 1 }

//go:noinline
func inner(n int) uint64 {
	s := uint64(0)
	for i := 0; i < n; i++ {
		s += uint64(small(i))
	}
	return s
}

// small and twice are inlined (two levels) into inner and main.
func small(x int) int { return twice(x) + 1 }

func twice(x int) int { return x*2 + x }

//go:noinline
func apply(f func(uint64), v uint64) { f(v) }

func main() {
	n := 1000
	if len(os.Args) > 1 {
		n, _ = strconv.Atoi(os.Args[1])
	}
	a := &Acc{}
	f := func(v uint64) { a.Add(v + 1) }
	for i := 0; i < n; i++ {
		apply(f, hot(small(i)))
	}
	fmt.Println(outer(n), a.Get())
}
