package extproc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/sim/server"
	"github.com/infergate/infergate/tier1/gateway"
)

// These tests run the ext_proc server on a real loopback socket in front of
// a gateway whose pods are simulated GPU pods (sim/server) on loopback.
// There is no Envoy binary here: a Go gRPC client stands in for Envoy's
// ext_proc filter, sending the messages Envoy sends (request headers, the
// buffered body, response headers, streamed response body) and, where a
// test needs the request served, forwarding it to the picked endpoint as
// an ORIGINAL_DST cluster reading x-gateway-destination-endpoint would.

const testToken = "test-token-123"

type testEnv struct {
	gw     *gateway.Gateway
	debug  string // gateway HTTP listener, for /debug/pods
	client extprocv3.ExternalProcessorClient
	conn   *grpc.ClientConn
	addr   string                 // ext_proc listener
	pods   map[string]*server.Pod // by name
}

type podSpec struct {
	name string
	lora []string
}

// newTestEnv starts simulated pods, a gateway over them (pool llama,
// model llama-3.1-8b) with extra YAML appended, and the ext_proc server.
func newTestEnv(t *testing.T, specs []podSpec, extra string, opts Options) *testEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	te := &testEnv{pods: map[string]*server.Pod{}}
	var b strings.Builder
	fmt.Fprintf(&b, "auth: {tokens: [%s]}\nscrape: {interval: 20ms, models_interval: 50ms}\n%s", testToken, extra)
	b.WriteString("pools: [{name: llama, model: llama-3.1-8b}]\npods:\n")
	for _, sp := range specs {
		cfg := server.Config{Name: sp.name, Model: "llama-3.1-8b", GPU: "h100", TimeScale: 0.01, MaxLoras: 2,
			Logger: slog.New(slog.DiscardHandler)}
		for _, l := range sp.lora {
			cfg.LoRAModules = append(cfg.LoRAModules, server.LoRAModule{Name: l, Path: "/adapters/" + l})
		}
		p, err := server.Listen(ctx, cfg, "127.0.0.1:0")
		if err != nil {
			t.Fatalf("sim pod %s: %v", sp.name, err)
		}
		t.Cleanup(func() { _ = p.Close() })
		te.pods[sp.name] = p
		fmt.Fprintf(&b, "  - {name: %s, address: %q, pool: llama, gpu: h100}\n", sp.name, p.Addr)
	}
	var cfg gateway.Config
	if err := config.Decode("extproc-test.yaml", []byte(b.String()), &cfg); err != nil {
		t.Fatalf("config: %v\n%s", err, b.String())
	}
	gw, err := gateway.New(ctx, &cfg, gateway.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("gateway: %v", err)
	}
	t.Cleanup(gw.Close)
	te.gw = gw
	hs := httptest.NewServer(gw)
	t.Cleanup(hs.Close)
	te.debug = hs.URL

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	te.addr = ln.Addr().String()
	srv := New(gw, opts)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	te.conn = conn
	te.client = extprocv3.NewExternalProcessorClient(conn)
	te.waitPods(t, "ready with models listed", func(d podDebug) bool { return d.Ready && len(d.Models) > 0 }, names(specs)...)
	return te
}

func names(specs []podSpec) []string {
	var out []string
	for _, s := range specs {
		out = append(out, s.name)
	}
	return out
}

// podDebug is the part of /debug/pods the tests read.
type podDebug struct {
	Name     string   `json:"name"`
	Address  string   `json:"address"`
	Ready    bool     `json:"ready"`
	Models   []string `json:"models"`
	InFlight int      `json:"in_flight"`
}

func (te *testEnv) debugPods(t *testing.T) map[string]podDebug {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, te.debug+"/debug/pods", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Pods []podDebug `json:"pods"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("/debug/pods: %v", err)
	}
	m := map[string]podDebug{}
	for _, p := range out.Pods {
		m[p.Name] = p
	}
	return m
}

// waitPods waits until cond holds for every named pod (a wait for a state,
// not a timing assertion: the deadline only bounds a broken test).
func (te *testEnv) waitPods(t *testing.T, what string, cond func(podDebug) bool, pods ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		all := te.debugPods(t)
		ok := true
		for _, n := range pods {
			if !cond(all[n]) {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for pods %v: %s (%+v)", pods, what, all)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// envoyStream is one ext_proc stream, driven as Envoy's filter drives it.
type envoyStream struct {
	t      *testing.T
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

func (te *testEnv) open(t *testing.T) *envoyStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := te.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &envoyStream{t: t, stream: s, cancel: cancel}
}

func (es *envoyStream) send(req *extprocv3.ProcessingRequest) {
	es.t.Helper()
	if err := es.stream.Send(req); err != nil {
		es.t.Fatalf("send: %v", err)
	}
}

func (es *envoyStream) recv() *extprocv3.ProcessingResponse {
	es.t.Helper()
	resp, err := es.stream.Recv()
	if err != nil {
		es.t.Fatalf("recv: %v", err)
	}
	return resp
}

func headerMap(kv ...string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return hm
}

// requestHeaders are an inference request's headers as Envoy sends them,
// with the test token unless kv overrides authorization.
func requestHeaders(path string, eos bool, kv ...string) *extprocv3.ProcessingRequest {
	all := []string{":method", "POST", ":path", path, ":authority", "gateway", "content-type", "application/json"}
	if !slices.Contains(kv, "authorization") {
		all = append(all, "authorization", "Bearer "+testToken)
	}
	all = append(all, kv...)
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(all...), EndOfStream: eos},
	}}
}

func requestBody(body string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: eos},
	}}
}

func chatBody(model, content string, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model": model, "stream": stream, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": content}},
	})
	return string(b)
}

// route sends a buffered request and returns the server's answer to the
// body (headers are answered with CONTINUE first).
func (es *envoyStream) route(path, body string, kv ...string) *extprocv3.ProcessingResponse {
	es.t.Helper()
	es.send(requestHeaders(path, false, kv...))
	if r := es.recv(); r.GetRequestHeaders() == nil {
		es.t.Fatalf("answer to request headers: %v", r)
	}
	es.send(requestBody(body, true))
	return es.recv()
}

// destination returns the x-gateway-destination-endpoint set by a body
// answer (failing if it is missing or not an overwrite) and the envoy.lb
// metadata.
func destination(t *testing.T, r *extprocv3.ProcessingResponse) (string, map[string]*structpb.Value) {
	t.Helper()
	var common *extprocv3.CommonResponse
	switch {
	case r.GetRequestBody() != nil:
		common = r.GetRequestBody().GetResponse()
	case r.GetRequestHeaders() != nil:
		common = r.GetRequestHeaders().GetResponse()
	default:
		t.Fatalf("want a request answer with a destination, got %v", r)
	}
	var dest string
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == HeaderDestination {
			if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
				t.Errorf("destination header is not overwritten: %v", h.GetAppendAction())
			}
			dest = string(h.GetHeader().GetRawValue())
		}
	}
	if dest == "" {
		t.Fatalf("no %s in %v", HeaderDestination, r)
	}
	if !common.GetClearRouteCache() {
		t.Error("route cache not cleared")
	}
	ns := r.GetDynamicMetadata().GetFields()[MetadataNamespace].GetStructValue().GetFields()
	if got := ns[KeyDestination].GetStringValue(); got != dest {
		t.Errorf("metadata %s/%s = %q, header = %q", MetadataNamespace, KeyDestination, got, dest)
	}
	return dest, ns
}

// immediate checks r is an immediate response with status and an
// OpenAI-style JSON error with code.
func immediate(t *testing.T, r *extprocv3.ProcessingResponse, status int, code string) {
	t.Helper()
	ir := r.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("want immediate %d, got %v", status, r)
	}
	if int(ir.GetStatus().GetCode()) != status {
		t.Fatalf("status %d, want %d (body %s)", ir.GetStatus().GetCode(), status, ir.GetBody())
	}
	var e struct {
		Error struct {
			Message, Type, Code string
		} `json:"error"`
	}
	if err := json.Unmarshal(ir.GetBody(), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body: %q (%v)", ir.GetBody(), err)
	}
	if e.Error.Code != code {
		t.Errorf("code %q, want %q", e.Error.Code, code)
	}
	ct := ""
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "content-type" {
			ct = string(h.GetHeader().GetRawValue())
		}
	}
	if ct != "application/json" {
		t.Errorf("content-type %q", ct)
	}
}

func (te *testEnv) podByAddr(addr string) string {
	for n, p := range te.pods {
		if p.Addr == addr {
			return n
		}
	}
	return ""
}

func TestPickReadyPod(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}, {name: "b"}, {name: "c"}}, "", Options{})
	// Take c down and wait for the router to see it unready: every pick
	// must then be a ready pod.
	_ = te.pods["c"].Close()
	te.waitPods(t, "c unready", func(d podDebug) bool { return !d.Ready }, "c")
	for i := range 6 {
		es := te.open(t)
		dest, ns := destination(t, es.route("/v1/chat/completions", chatBody("llama-3.1-8b", fmt.Sprintf("hello %d", i), false)))
		if pod := te.podByAddr(dest); pod != "a" && pod != "b" {
			t.Fatalf("picked %q (%s), want a ready pod (a or b)", dest, pod)
		}
		// The other ready pod is the fallback.
		if fb := ns[KeyFallback].GetStringValue(); fb == "" || fb == dest || strings.Contains(fb, te.pods["c"].Addr) {
			t.Errorf("fallbacks %q for pick %s", fb, dest)
		}
		es.cancel()
	}
}

func TestAdapterGoesToPodWithAdapter(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}, {name: "b", lora: []string{"sql-lora"}}, {name: "c"}}, "", Options{})
	for i := range 4 {
		es := te.open(t)
		dest, _ := destination(t, es.route("/v1/chat/completions", chatBody("sql-lora", fmt.Sprintf("q %d", i), false)))
		if pod := te.podByAddr(dest); pod != "b" {
			t.Fatalf("adapter request went to %s (%s), want b (the pod listing sql-lora)", dest, pod)
		}
		es.cancel()
	}
}

func TestRefusals(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}}, "max_body_bytes: 2048\n", Options{})
	cases := []struct {
		name, path, body string
		kv               []string
		status           int
		code             string
	}{
		{"unknown model", "/v1/chat/completions", chatBody("gpt-9", "hi", false), nil, 404, "model_not_found"},
		{"malformed JSON", "/v1/chat/completions", `{"model": "llama-3.1-8b", "messages": [`, nil, 400, "invalid_json"},
		{"missing messages", "/v1/chat/completions", `{"model": "llama-3.1-8b"}`, nil, 400, "missing_messages"},
		{"missing prompt", "/v1/completions", `{"model": "llama-3.1-8b", "messages": []}`, nil, 400, "missing_prompt"},
		{"no token", "/v1/chat/completions", chatBody("llama-3.1-8b", "hi", false), []string{"authorization", ""}, 401, "invalid_api_key"},
		{"wrong token", "/v1/chat/completions", chatBody("llama-3.1-8b", "hi", false), []string{"authorization", "Bearer nope"}, 401, "invalid_api_key"},
		{"not an inference path", "/v1/other", chatBody("llama-3.1-8b", "hi", false), nil, 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			es := te.open(t)
			immediate(t, es.route(tc.path, tc.body, tc.kv...), tc.status, tc.code)
		})
	}
	t.Run("too large in chunks", func(t *testing.T) {
		es := te.open(t)
		es.send(requestHeaders("/v1/chat/completions", false))
		es.recv()
		es.send(requestBody(`{"model":"llama-3.1-8b","messages":[{"role":"user","content":"`+strings.Repeat("x", 1500), false))
		es.send(requestBody(strings.Repeat("x", 1500)+`"}]}`, true))
		immediate(t, es.recv(), 413, "request_too_large")
	})
	t.Run("no body", func(t *testing.T) {
		es := te.open(t)
		es.send(requestHeaders("/v1/chat/completions", true))
		immediate(t, es.recv(), 400, "invalid_json")
	})
	// The Anthropic Messages API's refusals take its own shape.
	t.Run("anthropic", func(t *testing.T) {
		es := te.open(t)
		ir := es.route("/v1/messages?beta=true", `{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`).GetImmediateResponse()
		want := `{"type":"error","error":{"type":"not_found_error","message":`
		if ir == nil || ir.GetStatus().GetCode() != 404 || !strings.HasPrefix(string(ir.GetBody()), want) {
			t.Errorf("got %v, want 404 %s...", ir, want)
		} else if !strings.Contains(string(ir.GetBody()), "nope") {
			t.Errorf("not the unknown model refusal: %s", ir.GetBody())
		}
	})
	if n := te.debugPods(t)["a"].InFlight; n != 0 {
		t.Errorf("refused requests left %d in flight", n)
	}
}

func TestAuthByEnvoy(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}}, "", Options{AuthByEnvoy: true})
	es := te.open(t)
	dest, _ := destination(t, es.route("/v1/chat/completions", chatBody("llama-3.1-8b", "hi", false), "authorization", ""))
	if te.podByAddr(dest) != "a" {
		t.Fatalf("picked %s", dest)
	}
}

func TestSpoofedDestinationNotTrusted(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}, {name: "b"}}, "", Options{})
	const spoof = "10.66.66.66:6666"
	es := te.open(t)
	r := es.route("/v1/chat/completions", chatBody("llama-3.1-8b", "hi", false),
		"x-gateway-destination-endpoint", spoof, "x-infergate-priority", "100", "cookie", "c=1")
	dest, _ := destination(t, r)
	if dest == spoof || te.podByAddr(dest) == "" {
		t.Fatalf("destination %q: want one of the pods, not the client's %q", dest, spoof)
	}
	// Applying the mutation as Envoy does leaves only the picked pod, and
	// the client's internal headers and credentials do not reach the pod.
	m := r.GetRequestBody().GetResponse().GetHeaderMutation()
	h := http.Header{"X-Gateway-Destination-Endpoint": {spoof}, "X-Infergate-Priority": {"100"}, "Cookie": {"c=1"}, "Authorization": {"Bearer " + testToken}}
	applyMutation(h, m)
	if got := h.Values(HeaderDestination); len(got) != 1 || got[0] != dest {
		t.Errorf("after mutation %s = %q, want [%s]", HeaderDestination, got, dest)
	}
	for _, k := range []string{"X-Infergate-Priority", "Cookie", "Authorization"} {
		if v := h.Get(k); v != "" {
			t.Errorf("%s = %q still sent to the pod", k, v)
		}
	}
}

// applyMutation applies a header mutation the way Envoy does: removals,
// then sets (overwrite or append per action).
func applyMutation(h http.Header, m *extprocv3.HeaderMutation) {
	for _, k := range m.GetRemoveHeaders() {
		h.Del(k)
	}
	for _, o := range m.GetSetHeaders() {
		k, v := o.GetHeader().GetKey(), string(o.GetHeader().GetRawValue())
		if o.GetAppendAction() == corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			h.Set(k, v)
		} else {
			h.Add(k, v)
		}
	}
}

// TestInFlightAccounting serves a streamed request end to end: the stand-in
// for Envoy sends the request to the picked simulated pod and relays its
// response through ext_proc chunk by chunk. The pod's in-flight count is 1
// from the pick to the end of the stream and 0 after.
func TestInFlightAccounting(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}}, "", Options{})
	body := chatBody("llama-3.1-8b", "tell me a story", true)
	es := te.open(t)
	dest, _ := destination(t, es.route("/v1/chat/completions", body))
	if n := te.debugPods(t)["a"].InFlight; n != 1 {
		t.Fatalf("in flight after the pick = %d, want 1", n)
	}

	// Envoy forwards to the destination (ORIGINAL_DST) ...
	resp, err := http.Post("http://"+dest+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	es.send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(":status", fmt.Sprint(resp.StatusCode), "content-type", resp.Header.Get("Content-Type"),
				"x-infergate-pod", "spoofed-by-pod"),
		}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			MetadataNamespace: {Fields: map[string]*structpb.Value{KeyServed: structpb.NewStringValue(dest)}},
		}},
	})
	hr := es.recv().GetResponseHeaders()
	if hr == nil {
		t.Fatal("no answer to response headers")
	}
	rh := http.Header{"X-Infergate-Pod": {"spoofed-by-pod"}}
	applyMutation(rh, hr.GetResponse().GetHeaderMutation())
	if got := rh.Get("X-Infergate-Pod"); got != "a" {
		t.Errorf("x-infergate-pod = %q, want a", got)
	}
	// ... and streams the body through the filter as it arrives.
	var chunks int
	buf := make([]byte, 4096)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			chunks++
			es.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: bytes.Clone(buf[:n])},
			}})
			if es.recv().GetResponseBody() == nil {
				t.Fatal("no answer to a response body chunk")
			}
			if n := te.debugPods(t)["a"].InFlight; n != 1 {
				t.Fatalf("in flight mid-stream = %d, want 1", n)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			t.Fatal(rerr)
		}
	}
	if chunks == 0 {
		t.Fatal("empty response")
	}
	es.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{EndOfStream: true},
	}})
	es.recv()
	if n := te.debugPods(t)["a"].InFlight; n != 0 {
		t.Fatalf("in flight after end of stream = %d, want 0", n)
	}
	if err := es.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
}

// TestClientGoneCleansUp: Envoy ends the stream before any response (the
// client went away); the request must not stay in flight.
func TestClientGoneCleansUp(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}}, "", Options{})
	es := te.open(t)
	destination(t, es.route("/v1/chat/completions", chatBody("llama-3.1-8b", "bye", true)))
	if n := te.debugPods(t)["a"].InFlight; n != 1 {
		t.Fatalf("in flight after the pick = %d, want 1", n)
	}
	es.cancel()
	te.waitPods(t, "in flight back to 0", func(d podDebug) bool { return d.InFlight == 0 }, "a")
}

// TestFullDuplex follows GIE's streaming mode: the headers answer waits for
// the body and carries the pick; the body comes back as a streamed body.
func TestFullDuplex(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}}, "", Options{})
	es := te.open(t)
	h := requestHeaders("/v1/chat/completions", false)
	h.ProtocolConfig = &extprocv3.ProtocolConfiguration{
		RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	}
	es.send(h)
	body := chatBody("llama-3.1-8b", "duplex", true)
	es.send(requestBody(body[:10], false))
	es.send(requestBody(body[10:], true))
	dest, _ := destination(t, es.recv())
	if te.podByAddr(dest) != "a" {
		t.Fatalf("picked %s", dest)
	}
	sr := es.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if string(sr.GetBody()) != body || !sr.GetEndOfStream() {
		t.Fatalf("streamed body %q eos=%v, want the request body back", sr.GetBody(), sr.GetEndOfStream())
	}
	es.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte("data: [DONE]\n\n"), EndOfStream: true},
	}})
	rb := es.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if string(rb.GetBody()) != "data: [DONE]\n\n" || !rb.GetEndOfStream() {
		t.Fatalf("response chunk not passed back: %v", rb)
	}
	if n := te.debugPods(t)["a"].InFlight; n != 0 {
		t.Fatalf("in flight after end of stream = %d, want 0", n)
	}
}

func TestHealth(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}}, "", Options{})
	hc := healthpb.NewHealthClient(te.conn)
	r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: extprocv3.ExternalProcessor_ServiceDesc.ServiceName})
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", r, err)
	}
}

// TestShedAndNoEndpoint: a sheddable model whose only pod is saturated is
// refused with 429 (and Retry-After); with no ready pod, 503.
func TestShedAndNoEndpoint(t *testing.T) {
	// One request the router has in flight that the pod is not yet running
	// counts as queued; with a queue threshold of 1 the pod is saturated.
	te := newTestEnv(t, []podSpec{{name: "a"}},
		"scheduler: {saturation: {queue_threshold: 1}}\nmodels: [{name: llama-3.1-8b, sheddable: true}]\n", Options{})
	first := te.open(t)
	destination(t, first.route("/v1/chat/completions", chatBody("llama-3.1-8b", "one", false)))

	es := te.open(t)
	r := es.route("/v1/chat/completions", chatBody("llama-3.1-8b", "two", false))
	immediate(t, r, 429, "pool_saturated")
	retry := ""
	for _, h := range r.GetImmediateResponse().GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retry = string(h.GetHeader().GetRawValue())
		}
	}
	if retry != "1" {
		t.Errorf("retry-after %q, want 1", retry)
	}

	_ = te.pods["a"].Close()
	te.waitPods(t, "a unready", func(d podDebug) bool { return !d.Ready }, "a")
	es = te.open(t)
	immediate(t, es.route("/v1/chat/completions", chatBody("llama-3.1-8b", "three", false)), 503, "no_ready_pod")
}

// TestServedByFallback: when Envoy reports (envoy.lb
// x-gateway-destination-endpoint-served) that a fallback served the
// request, the in-flight count moves from the pick to that pod.
func TestServedByFallback(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}, {name: "b"}}, "", Options{})
	es := te.open(t)
	dest, ns := destination(t, es.route("/v1/chat/completions", chatBody("llama-3.1-8b", "fallback", true)))
	fallback := ns[KeyFallback].GetStringValue()
	picked, other := te.podByAddr(dest), te.podByAddr(fallback)
	if picked == "" || other == "" || picked == other {
		t.Fatalf("pick %s (%s), fallback %q (%s)", dest, picked, fallback, other)
	}
	es.send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(":status", "200", "content-type", "text/event-stream"),
		}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			MetadataNamespace: {Fields: map[string]*structpb.Value{KeyServed: structpb.NewStringValue(fallback)}},
		}},
	})
	rh := http.Header{}
	applyMutation(rh, es.recv().GetResponseHeaders().GetResponse().GetHeaderMutation())
	if got := rh.Get("X-Infergate-Pod"); got != other {
		t.Errorf("x-infergate-pod = %q, want the serving pod %s", got, other)
	}
	pods := te.debugPods(t)
	if pods[picked].InFlight != 0 || pods[other].InFlight != 1 {
		t.Fatalf("in flight: picked %s %d, served %s %d; want 0 and 1", picked, pods[picked].InFlight, other, pods[other].InFlight)
	}
	es.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte("data: [DONE]\n\n"), EndOfStream: true},
	}})
	es.recv()
	if n := te.debugPods(t)[other].InFlight; n != 0 {
		t.Fatalf("in flight after end of stream = %d, want 0", n)
	}
}

// TestLargeBufferedBody: a BUFFERED body arrives as one gRPC message, larger
// than gRPC's default 4 MiB receive limit.
func TestLargeBufferedBody(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}}, "max_body_bytes: 8388608\n", Options{})
	es := te.open(t)
	body := chatBody("llama-3.1-8b", strings.Repeat("long prompt ", 500_000), false) // ~6 MB
	dest, _ := destination(t, es.route("/v1/chat/completions", body))
	if te.podByAddr(dest) != "a" {
		t.Fatalf("picked %s", dest)
	}
}

// Internal headers spelled with underscores are removed before the request
// reaches a pod, as the dashed ones are.
func TestUnderscoreInternalHeadersRemoved(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}}, "", Options{})
	es := te.open(t)
	r := es.route("/v1/chat/completions", chatBody("llama-3.1-8b", "hi", false),
		"x_gateway_destination_endpoint", "10.66.66.66:6666", "x_infergate_priority", "100")
	removed := r.GetRequestBody().GetResponse().GetHeaderMutation().GetRemoveHeaders()
	for _, k := range []string{"x_gateway_destination_endpoint", "x_infergate_priority"} {
		if !slices.Contains(removed, k) {
			t.Errorf("%s not removed (removed: %v)", k, removed)
		}
	}
}

// A connection that never completes the HTTP/2 handshake is closed after
// timeouts.read_header.
func TestExtProcHandshakeTimeout(t *testing.T) {
	te := newTestEnv(t, []podSpec{{name: "a"}}, "timeouts: {read_header: 200ms}\n", Options{})
	c, err := net.Dial("tcp", te.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("silent connection still open")
	}
}
