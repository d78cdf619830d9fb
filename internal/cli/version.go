package cli

import (
	"context"
	"fmt"
	"runtime/debug"
)

func init() {
	register(command{name: "version", summary: "print the version", run: runVersion})
}

func runVersion(_ context.Context, env Env, args []string) error {
	fs := newFlags(env, "version", "version")
	if err := parseFlags(env, fs, args); err != nil {
		return err
	}
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	fmt.Fprintln(env.Stdout, "sluice", v)
	return nil
}
