package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/infergate/infergate/shared/openai"
)

func TestUpstreamHeaders(t *testing.T) {
	in := http.Header{}
	in.Set("Authorization", "Bearer client-secret")
	in.Set("Cookie", "a=b")
	in.Set("Connection", "keep-alive, X-Trace-Hop")
	in.Set("X-Trace-Hop", "1")
	in.Set("Keep-Alive", "timeout=5")
	in.Set("Te", "trailers")
	in.Set("Upgrade", "websocket")
	in.Set("Proxy-Authorization", "Basic x")
	in.Set("X-Gateway-Destination-Endpoint", "10.0.0.9:8000")
	in.Set("X-Infergate-Priority", "10")
	in.Set("X-Forwarded-For", "10.1.1.1")
	in.Set("Content-Type", "application/json")
	in.Set("X-Request-Id", "r1")

	tests := []struct {
		name, token string
		wantAuth    string
	}{
		{"no upstream token", "", ""},
		{"upstream token", "pod-key", "Bearer pod-key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := upstreamHeaders(in, "192.0.2.7", tt.token)
			for _, h := range []string{"Cookie", "Connection", "X-Trace-Hop", "Keep-Alive", "Te", "Upgrade",
				"Proxy-Authorization", "X-Gateway-Destination-Endpoint", "X-Infergate-Priority"} {
				if v := out.Get(h); v != "" {
					t.Errorf("%s forwarded: %q", h, v)
				}
			}
			if got := out.Get("Authorization"); got != tt.wantAuth {
				t.Errorf("Authorization = %q, want %q", got, tt.wantAuth)
			}
			if got := out.Get("X-Forwarded-For"); got != "192.0.2.7" { // the client's own is dropped
				t.Errorf("X-Forwarded-For = %q", got)
			}
			if out.Get("Content-Type") != "application/json" || out.Get("X-Request-Id") != "r1" {
				t.Errorf("end-to-end headers lost: %v", out)
			}
		})
	}
	if in.Get("Authorization") == "" {
		t.Error("input headers modified")
	}
}

func TestTokenSet(t *testing.T) {
	s := newTokenSet([]string{"alpha", "beta-longer-token"})
	tests := []struct {
		header string
		want   bool
	}{
		{"Bearer alpha", true},
		{"bearer beta-longer-token", true},
		{"Bearer  alpha ", true},
		{"Bearer alph", false},
		{"Bearer alphaa", false},
		{"Bearer ", false},
		{"alpha", false},
		{"Basic alpha", false},
		{"", false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", "/", nil)
		if tt.header != "" {
			r.Header.Set("Authorization", tt.header)
		}
		if got := s.check(r); got != tt.want {
			t.Errorf("check(%q) = %v, want %v", tt.header, got, tt.want)
		}
	}
}

func TestParseBodyKeepsSpans(t *testing.T) {
	data := []byte(`{"model":"m","cache_salt":"s","messages":[{"role":"user","content":"hello"}],"max_completion_tokens":7,"extra":{"x":1}}`)
	b, err := parseBody(epChat, data)
	if err != nil {
		t.Fatal(err)
	}
	if string(b.Messages) != `[{"role":"user","content":"hello"}]` || b.maxTokens(epChat) != 7 || b.CacheSalt != "s" {
		t.Fatalf("parsed %+v", b)
	}
	// The span aliases the body: no copy was made.
	off := strings.Index(string(data), "[{")
	if &b.Messages[0] != &data[off] {
		t.Error("messages were copied out of the body")
	}
}

// TestParsingAttacksHTTP sends, through the real listener, bodies that
// encoding/json (case-insensitive, last spelling wins) and the engine
// (exact keys) would read differently, or whose counts would overflow an
// estimate. Each must be refused with a 400 naming the field, and never
// reach the pod.
func TestParsingAttacksHTTP(t *testing.T) {
	pod := newFakePod(t, "p0")
	e := newEnv(t, []*fakePod{pod}, "")
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name, body, code, key string
	}{
		{"case-variant max_tokens", `{"model":"llama",` + msgs + `,"max_tokens":500,"Max_tokens":1,"stream":true,"Stream_options":{"include_usage":true}}`, "duplicate_key", "max_tokens"},
		{"case-variant model", `{"model":"unlisted-expensive-model","Model":"llama",` + msgs + `}`, "duplicate_key", "model"},
		{"duplicate model", `{"model":"unlisted-expensive-model",` + msgs + `,"model":"llama"}`, "duplicate_key", "model"},
		{"unicode-folded stream", `{"model":"llama",` + msgs + `,"ſtream":true}`, "duplicate_key", "stream"},
		{"case-variant messages", `{"model":"llama",` + msgs + `,"Messages":[{"role":"user","content":"other"}]}`, "duplicate_key", "messages"},
		{"case-variant cache_salt", `{"model":"llama",` + msgs + `,"cache_salt":"a","Cache_Salt":"b"}`, "duplicate_key", "cache_salt"},
		{"nested include_usage", `{"model":"llama",` + msgs + `,"stream":true,"stream_options":{"include_usage":false,"INCLUDE_USAGE":true}}`, "duplicate_key", "include_usage"},
		{"huge max_tokens", `{"model":"llama",` + msgs + `,"max_tokens":4611686018427387904}`, "invalid_value", "max_tokens"},
		{"huge n", `{"model":"llama",` + msgs + `,"n":1000000}`, "invalid_value", `field \"n\"`},
		{"trailing data", `{"model":"llama",` + msgs + `} {"model":"x"}`, "invalid_json", "after the top-level value"},
		{"invalid utf8 key", "{\"model\":\"llama\"," + msgs + ",\"max_\xfftokens\":1}", "invalid_json", "UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := e.do(t, "POST", "/v1/chat/completions", tt.body, nil)
			if res.status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400 (body %s)", res.status, res.body)
			}
			if code := errorCode(t, res.body); code != tt.code {
				t.Errorf("code %q, want %q", code, tt.code)
			}
			if !strings.Contains(res.body, tt.key) {
				t.Errorf("error does not name %s: %s", tt.key, res.body)
			}
		})
	}
	if n := pod.hits.Load(); n != 0 {
		t.Fatalf("refused bodies reached the pod %d times", n)
	}
	// An escaped key is the same key to every JSON reader: accepted, and
	// forwarded byte for byte.
	body := `{"\u006dodel":"llama",` + msgs + `,"max_tokens":7}`
	if res := e.do(t, "POST", "/v1/chat/completions", body, nil); res.status != http.StatusOK {
		t.Fatalf("escaped key: %d %s", res.status, res.body)
	}
	pod.mu.Lock()
	got := string(pod.lastBody)
	pod.mu.Unlock()
	if got != body {
		t.Fatalf("pod got %q, want the client's body unchanged", got)
	}
}

func TestMaxTokensEstimate(t *testing.T) {
	tests := []struct {
		body string
		want int
	}{
		{`{"model":"m","prompt":"x"}`, 0},
		{`{"model":"m","prompt":"x","max_tokens":10,"n":3}`, 30},
		{`{"model":"m","prompt":"x","max_tokens":10,"max_completion_tokens":4}`, 4},
		{`{"model":"m","prompt":"x","max_tokens":16777216,"n":128}`, 1 << 31},
	}
	for _, tt := range tests {
		b, err := parseBody(epCompletions, []byte(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		if got := b.maxTokens(epCompletions); got != tt.want {
			t.Errorf("%s: maxTokens = %d, want %d", tt.body, got, tt.want)
		}
	}
}

// FuzzParseBody: parseBody never panics; what it accepts, an exact-key
// decoder (encoding/json into a map) reads the same way, no field the
// router reads has a case variant, and the counts are within bounds.
func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
		`{"model":"m","Model":"x","messages":[]}`,
		`{"model":"m","messages":[],"max_tokens":500,"Max_tokens":1}`,
		`{"model":"m","messages":[],"n":2,"max_completion_tokens":9,"cache_salt":"s"}`,
		`{"\u006dodel":"m","messages":"x"}`,
		`{"model":"m","messages":[]} x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := parseBody(epChat, data)
		if err != nil {
			if requestErrorCode(err) == "" {
				t.Fatal("error without a code")
			}
			return
		}
		var exact map[string]json.RawMessage
		if err := json.Unmarshal(data, &exact); err != nil {
			t.Fatalf("accepted a body encoding/json refuses: %q: %v", data, err)
		}
		for k := range exact {
			for _, name := range openai.RequestFields.Names() {
				if k != name && strings.EqualFold(k, name) {
					t.Fatalf("accepted %q beside %q", k, name)
				}
			}
		}
		var model string
		if err := json.Unmarshal(exact["model"], &model); err != nil || model != b.Model {
			t.Fatalf("model %q, exact decode %q (%v)", b.Model, model, err)
		}
		if b.MaxTokens != nil {
			var mt int
			if err := json.Unmarshal(exact["max_tokens"], &mt); err != nil || mt != *b.MaxTokens {
				t.Fatalf("max_tokens %d, exact decode %d (%v)", *b.MaxTokens, mt, err)
			}
		} else if v, ok := exact["max_tokens"]; ok && string(v) != "null" {
			t.Fatalf("max_tokens %s not read", v)
		}
		if !bytes.Equal(b.Messages, exact["messages"]) {
			t.Fatalf("messages %q, exact %q", b.Messages, exact["messages"])
		}
		if mt := b.maxTokens(epChat); mt < 0 || mt > openai.MaxTokensLimit*openai.MaxN {
			t.Fatalf("maxTokens %d out of bounds", mt)
		}
	})
}

// BenchmarkParseBody32K measures parseBody on a 32 KiB chat body.
//
//	go test -run '^$' -bench ParseBody ./tier1/gateway
func BenchmarkParseBody32K(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"llama","stream":true,"max_tokens":256,"messages":[`)
	para := strings.Repeat(`The quick brown fox jumps over the lazy dog, \"twice\" — déjà vu.\n `, 16)
	for i := 0; sb.Len() < 32<<10; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"role":"user","content":"` + para + `"}`)
	}
	sb.WriteString(`]}`)
	data := []byte(sb.String())
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseBody(epChat, data); err != nil {
			b.Fatal(err)
		}
	}
}

func TestSessionKey(t *testing.T) {
	long := strings.Repeat("k", 300)
	tests := []struct {
		name, hdr, body, want string
	}{
		{"header wins", "hdr-1", `{"model":"m","prompt":"x","user":"u","prompt_cache_key":"pck"}`, "hdr-1"},
		{"prompt_cache_key before user", "", `{"model":"m","prompt":"x","user":"u","prompt_cache_key":"pck"}`, "pck"},
		{"user last", "", `{"model":"m","prompt":"x","user":"u"}`, "u"},
		{"none", "", `{"model":"m","prompt":"x"}`, ""},
		{"long key cut", long, `{"model":"m","prompt":"x"}`, long[:maxSessionKey]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := parseBody(epCompletions, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got := sessionKey(tt.hdr, b); got != tt.want {
				t.Fatalf("sessionKey = %q, want %q", got, tt.want)
			}
		})
	}
}
