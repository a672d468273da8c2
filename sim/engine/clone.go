package engine

import (
	"maps"
	"slices"
)

// Clone returns an independent copy of the engine's state: its queues, KV
// cache, LoRA slots, statistics and step clock. Driven with the same calls
// it produces exactly what e would (the step jitter is a function of the
// step counter, which is copied). The copy runs no callbacks of the
// requests already submitted and is not attached to any Loop. It exists
// for reference policies that look ahead (the benchmark's perfect-state
// oracle), not for routing: a router never sees an engine's internals.
func (e *Engine) Clone() *Engine {
	c := *e
	c.cfg.Adapters = slices.Clone(e.cfg.Adapters)
	c.kv.entries = slices.Clone(e.kv.entries)
	c.kv.freeEnt = slices.Clone(e.kv.freeEnt)
	c.kv.cache.slots = slices.Clone(e.kv.cache.slots)
	c.slots = slices.Clone(e.slots)
	c.registered = maps.Clone(e.registered)
	c.salts = maps.Clone(e.salts)
	c.waitingAdapters = maps.Clone(e.waitingAdapters)
	c.emits, c.deferred, c.pool, c.scratch = nil, nil, nil, nil
	c.firing = false
	c.notify, c.loopIt, c.inDirty = nil, nil, false

	c.seqs = make(map[uint64]*seq, len(e.seqs))
	copied := make(map[*seq]*seq, len(e.seqs))
	dup := func(s *seq) *seq {
		if s == nil {
			return nil
		}
		if d, ok := copied[s]; ok {
			return d
		}
		d := new(seq)
		*d = *s
		d.hashes = slices.Clone(s.hashes)
		d.ents = slices.Clone(s.ents)
		d.prev, d.next = nil, nil
		if s.r != nil {
			r := *s.r
			r.OnFirstToken, r.OnTokens, r.OnDone = nil, nil, nil
			d.r = &r
		}
		copied[s] = d
		return d
	}
	for id, s := range e.seqs {
		c.seqs[id] = dup(s)
	}
	c.waiting = seqList{}
	for s := e.waiting.head; s != nil; s = s.next {
		c.waiting.pushBack(dup(s))
	}
	c.running = make([]*seq, len(e.running))
	for i, s := range e.running {
		c.running[i] = dup(s)
	}
	c.blockedSeq = dup(e.blockedSeq)
	return &c
}
