package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// This file is the upstream of the load benchmark: cheap fake model-server
// pods. They stand in for GPUs. A real vLLM pod spends milliseconds to
// seconds per request; these answer at once with a fixed completion, so
// that what the benchmark measures in front of them is the router's own
// cost, not the model's.

// Model is the model name the fake pods serve and the bench requests.
const Model = "bench-model"

// podMetrics is a tiny static vLLM-style /metrics page: every pod lightly
// loaded (one running request, none waiting, KV cache 20 % used), which
// keeps every pod a candidate (nothing saturated, nothing queued) and
// leaves scheduling to the request-dependent scorers. The running request
// makes Tier 1 treat every pod as busy, so it scrapes each every
// scrape.interval with or without traffic, as it must a pod under load:
// the benchmark's windows with no load read that cost.
const podMetrics = `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="bench-model"} 0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="bench-model"} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="bench-model"} 0.2
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="65536"} 1
`

const podModels = `{"object":"list","data":[{"id":"bench-model","object":"model","owned_by":"infergate-loadbench"}]}`

var (
	chatCompletion = []byte(`{"id":"chatcmpl-bench","object":"chat.completion","created":1,"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"The answer is forty-two."},"finish_reason":"stop"}],"usage":{"prompt_tokens":8192,"completion_tokens":6,"total_tokens":8198}}`)
	// streamEvents are the SSE events of a streamed answer: a role-only
	// opening event (as vLLM sends), three content events, the finish
	// event and [DONE]; each is written and flushed on its own.
	streamEvents = [][]byte{
		[]byte("data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n"),
		[]byte("data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"The answer\"},\"finish_reason\":null}]}\n\n"),
		[]byte("data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" is forty\"},\"finish_reason\":null}]}\n\n"),
		[]byte("data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"-two.\"},\"finish_reason\":null}]}\n\n"),
		[]byte("data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"),
		[]byte("data: [DONE]\n\n"),
	}
	streamTrue = []byte(`"stream":true`)
)

// bodyPool holds request-body buffers of the fake pods (32 KB prompts).
var bodyPool = sync.Pool{New: func() any { return bytes.NewBuffer(make([]byte, 0, 40<<10)) }}

// PodHandler is one fake model-server pod: an OpenAI chat completion
// answered at once (streamed when the body asks for it), a static vLLM
// /metrics page and /v1/models, enough for Tier 1's scraper to mark it
// ready.
func PodHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = io.WriteString(w, podMetrics)
		case "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, podModels)
		case "/health":
			w.WriteHeader(http.StatusOK)
		case "/v1/chat/completions":
			if r.Method != http.MethodPost {
				http.Error(w, `{"error":{"message":"method not allowed","type":"invalid_request_error"}}`, http.StatusMethodNotAllowed)
				return
			}
			buf := bodyPool.Get().(*bytes.Buffer)
			buf.Reset()
			_, err := buf.ReadFrom(r.Body)
			// The only field the fake engine reads: a real one decodes
			// the whole body, but its cost is not what is measured here.
			stream := bytes.Contains(buf.Bytes(), streamTrue)
			bodyPool.Put(buf)
			if err != nil {
				return
			}
			if !stream {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(chatCompletion)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			f, _ := w.(http.Flusher)
			for _, ev := range streamEvents {
				if _, err := w.Write(ev); err != nil {
					return
				}
				if f != nil {
					f.Flush()
				}
			}
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"message":"not found","type":"invalid_request_error"}}`)
		}
	})
}

// Pods is a running set of fake pods, each on its own loopback listener.
type Pods struct {
	Addrs   []string
	servers []*http.Server
	wg      sync.WaitGroup
}

// StartPods starts n fake pods on 127.0.0.1 at ephemeral ports.
func StartPods(n int) (*Pods, error) {
	if n <= 0 {
		return nil, errors.New("pods: n must be positive")
	}
	p := &Pods{}
	h := PodHandler()
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("pod %d: listen: %w", i, err)
		}
		srv := &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       time.Minute,
			WriteTimeout:      time.Minute,
			IdleTimeout:       2 * time.Minute,
		}
		p.servers = append(p.servers, srv)
		p.Addrs = append(p.Addrs, ln.Addr().String())
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			_ = srv.Serve(ln)
		}()
	}
	return p, nil
}

// Close stops every pod.
func (p *Pods) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range p.servers {
		_ = s.Shutdown(ctx)
	}
	p.wg.Wait()
}
