package extproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/sim/server"
	"github.com/infergate/infergate/tier1/gateway"
)

// fuzzEnv is one simulated pod, a gateway over it and the ext_proc server
// on a loopback gRPC socket, shared by every fuzz input.
type fuzzEnv struct {
	client  extprocv3.ExternalProcessorClient
	debug   string
	podAddr string
}

func newFuzzEnv(f *testing.F) *fuzzEnv {
	ctx, cancel := context.WithCancel(context.Background())
	f.Cleanup(cancel)
	pod, err := server.Listen(ctx, server.Config{Name: "a", Model: "llama-3.1-8b", GPU: "h100", TimeScale: 0.01, MaxLoras: 2,
		LoRAModules: []server.LoRAModule{{Name: "sql-lora", Path: "/adapters/sql-lora"}}, Logger: slog.New(slog.DiscardHandler)}, "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = pod.Close() })
	yaml := fmt.Sprintf("auth: {tokens: [%s]}\nscrape: {interval: 20ms, models_interval: 50ms}\n"+
		"pools: [{name: llama, model: llama-3.1-8b}]\npods:\n  - {name: a, address: %q, pool: llama, gpu: h100}\n", testToken, pod.Addr)
	var cfg gateway.Config
	if err := config.Decode("fuzz.yaml", []byte(yaml), &cfg); err != nil {
		f.Fatal(err)
	}
	gw, err := gateway.New(ctx, &cfg, gateway.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(gw.Close)
	hs := httptest.NewServer(gw)
	f.Cleanup(hs.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go func() { _ = New(gw, Options{}).Serve(ctx, ln, time.Second) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = conn.Close() })
	fe := &fuzzEnv{client: extprocv3.NewExternalProcessorClient(conn), debug: hs.URL, podAddr: pod.Addr}
	// Wait until the pod is ready with its models listed.
	for deadline := time.Now().Add(20 * time.Second); ; {
		if p, ok := fe.pod(); ok && p.Ready && len(p.Models) > 0 {
			break
		}
		if time.Now().After(deadline) {
			f.Fatal("pod never became ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fe
}

func (fe *fuzzEnv) pod() (podDebug, bool) {
	req, _ := http.NewRequest(http.MethodGet, fe.debug+"/debug/pods", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return podDebug{}, false
	}
	defer resp.Body.Close()
	var out struct {
		Pods []podDebug `json:"pods"`
	}
	if json.NewDecoder(resp.Body).Decode(&out) != nil || len(out.Pods) != 1 {
		return podDebug{}, false
	}
	return out.Pods[0], true
}

// FuzzProcess plays Envoy with fuzzed request headers, body chunks and
// response body over a real gRPC stream. Whatever a client sends, the
// server must answer in bounded time with either an OpenAI-style error
// (4xx/503, JSON body) or a pick of the real pod (never a destination the
// client named), and the pod's in-flight count must return to zero.
func FuzzProcess(f *testing.F) {
	fe := newFuzzEnv(f)
	chat := `{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hi"}],"stream":true}`
	sse := "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"
	f.Add(uint8(0), "POST", "/v1/chat/completions", "x-gateway-destination-endpoint", "10.6.6.6:80", []byte(chat), uint16(7), []byte(sse))
	f.Add(uint8(1), "POST", "/v1/chat/completions", "x-infergate-pod", "b", []byte(chat), uint16(0), []byte(sse))
	f.Add(uint8(2), "POST", "/v1/completions", "authorization", "Bearer wrong", []byte(`{"model":"sql-lora","prompt":"x"}`), uint16(3), []byte("{}"))
	f.Add(uint8(4), "GET", "/v1/models", "content-length", "-1", []byte(nil), uint16(0), []byte(nil))
	f.Add(uint8(5), "POST", "/v1/chat/completions", "content-type", "text/plain", []byte(`{"model":"llama-3.1-8b","model":"x"}`), uint16(1), []byte("data: {"))
	f.Add(uint8(6), "PUT", "/../v1/embeddings?x=1", "x-request-id", "\x00\xff", []byte(`{"model":1}`), uint16(65535), []byte("\xff"))
	f.Add(uint8(3), "POST", "/v1/chat/completions", "authorization", "bearer "+testToken, []byte(`{"model":"llama-3.1-8b","messages":[],"max_tokens":-1}`), uint16(2), []byte(sse))
	f.Fuzz(func(t *testing.T, mode uint8, method, path, hk, hv string, body []byte, split uint16, respBody []byte) {
		if !utf8.ValidString(hk) {
			return // a proto3 string: Envoy cannot send it, gRPC refuses to marshal it
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stream, err := fe.client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		duplex := mode&1 != 0
		noBody := mode&2 != 0
		kv := []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte(method)}, {Key: ":path", RawValue: []byte(path)},
			{Key: ":authority", RawValue: []byte("gateway")}, {Key: "content-type", RawValue: []byte("application/json")},
		}
		if mode&4 == 0 {
			kv = append(kv, &corev3.HeaderValue{Key: "authorization", RawValue: []byte("Bearer " + testToken)})
		}
		kv = append(kv, &corev3.HeaderValue{Key: hk, RawValue: []byte(hv)})
		hdr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: kv}, EndOfStream: noBody}}}
		if duplex {
			hdr.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
				ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
		}
		msgs := []*extprocv3.ProcessingRequest{hdr}
		if !noBody {
			cut := min(int(split), len(body))
			for i, chunk := range [][]byte{body[:cut], body[cut:]} {
				msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
					RequestBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: i == 1}}})
			}
		}
		msgs = append(msgs,
			&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")},
					{Key: "content-type", RawValue: []byte("text/event-stream")}, {Key: "x-gateway-spoof", RawValue: []byte("1")}}}}}},
			&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: respBody, EndOfStream: true}}},
		)
		// Envoy's side: send everything (the server may stop reading after
		// an immediate response), then read until the server ends the stream.
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			for _, m := range msgs {
				if stream.Send(m) != nil {
					return
				}
			}
			_ = stream.CloseSend()
		}()
		var picked, refused bool
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				if ctx.Err() != nil {
					t.Fatalf("stream hung: %v", err)
				}
				t.Fatalf("stream error: %v", err)
			}
			if ir := resp.GetImmediateResponse(); ir != nil {
				refused = true
				code := int(ir.GetStatus().GetCode())
				switch code {
				case 400, 401, 403, 404, 405, 413, 415, 429, 503:
				default:
					t.Fatalf("immediate response %d: %s", code, ir.GetBody())
				}
				var e struct {
					Error struct{ Message, Type string } `json:"error"`
				}
				if json.Unmarshal(ir.GetBody(), &e) != nil || e.Error.Message == "" || e.Error.Type == "" {
					t.Fatalf("%d without an OpenAI-shaped body: %q", code, ir.GetBody())
				}
			}
			var hm *extprocv3.HeaderMutation
			if rh := resp.GetRequestHeaders(); rh != nil {
				hm = rh.GetResponse().GetHeaderMutation()
			}
			if rb := resp.GetRequestBody(); rb != nil && hm == nil {
				hm = rb.GetResponse().GetHeaderMutation()
			}
			for _, h := range hm.GetSetHeaders() {
				if h.GetHeader().GetKey() == HeaderDestination {
					picked = true
					if d := string(h.GetHeader().GetRawValue()); d != fe.podAddr {
						t.Fatalf("destination %q, the only pod is %s", d, fe.podAddr)
					}
				}
			}
		}
		<-sent
		if picked && refused {
			t.Fatal("both picked and refused")
		}
		// The pick (if any) must be released whatever the stream did.
		for deadline := time.Now().Add(5 * time.Second); ; {
			if p, ok := fe.pod(); ok && p.InFlight == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("pod's in-flight count did not return to 0")
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}
