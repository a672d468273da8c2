package engine

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Engine simulates one vLLM-V1-like model server. It is not safe for
// concurrent use: drive it from one goroutine (Loop) or through Realtime.
type Engine struct {
	cfg    Config
	maxLen int
	cost   costModel
	kv     kvPool
	prefix bool

	now     time.Duration // latest time seen
	seqs    map[uint64]*seq
	waiting seqList
	running []*seq // admission order: preemption takes the last

	busy    bool          // a step (or coalesced run of steps) is in flight
	stalled bool          // idle with waiting work that cannot be scheduled
	wakeAt  time.Duration // idle: when the waiting work arrived
	// The step in flight: it started at stepStart, ends at stepEnd and is
	// segK decode steps coalesced (1 = an ordinary step).
	stepStart, stepEnd time.Duration
	segK               int
	segD               int
	segCtx             float64
	segPairs           float64
	coalesced          int64 // coalesced runs started (tests, benchmarks)

	slots           []loraSlot
	registered      map[string]struct{}
	salts           map[string]uint64
	waitingAdapters map[string]int
	tick            int64 // step counter for slot LRU

	// The head of the queue failed to get KV blocks with this many free
	// blocks, this token budget and this cache version; with no more free
	// blocks, no smaller budget (a smaller chunk needs fewer blocks) and no
	// new cached blocks, retrying is pointless.
	blockedSeq     *seq
	blockedFree    int
	blockedBudget  int
	blockedVersion int64

	st       Stats
	emits    []emit
	firing   bool
	deferred []*seq
	pool     []*seq
	scratch  []int32

	// maxCoalesce caps the simulated time of one coalesced run (0: no cap).
	maxCoalesce time.Duration
	// notify tells a Loop that NextEventTime may have changed.
	notify  func(*Engine)
	loopIt  *loopItem
	inDirty bool

	// kvEvents hears the prefix cache change (kvevents.go).
	kvEvents KVEvents
	kvEvict  func(hash uint64)
}

type loraSlot struct {
	name     string
	running  int
	lastUsed int64
}

type emit struct {
	s           *seq
	n           int
	first, done bool
}

type seqState uint8

const (
	stateNone seqState = iota
	stateWaiting
	stateRunning
)

type seq struct {
	r        *Request
	id       uint64
	adapter  string
	slot     int
	hashes   []uint64
	prompt   int
	stopAt   int
	reason   string
	computed int // tokens whose KV is in blocks
	gen      int // generated tokens
	nblocks  int // KV blocks held
	// ents are the cache entries of the leading prompt blocks (-1: a block
	// that stayed anonymous because another block caches the same hash);
	// nHashed counts the non-negative ones. The other nblocks-nHashed
	// blocks are anonymous.
	ents      []int32
	nHashed   int
	cached    int
	cachedSet bool
	sched     int // tokens (or coalesced decode steps) in the step in flight
	firstAt   time.Duration
	firstSent bool
	preempts  int
	canceled  bool
	state     seqState
	prev      *seq
	next      *seq
}

type seqList struct {
	head, tail *seq
	n          int
}

func (l *seqList) pushBack(s *seq) {
	s.prev, s.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = s
	} else {
		l.head = s
	}
	l.tail = s
	l.n++
}

func (l *seqList) pushFront(s *seq) {
	s.prev, s.next = nil, l.head
	if l.head != nil {
		l.head.prev = s
	} else {
		l.tail = s
	}
	l.head = s
	l.n++
}

func (l *seqList) remove(s *seq) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		l.head = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	} else {
		l.tail = s.prev
	}
	s.prev, s.next = nil, nil
	l.n--
}

// New builds an engine from cfg after filling vLLM's defaults and checking
// that the model fits.
func New(cfg Config) (*Engine, error) {
	rc, numBlocks, maxLen, err := resolve(cfg)
	if err != nil {
		return nil, err
	}
	if rc, err = withNoiseDefaults(rc); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:             rc,
		maxLen:          maxLen,
		cost:            newCostModel(rc),
		kv:              newKVPool(numBlocks),
		prefix:          !rc.DisablePrefixCaching,
		seqs:            make(map[uint64]*seq),
		slots:           make([]loraSlot, rc.MaxLoras),
		registered:      make(map[string]struct{}),
		salts:           make(map[string]uint64),
		waitingAdapters: make(map[string]int),
		segK:            1,
	}
	e.cfg.Adapters = slices.Clone(rc.Adapters)
	for _, a := range rc.Adapters {
		if a == "" {
			return nil, fmt.Errorf("%w: empty adapter name", ErrInvalidConfig)
		}
		e.registered[a] = struct{}{}
	}
	return e, nil
}

// Config returns the configuration with every default filled in
// (NumBlocks and MaxModelLen are the derived values).
func (e *Engine) Config() Config { return e.cfg }

// MaxModelLen is the longest prompt+output the engine accepts.
func (e *Engine) MaxModelLen() int { return e.maxLen }

func blocksFor(tokens int) int { return (tokens + BlockSize - 1) / BlockSize }

func (e *Engine) observe(now time.Duration) {
	if now > e.now {
		e.now = now
	}
}

func (e *Engine) changed() {
	if e.notify != nil {
		e.notify(e)
	}
}

// Submit enqueues r at time now. It fails with ErrInvalidRequest,
// ErrUnknownAdapter, ErrContextLength or ErrKVCapacity (wrapped).
func (e *Engine) Submit(now time.Duration, r *Request) error {
	if r == nil || r.PromptTokens <= 0 || r.MaxTokens < 0 {
		return fmt.Errorf("%w: need a request with PromptTokens > 0 and MaxTokens ≥ 0", ErrInvalidRequest)
	}
	if _, dup := e.seqs[r.ID]; dup {
		return fmt.Errorf("%w: duplicate request id %d", ErrInvalidRequest, r.ID)
	}
	if r.Adapter != "" {
		if _, ok := e.registered[r.Adapter]; !ok {
			return fmt.Errorf("%w: %q", ErrUnknownAdapter, r.Adapter)
		}
	}
	maxTok := r.MaxTokens
	if maxTok == 0 {
		maxTok = e.maxLen - r.PromptTokens
	}
	if r.Pooling {
		maxTok = 0 // prefill only: the prompt alone must fit
	}
	// maxTok ≤ maxLen − prompt, not prompt + maxTok ≤ maxLen: the sum can
	// overflow and pass, and generation would then never stop.
	if (maxTok < 1 && !r.Pooling) || r.PromptTokens > e.maxLen || maxTok > e.maxLen-r.PromptTokens {
		total := r.PromptTokens + max(maxTok, 0)
		if maxTok > math.MaxInt-r.PromptTokens {
			total = math.MaxInt
		}
		return fmt.Errorf("%w: maximum context length is %d tokens, requested %d (%d prompt + %d completion)",
			ErrContextLength, e.maxLen, total, r.PromptTokens, max(maxTok, 0))
	}
	if blocksFor(r.PromptTokens+maxTok) > e.kv.n {
		return fmt.Errorf("%w: %d tokens need more than the %d blocks of %d tokens", ErrKVCapacity, r.PromptTokens+maxTok, e.kv.n, BlockSize)
	}
	e.observe(now)
	s := e.newSeq()
	s.r, s.id, s.adapter, s.prompt = r, r.ID, r.Adapter, r.PromptTokens
	s.stopAt, s.reason = maxTok, "length"
	if r.Pooling {
		s.stopAt, s.reason = 0, "stop"
	} else if r.OutputTokens > 0 && r.OutputTokens < maxTok {
		s.stopAt, s.reason = r.OutputTokens, "stop"
	}
	if e.prefix {
		n := min(len(r.BlockHashes), r.PromptTokens/BlockSize)
		salt := e.salt(r.Adapter)
		for _, h := range r.BlockHashes[:n] {
			s.hashes = append(s.hashes, saltKey(h, salt))
		}
	}
	e.seqs[r.ID] = s
	e.enqueue(s, false)
	if e.busy {
		e.truncate(now)
	} else if e.waiting.n == 1 || e.stalled {
		e.wakeAt = now
	}
	e.stalled = false
	e.changed()
	return nil
}

func (e *Engine) salt(adapter string) uint64 {
	if adapter == "" {
		return 0
	}
	s, ok := e.salts[adapter]
	if !ok {
		s = adapterSalt(adapter)
		e.salts[adapter] = s
	}
	return s
}

func adapterSalt(adapter string) uint64 { return xxhash.Sum64String(adapter) | 1 }

// saltKey is the cache key of block hash h under an adapter's salt (0:
// the base model, h itself): the same text under another adapter has
// different KV.
func saltKey(h, salt uint64) uint64 {
	if salt == 0 {
		return h
	}
	return (h ^ salt) * 0x9E3779B97F4A7C15
}

// BlockKeys appends to dst the keys under which an engine caches the
// first promptTokens/BlockSize of a request's BlockHashes for adapter:
// the hashes its KVEvents report. A router with the exact tokens computes
// the same keys (vLLM's block hashes), which is what a precise prefix
// index matches on.
func BlockKeys(dst []uint64, adapter string, hashes []uint64, promptTokens int) []uint64 {
	var salt uint64
	if adapter != "" {
		salt = adapterSalt(adapter)
	}
	for _, h := range hashes[:min(len(hashes), max(promptTokens, 0)/BlockSize)] {
		dst = append(dst, saltKey(h, salt))
	}
	return dst
}

func (e *Engine) newSeq() *seq {
	if n := len(e.pool); n > 0 {
		s := e.pool[n-1]
		e.pool = e.pool[:n-1]
		hashes, ents := s.hashes[:0], s.ents[:0]
		*s = seq{hashes: hashes, ents: ents}
		s.slot = -1
		return s
	}
	return &seq{slot: -1}
}

// recycle returns s to the pool, later if callbacks may still refer to it.
func (e *Engine) recycle(s *seq) {
	s.r = nil
	if e.firing {
		e.deferred = append(e.deferred, s)
		return
	}
	e.pool = append(e.pool, s)
}

func (e *Engine) enqueue(s *seq, front bool) {
	if front {
		e.waiting.pushFront(s)
	} else {
		e.waiting.pushBack(s)
	}
	s.state = stateWaiting
	if s.adapter != "" {
		e.waitingAdapters[s.adapter]++
	}
}

func (e *Engine) dequeue(s *seq) {
	e.waiting.remove(s)
	s.state = stateNone
	if s.adapter != "" {
		if e.waitingAdapters[s.adapter]--; e.waitingAdapters[s.adapter] == 0 {
			delete(e.waitingAdapters, s.adapter)
		}
	}
	if e.blockedSeq == s {
		e.blockedSeq = nil
	}
}

// unrun frees the blocks of s, which the caller takes off the running
// list. Cached blocks are released last block first so the tail of a prompt
// is evicted before its shared head.
func (e *Engine) unrun(s *seq) {
	s.state = stateNone
	for i := len(s.ents) - 1; i >= 0; i-- {
		if b := s.ents[i]; b >= 0 {
			e.kv.release(b)
		}
	}
	e.kv.releaseAnon(s.nblocks - s.nHashed)
	s.ents = s.ents[:0]
	s.nblocks, s.nHashed = 0, 0
	s.sched = 0
	if s.slot >= 0 {
		e.slots[s.slot].running--
		s.slot = -1
	}
}

// Cancel aborts request id (the client went away), freeing its slot and KV
// blocks. No callback runs. Unknown or finished ids are ignored.
func (e *Engine) Cancel(now time.Duration, id uint64) {
	s, ok := e.seqs[id]
	if !ok {
		return
	}
	e.observe(now)
	if before := e.truncate(now); before > 0 && s.state == stateRunning && s.sched > 0 {
		// Tokens of coalesced steps that ended before the cancellation were
		// generated (step-by-step they would have been counted already).
		e.st.GenerationTokens += int64(before)
	}
	delete(e.seqs, id)
	switch s.state {
	case stateWaiting:
		e.dequeue(s)
	case stateRunning:
		i := slices.Index(e.running, s)
		e.running = slices.Delete(e.running, i, i+1)
		e.unrun(s)
	}
	s.canceled = true
	e.recycle(s)
	e.stalled = false
	e.changed()
}

// NextEventTime is when the step in flight completes, or when waiting work
// should be scheduled; ok is false when the engine has nothing to do.
func (e *Engine) NextEventTime() (time.Duration, bool) {
	if e.busy {
		return e.stepEnd, true
	}
	if e.waiting.n > 0 && !e.stalled {
		return e.wakeAt, true
	}
	return 0, false
}

// Advance completes every step ending at or before now, running the
// requests' callbacks, and schedules the following steps.
func (e *Engine) Advance(now time.Duration) {
	e.observe(now)
	for {
		if e.busy {
			if e.stepEnd > now {
				return
			}
			t := e.stepEnd
			e.complete(t)
			e.fire(t)
			e.schedule(t)
			continue
		}
		if e.waiting.n == 0 || e.stalled || e.wakeAt > now {
			return
		}
		e.schedule(e.wakeAt)
		if !e.busy {
			return
		}
	}
}

// schedule plans the step starting at t, as vLLM V1's scheduler: running
// requests first (one decode token each, or the next prefill chunk),
// preempting the newest when blocks run out; then waiting requests FCFS
// while seats, token budget and blocks allow.
func (e *Engine) schedule(t time.Duration) {
	e.stepStart = t
	e.segK = 1
	e.tick++
	budget := e.cfg.MaxBatchedTokens
	var tokens, nseqs int
	var ctx, pairs float64
	var noise float64 // PrefillNoise's extra tokens (noise.go)
	preempted, admitted, allDecode := false, false, true

	for i := 0; i < len(e.running); i++ {
		s := e.running[i]
		n := min(s.prompt+s.gen-s.computed, budget)
		if n <= 0 {
			s.sched = 0
			continue
		}
		need := blocksFor(s.computed+n) - s.nblocks
		ok := true
		for need > e.kv.free() {
			v := e.running[len(e.running)-1]
			e.running[len(e.running)-1] = nil
			e.running = e.running[:len(e.running)-1]
			e.preempt(v)
			preempted = true
			if v == s {
				ok = false
				break
			}
		}
		if !ok {
			break
		}
		e.grow(s, need)
		s.sched = n
		budget -= n
		noise += e.noisyPrefill(s, n)
		tokens += n
		nseqs++
		ctx += float64(s.computed + n)
		pairs += float64(n)*float64(s.computed) + float64(n)*float64(n+1)/2
		if n != 1 || s.gen == 0 || s.computed+1 != s.prompt+s.gen {
			allDecode = false
		}
	}

	loads := 0
	if !preempted {
		for w := e.waiting.head; w != nil && len(e.running) < e.cfg.MaxNumSeqs && budget > 0; {
			next := w.next
			slot, load := -1, false
			if w.adapter != "" {
				if slot = e.findSlot(w.adapter); slot < 0 {
					if slot = e.freeSlot(); slot < 0 {
						// No LoRA slot: vLLM skips it and lets others through.
						w = next
						continue
					}
					load = true
				}
			}
			if w == e.blockedSeq && e.kv.free() <= e.blockedFree && budget >= e.blockedBudget && e.kv.version == e.blockedVersion {
				break
			}
			numTokens := w.prompt + w.gen
			hits, evictable := e.matchPrefix(w, numTokens)
			cachedTok := hits * BlockSize
			n := min(numTokens-cachedTok, budget)
			need := blocksFor(cachedTok+n) - hits
			if need+evictable > e.kv.free() {
				e.blockedSeq, e.blockedFree, e.blockedBudget, e.blockedVersion = w, e.kv.free(), budget, e.kv.version
				break
			}
			e.dequeue(w)
			for _, b := range e.scratch {
				e.kv.acquire(b)
				w.ents = append(w.ents, b)
			}
			w.nblocks, w.nHashed = hits, hits
			e.grow(w, need)
			w.computed = cachedTok
			if !w.cachedSet {
				w.cached, w.cachedSet = cachedTok, true
			}
			if e.prefix {
				e.st.PrefixCacheQueries += int64(numTokens)
				e.st.PrefixCacheHits += int64(cachedTok)
			}
			if slot >= 0 {
				if load {
					e.slots[slot].name = w.adapter
					loads++
				}
				e.slots[slot].running++
				e.slots[slot].lastUsed = e.tick
				w.slot = slot
			}
			e.running = append(e.running, w)
			w.state = stateRunning
			w.sched = n
			budget -= n
			noise += e.noisyPrefill(w, n)
			tokens += n
			nseqs++
			ctx += float64(cachedTok + n)
			pairs += float64(n)*float64(cachedTok) + float64(n)*float64(n+1)/2
			admitted = true
			w = next
		}
	}

	if nseqs == 0 {
		e.busy = false
		e.stalled = e.waiting.n > 0
		return
	}
	d := e.stepTime(0, e.cost.step(noisyTokens(tokens, noise), nseqs, ctx, pairs))
	if loads > 0 {
		// vLLM activates adapters in the model runner before the forward
		// pass, so the whole batch waits for the load.
		d += time.Duration(loads) * e.cfg.LoRALoadTime
		e.st.LoraLoads += int64(loads)
	}
	e.busy = true
	e.stepEnd = t + d
	if allDecode && !admitted && !preempted && nseqs == len(e.running) {
		e.coalesce(d, nseqs, ctx, pairs)
	}
}

// stepTime scales the cost model's duration of the i-th step of the step
// (or coalesced run) now scheduled by the pod's speed factor and jitter,
// and adds its stall (StallProb).
// Steps are numbered by st.Steps, which counts completed steps, so a
// truncated run recomputes exactly the durations it planned.
func (e *Engine) stepTime(i int, d time.Duration) time.Duration {
	f := stepFactor(e.cfg.SpeedFactor, e.cfg.StepJitter, e.cfg.JitterSeed, e.st.Steps+int64(i))
	stalled := stall(e.cfg.StallProb, e.cfg.StallMean, e.cfg.JitterSeed, e.st.Steps+int64(i))
	if f == 1 {
		return d + stalled
	}
	return max(time.Duration(float64(d)*f), time.Microsecond) + stalled
}

// maxCoalesceSteps caps the steps in one coalesced run.
const maxCoalesceSteps = 256

// coalesce extends a decode-only step into a run of identical-composition
// steps up to the next completion: with no admission possible until a
// request finishes (or Submit/Cancel, which truncate the run), the batch
// cannot change, so the steps need no scheduling in between.
func (e *Engine) coalesce(first time.Duration, d int, ctx, pairs float64) {
	// Planning and truncating a run cost O(k), so a cap keeps an arrival
	// that truncates a long run cheap.
	k := maxCoalesceSteps
	for _, s := range e.running {
		k = min(k, s.stopAt-s.gen)
	}
	if k <= 1 {
		return
	}
	// Blocks for k steps; shrink k if they would run out (preemption must
	// happen in an ordinary step).
	if e.extraBlocks(k) > e.kv.free() {
		lo, hi := 1, k // lo fits, hi does not
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			if e.extraBlocks(mid) <= e.kv.free() {
				lo = mid
			} else {
				hi = mid
			}
		}
		k = lo
	}
	if k <= 1 {
		return
	}
	cum := first
	i := 1
	for ; i < k; i++ {
		if e.maxCoalesce > 0 && cum >= e.maxCoalesce {
			break
		}
		cum += e.stepTime(i, e.cost.step(d, d, ctx+float64(i*d), pairs+float64(i*d)))
	}
	k = i
	if k <= 1 {
		return
	}
	for _, s := range e.running {
		e.grow(s, blocksFor(s.computed+k)-s.nblocks)
		s.sched = k
	}
	e.segK, e.segD, e.segCtx, e.segPairs = k, d, ctx, pairs
	e.coalesced++
	e.stepEnd = e.stepStart + cum
}

// extraBlocks is how many more blocks the running batch needs for k decode
// steps.
func (e *Engine) extraBlocks(k int) int {
	n := 0
	for _, s := range e.running {
		n += max(0, blocksFor(s.computed+k)-s.nblocks)
	}
	return n
}

// truncate shortens a coalesced run so it ends at the first step boundary
// at or after now, where a new arrival or a cancellation takes effect, as
// it would have with step-by-step scheduling.
func (e *Engine) truncate(now time.Duration) (before int) {
	if !e.busy || e.segK <= 1 {
		return 0
	}
	d := e.segD
	end := e.stepStart
	j := 0
	for j < e.segK {
		end += e.stepTime(j, e.cost.step(d, d, e.segCtx+float64(j*d), e.segPairs+float64(j*d)))
		j++
		if end < now {
			before = j
		}
		if end >= now {
			break
		}
	}
	if j >= e.segK {
		return before
	}
	e.segK = j
	e.stepEnd = end
	for _, s := range e.running {
		s.sched = j
		// Return blocks reserved for the dropped steps (anonymous decode
		// blocks) so admission sees what step-by-step would.
		keep := blocksFor(s.computed + j)
		e.kv.releaseAnon(s.nblocks - keep)
		s.nblocks = keep
	}
	return before
}

func (e *Engine) grow(s *seq, n int) {
	if n > 0 {
		e.kv.allocAnon(n, e.evictHook())
		s.nblocks += n
	}
}

// matchPrefix collects into e.scratch the longest cached prefix of w's
// blocks, leaving at least one token to compute (vLLM recomputes the last
// prompt token to get logits). evictable counts hits nobody references.
func (e *Engine) matchPrefix(w *seq, numTokens int) (hits, evictable int) {
	e.scratch = e.scratch[:0]
	if !e.prefix {
		return 0, 0
	}
	limit := min(len(w.hashes), (numTokens-1)/BlockSize)
	for _, h := range w.hashes[:limit] {
		b, ok := e.kv.lookup(h)
		if !ok {
			break
		}
		e.scratch = append(e.scratch, b)
		if e.kv.entries[b].ref == 0 {
			evictable++
		}
	}
	return len(e.scratch), evictable
}

func (e *Engine) findSlot(name string) int {
	for i := range e.slots {
		if e.slots[i].name == name {
			return i
		}
	}
	return -1
}

// freeSlot picks an empty slot, else the least recently used one whose
// adapter no running request uses.
func (e *Engine) freeSlot() int {
	best := -1
	for i := range e.slots {
		sl := &e.slots[i]
		if sl.name == "" {
			return i
		}
		if sl.running == 0 && (best < 0 || sl.lastUsed < e.slots[best].lastUsed) {
			best = i
		}
	}
	return best
}

// preempt recomputes v later: its blocks are freed (prompt blocks stay in
// the prefix cache) and it returns to the front of the queue.
func (e *Engine) preempt(v *seq) {
	e.unrun(v)
	v.computed = 0
	v.preempts++
	e.st.Preemptions++
	e.enqueue(v, true)
}

// complete applies the finished step at t and queues the callbacks.
func (e *Engine) complete(t time.Duration) {
	e.busy = false
	k := e.segK
	e.st.Steps += int64(k)
	w := 0
	for _, s := range e.running {
		n := s.sched
		if n == 0 {
			e.running[w] = s
			w++
			continue
		}
		s.sched = 0
		produced := 0
		s.computed += n
		if k > 1 {
			produced = n
		} else if s.computed == s.prompt+s.gen && !s.r.Pooling {
			produced = 1
		}
		if len(s.ents) < len(s.hashes) {
			full := min(s.computed/BlockSize, len(s.hashes))
			for len(s.ents) < full {
				b := e.kv.commit(s.hashes[len(s.ents)])
				if b >= 0 {
					s.nHashed++
					if l := e.kvListener(); l != nil {
						e.reportStored(l, s, len(s.ents))
					}
				}
				s.ents = append(s.ents, b)
			}
		}
		// A pooling request is done once its prompt is computed.
		if produced == 0 && (!s.r.Pooling || s.computed < s.prompt) {
			e.running[w] = s
			w++
			continue
		}
		first := !s.firstSent
		if first {
			s.firstSent, s.firstAt = true, t
			e.st.PromptTokens += int64(s.prompt)
		}
		s.gen += produced
		e.st.GenerationTokens += int64(produced)
		done := s.gen >= s.stopAt
		if done {
			e.unrun(s)
			delete(e.seqs, s.id)
			e.st.FinishedRequests++
		} else {
			e.running[w] = s
			w++
		}
		if first || done || s.r.OnTokens != nil {
			e.emits = append(e.emits, emit{s: s, n: produced, first: first, done: done})
		}
	}
	clear(e.running[w:])
	e.running = e.running[:w]
	e.segK = 1
}

// fire runs the queued callbacks; finished requests go back to the pool
// afterwards so a callback's Submit cannot reuse one still being reported.
func (e *Engine) fire(t time.Duration) {
	e.firing = true
	for i := range e.emits {
		em := e.emits[i]
		e.emits[i] = emit{}
		s := em.s
		if s.canceled {
			continue
		}
		r := s.r
		if em.first && r.OnFirstToken != nil {
			r.OnFirstToken(t)
		}
		if r.OnTokens != nil {
			r.OnTokens(t, em.n)
		}
		if em.done {
			if r.OnDone != nil {
				r.OnDone(t, Result{
					PromptTokens:     s.prompt,
					CachedTokens:     s.cached,
					CompletionTokens: s.gen,
					FinishReason:     s.reason,
					FirstTokenAt:     s.firstAt,
					Preemptions:      s.preempts,
				})
			}
			e.recycle(s)
		}
	}
	e.emits = e.emits[:0]
	e.firing = false
	e.pool = append(e.pool, e.deferred...)
	clear(e.deferred)
	e.deferred = e.deferred[:0]
}

// Stats snapshots the engine.
func (e *Engine) Stats() Stats {
	st := e.st
	st.Waiting, st.Running = e.waiting.n, len(e.running)
	st.NumBlocks = e.kv.n
	st.UsedBlocks = e.kv.used
	st.KVUsage = float64(e.kv.used) / float64(st.NumBlocks)
	st.BlockSize = BlockSize
	st.MaxLoras = e.cfg.MaxLoras
	for i := range e.slots {
		sl := &e.slots[i]
		if sl.name == "" {
			continue
		}
		st.LoadedAdapters = append(st.LoadedAdapters, sl.name)
		if sl.running > 0 {
			st.RunningAdapters = append(st.RunningAdapters, sl.name)
		}
	}
	slices.Sort(st.LoadedAdapters)
	slices.Sort(st.RunningAdapters)
	for a := range e.waitingAdapters {
		st.WaitingAdapters = append(st.WaitingAdapters, a)
	}
	slices.Sort(st.WaitingAdapters)
	return st
}

// LoadAdapter registers adapter name (vLLM's /v1/load_lora_adapter). It
// enters a GPU slot on first use, which costs LoRALoadTime.
func (e *Engine) LoadAdapter(now time.Duration, name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty adapter name", ErrInvalidRequest)
	}
	if _, ok := e.registered[name]; ok {
		return fmt.Errorf("%w: %q", ErrAdapterExists, name)
	}
	e.observe(now)
	e.registered[name] = struct{}{}
	return nil
}

// UnloadAdapter unregisters name: new requests for it fail; submitted ones
// still run. An idle GPU slot holding it is freed.
func (e *Engine) UnloadAdapter(name string) error {
	if _, ok := e.registered[name]; !ok {
		return fmt.Errorf("%w: %q", ErrUnknownAdapter, name)
	}
	delete(e.registered, name)
	if i := e.findSlot(name); i >= 0 && e.slots[i].running == 0 {
		e.slots[i] = loraSlot{}
	}
	return nil
}

// Adapters lists the registered adapters, sorted.
func (e *Engine) Adapters() []string {
	out := make([]string, 0, len(e.registered))
	for a := range e.registered {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}
