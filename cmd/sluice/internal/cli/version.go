package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/buildinfo"
)

func init() { register(newVersionCmd) }

func newVersionCmd(env Env) *cobra.Command {
	return &cobra.Command{
		Use:               "version",
		Short:             "print the version and commit of this build",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(env.Stdout, buildinfo.Read())
			return nil
		},
	}
}
