package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHasToken(t *testing.T) {
	tests := []struct {
		chunk string
		want  bool
	}{
		{`data: {"choices":[{"delta":{"role":"assistant","content":""}}]}`, false},
		{`data: {"choices":[{"delta":{"content":"Hi"}}]}`, true},
		{`data: {"choices":[{"text":"","index":0}]}`, false},
		{`data: {"choices":[{"text":" the"}]}`, true},
		{`data: {"choices":[{"delta":{},"finish_reason":"length"}]}`, true},
		{"data: [DONE]\n\n", true},
		{`data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n" + `data: {"choices":[{"delta":{"content":"x"}}]}`, true},
		{``, false},
	}
	for _, tt := range tests {
		if got := hasToken([]byte(tt.chunk)); got != tt.want {
			t.Errorf("hasToken(%q) = %v, want %v", tt.chunk, got, tt.want)
		}
	}
}

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
			if got := out.Get("X-Forwarded-For"); got != "10.1.1.1, 192.0.2.7" {
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
	if string(b.Messages) != `[{"role":"user","content":"hello"}]` || b.maxTokens() != 7 || b.CacheSalt != "s" {
		t.Fatalf("parsed %+v", b)
	}
	// The span aliases the body: no copy was made.
	off := strings.Index(string(data), "[{")
	if &b.Messages[0] != &data[off] {
		t.Error("messages were copied out of the body")
	}
}
