package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

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
	K      string      `json:"k"`
	Key    int         `json:"key"`            // 1-based index into KEYS
	DKey   int         `json:"dkey,omitempty"` // conc: deadline ZSET
	UKey   int         `json:"ukey,omitempty"` // conc: HASH replica -> slots in use
	Lim    int64       `json:"lim"`
	Need   int64       `json:"need"` // must all be granted or the whole call is denied
	Ask    int64       `json:"ask"`  // best-effort extra (a lease)
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

// resultWidth is how many values the script returns per op.
const resultWidth = 8

// backend runs one tenant's ops atomically.
type backend interface {
	run(ctx context.Context, keys []string, ops []*op, replica string) ([]result, error)
}

func decodeResults(vals []int64, n int) ([]result, error) {
	if len(vals) != resultWidth*n {
		return nil, fmt.Errorf("ratelimit: script returned %d values for %d ops", len(vals), n)
	}
	out := make([]result, n)
	for i := range out {
		v := vals[resultWidth*i : resultWidth*i+resultWidth]
		out[i] = result{Denied: v[0] == 1, Granted: v[1], Bucket: v[2], Used: v[3], Retry: time.Duration(v[4]) * time.Millisecond, Reset: time.Duration(v[5]) * time.Millisecond,
			Busy: v[6], Mine: v[7]}
	}
	return out, nil
}

// syncScript checks every op first and grants only if all needs fit, so an
// admission is all-or-nothing across RPM, TPM, concurrency and budget.
// Redis TIME is the only clock, so replicas' clocks do not matter.
var syncScript = redis.NewScript(`
local ops = cjson.decode(ARGV[1])
local rep = ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ok = true
local st = {}
for i, op in ipairs(ops) do
  local s = {used = 0, retry = -1, denied = 0, cur = 0, newest = -1, busy = 0, mine = 0}
  st[i] = s
  local key = KEYS[op.key]
  if op.k == 'w' then
    local w, n = op.w, op.n
    local cur = math.floor(now / w)
    local first = cur - n + 1
    s.cur = cur
    if not op.ro then
      if op.ref then
        for _, r in ipairs(op.ref) do
          if r[1] >= first and r[1] <= cur then
            local v = redis.call('HINCRBY', key, r[1], -r[2])
            if v <= 0 then redis.call('HDEL', key, r[1]) end
          end
        end
      end
      if op.debt and op.debt > 0 then
        redis.call('HINCRBY', key, cur, op.debt)
        redis.call('PEXPIRE', key, (n + 1) * w)
      end
    end
    local all = redis.call('HGETALL', key)
    local buckets = {}
    for j = 1, #all, 2 do
      local b, v = tonumber(all[j]), tonumber(all[j + 1])
      if b < first then
        if not op.ro then redis.call('HDEL', key, all[j]) end
      elseif v > 0 then
        s.used = s.used + v
        buckets[#buckets + 1] = {b, v}
        if b > s.newest then s.newest = b end
      end
    end
    if op.need > 0 and s.used + op.need > op.lim then
      ok = false
      s.denied = 1
      if op.need <= op.lim then
        table.sort(buckets, function(a, b) return a[1] < b[1] end)
        local excess = s.used + op.need - op.lim
        for _, bv in ipairs(buckets) do
          excess = excess - bv[2]
          if excess <= 0 then s.retry = (bv[1] + n) * w - now; break end
        end
      end
    end
  elseif op.k == 'b' then
    local used = tonumber(redis.call('GET', key) or '0')
    if not op.ro and op.delta and op.delta ~= 0 then
      used = redis.call('INCRBY', key, op.delta)
      if used < 0 then redis.call('SET', key, 0); used = 0 end
      redis.call('EXPIREAT', key, op.exp)
    end
    s.used = used
    if op.need > 0 and used + op.need > op.lim then
      ok = false
      s.denied = 1
      s.retry = op.rst or 0
    end
  elseif op.k == 'c' then
    local dkey = KEYS[op.dkey]
    local ukey = op.ukey and KEYS[op.ukey]
    if not op.ro then
      local dead = redis.call('ZRANGEBYSCORE', dkey, '-inf', now)
      for _, r in ipairs(dead) do
        redis.call('HDEL', key, r)
        redis.call('ZREM', dkey, r)
        if ukey then redis.call('HDEL', ukey, r) end
      end
    end
    local all = redis.call('HGETALL', key)
    local others = 0
    for j = 1, #all, 2 do
      if op.ro then
        -- Usage: live holders only (dead ones are purged by the next
        -- write), with the slots each reported in use.
        local dl = tonumber(redis.call('ZSCORE', dkey, all[j]) or '0')
        if dl > now then
          others = others + tonumber(all[j + 1])
          local b = 0
          if ukey then b = tonumber(redis.call('HGET', ukey, all[j]) or '0') end
          if all[j] == rep then s.mine = b else s.busy = s.busy + b end
        end
      elseif all[j] ~= rep then
        others = others + tonumber(all[j + 1])
      end
    end
    s.others = others
    op.inuse = op.inuse or 0
    s.used = others + op.inuse
    if op.need > 0 and others + op.inuse + op.need > op.lim then
      ok = false
      s.denied = 1
    end
  end
end
local out = {}
for i, op in ipairs(ops) do
  local s = st[i]
  local key = KEYS[op.key]
  local grant = 0
  if op.ro then
    -- usage only
  elseif op.k == 'w' then
    if ok then
      grant = math.min(op.need + op.ask, math.max(op.lim - s.used, 0))
      if grant > 0 then
        redis.call('HINCRBY', key, s.cur, grant)
        redis.call('PEXPIRE', key, (op.n + 1) * op.w)
        s.used = s.used + grant
        s.newest = s.cur
      end
    end
  elseif op.k == 'b' then
    if ok then
      grant = math.min(op.need + op.ask, math.max(op.lim - s.used, 0))
      if grant > 0 then
        s.used = redis.call('INCRBY', key, grant)
        redis.call('EXPIREAT', key, op.exp)
      end
    end
  elseif op.k == 'c' then
    local mine = op.inuse
    if ok then
      mine = op.inuse + math.min(op.need + op.ask, math.max(op.lim - s.others - op.inuse, 0))
    end
    grant = mine - op.inuse
    local dkey = KEYS[op.dkey]
    local ukey = op.ukey and KEYS[op.ukey]
    if mine > 0 then
      redis.call('HSET', key, rep, mine)
      redis.call('ZADD', dkey, now + op.ttl, rep)
      redis.call('PEXPIRE', key, op.ttl * 4)
      redis.call('PEXPIRE', dkey, op.ttl * 4)
      if ukey then
        local busy = op.busy or 0
        if ok then busy = busy + (op.adm or 0) end
        busy = math.min(busy, mine)
        if busy > 0 then
          redis.call('HSET', ukey, rep, busy)
          redis.call('PEXPIRE', ukey, op.ttl * 4)
        else
          redis.call('HDEL', ukey, rep)
        end
      end
    else
      redis.call('HDEL', key, rep)
      redis.call('ZREM', dkey, rep)
      if ukey then redis.call('HDEL', ukey, rep) end
    end
    s.used = s.others + mine
  end
  local reset = 0
  if op.k == 'w' and s.newest >= 0 then reset = (s.newest + op.n) * op.w - now end
  if op.k == 'b' then reset = op.rst or 0 end
  out[#out + 1] = s.denied
  out[#out + 1] = grant
  out[#out + 1] = s.cur
  out[#out + 1] = s.used
  out[#out + 1] = s.retry
  out[#out + 1] = reset
  out[#out + 1] = s.busy
  out[#out + 1] = s.mine
end
return out
`)

type redisBackend struct{ rdb redis.UniversalClient }

func (b redisBackend) run(ctx context.Context, keys []string, ops []*op, replica string) ([]result, error) {
	js, err := json.Marshal(ops)
	if err != nil {
		return nil, err
	}
	vals, err := withDeadline(ctx, func() ([]int64, error) {
		return syncScript.Run(ctx, b.rdb, keys, js, replica).Int64Slice()
	})
	if err != nil {
		return nil, fmt.Errorf("ratelimit: redis: %w", err)
	}
	return decodeResults(vals, len(ops))
}

// withDeadline returns when ctx ends even if f does not: go-redis only
// honours context deadlines on sockets with ContextTimeoutEnabled, and a
// hung server must not hold a request longer than Options.Timeout. The
// abandoned call finishes in the background at the client's own timeouts.
func withDeadline[T any](ctx context.Context, f func() (T, error)) (T, error) {
	type reply struct {
		v   T
		err error
	}
	ch := make(chan reply, 1)
	go func() {
		v, err := f()
		ch <- reply{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// memBackend implements the script's semantics in process for a single
// replica without Redis.
type memBackend struct {
	mu      sync.Mutex
	now     func() time.Time
	windows map[string]map[int64]int64
	budgets map[string]int64
	conc    map[string]map[string]int64 // holdings by replica
	busy    map[string]map[string]int64 // of those, in use by replica
}

func newMemBackend() *memBackend {
	return &memBackend{now: time.Now, windows: map[string]map[int64]int64{}, budgets: map[string]int64{}, conc: map[string]map[string]int64{},
		busy: map[string]map[string]int64{}}
}

func (m *memBackend) run(_ context.Context, keys []string, ops []*op, replica string) ([]result, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now().UnixMilli()
	type st struct {
		used, others, cur, newest int64
		retry                     int64
		busy, mine                int64
		denied                    bool
	}
	sts := make([]st, len(ops))
	ok := true
	for i, o := range ops {
		s := &sts[i]
		s.retry, s.newest = -1, -1
		key := keys[o.Key-1]
		switch o.K {
		case opWindow:
			win := m.windows[key]
			if win == nil {
				win = map[int64]int64{}
				m.windows[key] = win
			}
			cur := now / o.W
			first := cur - o.N + 1
			s.cur = cur
			if !o.RO {
				for _, r := range o.Ref {
					if r[0] >= first && r[0] <= cur {
						win[r[0]] -= r[1]
						if win[r[0]] <= 0 {
							delete(win, r[0])
						}
					}
				}
				if o.Debt > 0 {
					win[cur] += o.Debt
				}
			}
			var bs [][2]int64
			for b, v := range win {
				if b < first {
					if !o.RO {
						delete(win, b)
					}
					continue
				}
				if v > 0 {
					s.used += v
					bs = append(bs, [2]int64{b, v})
					s.newest = max(s.newest, b)
				}
			}
			if o.Need > 0 && s.used+o.Need > o.Lim {
				ok, s.denied = false, true
				if o.Need <= o.Lim {
					sort.Slice(bs, func(a, b int) bool { return bs[a][0] < bs[b][0] })
					excess := s.used + o.Need - o.Lim
					for _, bv := range bs {
						excess -= bv[1]
						if excess <= 0 {
							s.retry = (bv[0]+o.N)*o.W - now
							break
						}
					}
				}
			}
		case opBudget:
			if !o.RO && o.Delta != 0 {
				m.budgets[key] = max(0, m.budgets[key]+o.Delta)
			}
			s.used = m.budgets[key]
			if o.Need > 0 && s.used+o.Need > o.Lim {
				ok, s.denied, s.retry = false, true, o.ResetM
			}
		case opConc:
			h := m.conc[key]
			if h == nil {
				h = map[string]int64{}
				m.conc[key] = h
			}
			for r, v := range h {
				if r != replica || o.RO {
					s.others += v
				}
				if o.RO && o.UKey > 0 {
					if r == replica {
						s.mine = m.busy[keys[o.UKey-1]][r]
					} else {
						s.busy += m.busy[keys[o.UKey-1]][r]
					}
				}
			}
			s.used = s.others + o.InUse
			if o.Need > 0 && s.others+o.InUse+o.Need > o.Lim {
				ok, s.denied = false, true
			}
		}
	}
	out := make([]result, len(ops))
	for i, o := range ops {
		s := &sts[i]
		key := keys[o.Key-1]
		var grant int64
		switch {
		case o.RO:
		case o.K == opWindow:
			if ok {
				grant = min(o.Need+o.Ask, max(o.Lim-s.used, 0))
				if grant > 0 {
					m.windows[key][s.cur] += grant
					s.used += grant
					s.newest = s.cur
				}
			}
		case o.K == opBudget:
			if ok {
				grant = min(o.Need+o.Ask, max(o.Lim-s.used, 0))
				m.budgets[key] += grant
				s.used = m.budgets[key]
			}
		case o.K == opConc:
			mine := o.InUse
			if ok {
				mine = o.InUse + min(o.Need+o.Ask, max(o.Lim-s.others-o.InUse, 0))
			}
			grant = mine - o.InUse
			if mine > 0 {
				m.conc[key][replica] = mine
			} else {
				delete(m.conc[key], replica)
			}
			if o.UKey > 0 {
				ukey := keys[o.UKey-1]
				if m.busy[ukey] == nil {
					m.busy[ukey] = map[string]int64{}
				}
				busy := o.Busy
				if ok {
					busy += o.Adm
				}
				if busy = min(busy, mine); busy > 0 {
					m.busy[ukey][replica] = busy
				} else {
					delete(m.busy[ukey], replica)
				}
			}
			s.used = s.others + mine
		}
		var reset int64
		if o.K == opWindow && s.newest >= 0 {
			reset = (s.newest+o.N)*o.W - now
		}
		if o.K == opBudget {
			reset = o.ResetM
		}
		out[i] = result{Denied: s.denied, Granted: grant, Bucket: s.cur, Used: s.used, Retry: time.Duration(s.retry) * time.Millisecond, Reset: time.Duration(reset) * time.Millisecond,
			Busy: s.busy, Mine: s.mine}
	}
	return out, nil
}
