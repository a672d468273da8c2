package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/bench/load"
)

// runLoadbench is `infergate-lab loadbench`: the load benchmark of one Tier 1
// process (bench/load, docs/performance.md). The benchmark re-executes
// this binary as its pods and Tier 1 children; those land here too.
func runLoadbench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if load.IsChild() {
		return load.RunChild(ctx, os.Stdin, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "cpu" {
		return runLoadbenchCPU(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("loadbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		rates     = fs.String("rates", "500,1000,2000,5000", "comma-separated arrival rates, requests per second")
		duration  = fs.Duration("duration", 10*time.Second, "load time per path (direct, Tier 1) per rate")
		rounds    = fs.Int("rounds", 2, "alternating direct/Tier 1 phase pairs per rate")
		pods      = fs.Int("pods", 100, "fake model-server pods")
		streamPct = fs.Int("stream-percent", 50, "percent of requests that stream (0..100)")
		warmup    = fs.Duration("warmup", 2*time.Second, "unrecorded load on both paths first (0 = none)")
		timeout   = fs.Duration("timeout", 10*time.Second, "per-request timeout")
		inFlight  = fs.Int("max-in-flight", 5000, "in-flight requests per phase; later arrivals are dropped and counted")
		cpuprof   = fs.String("cpuprofile", "", "write a CPU profile of the Tier 1 process during its phases at --profile-rate to this file")
		profRate  = fs.Float64("profile-rate", 0, "the rate --cpuprofile covers (default the highest of --rates)")
		idle      = fs.Duration("idle", 5*time.Second, "measure Tier 1's CPU with no load (scraping only) this long first")
		settle    = fs.Duration("settle", time.Second, "pause after every phase (0 = none)")
		jsonOut   = fs.String("json-out", "", "also write the JSON report to this file")
	)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: infergate-lab loadbench [flags]")
		fmt.Fprintln(stderr, "       infergate-lab loadbench cpu [flags]   (CPU per request beside a bare proxy; loadbench cpu -h)")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Load one Tier 1 process with open-loop 32 KB chat requests at fixed rates, in")
		fmt.Fprintln(stderr, "front of fake pods that answer at once (stand-ins for GPUs), alternating with")
		fmt.Fprintln(stderr, "the same load sent straight to the pods; report the latency Tier 1 adds, its")
		fmt.Fprintln(stderr, "CPU per request and its memory. See docs/performance.md.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	rs, err := parseRates(*rates)
	if err != nil {
		return err
	}
	if *streamPct < 0 || *streamPct > 100 {
		return errors.New("--stream-percent must be in 0..100")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	o := load.Options{
		Command: []string{exe, "loadbench"}, Rates: rs, Duration: *duration, Rounds: *rounds, Pods: *pods,
		StreamPercent: *streamPct, Warmup: *warmup, Timeout: *timeout, MaxInFlight: *inFlight,
		CPUProfile: *cpuprof, ProfileRate: *profRate, Idle: *idle, Settle: *settle, Progress: stderr,
	}
	if *settle == 0 {
		o.Settle = -1
	}
	if *streamPct == 0 {
		o.StreamPercent = -1 // the package's zero means its default
	}
	if *warmup == 0 {
		o.Warmup = -1
	}
	rep, err := load.Run(ctx, o)
	if err != nil {
		return err
	}
	if err := rep.WriteMarkdown(stdout); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return writeJSON(*jsonOut, rep)
}

// runLoadbenchCPU is `infergate-lab loadbench cpu`: CPU per request of
// Tier 1 and Tier 2 beside a bare httputil.ReverseProxy (load.RunCompare,
// docs/performance.md "CPU per request").
func runLoadbenchCPU(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadbench cpu", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		bin       = fs.String("infergate", "", "the infergate binary (go build -o /tmp/infergate ./cmd/infergate); empty runs both tiers in children of this binary, which --cpuprofile needs")
		paths     = fs.String("paths", "bare,tier1,tier2", "paths to measure, from bare, tier1, tier2, tier1-1s (Tier 1 scraping every second, not every 50 ms: a diagnostic)")
		rates     = fs.String("rates", "300,600", "comma-separated arrival rates, requests per second")
		window    = fs.Duration("window", 20*time.Second, "load time of one path at a time")
		rounds    = fs.Int("rounds", 2, "rounds of windows per rate (every path once a round, order rotating)")
		pods      = fs.Int("pods", 16, "fake model-server pods")
		streamPct = fs.Int("stream-percent", 50, "percent of requests that stream (0..100)")
		warmup    = fs.Duration("warmup", 3*time.Second, "unrecorded load on every path before each rate (0 = none)")
		settle    = fs.Duration("settle", time.Second, "pause after every window (0 = none)")
		idle      = fs.Duration("idle", 5*time.Second, "a window with no load at the start of every round, for each process's CPU use without requests (0 = none)")
		logLevel  = fs.String("log-level", "info", "the infergate processes' --log-level")
		cpuprof   = fs.String("cpuprofile", "", "file name prefix: profile Tier 1 and Tier 2 during their windows at --profile-rate (needs --infergate empty)")
		profRate  = fs.Float64("profile-rate", 0, "the rate --cpuprofile covers (default the highest of --rates)")
		jsonOut   = fs.String("json-out", "", "also write the JSON report to this file")
	)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: infergate-lab loadbench cpu --infergate BIN [flags]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Measure the CPU time per request of infergate tier1 and infergate tier2 (in")
		fmt.Fprintln(stderr, "front of a bare proxy) beside a bare httputil.ReverseProxy, all forwarding the")
		fmt.Fprintln(stderr, "same 32 KB chat requests to the same fake pods, in alternating windows of one")
		fmt.Fprintln(stderr, "run. See docs/performance.md.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	rs, err := parseRates(*rates)
	if err != nil {
		return err
	}
	if *streamPct < 0 || *streamPct > 100 {
		return errors.New("--stream-percent must be in 0..100")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	o := load.CompareOptions{
		Command: []string{exe, "loadbench"}, Infergate: *bin, LogLevel: *logLevel, Rates: rs, Window: *window,
		Rounds: *rounds, Pods: *pods, StreamPercent: *streamPct, Warmup: *warmup, Settle: *settle,
		CPUProfile: *cpuprof, ProfileRate: *profRate, Idle: *idle, Progress: stderr,
	}
	for _, p := range strings.Split(*paths, ",") {
		o.Paths = append(o.Paths, strings.TrimSpace(p))
	}
	if *streamPct == 0 {
		o.StreamPercent = -1 // the package's zero means its default
	}
	if *warmup == 0 {
		o.Warmup = -1
	}
	if *settle == 0 {
		o.Settle = -1
	}
	if *idle == 0 {
		o.Idle = -1
	}
	rep, err := load.RunCompare(ctx, o)
	if err != nil {
		return err
	}
	if err := rep.WriteMarkdown(stdout); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return writeJSON(*jsonOut, rep)
}

// parseRates parses --rates.
func parseRates(s string) ([]float64, error) {
	var rs []float64
	for _, f := range strings.Split(s, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 {
			return nil, fmt.Errorf("--rates: %q is not a positive number", f)
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// writeJSON writes v as indented JSON to path, unless path is empty.
func writeJSON(path string, v any) error {
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
