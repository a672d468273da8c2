package gateway_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier2/gateway"
)

// logBuf is a bytes.Buffer safe for concurrent handlers.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The request ID: the client's when well-formed, else generated; sent to
// Tier 1, returned to the client (errors too) and on every log line.
func TestRequestID(t *testing.T) {
	for _, tc := range []struct {
		name, sent string
		keep       bool
	}{
		{"valid", "req-abc_123", true},
		{"absent", "", false},
		{"too long", strings.Repeat("x", 129), false},
		{"space", "a b", false},
		{"tab", "a\tb", false},
		{"non-ASCII", "caf\u00e9", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTier1(t, "a", "east", "m")
			b := newTier1(t, "b", "east", "m")
			var logs logBuf
			s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100), b.cluster(2, 100)),
				gateway: func(o *gateway.Options) { o.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) }})
			a.mode.Store("500") // a fails first: a log line about the request
			var hdr []string
			if tc.sent != "" {
				hdr = []string{"X-Request-Id", tc.sent}
			}
			r := s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, hdr...)
			if r.code != 200 {
				t.Fatalf("status %d: %s", r.code, r.body)
			}
			got := r.header.Get("X-Request-Id")
			if !openai.ValidRequestID(got) || (got == tc.sent) != tc.keep {
				t.Fatalf("response X-Request-Id %q for sent %q", got, tc.sent)
			}
			req, _ := b.lastRequest()
			if fwd := req.Header.Get("X-Request-Id"); fwd != got {
				t.Errorf("Tier 1 got X-Request-Id %q, client %q", fwd, got)
			}
			var line string
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, "tier1 attempt failed") && strings.Contains(l, `"request_id":"`+got+`"`) {
					line = l
				}
			}
			if line == "" {
				t.Errorf("no log line with request_id %q:\n%s", got, logs.String())
			}
		})
	}
	// Refusals carry it too.
	s := newStack(t, stackOpts{src: static(t, newTier1(t, "a", "east", "m").cluster(1, 100))})
	r := s.do(t, "bad-key", "/v1/chat/completions", `{"model":"m"}`, "X-Request-Id", "id-401")
	if r.code != 401 || r.header.Get("X-Request-Id") != "id-401" {
		t.Errorf("401: status %d, X-Request-Id %q", r.code, r.header.Get("X-Request-Id"))
	}
}
