package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpForEveryCommand(t *testing.T) {
	for name := range commands {
		code, out, _ := run(t, name, "--help")
		if code != 0 || !strings.Contains(out, "Usage: sluice "+name) {
			t.Errorf("%s --help: exit %d, output %q", name, code, out)
		}
	}
	code, out, _ := run(t, "help")
	if code != 0 || !strings.Contains(out, "demo") || !strings.Contains(out, "referee") {
		t.Errorf("help: %d %q", code, out)
	}
}

func TestBadUsage(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--limit", "ten per sec"}, "limit"},
		{[]string{"demo", "--limit", "5/fortnight"}, "fortnight"},
		{[]string{"demo", "--workers", "0"}, "--workers"},
		{[]string{"demo", "--duration", "-1s"}, "--duration"},
		{[]string{"demo", "--mode", "quantum"}, "quantum"},
		{[]string{"demo", "stray"}, "stray"},
		{[]string{"referee", "--limit", "0/s"}, "limit"},
		{[]string{"nonesuch"}, "nonesuch"},
		{nil, "no command"},
	}
	for _, c := range cases {
		code, _, errs := run(t, c.args...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errs, c.want)
		}
	}
}

func TestDemoJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("real time")
	}
	code, out, errs := run(t, "demo", "--duration", "1s", "--workers", "3", "--margin", "100ms", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j map[string]any
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("not JSON: %v: %q", err, out)
	}
	for _, k := range []string{"mode", "limit", "accepted", "violations", "utilization", "jain", "per_worker"} {
		if _, ok := j[k]; !ok {
			t.Errorf("the JSON lacks %q", k)
		}
	}
	if j["mode"] != "local" || j["limit"] != "20/s burst=10" {
		t.Errorf("mode %v limit %v", j["mode"], j["limit"])
	}
	code, out, errs = run(t, "demo", "--mode", "lease", "--duration", "1s", "--workers", "3", "--margin", "100ms", "--json")
	if code != 0 {
		t.Fatalf("lease: exit %d: %s", code, errs)
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || j["mode"] != "lease" || j["violations"] != 0.0 {
		t.Errorf("lease: %v %v", err, out)
	}
}

func TestSimCommand(t *testing.T) {
	code, out, errs := run(t, "sim", "../../scenarios/seed000-timeline.yaml", "--json", "--modes", "central")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j struct {
		Modes []map[string]any `json:"modes"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || len(j.Modes) != 1 {
		t.Fatalf("report %q: %v", out, err)
	}
	for _, k := range []string{"accepted", "violations", "utilization", "jain"} {
		if _, ok := j.Modes[0][k]; !ok {
			t.Errorf("the report lacks %q", k)
		}
	}
	code, out, _ = run(t, "sim", "--modes", "local", "../../scenarios/seed000-timeline.yaml")
	if code != 0 || !strings.Contains(out, "local") {
		t.Errorf("flags before the file: %d %q", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sim"}, "no scenario file"},
		{[]string{"sim", "nope.yaml"}, "nope.yaml"},
		{[]string{"sim", "../../scenarios/seed000-timeline.yaml", "--modes", "quantum"}, "quantum"},
		{[]string{"sim", "a.yaml", "b.yaml"}, "one scenario file"},
	} {
		code, _, errs := run(t, c.args...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d stderr %q, want 2 and %q", c.args, code, errs, c.want)
		}
	}
}
