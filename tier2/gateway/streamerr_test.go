package gateway_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// A Responses or Anthropic stream that Tier 1 cuts mid-way ends, at the
// client, with an error in that API's own shape: Anthropic's error event,
// or the Responses error event numbered after the last event relayed and
// response.failed naming the response.
func TestBrokenStreamErrorShapes(t *testing.T) {
	a := newTier1(t, "a", "east", "m")
	s := newStack(t, stackOpts{src: static(t, a.cluster(1, 100))})
	a.mode.Store("die-named")
	for _, tc := range []struct {
		path, body string
		names      []string // the events after the relayed ones
		check      func(data []map[string]any) bool
	}{
		{"/v1/messages", `{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, []string{"error"},
			func(d []map[string]any) bool {
				e, _ := d[0]["error"].(map[string]any)
				return d[0]["type"] == "error" && e["type"] == "api_error" && e["message"] == "upstream stream interrupted"
			}},
		{"/v1/responses", `{"model":"m","stream":true,"input":"hi"}`, []string{"error", "response.failed"},
			func(d []map[string]any) bool {
				r, _ := d[1]["response"].(map[string]any)
				return d[0]["type"] == "error" && d[0]["code"] == "upstream_interrupted" && d[0]["sequence_number"] == 2.0 &&
					d[1]["sequence_number"] == 3.0 && r["id"] == "resp_stub" && r["status"] == "failed"
			}},
	} {
		r := s.do(t, "key-cost", tc.path, tc.body)
		evs := strings.Split(strings.TrimSuffix(r.body, "\n\n"), "\n\n")
		if r.code != 200 || len(evs) != 2+len(tc.names) {
			t.Errorf("%s: %d %q", tc.path, r.code, r.body)
			continue
		}
		var data []map[string]any
		for i, name := range tc.names {
			ev := evs[2+i]
			head, d, _ := strings.Cut(ev, "\ndata: ")
			var m map[string]any
			if head != "event: "+name || json.Unmarshal([]byte(d), &m) != nil {
				t.Errorf("%s: event %d is %q, want %s", tc.path, 2+i, ev, name)
			}
			data = append(data, m)
		}
		if !t.Failed() && !tc.check(data) {
			t.Errorf("%s: ends with %v", tc.path, data)
		}
	}
}
