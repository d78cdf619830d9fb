package sim

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// scenarioDir holds the shipped scenarios (the large ones in large/, which the tests that
// run every scenario leave out).
const scenarioDir = "../scenarios"

// shippedScenarios lists the scenario files in scenarioDir, each once: a symlink there is a
// scenario's former file name, kept for one release, and is left out.
func shippedScenarios(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(scenarioDir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if e.Type()&fs.ModeSymlink != 0 || !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		files = append(files, filepath.Join(scenarioDir, e.Name()))
	}
	return files
}

// TestScenarioAliases: every symlink in scenarioDir (a scenario's former file name, kept
// for one release) points, by a relative name, at a scenario file that ships next to it,
// and loads as that scenario.
func TestScenarioAliases(t *testing.T) {
	entries, err := os.ReadDir(scenarioDir)
	if err != nil {
		t.Fatal(err)
	}
	shipped := map[string]bool{}
	for _, f := range shippedScenarios(t) {
		shipped[filepath.Base(f)] = true
	}
	for _, e := range entries {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		alias := filepath.Join(scenarioDir, e.Name())
		target, err := os.Readlink(alias)
		if err != nil {
			t.Errorf("%s: %v", alias, err)
			continue
		}
		if !shipped[target] {
			t.Errorf("%s points at %q, not at a scenario file next to it", alias, target)
			continue
		}
		sc, err := Load(alias)
		if err != nil {
			t.Errorf("%s: %v", alias, err)
			continue
		}
		if want := strings.TrimSuffix(target, ".yaml"); sc.Name != want {
			t.Errorf("%s loads scenario %q, want %q", alias, sc.Name, want)
		}
	}
}
