// Package report turns the routing benchmark's per-run measurements into
// per-policy summaries with 95% confidence intervals over seeds, and renders
// them as a table, JSON and hand-written SVG plots.
package report

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/infergate/infergate/bench/stats"
)

// Run is what one simulation (one policy, one seed) measured.
type Run struct {
	Policy string
	Seed   uint64
	// Per completed request, in milliseconds.
	TTFT, E2E, ITL []float64
	// Floor is each request's no-queue TTFT floor in milliseconds (all
	// requests, whatever happened to them).
	Floor []float64
	// CausalFloor is each request's causal floor (bench.CausalFloors): the
	// floor where a block is cached only once a request has computed it.
	CausalFloor  []float64
	Requests     int // requests in the stream
	Completed    int
	Failed       int // rejected or aborted by a pod
	Shed         int // shed by the router under saturation
	MetSLO       int // completed with TTFT ≤ the SLO
	OutputTokens int
	// Makespan is the virtual time from the first arrival to the last
	// completion; throughput is measured over it.
	Makespan      time.Duration
	PrefixHitRate float64 // prompt tokens served from prefix cache / prompt tokens, over all pods
	Load          *Load   // per-pod load over time, nil when not recorded
	PodRequests   []int   // requests dispatched to each pod
	// Speeds is what the router learned of its pods' prefill speeds by
	// the end of the run; nil for a policy that learns none.
	Speeds *Speeds
}

// maxSpeedPods is the largest fleet whose learned speeds a report lists
// pod by pod.
const maxSpeedPods = 64

// Speeds are a router's prefill speeds (tokens/s) per pod in fleet order:
// Learned is each pod's own estimate at the end of the run (0: none yet),
// WarmMean its time average from the end of the warm-up (the first 20% of
// the arrival window) to the end of the arrivals, Used the speed its
// scheduler uses at the end (pooled with the pod's class).
type Speeds struct {
	Seed uint64 `json:"seed"`
	// The per-pod lists are left out of a report of a fleet over
	// maxSpeedPods pods (Spread and EndSpread stay): scale-1000's made
	// its JSON 700 KB.
	Pods     []string `json:"pods,omitempty"`
	Classes  []string `json:"classes,omitempty"` // hardware class: GPU × GPUs per pod
	Learned  []Num    `json:"learned,omitempty"`
	WarmMean []Num    `json:"warm_mean,omitempty"`
	Used     []Num    `json:"used,omitempty"`
	// Spread is the largest max/min of WarmMean within one class (1: the
	// pods of every class agree; NaN when no class has two learned),
	// EndSpread the same of Learned.
	Spread    Num `json:"spread"`
	EndSpread Num `json:"end_spread"`
}

// ClassSpread is the largest max/min ratio of v (per pod, in Classes'
// order) among the pods of one class, NaN when no class has two pods
// with a positive value.
func (s *Speeds) ClassSpread(v []Num) float64 {
	lo, hi := map[string]float64{}, map[string]float64{}
	n := map[string]int{}
	for i, c := range s.Classes {
		if i >= len(v) {
			break
		}
		x := float64(v[i])
		if !(x > 0) {
			continue
		}
		if n[c] == 0 || x < lo[c] {
			lo[c] = x
		}
		if n[c] == 0 || x > hi[c] {
			hi[c] = x
		}
		n[c]++
	}
	out := math.NaN()
	for c, k := range n {
		if k >= 2 && (math.IsNaN(out) || hi[c]/lo[c] > out) {
			out = hi[c] / lo[c]
		}
	}
	return out
}

// Load samples each pod's load (waiting + running requests on the server)
// over time.
type Load struct {
	Pods  []string
	GPUs  []string
	Times []time.Duration
	// Values[i][p] is pod p's load at Times[i].
	Values [][]int
}

// Num is a float64 that encodes NaN and ±Inf as JSON null.
type Num float64

// MarshalJSON implements json.Marshaler.
func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, math.Round(f*1000)/1000, 'f', -1, 64), nil
}

// Quantiles are the reported percentiles of a latency, in milliseconds.
type Quantiles struct {
	P50 Num `json:"p50"`
	P95 Num `json:"p95"`
	P99 Num `json:"p99"`
}

// CI95 holds the half-widths of the 95% confidence intervals of the
// corresponding Policy fields (null with a single seed).
type CI95 struct {
	TTFT             Quantiles `json:"ttft_ms"`
	E2E              Quantiles `json:"e2e_ms"`
	ITL              Quantiles `json:"itl_ms"`
	OutputTokensPerS Num       `json:"output_tokens_per_s"`
	GoodputRPS       Num       `json:"goodput_rps"`
	SLOAttainment    Num       `json:"slo_attainment"`
	PrefixHitRate    Num       `json:"prefix_hit_rate"`
	Failed           Num       `json:"failed"`
	Shed             Num       `json:"shed"`
}

// Policy is one policy's results: each figure is the mean over seeds of the
// per-seed value (percentiles are taken per seed, then averaged).
type Policy struct {
	Name             string    `json:"name"`
	TTFT             Quantiles `json:"ttft_ms"`
	E2E              Quantiles `json:"e2e_ms"`
	ITL              Quantiles `json:"itl_ms"`
	OutputTokensPerS Num       `json:"output_tokens_per_s"`
	GoodputRPS       Num       `json:"goodput_rps"`    // completed within the TTFT SLO, per second
	SLOAttainment    Num       `json:"slo_attainment"` // fraction of all requests within the TTFT SLO
	PrefixHitRate    Num       `json:"prefix_hit_rate"`
	Failed           Num       `json:"failed"` // per seed
	Shed             Num       `json:"shed"`   // per seed
	Requests         Num       `json:"requests"`
	FloorTTFT        Quantiles `json:"floor_ttft_ms"` // no-queue floor
	// CausalFloorTTFT is the no-queue floor where a prefix is cached only
	// once a request has finished computing it.
	CausalFloorTTFT Quantiles `json:"causal_floor_ttft_ms"`
	CI95            CI95      `json:"ci95"`
	Seeds           int       `json:"seeds"`
	// LearnedSpeeds are the router's prefill speeds at the end of each
	// seed's run (Run.Speeds), for policies that learn them.
	LearnedSpeeds []Speeds `json:"learned_speeds,omitempty"`

	runs []Run
}

// Report is one scenario's comparison; its JSON form is what --json prints.
type Report struct {
	Scenario string `json:"scenario"`
	Seeds    int    `json:"seeds"`
	// SeedList names the seeds the runs used, ascending, so a report says
	// whether it was made on tuning, held-out or published seeds.
	SeedList  []uint64 `json:"seed_list"`
	TTFTSLOMs Num      `json:"ttft_slo_ms"`
	// OfferedRPS is the mean arrival rate; CapacityRPS the fleet's
	// saturated throughput on the same mix; Utilisation their ratio.
	OfferedRPS  Num `json:"offered_rps"`
	CapacityRPS Num `json:"capacity_rps"`
	Utilisation Num `json:"utilisation"`
	// EvenSplitUtilisation is the busiest pod type's utilisation under an
	// even split of requests (round-robin's), > 1 meaning overload.
	EvenSplitUtilisation Num `json:"even_split_utilisation"`
	// Conditions names the run's realism knobs and scheduling inputs, so a
	// report says what it was measured under.
	Conditions string   `json:"conditions,omitempty"`
	Policies   []Policy `json:"policies"`
}

// Summarize aggregates runs (any order) into a Report, keeping policies in
// the order given.
func Summarize(scenario string, slo time.Duration, policies []string, runs []Run) Report {
	rep := Report{Scenario: scenario, TTFTSLOMs: Num(float64(slo) / float64(time.Millisecond)), Utilisation: Num(math.NaN()), EvenSplitUtilisation: Num(math.NaN())}
	for _, name := range policies {
		var rs []Run
		for _, r := range runs {
			if r.Policy == name {
				rs = append(rs, r)
			}
		}
		slices.SortFunc(rs, func(a, b Run) int {
			switch {
			case a.Seed < b.Seed:
				return -1
			case a.Seed > b.Seed:
				return 1
			}
			return 0
		})
		rep.Policies = append(rep.Policies, summarizePolicy(name, rs))
		rep.Seeds = max(rep.Seeds, len(rs))
		for _, r := range rs {
			rep.SeedList = append(rep.SeedList, r.Seed)
		}
	}
	slices.Sort(rep.SeedList)
	rep.SeedList = slices.Compact(rep.SeedList)
	return rep
}

// seedsText describes the seeds for the table and Markdown headers:
// "5 seed(s) (101–105)", or the list when they are not consecutive.
// Reports read from JSON written before seed_list existed have no list
// and print the count alone.
func (r Report) seedsText() string {
	s := fmt.Sprintf("%d seed(s)", r.Seeds)
	l := r.SeedList
	switch {
	case len(l) == 0:
		return s
	case len(l) == 1:
		return fmt.Sprintf("%s (%d)", s, l[0])
	case l[len(l)-1]-l[0] == uint64(len(l)-1):
		// Sorted and unique, so this span means consecutive.
		return fmt.Sprintf("%s (%d–%d)", s, l[0], l[len(l)-1])
	}
	parts := make([]string, len(l))
	for i, v := range l {
		parts[i] = strconv.FormatUint(v, 10)
	}
	return fmt.Sprintf("%s (%s)", s, strings.Join(parts, ", "))
}

func summarizePolicy(name string, rs []Run) Policy {
	p := Policy{Name: name, Seeds: len(rs), runs: rs}
	per := func(f func(Run) float64) stats.CI {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		return stats.CI95(xs)
	}
	quant := func(get func(Run) []float64) (m, h Quantiles) {
		at := func(q float64) stats.CI {
			return per(func(r Run) float64 { return stats.Percentile(get(r), q) })
		}
		c50, c95, c99 := at(50), at(95), at(99)
		m = Quantiles{Num(c50.Mean), Num(c95.Mean), Num(c99.Mean)}
		h = Quantiles{Num(c50.HalfWidth), Num(c95.HalfWidth), Num(c99.HalfWidth)}
		return m, h
	}
	set := func(m, h *Num, f func(Run) float64) {
		c := per(f)
		*m, *h = Num(c.Mean), Num(c.HalfWidth)
	}
	p.TTFT, p.CI95.TTFT = quant(func(r Run) []float64 { return r.TTFT })
	p.E2E, p.CI95.E2E = quant(func(r Run) []float64 { return r.E2E })
	p.ITL, p.CI95.ITL = quant(func(r Run) []float64 { return r.ITL })
	p.FloorTTFT, _ = quant(func(r Run) []float64 { return r.Floor })
	p.CausalFloorTTFT, _ = quant(func(r Run) []float64 { return r.CausalFloor })
	set(&p.OutputTokensPerS, &p.CI95.OutputTokensPerS, func(r Run) float64 {
		return float64(r.OutputTokens) / r.Makespan.Seconds()
	})
	set(&p.GoodputRPS, &p.CI95.GoodputRPS, func(r Run) float64 { return float64(r.MetSLO) / r.Makespan.Seconds() })
	set(&p.SLOAttainment, &p.CI95.SLOAttainment, func(r Run) float64 { return float64(r.MetSLO) / float64(max(r.Requests, 1)) })
	set(&p.PrefixHitRate, &p.CI95.PrefixHitRate, func(r Run) float64 { return r.PrefixHitRate })
	set(&p.Failed, &p.CI95.Failed, func(r Run) float64 { return float64(r.Failed) })
	set(&p.Shed, &p.CI95.Shed, func(r Run) float64 { return float64(r.Shed) })
	p.Requests = Num(per(func(r Run) float64 { return float64(r.Requests) }).Mean)
	for _, r := range rs {
		if r.Speeds != nil {
			sp := *r.Speeds
			sp.Seed, sp.Spread, sp.EndSpread = r.Seed, Num(sp.ClassSpread(sp.WarmMean)), Num(sp.ClassSpread(sp.Learned))
			if len(sp.Pods) > maxSpeedPods {
				sp.Pods, sp.Classes, sp.Learned, sp.WarmMean, sp.Used = nil, nil, nil, nil, nil
			}
			p.LearnedSpeeds = append(p.LearnedSpeeds, sp)
		}
	}
	return p
}

// SpeedSpread is the mean and the largest over seeds of the within-class
// spread of learned speeds: of their time averages after warm-up
// (Speeds.Spread), or with end set of the end-of-run estimates
// (Speeds.EndSpread); NaN without any.
func (p Policy) SpeedSpread(end bool) (mean, worst float64) {
	var sum float64
	var n int
	worst = math.NaN()
	for _, s := range p.LearnedSpeeds {
		v := float64(s.Spread)
		if end {
			v = float64(s.EndSpread)
		}
		if !math.IsNaN(v) {
			sum += v
			n++
			if math.IsNaN(worst) || v > worst {
				worst = v
			}
		}
	}
	if n == 0 {
		return math.NaN(), math.NaN()
	}
	return sum / float64(n), worst
}

// SetLoad records the offered load, the fleet's capacity and the busiest
// pod type's utilisation under an even split.
func (r *Report) SetLoad(offered, capacity, evenSplit float64) {
	r.OfferedRPS, r.CapacityRPS, r.EvenSplitUtilisation = Num(offered), Num(capacity), Num(evenSplit)
	if capacity > 0 {
		r.Utilisation = Num(offered / capacity)
	}
}

// Runs returns the runs a policy summary was built from, by seed.
func (p Policy) Runs() []Run { return p.runs }

// WriteJSON writes the report as JSON indented by one space a level (the
// published reports under docs/bench stay small).
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	return nil
}

func fmtCI(m, h Num, unit string) string {
	mv, hv := float64(m), float64(h)
	if math.IsNaN(mv) {
		return "—"
	}
	s := fmtNum(mv) + unit
	if !math.IsNaN(hv) {
		s += " ±" + fmtNum(hv)
	}
	return s
}

func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

// WriteTable writes a human-readable comparison: means over seeds with the
// 95% CI half-width after ±.
func (r Report) WriteTable(w io.Writer) error {
	bw := bufio.NewWriter(w) // its error is sticky: Flush returns the first failed write
	fmt.Fprintf(bw, "scenario %s: %s, TTFT SLO %v ms; mean over seeds ± 95%% CI half-width\n",
		r.Scenario, r.seedsText(), fmtNum(float64(r.TTFTSLOMs)))
	if r.CapacityRPS > 0 {
		fmt.Fprintf(bw, "offered load %s req/s = %s of the fleet's saturated capacity (%s req/s); an even split would load the busiest pod type to %s\n",
			fmtNum(float64(r.OfferedRPS)), fmtPct(float64(r.Utilisation)), fmtNum(float64(r.CapacityRPS)), fmtPct(float64(r.EvenSplitUtilisation)))
	}
	if r.Conditions != "" {
		fmt.Fprintf(bw, "conditions: %s\n", r.Conditions)
	}
	fmt.Fprintln(bw)
	tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
	// tw writes through bw, whose error is sticky (returned by its Flush below).
	_, _ = fmt.Fprintln(tw, "policy\t"+strings.Join(latencyHeaders, "\t")+"\tout tok/s\tgoodput req/s\tSLO met\tprefix hit\tfailed\tshed\tfloor p99 ms\tcausal floor p99 ms\t")
	for _, p := range r.Policies {
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", p.Name,
			strings.Join(p.latencyCells(), "\t"),
			fmtCI(p.OutputTokensPerS, p.CI95.OutputTokensPerS, ""),
			fmtCI(p.GoodputRPS, p.CI95.GoodputRPS, ""),
			fmtPct(float64(p.SLOAttainment)),
			fmtPct(float64(p.PrefixHitRate)),
			fmtNum(float64(p.Failed)), fmtNum(float64(p.Shed)),
			fmtNum(float64(p.FloorTTFT.P99)), fmtNum(float64(p.CausalFloorTTFT.P99)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if lines := r.Comparisons(); len(lines) > 0 {
		fmt.Fprintln(bw)
		for _, l := range lines {
			fmt.Fprintln(bw, l)
		}
	}
	var spread []string
	for _, p := range r.Policies {
		if m, worst := p.SpeedSpread(false); !math.IsNaN(m) {
			em, eworst := p.SpeedSpread(true)
			spread = append(spread, fmt.Sprintf("%s %.3f, worst seed %.3f (at the end %.3f, worst %.3f)", p.Name, m, worst, em, eworst))
		}
	}
	if len(spread) > 0 {
		fmt.Fprintln(bw)
		fmt.Fprintln(bw, "learned prefill speeds, max/min among pods of one hardware class, time average after warm-up: "+strings.Join(spread, "; "))
	}
	return bw.Flush()
}

// latencyHeaders head the latency columns of the headline tables: TTFT,
// end-to-end latency and inter-token latency side by side, so a policy
// cannot look good on TTFT while hiding slower streams.
var latencyHeaders = []string{"TTFT p50 ms", "TTFT p95 ms", "TTFT p99 ms", "e2e p50 ms", "e2e p99 ms", "ITL p50 ms", "ITL p99 ms"}

// latencyCells are the cells under latencyHeaders, means ± 95% CI.
func (p Policy) latencyCells() []string {
	return []string{
		fmtCI(p.TTFT.P50, p.CI95.TTFT.P50, ""),
		fmtCI(p.TTFT.P95, p.CI95.TTFT.P95, ""),
		fmtCI(p.TTFT.P99, p.CI95.TTFT.P99, ""),
		fmtCI(p.E2E.P50, p.CI95.E2E.P50, ""),
		fmtCI(p.E2E.P99, p.CI95.E2E.P99, ""),
		fmtCI(p.ITL.P50, p.CI95.ITL.P50, ""),
		fmtCI(p.ITL.P99, p.CI95.ITL.P99, ""),
	}
}

func fmtPct(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return strconv.FormatFloat(v*100, 'f', 1, 64) + "%"
}

// Find returns the named policy's summary.
func (r Report) Find(name string) (Policy, bool) {
	for _, p := range r.Policies {
		if p.Name == name {
			return p, true
		}
	}
	return Policy{}, false
}

// Change is the relative change of x against base: −0.97 is 97% lower.
func Change(x, base Num) float64 {
	return (float64(x) - float64(base)) / float64(base)
}

// Comparisons describes infergate's P95/P99 TTFT and throughput against the
// baselines present in the report.
func (r Report) Comparisons() []string {
	ig, ok := r.Find("infergate")
	if !ok {
		return nil
	}
	var out []string
	for _, base := range []string{"round-robin", "gie-v1.5", "llm-d", "gie-strengthened", "gie-default", "least-request", "random"} {
		b, ok := r.Find(base)
		if !ok {
			continue
		}
		out = append(out, fmt.Sprintf("infergate vs %s: P95 TTFT %s, P99 TTFT %s (ratio %.3f×), output tokens/s %s",
			base, fmtChange(Change(ig.TTFT.P95, b.TTFT.P95)), fmtChange(Change(ig.TTFT.P99, b.TTFT.P99)),
			float64(ig.TTFT.P99)/float64(b.TTFT.P99), fmtChange(Change(ig.OutputTokensPerS, b.OutputTokensPerS))))
	}
	return out
}

func fmtChange(c float64) string {
	if math.IsNaN(c) || math.IsInf(c, 0) {
		return "n/a"
	}
	s := strconv.FormatFloat(c*100, 'f', 1, 64) + "%"
	if c >= 0 {
		s = "+" + s
	}
	return strings.Replace(s, "-", "−", 1)
}
