package server

import (
	"encoding/json"
	"strings"
	"testing"
)

// The Responses and Anthropic Messages endpoints: the same conversation
// counts the same prompt tokens as chat; answers and errors take each
// API's shape; streams use named events.
func TestDialects(t *testing.T) {
	p := startPod(t, Config{ServedModelName: "m", TimeScale: 0.05})
	base := p.URL
	chat := `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"hello there"}],"max_tokens":4}`
	_, b := postJSON(t, base+"/v1/chat/completions", chat)
	var c struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
	}
	if err := json.Unmarshal(b, &c); err != nil || c.Usage.PromptTokens == 0 {
		t.Fatalf("chat: %s", b)
	}
	for _, tc := range []struct {
		path, body, inKey string
	}{
		{"/v1/responses", `{"model":"m","instructions":"S","input":"hello there","max_output_tokens":4}`, "input_tokens"},
		{"/v1/responses", `{"model":"m","instructions":"S","input":[{"role":"user","content":[{"type":"input_text","text":"hello there"}]}],"max_output_tokens":4}`, "input_tokens"},
		{"/v1/messages", `{"model":"m","system":[{"type":"text","text":"S"}],"messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`, "input_tokens"},
		{"/v1/messages/count_tokens", `{"model":"m","system":"S","messages":[{"role":"user","content":"hello there"}]}`, "input_tokens"},
	} {
		code, b := postJSON(t, base+tc.path, tc.body)
		var m map[string]any
		if code != 200 || json.Unmarshal(b, &m) != nil {
			t.Fatalf("%s: %d %s", tc.path, code, b)
		}
		u, _ := m["usage"].(map[string]any)
		if u == nil {
			u = m
		}
		if got, _ := u[tc.inKey].(float64); int(got) != c.Usage.PromptTokens {
			t.Errorf("%s: %s = %v, chat counted %d: %s", tc.path, tc.inKey, u[tc.inKey], c.Usage.PromptTokens, b)
		}
	}
	// Streams: named events, usage in each API's own place.
	for path, want := range map[string][]string{
		"/v1/responses": {"event: response.created", "event: response.output_text.delta", "event: response.completed", `"output_tokens":4`},
		"/v1/messages":  {"event: message_start", "event: content_block_delta", "event: message_delta", "event: message_stop", `"usage":{"output_tokens":4}`},
	} {
		body := `{"model":"m","stream":true,"input":"hi","max_output_tokens":4}`
		if path == "/v1/messages" {
			body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
		}
		code, b := postJSON(t, base+path, body)
		if code != 200 || strings.Contains(string(b), "[DONE]") {
			t.Fatalf("%s: %d %s", path, code, b)
		}
		for _, w := range want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s stream lacks %s:\n%s", path, w, b)
			}
		}
	}
	// Errors: Anthropic's shape on its paths.
	code, b := postJSON(t, base+"/v1/messages", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if code != 400 || string(b) != `{"type":"error","error":{"type":"invalid_request_error","message":"'max_tokens' is a required property"}}` {
		t.Errorf("missing max_tokens: %d %s", code, b)
	}
	code, b = postJSON(t, base+"/v1/responses", `{"model":"m"}`)
	if code != 400 || !strings.Contains(string(b), `"code":"missing_input"`) {
		t.Errorf("missing input: %d %s", code, b)
	}
}
