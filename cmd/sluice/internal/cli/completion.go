package cli

import (
	"github.com/spf13/cobra"
)

func init() { register(newCompletionCmd) }

// shells are the shells cobra writes a completion script for.
var shells = []string{"bash", "zsh", "fish", "powershell"}

// newCompletionCmd prints the completion script cobra generates for a shell. The script
// asks the binary itself (its hidden __complete command) what to complete, so it always
// knows the binary's commands, flags and values.
func newCompletionCmd(env Env) *cobra.Command {
	return &cobra.Command{
		Use:   "completion SHELL",
		Short: "print a shell completion script: bash, zsh, fish or powershell",
		Long: `print a shell completion script: bash, zsh, fish or powershell

  bash:        source <(sluice completion bash)   (or save it in /etc/bash_completion.d/sluice)
  zsh:         sluice completion zsh > "${fpath[1]}/_sluice"   (or source it after compinit)
  fish:        sluice completion fish > ~/.config/fish/completions/sluice.fish
  powershell:  sluice completion powershell | Out-String | Invoke-Expression   (or add it to $PROFILE)

The script runs sluice to complete: it must be on the PATH.`,
		ValidArgs: shells,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("want one shell: bash, zsh, fish or powershell")
			}
			root := cmd.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(env.Stdout, true)
			case "zsh":
				return root.GenZshCompletion(env.Stdout)
			case "fish":
				return root.GenFishCompletion(env.Stdout, true)
			case "powershell":
				return root.GenPowerShellCompletionWithDesc(env.Stdout)
			}
			return usagef("shell %q: want bash, zsh, fish or powershell", args[0])
		},
	}
}
