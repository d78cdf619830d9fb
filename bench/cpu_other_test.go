//go:build !linux

package bench

// threadCPU is not available here: cpu-ns/op is not reported.
func threadCPU() (int64, bool) { return 0, false }
