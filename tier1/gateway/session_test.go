package gateway

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// A session key from the x-session-id header or the body's
// prompt_cache_key / user reaches the picker: with only the
// session-balance scorer, each new session goes to a pod with the fewest
// live sessions, so 8 new sessions land exactly 2 per pod on 4 pods (by
// chance, without the keys, 3.8% of the time), while requests without a
// key spread (max-score's random tie-break).
func TestSessionKeyReachesPicker(t *testing.T) {
	var pods []*fakePod
	for i := range 4 {
		pods = append(pods, newFakePod(t, fmt.Sprintf("p%d", i)))
	}
	e := newEnv(t, pods, "scheduler: {base: empty, filters: [model, ready], picker: max-score, scorers: [{name: session-balance, weight: 10}]}\n")
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
		name string
		key  func(i int) (map[string]string, string) // session i's header, body members
	}{
		{"x-session-id header", func(i int) (map[string]string, string) {
			return map[string]string{HeaderSessionID: fmt.Sprint("conv-a", i)}, ""
		}},
		{"prompt_cache_key", func(i int) (map[string]string, string) { return nil, fmt.Sprintf(`,"prompt_cache_key":"conv-b%d"`, i) }},
		{"user", func(i int) (map[string]string, string) { return nil, fmt.Sprintf(`,"user":"alice%d"`, i) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			per := map[string]int{}
			for i := range 8 {
				hdr, extra := tt.key(i)
				per[podOf(e.do(t, "POST", "/v1/chat/completions", body(extra, i), hdr))]++
			}
			for _, p := range pods {
				if per[p.name] != 2 {
					t.Fatalf("new sessions per pod %v, want 2 on each of the 4", per)
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

// New conversations that share a long system prompt spread over the pods
// (the default profile's session-balance) instead of all following the
// pod that first cached the prompt, and each conversation's next turn
// goes back to its own pod. With session-balance off every conversation
// lands on one pod: the case the scorer exists for.
func TestNewConversationsSpreadThroughGateway(t *testing.T) {
	system := strings.Repeat("You are a careful assistant for the fleet operations team. ", 40)
	for _, balance := range []bool{true, false} {
		t.Run(fmt.Sprint("balance=", balance), func(t *testing.T) {
			var pods []*fakePod
			for i := range 4 {
				pods = append(pods, newFakePod(t, fmt.Sprintf("p%d", i)))
			}
			cfg := ""
			if !balance {
				cfg = "scheduler: {base: default, scorers: [{name: session-balance, weight: 0}]}\n"
			}
			e := newEnv(t, pods, cfg)
			turn := func(conv, n int) string {
				t.Helper()
				// The opening question spans about 25 prefix blocks, so the
				// conversation's history, not only the shared system prompt,
				// is what its next turn finds cached, and by a margin no
				// noise in the fake pods' learned speeds outweighs (with 6
				// blocks, 4 after the index's stride, a loaded machine sent
				// a second turn to a pod whose measured speed was a few
				// percent better).
				question := strings.Repeat(fmt.Sprintf("conversation %d opens with its own long question. ", conv), 32)
				msgs := fmt.Sprintf(`{"role":"system","content":%q},{"role":"user","content":%q}`, system, question)
				if n > 1 {
					msgs += fmt.Sprintf(`,{"role":"assistant","content":"an answer for conversation %d"},{"role":"user","content":"a follow-up"}`, conv)
				}
				r := e.do(t, "POST", "/v1/chat/completions", fmt.Sprintf(`{"model":"llama","messages":[%s]}`, msgs),
					map[string]string{HeaderSessionID: fmt.Sprint("conv-", conv)})
				var v struct{ Pod string }
				if r.status != 200 || json.Unmarshal([]byte(r.body), &v) != nil || v.Pod == "" {
					t.Fatalf("status %d body %s", r.status, r.body)
				}
				return v.Pod
			}
			home := map[int]string{}
			per := map[string]int{}
			for conv := range 8 {
				home[conv] = turn(conv, 1)
				per[home[conv]]++
			}
			for conv := range 8 {
				if got := turn(conv, 2); got != home[conv] {
					t.Errorf("conversation %d's second turn went to %s, its first to %s", conv, got, home[conv])
				}
			}
			busiest := 0
			for _, n := range per {
				busiest = max(busiest, n)
			}
			t.Logf("conversations per pod: %v", per)
			if balance && busiest > 3 {
				t.Errorf("conversations per pod %v: want them spread over the 4 pods", per)
			}
			if !balance && busiest != 8 {
				t.Errorf("conversations per pod %v without session-balance: want all on the system prompt's pod", per)
			}
		})
	}
}
