package gossip

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain makes the test binary a member process when memberEnv is set, and otherwise
// fails the package if a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	if os.Getenv(memberEnv) != "" {
		os.Exit(memberMain())
	}
	goleak.VerifyTestMain(m)
}
