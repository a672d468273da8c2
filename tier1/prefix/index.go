package prefix

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/infergate/infergate/shared/config"
)

// Default capacities. 32,768 blocks of 16 tokens ≈ 512k tokens, about what
// one H100 holds in KV cache for an 8B model (GIE uses 31,250); remembering
// more than a pod can cache only produces false hits.
const (
	DefaultIndexBlocks = 1 << 20
	DefaultPodBlocks   = 1 << 15
)

// DefaultStride is how many of a prompt's blocks one index entry stands
// for. Keeping every 4th block's hash (and the last's) costs a quarter of
// the memory and of the cache misses of recording every block, which were
// over a quarter of Tier 1's CPU per request on unique 32 KB prompts
// (docs/performance.md#cpu-per-request); a match is then known to within
// 3 blocks (≈ 48 tokens), well below what moves a prefix score.
const DefaultStride = 4

// IndexOptions bounds an Index. Capacities count blocks; with a stride s
// the index holds a 1/s as many entries, each standing for s blocks.
// The zero value uses the defaults.
type IndexOptions struct {
	MaxBlocks       int // whole index; default DefaultIndexBlocks
	MaxBlocksPerPod int // per pod; default DefaultPodBlocks
	// Stride keeps one entry per Stride blocks of a prompt: blocks
	// Stride−1, 2·Stride−1, … and its last block. Chained hashes make
	// each entry stand for every block before it. Default DefaultStride;
	// 1 keeps every block.
	Stride int
}

func (o IndexOptions) withDefaults() IndexOptions {
	config.Default(&o.MaxBlocks, DefaultIndexBlocks)
	config.Default(&o.MaxBlocksPerPod, DefaultPodBlocks)
	o.MaxBlocksPerPod = min(o.MaxBlocksPerPod, o.MaxBlocks)
	config.Default(&o.Stride, DefaultStride)
	return o
}

// Sharding. An index whose pods may hold at least minShardPodBlocks blocks
// each is split into numShards shards by block hash, each with its own lock,
// map, slab and per-pod lists holding 1/numShards of the capacities, so
// concurrent Records of different blocks do not wait for each other. Small
// indexes (tests, tiny pools) keep one shard and exact capacities.
const (
	numShards         = 8
	minShardPodBlocks = numShards * 256
)

const nilNode = -1

// node is one (block, pod) entry: 32 bytes. Nodes live in one slab per
// shard and link by index, so the index holds no pointers for the GC to
// scan.
type node struct {
	hash       uint64
	pod        int32
	prev, next int32 // the pod's list, most recently placed first
	chain      int32 // next node with the same hash
	// ref is set (atomically, under the read lock) when a request sent to
	// the pod includes the block again; eviction gives such a block a
	// second chance instead of moving it on every hit.
	ref uint32
	// fp is the sum of podMix over this node and the nodes after it in
	// its hash chain, so the first node's fp fingerprints the set of pods
	// holding the block. It fills the struct's padding.
	fp uint32
}

// podMix spreads a pod id over 32 bits (splitmix64's finaliser). A sum of
// podMix values fingerprints a set of pods: Match compares the active pods'
// sum with a chain's instead of walking the chain. Two different sets of the
// same size have the same sum with probability about 2^-32 per comparison,
// and then a pod is credited with blocks it may not hold: the index is a
// hint, and a wrong hint costs one request a cache miss.
func podMix(id int32) uint32 {
	z := uint64(id) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return uint32(z ^ (z >> 31))
}

// head is a hash's chain: first node and length. The length lets Match
// rule out a block without walking its chain (same map slot size as a bare
// int32 on 64-bit).
type head struct{ first, n int32 }

type podList struct {
	head, tail int32 // most and least recently placed
	n          int
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
	opts   IndexOptions // effective: numShards × a shard's capacities
	shards []shard
	mask   uint64

	// reg guards the pod registry. Record and Match hold it for reading
	// for their whole run, so a pod id cannot be freed and reused under
	// them; RemovePod and the first Record of a pod take it for writing.
	reg    sync.RWMutex
	podIDs map[string]int32
	ids    int32 // ids handed out so far
	freeID []int32

	scratch sync.Pool // *matchScratch
	groups  sync.Pool // *[]uint64, hashes grouped by shard

	// key, when set, keys every hash recorded and looked up (SetKey).
	key   atomic.Pointer[Key]
	keyed sync.Pool // *[]uint64, a request's keyed hashes
}

// SetKey makes the index store and compare hashes keyed with k (nil: as
// given). Set it before the first Record: entries recorded under another
// key never match again (they age out like any other).
func (x *Index) SetKey(k *Key) { x.key.Store(k) }

// Key returns the key set with SetKey, nil if none.
func (x *Index) Key() *Key { return x.key.Load() }

// shard is one lock's worth of the index.
type shard struct {
	mu        sync.RWMutex
	maxBlocks int
	maxPerPod int
	heads     headTable // hash → its chain of nodes
	nodes     []node
	free      int32 // free-list of nodes, linked through next
	used      int
	pods      []podList // by pod id; grown on demand
	live      int       // pods holding at least one node here
	victim    int32     // pod last chosen for global eviction
	touched   uint64    // a sum of what prefetch loaded, so that its loads are used
	_         [64]byte  // keep shards' locks on separate cache lines
}

// NewIndex returns an empty index.
func NewIndex(opts IndexOptions) *Index {
	opts = opts.withDefaults()
	st := opts.Stride
	maxEntries, podEntries := max(opts.MaxBlocks/st, 1), max(opts.MaxBlocksPerPod/st, 1)
	n := 1
	if podEntries >= minShardPodBlocks {
		n = numShards
	}
	x := &Index{
		shards: make([]shard, n),
		mask:   uint64(n - 1),
		podIDs: make(map[string]int32),
	}
	for i := range x.shards {
		x.shards[i] = shard{
			maxBlocks: maxEntries / n,
			maxPerPod: podEntries / n,
			free:      nilNode,
			victim:    nilNode,
		}
	}
	x.opts = IndexOptions{MaxBlocks: maxEntries / n * n * st, MaxBlocksPerPod: podEntries / n * n * st, Stride: st}
	return x
}

// Options returns the index's effective options (capacities are rounded
// down to a multiple of the stride times the shard count).
func (x *Index) Options() IndexOptions { return x.opts }

func (x *Index) shardOf(h uint64) *shard { return &x.shards[h&x.mask] }

// Len returns the number of (block, pod) entries held: with a stride s,
// one per s blocks recorded.
func (x *Index) Len() int {
	n := 0
	for i := range x.shards {
		s := &x.shards[i]
		s.mu.RLock()
		n += s.used
		s.mu.RUnlock()
	}
	return n
}

// PodLen returns the number of entries recorded for pod (one per stride
// blocks).
func (x *Index) PodLen(pod string) int {
	x.reg.RLock()
	defer x.reg.RUnlock()
	id, ok := x.podIDs[pod]
	if !ok {
		return 0
	}
	n := 0
	for i := range x.shards {
		s := &x.shards[i]
		s.mu.RLock()
		if int(id) < len(s.pods) {
			n += s.pods[id].n
		}
		s.mu.RUnlock()
	}
	return n
}

// Record notes that the request with these chained hashes was sent to pod.
//
// Each shard gets the request's blocks that hash to it, in request order,
// and is updated under its own lock. Within a shard, blocks the pod already
// holds are only marked referenced, under the read lock, so requests that
// repeat a prefix (a system prompt, the earlier turns of a chat) do not
// serialise on a write lock; the write lock is taken only to add the blocks
// the pod lacks. A referenced block reaching the end of the pod's list is
// moved to the front rather than evicted (CLOCK), so the list stays close to
// LRU order without a move per hit.
//
// New blocks go right behind the last block of the prefix the pod holds (at
// the front if it holds none), in request order, so they are evicted before
// that prefix; and a block is only ever referenced together with every block
// before it (hashes are chained). Eviction so trims prefixes from their
// tail, which keeps the "present at i ⇒ present before i" property that
// Match relies on: exactly within a shard (TestIndexStaysPrefixClosed
// checks it under churn), and across shards as nearly as their evictions
// keep pace, which uniform hashing makes close.
func (x *Index) Record(pod string, hashes []uint64) {
	x.recordWith(pod, hashes, x.key.Load())
}

// recordWith records the kept blocks of hashes (IndexOptions.Stride) for
// pod, keyed with k first when k is not nil, through a pooled buffer.
func (x *Index) recordWith(pod string, hashes []uint64, k *Key) {
	if len(hashes) == 0 {
		return
	}
	hashes = hashes[:min(len(hashes), x.opts.MaxBlocksPerPod)]
	if k == nil && x.opts.Stride == 1 {
		x.record(pod, hashes)
		return
	}
	bp, _ := x.keyed.Get().(*[]uint64)
	if bp == nil {
		bp = new([]uint64)
	}
	buf := x.sample((*bp)[:0], hashes)
	if k != nil {
		k.Apply(buf)
	}
	x.record(pod, buf)
	*bp = buf
	x.keyed.Put(bp)
}

// sample appends to dst the hashes of the blocks the index keeps of a
// prompt with these hashes (see IndexOptions.Stride) and returns it.
func (x *Index) sample(dst, hashes []uint64) []uint64 {
	st, n := x.opts.Stride, len(hashes)
	for i := st - 1; i < n; i += st {
		dst = append(dst, hashes[i])
	}
	if n%st != 0 {
		dst = append(dst, hashes[n-1])
	}
	return dst
}

// RecordKeyed is Record for hashes already keyed with the index's key (a
// peer replica's records, tier1/peers); without a key it is Record.
func (x *Index) RecordKeyed(pod string, hashes []uint64) {
	x.recordWith(pod, hashes, nil)
}

// record puts a prompt's kept, keyed hashes in the index for pod.
func (x *Index) record(pod string, hashes []uint64) {
	id := x.lockPod(pod)
	defer x.reg.RUnlock()
	if len(x.shards) == 1 {
		x.shards[0].record(id, hashes)
		return
	}
	bp, _ := x.groups.Get().(*[]uint64)
	if bp == nil {
		bp = new([]uint64)
	}
	// Group by shard, in order, with a counting sort: two passes without
	// branches on the hash, not one filtering pass per shard (whose
	// mispredicted branches were most of this function's own time).
	var start, next [numShards + 1]int
	for _, h := range hashes {
		start[h&x.mask+1]++
	}
	for si := 1; si <= numShards; si++ {
		start[si] += start[si-1]
	}
	next = start
	buf := slices.Grow((*bp)[:0], len(hashes))[:len(hashes)]
	for _, h := range hashes {
		si := h & x.mask
		buf[next[si]] = h
		next[si]++
	}
	for si := range x.shards {
		if start[si+1] > start[si] {
			x.shards[si].record(id, buf[start[si]:start[si+1]])
		}
	}
	*bp = buf
	x.groups.Put(bp)
}

// lockPod returns pod's id, registering it if new, with x.reg read-locked.
func (x *Index) lockPod(pod string) int32 {
	x.reg.RLock()
	if id, ok := x.podIDs[pod]; ok {
		return id
	}
	x.reg.RUnlock()
	x.reg.Lock()
	if _, ok := x.podIDs[pod]; !ok {
		var id int32
		if n := len(x.freeID); n > 0 {
			id = x.freeID[n-1]
			x.freeID = x.freeID[:n-1]
		} else {
			id = x.ids
			x.ids++
		}
		x.podIDs[pod] = id
	}
	x.reg.Unlock()
	// RemovePod may run in between; then register again.
	return x.lockPod(pod)
}

func (s *shard) record(id int32, hashes []uint64) {
	s.mu.RLock()
	k := 0
	if int(id) < len(s.pods) {
		for ; k < len(hashes); k++ {
			i := s.find(id, hashes[k])
			if i == nilNode {
				break
			}
			if atomic.LoadUint32(&s.nodes[i].ref) == 0 {
				atomic.StoreUint32(&s.nodes[i].ref, 1)
			}
		}
	}
	s.mu.RUnlock()
	if k == len(hashes) {
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	for int(id) >= len(s.pods) {
		s.pods = append(s.pods, podList{head: nilNode, tail: nilNode})
	}
	after := int32(nilNode)
	if k > 0 {
		if after = s.find(id, hashes[k-1]); after == nilNode {
			k = 0 // evicted between the locks
		}
	}
	s.prefetch(id, hashes[k:])
	for _, h := range hashes[k:] {
		if after = s.place(id, h, after); after == nilNode {
			return
		}
	}
}

// prefetch loads the memory that placing hashes will touch before place
// does: the table slots where the new hashes go and, when the pod is full,
// the oldest nodes of its list and their hashes' slots, which making room
// evicts. Unlike place's dependent steps these loads are independent (but
// the walk along the list), so the CPU overlaps their cache misses: for a
// request of new blocks into a large index, the misses are most of the
// cost of recording it.
func (s *shard) prefetch(id int32, hashes []uint64) {
	if s.heads.n == 0 {
		return
	}
	var x uint64
	for _, h := range hashes {
		x += s.heads.slots[s.heads.home(h)].key
	}
	p := &s.pods[id]
	evict := min(len(hashes), p.n+len(hashes)-s.maxPerPod)
	for i := p.tail; evict > 0 && i != nilNode; evict-- {
		n := &s.nodes[i]
		x += s.heads.slots[s.heads.home(n.hash)].key
		i = n.prev
	}
	s.touched += x
}

// find returns pod id's node for hash h, or nilNode.
func (s *shard) find(id int32, h uint64) int32 {
	if hd, ok := s.heads.get(h); ok {
		for i := hd.first; i != nilNode; i = s.nodes[i].chain {
			if s.nodes[i].pod == id {
				return i
			}
		}
	}
	return nilNode
}

// place adds pod id's node for hash h right behind node after (at the front
// when after is nilNode) and returns it. New blocks go behind the prefix
// they extend, so they are evicted before it. A node the pod already holds
// is only marked referenced. It returns nilNode when making room evicted
// after itself: the pod's list holds nothing older, and the rest of the
// request would be evicted first anyway.
func (s *shard) place(id int32, h uint64, after int32) int32 {
	s.heads.reserve()
	slot, ok := s.heads.find(h)
	hd := head{first: nilNode}
	if ok {
		hd = s.heads.slots[slot].head
		for i := hd.first; i != nilNode; i = s.nodes[i].chain {
			if s.nodes[i].pod == id {
				s.nodes[i].ref = 1
				return i
			}
		}
	}
	p := &s.pods[id]
	evicted := int32(nilNode)
	if p.n >= s.maxPerPod {
		evicted = s.evict(id)
	} else if s.used >= s.maxBlocks {
		evicted = s.evict(s.globalVictim(id))
	}
	if evicted != nilNode {
		if evicted == after {
			return nilNode
		}
		// Eviction may have changed this hash's chain, and its deletion
		// may have moved the slot: find it again.
		if slot, ok = s.heads.find(h); ok {
			hd = s.heads.slots[slot].head
		} else {
			hd = head{first: nilNode}
		}
	}
	i := s.alloc()
	fp := podMix(id)
	if hd.first != nilNode {
		fp += s.nodes[hd.first].fp
	}
	s.nodes[i] = node{hash: h, pod: id, chain: hd.first, fp: fp}
	s.heads.setAt(slot, h, head{first: i, n: hd.n + 1})
	s.insertAfter(id, after, i)
	return i
}

// globalVictim picks the pod that gives up a block when the shard is full:
// the recording pod if it holds at least its fair share, else the largest.
func (s *shard) globalVictim(id int32) int32 {
	fair := s.used / max(s.live, 1)
	if s.pods[id].n >= fair && s.pods[id].n > 0 {
		return id
	}
	if v := s.victim; v != nilNode && int(v) < len(s.pods) && s.pods[v].n > fair {
		return v
	}
	best := id
	for i := range s.pods {
		if s.pods[i].n > s.pods[best].n {
			best = int32(i)
		}
	}
	s.victim = best
	return best
}

func (s *shard) alloc() int32 {
	s.used++
	if s.free != nilNode {
		i := s.free
		s.free = s.nodes[i].next
		return i
	}
	s.nodes = append(s.nodes, node{})
	return int32(len(s.nodes) - 1)
}

// insertAfter links node i into pod id's list right behind node after, or
// at the front when after is nilNode.
func (s *shard) insertAfter(id, after, i int32) {
	p := &s.pods[id]
	n := &s.nodes[i]
	if after == nilNode {
		n.prev, n.next = nilNode, p.head
		p.head = i
	} else {
		n.prev, n.next = after, s.nodes[after].next
		s.nodes[after].next = i
	}
	if n.next != nilNode {
		s.nodes[n.next].prev = i
	} else {
		p.tail = i
	}
	if p.n == 0 {
		s.live++
	}
	p.n++
}

func (s *shard) unlink(i int32) {
	n := &s.nodes[i]
	p := &s.pods[n.pod]
	if n.prev != nilNode {
		s.nodes[n.prev].next = n.next
	} else {
		p.head = n.next
	}
	if n.next != nilNode {
		s.nodes[n.next].prev = n.prev
	} else {
		p.tail = n.prev
	}
	p.n--
	if p.n == 0 {
		s.live--
	}
}

// evict drops the oldest unreferenced block of pod id and returns its node
// index (now free), or nilNode when the pod holds nothing. Referenced blocks
// met on the way move to the front with the mark cleared, in order: each
// move spends one mark, so the cost is amortised O(1).
func (s *shard) evict(id int32) int32 {
	p := &s.pods[id]
	for range p.n {
		t := p.tail
		if s.nodes[t].ref == 0 {
			break
		}
		s.nodes[t].ref = 0
		s.unlink(t)
		s.insertAfter(id, nilNode, t)
	}
	t := p.tail
	if t != nilNode {
		s.remove(t)
	}
	return t
}

// remove unlinks node i from its pod list and its hash chain and frees it.
func (s *shard) remove(i int32) {
	s.unlink(i)
	h := s.nodes[i].hash
	slot, _ := s.heads.find(h)
	hd := &s.heads.slots[slot].head
	switch {
	case hd.n <= 1:
		s.heads.deleteAt(slot)
	case hd.first == i:
		*hd = head{first: s.nodes[i].chain, n: hd.n - 1}
	default:
		// The nodes before i lose i's pod from their fingerprints.
		mix := podMix(s.nodes[i].pod)
		for j := hd.first; j != nilNode; j = s.nodes[j].chain {
			s.nodes[j].fp -= mix
			if s.nodes[j].chain == i {
				s.nodes[j].chain = s.nodes[i].chain
				break
			}
		}
		hd.n--
	}
	s.nodes[i] = node{next: s.free}
	s.free = i
	s.used--
}

// RemovePod forgets everything recorded for pod (it left the pool or
// restarted with an empty cache).
func (x *Index) RemovePod(pod string) {
	x.reg.Lock()
	defer x.reg.Unlock()
	id, ok := x.podIDs[pod]
	if !ok {
		return
	}
	for si := range x.shards {
		s := &x.shards[si]
		s.mu.Lock()
		if int(id) < len(s.pods) {
			for s.pods[id].tail != nilNode {
				s.remove(s.pods[id].tail)
			}
			if s.victim == id {
				s.victim = nilNode
			}
		}
		s.mu.Unlock()
	}
	delete(x.podIDs, pod)
	x.freeID = append(x.freeID, id)
}

type matchScratch struct {
	pos  []int32  // pod id → 1 + index in pods while active, else 0
	mark []uint32 // pod id → generation when last seen in a chain
	act  []int32  // active pod ids
	all  []int32  // every candidate id, to reset pos
	gen  uint32
	fp   uint32   // sum of podMix over act
	kept []uint64 // the request's kept hashes (IndexOptions.Stride)
}

// Match writes to dst[:len(pods)] the number of leading blocks of hashes
// each pod is believed to hold, and returns it. With a stride s the count
// is a multiple of s (or all of hashes): the pod may hold up to s−1 blocks
// more. It allocates only if dst is too small.
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
	if len(hashes) == 0 || len(pods) == 0 {
		return dst
	}
	x.reg.RLock()
	defer x.reg.RUnlock()
	// Hold every shard's read lock: a few atomic operations, cheaper than
	// locking per probe, and writers only ever hold one shard.
	for i := range x.shards {
		x.shards[i].mu.RLock()
	}
	defer func() {
		for i := range x.shards {
			x.shards[i].mu.RUnlock()
		}
	}()

	s, _ := x.scratch.Get().(*matchScratch)
	if s == nil {
		s = &matchScratch{}
	}
	blocks, st := len(hashes), x.opts.Stride
	if st > 1 {
		s.kept = x.sample(s.kept[:0], hashes)
		hashes = s.kept
		// The counts below are of kept hashes; kept hash j stands for
		// blocks up to min((j+1)·st, blocks).
		defer func() {
			for i, m := range dst {
				dst[i] = min(m*st, blocks)
			}
		}()
	}
	n := len(hashes)
	if len(s.pos) < int(x.ids) {
		s.pos = make([]int32, x.ids)
		s.mark = make([]uint32, x.ids)
	}
	s.act, s.all, s.fp = s.act[:0], s.all[:0], 0
	// at is block i's hash as the index holds it: keyed when a key is set,
	// probe by probe (the gallop below looks at O(log n) blocks).
	key := x.key.Load()
	var kb *[32]byte
	if key != nil {
		kb = key.buf()
		defer key.bufs.Put(kb)
	}
	at := func(i int) uint64 {
		if key == nil {
			return hashes[i]
		}
		return key.sum(hashes[i], kb)
	}
	for j, name := range pods {
		if id, ok := x.podIDs[name]; ok {
			if s.pos[id] == 0 {
				s.act = append(s.act, id)
				s.all = append(s.all, id)
				s.fp += podMix(id)
			}
			s.pos[id] = int32(j + 1)
		}
	}

	// keep shrinks the active set to the pods present at block i; the others
	// matched exactly i blocks.
	keep := func(i int) {
		s.gen++
		h := at(i)
		sh := x.shardOf(h)
		if hd, ok := sh.heads.get(h); ok {
			for c := hd.first; c != nilNode; c = sh.nodes[c].chain {
				s.mark[sh.nodes[c].pod] = s.gen
			}
		}
		a := s.act[:0]
		s.fp = 0
		for _, id := range s.act {
			if s.mark[id] == s.gen {
				a = append(a, id)
				s.fp += podMix(id)
			} else {
				dst[s.pos[id]-1] = i
				s.pos[id] = 0
			}
		}
		s.act = a
	}
	// all reports whether all k active pods hold block i.
	all := func(i, k int) bool {
		h := at(i)
		sh := x.shardOf(h)
		hd, ok := sh.heads.get(h)
		if !ok || int(hd.n) < k {
			return false // fewer holders than active pods: no walk needed
		}
		if int(hd.n) == k {
			// As many holders as active pods: they are the same pods if
			// the fingerprints agree. This is the common case (every pod
			// a candidate, the active pods holding the last block kept),
			// and a chain walk touches one scattered node per holder.
			return sh.nodes[hd.first].fp == s.fp
		}
		// Stop at the k-th active holder, or once more than n−k holders
		// are inactive (then some active pod is missing).
		c, miss := 0, int(hd.n)-k
		for j := hd.first; j != nilNode; j = sh.nodes[j].chain {
			if s.pos[sh.nodes[j].pod] != 0 {
				if c++; c == k {
					return true
				}
			} else if miss--; miss < 0 {
				return false
			}
		}
		return false
	}

	// When exactly the candidates hold the first block (a system prompt
	// every pod has seen), the fingerprint says so without a walk.
	h0 := at(0)
	sh0 := x.shardOf(h0)
	if hd, ok := sh0.heads.get(h0); !ok || int(hd.n) != len(s.act) || sh0.nodes[hd.first].fp != s.fp {
		keep(0)
	}
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
