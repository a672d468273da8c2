package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/infergate/infergate/bench"
	"github.com/infergate/infergate/bench/report"
	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/trace"
	"github.com/infergate/infergate/bench/workload"
)

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		scen       = fs.String("scenario", "", "scenario to run: "+strings.Join(scenario.Names(), ", "))
		policies   = fs.String("policies", "round-robin,gie-v1.5,llm-d,infergate", "comma-separated policies: "+strings.Join(bench.BuiltinPolicies(), ", ")+", or a YAML picker profile path")
		seeds      = fs.Int("seeds", 5, "number of seeds; 95% CIs are over seeds")
		seedBase   = fs.Uint64("seed-base", 1, "first seed: runs seeds seed-base .. seed-base+seeds-1 (tune on one range, confirm on another)")
		asJSON     = fs.Bool("json", false, "print JSON instead of a table (same as --format json)")
		format     = fs.String("format", "table", "output format: table, json or markdown")
		jsonOut    = fs.String("json-out", "", "also write the JSON report to this file")
		targets    = fs.String("targets", "", "print the targets table (Markdown) for these comma-separated JSON reports and exit")
		glance     = fs.String("glance", "", "print the at-a-glance table (Markdown: P99 TTFT and e2e per policy) for these comma-separated JSON reports and exit")
		plots      = fs.String("plots", "", "write SVG plots (TTFT CDF, per-pod load) into this directory")
		tracePath  = fs.String("trace", "", "replay a trace instead of a scenario: Mooncake .jsonl or Azure .csv")
		traceName  = fs.String("name", "", "the run's name in reports and plot file names (default: the scenario, or trace:<file name>)")
		fleetPath  = fs.String("fleet", "", "fleet YAML: the pods for --trace (default: 4 H100 + 4 A10G, Llama-3.1-8B), or in place of a scenario's own")
		duration   = fs.Duration("duration", 0, "with --trace: keep arrivals before this (after --rate-scale); with --scenario: override the arrival window")
		rateScale  = fs.Float64("rate-scale", 1, "multiply the arrival rate (a trace's time is compressed by it)")
		scrape     = fs.Duration("scrape-interval", bench.DefaultScrapeInterval, "pod metrics scrape interval")
		maxWait    = fs.Duration("max-queue-wait", bench.DefaultMaxQueueWait, "router queue bound under saturation before shedding")
		parallel   = fs.Int("parallel", 0, "simulations run at once (default GOMAXPROCS)")
		list       = fs.Bool("list", false, "list scenarios and exit")
		maxOutTrce = fs.Int("trace-max-output", 0, "with --trace: clamp output tokens (0 = no clamp)")
		replicas   = fs.Int("router-replicas", 1, "Tier 1 replicas: arrivals split at random over this many routers, each with its own state (docs/tier1-replicas.md)")
		share      = fs.Bool("share-state", true, "with --router-replicas > 1: routers share dispatches and in-flight counts, as tier1/peers does")
		shareDelay = fs.Duration("share-delay", bench.DefaultShareDelay, "with --share-state: propagation delay of a sent frame of shared state (network, apply), in virtual time")
		shareFlush = fs.Duration("share-flush", bench.DefaultShareFlush, "with --share-state: batching interval of shared state (peers.flush); 0 sends every change at once")
		start      = fs.Duration("start", 0, "with --trace: start the window this far into the trace (after --rate-scale); held-out windows for tuning")
		realism    = fs.String("realism", "default", "realism knobs: default, off, or a comma-separated list of jitter, spread, stagger, late")
		inputs     = fs.String("inputs", bench.InputsProduction, "scheduling inputs: production (Tier 1's admission.Prompt on generated request text) or engine (oracle token counts and block hashes)")
	)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: infergate bench --scenario NAME [--fleet FILE] [--rate-scale X] [flags]")
		fmt.Fprintln(stderr, "       infergate bench --trace FILE [--fleet FILE] [--duration D] [--rate-scale X] [flags]")
		fmt.Fprintln(stderr, "\nRuns routing policies side by side on one simulated fleet and one seeded request stream, in virtual time.")
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *targets != "" || *glance != "" {
		paths := *targets + *glance
		if *targets != "" && *glance != "" {
			return errors.New("give one of --targets or --glance")
		}
		var reps []report.Report
		for _, p := range strings.Split(paths, ",") {
			r, err := report.ReadJSON(strings.TrimSpace(p))
			if err != nil {
				return err
			}
			reps = append(reps, r)
		}
		if *glance != "" {
			return report.WriteGlance(stdout, reps)
		}
		return report.WriteTargets(stdout, reps)
	}
	if *asJSON {
		*format = "json"
	}
	switch *format {
	case "table", "json", "markdown":
	default:
		return fmt.Errorf("unknown --format %q (want table, json or markdown)", *format)
	}
	if *list {
		for _, s := range scenario.All() {
			fmt.Fprintf(stdout, "%-17s %s\n", s.Name, s.Summary)
		}
		return nil
	}
	if (*scen == "") == (*tracePath == "") {
		fs.Usage()
		return errors.New("give exactly one of --scenario or --trace")
	}
	if *seeds < 1 {
		return errors.New("--seeds must be ≥ 1")
	}
	if *replicas < 1 || *replicas > 64 {
		return errors.New("--router-replicas must be between 1 and 64")
	}
	if *shareDelay < 0 || *shareFlush < 0 {
		return errors.New("--share-delay and --share-flush must be ≥ 0")
	}
	// bench.Replicas: negative is none, zero the default.
	if *shareDelay == 0 {
		*shareDelay = -1
	}
	if *shareFlush == 0 {
		*shareFlush = -1
	}
	if *seedBase > math.MaxUint64-uint64(*seeds-1) {
		return fmt.Errorf("--seed-base %d + --seeds %d overflows a uint64 seed", *seedBase, *seeds)
	}
	var pols []bench.Policy
	var names []string
	for _, n := range strings.Split(*policies, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		p, err := bench.ParsePolicy(n)
		if err != nil {
			return err
		}
		pols = append(pols, p)
		names = append(names, p.Name)
	}
	if len(pols) == 0 {
		return errors.New("--policies is empty")
	}

	real, err := bench.ParseRealism(*realism)
	if err != nil {
		return err
	}
	switch *inputs {
	case bench.InputsProduction, bench.InputsEngine:
	default:
		return fmt.Errorf("unknown --inputs %q (want %s or %s)", *inputs, bench.InputsProduction, bench.InputsEngine)
	}
	cmp := bench.Comparison{
		Policies: pols,
		Options: bench.Options{ScrapeInterval: *scrape, MaxQueueWait: *maxWait, RecordLoad: *plots != "", Realism: &real, Inputs: *inputs,
			Replicas: bench.Replicas{N: *replicas, Share: *share, Delay: *shareDelay, Flush: *shareFlush}},
		Parallel: *parallel,
		Progress: stderr,
	}
	if f, ok := stderr.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			cmp.ProgressInPlace = true
		}
	}
	for i := range *seeds {
		cmp.Seeds = append(cmp.Seeds, *seedBase+uint64(i))
	}
	if *scen != "" {
		s, err := scenario.Get(*scen)
		if err != nil {
			return err
		}
		if *duration > 0 {
			s.Duration = *duration
		}
		s = s.ScaleRate(*rateScale)
		if *fleetPath != "" {
			// The scenario's requests on other pods (say, a mixed fleet),
			// a question its own fleet cannot answer.
			if s.Fleet, err = scenario.LoadFleet(*fleetPath); err != nil {
				return err
			}
		}
		f := s.Fleet
		f.SetDefaults()
		name := s.Name
		if *traceName != "" {
			name = *traceName
		}
		cmp.Setup = bench.Setup{Name: name, Fleet: f, Horizon: s.Duration + s.Drain}
		cmp.Stream = func(seed uint64) (workload.Stream, error) { return s.Stream(seed), nil }
	} else {
		f := scenario.DefaultTraceFleet()
		if *fleetPath != "" {
			var err error
			if f, err = scenario.LoadFleet(*fleetPath); err != nil {
				return err
			}
		}
		maxLen, err := bench.MaxModelLen(f)
		if err != nil {
			return err
		}
		st, err := trace.Load(*tracePath, trace.Options{RateScale: *rateScale, Start: *start, Duration: *duration, MaxTotalTokens: maxLen, MaxOutputTokens: *maxOutTrce})
		if err != nil {
			return err
		}
		name := "trace:" + filepath.Base(*tracePath)
		if *traceName != "" {
			name = *traceName
		}
		cmp.Setup = bench.Setup{Name: name, Fleet: f, Horizon: st.Duration + 10*time.Minute}
		// A trace is one fixed stream: seeds vary only the policies' own
		// randomness (tie-breaks, random picks).
		cmp.Stream = func(uint64) (workload.Stream, error) { return st, nil }
	}

	out, err := cmp.Run(ctx)
	if err != nil {
		return err
	}
	rep := report.Summarize(cmp.Setup.Name, cmp.Setup.Fleet.TTFTSLO, names, out.Runs)
	rep.SetLoad(out.OfferedRPS, out.CapacityRPS, out.EvenSplitUtilisation)
	rep.Conditions = cmp.Options.Conditions()
	if *plots != "" {
		if err := writePlots(*plots, rep); err != nil {
			return err
		}
	}
	if *jsonOut != "" {
		f, err := os.Create(*jsonOut)
		if err != nil {
			return fmt.Errorf("json-out: %w", err)
		}
		if err := rep.WriteJSON(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("json-out: %w", err)
		}
	}
	switch *format {
	case "json":
		return rep.WriteJSON(stdout)
	case "markdown":
		return rep.WriteMarkdown(stdout)
	}
	return rep.WriteTable(stdout)
}

// writePlots writes DIR/<scenario>-ttft-cdf.svg and one
// DIR/<scenario>-load-<policy>.svg per policy (first seed).
func writePlots(dir string, rep report.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	base := fileSafe(rep.Scenario)
	write := func(name string, fn func(io.Writer) error) error {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("plots: %w", err)
		}
		if err := fn(f); err != nil {
			f.Close()
			return fmt.Errorf("plots: %s: %w", name, err)
		}
		return f.Close()
	}
	if err := write(base+"-ttft-cdf.svg", rep.WriteTTFTCDF); err != nil {
		return err
	}
	for _, p := range rep.Policies {
		runs := p.Runs()
		if len(runs) == 0 {
			continue
		}
		title := fmt.Sprintf("%s: per-pod load, %s (seed %d)", rep.Scenario, p.Name, runs[0].Seed)
		if err := write(base+"-load-"+fileSafe(p.Name)+".svg", func(w io.Writer) error { return report.WriteLoad(w, title, runs[0].Load) }); err != nil {
			return err
		}
	}
	return nil
}

func fileSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, trimFileExt(filepath.Base(s)))
}

// trimFileExt drops a file extension (a profile's .yaml, a trace's .csv)
// but not the dot of a name like gie-v1.5.
func trimFileExt(s string) string {
	switch ext := filepath.Ext(s); ext {
	case ".yaml", ".yml", ".json", ".jsonl", ".csv":
		return strings.TrimSuffix(s, ext)
	}
	return s
}
