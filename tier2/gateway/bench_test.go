package gateway_test

import (
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/tier2/gateway"
)

// Benchmarks of the latency Tier 2 adds: the same request sent to a
// stand-in Tier 1 directly and through the gateway (auth, planning,
// admission with the in-memory fake limiter, forwarding, usage parsing).
// Both paths use keep-alive connections on loopback. Reported: ns/op and
// the p50/p99 of per-request latency.
//
//	go test -run '^$' -bench Tier2 -benchtime 3000x ./tier2/gateway

const benchBody = `{"model":"m","messages":[{"role":"user","content":"Say hello in one short sentence, please."}],"max_tokens":16}`

func benchPost(b *testing.B, c *http.Client, url, key, body string) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

func runLatency(b *testing.B, do func()) {
	for range 50 { // warm connections
		do()
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		do()
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func BenchmarkTier2(b *testing.B) {
	t1 := newTier1(b, "a", "east", "m")
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for _, stream := range []bool{false, true} {
		body := benchBody
		name := "json"
		if stream {
			body = strings.Replace(benchBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
			name = "stream"
		}
		b.Run(name+"/direct", func(b *testing.B) {
			runLatency(b, func() { benchPost(b, c, t1.URL()+"/v1/chat/completions", tier1Token, body) })
		})
		b.Run(name+"/via-tier2", func(b *testing.B) {
			lim := &fakeLimiter{}
			s := newStack(b, stackOpts{src: static(b, t1.cluster(1, 1000)), gateway: func(o *gateway.Options) { o.Limiter = lim }})
			runLatency(b, func() { benchPost(b, c, s.url+"/v1/chat/completions", "key-cost", body) })
		})
	}
}
