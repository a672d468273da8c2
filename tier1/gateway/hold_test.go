package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/shared/config"
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

// Holding is per kind of request. Two pods each hold one LoRA adapter
// with no free slot, so a request for one adapter can only go to its pod.
// While requests for lora-a are held (its pod is busy), a request for
// lora-b goes to its idle pod at once, and a lora-b request held behind a
// lora-a one goes as soon as lora-b's pod frees up, though lora-a's is
// still busy. Before admission.Pass both waited behind the lora-a
// request (head-of-line blocking) until its wait bound.
func TestHeldAdapterDoesNotBlockAnother(t *testing.T) {
	pods := map[string]*fakePod{}
	release := map[string]func(){}
	for _, ad := range []string{"lora-a", "lora-b"} {
		p := newFakePod(t, "pod-"+ad)
		gate := make(chan struct{})
		var once sync.Once
		release[ad] = func() { once.Do(func() { close(gate) }) }
		t.Cleanup(release[ad]) // a failing test must not leave a handler blocked
		p.set(func(p *fakePod) {
			p.models = []string{"llama", ad + ":llama"}
			p.metrics = fmt.Sprintf("# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=%q,waiting_lora_adapters=\"\"} 1\n", ad)
			var calls atomic.Int32
			p.handler = func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					<-gate // the first request holds its pod's prefill until released
				}
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
			}
		})
		pods[ad] = p
	}
	var b strings.Builder
	// Scraped once at start: no scrape wakes the queue during the test,
	// so a request goes only by its own cycle on arrival or by a pass
	// that a first token or a completion starts.
	fmt.Fprintf(&b, "auth: {tokens: [%s]}\nscrape: {interval: 1m}\nqueue: {max_wait: 1m}\n", testToken)
	b.WriteString("scheduler: {stale_after: 1h, saturation: {prefill_wait: 1ms}}\n")
	b.WriteString("pools:\n  - {name: llama-pool, model: llama, adapters: [lora-a, lora-b]}\npods:\n")
	for _, p := range pods {
		fmt.Fprintf(&b, "  - {name: %s, address: %q, pool: llama-pool, engine: vllm}\n", p.name, p.addr())
	}
	var cfg Config
	if err := config.Decode("test.yaml", []byte(b.String()), &cfg); err != nil {
		t.Fatalf("config: %v\n%s", err, b.String())
	}
	e := startEnv(t, &cfg, []*fakePod{pods["lora-a"], pods["lora-b"]}, "")
	for _, p := range pods {
		// Both pods have learned 10,000 tokens/s: a few queued tokens
		// make one busy.
		teach := &picker.Request{ID: "teach", PromptTokens: 10000}
		e.gw.tracker.Dispatched(p.name, teach)
		e.gw.tracker.FirstToken(p.name, teach, time.Second)
		e.gw.tracker.Done(p.name, teach)
	}
	body := func(model, text string) string {
		return `{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"` + text + " " + strings.Repeat("word ", 40) + `"}]}`
	}
	send := func(model, text string) chan result {
		ch := make(chan result, 1)
		go func() { ch <- e.do(t, "POST", "/v1/chat/completions", body(model, text), nil) }()
		return ch
	}
	within := func(what string, ch chan result) {
		t.Helper()
		select {
		case r := <-ch:
			if r.status != 200 {
				t.Fatalf("%s: status %d %s", what, r.status, r.body)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no answer in 10 s (held behind another adapter's request?)", what)
		}
	}
	queue := e.gw.state.Load().pools["llama-pool"].queue
	pa, pb := pods["lora-a"], pods["lora-b"]

	a1 := send("lora-a", "first")
	waitFor(t, "lora-a's first request at its pod", func() bool { return pa.hits.Load() == 1 })
	a2 := send("lora-a", "second")
	waitFor(t, "lora-a's second request held", func() bool { return queue.len() == 1 })

	// An idle pod for lora-b: its request goes there at once.
	b1 := send("lora-b", "first")
	waitFor(t, "lora-b's first request at its pod", func() bool { return pb.hits.Load() == 1 })
	if queue.len() != 1 || pa.hits.Load() != 1 {
		t.Fatalf("queue %d, lora-a pod hits %d: want 1 held, 1 sent", queue.len(), pa.hits.Load())
	}

	// lora-b's pod is busy with b1 now: the next lora-b request is held
	// behind a2, and goes when b1's first token frees its pod.
	b2 := send("lora-b", "second")
	waitFor(t, "lora-b's second request held", func() bool { return queue.len() == 2 })
	release["lora-b"]()
	within("lora-b's first request", b1)
	within("lora-b's held request", b2)
	if queue.len() != 1 || pa.hits.Load() != 1 {
		t.Fatalf("queue %d, lora-a pod hits %d: lora-a's request must still be held", queue.len(), pa.hits.Load())
	}
	release["lora-a"]()
	within("lora-a's first request", a1)
	within("lora-a's held request", a2)
}
