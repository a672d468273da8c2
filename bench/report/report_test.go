package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func runOf(policy string, seed uint64, ttft []float64) Run {
	return Run{
		Policy: policy, Seed: seed, TTFT: ttft, E2E: ttft, ITL: []float64{10},
		Floor: []float64{1}, Requests: len(ttft) + 1, Completed: len(ttft), Shed: 1,
		MetSLO: len(ttft), OutputTokens: 1000, Makespan: 10 * time.Second, PrefixHitRate: 0.5,
		Load: &Load{Pods: []string{"a", "b"}, GPUs: []string{"h100", "a10g"}, Times: []time.Duration{0, time.Second}, Values: [][]int{{1, 0}, {3, 5}}},
	}
}

func sample() Report {
	runs := []Run{
		runOf("infergate", 2, []float64{20, 20, 20}),
		runOf("round-robin", 1, []float64{100, 200, 300}),
		runOf("infergate", 1, []float64{10, 10, 10}),
		runOf("round-robin", 2, []float64{100, 200, 300}),
	}
	r := Summarize("s", time.Second, []string{"round-robin", "infergate"}, runs)
	r.SetLoad(5, 10, 0.9)
	return r
}

func TestSummarize(t *testing.T) {
	r := sample()
	if r.Seeds != 2 || len(r.Policies) != 2 || r.Policies[0].Name != "round-robin" {
		t.Fatalf("report = %+v", r)
	}
	ig := r.Policies[1]
	// Per-seed p50 are 10 and 20: mean 15, t(1) × sd(7.071) / √2 = 63.53.
	if ig.TTFT.P50 != 15 || math.Abs(float64(ig.CI95.TTFT.P50)-12.706*5) > 1e-9 {
		t.Errorf("infergate p50 %v ± %v", ig.TTFT.P50, ig.CI95.TTFT.P50)
	}
	rr := r.Policies[0]
	if rr.TTFT.P50 != 200 || rr.CI95.TTFT.P50 != 0 || math.Abs(float64(rr.TTFT.P99)-298) > 1e-9 {
		t.Errorf("round-robin ttft %+v ci %+v", rr.TTFT, rr.CI95.TTFT)
	}
	if rr.OutputTokensPerS != 100 || rr.Shed != 1 || rr.SLOAttainment != 0.75 || rr.GoodputRPS != 0.3 || rr.PrefixHitRate != 0.5 {
		t.Errorf("round-robin = %+v", rr)
	}
	if r.Utilisation != 0.5 {
		t.Errorf("utilisation %v", r.Utilisation)
	}
	if got := Change(ig.TTFT.P99, rr.TTFT.P99); got >= 0 {
		t.Errorf("Change = %v", got)
	}
}

func TestJSONShape(t *testing.T) {
	r := Summarize("s", time.Second, []string{"infergate"}, []Run{runOf("infergate", 1, []float64{1, 2})})
	var buf bytes.Buffer
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var v struct {
		Scenario string `json:"scenario"`
		Policies []map[string]json.RawMessage
	}
	if err := json.Unmarshal(buf.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if v.Scenario != "s" || len(v.Policies) != 1 {
		t.Fatalf("decoded %+v", v)
	}
	p := v.Policies[0]
	for _, k := range []string{"name", "ttft_ms", "e2e_ms", "output_tokens_per_s", "prefix_hit_rate", "failed", "shed", "ci95"} {
		if _, ok := p[k]; !ok {
			t.Errorf("policy lacks %q", k)
		}
	}
	var q map[string]*float64
	json.Unmarshal(p["ttft_ms"], &q)
	for _, k := range []string{"p50", "p95", "p99"} {
		if q[k] == nil {
			t.Errorf("ttft_ms.%s missing", k)
		}
	}
	// One seed: CI half-widths are unknown, encoded as null rather than NaN.
	var ci map[string]json.RawMessage
	json.Unmarshal(p["ci95"], &ci)
	if string(ci["output_tokens_per_s"]) != "null" {
		t.Errorf("ci95.output_tokens_per_s = %s, want null", ci["output_tokens_per_s"])
	}
}

func TestTable(t *testing.T) {
	var buf bytes.Buffer
	if err := sample().WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"round-robin", "infergate", "TTFT p99 ms", "50.0% of the fleet", "infergate vs round-robin: P95 TTFT −"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func wellFormed(t *testing.T, svg string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := d.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("malformed SVG: %v", err)
		}
	}
}

func TestSVG(t *testing.T) {
	r := sample()
	var buf bytes.Buffer
	if err := r.WriteTTFTCDF(&buf); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, buf.String())
	if n := strings.Count(buf.String(), "<polyline"); n != 2 {
		t.Errorf("%d CDF lines, want 2", n)
	}
	tests := []struct {
		name string
		load *Load
	}{
		{"nil", nil},
		{"small", r.Policies[0].Runs()[0].Load},
		{"many pods", func() *Load {
			l := &Load{}
			for i := range 1000 {
				l.Pods = append(l.Pods, "p")
				l.GPUs = append(l.GPUs, "h100")
				_ = i
			}
			for k := range 500 {
				l.Times = append(l.Times, time.Duration(k)*time.Second)
				l.Values = append(l.Values, make([]int, 1000))
				l.Values[k][k%1000] = k
			}
			return l
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteLoad(&b, "t <&>", tt.load); err != nil {
				t.Fatal(err)
			}
			wellFormed(t, b.String())
			if tt.load != nil && strings.Count(b.String(), "<rect") > heatRowsMax*heatColsMax+10 {
				t.Error("heatmap not binned")
			}
		})
	}
}

func TestMarkdownAndTargets(t *testing.T) {
	r := sample()
	r.Scenario = "mixed-gpu-8b"
	var buf bytes.Buffer
	if err := r.WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "| infergate | 15.0 ±63.5 |") {
		t.Errorf("markdown:\n%s", buf.String())
	}
	// Round trip through JSON keeps what the targets need.
	dir := t.TempDir()
	buf.Reset()
	r.WriteJSON(&buf)
	path := dir + "/r.json"
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if err := WriteTargets(&buf, []Report{back}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	// infergate p99 ≈ 19.9 vs round-robin 298: ratio 0.067 misses 0.02, meets 0.7 vs gie (absent).
	for _, want := range []string{"≥ 98% lower P99 TTFT than round-robin", "**no**", "not run"} {
		if !strings.Contains(out, want) {
			t.Errorf("targets lack %q:\n%s", want, out)
		}
	}
}

func TestTargetsTable(t *testing.T) {
	tests := []struct {
		scenario string
		n        int
		first    float64
	}{
		{"mixed-gpu-8b", 2, 0.02},
		{"bursty-70b", 2, 0.02},
		{"shared-prefix-8b", 2, 0.40},
		{"uniform-235b", 2, 1.03},
		{"many-lora", 1, 0.70},
	}
	for _, tt := range tests {
		ts := Targets([]string{tt.scenario})
		if len(ts) != tt.n || ts[0].MaxRatio != tt.first {
			t.Errorf("Targets(%s) = %+v", tt.scenario, ts)
		}
	}
}

func TestSeedsText(t *testing.T) {
	tests := []struct {
		name  string
		seeds []uint64
		want  string
		list  []uint64
	}{
		{"one seed", []uint64{7}, "1 seed(s) (7)", []uint64{7}},
		{"consecutive, any order", []uint64{203, 201, 202}, "3 seed(s) (201–203)", []uint64{201, 202, 203}},
		{"gaps are listed", []uint64{1, 5, 3}, "3 seed(s) (1, 3, 5)", []uint64{1, 3, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var runs []Run
			for _, s := range tt.seeds {
				runs = append(runs, runOf("a", s, []float64{1}), runOf("b", s, []float64{2}))
			}
			r := Summarize("s", time.Second, []string{"a", "b"}, runs)
			if !slices.Equal(r.SeedList, tt.list) {
				t.Errorf("SeedList = %v, want %v", r.SeedList, tt.list)
			}
			var md bytes.Buffer
			if err := r.WriteMarkdown(&md); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(md.String(), tt.want+";") {
				t.Errorf("markdown starts %q, want %q", md.String()[:min(md.Len(), 40)], tt.want)
			}
		})
	}
	// A report read from JSON written before seed_list existed has only
	// the count.
	if got := (Report{Seeds: 5}).seedsText(); got != "5 seed(s)" {
		t.Errorf("without a list: %q", got)
	}
}

// TestHeadlineColumns: both headline tables show TTFT, end-to-end and
// inter-token latency side by side, keep the floor column, and every row
// has as many cells as the header.
func TestHeadlineColumns(t *testing.T) {
	a, b := runOf("infergate", 1, []float64{10, 10, 10}), runOf("infergate", 2, []float64{10, 10, 10})
	a.E2E, b.E2E = []float64{400, 400, 400}, []float64{400, 400, 400}
	a.ITL, b.ITL = []float64{7}, []float64{7}
	r := Summarize("s", time.Second, []string{"infergate"}, []Run{a, b})
	var md, tab bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	want := []string{"TTFT p50 ms", "TTFT p99 ms", "e2e p50 ms", "e2e p99 ms", "ITL p50 ms", "ITL p99 ms", "floor p99 ms"}
	for _, out := range []string{md.String(), tab.String()} {
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("table lacks %q:\n%s", w, out)
			}
		}
	}
	var header, row string
	for _, l := range strings.Split(md.String(), "\n") {
		switch {
		case strings.HasPrefix(l, "| policy"):
			header = l
		case strings.HasPrefix(l, "| infergate"):
			row = l
		}
	}
	if header == "" || strings.Count(header, "|") != strings.Count(row, "|") {
		t.Errorf("header and row differ in cells:\n%s\n%s", header, row)
	}
	// TTFT 10, e2e 400, ITL 7 in that order.
	if !strings.Contains(row, "| infergate | 10.0 ±0.00 | 10.0 ±0.00 | 10.0 ±0.00 | 400 ±0.00 | 400 ±0.00 | 7.00 ±0.00 | 7.00 ±0.00 |") {
		t.Errorf("row cells: %s", row)
	}
}

func TestWriteGlance(t *testing.T) {
	pol := func(n string, ttft, e2e float64) Policy {
		return Policy{Name: n, TTFT: Quantiles{P99: Num(ttft)}, E2E: Quantiles{P99: Num(e2e)}}
	}
	reps := []Report{
		{Scenario: "a", Policies: []Policy{pol("round-robin", 1000, 9000), pol("gie-v1.5", 400, 5000), pol("infergate", 200, 6000)}},
		{Scenario: "b", Policies: []Policy{pol("round-robin", 100, 900)}},
	}
	var b strings.Builder
	if err := WriteGlance(&b, reps); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"P99 TTFT ms (round-robin / gie-v1.5 / infergate)",
		"| a | 1000 / 400 / 200 | 9000 / 5000 / 6000 | 0.50× / 1.20× |",
		"| b | 100 / — / — | 900 / — / — | — |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

// failAfter accepts n bytes, then fails every write: a full disk or a
// closed pipe under the report.
type failAfter struct{ n int }

var errWriteFailed = errors.New("write failed")

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) <= f.n {
		f.n -= len(p)
		return len(p), nil
	}
	n := f.n
	f.n = 0
	return n, errWriteFailed
}

// Every report writer returns the first failed write, whether it fails at
// the first byte or part way through (a report must not look written when
// it was cut).
func TestWritersReportWriteErrors(t *testing.T) {
	r := sample()
	writers := []struct {
		name  string
		write func(io.Writer) error
	}{
		{"WriteMarkdown", r.WriteMarkdown},
		{"WriteTable", r.WriteTable},
		{"WriteTargets", func(w io.Writer) error { return WriteTargets(w, []Report{r}) }},
		{"WriteGlance", func(w io.Writer) error { return WriteGlance(w, []Report{r}) }},
		{"WriteTTFTCDF", r.WriteTTFTCDF},
		{"WriteLoad", func(w io.Writer) error { return WriteLoad(w, "t", r.Policies[0].Runs()[0].Load) }},
		{"WriteJSON", r.WriteJSON},
	}
	for _, wr := range writers {
		var whole bytes.Buffer
		if err := wr.write(&whole); err != nil {
			t.Fatalf("%s: %v", wr.name, err)
		}
		for _, n := range []int{0, whole.Len() / 2, whole.Len() - 1} {
			if err := wr.write(&failAfter{n: n}); !errors.Is(err, errWriteFailed) {
				t.Errorf("%s failing after %d of %d bytes: err %v, want the write's error", wr.name, n, whole.Len(), err)
			}
		}
	}
}
