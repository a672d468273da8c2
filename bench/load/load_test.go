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

// TestMain lets the benchmark re-execute this test binary as its pods and
// Tier 1 children.
func TestMain(m *testing.M) {
	if IsChild() {
		if err := RunChild(context.Background(), os.Stdin, os.Stdout, os.Stderr); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRunTiny runs the whole benchmark (three processes) at a tiny rate
// for about two seconds: it checks that every request succeeds on both
// paths and that Tier 1's CPU, memory and profile were read. No timing
// is asserted.
func TestRunTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes and loads them for seconds")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	prof := t.TempDir() + "/tier1.pprof"
	var progress bytes.Buffer
	rep, err := Run(context.Background(), Options{
		Command:     []string{exe},
		Rates:       []float64{20, 40},
		Duration:    time.Second,
		Pods:        10,
		Warmup:      -1,
		Idle:        200 * time.Millisecond,
		Settle:      -1,
		CPUProfile:  prof,
		Progress:    &progress,
		MaxInFlight: 1000,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(progress.String())
	if len(rep.Rates) != 2 {
		t.Fatalf("got %d rates, want 2", len(rep.Rates))
	}
	for _, r := range rep.Rates {
		for name, p := range map[string]PathResult{"direct": r.Direct, "tier1": r.Tier1} {
			want := int(r.Rate * rep.Duration.Seconds())
			if p.Sent != want || p.OK != want || p.Errors != 0 || p.Dropped != 0 {
				t.Errorf("rate %g %s: sent %d ok %d errors %d dropped %d, want %d ok (first error %q)",
					r.Rate, name, p.Sent, p.OK, p.Errors, p.Dropped, want, p.FirstErr)
			}
			if p.Latency.N != p.OK || p.Latency.P50 <= 0 || p.Latency.P99 < p.Latency.P50 {
				t.Errorf("rate %g %s: latency %+v", r.Rate, name, p.Latency)
			}
		}
		if r.RSS <= 0 {
			t.Errorf("rate %g: Tier 1 RSS not read", r.Rate)
		}
	}
	if rep.PeakRSS <= 0 {
		t.Error("Tier 1 peak RSS not read")
	}
	for _, f := range []string{prof, prof + ".mutex"} {
		if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
			t.Errorf("profile %s not written: %v", f, err)
		}
	}
	var md strings.Builder
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| 40 |") {
		t.Errorf("markdown lacks the 40 req/s row:\n%s", md.String())
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Error(err)
	}
}

// TestBodies checks the request bodies: exact size, distinct prompts,
// shared system prompts, the stream mix, and valid JSON.
func TestBodies(t *testing.T) {
	b := NewBodies(1, 50)
	seen := map[string]bool{}
	streams := 0
	systems := map[string]bool{}
	for i := uint64(0); i < 200; i++ {
		body, stream := b.Body(i)
		if len(body) != BodyBytes {
			t.Fatalf("body %d: %d bytes, want %d", i, len(body), BodyBytes)
		}
		var req struct {
			Model    string `json:"model"`
			Stream   bool   `json:"stream"`
			Messages []struct {
				Role, Content string
			} `json:"messages"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			t.Fatalf("body %d: %v", i, err)
		}
		if req.Model != Model || req.Stream != stream || len(req.Messages) != 2 {
			t.Fatalf("body %d: model %q stream %v/%v, %d messages", i, req.Model, req.Stream, stream, len(req.Messages))
		}
		if seen[req.Messages[1].Content] {
			t.Fatalf("body %d repeats a user prompt", i)
		}
		seen[req.Messages[1].Content] = true
		systems[req.Messages[0].Content] = true
		if stream {
			streams++
		}
	}
	if streams != 100 {
		t.Errorf("%d of 200 stream, want 100", streams)
	}
	if len(systems) < 2 || len(systems) > sharedSys {
		t.Errorf("%d distinct system prompts, want 2..%d", len(systems), sharedSys)
	}
}
