// Command infergate is a two-tier, GPU-aware router for LLM inference.
//
// Subcommands:
//
//	sim     an OpenAI-compatible model-server simulator (one pod or a fleet)
//	tier1   the per-cluster GPU-aware router
//	tier2   the regional front door
//	bench   the side-by-side routing benchmark
//	dev     the all-in-one local stack
//	version the version and build information (also --version)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand. Each lives in its own file and registers itself
// in commands below.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"sim":     {summary: "run a simulated GPU model server (or a fleet of them)", run: runSim},
	"tier1":   {summary: "run the per-cluster GPU-aware router", run: runTier1},
	"tier2":   {summary: "run the regional front door", run: runTier2},
	"bench":   {summary: "compare routing policies side by side on a simulated fleet", run: runBench},
	"dev":     {summary: "run the all-in-one local stack", run: runDev},
	"version": {summary: "print the version and build information", run: runVersion},
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "infergate: a two-tier, GPU-aware router for LLM inference")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: infergate <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'infergate <command> --help' for a command's flags.")
}

// newLogger builds the slog logger a subcommand logs with: JSON for the
// servers (for log pipelines), text for the interactive commands.
func newLogger(w io.Writer, levelName string, json bool) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	if json {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "infergate: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.run(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "infergate %s: %v\n", args[0], err)
		return 1
	}
	return 0
}
