// Command infergate-lab holds everything around the router that production
// does not run: the model-server simulator, the routing benchmark, the load
// benchmark and the all-in-one local stack. The router itself is the
// infergate binary (cmd/infergate), which links none of this.
//
// Subcommands:
//
//	sim        an OpenAI-compatible model-server simulator (one pod or a fleet)
//	bench      the side-by-side routing benchmark
//	experiment the benchmark with the knobs that change its conditions
//	report     tables over saved benchmark reports (JSON)
//	loadbench  the load benchmark of one Tier 1 process
//	dev        the all-in-one local stack
package main

import (
	"io"
	"os"

	"github.com/infergate/infergate/cmd/internal/cli"
)

var program = cli.Program{
	Name:  "infergate-lab",
	Title: "the simulator, benchmarks and local stack around infergate",
	Commands: map[string]cli.Command{
		"sim":        {Summary: "run a simulated GPU model server (or a fleet of them)", Run: runSim},
		"bench":      {Summary: "compare routing policies side by side on a simulated fleet", Run: runBench},
		"experiment": {Summary: "bench with the knobs that change its conditions (realism, inputs, load, replicas)", Run: runExperiment},
		"report":     {Summary: "print the glance or targets table of saved bench reports", Run: runReport},
		"loadbench":  {Summary: "load one Tier 1 process at fixed rates: added latency, CPU, RSS", Run: runLoadbench},
		"dev":        {Summary: "run the all-in-one local stack", Run: runDev},
	},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	return program.Run(args, stdout, stderr)
}
