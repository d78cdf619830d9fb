package cli

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/internal/buildinfo"
)

func init() {
	register(command{name: "version", summary: "print the version and commit of this build", run: runVersion})
}

func runVersion(_ context.Context, env Env, args []string) error {
	fs := newFlags(env, "version", "version")
	if err := parseFlags(env, fs, args); err != nil {
		return err
	}
	fmt.Fprintln(env.Stdout, buildinfo.Read())
	return nil
}
