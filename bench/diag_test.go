package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/bench/scenario"
	"github.com/infergate/infergate/bench/trace"
	"github.com/infergate/infergate/bench/workload"
	"github.com/infergate/infergate/sim/engine"
	"github.com/infergate/infergate/tier1/picker"
)

// TestDiag prints the worst requests of one run with their floors, pod and
// cache state (DIAG=scenario:policy:seed, DIAGN=rows, DIAGPOD=1 for the
// prefix × pod matrix; a profile path must be absolute); skipped otherwise.
func TestDiag(t *testing.T) {
	spec := os.Getenv("DIAG")
	if spec == "" {
		t.Skip("DIAG not set")
	}
	parts := strings.Split(spec, ":")
	pol, err := ParsePolicy(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := strconv.ParseUint(parts[2], 10, 64)
	sc, st := diagStream(t, parts[0], seed)
	sp := RunSpeeds(nil, seed)
	floors, err := Floors(context.Background(), sc.Fleet, st, sp)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	causal, err := CausalFloors(context.Background(), sc.Fleet, st, floors, sp)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("causal floors in %v\n", time.Since(t0))
	s, err := newSim(context.Background(), Setup{Name: sc.Name, Fleet: sc.Fleet, Horizon: st.Duration + sc.Drain}, pol, seed, st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	type rec struct {
		i, pod                 int
		arr, disp, ttft        time.Duration
		cached, prompt         int
		waitQ, runQ, infl, kvu int
		floor, causal          float64
		key                    uint64
	}
	recs := make([]rec, len(st.Requests))
	prefixOf := map[uint64]int{}
	lastPod := map[int]int{}
	prevPod := make([]int, len(st.Requests))
	believed := make([]float64, len(st.Requests))
	s.onDispatch = func(i, pod int, now time.Duration) {
		e := s.pods[pod].eng.Stats()
		r := &recs[i]
		r.i, r.pod, r.disp = i, pod, now
		if want := os.Getenv("DIAGREQ"); want != "" && strings.Contains(","+want+",", ","+strconv.Itoa(i)+",") {
			res := &s.result
			fmt.Printf("request %d at %v → pod %d; scorers %v weights %v\n", i, now, pod, res.Scorers, res.Weights)
			for c, p := range res.Candidates {
				fmt.Printf("  %-12s total %.2f", p.Name, res.Total[c])
				for k := range res.Scorers {
					fmt.Printf(" %.2f", res.Scores[k][c])
				}
				fmt.Printf(" | W%d R%d kv%.2f infl%d inflPre%d uncached%d speed%.0f\n", p.Metrics.Waiting, p.Metrics.Running, p.Metrics.KVUsage, p.InFlight, p.InFlightPrefill, p.InFlightUncachedTokens, p.PrefillTokensPerSec)
			}
		}
		if ss := st.Requests[i].Session; ss >= 0 {
			if pp, ok := lastPod[ss]; ok {
				prevPod[i] = pp
			} else {
				prevPod[i] = -1
			}
			lastPod[ss] = pod
		}
		// What the prefix scorer believed the chosen pod holds.
		res := &s.result
		if k, c := slices.Index(res.Scorers, picker.ScorerPrefix), slices.Index(res.Candidates, s.pods[pod].view); k >= 0 && c >= 0 {
			believed[i] = res.Scores[k][c]
		}
		r.waitQ, r.runQ = e.Waiting, e.Running
		r.kvu = int(e.KVUsage * 100)
		r.infl = s.pods[pod].view.InFlight
		w := &st.Requests[i]
		r.arr = w.Arrival
		if len(w.BlockHashes) > 0 {
			r.key = w.BlockHashes[0]
		}
		if _, ok := prefixOf[r.key]; !ok {
			prefixOf[r.key] = len(prefixOf)
		}
	}
	s.onDone = func(i int, at time.Duration, res engine.Result) {
		r := &recs[i]
		r.ttft = res.FirstTokenAt - r.arr
		r.cached, r.prompt = res.CachedTokens, res.PromptTokens
		r.floor = floors[i]
		r.causal = causal[i]
	}
	out, err := s.run()
	if err != nil {
		t.Fatal(err)
	}
	if want := os.Getenv("DIAGREQ"); want != "" {
		for _, f := range strings.Split(want, ",") {
			i, _ := strconv.Atoi(f)
			hi := st.Requests[i].BlockHashes
			for j := 0; j < i; j++ {
				hj := st.Requests[j].BlockHashes
				n := 0
				for n < len(hi) && n < len(hj) && hi[n] == hj[n] {
					n++
				}
				if n > 32 {
					r := recs[j]
					fmt.Printf("  req %d shares %d/%d blocks with earlier %d: arr %.2fs disp %.2fs pod %d ttft %dms prompt %d cached %d\n", i, n, len(hi), j, r.arr.Seconds(), r.disp.Seconds(), r.pod, r.ttft.Milliseconds(), r.prompt, r.cached)
				}
			}
			r := recs[i]
			fmt.Printf("  req %d: arr %.2fs disp %.2fs pod %d ttft %dms prompt %d cached %d\n", i, r.arr.Seconds(), r.disp.Seconds(), r.pod, r.ttft.Milliseconds(), r.prompt, r.cached)
		}
	}
	if at := os.Getenv("DIAGAT"); at != "" {
		for _, f := range strings.Split(at, ",") {
			t0, _ := time.ParseDuration(f)
			for _, r := range recs {
				if r.arr >= t0-3*time.Second && r.arr <= t0+3*time.Second {
					fmt.Printf("  at %v: i=%d arr %.2fs disp %.2fs pod %d ttft %dms floor %.0f prompt %d cached %d\n", t0, r.i, r.arr.Seconds(), r.disp.Seconds(), r.pod, r.ttft.Milliseconds(), r.floor, r.prompt, r.cached)
				}
			}
		}
	}
	{
		fh, fhTail := 0, 0
		var ts []float64
		for _, r := range recs {
			ts = append(ts, float64(r.ttft.Milliseconds()))
		}
		sort.Float64s(ts)
		p99 := ts[int(0.99*float64(len(ts)-1))]
		for i, r := range recs {
			if r.prompt > 0 && believed[i] >= 0.5 && float64(r.cached) < 0.2*float64(r.prompt) {
				fh++
				if float64(r.ttft.Milliseconds()) >= p99 {
					fhTail++
				}
			}
		}
		fmt.Printf("false hits (prefix score >= 0.5 on the chosen pod, < 20%% cached): %d, %d of them at or above p99 %.0f\n", fh, fhTail, p99)
	}
	for _, cls := range []struct {
		name string
		keep func(w workload.Request) bool
	}{
		{"critical", func(w workload.Request) bool { return w.Priority > 0 }},
		{"standard", func(w workload.Request) bool { return w.Priority == 0 && !w.Sheddable }},
		{"sheddable", func(w workload.Request) bool { return w.Sheddable }},
	} {
		var a, f []float64
		for i, r := range recs {
			if cls.keep(st.Requests[i]) && r.ttft > 0 {
				a = append(a, float64(r.ttft.Milliseconds()))
				f = append(f, r.floor)
			}
		}
		if len(a) == 0 {
			continue
		}
		sort.Float64s(a)
		sort.Float64s(f)
		k := int(0.99 * float64(len(a)-1))
		fmt.Printf("class %s: n=%d p99 %.0f floor p99 %.0f\n", cls.name, len(a), a[k], f[k])
	}
	below := 0
	for _, r := range recs {
		if r.ttft > 0 && float64(r.ttft.Milliseconds()) < 0.95*r.causal-1 {
			below++
			if os.Getenv("DIAGBELOW") != "" {
				fmt.Printf("below: i=%d ttft=%dms floor=%.1f causal=%.1f prompt=%d cached=%d pod=%d\n", r.i, r.ttft.Milliseconds(), r.floor, r.causal, r.prompt, r.cached, r.pod)
			}
		}
	}
	fmt.Printf("requests more than 5%% below their causal floor: %d\n", below)
	idx := make([]int, len(recs))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return recs[idx[a]].ttft > recs[idx[b]].ttft })
	n := 40
	if v := os.Getenv("DIAGN"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	fmt.Printf("completed %d, p99 rank %d\n", out.Completed, len(recs)/100)
	for _, cut := range []time.Duration{0, 30 * time.Second, 60 * time.Second} {
		var a, f, c []float64
		for _, r := range recs {
			if r.arr >= cut {
				a = append(a, float64(r.ttft.Milliseconds()))
				f = append(f, r.floor)
				c = append(c, r.causal)
			}
		}
		sort.Float64s(a)
		sort.Float64s(f)
		sort.Float64s(c)
		k := int(0.99 * float64(len(a)-1))
		fmt.Printf("arrivals after %v: n=%d p99 %.0f floor p99 %.0f causal p99 %.0f\n", cut, len(a), a[k], f[k], c[k])
	}
	for _, i := range idx[:min(n, len(idx))] {
		r := recs[i]
		fmt.Printf("i=%4d arr=%7.2fs q=%5dms pod=%d ttft=%5dms floor=%5.0f causal=%5.0f prompt=%5d cached=%5d grp=%2d sess=%d prev=%d engW=%d engR=%d infl=%d kv=%d%% prio=%d shed=%v\n",
			r.i, r.arr.Seconds(), (r.disp - r.arr).Milliseconds(), r.pod, r.ttft.Milliseconds(), r.floor, r.causal, r.prompt, r.cached, prefixOf[r.key], st.Requests[i].Session, prevPod[i], r.waitQ, r.runQ, r.infl, r.kvu, st.Requests[i].Priority, st.Requests[i].Sheddable)
	}
	if os.Getenv("DIAGPOD") != "" {
		// pod-by-prefix matrix
		cnt := map[[2]int]int{}
		for _, r := range recs {
			cnt[[2]int{prefixOf[r.key], r.pod}]++
		}
		for g := 0; g < 20; g++ {
			fmt.Printf("grp %2d:", g)
			for p := range s.pods {
				fmt.Printf(" %4d", cnt[[2]int{g, p}])
			}
			fmt.Println()
		}
	}
}

// diagStream is DIAG's stream: a scenario's for seed, or, for
// path.jsonl@start, ten minutes of the trace from start on the bench's
// default trace fleet (4 H100 + 4 A10G, Llama-3.1-8B), drained for ten
// minutes (skipped when the file is absent).
func diagStream(t *testing.T, src string, seed uint64) (scenario.Scenario, workload.Stream) {
	t.Helper()
	path, at, isTrace := strings.Cut(src, "@")
	if !isTrace {
		sc, err := scenario.Get(src)
		if err != nil {
			t.Fatal(err)
		}
		return sc, sc.Stream(seed)
	}
	opts := trace.Options{Duration: 10 * time.Minute, RateScale: 1}
	var err error
	if a, r, ok := strings.Cut(at, "*"); ok {
		at = a
		if opts.RateScale, err = strconv.ParseFloat(r, 64); err != nil {
			t.Fatal(err)
		}
	}
	if opts.Start, err = time.ParseDuration(at); err != nil {
		t.Fatal(err)
	}
	if v := os.Getenv("DIAGDUR"); v != "" {
		if opts.Duration, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	sc := scenario.Scenario{Name: "trace", Drain: 10 * time.Minute}
	var st workload.Stream
	sc.Fleet, st = traceOnDefaultFleet(t, path, opts)
	return sc, st
}
