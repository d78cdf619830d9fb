package local

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: background sweeps
// must end by Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
