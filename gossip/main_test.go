package gossip

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain makes the test binary a member process when memberEnv is set, and otherwise
// fails the package if a test leaves a goroutine behind (but memberlist's probe in flight).
func TestMain(m *testing.M) {
	if os.Getenv(memberEnv) != "" {
		os.Exit(memberMain())
	}
	// memberlist's Shutdown does not wait for a probe in flight: it ends by itself within
	// a probe interval (500 ms here) of the member's Close, which a short last test may
	// not leave it.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}
