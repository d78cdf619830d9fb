// Package cli is the sluice command: one binary with subcommands, each with --help. It
// uses the standard flag package, one FlagSet per subcommand.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Env is what a command runs with: its streams. Tests run commands in process with buffers.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env Env, args []string) error
}

var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

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
	case err == nil, errors.Is(err, flag.ErrHelp):
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
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok {
				return c.run(ctx, env, []string{"--help"})
			}
		}
		printUsage(env.Stdout)
		if len(args) == 0 {
			return usagef("no command given")
		}
		return nil
	}
	if args[0] == "--version" || args[0] == "-version" || args[0] == "-v" {
		args = append([]string{"version"}, args[1:]...) // the flag spellings users try first
	}
	c, ok := commands[args[0]]
	if !ok {
		printUsage(env.Stderr)
		return usagef("unknown command %q", args[0])
	}
	return c.run(ctx, env, args[1:])
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "Sluice makes a pool of workers obey one shared rate limit together.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: sluice COMMAND [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, n := range commandNames() {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'sluice COMMAND --help' for a command's flags.")
}

// commandNames lists the commands' names in order.
func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// newFlags returns a FlagSet that prints its usage to env.Stderr (or Stdout for --help)
// with a summary line.
func newFlags(env Env, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: sluice %s\n\n", usage)
		if c, ok := commands[name]; ok {
			fmt.Fprintln(out, c.summary)
			fmt.Fprintln(out)
		}
		fmt.Fprintln(out, "Flags:")
		printFlags(out, fs)
	}
	if collect != nil {
		collect(fs)
	}
	return fs
}

// parseFlags parses args, sending --help to stdout and turning errors into usage errors.
// Arguments that are not flags are refused.
func parseFlags(env Env, fs *flag.FlagSet, args []string) error {
	rest, err := parseArgs(env, fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usagef("unexpected argument %q", strings.Join(rest, " "))
	}
	return nil
}

// parseArgs parses the flags in args wherever they stand, before, between or after the
// other arguments (`sluice check api --n 5` as `sluice check --n 5 api`), and returns the
// other arguments in order; those after a "--" are never read as flags.
func parseArgs(env Env, fs *flag.FlagSet, args []string) ([]string, error) {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" || a == "-help" {
			fs.SetOutput(env.Stdout)
			fs.Usage()
			return nil, flag.ErrHelp
		}
	}
	fs.Usage = func() {}     // the error message is enough; --help shows the flags
	fs.SetOutput(io.Discard) // Main prints the error once
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usageError{flagError(err)}
		}
		left := fs.Args()
		if n := len(args) - len(left); n > 0 && args[n-1] == "--" {
			return append(rest, left...), nil // the flag package ate the "--"
		}
		if len(left) == 0 {
			return rest, nil
		}
		rest, args = append(rest, left[0]), left[1:]
	}
}

// flagError drops the flag package's prefix, `invalid value "V" for flag -F: `, from the
// error of a flag whose own error names it already (`--limit "V": ...`), so that the
// value is said once.
func flagError(err error) error {
	var value, name string
	msg := err.Error()
	if _, scanErr := fmt.Sscanf(msg, "invalid value %q for flag -%s", &value, &name); scanErr != nil {
		return err
	}
	name = strings.TrimSuffix(name, ":")
	_, inner, ok := strings.Cut(msg, ": ")
	switch {
	case !ok:
		return err
	case strings.HasPrefix(inner, "--"):
		return errors.New(inner)
	}
	// A limit's own error names the value again: say it once, as the flag's.
	if rest, ok := strings.CutPrefix(inner, "sluice: bad limit "+strconv.Quote(value)+": "); ok {
		return fmt.Errorf("--%s %q: %s", name, value, rest)
	}
	if inner == "parse error" { // the flag package's word for a number it cannot read
		inner = "not a number"
	}
	return fmt.Errorf("--%s %q: %s", name, value, strings.TrimPrefix(inner, "sluice: "))
}

// printFlags lists fs's flags as the README writes them: --name VALUE, where VALUE names
// what the flag takes (the usage's `backquoted` word, or its type, never a default that
// would read as one), then the usage and the default.
func printFlags(out io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		if name == f.DefValue || name == "value" || name == "string" {
			name = valueKind(f)
		}
		line := "  --" + f.Name
		if name != "" {
			line += " " + strings.ToUpper(name)
		}
		fmt.Fprintln(out, line)
		fmt.Fprintf(out, "    \t%s", strings.ReplaceAll(usage, "\n", "\n    \t"))
		if d := f.DefValue; d != "" && d != "0" && d != "false" && d != "0s" && d != "[]" {
			fmt.Fprintf(out, " (default %s)", strconv.Quote(d))
		}
		fmt.Fprintln(out)
	})
}

// valueKind names what a flag takes by its type: "" for a switch.
func valueKind(f *flag.Flag) string {
	type boolFlag interface{ IsBoolFlag() bool }
	if b, ok := f.Value.(boolFlag); ok && b.IsBoolFlag() {
		return ""
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return "VALUE"
	}
	switch g.Get().(type) {
	case int, int64, uint, uint64:
		return "N"
	case float64:
		return "NUMBER"
	case time.Duration:
		return "DURATION"
	}
	return "VALUE"
}
