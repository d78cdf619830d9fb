package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSimStopsOnASignal: `sluice sim` on the large scenario (an hour of 1,000 members, most
// of a minute of work) stops within 1.5 s of SIGINT, prints the table of what it measured
// with a line saying it was interrupted, and exits 130; with --json, SIGTERM, the report
// marked partial, and 143.
func TestSimStopsOnASignal(t *testing.T) {
	for _, c := range []struct {
		sig  os.Signal
		args []string
		code int
		want []string
	}{
		{syscall.SIGINT, nil, 130, []string{"interrupted at ", "accepted"}},
		{syscall.SIGTERM, []string{"--json"}, 143, []string{`"partial": true`, `"interrupted_at_s"`, `"accepted"`}},
	} {
		cmd := exec.Command(binary, append([]string{"sim", "../../scenarios/large/pool-1000-hour.yaml"}, c.args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		time.Sleep(500 * time.Millisecond) // well into the run
		sent := time.Now()
		if err := cmd.Process.Signal(c.sig); err != nil {
			t.Fatal(err)
		}
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatalf("%v: still running 10 s after the signal", c.sig)
		}
		if took := time.Since(sent); took > 1500*time.Millisecond {
			t.Errorf("%v: exited %v after the signal, want within 1.5 s", c.sig, took)
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != c.code {
			t.Errorf("%v: %v, want exit code %d; stderr %q", c.sig, err, c.code, errb.String())
		}
		for _, w := range c.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v: the output lacks %q: %q", c.sig, w, out.String())
			}
		}
		if !strings.Contains(errb.String(), "interrupted") {
			t.Errorf("%v: stderr %q does not say the run was interrupted", c.sig, errb.String())
		}
	}
}
