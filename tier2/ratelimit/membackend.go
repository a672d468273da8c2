package ratelimit

import (
	"context"
	"sort"
	"sync"
	"time"
)

// memBackend implements sync.lua's semantics in process, for a single
// replica without Redis. protocol_test.go runs one table of calls against
// both this and the script on a real Redis, so the two cannot drift apart
// unnoticed.
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
				grant = min(o.Need+max(min(o.Ask, o.Lim-s.used-o.Need-o.Rsv), 0), max(o.Lim-s.used, 0))
				if grant > 0 {
					m.windows[key][s.cur] += grant
					s.used += grant
					s.newest = s.cur
				}
			}
		case o.K == opBudget:
			if ok {
				grant = min(o.Need+max(min(o.Ask, o.Lim-s.used-o.Need-o.Rsv), 0), max(o.Lim-s.used, 0))
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
