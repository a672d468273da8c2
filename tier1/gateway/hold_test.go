package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/tier1/picker"
)

// With saturation.prefill_wait, a request that finds the only pod busy
// (the router's own prefill in flight there) is held in the router and
// goes out once that prefill's first token comes back, before the earlier
// request finishes.
func TestHeldRequestGoesAtFirstToken(t *testing.T) {
	pod := newFakePod(t, "p0")
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open) // a failing test must not leave the handler blocked
	var calls atomic.Int32
	pod.set(func(p *fakePod) {
		p.handler = func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) > 1 {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"id":"b","object":"chat.completion"}`)
				return
			}
			<-release
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
			w.(http.Flusher).Flush()
			// Finish only once the held request reached the pod: it must
			// not need this one's completion to go.
			deadline := time.Now().Add(10 * time.Second)
			for pod.hits.Load() < 2 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
		}
	})
	e := newEnv(t, []*fakePod{pod}, "queue: {max_wait: 1m}\nscheduler: {stale_after: 1h, saturation: {prefill_wait: 1ms}}\n")
	// The pod has learned a speed of 10,000 tokens/s, so 10 queued tokens
	// make it busy.
	teach := &picker.Request{ID: "teach", PromptTokens: 10000}
	e.gw.tracker.Dispatched("p0", teach)
	e.gw.tracker.FirstToken("p0", teach, time.Second)
	e.gw.tracker.Done("p0", teach)

	first := make(chan result, 1)
	go func() {
		first <- e.do(t, "POST", "/v1/chat/completions", `{"model":"llama","stream":true,"messages":[{"role":"user","content":"first `+strings.Repeat("word ", 40)+`"}]}`, nil)
	}()
	waitFor(t, "first request at the pod", func() bool { return pod.hits.Load() == 1 })
	second := make(chan result, 1)
	go func() { second <- e.do(t, "POST", "/v1/chat/completions", chatBody("llama", "second"), nil) }()
	queue := e.gw.state.Load().pools["llama-pool"].queue
	waitFor(t, "second request held", func() bool { return queue.len() == 1 })
	if pod.hits.Load() != 1 {
		t.Fatal("held request reached the busy pod")
	}
	open()
	if r := <-second; r.status != 200 {
		t.Fatalf("held request: status %d %s", r.status, r.body)
	}
	if r := <-first; r.status != 200 {
		t.Fatalf("first request: status %d %s", r.status, r.body)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
