package gateway

import (
	"encoding/json"
	"net/http"
	"testing"
)

// The Responses and Anthropic Messages endpoints are routed like chat:
// model from the body, prompt (system text first) for prefix affinity,
// errors in each API's own shape.
func TestResponsesAndMessages(t *testing.T) {
	e := newEnv(t, []*fakePod{newFakePod(t, "p1")}, "")
	for _, tc := range []struct {
		path, body string
		status     int
		anthropic  bool // the error must be in Anthropic's shape
	}{
		{"/v1/responses", `{"model":"llama","instructions":"sys","input":"hi","max_output_tokens":5}`, 200, false},
		{"/v1/responses", `{"model":"llama","input":[{"role":"user","content":"hi"}]}`, 200, false},
		{"/v1/messages", `{"model":"llama","system":"sys","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, 200, false},
		{"/v1/messages/count_tokens", `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`, 200, false},
		{"/v1/responses", `{"model":"llama"}`, 400, false},
		{"/v1/messages", `{"model":"llama","max_tokens":5}`, 400, true},
		{"/v1/messages", `{"model":"nope","messages":[],"max_tokens":5}`, 404, true},
		{"/v1/messages", `{"model":"llama","messages":[],"max_tokens":5,"Max_tokens":1}`, 400, true},
	} {
		r := e.do(t, http.MethodPost, tc.path, tc.body, nil)
		if r.status != tc.status {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, r.status, r.body)
			continue
		}
		if r.status == 200 {
			p := e.pods["p1"]
			p.mu.Lock()
			got := p.lastReq.URL.Path
			p.mu.Unlock()
			if got != tc.path {
				t.Errorf("pod got %s, want %s", got, tc.path)
			}
			continue
		}
		var anth struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if tc.anthropic {
			if json.Unmarshal([]byte(r.body), &anth) != nil || anth.Type != "error" || anth.Error.Type == "" || anth.Error.Message == "" {
				t.Errorf("%s: not an Anthropic error: %s", tc.path, r.body)
			}
		} else {
			errorCode(t, r.body)
		}
	}
	// Unauthenticated: Anthropic's shape too.
	r := e.do(t, http.MethodPost, "/v1/messages", `{}`, map[string]string{"Authorization": ""})
	if r.status != 401 || r.body != `{"type":"error","error":{"type":"authentication_error","message":"missing or invalid bearer token"}}` {
		t.Errorf("401: %d %s", r.status, r.body)
	}
}

func TestPromptBytesSystemFirst(t *testing.T) {
	for _, tc := range []struct {
		ep   endpoint
		body string
		want string
	}{
		{epResponses, `{"model":"m","instructions":"S","input":"I"}`, "\"S\"\n\"I\""},
		{epResponses, `{"model":"m","input":"I"}`, `"I"`},
		{epMessages, `{"model":"m","system":"S","messages":[1]}`, "\"S\"\n[1]"},
		{epChat, `{"model":"m","system":"S","messages":[1]}`, `[1]`}, // chat has no system field
	} {
		b, err := parseBody(tc.ep, []byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if got := string(b.promptBytes(tc.ep)); got != tc.want {
			t.Errorf("%s %s: %q, want %q", tc.ep.path, tc.body, got, tc.want)
		}
	}
}
