package gateway_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier2/gateway"
)

// A cluster that sends [DONE] and then breaks the connection: the client
// sees the stream end exactly once, with no error event after [DONE], and
// the cluster is not blamed.
func TestDoneThenBreak(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	lim := &fakeLimiter{}
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100)), gateway: func(o *gateway.Options) { o.Limiter = lim }})
	a.mode.Store("die-after-done")
	r := s.do(t, "key-cost", "/v1/chat/completions", `{"model":"m","stream":true}`)
	d := sseData(r.body)
	if r.code != 200 || len(d) != 4 || d[3] != "[DONE]" || strings.Count(r.body, "[DONE]") != 1 || strings.Contains(r.body, "error") {
		t.Fatalf("client stream %q", r.body)
	}
	if n := s.metric(t, "infergate_tier2_attempts_total", map[string]string{"cluster": "a", "outcome": "failure"}); n != 0 {
		t.Errorf("a whole stream counted %v failures", n)
	}
	if got := lim.settled(t, 1); len(got) != 1 || got[0] != 8 {
		t.Errorf("reconciled %v, want the stream's usage [8]", got)
	}
}

// A streamed chat body without include_usage reaches Tier 1 byte for byte
// as the client sent it, but for the stream_options member Tier 2 adds (or
// the value it sets): non-ASCII, <>& and odd whitespace untouched, no key
// reordered. The client does not see the usage it did not ask for.
func TestIncludeUsageBytes(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	lim := &fakeLimiter{}
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100)), gateway: func(o *gateway.Options) { o.Limiter = lim }})
	const msgs = `[ {"role" : "system","content":"Réponds <b>brièvement</b> & poliment.\u00e9"},` + "\n\t" +
		`{"role":"user",   "content":"日本語 ✓ émoji 🎉 <script>&amp;</script> \"quoted\"\n"} ]`
	for i, tc := range []struct{ name, body, want string }{
		{"no stream_options",
			"{ \"model\":\"m\",\n  \"stream\" : true,\"messages\":" + msgs + ",\"temperature\": 0.5 \n}\n",
			"{ \"model\":\"m\",\n  \"stream\" : true,\"messages\":" + msgs + ",\"temperature\": 0.5,\"stream_options\":{\"include_usage\":true} \n}\n"},
		{"stream_options without include_usage",
			`{"stream_options" : { "continuous_usage_stats" : false } ,"model":"m","stream":true,"messages":` + msgs + `}`,
			`{"stream_options" : { "continuous_usage_stats" : false,"include_usage":true } ,"model":"m","stream":true,"messages":` + msgs + `}`},
		{"include_usage false",
			`{"model":"m","stream":true,"stream_options":{"include_usage": false},"messages":` + msgs + `}`,
			`{"model":"m","stream":true,"stream_options":{"include_usage": true},"messages":` + msgs + `}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.do(t, "key-cost", "/v1/chat/completions", tc.body)
			if r.code != 200 || strings.Contains(r.body, "usage") || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
				t.Fatalf("client got %d %q", r.code, r.body)
			}
			_, got := a.lastRequest()
			if !bytes.Equal(got, []byte(tc.want)) {
				t.Fatalf("tier1 got\n%s\nwant\n%s", got, tc.want)
			}
			// The prompt Tier 1 reads (and hashes) is the client's.
			sent, _ := openai.ParseRequest([]byte(tc.body))
			recv, err := openai.ParseRequest(got)
			if err != nil || !bytes.Equal(sent.Messages, recv.Messages) || !recv.StreamOptions.IncludeUsage {
				t.Fatalf("tier1 reads other messages or no include_usage: %v", err)
			}
			if fin := lim.settled(t, i+1); fin[len(fin)-1] != 8 {
				t.Errorf("reconciled %v, want the stream's usage 8", fin)
			}
		})
	}
}
