package report

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
)

// UnmarshalJSON implements json.Unmarshaler: null decodes as NaN.
func (n *Num) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = Num(math.NaN())
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*n = Num(f)
	return nil
}

// ReadJSON reads a report written by WriteJSON.
func ReadJSON(path string) (Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Report{}, fmt.Errorf("read report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return Report{}, fmt.Errorf("report %s: %w", path, err)
	}
	return r, nil
}

// WriteMarkdown writes the comparison as a Markdown table (means ± 95% CI
// half-widths) followed by infergate's relative changes.
func (r Report) WriteMarkdown(w io.Writer) error {
	bw := bufio.NewWriter(w) // its error is sticky: Flush returns the first failed write
	fmt.Fprintf(bw, "%s; TTFT SLO %s ms", r.seedsText(), fmtNum(float64(r.TTFTSLOMs)))
	if r.CapacityRPS > 0 {
		fmt.Fprintf(bw, "; offered load %s req/s = %s of the fleet's saturated capacity (%s req/s); an even split would load the busiest pod type to %s",
			fmtNum(float64(r.OfferedRPS)), fmtPct(float64(r.Utilisation)), fmtNum(float64(r.CapacityRPS)), fmtPct(float64(r.EvenSplitUtilisation)))
	}
	if r.Conditions != "" {
		fmt.Fprintf(bw, "; %s", r.Conditions)
	}
	fmt.Fprint(bw, ".\n\n")
	fmt.Fprintln(bw, "| policy | "+strings.Join(latencyHeaders, " | ")+" | output tok/s | goodput req/s | SLO met | prefix hit | failed | shed | floor p99 ms | causal floor p99 ms |")
	fmt.Fprintln(bw, "|---|"+strings.Repeat("--:|", len(latencyHeaders)+8))
	for _, p := range r.Policies {
		fmt.Fprintf(bw, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p.Name,
			strings.Join(p.latencyCells(), " | "),
			fmtCI(p.OutputTokensPerS, p.CI95.OutputTokensPerS, ""),
			fmtCI(p.GoodputRPS, p.CI95.GoodputRPS, ""),
			fmtPct(float64(p.SLOAttainment)), fmtPct(float64(p.PrefixHitRate)),
			fmtNum(float64(p.Failed)), fmtNum(float64(p.Shed)), fmtNum(float64(p.FloorTTFT.P99)),
			fmtNum(float64(p.CausalFloorTTFT.P99)))
	}
	if lines := r.Comparisons(); len(lines) > 0 {
		fmt.Fprintln(bw)
		for _, l := range lines {
			fmt.Fprintf(bw, "- %s\n", l)
		}
	}
	return bw.Flush()
}

// Target is one of the goals for infergate's P99 TTFT.
type Target struct {
	Scenario string
	Baseline string
	// MaxRatio is the largest acceptable infergate P99 / baseline P99.
	MaxRatio float64
	Goal     string
}

// Targets are the goals the benchmark reports against (never asserts):
// AWS's headline claims for round-robin, and a margin over GIE v1.5.0's
// default as shipped (gie-v1.5).
func Targets(scenarios []string) []Target {
	var out []Target
	for _, s := range scenarios {
		switch {
		case strings.HasPrefix(s, "mixed-gpu"), strings.HasPrefix(s, "bursty"):
			out = append(out, Target{s, "round-robin", 0.02, "≥ 98% lower P99 TTFT than round-robin"})
		case strings.HasPrefix(s, "shared-prefix"):
			out = append(out, Target{s, "round-robin", 0.40, "≥ 60% lower P99 TTFT than round-robin"})
		case strings.HasPrefix(s, "uniform"):
			out = append(out, Target{s, "round-robin", 1.03, "≤ 3% worse P99 TTFT than round-robin"})
		}
		out = append(out, Target{s, "gie-v1.5", 0.70, "P99 TTFT ≤ 0.7× gie-v1.5"})
	}
	return out
}

// WriteTargets writes a Markdown table of each target, the measured ratio
// and whether it was met, with the best ratio any router could reach: the
// no-queue floor's P99 (the larger of the floor and the causal floor) over
// the baseline's P99. (Each request's TTFT is at least its floor, so the
// P99 of TTFTs is at least the P99 of floors.)
func WriteTargets(w io.Writer, reports []Report) error {
	bw := bufio.NewWriter(w) // its error is sticky: Flush returns the first failed write
	byName := map[string]Report{}
	var names []string
	for _, r := range reports {
		byName[r.Scenario] = r
		names = append(names, r.Scenario)
	}
	fmt.Fprintln(bw, "| scenario | target | infergate P99 ms | baseline P99 ms | ratio | change | floor-bound ratio | met? |")
	fmt.Fprintln(bw, "|---|---|--:|--:|--:|--:|--:|---|")
	for _, t := range Targets(names) {
		r := byName[t.Scenario]
		ig, ok1 := r.Find("infergate")
		b, ok2 := r.Find(t.Baseline)
		if !ok1 || !ok2 {
			fmt.Fprintf(bw, "| %s | %s | — | — | — | — | — | not run |\n", t.Scenario, t.Goal)
			continue
		}
		ratio := float64(ig.TTFT.P99) / float64(b.TTFT.P99)
		met := "yes"
		if !(ratio <= t.MaxRatio) {
			met = fmt.Sprintf("**no** (needs ≤ %.2f×, off by %.2f×)", t.MaxRatio, ratio/t.MaxRatio)
		}
		// The causal floor (a prefix cached only once computed) is also a
		// lower bound on every request's TTFT, and the tighter one.
		bound := max(float64(ig.FloorTTFT.P99), float64(ig.CausalFloorTTFT.P99)) / float64(b.TTFT.P99)
		if bound > t.MaxRatio {
			met += " — out of reach: the floor alone exceeds it"
		}
		fmt.Fprintf(bw, "| %s | %s | %s | %s | %.3f× | %s | %.3f× | %s |\n", t.Scenario, t.Goal,
			fmtCI(ig.TTFT.P99, ig.CI95.TTFT.P99, ""), fmtCI(b.TTFT.P99, b.CI95.TTFT.P99, ""),
			ratio, fmtChange(ratio-1), bound, met)
	}
	return bw.Flush()
}

// WriteGlance writes one Markdown row per report: each policy's P99 TTFT
// and P99 end-to-end latency (means over seeds, ms) side by side, and
// infergate's ratio to the best other policy on each (below 1 is better).
// The README's "Routing results at a glance" table is this, generated by
// scripts/bench.sh from the same run as BENCHMARKS.md. Policies are those
// of the first report, in its order.
func WriteGlance(w io.Writer, reports []Report) error {
	bw := bufio.NewWriter(w) // its error is sticky: Flush returns the first failed write
	if len(reports) == 0 {
		return nil
	}
	var names []string
	for _, p := range reports[0].Policies {
		names = append(names, p.Name)
	}
	list := strings.Join(names, " / ")
	fmt.Fprintf(bw, "| run | P99 TTFT ms (%s) | P99 e2e ms (%s) | infergate ÷ best other, TTFT / e2e |\n", list, list)
	fmt.Fprintln(bw, "|---|--:|--:|--:|")
	for _, r := range reports {
		var ttft, e2e []string
		ig, hasIG := r.Find("infergate")
		bestT, bestE := math.Inf(1), math.Inf(1)
		for _, n := range names {
			p, ok := r.Find(n)
			if !ok {
				ttft, e2e = append(ttft, "—"), append(e2e, "—")
				continue
			}
			ttft = append(ttft, fmtNum(float64(p.TTFT.P99)))
			e2e = append(e2e, fmtNum(float64(p.E2E.P99)))
			if n != "infergate" {
				bestT = math.Min(bestT, float64(p.TTFT.P99))
				bestE = math.Min(bestE, float64(p.E2E.P99))
			}
		}
		ratio := "—"
		if hasIG && !math.IsInf(bestT, 1) {
			ratio = fmt.Sprintf("%.2f× / %.2f×", float64(ig.TTFT.P99)/bestT, float64(ig.E2E.P99)/bestE)
		}
		fmt.Fprintf(bw, "| %s | %s | %s | %s |\n", r.Scenario, strings.Join(ttft, " / "), strings.Join(e2e, " / "), ratio)
	}
	return bw.Flush()
}
