package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
)

func init() {
	register(command{
		name:    "completion",
		summary: "print a shell completion script: bash or zsh",
		run:     runCompletion,
	})
}

// flagValues are the values completed after the flags that take one of a few words.
var flagValues = map[string]string{
	"backend":    "local redis strict lease",
	"mode":       "local redis strict lease adaptive",
	"fail-mode":  "closed open local",
	"log-format": "text json",
	"log-level":  "debug info warn error",
}

func runCompletion(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env, "completion", "completion bash|zsh\n\n"+
		"  bash: source <(sluice completion bash)   (or save it in /etc/bash_completion.d/sluice)\n"+
		"  zsh:  sluice completion zsh > \"${fpath[1]}/_sluice\"   (or source it after compinit)")
	rest, err := parseArgs(env, fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return usagef("want one shell: bash or zsh")
	}
	cmds := commandFlags(ctx)
	switch rest[0] {
	case "bash":
		writeBash(env.Stdout, cmds)
	case "zsh":
		writeZsh(env.Stdout, cmds)
	default:
		return usagef("shell %q: want bash or zsh", rest[0])
	}
	return nil
}

// cmdFlags is a command and its flags, for the completion scripts.
type cmdFlags struct {
	name, summary string
	flags         []*flag.Flag
}

var (
	collectMu sync.Mutex
	collect   func(*flag.FlagSet) // when set, newFlags hands it every FlagSet it makes
)

// commandFlags lists every command with its flags, read from the FlagSets the commands
// build (each is run with --help, its output discarded), so the scripts never miss a flag.
func commandFlags(ctx context.Context) []cmdFlags {
	collectMu.Lock()
	defer collectMu.Unlock()
	var out []cmdFlags
	for _, name := range commandNames() {
		c := cmdFlags{name: name, summary: commands[name].summary}
		var made *flag.FlagSet
		collect = func(fs *flag.FlagSet) {
			if fs.Name() == name {
				made = fs
			}
		}
		_ = commands[name].run(ctx, Env{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard}, []string{"--help"})
		collect = nil
		if made != nil { // its flags are defined once newFlags has returned
			made.VisitAll(func(f *flag.Flag) { c.flags = append(c.flags, f) })
		}
		out = append(out, c)
	}
	return out
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func writeBash(w io.Writer, cmds []cmdFlags) {
	var names []string
	for _, c := range cmds {
		names = append(names, c.name)
	}
	fmt.Fprintf(w, `# bash completion for sluice: source <(sluice completion bash)
_sluice() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} opts=""
	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W "%s help --version" -- "$cur"))
		return
	fi
	case "$prev" in
`, strings.Join(names, " "))
	keys := make([]string, 0, len(flagValues))
	for k := range flagValues {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "\t--%s) COMPREPLY=($(compgen -W %q -- \"$cur\")); return ;;\n", k, flagValues[k])
	}
	fmt.Fprint(w, "\tesac\n\tcase \"${COMP_WORDS[1]}\" in\n")
	for _, c := range cmds {
		var fl []string
		for _, f := range c.flags {
			fl = append(fl, "--"+f.Name)
		}
		fmt.Fprintf(w, "\t%s) opts=%q ;;\n", c.name, strings.Join(fl, " "))
	}
	fmt.Fprint(w, `	esac
	if [[ "$cur" == -* ]]; then
		COMPREPLY=($(compgen -W "$opts" -- "$cur"))
	else
		COMPREPLY=($(compgen -f -- "$cur"))
	fi
}
complete -o default -F _sluice sluice
`)
}

// takesFile reports whether a flag's value is a file path.
func takesFile(f *flag.Flag) bool {
	name, _ := flag.UnquoteUsage(f)
	return strings.Contains(f.Name, "file") || f.Name == "config" || f.Name == "csv" || name == "file" || name == "FILE"
}

// zshQuote makes s safe inside a single-quoted _arguments spec.
func zshQuote(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 70 {
		s = s[:67] + "..."
	}
	return strings.NewReplacer("'", "'\\''", "[", "(", "]", ")", ":", " ").Replace(s)
}

func writeZsh(w io.Writer, cmds []cmdFlags) {
	fmt.Fprint(w, "#compdef sluice\n# zsh completion for sluice: sluice completion zsh > \"${fpath[1]}/_sluice\"\n_sluice() {\n\tlocal -a commands\n\tcommands=(\n")
	for _, c := range cmds {
		fmt.Fprintf(w, "\t\t'%s:%s'\n", c.name, zshQuote(c.summary))
	}
	fmt.Fprint(w, "\t)\n\tif (( CURRENT == 2 )); then\n\t\t_describe 'command' commands\n\t\treturn\n\tfi\n\tcase $words[2] in\n")
	for _, c := range cmds {
		fmt.Fprintf(w, "\t%s)\n\t\t_arguments \\\n", c.name)
		for _, f := range c.flags {
			_, usage := flag.UnquoteUsage(f)
			spec := fmt.Sprintf("--%s[%s]", f.Name, zshQuote(usage))
			if !isBoolFlag(f) {
				if v, ok := flagValues[f.Name]; ok {
					spec += fmt.Sprintf(":%s:(%s)", f.Name, v)
				} else if takesFile(f) {
					spec += fmt.Sprintf(":%s:_files", f.Name)
				} else {
					spec += fmt.Sprintf(":%s: ", f.Name)
				}
			}
			fmt.Fprintf(w, "\t\t\t'%s' \\\n", spec)
		}
		fmt.Fprint(w, "\t\t\t'*:argument:_files' ;;\n")
	}
	fmt.Fprint(w, "\tesac\n}\nif [ \"$funcstack[1]\" = \"_sluice\" ]; then\n\t_sluice \"$@\"\nelse\n\tcompdef _sluice sluice\nfi\n")
}
