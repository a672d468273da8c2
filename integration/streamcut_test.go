package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/infergate/infergate/devstack"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/server"
	"github.com/infergate/infergate/tier2/tenant"
)

// startTier2Over runs Tier 2 in process (as devstack does) with one
// static cluster, the Tier 1 at tier1URL, and one tenant; it returns
// Tier 2's base URL and the tenant's key.
func startTier2Over(t *testing.T, tier1URL, tier1Token string) (string, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const key = "sk-it-cut"
	cfg := server.Config{
		Listen: ln.Addr().String(), Region: "local",
		Tier1:   server.Tier1Config{Token: tier1Token, PollInterval: 200 * time.Millisecond},
		Tenants: []tenant.Tenant{{ID: "cut", Name: "stream cut"}},
		Keys:    []tenant.SeedKey{{TenantID: "cut", Name: "it", Key: key}},
		Clusters: []discovery.Cluster{{ID: "podkill", Name: "podkill", Region: "local", Address: tier1URL,
			Models: []string{devstack.LlamaModel}}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(ctx, cfg, server.Options{Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 2 * time.Second})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, ln, nil) }()
	t.Cleanup(func() { cancel(); <-done; _ = srv.Close() })
	url := "http://" + ln.Addr().String()
	waitFor(t, "tier 2 to be ready", 30*time.Second, func() error {
		resp, err := http.Get(url + "/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("ready: %s", resp.Status)
		}
		return nil
	})
	return url, key
}

// sseEvent is one event of a stream: its name and data.
type sseEvent struct{ name, data string }

// readEvents reads events from r into out until EOF or an error, and
// signals started after the first n content events.
func readEvents(r io.Reader, n int, started chan<- struct{}) ([]sseEvent, error) {
	var evs []sseEvent
	var cur sseEvent
	content := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.data != "" {
				evs = append(evs, cur)
				if strings.Contains(cur.data, "delta") {
					if content++; content == n {
						close(started)
					}
				}
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[len("data: "):]
		}
	}
	return evs, sc.Err()
}

// TestAPIStreamCut cuts streams mid-way, for each API, in each tier: a
// pod SIGKILLed under Tier 1, or the Tier 1 process SIGKILLed under
// Tier 2. The client (through Tier 2 either way) must see its stream end
// with an error in its own API's shape: the OpenAI error chunk for chat,
// Anthropic's error event for Messages, and for Responses an error event
// numbered after the last one relayed, then response.failed naming the
// stream's response.
func TestAPIStreamCut(t *testing.T) {
	needBinary(t)
	bodies := map[string]string{
		"/v1/chat/completions": `{"model":%q,"stream":true,"max_tokens":3000,"messages":[{"role":"user","content":"write at length"}]}`,
		"/v1/responses":        `{"model":%q,"stream":true,"max_output_tokens":3000,"input":"write at length"}`,
		"/v1/messages":         `{"model":%q,"stream":true,"max_tokens":3000,"messages":[{"role":"user","content":"write at length"}]}`,
	}
	for _, cut := range []string{"pod", "tier1"} {
		for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/messages"} {
			t.Run(cut+path, func(t *testing.T) {
				// Real time: 3000 tokens take tens of seconds, the cut
				// lands mid-decode.
				c := startPodCluster(t, 1, 1)
				url, key := startTier2Over(t, c.url, c.token)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(fmt.Sprintf(bodies[path], devstack.LlamaModel)))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if resp.StatusCode != 200 {
					b, _ := io.ReadAll(resp.Body)
					t.Fatalf("%s: %s", resp.Status, b)
				}
				started := make(chan struct{})
				type result struct {
					evs []sseEvent
					err error
				}
				res := make(chan result, 1)
				go func() { evs, err := readEvents(resp.Body, 3, started); res <- result{evs, err} }()
				select {
				case <-started:
				case <-ctx.Done():
					t.Fatal("no tokens streamed")
				}
				if cut == "pod" {
					c.pods[0].kill(t)
				} else {
					c.tier1.kill(t)
				}
				var r result
				select {
				case r = <-res:
				case <-ctx.Done():
					t.Fatal("the cut stream never ended: a hung stream")
				}
				if r.err != nil {
					t.Fatalf("the stream ended without its error event: %v", r.err)
				}
				checkCutStream(t, path, r.evs)
			})
		}
	}
}

// checkCutStream checks that evs, a stream cut mid-way, ends with an
// error in path's API's shape.
func checkCutStream(t *testing.T, path string, evs []sseEvent) {
	t.Helper()
	n := len(evs)
	if n < 4 {
		t.Fatalf("%d events", n)
	}
	last := map[string]any{}
	if err := json.Unmarshal([]byte(evs[n-1].data), &last); err != nil {
		t.Fatalf("last event %q: %v", evs[n-1].data, err)
	}
	switch path {
	case "/v1/chat/completions":
		e, _ := last["error"].(map[string]any)
		if evs[n-1].name != "" || e["type"] != "server_error" || e["code"] != "upstream_interrupted" || e["message"] == "" {
			t.Errorf("chat stream ends with %+v", evs[n-1])
		}
	case "/v1/messages":
		e, _ := last["error"].(map[string]any)
		if evs[n-1].name != "error" || last["type"] != "error" || e["type"] != "api_error" || e["message"] == "" || len(e) != 2 {
			t.Errorf("messages stream ends with %+v", evs[n-1])
		}
	case "/v1/responses":
		var created struct {
			Response struct{ ID string }
		}
		var seqs []int
		for _, ev := range evs {
			var d struct {
				Type string
				Seq  *int `json:"sequence_number"`
			}
			if json.Unmarshal([]byte(ev.data), &d) != nil || d.Seq == nil || d.Type != ev.name {
				t.Fatalf("event %+v: no name, type or sequence number", ev)
			}
			seqs = append(seqs, *d.Seq)
			if ev.name == "response.created" {
				_ = json.Unmarshal([]byte(ev.data), &created)
			}
		}
		for i, s := range seqs {
			if s != i {
				t.Fatalf("sequence numbers %v are not 0, 1, 2, ...", seqs)
			}
		}
		var errEv struct{ Type, Code, Message string }
		_ = json.Unmarshal([]byte(evs[n-2].data), &errEv)
		r, _ := last["response"].(map[string]any)
		re, _ := r["error"].(map[string]any)
		if evs[n-2].name != "error" || errEv.Code != "upstream_interrupted" || errEv.Message == "" {
			t.Errorf("responses stream: next to last %+v", evs[n-2])
		}
		if evs[n-1].name != "response.failed" || r["id"] != created.Response.ID || r["id"] == "" || r["status"] != "failed" || re["message"] == "" {
			t.Errorf("responses stream ends with %+v (created %s)", evs[n-1], created.Response.ID)
		}
	}
	t.Logf("%d events, then %s", n, evs[n-1].data)
}

// TestAPIStreamCutSDKs: the official SDKs see a cut stream for what it
// is. The Anthropic SDK skips unnamed events, so before errors took
// Anthropic's shape a cut Messages stream looked to it like a short,
// successful one; now its stream ends in an api_error. The OpenAI SDK
// receives the Responses stream's response.failed.
func TestAPIStreamCutSDKs(t *testing.T) {
	needBinary(t)
	t.Run("anthropic", func(t *testing.T) {
		c := startPodCluster(t, 1, 1)
		url, key := startTier2Over(t, c.url, c.token)
		client := anthropic.NewClient(aoption.WithBaseURL(url), aoption.WithAPIKey(key), aoption.WithMaxRetries(0))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stream := client.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
			Model: anthropic.Model(devstack.LlamaModel), MaxTokens: 3000,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("write at length"))},
		})
		deltas := 0
		for stream.Next() {
			if stream.Current().Type == "content_block_delta" {
				if deltas++; deltas == 3 {
					c.pods[0].kill(t)
				}
			}
		}
		var ae *anthropic.Error
		if err := stream.Err(); !errors.As(err, &ae) || ae.Type() != "api_error" || deltas < 3 {
			t.Fatalf("after %d deltas: %v", deltas, err)
		}
		t.Logf("after %d deltas: %v", deltas, stream.Err())
	})
	t.Run("openai", func(t *testing.T) {
		c := startPodCluster(t, 1, 1)
		url, key := startTier2Over(t, c.url, c.token)
		client := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
			Model: devstack.LlamaModel, MaxOutputTokens: openai.Int(3000),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("write at length")},
		})
		deltas, id := 0, ""
		var failed *responses.Response
		var errEvent string
		for stream.Next() {
			ev := stream.Current()
			switch ev.Type {
			case "response.created":
				id = ev.Response.ID
			case "response.output_text.delta":
				if deltas++; deltas == 3 {
					c.pods[0].kill(t)
				}
			case "error":
				errEvent = ev.Code
			case "response.failed":
				r := ev.Response
				failed = &r
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if errEvent != "upstream_interrupted" || failed == nil || failed.ID != id || failed.Status != responses.ResponseStatusFailed || failed.Error.Message == "" {
			t.Fatalf("after %d deltas: error event %q, response.failed %+v", deltas, errEvent, failed)
		}
		t.Logf("after %d deltas: %s, %s failed: %s", deltas, errEvent, failed.ID, failed.Error.Message)
	})
}
