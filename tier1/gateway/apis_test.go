package gateway

import (
	"encoding/json"
	"io"
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

// A stream the pod cuts mid-way ends in the API's own error shape, and
// the chunking of the pod's writes does not matter: the Responses error
// continues the stream's numbering and response.failed names the
// response; Anthropic's is its error event; chat keeps the OpenAI one.
func TestBrokenStreamErrorShapes(t *testing.T) {
	streams := map[string]string{
		"/v1/responses": "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_p\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"a\"}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"delta\":\"b\"}\n\n",
		"/v1/messages": "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_p\"}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n",
		"/v1/chat/completions": "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
	}
	pod := newFakePod(t, "p0")
	pod.set(func(p *fakePod) {
		p.handler = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			s := streams[r.URL.Path]
			for len(s) > 0 { // small writes: events split across reads
				n := min(13, len(s))
				_, _ = io.WriteString(w, s[:n])
				w.(http.Flusher).Flush()
				s = s[n:]
			}
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close() // the pod dies mid-stream
			}
		}
	})
	e := newEnv(t, []*fakePod{pod}, "")
	for path, want := range map[string]string{
		"/v1/responses": "event: error\ndata: {\"type\":\"error\",\"code\":\"upstream_interrupted\",\"message\":\"upstream stream interrupted\",\"param\":null,\"sequence_number\":3}\n\n" +
			"event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":4,\"response\":{\"error\":{\"code\":\"server_error\",\"message\":\"upstream stream interrupted\"},\"id\":\"resp_p\",\"object\":\"response\",\"output\":[],\"status\":\"failed\"}}\n\n",
		"/v1/messages":         "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"upstream stream interrupted\"}}\n\n",
		"/v1/chat/completions": "data: {\"error\":{\"message\":\"upstream stream interrupted\",\"type\":\"server_error\",\"param\":null,\"code\":\"upstream_interrupted\"}}\n\n",
	} {
		body := `{"model":"llama","stream":true,"input":"hi","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
		r := e.do(t, http.MethodPost, path, body, nil)
		if r.status != 200 || r.body != streams[path]+want {
			t.Errorf("%s: %d\n%s\nwant the stream then\n%s", path, r.status, r.body, want)
		}
	}
}
