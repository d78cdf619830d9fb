// Package poll waits in tests for a condition that another goroutine or process makes
// true, in real time: the one loop the packages' tests share.
package poll

import (
	"runtime"
	"testing"
	"time"
)

// Until calls cond until it holds, and fails t (naming what) if it does not within limit.
// Between calls it sleeps every, or only yields the processor when every is 0 (for a
// condition another goroutine of the process makes true at once).
func Until(t testing.TB, what string, limit, every time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		if every > 0 {
			time.Sleep(every)
		} else {
			runtime.Gosched()
		}
	}
}
