package load

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// TestRunCompareTiny runs the CPU comparison (pods, bare proxy, both tiers
// in children of this test binary) at a tiny rate, one short round: every
// path answers every request, every window and the idle window read the
// processes' CPU, and there is a row per path (the arithmetic is
// TestCompareRowsNet's). No timing or ratio is asserted.
func TestRunCompareTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four processes and loads them for seconds")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	rep, err := RunCompare(context.Background(), CompareOptions{
		Command: []string{exe}, Rates: []float64{20}, Window: time.Second, Rounds: 1, Pods: 4,
		Warmup: -1, Settle: -1, Idle: 500 * time.Millisecond, Progress: &progress, LogLevel: "warn",
		Paths: []string{PathBare, PathTier1, PathTier2, PathTier1Slow},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(progress.String())
	if len(rep.Windows) != 4 || len(rep.Idle) != 1 || len(rep.Rows) != 4 {
		t.Fatalf("got %d windows, %d idle windows, %d rows; want 4, 1, 4", len(rep.Windows), len(rep.Idle), len(rep.Rows))
	}
	for _, w := range rep.Windows {
		if w.OK != w.Sent || w.OK != 20 || w.Errors+w.Dropped != 0 {
			t.Errorf("%s: sent %d ok %d errors %d dropped %d (first error %q), want 20 ok", w.Path, w.Sent, w.OK, w.Errors, w.Dropped, w.FirstErr)
		}
		// CPU is read in clock ticks (10 ms): a second at 20 req/s may
		// read as none, so only the readings are checked here.
		if len(w.CPU) != 6 || w.Span < w.Wall {
			t.Errorf("%s: CPU read %v, span %v, wall %v", w.Path, w.CPU, w.Span, w.Wall)
		}
	}
	if c := rep.Idle[0].Cores; len(c) != 6 {
		t.Errorf("idle window read %v, want pods, bare, tier1, tier2, tier1-1s and generator", c)
	}
	for i, path := range []string{PathBare, PathTier1, PathTier2, PathTier1Slow} {
		if r := rep.Rows[i]; r.Path != path || r.Rate != 20 || r.Errors != 0 {
			t.Errorf("row %d: %s at %g req/s, %d errors; want %s, 20, 0", i, r.Path, r.Rate, r.Errors, path)
		}
	}
	var md strings.Builder
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| tier1 | 20 |") || !strings.Contains(md.String(), "| tier1-1s | 20 |") || !strings.Contains(md.String(), "No-load cores") {
		t.Errorf("markdown lacks the tier1 row or the no-load note:\n%s", md.String())
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Error(err)
	}
}

// TestCompareRowsNet checks the net figures: each window less its
// process's no-load use (same round) over the window's span.
func TestCompareRowsNet(t *testing.T) {
	ms := time.Millisecond
	ws := []Window{
		{Path: PathBare, Rate: 100, Round: 1, OK: 1000, Span: 10 * time.Second, PerRequest: 500 * time.Microsecond,
			CPU: map[string]time.Duration{PathBare: 500 * ms}},
		{Path: PathTier1, Rate: 100, Round: 1, OK: 1000, Span: 10 * time.Second, PerRequest: 900 * time.Microsecond,
			CPU: map[string]time.Duration{PathTier1: 900 * ms}},
	}
	idle := []IdleWindow{{Rate: 100, Round: 1, Span: 5 * time.Second, Cores: map[string]float64{PathBare: 0, PathTier1: 0.03}}}
	rows := compareRows(ws, idle, []string{PathBare, PathTier1}, []float64{100})
	if len(rows) != 2 {
		t.Fatalf("got %d rows", len(rows))
	}
	for _, tc := range []struct {
		row             CompareRow
		ratio, netRatio float64
		net             time.Duration
		noLoad          float64
	}{
		{rows[0], 1, 1, 500 * time.Microsecond, 0},
		// 900 ms less 0.03 cores × 10 s = 600 ms over 1000 requests.
		{rows[1], 1.8, 1.2, 600 * time.Microsecond, 0.03},
	} {
		r := tc.row
		if r.Ratio != tc.ratio || r.NetPerRequest != tc.net || r.NoLoadCores != tc.noLoad ||
			r.NetRatio < tc.netRatio-1e-9 || r.NetRatio > tc.netRatio+1e-9 {
			t.Errorf("%s: ratio %g net %v net ratio %g no-load %g; want %g, %v, %g, %g",
				r.Path, r.Ratio, r.NetPerRequest, r.NetRatio, r.NoLoadCores, tc.ratio, tc.net, tc.netRatio, tc.noLoad)
		}
	}
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %g, want %g", tc.in, got, tc.want)
		}
	}
	// Without idle windows there are no net figures.
	if r := compareRows(ws, nil, []string{PathTier1}, []float64{100})[0]; r.NetPerRequest != 0 || r.NetRatio != 0 {
		t.Errorf("no idle windows: net %v, net ratio %g", r.NetPerRequest, r.NetRatio)
	}
}
