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
	var rs []float64
	for _, s := range strings.Split(*rates, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || r <= 0 {
			return fmt.Errorf("--rates: %q is not a positive number", s)
		}
		rs = append(rs, r)
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
	rep.WriteMarkdown(stdout)
	if *jsonOut != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}
