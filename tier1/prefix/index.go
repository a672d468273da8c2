package prefix

import (
	"sync"
	"sync/atomic"
)

// Default capacities. 32,768 blocks of 16 tokens ≈ 512k tokens, about what
// one H100 holds in KV cache for an 8B model (GIE uses 31,250); remembering
// more than a pod can cache only produces false hits.
const (
	DefaultIndexBlocks = 1 << 20
	DefaultPodBlocks   = 1 << 15
)

// IndexOptions bounds an Index. Capacities count (block, pod) entries.
// The zero value uses the defaults.
type IndexOptions struct {
	MaxBlocks       int // whole index; default DefaultIndexBlocks
	MaxBlocksPerPod int // per pod; default DefaultPodBlocks
}

func (o IndexOptions) withDefaults() IndexOptions {
	if o.MaxBlocks <= 0 {
		o.MaxBlocks = DefaultIndexBlocks
	}
	if o.MaxBlocksPerPod <= 0 {
		o.MaxBlocksPerPod = DefaultPodBlocks
	}
	if o.MaxBlocksPerPod > o.MaxBlocks {
		o.MaxBlocksPerPod = o.MaxBlocks
	}
	return o
}

const nilNode = -1

// node is one (block, pod) entry: 32 bytes. Nodes live in one slab and link
// by index, so the index holds no pointers for the GC to scan.
type node struct {
	hash       uint64
	pod        int32
	prev, next int32 // the pod's list, most recently placed first
	chain      int32 // next node with the same hash
	// ref is set (atomically, under the read lock) when a request sent to
	// the pod includes the block again; eviction gives such a block a
	// second chance instead of moving it on every hit.
	ref uint32
}

// head is a hash's chain: first node and length. The length lets Match
// rule out a block without walking its chain (same map slot size as a bare
// int32 on 64-bit).
type head struct{ first, n int32 }

type podList struct {
	name       string
	head, tail int32 // most and least recently recorded
	n          int
	live       bool
}

// Index is an approximate map from chained block hash to the pods that were
// recently sent that block. Each pod keeps a list bounded by
// MaxBlocksPerPod and evicts in CLOCK (second-chance) order, an
// approximation of LRU; when the whole index reaches MaxBlocks the pod
// holding the most entries gives up its oldest. It records routing
// decisions, not what servers actually cached, so it is a hint, never a
// guarantee.
// The zero value is not usable; call NewIndex. Safe for concurrent use.
type Index struct {
	opts IndexOptions

	mu     sync.RWMutex
	heads  map[uint64]head // hash → its chain of nodes
	nodes  []node
	free   int32 // free-list of nodes, linked through next
	used   int
	pods   []podList
	podIDs map[string]int32
	freeID []int32
	victim int32 // pod last chosen for global eviction

	scratch sync.Pool // *matchScratch
}

// NewIndex returns an empty index.
func NewIndex(opts IndexOptions) *Index {
	opts = opts.withDefaults()
	return &Index{
		opts:   opts,
		heads:  make(map[uint64]head),
		podIDs: make(map[string]int32),
		free:   nilNode,
		victim: nilNode,
	}
}

// Options returns the index's effective options.
func (x *Index) Options() IndexOptions { return x.opts }

// Len returns the number of (block, pod) entries held.
func (x *Index) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.used
}

// PodLen returns the number of blocks recorded for pod.
func (x *Index) PodLen(pod string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if id, ok := x.podIDs[pod]; ok {
		return x.pods[id].n
	}
	return 0
}

// Record notes that the request with these chained hashes was sent to pod.
//
// Blocks the pod already holds are only marked referenced, under the read
// lock, so requests that repeat a prefix (a system prompt, the earlier turns
// of a chat) do not serialise on the write lock; the write lock is taken only
// to add the blocks the pod lacks. A referenced block reaching the end of
// the pod's list is moved to the front rather than evicted (CLOCK), so the
// list stays close to LRU order without a move per hit.
//
// New blocks go right behind the last block of the prefix the pod holds (at
// the front if it holds none), in request order, so they are evicted before
// that prefix; and a block is only ever referenced together with every block
// before it (hashes are chained). Eviction so trims prefixes from their
// tail, which keeps the "present at i ⇒ present before i" property that
// Match relies on (TestIndexStaysPrefixClosed checks it under churn).
func (x *Index) Record(pod string, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	if len(hashes) > x.opts.MaxBlocksPerPod {
		hashes = hashes[:x.opts.MaxBlocksPerPod]
	}
	x.mu.RLock()
	k := 0
	if id, ok := x.podIDs[pod]; ok {
		for ; k < len(hashes); k++ {
			i := x.find(id, hashes[k])
			if i == nilNode {
				break
			}
			if atomic.LoadUint32(&x.nodes[i].ref) == 0 {
				atomic.StoreUint32(&x.nodes[i].ref, 1)
			}
		}
	}
	x.mu.RUnlock()
	if k == len(hashes) {
		return
	}

	x.mu.Lock()
	defer x.mu.Unlock()
	id := x.podID(pod)
	after := int32(nilNode)
	if k > 0 {
		if after = x.find(id, hashes[k-1]); after == nilNode {
			k = 0 // evicted between the locks
		}
	}
	for _, h := range hashes[k:] {
		if after = x.place(id, h, after); after == nilNode {
			return
		}
	}
}

// find returns pod id's node for hash h, or nilNode.
func (x *Index) find(id int32, h uint64) int32 {
	if hd, ok := x.heads[h]; ok {
		for i := hd.first; i != nilNode; i = x.nodes[i].chain {
			if x.nodes[i].pod == id {
				return i
			}
		}
	}
	return nilNode
}

func (x *Index) podID(pod string) int32 {
	if id, ok := x.podIDs[pod]; ok {
		return id
	}
	var id int32
	if n := len(x.freeID); n > 0 {
		id = x.freeID[n-1]
		x.freeID = x.freeID[:n-1]
	} else {
		id = int32(len(x.pods))
		x.pods = append(x.pods, podList{})
	}
	x.pods[id] = podList{name: pod, head: nilNode, tail: nilNode, live: true}
	x.podIDs[pod] = id
	return id
}

// place adds pod id's node for hash h right behind node after (at the front
// when after is nilNode) and returns it. New blocks go behind the prefix
// they extend, so they are evicted before it. A node the pod already holds
// is only marked referenced. It returns nilNode when making room evicted
// after itself: the pod's list holds nothing older, and the rest of the
// request would be evicted first anyway.
func (x *Index) place(id int32, h uint64, after int32) int32 {
	hd, ok := x.heads[h]
	if ok {
		for i := hd.first; i != nilNode; i = x.nodes[i].chain {
			if x.nodes[i].pod == id {
				x.nodes[i].ref = 1
				return i
			}
		}
	} else {
		hd = head{first: nilNode}
	}
	p := &x.pods[id]
	evicted := int32(nilNode)
	if p.n >= x.opts.MaxBlocksPerPod {
		evicted = x.evict(id)
	} else if x.used >= x.opts.MaxBlocks {
		evicted = x.evict(x.globalVictim(id))
	}
	if evicted != nilNode {
		if evicted == after {
			return nilNode
		}
		// Eviction may have changed this hash's chain: read it again.
		if hd, ok = x.heads[h]; !ok {
			hd = head{first: nilNode}
		}
	}
	i := x.alloc()
	x.nodes[i] = node{hash: h, pod: id, chain: hd.first}
	x.heads[h] = head{first: i, n: hd.n + 1}
	x.insertAfter(id, after, i)
	return i
}

// globalVictim picks the pod that gives up a block when the index is full:
// the recording pod if it holds at least its fair share, else the largest.
func (x *Index) globalVictim(id int32) int32 {
	live := len(x.pods) - len(x.freeID)
	fair := x.used / max(live, 1)
	if x.pods[id].n >= fair && x.pods[id].n > 0 {
		return id
	}
	if v := x.victim; v != nilNode && int(v) < len(x.pods) && x.pods[v].live && x.pods[v].n > fair {
		return v
	}
	best := id
	for i := range x.pods {
		if x.pods[i].live && x.pods[i].n > x.pods[best].n {
			best = int32(i)
		}
	}
	x.victim = best
	return best
}

func (x *Index) alloc() int32 {
	x.used++
	if x.free != nilNode {
		i := x.free
		x.free = x.nodes[i].next
		return i
	}
	x.nodes = append(x.nodes, node{})
	return int32(len(x.nodes) - 1)
}

func (x *Index) pushFront(id, i int32) { x.insertAfter(id, nilNode, i) }

// insertAfter links node i into pod id's list right behind node after, or
// at the front when after is nilNode.
func (x *Index) insertAfter(id, after, i int32) {
	p := &x.pods[id]
	n := &x.nodes[i]
	if after == nilNode {
		n.prev, n.next = nilNode, p.head
		p.head = i
	} else {
		n.prev, n.next = after, x.nodes[after].next
		x.nodes[after].next = i
	}
	if n.next != nilNode {
		x.nodes[n.next].prev = i
	} else {
		p.tail = i
	}
	p.n++
}

func (x *Index) unlink(i int32) {
	n := &x.nodes[i]
	p := &x.pods[n.pod]
	if n.prev != nilNode {
		x.nodes[n.prev].next = n.next
	} else {
		p.head = n.next
	}
	if n.next != nilNode {
		x.nodes[n.next].prev = n.prev
	} else {
		p.tail = n.prev
	}
	p.n--
}

// evict drops the oldest unreferenced block of pod id and returns its node
// index (now free), or nilNode when the pod holds nothing. Referenced blocks
// met on the way move to the front with the mark cleared, in order: each
// move spends one mark, so the cost is amortised O(1).
func (x *Index) evict(id int32) int32 {
	p := &x.pods[id]
	for range p.n {
		t := p.tail
		if x.nodes[t].ref == 0 {
			break
		}
		x.nodes[t].ref = 0
		x.unlink(t)
		x.pushFront(id, t)
	}
	t := p.tail
	if t != nilNode {
		x.remove(t)
	}
	return t
}

// remove unlinks node i from its pod list and its hash chain and frees it.
func (x *Index) remove(i int32) {
	x.unlink(i)
	h := x.nodes[i].hash
	hd := x.heads[h]
	switch {
	case hd.n <= 1:
		delete(x.heads, h)
	case hd.first == i:
		x.heads[h] = head{first: x.nodes[i].chain, n: hd.n - 1}
	default:
		for j := hd.first; j != nilNode; j = x.nodes[j].chain {
			if x.nodes[j].chain == i {
				x.nodes[j].chain = x.nodes[i].chain
				break
			}
		}
		x.heads[h] = head{first: hd.first, n: hd.n - 1}
	}
	x.nodes[i] = node{next: x.free}
	x.free = i
	x.used--
}

// RemovePod forgets everything recorded for pod (it left the pool or
// restarted with an empty cache).
func (x *Index) RemovePod(pod string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, ok := x.podIDs[pod]
	if !ok {
		return
	}
	for x.pods[id].tail != nilNode {
		x.remove(x.pods[id].tail)
	}
	delete(x.podIDs, pod)
	x.pods[id] = podList{head: nilNode, tail: nilNode}
	x.freeID = append(x.freeID, id)
	if x.victim == id {
		x.victim = nilNode
	}
}

type matchScratch struct {
	pos  []int32  // pod id → 1 + index in pods while active, else 0
	mark []uint32 // pod id → generation when last seen in a chain
	act  []int32  // active pod ids
	all  []int32  // every candidate id, to reset pos
	gen  uint32
}

// Match writes to dst[:len(pods)] the number of leading blocks of hashes
// each pod is believed to hold, and returns it. It allocates only if dst is
// too small.
//
// It assumes the per-pod sets are prefix-closed (a pod holding block i
// holds blocks before i), which chaining and tail-first eviction make
// nearly true, and gallops over the blocks: the cost is O(changes × log n)
// chain walks rather than one lookup per block.
func (x *Index) Match(hashes []uint64, pods []string, dst []int) []int {
	if cap(dst) < len(pods) {
		dst = make([]int, len(pods))
	}
	dst = dst[:len(pods)]
	clear(dst)
	n := len(hashes)
	if n == 0 || len(pods) == 0 {
		return dst
	}
	x.mu.RLock()
	defer x.mu.RUnlock()

	s, _ := x.scratch.Get().(*matchScratch)
	if s == nil {
		s = &matchScratch{}
	}
	if len(s.pos) < len(x.pods) {
		s.pos = make([]int32, len(x.pods))
		s.mark = make([]uint32, len(x.pods))
	}
	s.act, s.all = s.act[:0], s.all[:0]
	for j, name := range pods {
		if id, ok := x.podIDs[name]; ok {
			if s.pos[id] == 0 {
				s.act = append(s.act, id)
				s.all = append(s.all, id)
			}
			s.pos[id] = int32(j + 1)
		}
	}

	// keep shrinks the active set to the pods present at block i; the others
	// matched exactly i blocks.
	keep := func(i int) {
		s.gen++
		if hd, ok := x.heads[hashes[i]]; ok {
			for c := hd.first; c != nilNode; c = x.nodes[c].chain {
				s.mark[x.nodes[c].pod] = s.gen
			}
		}
		a := s.act[:0]
		for _, id := range s.act {
			if s.mark[id] == s.gen {
				a = append(a, id)
			} else {
				dst[s.pos[id]-1] = i
				s.pos[id] = 0
			}
		}
		s.act = a
	}
	// all reports whether all k active pods hold block i.
	all := func(i, k int) bool {
		hd, ok := x.heads[hashes[i]]
		if !ok || int(hd.n) < k {
			return false // fewer holders than active pods: no walk needed
		}
		// Stop at the k-th active holder, or once more than n−k holders
		// are inactive (then some active pod is missing).
		c, miss := 0, int(hd.n)-k
		for j := hd.first; j != nilNode; j = x.nodes[j].chain {
			if s.pos[x.nodes[j].pod] != 0 {
				if c++; c == k {
					return true
				}
			} else if miss--; miss < 0 {
				return false
			}
		}
		return false
	}

	keep(0)
	lo := 0
	for len(s.act) > 0 {
		k := len(s.act)
		good, bad := lo, n
		for step := 1; ; step *= 2 {
			p := lo + step
			if p >= n {
				p = n - 1
			}
			if p <= good {
				break
			}
			if all(p, k) {
				good = p
				if p == n-1 {
					break
				}
			} else {
				bad = p
				break
			}
		}
		for bad-good > 1 {
			mid := int(uint(good+bad) >> 1)
			if all(mid, k) {
				good = mid
			} else {
				bad = mid
			}
		}
		if bad == n {
			for _, id := range s.act {
				dst[s.pos[id]-1] = n
				s.pos[id] = 0
			}
			s.act = s.act[:0]
			break
		}
		keep(bad)
		lo = bad
	}
	for _, id := range s.all {
		s.pos[id] = 0
	}
	x.scratch.Put(s)
	return dst
}
