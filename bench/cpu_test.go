package bench

import (
	"runtime"
	"sync/atomic"
	"testing"
)

// cpuTimer adds up the CPU time a benchmark's goroutines spend, each measured on its own
// thread (locked to it for the run), and reports it per op as cpu-ns/op. Time a goroutine
// spends waiting for a core is not in it: on a shared machine the wall time per op (ns/op)
// moves twofold from one run to the next with the other load, this much less. It is
// reported only where the thread's CPU time can be read (Linux).
type cpuTimer struct {
	ns atomic.Int64
	ok atomic.Bool
}

// run calls f and adds the CPU time the calling goroutine's thread spent in it.
func (c *cpuTimer) run(f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0, ok := threadCPU()
	f()
	if t1, ok1 := threadCPU(); ok && ok1 {
		c.ns.Add(t1 - t0)
		c.ok.Store(true)
	}
}

// report reports the CPU time per op.
func (c *cpuTimer) report(b *testing.B) {
	if c.ok.Load() && b.N > 0 {
		b.ReportMetric(float64(c.ns.Load())/float64(b.N), "cpu-ns/op")
	}
}

// loop runs b's loop (b.Loop) on the calling goroutine, timing its CPU.
func cpuLoop(b *testing.B, f func()) {
	var c cpuTimer
	c.run(func() {
		for b.Loop() {
			f()
		}
	})
	c.report(b)
}

// cpuParallel is b.RunParallel(body), timing each goroutine's CPU.
func cpuParallel(b *testing.B, body func(*testing.PB)) {
	var c cpuTimer
	b.RunParallel(func(pb *testing.PB) { c.run(func() { body(pb) }) })
	c.report(b)
}
