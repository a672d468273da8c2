package kvevents

import (
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/shared/config"
)

// PodState says how far a pod's entries in the index can be trusted.
type PodState uint8

// Pod states. The scorer uses the exact index only for fresh pods and
// falls back to the approximate prefix index (tier1/prefix) otherwise.
const (
	// StateAbsent: no events from the pod (never, or not since its
	// publisher went away); the index holds nothing for it.
	StateAbsent PodState = iota
	// StateStale: events stopped for longer than StaleAfter, or history
	// was lost (a sequence gap replay could not fill, joining a running
	// pod without replay, an undecodable batch) and the index is being
	// rebuilt from new events for RebuildWindow. What the index holds is
	// a subset of the pod's cache: it never credits blocks the pod lacks,
	// but may miss some it has.
	StateStale
	// StateFresh: the index follows the pod's cache event by event.
	StateFresh
)

// States lists every state, for metrics.
var States = []PodState{StateAbsent, StateStale, StateFresh}

func (s PodState) String() string {
	switch s {
	case StateStale:
		return "stale"
	case StateFresh:
		return "fresh"
	}
	return "absent"
}

// IndexOptions configures an Index. Zero fields take the defaults of the
// matching Config keys.
type IndexOptions struct {
	// MaxBlocksPerPod caps a pod's entries; blocks stored beyond it are
	// dropped (counted), so a pod reporting billions of blocks costs no
	// more than an honest full one.
	MaxBlocksPerPod int
	// StaleAfter: a pod with no event for this long is stale (0: never).
	StaleAfter time.Duration
	// RebuildWindow: how long a pod stays stale after its history was
	// lost, while new events refill the index.
	RebuildWindow time.Duration
	// Media are the block media indexed (nil: GPU). Events without a
	// medium count as GPU.
	Media []string
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
}

// Index is the exact per-pod index of cached KV blocks, fed by KV-cache
// events and keyed by our own token-id hash chains (HashTokens): a
// request's prompt tokens, hashed the same way, find the blocks each pod
// reported. It is safe for concurrent use.
//
// Layout: one table, sharded by hash, maps each of our block hashes to
// the pods holding it, so Match walks a prompt's chain once for all pods
// (a shared system prompt on 1,000 pods is 1,000 small integers per
// block, not 1,000 map probes). Each pod also maps the engine's block
// hashes to ours, since BlockRemoved names blocks by the engine's hash.
// Lock order: Index.mu, then a pod's mu, then a shard's mu.
type Index struct {
	opts  IndexOptions
	media map[string]bool

	mu      sync.RWMutex
	pods    map[string]*podIndex
	byID    []*podIndex // pod id → pod (nil: free id)
	freeIDs []uint32
	shards  [numShards]shard
	scratch sync.Pool // *matchScratch
}

const (
	shardBits = 6
	numShards = 1 << shardBits
	// listFlag marks a holders value that indexes a shard's lists; other
	// values are the one holder's pod id.
	listFlag = 1 << 63
)

// shard holds the holders of the hashes whose top bits pick it.
type shard struct {
	mu    sync.RWMutex
	m     map[uint64]uint64
	lists [][]uint32
	free  []uint32
	peak  int
}

// podIndex is one pod's side: engine hash → our hash (with the rare
// repeats counted aside: vLLM caches a hash in two physical blocks,
// hybrid models store one per KV group, and two engine hashes can map to
// one of ours), and the pod's state.
type podIndex struct {
	id uint32

	mu        sync.RWMutex
	blockSize atomic.Int64
	engine    map[uint64]uint64
	engineDup map[uint64]uint32
	oursDup   map[uint64]uint32
	blocks    int // stored block references: len(engine) + Σ engineDup
	peak      int // most entries since the map was made (maps never shrink)

	known        bool
	lastEvent    time.Time
	rebuildUntil time.Time
	buf          []byte
}

// NewIndex returns an empty index.
func NewIndex(opts IndexOptions) *Index {
	config.Default(&opts.MaxBlocksPerPod, DefaultMaxBlocksPerPod)
	config.Default(&opts.RebuildWindow, DefaultRebuildWindow)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	media := opts.Media
	if len(media) == 0 {
		media = []string{"GPU"}
	}
	x := &Index{opts: opts, media: map[string]bool{"": true}, pods: map[string]*podIndex{}}
	for _, m := range media {
		x.media[m] = true
	}
	for i := range x.shards {
		x.shards[i].m = map[uint64]uint64{}
	}
	return x
}

func (x *Index) pod(name string) *podIndex {
	x.mu.RLock()
	p := x.pods[name]
	x.mu.RUnlock()
	if p != nil {
		return p
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if p = x.pods[name]; p == nil {
		p = &podIndex{engine: map[uint64]uint64{}}
		if n := len(x.freeIDs); n > 0 {
			p.id = x.freeIDs[n-1]
			x.freeIDs = x.freeIDs[:n-1]
			x.byID[p.id] = p
		} else {
			p.id = uint32(len(x.byID))
			x.byID = append(x.byID, p)
		}
		x.pods[name] = p
	}
	return p
}

func (x *Index) shardOf(h uint64) *shard { return &x.shards[h>>(64-shardBits)] }

// addHolder records that pod id holds h; false if it already did.
func (x *Index) addHolder(h uint64, id uint32) bool {
	s := x.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[h]
	switch {
	case !ok:
		s.m[h] = uint64(id)
		s.peak = max(s.peak, len(s.m))
		return true
	case v&listFlag == 0:
		if uint32(v) == id {
			return false
		}
		var li uint32
		if n := len(s.free); n > 0 {
			li = s.free[n-1]
			s.free = s.free[:n-1]
			s.lists[li] = append(s.lists[li][:0], uint32(v), id)
		} else {
			li = uint32(len(s.lists))
			s.lists = append(s.lists, []uint32{uint32(v), id})
		}
		s.m[h] = listFlag | uint64(li)
		return true
	}
	li := uint32(v)
	if slices.Contains(s.lists[li], id) {
		return false
	}
	s.lists[li] = append(s.lists[li], id)
	return true
}

// removeHolder forgets that pod id holds h (a no-op if it did not).
func (x *Index) removeHolder(h uint64, id uint32) {
	s := x.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[h]
	switch {
	case !ok:
		return
	case v&listFlag == 0:
		if uint32(v) == id {
			delete(s.m, h)
		}
	default:
		li := uint32(v)
		l := s.lists[li]
		i := slices.Index(l, id)
		if i < 0 {
			return
		}
		l[i] = l[len(l)-1]
		l = l[:len(l)-1]
		if len(l) == 1 {
			s.m[h] = uint64(l[0])
			if cap(l) > 64 {
				l = nil // do not keep a big shared prefix's list for reuse
			}
			s.lists[li] = l[:0]
			s.free = append(s.free, li)
		} else {
			s.lists[li] = l
		}
	}
	// Maps never shrink: once mostly empty, copy what is left.
	if s.peak > 4096 && len(s.m)*4 < s.peak {
		m := make(map[uint64]uint64, len(s.m))
		for k, v := range s.m {
			m[k] = v
		}
		s.m, s.peak = m, len(m)
	}
}

// ApplyStats counts what applying one batch did.
type ApplyStats struct {
	Stored, Removed int // block references added and removed
	Cleared         int // AllBlocksCleared events
	Unknown         int // events of an unknown type (skipped)
	// Blocks not indexed, by reason.
	DroppedCap       int // the pod is at MaxBlocksPerPod
	DroppedOrphan    int // parent block unknown (an earlier event missed or dropped)
	DroppedMedium    int // a medium not indexed
	DroppedBlockSize int // block size differs from the pod's
	Inconsistent     int // BlockStored whose token count is not blocks × block size
}

// Apply applies a decoded batch from pod, creating the pod if needed.
func (x *Index) Apply(pod string, b *Batch) ApplyStats {
	p := x.pod(pod)
	now := x.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	var st ApplyStats
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case KindBlockStored:
			x.stored(p, ev, &st)
		case KindBlockRemoved:
			if !x.media[ev.Medium] {
				continue
			}
			for _, h := range ev.BlockHashes {
				if x.remove(p, h) {
					st.Removed++
				}
			}
		case KindAllBlocksCleared:
			x.reset(p)
			st.Cleared++
		default:
			st.Unknown++
		}
	}
	p.known = true
	p.lastEvent = now
	// Maps never shrink: after a pod's cache emptied, copy what is left
	// into a map sized for it.
	if p.peak > 4096 && len(p.engine)*4 < p.peak {
		p.compact()
	}
	return st
}

func (x *Index) stored(p *podIndex, ev *Event, st *ApplyStats) {
	n := len(ev.BlockHashes)
	if !x.media[ev.Medium] {
		st.DroppedMedium += n
		return
	}
	bs := ev.BlockSize
	if bs <= 0 || len(ev.TokenIDs) != n*bs {
		st.Inconsistent++
		return
	}
	if cur := p.blockSize.Load(); cur == 0 {
		p.blockSize.Store(int64(bs))
	} else if cur != int64(bs) {
		st.DroppedBlockSize += n
		return
	}
	var prev uint64
	switch {
	case ev.HasParent:
		var ok bool
		if prev, ok = p.engine[ev.ParentHash]; !ok {
			st.DroppedOrphan += n
			return
		}
	case ev.HasLoRAName:
		prev = ChainSeed(ev.LoRAName)
	case ev.HasLoRAID:
		prev = loraIDSeed(ev.LoRAID)
	default:
		prev = ChainSeed("")
	}
	for i, eh := range ev.BlockHashes {
		if p.blocks >= x.opts.MaxBlocksPerPod {
			st.DroppedCap += n - i
			return
		}
		prev, p.buf = chainStep(prev, ev.TokenIDs[i*bs:(i+1)*bs], ev.blockSalt(i), p.buf)
		x.add(p, eh, prev)
		st.Stored++
	}
}

func (x *Index) add(p *podIndex, eh, oh uint64) {
	p.blocks++
	if _, dup := p.engine[eh]; dup {
		// Another physical block (or KV group) with the same engine hash:
		// counted, so the block stays credited until its last removal.
		if p.engineDup == nil {
			p.engineDup = map[uint64]uint32{}
		}
		p.engineDup[eh]++
		return
	}
	p.engine[eh] = oh
	p.peak = max(p.peak, len(p.engine))
	if !x.addHolder(oh, p.id) {
		if p.oursDup == nil {
			p.oursDup = map[uint64]uint32{}
		}
		p.oursDup[oh]++
	}
}

// remove drops one reference to engine hash eh; false if it was not
// indexed (stored before we listened, or dropped).
func (x *Index) remove(p *podIndex, eh uint64) bool {
	oh, ok := p.engine[eh]
	if !ok {
		return false
	}
	p.blocks--
	if d := p.engineDup[eh]; d > 0 {
		if d == 1 {
			delete(p.engineDup, eh)
		} else {
			p.engineDup[eh] = d - 1
		}
		return true
	}
	delete(p.engine, eh)
	if d := p.oursDup[oh]; d > 0 {
		if d == 1 {
			delete(p.oursDup, oh)
		} else {
			p.oursDup[oh] = d - 1
		}
		return true
	}
	x.removeHolder(oh, p.id)
	return true
}

// reset empties the pod's entries, releasing its map.
func (x *Index) reset(p *podIndex) {
	for _, oh := range p.engine {
		x.removeHolder(oh, p.id)
	}
	p.engine = map[uint64]uint64{}
	p.engineDup, p.oursDup = nil, nil
	p.blocks, p.peak = 0, 0
	p.blockSize.Store(0)
}

func (p *podIndex) compact() {
	engine := make(map[uint64]uint64, len(p.engine))
	for k, v := range p.engine {
		engine[k] = v
	}
	p.engine, p.peak = engine, len(engine)
	if len(p.engineDup) == 0 {
		p.engineDup = nil
	}
	if len(p.oursDup) == 0 {
		p.oursDup = nil
	}
}

// Clear empties pod's entries. With rebuild, the pod is stale for
// RebuildWindow (history was lost: what it reports from now on is only
// part of its cache); without, its state is unchanged until the next
// event (a restarted engine's cache is empty, so a new complete stream is
// exact from its first event).
func (x *Index) Clear(pod string, rebuild bool) {
	p := x.pod(pod)
	now := x.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	x.reset(p)
	if rebuild {
		p.known = true
		p.lastEvent = now
		p.rebuildUntil = now.Add(x.opts.RebuildWindow)
	} else {
		p.rebuildUntil = time.Time{}
	}
}

// Forget empties pod's entries and marks it absent (its publisher went
// away); the pod stays registered.
func (x *Index) Forget(pod string) {
	p := x.pod(pod)
	p.mu.Lock()
	defer p.mu.Unlock()
	x.reset(p)
	p.known = false
	p.rebuildUntil = time.Time{}
}

// Remove deletes pod from the index (it left the pool).
func (x *Index) Remove(pod string) {
	x.mu.Lock()
	p := x.pods[pod]
	delete(x.pods, pod)
	x.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	x.reset(p)
	p.mu.Unlock()
	// Only now may the id be reused: the holders no longer name it.
	x.mu.Lock()
	x.byID[p.id] = nil
	x.freeIDs = append(x.freeIDs, p.id)
	x.mu.Unlock()
}

// matchScratch is Match's per-call state, indexed by pod id.
type matchScratch struct {
	depth   []int32 // leading blocks held so far
	cand    []bool  // the pod is one Match was asked about
	touched []uint32
}

// Match writes into dst (resized to len(pods)) how many leading hashes
// each pod holds: the pod's cached prefix in blocks. hashes are
// HashTokens(prompt, blockSize, adapter); a pod whose events use another
// block size, or that is unknown, matches 0. Match does not look at
// states: callers check State and fall back when a pod is not fresh.
func (x *Index) Match(hashes []uint64, blockSize int, pods []string, dst []int) []int {
	dst = slices.Grow(dst[:0], len(pods))[:len(pods)]
	clear(dst)
	x.mu.RLock()
	defer x.mu.RUnlock()
	sc, _ := x.scratch.Get().(*matchScratch)
	if sc == nil {
		sc = &matchScratch{}
	}
	defer x.scratch.Put(sc)
	if n := len(x.byID); len(sc.depth) < n {
		sc.depth = make([]int32, n)
		sc.cand = make([]bool, n)
	}
	sc.touched = sc.touched[:0]
	live := false
	for _, name := range pods {
		if p := x.pods[name]; p != nil && p.blockSize.Load() == int64(blockSize) && !sc.cand[p.id] {
			sc.cand[p.id] = true
			sc.touched = append(sc.touched, p.id)
			live = true
		}
	}
	for i, h := range hashes {
		if !live {
			break // no candidate held every block so far
		}
		live = false
		s := x.shardOf(h)
		s.mu.RLock()
		v, ok := s.m[h]
		if ok {
			if v&listFlag == 0 {
				live = sc.advance(uint32(v), int32(i))
			} else {
				for _, id := range s.lists[uint32(v)] {
					if sc.advance(id, int32(i)) {
						live = true
					}
				}
			}
		}
		s.mu.RUnlock()
	}
	for k, name := range pods {
		if p := x.pods[name]; p != nil && sc.cand[p.id] {
			dst[k] = int(sc.depth[p.id])
		}
	}
	for _, id := range sc.touched {
		sc.depth[id], sc.cand[id] = 0, false
	}
	return dst
}

// advance extends pod id's prefix if it held every block before i.
func (sc *matchScratch) advance(id uint32, i int32) bool {
	if int(id) >= len(sc.cand) || !sc.cand[id] || sc.depth[id] != i {
		return false
	}
	sc.depth[id] = i + 1
	return true
}

// BlockSize is the block size pod's events use (0: none seen yet).
func (x *Index) BlockSize(pod string) int {
	x.mu.RLock()
	p := x.pods[pod]
	x.mu.RUnlock()
	if p == nil {
		return 0
	}
	return int(p.blockSize.Load())
}

// State is pod's state now.
func (x *Index) State(pod string) PodState {
	x.mu.RLock()
	p := x.pods[pod]
	x.mu.RUnlock()
	if p == nil {
		return StateAbsent
	}
	return x.state(p, x.opts.Now())
}

func (x *Index) state(p *podIndex, now time.Time) PodState {
	p.mu.RLock()
	defer p.mu.RUnlock()
	switch {
	case !p.known:
		return StateAbsent
	case x.opts.StaleAfter > 0 && now.Sub(p.lastEvent) > x.opts.StaleAfter:
		return StateStale
	case now.Before(p.rebuildUntil):
		return StateStale
	}
	return StateFresh
}

// PodStats describes one pod's entries.
type PodStats struct {
	Pod       string
	State     PodState
	Blocks    int // block references indexed
	BlockSize int
	// Bytes estimates the memory of the pod's own maps (see mapBytes);
	// Index.Bytes adds the table shared by all pods.
	Bytes int64
}

// Stats returns every pod's stats, sorted by pod.
func (x *Index) Stats() []PodStats {
	now := x.opts.Now()
	x.mu.RLock()
	out := make([]PodStats, 0, len(x.pods))
	for name, p := range x.pods {
		st := PodStats{Pod: name, State: x.state(p, now)}
		p.mu.RLock()
		st.Blocks, st.BlockSize = p.blocks, int(p.blockSize.Load())
		st.Bytes = p.bytes()
		p.mu.RUnlock()
		out = append(out, st)
	}
	x.mu.RUnlock()
	slices.SortFunc(out, func(a, b PodStats) int {
		if a.Pod < b.Pod {
			return -1
		}
		if a.Pod > b.Pod {
			return 1
		}
		return 0
	})
	return out
}

// bytes estimates the pod's own memory from its map's high-water mark
// (the shared holders table is in Index.Bytes).
func (p *podIndex) bytes() int64 {
	const podOverhead = 256 // the struct, map headers, scratch
	b := int64(podOverhead + cap(p.buf))
	b += mapBytes(p.peak, 16) + mapBytes(len(p.engineDup), 16) + mapBytes(len(p.oursDup), 16)
	return b
}

// Bytes estimates the whole index's memory: every pod's maps and the
// shared holders table.
func (x *Index) Bytes() int64 {
	x.mu.RLock()
	pods := make([]*podIndex, 0, len(x.pods))
	for _, p := range x.pods {
		pods = append(pods, p)
	}
	x.mu.RUnlock()
	var b int64
	for _, p := range pods {
		p.mu.RLock()
		b += p.bytes()
		p.mu.RUnlock()
	}
	for i := range x.shards {
		s := &x.shards[i]
		s.mu.RLock()
		b += mapBytes(s.peak, 16)
		for _, l := range s.lists {
			b += 24 + 4*int64(cap(l))
		}
		s.mu.RUnlock()
	}
	return b
}

// mapBytes estimates a Go (swiss table) map's memory for n entries of
// slot bytes each: groups of 8 slots with a control word, tables of at
// most 1,024 slots filled to 7/8 before they grow or split, so between
// 7/16 and 7/8 full: the true figure is within about ±30% of this, by
// where n falls between splits. TestIndexMemory checks it against the
// heap.
func mapBytes(n int, slot int64) int64 {
	if n == 0 {
		return 48
	}
	perSlot := slot + 1
	if n <= 896 { // one table: its slot count is a power of two
		slots := max(8, 1<<bits.Len(uint((n*8+6)/7-1)))
		return 48 + int64(slots)*perSlot
	}
	// Many tables, split independently: on average about two-thirds full.
	return 48 + int64(float64(n)/0.66)*perSlot + int64(n/448)*8
}
