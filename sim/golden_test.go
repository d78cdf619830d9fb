//go:build !race

package sim

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The golden test runs every shipped scenario in full, hours and days of virtual time:
// about a minute under the race detector, a few seconds without it. It is built without
// -race only; make test runs it in a step of its own (go test -run Golden ./sim), so the
// race run of the package stays short. The engine's code paths still run under -race in
// the other tests, on shorter scenarios.

// TestShippedScenariosAreDeterministicAndGolden compares every shipped scenario's report
// with its golden one (refresh with -update, which runs each twice and demands the same
// bytes before it writes: a report that matches the golden one written by an earlier run
// is as deterministic).
func TestShippedScenariosAreDeterministicAndGolden(t *testing.T) {
	files := shippedScenarios(t)
	if len(files) < 3 {
		t.Fatalf("%d scenarios ship, want at least 3", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			sc, err := Load(f)
			if err != nil {
				t.Fatal(err)
			}
			var a, b bytes.Buffer
			runs := []*bytes.Buffer{&a}
			if *update {
				runs = append(runs, &b)
			}
			for _, buf := range runs {
				r, err := Run(sc, Options{})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.WriteJSON(buf); err != nil {
					t.Fatal(err)
				}
			}
			if *update && !bytes.Equal(a.Bytes(), b.Bytes()) {
				t.Fatalf("two runs differ")
			}
			golden := filepath.Join("testdata", "golden", strings.TrimSuffix(filepath.Base(f), ".yaml")+".json")
			if *update {
				if err := os.WriteFile(golden, a.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(a.Bytes(), want) {
				t.Errorf("the report differs from %s (run go test ./sim -run Golden -update if the change is intended)", golden)
			}
		})
	}
}
