// Command sluice is the CLI of Sluice: a demo, the referee, the simulator and the daemon.
// Run `sluice help` for the commands.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string) int {
	return cli.Main(ctx, args, os.Stdin, os.Stdout, os.Stderr)
}
