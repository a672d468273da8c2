package integration

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// outcome is how one request of a load ended, seen from the client.
type outcome int

const (
	// answered: a 200 and a whole answer (a stream ending in [DONE]
	// without an error event, or a JSON completion with choices).
	answered outcome = iota
	// limited: 429 from a rate limit, where the load expects limits.
	limited
	// failedBeforeStream: no 200 reached the client: a transport error or
	// an error status. The gateways promise this cannot happen while
	// another pod or cluster can take the request.
	failedBeforeStream
	// cutMidStream: a 200 and then a broken or incomplete answer; a
	// process dying mid-generation does this, and nothing can hide it.
	cutMidStream
)

// record is one request of a load.
type record struct {
	start    time.Duration // since the load began
	end      time.Duration
	stream   bool
	outcome  outcome
	servedBy string // the load's servedHeader, e.g. the cluster
	detail   string // why it failed
}

// loadSpec is an open-loop load: requests start at a fixed rate whatever
// the answers take, as independent clients would, so a failing or slow
// stack cannot lower the load it is measured under.
type loadSpec struct {
	name         string
	url          string // base URL; /v1/chat/completions is added
	key          string
	model        string
	rate         float64       // requests per second
	duration     time.Duration // how long requests keep starting
	maxTokens    int
	streamEvery  int    // every streamEvery-th request streams; 0: none
	servedHeader string // response header naming who served it
	limited      bool   // a 429 is an expected answer, not a failure
	timeout      time.Duration
	// body, when set, is request i's JSON body (it must set "stream" to
	// stream); default a short chat completion unique to i.
	body func(i int, stream bool) string
}

// loadRun is a load in progress.
type loadRun struct {
	spec  loadSpec
	began time.Time
	done  chan struct{}

	mu      sync.Mutex
	records []record
}

var loadTransport = &http.Transport{
	MaxIdleConns: 512, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second,
	DisableCompression: true,
}

// startLoad starts spec in the background; wait returns its records.
func startLoad(ctx context.Context, spec loadSpec) *loadRun {
	spec.maxTokens = cmp.Or(spec.maxTokens, 16)
	spec.timeout = cmp.Or(spec.timeout, 30*time.Second)
	spec.servedHeader = cmp.Or(spec.servedHeader, "X-Infergate-Cluster")
	l := &loadRun{spec: spec, began: time.Now(), done: make(chan struct{})}
	client := &http.Client{Transport: loadTransport}
	interval := time.Duration(float64(time.Second) / spec.rate)
	n := int(spec.duration / interval)
	go func() {
		defer close(l.done)
		var wg sync.WaitGroup
		for i := range n {
			// Scheduled from the start, not from the last tick, so a
			// slow scheduler does not lower the rate.
			if d := time.Until(l.began.Add(time.Duration(i) * interval)); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
			}
			if ctx.Err() != nil {
				break
			}
			stream := spec.streamEvery > 0 && i%spec.streamEvery == 1%spec.streamEvery
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := l.one(ctx, client, i, stream)
				l.mu.Lock()
				l.records = append(l.records, r)
				l.mu.Unlock()
			}()
		}
		wg.Wait()
	}()
	return l
}

// at sleeps until offset since the load began.
func (l *loadRun) at(offset time.Duration) {
	time.Sleep(time.Until(l.began.Add(offset)))
}

// since is the time since the load began.
func (l *loadRun) since() time.Duration { return time.Since(l.began) }

// wait waits for every request to end and returns the records by start.
func (l *loadRun) wait() []record {
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.SortFunc(l.records, func(a, b record) int { return cmp.Compare(a.start, b.start) })
	return l.records
}

func (l *loadRun) one(ctx context.Context, client *http.Client, i int, stream bool) (r record) {
	r = record{start: time.Since(l.began), stream: stream}
	defer func() { r.end = time.Since(l.began) }()
	ctx, cancel := context.WithTimeout(ctx, l.spec.timeout)
	defer cancel()
	var body string
	if l.spec.body != nil {
		body = l.spec.body(i, stream)
	} else {
		body = fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Request %d of %s: say something about GPUs."}],"max_tokens":%d,"stream":%t}`,
			l.spec.model, i, l.spec.name, l.spec.maxTokens, stream)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.spec.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		r.outcome, r.detail = failedBeforeStream, err.Error()
		return r
	}
	req.Header.Set("Authorization", "Bearer "+l.spec.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		r.outcome, r.detail = failedBeforeStream, err.Error()
		return r
	}
	defer resp.Body.Close()
	r.servedBy = resp.Header.Get(l.spec.servedHeader)
	switch {
	case resp.StatusCode == http.StatusTooManyRequests && l.spec.limited:
		_, _ = io.Copy(io.Discard, resp.Body)
		r.outcome = limited
		return r
	case resp.StatusCode != http.StatusOK:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		r.outcome, r.detail = failedBeforeStream, fmt.Sprintf("%s: %s", resp.Status, b)
		return r
	}
	r.outcome = cutMidStream
	if stream {
		done, sawError := false, false
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "data: [DONE]":
				done = true
			case strings.HasPrefix(line, "data: ") && strings.Contains(line, `"error"`):
				sawError, r.detail = true, line
			}
		}
		switch {
		case sc.Err() != nil:
			r.detail = "stream: " + sc.Err().Error()
		case sawError:
		case !done:
			r.detail = "stream ended without [DONE]"
		default:
			r.outcome = answered
		}
		return r
	}
	var c struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		r.detail = "body: " + err.Error()
	case json.Unmarshal(b, &c) != nil || len(c.Choices) == 0:
		r.detail = "incomplete body: " + string(b[:min(len(b), 200)])
	default:
		r.outcome = answered
	}
	return r
}

// figures sums the records of one fault scenario.
type figures struct {
	sent, answered, failedBefore, cut, limited int
	// overAdmitted is the most requests a limited tenant had admitted in
	// any sliding minute beyond its limit; -1 where no limit is set.
	overAdmitted int
	servedBy     map[string]int
	failures     []string // a few examples
}

func sum(recs ...[]record) figures {
	f := figures{overAdmitted: -1, servedBy: map[string]int{}}
	for _, rs := range recs {
		for _, r := range rs {
			f.sent++
			switch r.outcome {
			case answered:
				f.answered++
			case limited:
				f.limited++
			case failedBeforeStream:
				f.failedBefore++
			case cutMidStream:
				f.cut++
			}
			if r.outcome == answered || r.outcome == cutMidStream {
				f.servedBy[r.servedBy]++
			}
			if (r.outcome == failedBeforeStream || r.outcome == cutMidStream) && len(f.failures) < 5 {
				f.failures = append(f.failures, fmt.Sprintf("at %v (stream %t): %s", r.start.Round(time.Millisecond), r.stream, r.detail))
			}
		}
	}
	return f
}

// report logs the scenario's figures as one line (FIGURES ...) that
// docs/reliability.md quotes, plus examples of failures.
func (f figures) report(t *testing.T, fault string, wall time.Duration, extra string) {
	t.Helper()
	over := "n/a"
	if f.overAdmitted >= 0 {
		over = strconv.Itoa(f.overAdmitted)
	}
	line := fmt.Sprintf("FIGURES %s: sent=%d answered=%d failed_before_streaming=%d cut_mid_stream=%d over_admitted=%s rejected_429=%d wall=%v served_by=%v",
		fault, f.sent, f.answered, f.failedBefore, f.cut, over, f.limited, wall.Round(100*time.Millisecond), f.servedBy)
	if extra != "" {
		line += " " + extra
	}
	t.Log(line)
	for _, e := range f.failures {
		t.Logf("  e.g. %s", e)
	}
	// INFERGATE_FIGURES names a file collecting every scenario's line.
	if path := os.Getenv("INFERGATE_FIGURES"); path != "" {
		if fh, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(fh, line)
			fh.Close()
		}
	}
}

// admittedInWindow is the most requests admitted (a 200, whole or cut)
// whose start lies in any window of length w.
func admittedInWindow(recs []record, w time.Duration) int {
	var ts []time.Duration
	for _, r := range recs {
		if r.outcome == answered || r.outcome == cutMidStream {
			ts = append(ts, r.start)
		}
	}
	slices.Sort(ts)
	best, lo := 0, 0
	for hi := range ts {
		for ts[hi]-ts[lo] >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// count counts records with outcome o that started in [from, to).
func count(recs []record, o outcome, from, to time.Duration) int {
	n := 0
	for _, r := range recs {
		if r.outcome == o && r.start >= from && r.start < to {
			n++
		}
	}
	return n
}

// servedAfter counts answered requests started at or after from, by who
// served them.
func servedAfter(recs []record, from time.Duration) map[string]int {
	out := map[string]int{}
	for _, r := range recs {
		if r.start >= from && (r.outcome == answered || r.outcome == cutMidStream) {
			out[r.servedBy]++
		}
	}
	return out
}

// procStats is one sample of a process's resource use.
type procStats struct {
	rssBytes   int64
	goroutines int
}

// sampleProc reads a running infergate process's resident memory from
// /proc and its goroutine count from its metrics endpoint. This is the one
// place that knows where those figures come from: if the metrics move to
// another listener or a debug endpoint appears, change it here.
func sampleProc(ctx context.Context, p *proc, metricsURL string) (procStats, error) {
	rss, err := procRSS(p.cmd.Process.Pid)
	if err != nil {
		return procStats{}, err
	}
	g, err := metricValue(ctx, metricsURL, "go_goroutines")
	if err != nil {
		return procStats{}, err
	}
	return procStats{rssBytes: rss, goroutines: int(g)}, nil
}

// procRSS is VmRSS from /proc/PID/status, in bytes.
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// metricValue sums every series of a metric in a Prometheus text
// exposition (0 and an error when it is absent).
func metricValue(ctx context.Context, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	total, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		if rest[0] == '{' {
			// Label values are quoted; the set ends at the last brace.
			rest = rest[strings.LastIndexByte(rest, '}')+1:]
		}
		f := strings.Fields(rest) // value [timestamp]
		if len(f) == 0 {
			return 0, fmt.Errorf("%s: %q: no value", name, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", name, line, err)
		}
		total, found = total+v, true
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("%s: no %s", url, name)
	}
	return total, nil
}

// limiterWatch polls Tier 2's infergate_tier2_ratelimit_redis_down gauge, so a
// test knows how long the limiter decided locally (fail open), whether
// from the fault it injected or from a Redis call that merely timed out.
type limiterWatch struct {
	began    time.Time
	interval time.Duration
	stop     context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	samples  []downSample
}

type downSample struct {
	at   time.Duration
	down bool
}

// downPeriod is one stretch of fail-open decisions, widened by the poll
// interval on both sides (it may have begun right after the last "up"
// sample and ended right before the next).
type downPeriod struct{ from, to time.Duration }

func watchLimiter(ctx context.Context, metricsURL string, began time.Time) *limiterWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &limiterWatch{began: began, interval: 100 * time.Millisecond, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(w.interval)
		defer tick.Stop()
		for {
			v, err := metricValue(ctx, metricsURL, "infergate_tier2_ratelimit_redis_down")
			if err == nil {
				w.mu.Lock()
				w.samples = append(w.samples, downSample{time.Since(began), v > 0})
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// periods stops the watch and returns the fail-open periods.
func (w *limiterWatch) periods() []downPeriod {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []downPeriod
	for i := 0; i < len(w.samples); i++ {
		if !w.samples[i].down {
			continue
		}
		j := i
		for j+1 < len(w.samples) && w.samples[j+1].down {
			j++
		}
		out = append(out, downPeriod{from: w.samples[i].at - w.interval, to: w.samples[j].at + w.interval})
		i = j
	}
	return out
}

// total is the time of periods overlapping [from, to), and how many.
func total(ps []downPeriod, from, to time.Duration) (time.Duration, int) {
	var d time.Duration
	n := 0
	for _, p := range ps {
		lo, hi := max(p.from, from), min(p.to, to)
		if hi > lo {
			d += hi - lo
			n++
		}
	}
	return d, n
}
