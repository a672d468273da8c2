// Package load is a load benchmark of one Tier 1 process: an open-loop
// generator sends 32 KB chat requests (≈8k tokens, distinct prompts with
// shared system prompts, streaming and not) at fixed arrival rates to
// fake model-server pods, alternately straight to a pod and through
// Tier 1, and reports the latency Tier 1 adds, the rate it delivers, and
// its CPU time per request and memory, read from its own process.
//
// The pods are cheap stand-ins for GPUs (see PodHandler): they answer at
// once, so the figures are Tier 1's own cost. Pods, Tier 1 and the
// generator run in three processes (see RunChild). docs/performance.md
// has the command and the figures.
package load

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/shared/cluster"
)

// Options configure a benchmark run. The zero value (plus Command) runs
// the defaults.
type Options struct {
	// Command re-executes this binary as a child (see RunChild): the
	// executable and the arguments that reach the code calling RunChild.
	Command []string
	// Rates are the arrival rates in requests per second; default 500,
	// 1000, 2000, 5000.
	Rates []float64
	// Duration is how long each path (direct, Tier 1) is loaded at each
	// rate, split into Rounds alternating phases; default 10s.
	Duration time.Duration
	// Rounds is how many direct/Tier 1 phase pairs each rate is split
	// into, alternating which goes first; default 2.
	Rounds int
	// Pods is the number of fake pods; default 100.
	Pods int
	// StreamPercent of requests stream (0..100); default 50. Negative
	// means none.
	StreamPercent int
	// Warmup loads both paths at the first rate, unrecorded, to open
	// connections; default 2s, negative skips it.
	Warmup time.Duration
	// Timeout bounds each request; default 10s.
	Timeout time.Duration
	// MaxInFlight requests per phase; arrivals beyond are dropped and
	// counted; default 5000 (the open-file limit is the bound).
	MaxInFlight int
	// CPUProfile, when set, is written with a CPU profile of the Tier 1
	// process taken over its phases at ProfileRate, and CPUProfile+".mutex"
	// with the lock contention sampled over the same time.
	CPUProfile string
	// ProfileRate is the rate profiled; default the highest.
	ProfileRate float64
	// Idle is how long Tier 1's CPU use is measured with no load before
	// the first rate (it scrapes the pods all the time); the per-request
	// CPU figures subtract it. Default 5s.
	Idle time.Duration
	// Settle is a pause after every phase, so that work a phase left
	// behind in Tier 1 (requests whose client already gave up) is not
	// counted in the next; default 1s, negative for none.
	Settle time.Duration
	// Progress, when set, gets a line per finished phase.
	Progress io.Writer
}

func (o *Options) defaults() {
	if len(o.Rates) == 0 {
		o.Rates = []float64{500, 1000, 2000, 5000}
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	if o.Rounds <= 0 {
		o.Rounds = 2
	}
	if o.Pods <= 0 {
		o.Pods = 100
	}
	switch {
	case o.StreamPercent == 0:
		o.StreamPercent = 50
	case o.StreamPercent < 0:
		o.StreamPercent = 0
	}
	if o.Warmup == 0 {
		o.Warmup = 2 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 5000
	}
	if o.Idle <= 0 {
		o.Idle = 5 * time.Second
	}
	if o.Settle == 0 {
		o.Settle = time.Second
	}
	if o.ProfileRate == 0 {
		for _, r := range o.Rates {
			o.ProfileRate = max(o.ProfileRate, r)
		}
	}
}

// Report is the whole run.
type Report struct {
	Start     time.Time
	Pods      int
	StreamPct int
	BodyBytes int
	Duration  time.Duration // per path per rate
	Rounds    int
	Rates     []RateResult
	PeakRSS   int64 // Tier 1's VmHWM at the end, bytes
	// IdleCores is Tier 1's CPU use with no load (scraping every pod),
	// in cores, measured for Options.Idle before the first rate.
	IdleCores   float64
	IdleRSS     int64   // Tier 1's VmRSS then, bytes
	Crossing    float64 // first rate whose p99 added latency > 5 ms; 0 if none
	ProfileFile string  `json:",omitempty"`
	ProfileRate float64 `json:",omitempty"`
}

// RateResult is one arrival rate, both paths.
type RateResult struct {
	Rate    float64
	LoadAvg [2]float64 // machine 1-minute load average before and after
	Direct  PathResult
	Tier1   PathResult
	// AddedP50 and AddedP99 are Tier 1 minus direct at each quantile.
	AddedP50, AddedP99 time.Duration
	// Tier1CPU is the Tier 1 process's CPU time during its phases;
	// Tier1IdleCPU is Report.IdleCores over the same wall time (what it
	// spends scraping the pods, load or not); the per-request figures
	// subtract it. DirectPhaseCPU is its CPU time during the direct
	// phases, for comparison with Tier1IdleCPU.
	Tier1CPU, Tier1IdleCPU, DirectPhaseCPU time.Duration
	// CPUPer1k is (Tier1CPU - Tier1IdleCPU) per 1,000 OK requests;
	// GrossCPUPer1k without subtracting the idle part.
	CPUPer1k, GrossCPUPer1k time.Duration
	// Cores is Tier 1's mean CPU use during its phases, in cores.
	Cores float64
	RSS   int64 // Tier 1's VmRSS after the rate, bytes
	// RecordsDropped is how many of the rate's requests Tier 1 did not
	// record in its prefix index because the record queue was full (the
	// CPU figures then leave that work out).
	RecordsDropped uint64
}

// PathResult sums the phases of one path at one rate.
type PathResult struct {
	Sent, OK, Dropped, Errors int
	Elapsed                   time.Duration
	Delivered                 float64 // OK per second of Elapsed
	MaxLag                    time.Duration
	Latency                   Dist
	FirstErr                  string `json:",omitempty"`
}

func (p *PathResult) add(r PhaseResult, lats *[]time.Duration) {
	p.Sent += r.Sent
	p.OK += r.OK
	p.Dropped += r.Dropped
	p.Errors += r.Errors
	p.Elapsed += r.Elapsed
	p.MaxLag = max(p.MaxLag, r.MaxLag)
	if p.FirstErr == "" {
		p.FirstErr = r.FirstErr
	}
	*lats = append(*lats, r.Latencies...)
}

// child is a running child process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func startChild(ctx context.Context, command []string, env ...string) (*child, string, error) {
	if len(command) == 0 {
		return nil, "", errors.New("load: Options.Command is empty")
	}
	cmd := exec.CommandContext(ctx, command[0], command[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("starting child: %w", err)
	}
	c := &child{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	c.out.Buffer(make([]byte, 64<<10), 1<<20)
	if !c.out.Scan() {
		c.stop()
		return nil, "", fmt.Errorf("child %v exited before it was ready", env)
	}
	return c, c.out.Text(), nil
}

// recordsDropped asks the Tier 1 child how many prefix-index records it
// dropped so far (its record queue was full).
func (c *child) recordsDropped() (uint64, error) {
	if _, err := fmt.Fprintln(c.stdin, "records-dropped"); err != nil {
		return 0, err
	}
	if !c.out.Scan() {
		return 0, errors.New("child exited")
	}
	n, ok := strings.CutPrefix(c.out.Text(), "ok ")
	if !ok {
		return 0, fmt.Errorf("child: %s", c.out.Text())
	}
	return strconv.ParseUint(n, 10, 64)
}

// command sends one protocol command and waits for its answer.
func (c *child) command(line string) error {
	if _, err := fmt.Fprintln(c.stdin, line); err != nil {
		return err
	}
	if !c.out.Scan() {
		return errors.New("child exited")
	}
	if ans := c.out.Text(); ans != "ok" {
		return fmt.Errorf("child: %s", ans)
	}
	return nil
}

func (c *child) stop() {
	_ = c.stdin.Close() // the child exits when its stdin closes; Wait below reports how it ended
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// Run runs the benchmark.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.defaults()
	if o.CPUProfile != "" && !slices.Contains(o.Rates, o.ProfileRate) {
		return nil, fmt.Errorf("load: profile rate %g is not one of the rates %v", o.ProfileRate, o.Rates)
	}
	rep := &Report{Start: time.Now().UTC(), Pods: o.Pods, StreamPct: o.StreamPercent, BodyBytes: BodyBytes,
		Duration: o.Duration, Rounds: o.Rounds}

	pods, line, err := startChild(ctx, o.Command, ChildEnv+"=pods", fmt.Sprintf("%s=%d", childPodsEnv, o.Pods))
	if err != nil {
		return nil, err
	}
	defer pods.stop()
	addrs := strings.Split(strings.TrimPrefix(line, "pods "), ",")
	if !strings.HasPrefix(line, "pods ") || len(addrs) != o.Pods {
		return nil, fmt.Errorf("pods child said %q", line)
	}

	dir, err := os.MkdirTemp("", "infergate-loadbench-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }() // a temporary directory; a leftover is harmless
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	token := hex.EncodeToString(tok)
	cfgPath := filepath.Join(dir, "tier1.yaml")
	if err := os.WriteFile(cfgPath, tier1Config(token, addrs), 0o600); err != nil {
		return nil, err
	}
	t1, line, err := startChild(ctx, o.Command, ChildEnv+"=tier1", childConfigEnv+"="+cfgPath)
	if err != nil {
		return nil, err
	}
	defer t1.stop()
	if !strings.HasPrefix(line, "tier1 ") {
		return nil, fmt.Errorf("tier1 child said %q", line)
	}
	t1URL := "http://" + strings.TrimPrefix(line, "tier1 ")
	pid := t1.cmd.Process.Pid

	if err := waitReady(ctx, t1URL, token, o.Pods); err != nil {
		return nil, err
	}

	bodies := NewBodies(1, o.StreamPercent)
	var seq atomic.Uint64
	directURLs := make([]string, len(addrs))
	for i, a := range addrs {
		directURLs[i] = "http://" + a + "/v1/chat/completions"
	}
	direct := phase{client: newClient(o.Timeout), urls: directURLs, bodies: bodies, seq: &seq, maxInFlight: o.MaxInFlight}
	via := phase{client: newClient(o.Timeout), urls: []string{t1URL + "/v1/chat/completions"}, token: token,
		bodies: bodies, seq: &seq, maxInFlight: o.MaxInFlight}

	if o.Warmup > 0 {
		for _, p := range []*phase{&direct, &via} {
			p.rate, p.dur = o.Rates[0], o.Warmup
			p.run(ctx)
		}
	}

	// Tier 1's own background cost: scraping every pod, no requests.
	c0, err := ProcCPU(pid)
	if err != nil {
		return nil, err
	}
	w0 := time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(o.Idle):
	}
	c1, err := ProcCPU(pid)
	if err != nil {
		return nil, err
	}
	rep.IdleCores = (c1 - c0).Seconds() / time.Since(w0).Seconds()
	if m, err := ReadProcMem(pid); err == nil {
		rep.IdleRSS = m.RSS
	}

	profiled := false
	dropped, err := t1.recordsDropped()
	if err != nil {
		return nil, err
	}
	for _, rate := range o.Rates {
		rr := RateResult{Rate: rate}
		rr.LoadAvg[0] = LoadAvg()
		var dl, tl []time.Duration
		var t1CPU, idleCPU time.Duration
		var t1Wall time.Duration
		profile := o.CPUProfile != "" && rate == o.ProfileRate && !profiled
		for round := 0; round < o.Rounds; round++ {
			order := []bool{false, true} // false: direct, true: via Tier 1
			if round%2 == 1 {
				order = []bool{true, false}
			}
			for _, viaT1 := range order {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				p := &direct
				if viaT1 {
					p = &via
				}
				p.rate, p.dur = rate, o.Duration/time.Duration(o.Rounds)
				if viaT1 && profile && round == 0 {
					// With alternating order, every Tier 1 phase of this
					// rate runs back to back from here when Rounds is 2.
					if err := t1.command("profile-start " + o.CPUProfile); err != nil {
						return nil, err
					}
				}
				c0, err := ProcCPU(pid)
				if err != nil {
					return nil, err
				}
				w0 := time.Now()
				res := p.run(ctx)
				wall := time.Since(w0)
				c1, err := ProcCPU(pid)
				if err != nil {
					return nil, err
				}
				if viaT1 {
					rr.Tier1.add(res, &tl)
					t1CPU += c1 - c0
					t1Wall += wall
				} else {
					rr.Direct.add(res, &dl)
					idleCPU += c1 - c0
				}
				if viaT1 && profile && round == o.Rounds-1 {
					if err := t1.command("profile-stop"); err != nil {
						return nil, err
					}
					profiled = true
					rep.ProfileFile, rep.ProfileRate = o.CPUProfile, rate
				}
				if o.Settle > 0 {
					select {
					case <-ctx.Done():
						return nil, ctx.Err()
					case <-time.After(o.Settle):
					}
				}
				if o.Progress != nil {
					name := "direct"
					if viaT1 {
						name = "tier1"
					}
					d := distOf(res.Latencies)
					// Progress only: a failed write to it must not stop the run.
					_, _ = fmt.Fprintf(o.Progress, "rate %g round %d %-6s sent %d ok %d dropped %d errors %d p50 %v p99 %v (load %.1f)\n",
						rate, round+1, name, res.Sent, res.OK, res.Dropped, res.Errors,
						d.P50.Round(10*time.Microsecond), d.P99.Round(10*time.Microsecond), LoadAvg())
				}
			}
		}
		rr.LoadAvg[1] = LoadAvg()
		finish := func(p *PathResult, lats []time.Duration) {
			p.Latency = distOf(lats)
			if p.Elapsed > 0 {
				p.Delivered = float64(p.OK) / p.Elapsed.Seconds()
			}
		}
		finish(&rr.Direct, dl)
		finish(&rr.Tier1, tl)
		rr.AddedP50 = rr.Tier1.Latency.P50 - rr.Direct.Latency.P50
		rr.AddedP99 = rr.Tier1.Latency.P99 - rr.Direct.Latency.P99
		rr.Tier1CPU = t1CPU
		rr.DirectPhaseCPU = idleCPU
		rr.Tier1IdleCPU = time.Duration(rep.IdleCores * float64(t1Wall))
		if rr.Tier1.OK > 0 {
			rr.GrossCPUPer1k = time.Duration(float64(t1CPU) * 1000 / float64(rr.Tier1.OK))
			rr.CPUPer1k = time.Duration(float64(max(t1CPU-rr.Tier1IdleCPU, 0)) * 1000 / float64(rr.Tier1.OK))
		}
		if t1Wall > 0 {
			rr.Cores = t1CPU.Seconds() / t1Wall.Seconds()
		}
		if m, err := ReadProcMem(pid); err == nil {
			rr.RSS = m.RSS
		}
		if d, err := t1.recordsDropped(); err == nil {
			rr.RecordsDropped, dropped = d-dropped, d
		}
		if rep.Crossing == 0 && rr.AddedP99 > 5*time.Millisecond {
			rep.Crossing = rate
		}
		rep.Rates = append(rep.Rates, rr)
	}
	if m, err := ReadProcMem(pid); err == nil {
		rep.PeakRSS = m.Peak
	}
	return rep, nil
}

// tier1Config is Tier 1's configuration for the run: one pool of every
// fake pod, the default scheduling profile, auth on.
func tier1Config(token string, addrs []string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:0\nauth: {tokens: [%q]}\nreload_interval: -1s\n", token)
	fmt.Fprintf(&b, "pools: [{name: bench, model: %q}]\npods:\n", Model)
	for i, a := range addrs {
		fmt.Fprintf(&b, "  - {name: pod-%03d, address: %q, pool: bench, engine: vllm}\n", i, a)
	}
	return []byte(b.String())
}

// waitReady waits until Tier 1 reports every pod ready.
func waitReady(ctx context.Context, base, token string, pods int) error {
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+cluster.LoadPath, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var s cluster.LoadSummary
			err = json.NewDecoder(resp.Body).Decode(&s)
			resp.Body.Close()
			if err == nil {
				if m := s.Models[Model]; m.ReadyPods == pods {
					return nil
				} else {
					last = fmt.Sprintf("%d of %d pods ready", m.ReadyPods, pods)
				}
			}
		}
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("tier1 not ready after 30s: %s", last)
}
