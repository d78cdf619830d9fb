// Package cli is the sluice command: one binary with subcommands, each with --help, on
// spf13/cobra: GNU flags (spf13/pflag) before, between or after the arguments, and shell
// completion generated from the commands' own flags.
package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice"
)

// Env is what a command runs with: its streams. Tests run commands in process with buffers.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// commands are the subcommands by name, each a function that builds it for one run: its
// flags bound to variables of that run alone, so that runs at once (the tests') share
// nothing.
var commands = map[string]func(Env) *cobra.Command{}

// register adds a command under the name its Use line starts with.
func register(newCmd func(Env) *cobra.Command) {
	commands[newCmd(Env{}).Name()] = newCmd
}

// usageError is a bad flag or argument: exit code 2, with the message.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// Main runs the command line args and returns the process exit code: ExitOK on success,
// ExitUsage for bad usage, ExitFailure for other failures (and the codes of `check`).
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	env := Env{Stdin: stdin, Stdout: stdout, Stderr: stderr}
	err := Run(ctx, env, args)
	var ec interface{ ExitCode() int }
	switch {
	case err == nil, errors.Is(err, pflag.ErrHelp):
		return 0
	case errors.As(err, &ec):
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(stderr, message(err))
		}
		return ec.ExitCode()
	case errors.As(err, new(usageError)):
		fmt.Fprintln(stderr, message(err))
		return ExitUsage
	default:
		fmt.Fprintln(stderr, message(err))
		return ExitFailure
	}
}

// Exit codes of every command; `sluice check` adds ExitDenied and ExitUnreachable.
const (
	ExitOK          = 0 // done; `check`: allowed
	ExitFailure     = 1 // failed; `check`: denied (throttled)
	ExitUsage       = 2 // bad flags, arguments or config
	ExitUnreachable = 3 // `check`: the daemon did not answer
	ExitDenied      = ExitFailure
	// `sim` cut short by a signal, after printing what it measured: 128 + the signal's
	// number, as a shell reports a process the signal ended.
	ExitInterrupted = 130 // SIGINT (and a cancellation without a signal)
	ExitTerminated  = 143 // SIGTERM
)

// repeatedPrefix is the package prefix the errors of the packages below carry ("sluice:
// bad limit"), at the start of the message or after a ": ".
var repeatedPrefix = regexp.MustCompile(`(^|: )sluice: `)

// message is err's text after one "sluice: ": the prefixes the errors of the packages
// below carry are dropped, so the line does not read "sluice: ... sluice: ...".
func message(err error) string {
	return "sluice: " + repeatedPrefix.ReplaceAllString(err.Error(), "$1")
}

// Run runs one command.
func Run(ctx context.Context, env Env, args []string) error {
	root := newRoot(env)
	if len(args) == 0 {
		writeHelp(env.Stdout, root)
		return usagef("no command given")
	}
	switch args[0] {
	case "--version", "-version", "-v":
		args = append([]string{"version"}, args[1:]...) // the flag spellings users try first
	case cobra.ShellCompRequestCmd, cobra.ShellCompNoDescRequestCmd:
		registerCompletions(root)
	}
	if c, _, err := root.Find(args[:1]); err == nil && c != root {
		args = append([]string{args[0]}, oneDashFlags(c, args[1:])...)
	}
	root.SetArgs(args)
	c, err := root.ExecuteContextC(ctx)
	if err != nil && c == root && !errors.As(err, new(usageError)) {
		// The root runs nothing: its error is cobra's, that args[0] names no command.
		writeHelp(env.Stderr, root)
		msg := fmt.Sprintf("unknown command %q", args[0])
		if s := root.SuggestionsFor(args[0]); len(s) > 0 {
			msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
		}
		return usagef("%s", msg)
	}
	return err
}

// newRoot builds the sluice command and its subcommands for one run on env's streams.
func newRoot(env Env) *cobra.Command {
	root := &cobra.Command{
		Use:               "sluice",
		Long:              "Sluice makes a pool of workers obey one shared rate limit together.",
		SilenceErrors:     true,                                             // Main prints the error once, with its exit code
		SilenceUsage:      true,                                             // the error says what is wrong; --help shows the flags
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true}, // our own: `sluice completion SHELL`
	}
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{flagError(err)} })
	help := func(c *cobra.Command, _ []string) { writeHelp(c.OutOrStdout(), c) }
	root.SetHelpFunc(help)
	root.SetUsageFunc(func(c *cobra.Command) error { help(c, nil); return nil })
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		root.AddCommand(commands[n](env))
	}
	return root
}

// helpWidth is the width help wraps the flags' descriptions to.
const helpWidth = 100

// writeHelp prints c's help: for the root, the commands; for a command, its usage line,
// what it does and its flags, as GNU tools write them (--name VALUE, then the default).
func writeHelp(w io.Writer, c *cobra.Command) {
	if !c.HasParent() {
		fmt.Fprintf(w, "%s\n\nUsage: sluice COMMAND [flags]\n\nCommands:\n", c.Long)
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() && sub.Name() != "help" {
				fmt.Fprintf(w, "  %-*s %s\n", sub.NamePadding(), sub.Name(), sub.Short)
			}
		}
		fmt.Fprintln(w, "\nRun 'sluice COMMAND --help' for a command's flags.")
		return
	}
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", c.UseLine(), cmp.Or(c.Long, c.Short))
	if c.HasAvailableSubCommands() {
		fmt.Fprintln(w, "\nCommands:")
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				fmt.Fprintf(w, "  %-*s %s\n", sub.NamePadding(), sub.Name(), sub.Short)
			}
		}
	}
	if c.Example != "" {
		fmt.Fprintf(w, "\nExamples:\n%s\n", c.Example)
	}
	c.InitDefaultHelpFlag()
	fmt.Fprintf(w, "\nFlags:\n%s", c.LocalFlags().FlagUsagesWrapped(helpWidth))
}

// noArgs refuses the arguments of a command that takes none.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", strings.Join(args, " "))
	}
	return nil
}

// exactArgs refuses anything but n arguments, saying what is wanted.
func exactArgs(n int, want string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s", want)
		}
		return nil
	}
}

// oneDashFlags rewrites the spellings the standard flag package read, a long flag with
// one dash (-mode local, -json=false, -n 5), to the two pflag reads, for the flags c
// defines (a shorthand, -h, stays one). A flag's value is left as it is, and so is
// everything after "--".
func oneDashFlags(c *cobra.Command, args []string) []string {
	c.InitDefaultHelpFlag()
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := c.Flags().Lookup(name)
		long := f != nil && (len(name) > 1 || c.Flags().ShorthandLookup(name) == nil)
		if long && strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") {
			a = "-" + a
		}
		out = append(out, a)
		if f != nil && strings.HasPrefix(a, "--") && !hasValue && f.NoOptDefVal == "" && i+1 < len(args) {
			i++
			out = append(out, args[i]) // the flag's value
		}
	}
	return out
}

// flagError says a bad flag value once, as the flag's (`--workers "x": not a number`),
// not as pflag's `invalid argument "x" for "--workers" flag: strconv.ParseInt: ...`.
// pflag's other errors (an unknown flag, a missing value) are clear as they are.
func flagError(err error) error {
	var bad *pflag.InvalidValueError
	if !errors.As(err, &bad) {
		return err
	}
	name, v := bad.GetFlag().Name, bad.GetValue()
	return fmt.Errorf("--%s %q: %s", name, v, valueProblem(v, bad.Unwrap()))
}

// valueProblem is what is wrong in a flag's value v, said without v, which the caller
// names.
func valueProblem(v string, err error) string {
	var num *strconv.NumError
	var bad *sluice.LimitError
	msg := err.Error()
	switch {
	case errors.As(err, &num) && num.Func == "ParseBool":
		return "want true or false"
	case errors.As(err, &num) && errors.Is(num.Err, strconv.ErrRange):
		return "out of range"
	case errors.As(err, &num):
		return "not a number"
	case strings.HasPrefix(msg, "time: "): // time.ParseDuration's
		return "not a duration (e.g. 500ms, 10s or 1m30s)"
	}
	// The value's own error that names it after one word: `--limit "V": ...`,
	// `max_penalty "V": ...`.
	if word, rest, ok := strings.Cut(msg, " "+strconv.Quote(v)+": "); ok && !strings.Contains(word, " ") {
		return rest
	}
	if errors.As(err, &bad) { // `sluice: bad limit "V": ...`
		return bad.Detail()
	}
	return strings.TrimPrefix(msg, "sluice: ")
}

// completeWith makes the shells complete the value of the flag name from words: it is
// noted on the flag, and registered with cobra (registerCompletions) only by a run that
// completes, as cobra keeps what is registered for the life of the process.
func completeWith(c *cobra.Command, name string, words ...string) {
	if err := c.Flags().SetAnnotation(name, completeAnnotation, words); err != nil {
		panic(err) // no such flag: a mistake in the command's definition
	}
}

const completeAnnotation = "sluice_complete_words"

// registerCompletions registers the words completeWith noted on every command's flags.
func registerCompletions(root *cobra.Command) {
	for _, c := range root.Commands() {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if words, ok := f.Annotations[completeAnnotation]; ok {
				_ = c.RegisterFlagCompletionFunc(f.Name, func(_ *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
					return slices.DeleteFunc(slices.Clone(words), func(w string) bool { return !strings.HasPrefix(w, prefix) }), cobra.ShellCompDirectiveNoFileComp
				})
			}
		})
	}
}
