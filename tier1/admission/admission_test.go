package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/prefix"
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
		{"busy waits", std, picker.ErrBusy, Wait, 0, ""},
		{"busy sheddable shed, never held", shed, picker.ErrBusy, Shed, 429, "pool_saturated"},
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
	if a := Expired(std, picker.ErrBusy).Action; a != Dispatch {
		t.Errorf("expired busy: %v", a)
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

// TestPromptBlocks: a prompt longer than the hashed window says how many
// blocks it spans in all, so a match on the window is not taken for the
// whole prompt; a reused request forgets an earlier long prompt's count.
func TestPromptBlocks(t *testing.T) {
	tests := []struct {
		name       string
		blocks     int // full blocks of text
		wantHashed int
		wantBlocks int
	}{
		{"short", 10, 10, 0},
		{"exactly the window", prefix.DefaultPromptBlocks, prefix.DefaultPromptBlocks, 0},
		{"twice the window", 2 * prefix.DefaultPromptBlocks, prefix.DefaultPromptBlocks, 2 * prefix.DefaultPromptBlocks},
	}
	req := &picker.Request{Model: "m"}
	for _, long := range []bool{false, true} {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if long {
					Prompt(req, "", make([]byte, 3*prefix.DefaultPromptBlocks*prefix.DefaultBlockBytes))
				}
				Prompt(req, "", make([]byte, tt.blocks*prefix.DefaultBlockBytes+7))
				if len(req.BlockHashes) != tt.wantHashed || req.PromptBlocks != tt.wantBlocks {
					t.Fatalf("hashed %d, prompt blocks %d; want %d, %d", len(req.BlockHashes), req.PromptBlocks, tt.wantHashed, tt.wantBlocks)
				}
			})
		}
	}
}

func TestQueueAfter(t *testing.T) {
	var q Queue[string]
	for _, v := range []string{"a", "b", "c", "d"} {
		q.Push(0, v)
	}
	skipC := func(v string) bool { return v == "c" }
	none := func(string) bool { return false }
	for _, tc := range []struct {
		from string
		skip func(string) bool
		want string
		ok   bool
	}{
		{"a", none, "b", true},
		{"b", skipC, "d", true},
		{"d", none, "", false},
		{"c", func(string) bool { return true }, "", false},
		{"x", none, "", false}, // not waiting
	} {
		if got, ok := q.After(tc.from, tc.skip); got != tc.want || ok != tc.ok {
			t.Errorf("After(%s) = %q, %v; want %q, %v", tc.from, got, ok, tc.want, tc.ok)
		}
	}
}

// A Pass schedules each kind of waiter once per wake, keyless ones up to
// PassScan, and blocks a newcomer while a pass is open, when its kind
// was held since the last wake, or when it is sheddable.
func TestPass(t *testing.T) {
	a := picker.HoldKey{Model: "m", Adapter: "a"}
	b := picker.HoldKey{Model: "m", Adapter: "b"}
	std := &picker.Request{}
	var p Pass
	for _, tc := range []struct {
		name  string
		req   *picker.Request
		key   picker.HoldKey
		keyed bool
		want  bool
	}{
		{"nothing held", std, a, true, false},
		{"keyless", std, picker.HoldKey{}, false, false},
		{"sheddable", &picker.Request{Sheddable: true}, a, true, true},
	} {
		if got := p.Blocks(tc.req, tc.key, tc.keyed); got != tc.want {
			t.Errorf("zero Pass: Blocks(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}

	p.Start()
	if !p.Open() || !p.Blocks(std, b, true) || !p.Blocks(std, picker.HoldKey{}, false) {
		t.Error("an open pass does not block newcomers")
	}
	if p.Skip(a, true) {
		t.Error("skips a kind not held yet")
	}
	p.Held(a, true)
	if !p.Skip(a, true) || p.Skip(b, true) {
		t.Error("Skip: want a skipped, b not")
	}
	for i := 0; i < PassScan; i++ {
		if p.Skip(picker.HoldKey{}, false) {
			t.Fatalf("keyless waiter %d skipped before PassScan cycles", i)
		}
		p.Held(picker.HoldKey{}, false)
	}
	if !p.Skip(picker.HoldKey{}, false) {
		t.Error("keyless waiters scheduled beyond PassScan")
	}
	p.End()
	if p.Open() {
		t.Error("open after End")
	}
	if !p.Blocks(std, a, true) || p.Blocks(std, b, true) || p.Blocks(std, picker.HoldKey{}, false) {
		t.Error("after the pass: want only kind a blocked")
	}
	p.Start() // a wake: nothing held stands
	p.End()
	if p.Blocks(std, a, true) || p.Skip(a, true) || p.Skip(picker.HoldKey{}, false) {
		t.Error("a held kind or the scan count outlived the next Start")
	}
}
