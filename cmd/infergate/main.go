// Command infergate is a two-tier, GPU-aware router for LLM inference: the
// binary production images ship.
//
// Subcommands:
//
//	tier1   the per-cluster GPU-aware router
//	tier2   the regional front door
//	check   check a configuration file (either tier) without starting
//	version the version and build information (also --version)
//
// The simulator, the benchmarks and the local stack are in a separate
// binary, infergate-lab (cmd/infergate-lab), so that none of their code is
// linked into this one (TestNoLabDependencies).
package main

import (
	"io"
	"os"

	"github.com/infergate/infergate/cmd/internal/cli"
)

var program = cli.Program{
	Name:  "infergate",
	Title: "a two-tier, GPU-aware router for LLM inference",
	Commands: map[string]cli.Command{
		"tier1":   {Summary: "run the per-cluster GPU-aware router", Run: runTier1},
		"tier2":   {Summary: "run the regional front door", Run: runTier2},
		"check":   {Summary: "check a tier1 or tier2 configuration file without starting", Run: runCheck},
		"version": {Summary: "print the version and build information", Run: runVersion},
	},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	return program.Run(args, stdout, stderr)
}
