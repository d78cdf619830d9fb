//go:build soak

package lease_test

import (
	"os"
	"testing"
	"time"
)

// soakRestart is make soak's run of the four processes through a store: about SLUICE_SOAK
// long (default 1m), the member killed after a quarter and the store after half, held to
// the figure: the pool uses at least 90% of the limit in each window.
// SLUICE_SOAK_MARGIN sets the members' margin (default shortRestart's, 20 ms): with 0 they
// use every permit however late, and the run reports (without judging them) how far the
// machine's scheduling bunched the use times (docs/lease.md, "Measured").
func soakRestart() restartPlan {
	d, err := time.ParseDuration(os.Getenv("SLUICE_SOAK"))
	if err != nil || d <= 0 {
		d = time.Minute
	}
	margin := shortRestart.margin
	if m, err := time.ParseDuration(os.Getenv("SLUICE_SOAK_MARGIN")); err == nil && m >= 0 {
		margin = m
	}
	return restartPlan{kill: d / 4, down: d / 2, after: d / 2, margin: margin, minUse: 0.9}
}

// TestSoakMultiProcessOnEtcd: TestMultiProcessOnEtcdAndZK's etcd run for SLUICE_SOAK
// (soakRestart).
func TestSoakMultiProcessOnEtcd(t *testing.T) {
	testStoreRestarts(t, soakRestart(), etcdRun(t))
}

// TestSoakMultiProcessOnZK: TestMultiProcessOnEtcdAndZK's ZooKeeper run for SLUICE_SOAK
// (soakRestart).
func TestSoakMultiProcessOnZK(t *testing.T) {
	testStoreRestarts(t, soakRestart(), zkRun(t))
}
