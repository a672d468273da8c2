package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/infergate/infergate/tier1/picker"
)

func TestDecide(t *testing.T) {
	std := &picker.Request{Model: "m"}
	shed := &picker.Request{Model: "m", Sheddable: true, Priority: -1}
	tests := []struct {
		name   string
		req    *picker.Request
		err    error
		action Action
		status int
		code   string
	}{
		{"scheduled", std, nil, Dispatch, 0, ""},
		{"saturated waits", std, picker.ErrSaturated, Wait, 0, ""},
		{"saturated sheddable shed", shed, picker.ErrSaturated, Shed, 429, "pool_saturated"},
		{"wrapped saturation", shed, fmt.Errorf("x: %w", picker.ErrSaturated), Shed, 429, "pool_saturated"},
		{"no pod", std, picker.ErrNoCandidates, Fail, 503, "no_ready_pod"},
		{"timed out", std, context.DeadlineExceeded, Fail, 504, "timeout"},
		{"client gone", std, context.Canceled, Fail, StatusClientClosed, "timeout"},
		{"other", std, errors.New("boom"), Fail, 503, "scheduling_failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.req, tt.err)
			if d.Action != tt.action || d.Status != tt.status || d.Code != tt.code {
				t.Errorf("Decide = %+v, want %v %d %s", d, tt.action, tt.status, tt.code)
			}
			if d.Action == Shed && d.RetryAfter <= 0 {
				t.Error("shed without Retry-After")
			}
		})
	}
}

func TestArriveAndExpired(t *testing.T) {
	std := &picker.Request{Model: "m"}
	shed := &picker.Request{Model: "m", Sheddable: true, Priority: -1}
	if a := Arrive(std, false).Action; a != Schedule {
		t.Errorf("no waiters: %v", a)
	}
	if a := Arrive(std, true).Action; a != Wait {
		t.Errorf("waiters ahead, standard: %v", a)
	}
	if a := Arrive(shed, true).Action; a != Shed {
		t.Errorf("waiters ahead, sheddable: %v", a)
	}
	if a := Expired(std, picker.ErrSaturated).Action; a != Dispatch {
		t.Errorf("expired saturated: %v", a)
	}
	if a := Expired(std, picker.ErrNoCandidates).Action; a != Fail {
		t.Errorf("expired without pods: %v", a)
	}
	if MaxWait(&picker.Request{Priority: 1}, 1, 2) != 2 || MaxWait(std, 1, 2) != 1 {
		t.Error("MaxWait picks the wrong bound")
	}
}

func TestQueueOrder(t *testing.T) {
	var q Queue[string]
	for _, a := range []struct {
		name string
		prio int
	}{{"std1", 0}, {"low", -1}, {"crit1", 2}, {"std2", 0}, {"crit2", 2}, {"mid", 1}} {
		q.Push(a.prio, a.name)
	}
	want := []string{"crit1", "crit2", "mid", "std1", "std2", "low"}
	if got := q.All(); !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if !q.Ahead(2) || q.Ahead(3) || !q.Ahead(-5) {
		t.Error("Ahead wrong")
	}
	if !q.Remove("mid") || q.Remove("mid") || q.Len() != 5 {
		t.Error("Remove wrong")
	}
	for _, w := range []string{"crit1", "crit2", "std1", "std2", "low"} {
		h, ok := q.Head()
		if !ok || h != w {
			t.Fatalf("head %q, want %q", h, w)
		}
		q.Remove(h)
	}
	if _, ok := q.Head(); ok || q.Ahead(-100) {
		t.Error("empty queue has a head")
	}
}

func TestPrompt(t *testing.T) {
	text := []byte(string(slices.Repeat([]byte("abcdefgh"), 100)))
	a := &picker.Request{Model: "m"}
	Prompt(a, "", text)
	b := &picker.Request{Model: "m"}
	Prompt(b, "salt", text)
	if a.PromptTokens != 200 || len(a.BlockHashes) == 0 || len(a.BlockHashes) != len(b.BlockHashes) {
		t.Fatalf("tokens %d, hashes %d/%d", a.PromptTokens, len(a.BlockHashes), len(b.BlockHashes))
	}
	if a.BlockHashes[0] == b.BlockHashes[0] {
		t.Error("cache_salt does not change the hashes")
	}
	// The buffer in BlockHashes is reused.
	buf := make([]uint64, 0, 64)
	c := &picker.Request{Model: "m", BlockHashes: buf}
	Prompt(c, "", text)
	if &c.BlockHashes[:1][0] != &buf[:1][0] || !slices.Equal(c.BlockHashes, a.BlockHashes) {
		t.Error("buffer not reused or hashes differ")
	}
	empty := &picker.Request{Model: "m"}
	Prompt(empty, "", nil)
	if empty.PromptTokens != 1 || len(empty.BlockHashes) != 0 {
		t.Errorf("empty prompt: %d tokens, %d hashes", empty.PromptTokens, len(empty.BlockHashes))
	}
}
