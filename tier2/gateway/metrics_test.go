package gateway_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/tier2/gateway"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// TestRequestMetrics: requests, latency, tokens and cost by tenant, model
// and cluster; cost in both pricing modes; tenant and model values
// bounded ("other" past the bound, and for a model no cluster serves).
func TestRequestMetrics(t *testing.T) {
	gpu := newTier1(t, "gpu", "east", "m")
	mtok := newTier1(t, "mtok", "west", "m2")
	ks := keys{}
	for i := range 3 {
		ks["key-"+strconv.Itoa(i)] = &tenant.Tenant{ID: "t" + strconv.Itoa(i)}
	}
	mc := mtok.cluster(0, 100)
	mc.Cost, mc.CostUnit = 0.5, cluster.CostPerMTok
	gc := gpu.cluster(3.6, 100) // 3.6 per GPU-hour at 1000 tokens/s = 1 per Mtok
	s := newStack(t, stackOpts{src: static(t, gc, mc),
		route:   func(o *route.Options) { o.TokensPerGPUSecond = 1000 },
		gateway: func(o *gateway.Options) { o.Auth = ks; o.MaxTenantLabels = 2 }})
	chat := func(key, model string, stream bool) reply {
		return s.do(t, key, "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"user","content":"hi"}]}`, model, stream))
	}
	for i := range 3 {
		if r := chat("key-"+strconv.Itoa(i), "m", false); r.code != 200 {
			t.Fatalf("t%d: %d", i, r.code)
		}
	}
	if r := chat("key-0", "m2", true); r.code != 200 {
		t.Fatalf("stream: %d", r.code)
	}
	if r := chat("key-0", "nope", false); r.code != 404 {
		t.Fatalf("unknown model: %d", r.code)
	}
	// A JSON answer goes out whole (Content-Length, flushed) before the
	// handler counts its tokens and cost and, deferred, the request and its
	// duration: the client may read it first. Wait (to a deadline) until all
	// five requests' durations, the last thing counted, are in; the checks
	// below then judge what is there.
	for deadline := time.Now().Add(10 * time.Second); histCount(t, s, "infergate_tier2_request_duration_seconds", nil) < 5 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"infergate_tier2_requests_total", map[string]string{"tenant": "t0", "model": "m", "cluster": "gpu", "region": "east", "status": "200", "endpoint": "chat/completions"}, 1},
		{"infergate_tier2_requests_total", map[string]string{"tenant": "other", "model": "m"}, 1}, // t2: past the bound of 2
		{"infergate_tier2_requests_total", map[string]string{"tenant": "t0", "model": "other", "cluster": "", "status": "404"}, 1},
		{"infergate_tier2_requests_total", map[string]string{"tenant": "t0", "model": "m2", "cluster": "mtok", "region": "west"}, 1},
		{"infergate_tier2_tokens_total", map[string]string{"tenant": "t0", "model": "m", "cluster": "gpu", "type": "completion"}, 7},
		// 12 tokens at 1 per Mtok (GPU-hour, converted) and 8 at 0.5 (the stream's usage).
		{"infergate_tier2_cost_total", map[string]string{"tenant": "t1", "model": "m", "cluster": "gpu"}, 12e-6},
		{"infergate_tier2_cost_total", map[string]string{"tenant": "t0", "model": "m2", "cluster": "mtok"}, 8 * 0.5e-6},
	} {
		if got := s.metric(t, tc.name, tc.labels); fmt.Sprintf("%.9f", got) != fmt.Sprintf("%.9f", tc.want) {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if n := histCount(t, s, "infergate_tier2_ttft_seconds", map[string]string{"model": "m2", "cluster": "mtok"}); n != 1 {
		t.Errorf("ttft samples = %d, want 1 (the stream)", n)
	}
	if n := histCount(t, s, "infergate_tier2_request_duration_seconds", map[string]string{"model": "m", "cluster": "gpu"}); n != 3 {
		t.Errorf("duration samples for m on gpu = %d, want 3", n)
	}
}

// histCount is a histogram's sample count over the series matching want.
func histCount(t *testing.T, s *stack, name string, want map[string]string) uint64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue series
				}
			}
			n += m.GetHistogram().GetSampleCount()
		}
	}
	return n
}
