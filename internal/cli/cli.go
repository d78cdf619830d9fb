// Package cli is the sluice command: one binary with subcommands, each with --help. It
// uses the standard flag package, one FlagSet per subcommand.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
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

// Main runs the command line args and returns the process exit code: 0 on success, 2 for
// bad usage, 1 for other failures.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	env := Env{Stdin: stdin, Stdout: stdout, Stderr: stderr}
	err := Run(ctx, env, args)
	var ec interface{ ExitCode() int }
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ec):
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(stderr, "sluice:", msg)
		}
		return ec.ExitCode()
	case errors.As(err, new(usageError)):
		fmt.Fprintln(stderr, "sluice:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "sluice:", err)
		return 1
	}
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
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'sluice COMMAND --help' for a command's flags.")
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
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args, sending --help to stdout and turning errors into usage errors.
// Arguments that are not flags are refused.
func parseFlags(env Env, fs *flag.FlagSet, args []string) error {
	if err := parseFlagsWithArgs(env, fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", strings.Join(fs.Args(), " "))
	}
	return nil
}

// parseFlagsWithArgs is parseFlags that leaves other arguments in fs.Args().
func parseFlagsWithArgs(env Env, fs *flag.FlagSet, args []string) error {
	for _, a := range args {
		if a == "-h" || a == "--help" || a == "-help" {
			fs.SetOutput(env.Stdout)
			fs.Usage()
			return flag.ErrHelp
		}
	}
	fs.Usage = func() {}     // the error message is enough; --help shows the flags
	fs.SetOutput(io.Discard) // Main prints the error once
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	return nil
}
