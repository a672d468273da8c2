package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// tinyBench is the smallest real run: two policies on mixed-gpu-8b with
// the arrival window cut to 5 s of virtual time and one seed. It takes a
// fraction of a second yet goes through the whole harness (stream, fleet,
// scheduler, floor, capacity, report).
var tinyBench = []string{"--scenario", "mixed-gpu-8b", "--policies", "round-robin,infergate", "--duration", "5s", "--seeds", "1"}

// runTinyBench runs runBench with args after tinyBench (later flags win) and
// returns its stdout.
func runTinyBench(t *testing.T, args ...string) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := runBench(context.Background(), append(slices.Clone(tinyBench), args...), &stdout, &stderr); err != nil {
		t.Fatalf("runBench %q: %v\nstderr:\n%s", args, err, stderr.String())
	}
	return stdout.Bytes()
}

func TestBenchErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-trace.jsonl")
	tests := []struct {
		name string
		args []string
		// wantIs is checked with errors.Is; otherwise every wantText
		// substring must be in the error.
		wantIs   error
		wantText []string
	}{
		{name: "help", args: []string{"--help"}, wantIs: flag.ErrHelp},
		{name: "unknown scenario", args: []string{"--scenario", "no-such-scenario"}, wantText: []string{`"no-such-scenario"`, "mixed-gpu-8b"}},
		{name: "unknown policy", args: []string{"--scenario", "mixed-gpu-8b", "--policies", "round-robin,no-such-policy"}, wantText: []string{`"no-such-policy"`, "round-robin", "infergate"}},
		{name: "missing trace", args: []string{"--trace", missing}, wantText: []string{missing}},
		{name: "scenario and trace", args: []string{"--scenario", "mixed-gpu-8b", "--trace", missing}, wantText: []string{"exactly one"}},
		{name: "neither scenario nor trace", args: nil, wantText: []string{"exactly one"}},
		{name: "zero seeds", args: []string{"--scenario", "mixed-gpu-8b", "--seeds", "0"}, wantText: []string{"--seeds"}},
		{name: "seed range overflows", args: []string{"--scenario", "mixed-gpu-8b", "--seeds", "2", "--seed-base", "18446744073709551615"}, wantText: []string{"--seed-base", "overflows"}},
		{name: "negative seed base", args: []string{"--scenario", "mixed-gpu-8b", "--seed-base", "-1"}, wantText: []string{"seed-base"}},
		{name: "unknown format", args: []string{"--scenario", "mixed-gpu-8b", "--format", "yaml"}, wantText: []string{`"yaml"`, "json"}},
		// The knobs that change the conditions are experiment's, not bench's.
		{name: "experiment flag", args: []string{"--scenario", "mixed-gpu-8b", "--realism", "off"}, wantText: []string{"-realism"}},
		{name: "oracle policy", args: []string{"--scenario", "mixed-gpu-8b", "--policies", "oracle-greedy"}, wantText: []string{`"oracle-greedy"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := runBench(context.Background(), tt.args, &stdout, &stderr)
			if err == nil {
				t.Fatalf("runBench %q succeeded; stdout:\n%s", tt.args, stdout.String())
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error = %v, want %v", err, tt.wantIs)
			}
			for _, want := range tt.wantText {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			// Errors are the caller's to print; only usage goes to stderr,
			// and nothing to stdout, which may be piped into a JSON parser.
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
}

// benchReport is the documented JSON shape (docs/benchmarks.md), decoded
// with pointers so that a missing key shows up as nil rather than zero.
type benchReport struct {
	Scenario *string  `json:"scenario"`
	Seeds    *int     `json:"seeds"`
	SeedList []uint64 `json:"seed_list"`
	Policies []struct {
		Name             *string                    `json:"name"`
		TTFT             map[string]*float64        `json:"ttft_ms"`
		E2E              map[string]*float64        `json:"e2e_ms"`
		OutputTokensPerS *float64                   `json:"output_tokens_per_s"`
		PrefixHitRate    *float64                   `json:"prefix_hit_rate"`
		Failed           *float64                   `json:"failed"`
		Shed             *float64                   `json:"shed"`
		CI95             map[string]json.RawMessage `json:"ci95"`
	} `json:"policies"`
}

func TestBenchJSON(t *testing.T) {
	out := runTinyBench(t, "--format", "json")
	var rep benchReport
	dec := json.NewDecoder(bytes.NewReader(out))
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("decode: %v\n%s", err, out)
	}
	if dec.More() {
		t.Errorf("stdout holds more than one JSON value:\n%s", out)
	}
	if rep.Scenario == nil || *rep.Scenario != "mixed-gpu-8b" {
		t.Errorf("scenario = %v, want mixed-gpu-8b", rep.Scenario)
	}
	if rep.Seeds == nil || *rep.Seeds != 1 || !slices.Equal(rep.SeedList, []uint64{1}) {
		t.Errorf("seeds = %v, seed_list = %v, want 1 and [1]", rep.Seeds, rep.SeedList)
	}
	var names []string
	for _, p := range rep.Policies {
		if p.Name == nil {
			t.Fatalf("policy without a name:\n%s", out)
		}
		names = append(names, *p.Name)
		for _, q := range []struct {
			key string
			m   map[string]*float64
		}{{"ttft_ms", p.TTFT}, {"e2e_ms", p.E2E}} {
			for _, k := range []string{"p50", "p95", "p99"} {
				// A run that completed requests has every percentile.
				if v := q.m[k]; v == nil || *v <= 0 {
					t.Errorf("%s: %s.%s = %v, want a positive number", *p.Name, q.key, k, v)
				}
			}
		}
		if p.OutputTokensPerS == nil || *p.OutputTokensPerS <= 0 {
			t.Errorf("%s: output_tokens_per_s = %v", *p.Name, p.OutputTokensPerS)
		}
		if p.PrefixHitRate == nil || p.Failed == nil || p.Shed == nil {
			t.Errorf("%s: prefix_hit_rate, failed or shed missing", *p.Name)
		}
		// One seed: the CI is unknown and encoded as null, but the key is
		// there.
		if got := string(p.CI95["output_tokens_per_s"]); got != "null" {
			t.Errorf("%s: ci95.output_tokens_per_s = %q, want null", *p.Name, got)
		}
	}
	if want := []string{"round-robin", "infergate"}; !slices.Equal(names, want) {
		t.Errorf("policies = %v, want %v", names, want)
	}
}

// TestBenchSeedBase checks that --seed-base selects other seeds (different
// results from the default 1), that the same base reproduces a run exactly
// (the benchmark is deterministic in virtual time), and that every output
// format says which seeds were used.
func TestBenchSeedBase(t *testing.T) {
	def := runTinyBench(t, "--format", "json", "--seeds", "2")
	held := runTinyBench(t, "--format", "json", "--seed-base", "201", "--seeds", "2")
	again := runTinyBench(t, "--format", "json", "--seed-base", "201", "--seeds", "2")
	// Compare the figures alone: seed_list differs anyway, and must not be
	// what tells the runs apart.
	figures := func(b []byte) string {
		var v struct{ Policies json.RawMessage }
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		return string(v.Policies)
	}
	if figures(def) == figures(held) {
		t.Error("--seed-base 201 gave the same figures as the default seeds 1–2")
	}
	if !bytes.Equal(held, again) {
		t.Errorf("the same --seed-base gave different reports:\n%s\n---\n%s", held, again)
	}
	var rep benchReport
	if err := json.Unmarshal(held, &rep); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.SeedList, []uint64{201, 202}) {
		t.Errorf("seed_list = %v, want [201 202]", rep.SeedList)
	}

	tests := []struct {
		format string
		want   string
	}{
		{"table", "2 seed(s) (201–202)"},
		{"markdown", "2 seed(s) (201–202)"},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			out := runTinyBench(t, "--format", tt.format, "--seed-base", "201", "--seeds", "2")
			if !bytes.Contains(out, []byte(tt.want)) {
				t.Errorf("%s output lacks %q:\n%s", tt.format, tt.want, out)
			}
		})
	}
}

// --fleet replaces a scenario's pods (and TTFT SLO), so a scenario's
// requests can be run on another fleet.
func TestBenchScenarioFleet(t *testing.T) {
	fleet := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(fleet, []byte("model: llama-3.1-8b\npods:\n  - gpu: a10g\n    count: 2\nttft_slo: 3s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var own, other struct {
		SLO      float64 `json:"ttft_slo_ms"`
		Capacity float64 `json:"capacity_rps"`
	}
	if err := json.Unmarshal(runTinyBench(t, "--format", "json"), &own); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(runTinyBench(t, "--format", "json", "--fleet", fleet), &other); err != nil {
		t.Fatal(err)
	}
	if other.SLO != 3000 || own.SLO == 3000 {
		t.Errorf("TTFT SLO %v ms with --fleet (want 3000), %v without", other.SLO, own.SLO)
	}
	// mixed-gpu-8b's own fleet is 4 H100 + 4 A10G; two A10Gs serve far less.
	if !(other.Capacity > 0 && other.Capacity < own.Capacity/4) {
		t.Errorf("capacity %v req/s on 2 A10G, %v on the scenario's fleet", other.Capacity, own.Capacity)
	}
	var stdout, stderr bytes.Buffer
	err := runBench(context.Background(), append(slices.Clone(tinyBench), "--fleet", filepath.Join(t.TempDir(), "missing.yaml")), &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing fleet file: error %v", err)
	}
}

// experiment without knobs is bench: the same report, byte for byte; a knob
// changes the conditions the report states.
func TestExperiment(t *testing.T) {
	run := func(args ...string) []byte {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if err := runExperiment(context.Background(), append(slices.Clone(tinyBench), args...), &stdout, &stderr); err != nil {
			t.Fatalf("runExperiment %q: %v\nstderr:\n%s", args, err, stderr.String())
		}
		return stdout.Bytes()
	}
	if b, e := runTinyBench(t, "--format", "json"), run("--format", "json"); !bytes.Equal(b, e) {
		t.Errorf("experiment with its defaults differs from bench:\n%s\n---\n%s", e, b)
	}
	var off struct{ Conditions string }
	if err := json.Unmarshal(run("--format", "json", "--realism", "off", "--inputs", "engine"), &off); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(off.Conditions, "engine inputs") || strings.Contains(off.Conditions, "jitter") {
		t.Errorf("conditions with --realism off --inputs engine: %q", off.Conditions)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--router-replicas", "0"}, "--router-replicas"},
		{[]string{"--share-delay", "-1ms"}, "--share-delay"},
		{[]string{"--rate-scale", "0"}, "--rate-scale"},
		{[]string{"--inputs", "psychic"}, `"psychic"`},
		{[]string{"--realism", "fog"}, "fog"},
	} {
		var stdout, stderr bytes.Buffer
		err := runExperiment(context.Background(), append(slices.Clone(tinyBench), tt.args...), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: err %v, want it to mention %q", tt.args, err, tt.want)
		}
	}
}

// report reads saved JSON reports, comma-separated or as separate
// arguments, and prints the table asked for.
func TestReport(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	runTinyBench(t, "--json-out", a, "--name", "run-a")
	runTinyBench(t, "--json-out", b, "--name", "run-b", "--seed-base", "7")
	report := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		err := runReport(context.Background(), args, &stdout, &stderr)
		return stdout.String(), err
	}
	comma, err := report("glance", a+","+b)
	if err != nil {
		t.Fatal(err)
	}
	spaced, err := report("glance", a, b)
	if err != nil {
		t.Fatal(err)
	}
	if comma != spaced {
		t.Errorf("comma-separated and separate arguments differ:\n%s\n---\n%s", comma, spaced)
	}
	for _, want := range []string{"| run-a |", "| run-b |", "round-robin / infergate"} {
		if !strings.Contains(comma, want) {
			t.Errorf("glance lacks %q:\n%s", want, comma)
		}
	}
	// Targets are per scenario; a run under another name has none.
	mixed := filepath.Join(dir, "mixed.json")
	runTinyBench(t, "--json-out", mixed)
	targets, err := report("targets", mixed)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(targets, "| mixed-gpu-8b |") || !strings.Contains(targets, "floor-bound ratio") {
		t.Errorf("targets table:\n%s", targets)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "glance or targets"},
		{[]string{"glance"}, "at least one"},
		{[]string{"summary", a}, `"summary"`},
		{[]string{"glance", filepath.Join(dir, "missing.json")}, "missing.json"},
	} {
		if _, err := report(tt.args...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("report %q: err %v, want it to mention %q", tt.args, err, tt.want)
		}
	}
}
