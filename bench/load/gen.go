package load

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// This file is the open-loop load generator. Arrivals follow a fixed
// schedule (one every 1/rate seconds) whatever the server does; each
// request runs on its own goroutine, and its latency is measured from its
// scheduled send time, not from when it was actually sent, so a generator
// or server that falls behind shows up in the latency instead of silently
// lowering the offered rate (coordinated omission).

// newClient is the generator's HTTP client: keep-alive connections, enough
// idle ones per host that a burst does not close and reopen them.
func newClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        20000,
			MaxIdleConnsPerHost: 5000,
			IdleConnTimeout:     2 * time.Minute,
			DisableCompression:  true,
		},
	}
}

// phase is one run of the generator against one path at one rate.
type phase struct {
	client      *http.Client
	urls        []string // round-robin targets (pods direct) or one (Tier 1)
	token       string
	rate        float64
	dur         time.Duration
	bodies      *Bodies
	seq         *atomic.Uint64 // request numbers, distinct across phases
	maxInFlight int
}

// PhaseResult is what one phase measured.
type PhaseResult struct {
	Sent    int // scheduled arrivals
	OK      int // 200 with a complete body ([DONE] for streams)
	Dropped int // not sent: MaxInFlight requests were already in flight
	Errors  int // transport errors, non-200 statuses, truncated streams
	// Elapsed is from the first scheduled send to the last response end.
	Elapsed time.Duration
	// MaxLag is how far behind schedule the generator sent a request.
	MaxLag    time.Duration
	FirstErr  string
	Latencies []time.Duration // of OK requests, from scheduled send to body end
}

func (p *phase) run(ctx context.Context) PhaseResult {
	n := int(p.rate * p.dur.Seconds())
	lat := make([]time.Duration, n)
	okv := make([]bool, n)
	var (
		wg       sync.WaitGroup
		inFlight atomic.Int64
		dropped  atomic.Int64
		lastEnd  atomic.Int64 // unix nanos
		errOnce  sync.Once
		firstErr string
		maxLag   time.Duration
	)
	interval := time.Duration(float64(time.Second) / p.rate)
	start := time.Now()
	fail := func(err string) {
		errOnce.Do(func() { firstErr = err })
	}
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(i) * interval)
		if d := time.Until(at); d > 0 {
			select {
			case <-ctx.Done():
				n = i
			case <-time.After(d):
			}
			if n == i {
				break
			}
		} else if -d > maxLag {
			maxLag = -d
		}
		if inFlight.Load() >= int64(p.maxInFlight) {
			dropped.Add(1)
			continue
		}
		inFlight.Add(1)
		wg.Add(1)
		num := p.seq.Add(1)
		url := p.urls[int(num)%len(p.urls)]
		go func(i int) {
			defer wg.Done()
			defer inFlight.Add(-1)
			err := p.do(ctx, url, num)
			end := time.Now()
			for {
				old := lastEnd.Load()
				if end.UnixNano() <= old || lastEnd.CompareAndSwap(old, end.UnixNano()) {
					break
				}
			}
			if err != nil {
				fail(err.Error())
				return
			}
			lat[i] = end.Sub(at)
			okv[i] = true
		}(i)
	}
	wg.Wait()
	r := PhaseResult{Sent: n, Dropped: int(dropped.Load()), MaxLag: maxLag, FirstErr: firstErr}
	for i := 0; i < n; i++ {
		if okv[i] {
			r.OK++
			r.Latencies = append(r.Latencies, lat[i])
		}
	}
	r.Errors = n - r.OK - r.Dropped
	if le := lastEnd.Load(); le > 0 {
		r.Elapsed = time.Unix(0, le).Sub(start)
	}
	return r
}

var done = []byte("data: [DONE]")

// do sends request num to url and reads the whole response.
func (p *phase) do(ctx context.Context, url string, num uint64) error {
	body, stream := p.bodies.Body(num)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if p.token != "" {
		req.Header.Set("Authorization", "Bearer "+p.token)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %.200s", resp.StatusCode, b)
	}
	if stream && !bytes.Contains(b, done) {
		return fmt.Errorf("stream ended without [DONE]: %.200s", b)
	}
	return nil
}

// Dist summarises latencies.
type Dist struct {
	N                  int
	P50, P90, P99, Max time.Duration
}

func distOf(lats []time.Duration) Dist {
	if len(lats) == 0 {
		return Dist{}
	}
	s := slices.Clone(lats)
	slices.Sort(s)
	q := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.5) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return Dist{N: len(s), P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: s[len(s)-1]}
}
