package engine

// kvPool is a paged KV cache with vLLM-style automatic prefix caching.
//
// Only blocks that hold a full, hashed prompt block have an identity (an
// entry): they are ref-counted, and when nobody references them they stay
// cached, evicted least recently released first. Every other block (decode
// output, partial prompt blocks) is anonymous and only counted, which keeps
// decode O(1) per token and the metadata small. Anonymous allocations use
// truly free blocks before evicting cached ones (vLLM keeps both in one
// queue; preferring free blocks raises the hit rate a little).
type kvPool struct {
	n       int // total blocks
	used    int // blocks referenced by requests (anonymous + entries with ref > 0)
	entries []kvEntry
	freeEnt []int32
	// LRU list of unreferenced cached entries; head is evicted first.
	lruHead, lruTail int32
	nLRU             int
	cache            blockIndex
	version          int64 // bumped whenever a block becomes cached
}

type kvEntry struct {
	hash       uint64
	ref        int32
	prev, next int32
}

func newKVPool(n int) kvPool {
	return kvPool{n: n, lruHead: -1, lruTail: -1, cache: newBlockIndex(n)}
}

// free is the number of blocks an allocation can take (truly free plus
// evictable cached).
func (p *kvPool) free() int { return p.n - p.used }

// allocAnon takes k anonymous blocks, evicting cached ones if the truly
// free blocks do not suffice. The caller checks free() ≥ k. evicted, if
// not nil, hears each evicted block's hash.
func (p *kvPool) allocAnon(k int, evicted func(hash uint64)) {
	p.used += k
	for p.used+p.nLRU > p.n {
		b := p.lruHead
		p.lruRemove(b)
		p.cache.del(p.entries[b].hash)
		p.freeEnt = append(p.freeEnt, b)
		if evicted != nil {
			evicted(p.entries[b].hash)
		}
	}
}

// releaseAnon returns k anonymous blocks.
func (p *kvPool) releaseAnon(k int) { p.used -= k }

// lookup finds a cached block by hash.
func (p *kvPool) lookup(h uint64) (int32, bool) {
	return p.cache.get(h)
}

// acquire adds a reference to a cached block (a prefix hit).
func (p *kvPool) acquire(b int32) {
	e := &p.entries[b]
	if e.ref == 0 {
		p.lruRemove(b)
		p.used++
	}
	e.ref++
}

// release drops a reference; an unreferenced entry joins the LRU tail.
func (p *kvPool) release(b int32) {
	e := &p.entries[b]
	if e.ref--; e.ref == 0 {
		p.used--
		p.lruPush(b)
	}
}

// commit turns one of the caller's anonymous blocks into a cached block
// holding hash h and returns its entry, or -1 (the block stays anonymous)
// if another block already caches h: vLLM does not deduplicate either.
func (p *kvPool) commit(h uint64) int32 {
	var b int32
	if n := len(p.freeEnt); n > 0 {
		b = p.freeEnt[n-1]
	} else {
		b = int32(len(p.entries))
	}
	if !p.cache.putIfAbsent(h, b) {
		return -1
	}
	if n := len(p.freeEnt); n > 0 {
		p.freeEnt = p.freeEnt[:n-1]
	} else {
		p.entries = append(p.entries, kvEntry{})
	}
	p.entries[b] = kvEntry{hash: h, ref: 1, prev: -1, next: -1}
	p.version++
	return b
}

func (p *kvPool) lruPush(b int32) {
	e := &p.entries[b]
	e.prev, e.next = p.lruTail, -1
	if p.lruTail >= 0 {
		p.entries[p.lruTail].next = b
	} else {
		p.lruHead = b
	}
	p.lruTail = b
	p.nLRU++
}

func (p *kvPool) lruRemove(b int32) {
	e := &p.entries[b]
	if e.prev >= 0 {
		p.entries[e.prev].next = e.next
	} else {
		p.lruHead = e.next
	}
	if e.next >= 0 {
		p.entries[e.next].prev = e.prev
	} else {
		p.lruTail = e.prev
	}
	e.prev, e.next = -1, -1
	p.nLRU--
}
