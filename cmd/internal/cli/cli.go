// Package cli is what the infergate and infergate-lab commands share: a
// table of subcommands, their dispatch and exit codes, and the logger
// they log with.
package cli

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

// Command is one subcommand.
type Command struct {
	Summary string
	Run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// Program is a binary made of subcommands.
type Program struct {
	Name     string // the binary's name, as typed
	Title    string // one line on what it is
	Commands map[string]Command
}

// Usage lists the commands.
func (p Program) Usage(w io.Writer) {
	fmt.Fprintf(w, "%s: %s\n\n", p.Name, p.Title)
	fmt.Fprintf(w, "Usage: %s <command> [flags]\n\nCommands:\n", p.Name)
	names := make([]string, 0, len(p.Commands))
	width := 9
	for n := range p.Commands {
		names = append(names, n)
		width = max(width, len(n))
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s %s\n", width, n, p.Commands[n].Summary)
	}
	fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags.\n", p.Name)
}

// Run runs the subcommand args[0] until it returns or SIGINT/SIGTERM ends
// its context, and returns the exit code: 0, 1 for a failed command, 2
// for a usage error. --version is the version command, where there is one.
func (p Program) Run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		p.Usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if _, ok := p.Commands["version"]; ok && (args[0] == "--version" || args[0] == "-version") {
		args = append([]string{"version"}, args[1:]...)
	}
	cmd, ok := p.Commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n", p.Name, args[0])
		p.Usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.Run(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "%s %s: %v\n", p.Name, args[0], err)
		return 1
	}
	return 0
}

// NewLogger builds the slog logger a subcommand logs with: JSON for the
// servers (for log pipelines), text for the interactive commands.
func NewLogger(w io.Writer, levelName string, json bool) (*slog.Logger, error) {
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
