package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/devstack"
)

// startDevStack runs make run's stack (`infergate-lab dev`: devstack with its
// default topology, four clusters of simulated pods in two regions) in
// process, on free ports.
func startDevStack(t *testing.T) *devstack.Stack {
	t.Helper()
	if testing.Short() {
		t.Skip("integration suite: skipped under -short")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := devstack.Start(ctx, devstack.Options{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", TimeScale: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// apiUsage is one answer's token counts, whatever the API.
type apiUsage struct{ in, out int }

// post sends body to Tier 2 and returns the response and its body.
func post(t *testing.T, st *devstack.Stack, path, body string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+st.Addr+path, strings.NewReader(body))
	if strings.HasPrefix(path, "/v1/messages") {
		req.Header.Set("x-api-key", st.APIKey) // as Anthropic clients send it
		req.Header.Set("anthropic-version", "2023-06-01")
	} else {
		req.Header.Set("Authorization", "Bearer "+st.APIKey)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// sseEvents splits an event stream into (event name, data) pairs.
func sseEvents(t *testing.T, b []byte) [][2]string {
	t.Helper()
	var out [][2]string
	var name, data string
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data != "" {
				out = append(out, [2]string{name, data})
			}
			name, data = "", ""
		case strings.HasPrefix(line, "event: "):
			name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			data = line[len("data: "):]
		}
	}
	return out
}

// TestAPIs sends one conversation as Chat Completions, Responses and
// Anthropic Messages through make run's stack (Tier 2, Tier 1, the
// simulator), streaming and not: each gets a well-formed answer in its
// API's shape, the same prompt token count, a completion count that is
// the answer's (the simulator writes one word per token), and the
// tenant's TPM is charged exactly the tokens the answer reports.
func TestAPIs(t *testing.T) {
	st := startDevStack(t)
	const sys, user, maxTok = "You are terse.", "Say hello to the router.", 12
	bodies := map[string]string{
		"/v1/chat/completions": fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":%d`, devstack.LlamaModel, sys, user, maxTok),
		"/v1/responses":        fmt.Sprintf(`{"model":%q,"instructions":%q,"input":%q,"max_output_tokens":%d`, devstack.LlamaModel, sys, user, maxTok),
		"/v1/messages":         fmt.Sprintf(`{"model":%q,"system":%q,"messages":[{"role":"user","content":[{"type":"text","text":%q}]}],"max_tokens":%d`, devstack.LlamaModel, sys, user, maxTok),
	}
	prompt := 0
	for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/messages"} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%t", path, stream), func(t *testing.T) {
				body := bodies[path] + fmt.Sprintf(`,"stream":%t}`, stream)
				if stream && path == "/v1/chat/completions" {
					body = bodies[path] + `,"stream":true,"stream_options":{"include_usage":true}}`
				}
				before := tpmUsed(t, st)
				resp, b := post(t, st, path, body)
				if resp.StatusCode != 200 {
					t.Fatalf("%s: %s", resp.Status, b)
				}
				if resp.Header.Get("X-Request-Id") == "" {
					t.Error("no X-Request-Id")
				}
				var u apiUsage
				var text string
				if stream {
					u, text = streamAnswer(t, path, sseEvents(t, b))
				} else {
					u, text = bufferedAnswer(t, path, b)
				}
				if text == "" || u.in <= 0 || u.out <= 0 || u.out > maxTok {
					t.Fatalf("answer %q usage %+v:\n%s", text, u, b)
				}
				if words := len(strings.Fields(text)); words != u.out {
					t.Errorf("usage reports %d completion tokens, the answer has %d: %q", u.out, words, text)
				}
				if prompt == 0 {
					prompt = u.in
				} else if u.in != prompt {
					t.Errorf("prompt tokens %d, chat completions counted %d for the same conversation", u.in, prompt)
				}
				var delta int64
				waitFor(t, "the tenant's TPM to be charged", 5*time.Second, func() error {
					if delta = tpmUsed(t, st) - before; delta != int64(u.in+u.out) {
						return fmt.Errorf("TPM charged %d, answer reports %d+%d", delta, u.in, u.out)
					}
					return nil
				})
				t.Logf("usage %d+%d, TPM charged %d", u.in, u.out, delta)
			})
		}
	}

	t.Run("errors", func(t *testing.T) {
		for _, tc := range []struct {
			path, body, typ string
			status          int
		}{
			// Tier 2's own refusal, in each API's shape.
			{"/v1/messages", `{"model":"nope","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, "not_found_error", 404},
			{"/v1/messages", fmt.Sprintf(`{"model":%q,"messages":[],"max_tokens":5,"MAX_TOKENS":9999}`, devstack.LlamaModel), "invalid_request_error", 400},
			{"/v1/responses", fmt.Sprintf(`{"model":%q,"input":"hi","max_output_tokens":5,"Max_Output_Tokens":9999}`, devstack.LlamaModel), "invalid_request_error", 400},
			// The engine's refusal, relayed through both tiers.
			{"/v1/messages", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, devstack.LlamaModel), "invalid_request_error", 400},
		} {
			resp, b := post(t, st, tc.path, tc.body)
			var anth struct {
				Type  string
				Error struct{ Type, Message string }
			}
			if err := json.Unmarshal(b, &anth); err != nil || resp.StatusCode != tc.status || anth.Error.Type != tc.typ || anth.Error.Message == "" {
				t.Errorf("%s %s: %s %s", tc.path, tc.body, resp.Status, b)
				continue
			}
			if strings.HasPrefix(tc.path, "/v1/messages") && anth.Type != "error" {
				t.Errorf("%s: not the Anthropic error shape: %s", tc.path, b)
			}
		}
		resp, b := post(t, st, "/v1/messages/count_tokens", fmt.Sprintf(`{"model":%q,"system":%q,"messages":[{"role":"user","content":%q}]}`, devstack.LlamaModel, sys, user))
		var ct struct {
			InputTokens int `json:"input_tokens"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &ct) != nil || ct.InputTokens != prompt {
			t.Errorf("count_tokens: %s %s, want %d", resp.Status, b, prompt)
		}
	})
}

func bufferedAnswer(t *testing.T, path string, b []byte) (apiUsage, string) {
	t.Helper()
	switch path {
	case "/v1/responses":
		var r struct {
			Object, Status string
			Output         []struct {
				Type    string
				Content []struct{ Type, Text string }
			}
			Usage struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			}
		}
		if err := json.Unmarshal(b, &r); err != nil || r.Object != "response" || r.Status != "completed" || len(r.Output) != 1 || len(r.Output[0].Content) != 1 {
			t.Fatalf("not a response (%v): %s", err, b)
		}
		return apiUsage{r.Usage.InputTokens, r.Usage.OutputTokens}, r.Output[0].Content[0].Text
	case "/v1/messages":
		var m struct {
			Type, Role, StopReason string
			Content                []struct{ Type, Text string }
			Usage                  struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			}
		}
		if err := json.Unmarshal(b, &m); err != nil || m.Type != "message" || m.Role != "assistant" || len(m.Content) != 1 {
			t.Fatalf("not a message (%v): %s", err, b)
		}
		return apiUsage{m.Usage.InputTokens, m.Usage.OutputTokens}, m.Content[0].Text
	}
	var c struct {
		Choices []struct{ Message struct{ Content string } }
		Usage   struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("not a chat completion (%v): %s", err, b)
	}
	return apiUsage{c.Usage.PromptTokens, c.Usage.CompletionTokens}, c.Choices[0].Message.Content
}

func streamAnswer(t *testing.T, path string, evs [][2]string) (apiUsage, string) {
	t.Helper()
	var u apiUsage
	var text strings.Builder
	var last string
	for _, ev := range evs {
		name, data := ev[0], ev[1]
		if data == "[DONE]" {
			last = data
			continue
		}
		var d struct {
			Type    string
			Delta   json.RawMessage
			Choices []struct{ Delta struct{ Content string } }
			Usage   *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
				OutputTokens     int `json:"output_tokens"`
			}
			Response *struct {
				Usage *struct {
					InputTokens  int `json:"input_tokens"`
					OutputTokens int `json:"output_tokens"`
				}
			}
			Message *struct {
				Usage struct {
					InputTokens int `json:"input_tokens"`
				}
			}
		}
		if err := json.Unmarshal([]byte(data), &d); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if path != "/v1/chat/completions" && name != d.Type {
			t.Errorf("event name %q, data type %q", name, d.Type)
		}
		last = d.Type
		switch d.Type {
		case "response.output_text.delta":
			var s string
			_ = json.Unmarshal(d.Delta, &s)
			text.WriteString(s)
		case "response.completed":
			u = apiUsage{d.Response.Usage.InputTokens, d.Response.Usage.OutputTokens}
		case "content_block_delta":
			var td struct{ Type, Text string }
			_ = json.Unmarshal(d.Delta, &td)
			text.WriteString(td.Text)
		case "message_start":
			u.in = d.Message.Usage.InputTokens
		case "message_delta":
			u.out = d.Usage.OutputTokens
		case "":
			for _, c := range d.Choices {
				text.WriteString(c.Delta.Content)
			}
			if d.Usage != nil {
				u = apiUsage{d.Usage.PromptTokens, d.Usage.CompletionTokens}
			}
		}
	}
	want := map[string]string{"/v1/chat/completions": "[DONE]", "/v1/responses": "response.completed", "/v1/messages": "message_stop"}[path]
	if last != want {
		t.Errorf("stream ended with %q, want %q", last, want)
	}
	return u, text.String()
}
