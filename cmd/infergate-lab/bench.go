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

// runBench is `infergate-lab bench`: the benchmark as published, with the
// flags a user needs to run it on a scenario or a trace, on their own fleet
// and policies.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runBenchmark(ctx, "bench", args, stdout, stderr)
}

// runExperiment is `infergate-lab experiment`: bench plus the knobs that
// change the conditions the published figures are measured under.
func runExperiment(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runBenchmark(ctx, "experiment", args, stdout, stderr)
}

// knobs are experiment's flags; bench runs with their defaults.
type knobs struct {
	start      time.Duration
	rateScale  float64
	realism    string
	inputs     string
	scrape     time.Duration
	maxWait    time.Duration
	replicas   int
	share      bool
	shareDelay time.Duration
	shareFlush time.Duration
}

func defaultKnobs() knobs {
	return knobs{rateScale: 1, realism: "default", inputs: bench.InputsProduction, scrape: bench.DefaultScrapeInterval,
		maxWait: bench.DefaultMaxQueueWait, replicas: 1, share: true, shareDelay: bench.DefaultShareDelay, shareFlush: bench.DefaultShareFlush}
}

func (k *knobs) register(fs *flag.FlagSet) {
	fs.DurationVar(&k.start, "start", k.start, "with --trace: start the window this far into the trace (after --rate-scale); held-out windows for tuning")
	fs.Float64Var(&k.rateScale, "rate-scale", k.rateScale, "multiply the arrival rate (a trace's time is compressed by it)")
	fs.StringVar(&k.realism, "realism", k.realism, "realism knobs: default, off, or a comma-separated list of jitter, spread, stagger, late")
	fs.StringVar(&k.inputs, "inputs", k.inputs, "scheduling inputs: production (Tier 1's admission.Prompt on generated request text) or engine (oracle token counts and block hashes)")
	fs.DurationVar(&k.scrape, "scrape-interval", k.scrape, "pod metrics scrape interval")
	fs.DurationVar(&k.maxWait, "max-queue-wait", k.maxWait, "router queue bound under saturation before shedding")
	fs.IntVar(&k.replicas, "router-replicas", k.replicas, "Tier 1 replicas: arrivals split at random over this many routers, each with its own state (docs/tier1-replicas.md)")
	fs.BoolVar(&k.share, "share-state", k.share, "with --router-replicas > 1: routers share dispatches and in-flight counts, as tier1/peers does")
	fs.DurationVar(&k.shareDelay, "share-delay", k.shareDelay, "with --share-state: propagation delay of a sent frame of shared state (network, apply), in virtual time")
	fs.DurationVar(&k.shareFlush, "share-flush", k.shareFlush, "with --share-state: batching interval of shared state (peers.flush); 0 sends every change at once")
}

// options are the bench.Options the knobs give.
func (k knobs) options(recordLoad bool) (bench.Options, error) {
	if k.replicas < 1 || k.replicas > 64 {
		return bench.Options{}, errors.New("--router-replicas must be between 1 and 64")
	}
	if k.shareDelay < 0 || k.shareFlush < 0 {
		return bench.Options{}, errors.New("--share-delay and --share-flush must be ≥ 0")
	}
	if !(k.rateScale > 0) {
		return bench.Options{}, errors.New("--rate-scale must be positive")
	}
	// bench.Replicas: negative is none, zero the default.
	if k.shareDelay == 0 {
		k.shareDelay = -1
	}
	if k.shareFlush == 0 {
		k.shareFlush = -1
	}
	real, err := bench.ParseRealism(k.realism)
	if err != nil {
		return bench.Options{}, err
	}
	switch k.inputs {
	case bench.InputsProduction, bench.InputsEngine:
	default:
		return bench.Options{}, fmt.Errorf("unknown --inputs %q (want %s or %s)", k.inputs, bench.InputsProduction, bench.InputsEngine)
	}
	return bench.Options{ScrapeInterval: k.scrape, MaxQueueWait: k.maxWait, RecordLoad: recordLoad, Realism: &real, Inputs: k.inputs,
		Replicas: bench.Replicas{N: k.replicas, Share: k.share, Delay: k.shareDelay, Flush: k.shareFlush}}, nil
}

// runBenchmark is bench, or experiment (cmd == "experiment") with the knobs
// as flags.
func runBenchmark(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		scen      = fs.String("scenario", "", "scenario to run: "+strings.Join(scenario.Names(), ", "))
		tracePath = fs.String("trace", "", "replay a trace instead of a scenario: Mooncake .jsonl or Azure .csv")
		fleetPath = fs.String("fleet", "", "fleet YAML: the pods for --trace (default: 4 H100 + 4 A10G, Llama-3.1-8B), or in place of a scenario's own")
		duration  = fs.Duration("duration", 0, "with --trace: keep arrivals before this; with --scenario: override the arrival window")
		policies  = fs.String("policies", "round-robin,gie-v1.5,llm-d,infergate", "comma-separated policies: "+strings.Join(bench.BuiltinPolicies(), ", ")+", or a YAML picker profile path")
		seeds     = fs.Int("seeds", 5, "number of seeds; 95% CIs are over seeds")
		seedBase  = fs.Uint64("seed-base", 1, "first seed: runs seeds seed-base .. seed-base+seeds-1 (tune on one range, confirm on another)")
		runName   = fs.String("name", "", "the run's name in reports and plot file names (default: the scenario, or trace:<file name>)")
		format    = fs.String("format", "table", "output format: table, json or markdown")
		jsonOut   = fs.String("json-out", "", "also write the JSON report to this file")
		plots     = fs.String("plots", "", "write SVG plots (TTFT CDF, per-pod load) into this directory")
		list      = fs.Bool("list", false, "list scenarios and exit")
	)
	k := defaultKnobs()
	if cmd == "experiment" {
		k.register(fs)
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: infergate-lab %s --scenario NAME [--fleet FILE] [flags]\n", cmd)
		fmt.Fprintf(stderr, "       infergate-lab %s --trace FILE [--fleet FILE] [--duration D] [flags]\n", cmd)
		fmt.Fprintln(stderr, "\nRuns routing policies side by side on one simulated fleet and one seeded request stream, in virtual time.")
		if cmd == "experiment" {
			fmt.Fprintln(stderr, "Experiment is bench with the knobs that change the conditions it measures under.")
		} else {
			fmt.Fprintln(stderr, "'infergate-lab experiment' takes the same flags plus the knobs that change its conditions.")
		}
		fmt.Fprintln(stderr, "Simulations run GOMAXPROCS at once; the results do not depend on it.")
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
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
	opts, err := k.options(*plots != "")
	if err != nil {
		return err
	}
	cmp := bench.Comparison{Policies: pols, Options: opts, Progress: stderr}
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
		s = s.ScaleRate(k.rateScale)
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
		if *runName != "" {
			name = *runName
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
		st, err := trace.Load(*tracePath, trace.Options{RateScale: k.rateScale, Start: k.start, Duration: *duration, MaxTotalTokens: maxLen})
		if err != nil {
			return err
		}
		name := "trace:" + filepath.Base(*tracePath)
		if *runName != "" {
			name = *runName
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
			_ = f.Close() // the write failed; its error is the one to report
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

// runReport is `infergate-lab report glance|targets FILE...`: a table over
// saved JSON reports (what scripts/bench.sh puts in README.md and
// BENCHMARKS.md).
func runReport(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: infergate-lab report glance|targets FILE[,FILE...] [FILE...]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Prints a Markdown table over JSON reports of 'infergate-lab bench --json-out':")
		fmt.Fprintln(stderr, "  glance   P99 TTFT and e2e latency per policy, one row per report")
		fmt.Fprintln(stderr, "  targets  infergate's P99 TTFT against each baseline's, with the floor-bound ratio")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() < 2 {
		fs.Usage()
		return errors.New("give a table (glance or targets) and at least one JSON report")
	}
	write := map[string]func(io.Writer, []report.Report) error{"glance": report.WriteGlance, "targets": report.WriteTargets}[fs.Arg(0)]
	if write == nil {
		return fmt.Errorf("unknown table %q (want glance or targets)", fs.Arg(0))
	}
	var reps []report.Report
	for _, arg := range fs.Args()[1:] {
		for _, p := range strings.Split(arg, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			r, err := report.ReadJSON(p)
			if err != nil {
				return err
			}
			reps = append(reps, r)
		}
	}
	return write(stdout, reps)
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
			_ = f.Close() // the write failed; its error is the one to report
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
