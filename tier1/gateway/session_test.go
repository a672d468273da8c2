package gateway

import (
	"encoding/json"
	"fmt"
	"testing"
)

// A session key from the x-session-id header or the body's
// prompt_cache_key / user reaches the picker: with only the
// session-affinity scorer, a session's requests stay on one pod, while
// requests without a key spread (max-score's random tie-break).
func TestSessionKeyReachesPicker(t *testing.T) {
	var pods []*fakePod
	for i := range 4 {
		pods = append(pods, newFakePod(t, fmt.Sprintf("p%d", i)))
	}
	e := newEnv(t, pods, "scheduler: {base: empty, filters: [model, ready], picker: max-score, scorers: [{name: session-affinity, weight: 10}]}\n")
	podOf := func(r result) string {
		t.Helper()
		var v struct{ Pod string }
		if r.status != 200 || json.Unmarshal([]byte(r.body), &v) != nil || v.Pod == "" {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		return v.Pod
	}
	body := func(extra string, i int) string {
		return fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":"turn %d"}]%s}`, i, extra)
	}
	tests := []struct {
		name  string
		hdr   map[string]string
		extra string
	}{
		{"x-session-id header", map[string]string{HeaderSessionID: "conv-a"}, ""},
		{"prompt_cache_key", nil, `,"prompt_cache_key":"conv-b"`},
		{"user", nil, `,"user":"alice"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first := ""
			for i := range 12 {
				got := podOf(e.do(t, "POST", "/v1/chat/completions", body(tt.extra, i), tt.hdr))
				if first == "" {
					first = got
				} else if got != first {
					t.Fatalf("request %d went to %s, session was on %s", i, got, first)
				}
			}
		})
	}
	seen := map[string]bool{}
	for i := range 24 {
		seen[podOf(e.do(t, "POST", "/v1/chat/completions", body("", i), nil))] = true
	}
	if len(seen) < 2 {
		t.Fatalf("requests without a session key all went to %v", seen)
	}
}
