package ratelimit

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The limiter's protocol with Redis is defined here once: op is the
// request (its JSON tags are the field names sync.lua reads), result the
// answer (resultWidth integers per op, in the order below), and sync.lua
// the script that runs a call. memBackend implements the same semantics
// in process; protocol_test.go checks both against one table.

// Op kinds. Every op of one call names keys of one tenant, which share the
// {tenant} hash tag, so one script runs in one Redis Cluster slot.
const (
	opWindow = "w" // sliding window of sub-buckets (RPM, TPM)
	opBudget = "b" // period counter (token budget)
	opConc   = "c" // concurrency holdings per replica with deadlines
)

// op is one resource's part of a sync. Field names are short because they
// travel as JSON to the Lua script on every call.
type op struct {
	K    string `json:"k"`
	Key  int    `json:"key"`            // 1-based index into KEYS
	DKey int    `json:"dkey,omitempty"` // conc: deadline ZSET
	UKey int    `json:"ukey,omitempty"` // conc: HASH replica -> slots in use
	Lim  int64  `json:"lim"`
	Need int64  `json:"need"` // must all be granted or the whole call is denied
	Ask  int64  `json:"ask"`  // best-effort extra (a lease)
	// Rsv (window, budget): grant the Ask only from what leaves at least
	// this much of the limit ungranted, so the last units of a window or
	// budget are granted one admission at a time and no replica parks them
	// in a lease while another is refused (docs/tier2-limits.md).
	Rsv    int64       `json:"rsv,omitempty"`
	W      int64       `json:"w,omitempty"`
	N      int64       `json:"n,omitempty"`
	Ref    [][2]int64  `json:"ref,omitempty"`   // window: [bucket, refund]
	Debt   int64       `json:"debt,omitempty"`  // window: add to current bucket
	Delta  int64       `json:"delta,omitempty"` // budget: add (negative refunds)
	Exp    int64       `json:"exp,omitempty"`   // budget: unix seconds the key expires
	ResetM int64       `json:"rst,omitempty"`   // budget: ms until period end
	InUse  int64       `json:"inuse,omitempty"` // conc: slots this replica holds (in use plus spare)
	Busy   int64       `json:"busy,omitempty"`  // conc: of those, in use by requests (reported for usage)
	Adm    int64       `json:"adm,omitempty"`   // conc: slots the admission takes if granted (in use too)
	TTL    int64       `json:"ttl,omitempty"`   // conc: ms until holdings lapse
	RO     bool        `json:"ro,omitempty"`    // read only (usage)
	res    *resource   `json:"-"`
	refBud []budgetRef `json:"-"`
	other  bool        `json:"-"` // budget refund to another period
	reqN   int64       `json:"-"` // the admission's whole need
}

type budgetRef struct {
	period string
	n      int64
}

// result is one op's answer.
type result struct {
	Denied  bool
	Granted int64
	Bucket  int64 // window: current bucket index
	Used    int64 // after the call, including all replicas' leases (conc: holdings)
	Retry   time.Duration
	Reset   time.Duration
	// Read-only concurrency ops (usage): slots in use as reported by the
	// other live replicas, and as last reported by this one.
	Busy, Mine int64
}

// resultWidth is how many integers the script returns per op.
const resultWidth = 8

// decodeResults reads the script's reply: resultWidth integers per op.
func decodeResults(vals []int64, n int) ([]result, error) {
	if len(vals) != resultWidth*n {
		return nil, fmt.Errorf("ratelimit: script returned %d values for %d ops", len(vals), n)
	}
	out := make([]result, n)
	for i := range out {
		v := vals[resultWidth*i : resultWidth*i+resultWidth]
		out[i] = result{Denied: v[0] == 1, Granted: v[1], Bucket: v[2], Used: v[3],
			Retry: time.Duration(v[4]) * time.Millisecond, Reset: time.Duration(v[5]) * time.Millisecond,
			Busy: v[6], Mine: v[7]}
	}
	return out, nil
}

// backend runs one tenant's ops atomically.
type backend interface {
	run(ctx context.Context, keys []string, ops []*op, replica string) ([]result, error)
}

//go:embed sync.lua
var syncLua string

var syncScript = redis.NewScript(syncLua)

// redisBackend runs sync.lua. The caller bounds ctx (Options.Timeout); the
// client must honour it on the socket (ContextTimeoutEnabled, as
// RedisConfig.Client sets), else a hung server holds the call until the
// client's own ReadTimeout.
type redisBackend struct{ rdb redis.UniversalClient }

func (b redisBackend) run(ctx context.Context, keys []string, ops []*op, replica string) ([]result, error) {
	js, err := json.Marshal(ops)
	if err != nil {
		return nil, err
	}
	vals, err := syncScript.Run(ctx, b.rdb, keys, js, replica).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("ratelimit: redis: %w", err)
	}
	return decodeResults(vals, len(ops))
}
