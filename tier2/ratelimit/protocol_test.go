package ratelimit

import (
	"context"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testservice"
)

// Keys of every protocol case, as 1-based indices in ops.
const (
	kW1    = iota + 1 // window
	kW2               // second window
	kB1               // budget
	kC1               // concurrency holdings
	kC1DL             // their deadlines
	kC1Use            // their slots in use
)

const hour = int64(time.Hour / time.Millisecond)

func win(lim, need, ask int64) *op {
	return &op{K: opWindow, Key: kW1, Lim: lim, Need: need, Ask: ask, W: hour, N: 2}
}

func conc(lim, inuse, need, ask int64) *op {
	return &op{K: opConc, Key: kC1, DKey: kC1DL, UKey: kC1Use, Lim: lim, InUse: inuse, Need: need, Ask: ask, Busy: inuse, TTL: 60_000}
}

func bud(lim, need, ask, delta int64) *op {
	return &op{K: opBudget, Key: kB1, Lim: lim, Need: need, Ask: ask, Delta: delta, Exp: time.Now().Add(time.Hour).Unix(), ResetM: 1234}
}

// step is one script call and what it must answer. Only the fields that do
// not depend on the clock are compared: Denied, Granted, Used, Busy, Mine,
// and Retry of a denied budget (the period end the caller passed).
type step struct {
	replica string
	ops     func(prev []result) []*op
	want    []result
}

func fixed(ops ...*op) func([]result) []*op { return func([]result) []*op { return ops } }

var protocolCases = []struct {
	name  string
	steps []step
}{
	{"window grants need and lease up to the limit", []step{
		{"a", fixed(win(10, 3, 4)), []result{{Granted: 7, Used: 7}}},
		{"a", fixed(win(10, 2, 5)), []result{{Granted: 3, Used: 10}}},
		{"a", fixed(win(10, 1, 0)), []result{{Denied: true, Used: 10}}},
	}},
	{"window refunds and debts", []step{
		{"a", fixed(win(10, 8, 0)), []result{{Granted: 8, Used: 8}}},
		{"a", func(prev []result) []*op {
			o := win(10, 0, 0)
			o.Ref = [][2]int64{{prev[0].Bucket, 5}}
			return []*op{o}
		}, []result{{Used: 3}}},
		{"a", func([]result) []*op { o := win(10, 0, 0); o.Debt = 4; return []*op{o} }, []result{{Used: 7}}},
		{"a", fixed(win(10, 4, 0)), []result{{Denied: true, Used: 7}}},
	}},
	{"leases stop at the reserve; needs do not", []step{
		{"a", func([]result) []*op { o := win(10, 2, 5); o.Rsv = 4; return []*op{o} }, []result{{Granted: 6, Used: 6}}},
		{"b", func([]result) []*op { o := win(10, 1, 3); o.Rsv = 4; return []*op{o} }, []result{{Granted: 1, Used: 7}}},
		{"b", func([]result) []*op { o := win(10, 3, 3); o.Rsv = 4; return []*op{o} }, []result{{Granted: 3, Used: 10}}},
		{"a", func([]result) []*op { o := bud(20, 2, 10, 0); o.Rsv = 15; return []*op{o} }, []result{{Granted: 5, Used: 5}}},
		{"b", func([]result) []*op { o := bud(20, 4, 10, 0); o.Rsv = 15; return []*op{o} }, []result{{Granted: 4, Used: 9}}},
	}},
	{"read only window changes nothing", []step{
		{"a", fixed(win(10, 6, 0)), []result{{Granted: 6, Used: 6}}},
		{"a", func([]result) []*op { o := win(10, 0, 0); o.RO = true; o.Debt = 3; return []*op{o} }, []result{{Used: 6}}},
	}},
	{"all or nothing across ops", []step{
		{"a", fixed(bud(5, 5, 0, 0)), []result{{Granted: 5, Used: 5, Retry: 0}}},
		{"a", fixed(win(10, 2, 2), bud(5, 1, 0, 0)), []result{{Used: 0}, {Denied: true, Used: 5, Retry: 1234 * time.Millisecond}}},
		{"a", fixed(win(10, 2, 0)), []result{{Granted: 2, Used: 2}}},
	}},
	{"budget deltas never go below zero", []step{
		{"a", fixed(bud(100, 10, 0, 0)), []result{{Granted: 10, Used: 10}}},
		{"a", fixed(bud(100, 0, 0, -30)), []result{{Used: 0}}},
		{"a", fixed(bud(100, 0, 0, 40)), []result{{Used: 40}}},
		{"a", fixed(bud(100, 61, 0, 0)), []result{{Denied: true, Used: 40, Retry: 1234 * time.Millisecond}}},
	}},
	{"concurrency is shared between replicas", []step{
		{"a", fixed(conc(3, 0, 1, 1)), []result{{Granted: 2, Used: 2}}},
		{"b", fixed(conc(3, 0, 1, 5)), []result{{Granted: 1, Used: 3}}},
		{"b", fixed(conc(3, 1, 1, 0)), []result{{Denied: true, Used: 3}}},
		{"a", fixed(conc(3, 0, 0, 0)), []result{{Used: 1}}}, // a gives its slots back
		{"b", fixed(conc(3, 1, 2, 0)), []result{{Granted: 2, Used: 3}}},
	}},
	{"concurrency usage reports busy slots per replica", []step{
		{"a", func([]result) []*op { o := conc(5, 0, 1, 1); o.Adm = 1; return []*op{o} }, []result{{Granted: 2, Used: 2}}},
		{"b", func([]result) []*op { o := conc(5, 0, 1, 0); o.Adm = 1; return []*op{o} }, []result{{Granted: 1, Used: 3}}},
		{"a", func([]result) []*op { o := conc(5, 0, 0, 0); o.RO = true; return []*op{o} }, []result{{Used: 3, Busy: 1, Mine: 1}}},
	}},
}

// TestProtocol runs one table of script calls against sync.lua on a real
// Redis and against memBackend, so the in-process copy of the protocol is
// checked against the script itself.
func TestProtocol(t *testing.T) {
	rs := testservice.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	backends := map[string]func() backend{
		"memory": func() backend { return newMemBackend() },
		"redis":  func() backend { return redisBackend{rdb: rdb} },
	}
	for bi, bname := range []string{"memory", "redis"} {
		for ci, tc := range protocolCases {
			t.Run(bname+"/"+tc.name, func(t *testing.T) {
				be := backends[bname]()
				var keys []string
				for _, n := range []string{"w1", "w2", "b1", "c1", "c1dl", "c1use"} {
					keys = append(keys, "proto:{"+string(rune('a'+bi))+string(rune('a'+ci))+"}:"+n)
				}
				var prev []result
				for si, s := range tc.steps {
					got, err := be.run(context.Background(), keys, s.ops(prev), s.replica)
					if err != nil {
						t.Fatalf("step %d: %v", si, err)
					}
					for i := range got {
						g := got[i]
						cmp := result{Denied: g.Denied, Granted: g.Granted, Used: g.Used, Busy: g.Busy, Mine: g.Mine}
						if s.ops(prev)[i].K == opBudget && g.Denied {
							cmp.Retry = g.Retry
						}
						if cmp != s.want[i] {
							t.Fatalf("step %d op %d: got %+v, want %+v", si, i, cmp, s.want[i])
						}
					}
					prev = got
				}
			})
		}
	}
}

// TestScriptReadsOnlyOpFields: every op field sync.lua reads is a JSON
// field of op, and every JSON field of op is read by the script, so the Go
// type is the schema of the script's input.
func TestScriptReadsOnlyOpFields(t *testing.T) {
	read := map[string]bool{}
	for _, m := range regexp.MustCompile(`\bop\.([a-z]+)`).FindAllStringSubmatch(syncLua, -1) {
		read[m[1]] = true
	}
	tags := map[string]bool{}
	ty := reflect.TypeOf(op{})
	for i := range ty.NumField() {
		tag, _, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ",")
		if tag != "" && tag != "-" {
			tags[tag] = true
		}
	}
	keys := func(m map[string]bool) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	if !reflect.DeepEqual(keys(read), keys(tags)) {
		t.Fatalf("sync.lua reads op fields %v; op's JSON fields are %v", keys(read), keys(tags))
	}
	for _, k := range []string{opWindow, opBudget, opConc} {
		if !strings.Contains(syncLua, "op.k == '"+k+"'") {
			t.Errorf("sync.lua does not handle op kind %q", k)
		}
	}
}
