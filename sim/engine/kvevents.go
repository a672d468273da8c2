package engine

// KVEvents hears the prefix cache change, as vLLM's KV-cache events report
// it (sim/server publishes them over ZeroMQ). Calls run on the driver's
// goroutine, inside Submit or Advance (under Realtime's lock), and must not
// block.
type KVEvents interface {
	// BlockStored: prompt block i of r (tokens r.TokenIDs[i*BlockSize :
	// (i+1)*BlockSize] when r carries them) is now cached under hash.
	// parent is the hash of block i-1, hasParent false for block 0. The
	// hashes are the engine's (namespaced by adapter). r must not be
	// kept: the engine owns it.
	BlockStored(r *Request, i int, hash, parent uint64, hasParent bool)
	// BlockRemoved: the cached block hash was evicted.
	BlockRemoved(hash uint64)
	// AllBlocksCleared: the whole prefix cache was dropped.
	AllBlocksCleared()
}

// SetKVEvents attaches l to the engine (nil detaches it).
func (e *Engine) SetKVEvents(l KVEvents) {
	e.kvEvents, e.kvEvict = l, nil
	if l != nil {
		e.kvEvict = l.BlockRemoved
	}
}

// kvListener is the attached listener, nil when none is.
func (e *Engine) kvListener() KVEvents { return e.kvEvents }

// evictHook is what allocAnon calls per evicted block (nil: nothing).
func (e *Engine) evictHook() func(uint64) { return e.kvEvict }

func (e *Engine) reportStored(l KVEvents, s *seq, i int) {
	var parent uint64
	if i > 0 {
		parent = s.hashes[i-1]
	}
	l.BlockStored(s.r, i, s.hashes[i], parent, i > 0)
}

// ResetPrefixCache drops every cached block, as vLLM's
// POST /reset_prefix_cache. Like vLLM it refuses, changing nothing and
// returning false, while any request holds KV blocks.
func (e *Engine) ResetPrefixCache() bool {
	if e.kv.used != 0 {
		return false
	}
	version := e.kv.version
	e.kv = newKVPool(e.kv.n)
	e.kv.version = version + 1 // the cache changed: blocked admissions retry
	e.blockedSeq = nil
	if l := e.kvListener(); l != nil {
		l.AllBlocksCleared()
	}
	e.changed()
	return true
}
