// Package buildinfo says which build of sluice is running: the module version and the
// commit, read from the binary (runtime/debug.ReadBuildInfo, which the go command fills
// from the module and, when it may, from git), or from the -ldflags -X values `make
// release` sets when the build cannot ask git.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Set by `make release` with -ldflags "-X github.com/sluicehq/sluice/internal/buildinfo.version=... -X ...commit=...".
var version, commit string

// Info is what a build says about itself.
type Info struct {
	Version   string // the module version (v1.2.3, a pseudo-version), or "(devel)"
	Commit    string // the git commit, "" if unknown; with "+dirty" when built from a modified tree
	GoVersion string // the Go toolchain that built it
}

// Read returns the running binary's Info.
func Read() Info {
	in := Info{Version: "(devel)", GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			in.Version = bi.Main.Version
		}
		var dirty bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Commit = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if in.Commit != "" && dirty {
			in.Commit += "+dirty"
		}
	}
	if version != "" {
		in.Version = version
	}
	if commit != "" {
		in.Commit = commit
	}
	return in
}

// String is the one-line form `sluice version` prints: "sluice v1.2.3 (commit abc1234, go1.26.0)".
func (in Info) String() string {
	var b strings.Builder
	b.WriteString("sluice ")
	b.WriteString(in.Version)
	b.WriteString(" (")
	if in.Commit != "" {
		b.WriteString("commit ")
		b.WriteString(in.Commit)
		b.WriteString(", ")
	}
	b.WriteString(in.GoVersion)
	b.WriteString(")")
	return b.String()
}
