package load

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// This file is the CPU comparison: CPU time per request of Tier 1 and of
// Tier 2 beside a bare httputil.ReverseProxy (BareProxy) forwarding the
// same requests to the same fake pods, side by side in one run. Each path
// is its own process, so its CPU is read from /proc apart from the load
// generator's (this process) and the pods':
//
//	bare:  generator → bare proxy → pods
//	tier1: generator → infergate tier1 → pods
//	tier2: generator → infergate tier2 → bare proxy → pods
//
// For the tier2 path the figure is the Tier 2 process's CPU (the bare
// proxy behind it is measured too, as a check that it costs what it costs
// on its own path). Windows of every path alternate at each rate, the
// order rotating each round, so that drifting machine load falls on every
// path alike.

// Paths the comparison knows, in their default order.
const (
	PathBare  = "bare"
	PathTier1 = "tier1"
	PathTier2 = "tier2"
	// PathTier1Slow is Tier 1 as on its path but scraping every pod every
	// second (scrape.interval 1s, and scheduler.stale_after 3s so that
	// no pod's metrics go stale between scrapes), not every 50 ms:
	// measured beside tier1, the difference is what 50 ms scraping costs
	// under load. A diagnostic, not in the default paths.
	PathTier1Slow = "tier1-1s"
)

// tierOf is the infergate subcommand (or lab child role) that serves path.
func tierOf(path string) string {
	if path == PathTier1Slow {
		return PathTier1
	}
	return path
}

// CompareOptions configure RunCompare. The zero value (plus Command and
// Infergate) runs the figures: 300 and 600 req/s, 20 s windows, 2
// rounds, 16 pods, half of the requests streamed.
type CompareOptions struct {
	// Command re-executes this binary as a child (pods, bare proxy; the
	// tiers too when Infergate is empty): see RunChild.
	Command []string
	// Infergate is the production binary (cmd/infergate) run as
	// `infergate tier1` and `infergate tier2`. Empty runs both tiers in
	// children of Command built the same way (tier1/server,
	// tier2/server), which is what CPUProfile needs.
	Infergate string
	// LogLevel of the infergate processes; default info (their default).
	LogLevel string
	// Paths to measure, a subset of bare, tier1, tier2, tier1-1s; default
	// bare, tier1, tier2. The bare proxy always runs (Tier 2 forwards to
	// it).
	Paths []string
	// Rates in requests per second; default 300, 600.
	Rates []float64
	// Window is how long one path is loaded at a time; default 20s.
	Window time.Duration
	// Rounds of windows per rate, every path once a round; default 2.
	Rounds int
	// Pods is the number of fake pods; default 16.
	Pods int
	// StreamPercent of requests stream; default 50, negative none.
	StreamPercent int
	// Warmup loads every path, unrecorded, before each rate; default
	// 3s, negative none.
	Warmup time.Duration
	// Settle is a pause after every window; default 1s, negative none.
	Settle time.Duration
	// Idle is a window with no load at the start of every round, to read
	// each process's CPU use without requests (Tier 1 still scrapes: the
	// fake pods report a running request, so they are busy and scraped
	// every interval, as under load); default 5s, negative none.
	Idle time.Duration
	// Timeout bounds each request; default 10s.
	Timeout time.Duration
	// MaxInFlight requests per window; default 5000.
	MaxInFlight int
	// CPUProfile, when set (Infergate empty), is a file name prefix: each
	// window of a profiled process at ProfileRate writes
	// PREFIX-PATH-RATE-ROUND.pprof (and .mutex, .allocs: see RunChild).
	CPUProfile string
	// ProfileRate is the rate profiled; default the highest.
	ProfileRate float64
	// Progress, when set, gets a line per window.
	Progress io.Writer
}

func (o *CompareOptions) defaults() {
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	if len(o.Paths) == 0 {
		o.Paths = []string{PathBare, PathTier1, PathTier2}
	}
	if len(o.Rates) == 0 {
		o.Rates = []float64{300, 600}
	}
	if o.Window <= 0 {
		o.Window = 20 * time.Second
	}
	if o.Rounds <= 0 {
		o.Rounds = 2
	}
	if o.Pods <= 0 {
		o.Pods = 16
	}
	switch {
	case o.StreamPercent == 0:
		o.StreamPercent = 50
	case o.StreamPercent < 0:
		o.StreamPercent = 0
	}
	if o.Warmup == 0 {
		o.Warmup = 3 * time.Second
	}
	if o.Settle == 0 {
		o.Settle = time.Second
	}
	if o.Idle == 0 {
		o.Idle = 5 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 5000
	}
	if o.ProfileRate == 0 {
		for _, r := range o.Rates {
			o.ProfileRate = max(o.ProfileRate, r)
		}
	}
}

// CompareReport is a whole comparison run.
type CompareReport struct {
	Start         time.Time
	Binary        string // the infergate binary, or "in-process children"
	Pods          int
	StreamPct     int
	BodyBytes     int
	Window        time.Duration
	Rounds        int
	Windows       []Window
	Idle          []IdleWindow `json:",omitempty"`
	Rows          []CompareRow
	Profiles      []string `json:",omitempty"`
	LoadAvgBefore float64
	LoadAvgAfter  float64
}

// Window is one path loaded at one rate for one window.
type Window struct {
	Path      string
	Rate      float64
	Round     int
	Sent, OK  int
	Errors    int
	Dropped   int
	FirstErr  string        `json:",omitempty"`
	Wall      time.Duration // the window, first send to last response
	Delivered float64       // OK per second of Wall
	Latency   Dist
	LoadAvg   float64 // machine 1-minute load average after the window
	// CPU is the CPU time every process used during the window: bare,
	// tier1, tier2 (those running), pods and generator (this process).
	CPU map[string]time.Duration
	// Span is the time between the two CPU readings around the window.
	Span time.Duration
	// PerRequest is the path's own process's CPU per OK request (for
	// tier2: the Tier 2 process, not the bare proxy behind it).
	PerRequest time.Duration
	// BehindPerRequest is, for tier2, the bare proxy's CPU per request.
	BehindPerRequest time.Duration `json:",omitempty"`
}

// IdleWindow is a window with no load, at the start of a round.
type IdleWindow struct {
	Rate  float64
	Round int
	Span  time.Duration
	// Cores is each process's CPU time over Span, in cores: what it
	// spends with no requests (Tier 1: scraping the pods).
	Cores map[string]float64
}

// CompareRow summarises one path at one rate over its rounds.
type CompareRow struct {
	Path string
	Rate float64
	// PerRequest is the lowest and highest CPU per request over the
	// rounds; Mean over all of them (total CPU / total OK).
	PerRequestMin, PerRequestMax, PerRequestMean time.Duration
	// Ratio is Mean over the bare proxy's Mean at the same rate;
	// RatioMin, RatioMedian and RatioMax pair each round with the bare
	// window of the same round (with many short rounds the median is the
	// figure least moved by the machine's drift).
	Ratio, RatioMin, RatioMedian, RatioMax float64
	// BehindPerRequest: for tier2, the bare proxy behind it, mean.
	BehindPerRequest time.Duration `json:",omitempty"`
	// NoLoadCores is the path's process's mean CPU use in the rounds'
	// idle windows; NetPerRequest is PerRequestMean less that use over
	// the path's windows, and NetRatio its ratio to the bare proxy's
	// (zero without idle windows). Net figures are a decomposition, not
	// the goal: under load the background work shares wake-ups with
	// requests and may cost less than alone.
	NoLoadCores   float64       `json:",omitempty"`
	NetPerRequest time.Duration `json:",omitempty"`
	NetRatio      float64       `json:",omitempty"`
	Delivered     float64       // mean over the rounds, req/s
	Errors        int           // errors + dropped over the rounds
}

// process is one process of the comparison whose CPU is read.
type process struct {
	name string
	pid  int
	lab  *child    // a child of Command (commands: profiling)
	real *exec.Cmd // an infergate process
	log  string    // where a real process's stderr goes
}

func (p *process) stop() {
	if p.lab != nil {
		p.lab.stop()
		return
	}
	// SIGTERM lets it shut down as in production; a process that
	// ignores it is killed.
	if err := p.real.Process.Signal(syscall.SIGTERM); err != nil {
		// Already gone: Wait reports how.
		_ = p.real.Process.Kill() // best effort; Wait below returns either way
	}
	done := make(chan struct{})
	go func() {
		// Its exit status after SIGTERM says nothing about the run.
		_ = p.real.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.real.Process.Kill() // stuck in shutdown; Wait returns once it is dead
		<-done
	}
}

// startReal starts `infergate SUB --config cfg …` and waits for its
// "listening on ADDR" line.
func startReal(ctx context.Context, bin, sub, cfg, logLevel, logPath string, extra ...string) (*process, string, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = logf.Close() }() // the child holds its own descriptor and writes through it
	args := append([]string{sub, "--config", cfg, "--log-level", logLevel}, extra...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("starting %s %s: %w", bin, sub, err)
	}
	p := &process{name: sub, pid: cmd.Process.Pid, real: cmd, log: logPath}
	sc := bufio.NewScanner(out)
	prefix := "infergate " + sub + " listening on "
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			// Nothing more is read from its stdout: drain it so that a
			// later line cannot block the process.
			go func() { _, _ = io.Copy(io.Discard, out) }() // ends with the process
			return p, addr, nil
		}
	}
	p.stop()
	tail, _ := os.ReadFile(logPath) // best effort: the error below stands either way
	if len(tail) > 2000 {
		tail = tail[len(tail)-2000:]
	}
	return nil, "", fmt.Errorf("%s %s exited before listening: %s", bin, sub, tail)
}

// startLab starts a child of Command in role and reads its "ROLE ADDR"
// line.
func startLab(ctx context.Context, command []string, role string, env ...string) (*process, string, error) {
	c, line, err := startChild(ctx, command, append([]string{ChildEnv + "=" + role}, env...)...)
	if err != nil {
		return nil, "", err
	}
	addr, ok := strings.CutPrefix(line, role+" ")
	if !ok {
		c.stop()
		return nil, "", fmt.Errorf("%s child said %q", role, line)
	}
	return &process{name: role, pid: c.cmd.Process.Pid, lab: c}, addr, nil
}

// RunCompare runs the CPU comparison.
func RunCompare(ctx context.Context, o CompareOptions) (*CompareReport, error) {
	o.defaults()
	for _, p := range o.Paths {
		if p != PathBare && p != PathTier1 && p != PathTier2 && p != PathTier1Slow {
			return nil, fmt.Errorf("load: unknown path %q (want bare, tier1, tier2, tier1-1s)", p)
		}
	}
	if o.CPUProfile != "" && o.Infergate != "" {
		return nil, errors.New("load: CPU profiles need the tiers in children (no infergate binary)")
	}
	if o.CPUProfile != "" && !slices.Contains(o.Rates, o.ProfileRate) {
		return nil, fmt.Errorf("load: profile rate %g is not one of the rates %v", o.ProfileRate, o.Rates)
	}
	rep := &CompareReport{Start: time.Now().UTC(), Binary: o.Infergate, Pods: o.Pods, StreamPct: o.StreamPercent,
		BodyBytes: BodyBytes, Window: o.Window, Rounds: o.Rounds, LoadAvgBefore: LoadAvg()}
	if rep.Binary == "" {
		rep.Binary = "in-process children"
	}

	dir, err := os.MkdirTemp("", "infergate-loadbench-cpu-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }() // a temporary directory; a leftover is harmless

	pods, line, err := startChild(ctx, o.Command, ChildEnv+"=pods", fmt.Sprintf("%s=%d", childPodsEnv, o.Pods))
	if err != nil {
		return nil, err
	}
	defer pods.stop()
	addrs := strings.Split(strings.TrimPrefix(line, "pods "), ",")
	if !strings.HasPrefix(line, "pods ") || len(addrs) != o.Pods {
		return nil, fmt.Errorf("pods child said %q", line)
	}
	procs := map[string]*process{"pods": {name: "pods", pid: pods.cmd.Process.Pid}}

	bare, bareAddr, err := startLab(ctx, o.Command, PathBare, childAddrsEnv+"="+strings.Join(addrs, ","))
	if err != nil {
		return nil, err
	}
	defer bare.stop()
	procs[PathBare] = bare

	secret := func(prefix string) string {
		b := make([]byte, 16)
		_, _ = rand.Read(b) // never fails (crypto/rand documents it)
		return prefix + hex.EncodeToString(b)
	}
	t1Token, apiKey := secret(""), secret("sk-bench-")
	urls := map[string]string{PathBare: "http://" + bareAddr + "/v1/chat/completions"}
	tokens := map[string]string{}
	start := func(path string, cfg []byte) error {
		cfgPath := filepath.Join(dir, path+".yaml")
		if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
			return err
		}
		var p *process
		var addr string
		var err error
		if o.Infergate != "" {
			p, addr, err = startReal(ctx, o.Infergate, tierOf(path), cfgPath, o.LogLevel, filepath.Join(dir, path+".log"), "--listen", "127.0.0.1:0")
		} else {
			p, addr, err = startLab(ctx, o.Command, tierOf(path), childConfigEnv+"="+cfgPath)
		}
		if err != nil {
			return err
		}
		procs[path] = p
		urls[path] = "http://" + addr + "/v1/chat/completions"
		return nil
	}
	defer func() {
		for _, name := range []string{PathTier1, PathTier2, PathTier1Slow} {
			if p := procs[name]; p != nil {
				p.stop()
			}
		}
	}()
	for _, t1 := range []struct{ path, extra string }{
		{PathTier1, ""},
		{PathTier1Slow, "scrape: {interval: 1s}\nscheduler: {stale_after: 3s}\n"},
	} {
		path, extra := t1.path, t1.extra
		if !slices.Contains(o.Paths, path) {
			continue
		}
		cfg := tier1Config(t1Token, addrs)
		cfg = append(cfg, "metrics_listen: 127.0.0.1:0\n"+extra...)
		if err := start(path, cfg); err != nil {
			return nil, err
		}
		tokens[path] = t1Token
		if err := waitReady(ctx, strings.TrimSuffix(urls[path], "/v1/chat/completions"), t1Token, o.Pods); err != nil {
			return nil, err
		}
	}
	if slices.Contains(o.Paths, PathTier2) {
		if err := start(PathTier2, tier2Config(t1Token, apiKey, "http://"+bareAddr)); err != nil {
			return nil, err
		}
		tokens[PathTier2] = apiKey
	}

	bodies := NewBodies(1, o.StreamPercent)
	var seq atomic.Uint64
	phases := map[string]*phase{}
	for _, path := range o.Paths {
		phases[path] = &phase{client: newClient(o.Timeout), urls: []string{urls[path]}, token: tokens[path],
			bodies: bodies, seq: &seq, maxInFlight: o.MaxInFlight}
	}
	self := os.Getpid()
	names := []string{"pods", PathBare, PathTier1, PathTier2, PathTier1Slow}
	cpuAll := func() (map[string]time.Duration, error) {
		m := map[string]time.Duration{}
		for _, n := range names {
			if p := procs[n]; p != nil {
				c, err := ProcCPU(p.pid)
				if err != nil {
					return nil, err
				}
				m[n] = c
			}
		}
		c, err := ProcCPU(self)
		if err != nil {
			return nil, err
		}
		m["generator"] = c
		return m, nil
	}
	pause := func(d time.Duration) error {
		if d <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}

	for _, rate := range o.Rates {
		if o.Warmup > 0 {
			for _, path := range o.Paths {
				p := phases[path]
				p.rate, p.dur = rate, o.Warmup
				if res := p.run(ctx); res.OK == 0 {
					return nil, fmt.Errorf("warm-up of %s at %g req/s: no request succeeded (%d sent): %s", path, rate, res.Sent, res.FirstErr)
				}
				if err := pause(o.Settle); err != nil {
					return nil, err
				}
			}
		}
		for round := 0; round < o.Rounds; round++ {
			if o.Idle > 0 {
				t0 := time.Now()
				c0, err := cpuAll()
				if err != nil {
					return nil, err
				}
				if err := pause(o.Idle); err != nil {
					return nil, err
				}
				c1, err := cpuAll()
				if err != nil {
					return nil, err
				}
				iw := IdleWindow{Rate: rate, Round: round + 1, Span: time.Since(t0), Cores: map[string]float64{}}
				for n, c := range c1 {
					iw.Cores[n] = (c - c0[n]).Seconds() / iw.Span.Seconds()
				}
				rep.Idle = append(rep.Idle, iw)
				if o.Progress != nil {
					var cores []string
					for _, n := range names {
						if procs[n] != nil {
							cores = append(cores, fmt.Sprintf("%s %.3f", n, iw.Cores[n]))
						}
					}
					// Progress only: a failed write to it must not stop the run.
					_, _ = fmt.Fprintf(o.Progress, "rate %g round %d no load for %v: %s cores\n",
						rate, round+1, o.Idle, strings.Join(cores, ", "))
				}
			}
			for i := range o.Paths {
				// Rotate the order each round: every path follows every
				// other once in a while.
				path := o.Paths[(i+round)%len(o.Paths)]
				p := phases[path]
				p.rate, p.dur = rate, o.Window
				var prof string
				if o.CPUProfile != "" && rate == o.ProfileRate {
					prof = fmt.Sprintf("%s-%s-%g-%d.pprof", o.CPUProfile, path, rate, round+1)
					if err := procs[path].lab.command("profile-start " + prof); err != nil {
						return nil, err
					}
				}
				t0 := time.Now()
				c0, err := cpuAll()
				if err != nil {
					return nil, err
				}
				res := p.run(ctx)
				c1, err := cpuAll()
				span := time.Since(t0)
				if err != nil {
					return nil, err
				}
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				if prof != "" {
					if err := procs[path].lab.command("profile-stop"); err != nil {
						return nil, err
					}
					rep.Profiles = append(rep.Profiles, prof)
				}
				w := Window{Path: path, Rate: rate, Round: round + 1, Sent: res.Sent, OK: res.OK, Errors: res.Errors,
					Dropped: res.Dropped, FirstErr: res.FirstErr, Wall: res.Elapsed, Latency: distOf(res.Latencies),
					LoadAvg: LoadAvg(), CPU: map[string]time.Duration{}, Span: span}
				for n, c := range c1 {
					w.CPU[n] = c - c0[n]
				}
				if w.Wall > 0 {
					w.Delivered = float64(w.OK) / w.Wall.Seconds()
				}
				if w.OK > 0 {
					w.PerRequest = w.CPU[path] / time.Duration(w.OK)
					if path == PathTier2 {
						w.BehindPerRequest = w.CPU[PathBare] / time.Duration(w.OK)
					}
				}
				rep.Windows = append(rep.Windows, w)
				if o.Progress != nil {
					// Progress only: a failed write to it must not stop the run.
					_, _ = fmt.Fprintf(o.Progress, "rate %g round %d %-5s ok %d/%d errors %d dropped %d: %.3f ms CPU per request (pods %.3f, generator %.3f), p50 %v p99 %v, load %.1f\n",
						rate, round+1, path, w.OK, w.Sent, w.Errors, w.Dropped, ms(w.PerRequest),
						ms(perReq(w.CPU["pods"], w.OK)), ms(perReq(w.CPU["generator"], w.OK)),
						w.Latency.P50.Round(10*time.Microsecond), w.Latency.P99.Round(10*time.Microsecond), w.LoadAvg)
				}
				if err := pause(o.Settle); err != nil {
					return nil, err
				}
			}
		}
	}
	rep.LoadAvgAfter = LoadAvg()
	rep.Rows = compareRows(rep.Windows, rep.Idle, o.Paths, o.Rates)
	return rep, nil
}

// median of xs (0 for none); xs is sorted in place.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if m := len(xs) / 2; len(xs)%2 == 0 {
		return (xs[m-1] + xs[m]) / 2
	}
	return xs[len(xs)/2]
}

func perReq(cpu time.Duration, ok int) time.Duration {
	if ok == 0 {
		return 0
	}
	return cpu / time.Duration(ok)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// compareRows summarises the windows per path and rate. Net figures
// subtract from each window the path's process's use in the idle window
// of the same round.
func compareRows(ws []Window, idle []IdleWindow, paths []string, rates []float64) []CompareRow {
	var rows []CompareRow
	for _, rate := range rates {
		noLoad := map[int]map[string]float64{} // round → process → cores
		for _, iw := range idle {
			if iw.Rate == rate {
				noLoad[iw.Round] = iw.Cores
			}
		}
		// net is w's CPU for process less its no-load use over w.
		net := func(w Window, process string) time.Duration {
			c := noLoad[w.Round][process] * w.Span.Seconds()
			return w.CPU[process] - time.Duration(c*float64(time.Second))
		}
		bare := map[int]time.Duration{} // round → bare per request
		var bareCPU, bareNet time.Duration
		var bareOK int
		for _, w := range ws {
			if w.Rate == rate && w.Path == PathBare {
				bare[w.Round] = w.PerRequest
				bareCPU += w.CPU[PathBare]
				bareNet += net(w, PathBare)
				bareOK += w.OK
			}
		}
		for _, path := range paths {
			r := CompareRow{Path: path, Rate: rate}
			var cpu, netCPU, behind time.Duration
			var ok, n, idleN int
			var ratios []float64
			for _, iw := range idle {
				if iw.Rate == rate {
					r.NoLoadCores += iw.Cores[path]
					idleN++
				}
			}
			if idleN > 0 {
				r.NoLoadCores /= float64(idleN)
			}
			for _, w := range ws {
				if w.Rate != rate || w.Path != path {
					continue
				}
				if n == 0 || w.PerRequest < r.PerRequestMin {
					r.PerRequestMin = w.PerRequest
				}
				r.PerRequestMax = max(r.PerRequestMax, w.PerRequest)
				cpu += w.CPU[path]
				netCPU += net(w, path)
				behind += w.CPU[PathBare]
				ok += w.OK
				r.Delivered += w.Delivered
				r.Errors += w.Errors + w.Dropped
				if b := bare[w.Round]; b > 0 {
					x := float64(w.PerRequest) / float64(b)
					ratios = append(ratios, x)
					if n == 0 || x < r.RatioMin {
						r.RatioMin = x
					}
					r.RatioMax = max(r.RatioMax, x)
				}
				n++
			}
			if n == 0 {
				continue
			}
			r.Delivered /= float64(n)
			r.PerRequestMean = perReq(cpu, ok)
			r.RatioMedian = median(ratios)
			if path == PathTier2 {
				r.BehindPerRequest = perReq(behind, ok)
			}
			if bareOK > 0 && bareCPU > 0 {
				r.Ratio = float64(r.PerRequestMean) / float64(perReq(bareCPU, bareOK))
			}
			if idleN > 0 {
				r.NetPerRequest = perReq(netCPU, ok)
				if b := perReq(bareNet, bareOK); b > 0 {
					r.NetRatio = float64(r.NetPerRequest) / float64(b)
				}
			}
			rows = append(rows, r)
		}
	}
	return rows
}

// WriteMarkdown writes the comparison as a Markdown table.
func (r *CompareReport) WriteMarkdown(w io.Writer) error {
	bw := bufio.NewWriter(w) // its error is sticky: Flush returns the first failed write
	fmt.Fprintf(bw, "CPU per request beside a bare httputil.ReverseProxy, %s (%s): %d fake pods, %d-byte chat bodies, %d%% streaming, %v windows, %d rounds; load average %.1f before, %.1f after.\n\n",
		r.Start.Format(time.RFC3339), r.Binary, r.Pods, r.BodyBytes, r.StreamPct, r.Window, r.Rounds, r.LoadAvgBefore, r.LoadAvgAfter)
	fmt.Fprintln(bw, "| path | rate (req/s) | CPU ms per request (rounds) | mean | × bare (mean; median, range of rounds) | no-load cores | net ms per request; × bare | delivered (req/s) | errors+dropped |")
	fmt.Fprintln(bw, "|---|---|---|---|---|---|---|---|---|")
	for _, x := range r.Rows {
		name := x.Path
		if x.Path == PathTier2 {
			name = fmt.Sprintf("tier2 (bare proxy behind it: %.3f)", ms(x.BehindPerRequest))
		}
		net := "–"
		if x.NetPerRequest != 0 {
			net = fmt.Sprintf("%.3f; %.2f", ms(x.NetPerRequest), x.NetRatio)
		}
		fmt.Fprintf(bw, "| %s | %g | %.3f–%.3f | %.3f | %.2f; %.2f, %.2f–%.2f | %.3f | %s | %.0f | %d |\n",
			name, x.Rate, ms(x.PerRequestMin), ms(x.PerRequestMax), ms(x.PerRequestMean),
			x.Ratio, x.RatioMedian, x.RatioMin, x.RatioMax, x.NoLoadCores, net, x.Delivered, x.Errors)
	}
	if len(r.Idle) > 0 {
		fmt.Fprintln(bw, "\nNo-load cores: each process's CPU use in a window with no requests at the start of every round (Tier 1 keeps scraping the pods, which report a running request). Net: CPU per request less that use over the window; a decomposition, not the goal.")
	}
	for _, x := range r.Windows {
		if x.FirstErr != "" {
			fmt.Fprintf(bw, "\nFirst error, %s at %g req/s round %d: %s\n", x.Path, x.Rate, x.Round, x.FirstErr)
		}
	}
	if len(r.Profiles) > 0 {
		fmt.Fprintf(bw, "\nCPU profiles (go tool pprof -top FILE…): %s\n", strings.Join(r.Profiles, " "))
	}
	return bw.Flush()
}

// tier2Config is Tier 2's configuration for the comparison: one static
// cluster (the bare proxy), tenants and limits in memory, one tenant with
// one API key and limits far above the load (so that every request goes
// through the limiter and none is refused).
func tier2Config(t1Token, apiKey, clusterURL string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:0\nregion: bench\n")
	fmt.Fprintf(&b, "clusters:\n  - {name: bare, region: bench, address: %q, models: [%q], cost: 1, cost_unit: mtok, capacity: 100000}\n", clusterURL, Model)
	fmt.Fprintf(&b, "tier1: {token: %q}\n", t1Token)
	fmt.Fprintf(&b, "tenants:\n  - {id: bench, limits: {rpm: 100000000, tpm: 2000000000, concurrent: 100000}}\n")
	fmt.Fprintf(&b, "keys:\n  - {tenant: bench, name: load, key: %q}\n", apiKey)
	fmt.Fprintf(&b, "metrics: {listen: 127.0.0.1:0}\n")
	return []byte(b.String())
}
