package picker

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/prefix"
)

// TrackerOptions configure a Tracker. The zero value uses the defaults.
type TrackerOptions struct {
	// Index bounds the prefix index.
	Index prefix.IndexOptions
	// Alpha is the weight of a new sample in the prefill-speed averages;
	// default 0.05 (about the last 40 first-token samples count).
	Alpha float64
	// MinSampleTokens: first tokens after fewer prefill tokens than this
	// (own uncached plus queued ahead) teach nothing; default 32.
	MinSampleTokens int
	// Sessions bound the session → pod memory of the session-balance
	// scorer (which sessions it has seen, and where they are live).
	Sessions SessionOptions
	// RecordAsync moves prefix-index writes off Dispatched: it queues the
	// request's block hashes and one background goroutine records them,
	// so requests no longer queue on the index's write locks (the largest
	// cost of a 32 KB request at a few thousand req/s); a Match waits at
	// most for the one shard the goroutine is writing. A later Match sees
	// the record once that goroutine got to it, normally within the
	// time the request takes to reach its pod. The zero value records
	// synchronously, which virtual-time callers (bench/) need to stay
	// deterministic.
	RecordAsync bool
	// RecordQueue bounds the requests waiting to be recorded when
	// RecordAsync is set; one arriving at a full queue is not recorded
	// (see RecordsDropped). Default 1024 (about 4 MiB of hashes).
	RecordQueue int
	// Exact is the exact per-pod index the engines' KV-cache events feed
	// (precise.go); nil: the prefix index is the only evidence. For a
	// request carrying ExactHashes, pods it reports fresh are judged by it.
	Exact ExactIndex
}

// Tracker is the router's own view of its pods: what it sent where (the
// prefix index), what is still in flight, and how fast each pod prefills.
// It complements scraped metrics, which lag by a scrape interval. Safe for
// concurrent use; the zero value is not usable, call NewTracker.
//
// Each request must be reported with the same *Request pointer:
// Dispatched when sent to a pod, FirstToken when the first token (or
// the full non-streamed response) arrives, Done when it ends in any way.
// A retry on another pod is Done on the first, then Dispatched again.
type Tracker struct {
	opts TrackerOptions
	idx  *prefix.Index
	rec  *recorder // nil unless RecordAsync

	prefixSources [numPrefixSources]atomic.Uint64 // dispatches by evidence (PrefixSourceCount)

	sessions sessionStore // session → pod of its last turn

	// mu guards pods and reqs. Apply, run for every scheduling cycle,
	// only reads: it shares the lock.
	mu   sync.RWMutex
	pods map[string]*podState
	reqs map[*Request]*flight

	// obs, when set, hears of every change to the local counts (see
	// SetObserver); peer replicas are told through it. seq numbers the
	// changes tracker-wide, so a pod's versions never go back, even when
	// it is removed and added again.
	obs atomic.Pointer[observerBox]
	seq uint64
}

type podState struct {
	inFlight, prefill      int
	promptTokens, uncached int
	speed                  speedEstimator

	// version is the tracker's seq at the last change to the local
	// counts, so an observer can order snapshots taken concurrently.
	version uint64
	// remote is what peer replicas dispatched to the pod (by replica ID);
	// rsum is its sum, which Apply adds to the local counts.
	remote map[string]ReplicaLoad
	rsum   ReplicaLoad
	// remoteOnly: only peers' state made this entry (SetRemote,
	// RemoteSample); DropRemote frees it once no peer counts on it.
	remoteOnly bool
}

type flight struct {
	pod              string
	prompt, uncached int
	ahead            int // uncached tokens queued ahead at dispatch
	first            bool
}

// NewTracker returns an empty tracker.
func NewTracker(opts TrackerOptions) *Tracker {
	if opts.Alpha <= 0 || opts.Alpha > 1 {
		opts.Alpha = 0.05
	}
	config.Default(&opts.MinSampleTokens, 32)
	t := &Tracker{
		opts: opts,
		idx:  prefix.NewIndex(opts.Index),
		pods: make(map[string]*podState),
		reqs: make(map[*Request]*flight),
	}
	t.sessions.opts = opts.Sessions
	if opts.RecordAsync {
		config.Default(&t.opts.RecordQueue, 1024)
		t.rec = &recorder{idx: t.idx, limit: t.opts.RecordQueue}
	}
	return t
}

// Index returns the prefix index the tracker records into.
func (t *Tracker) Index() *prefix.Index { return t.idx }

func (t *Tracker) pod(name string) *podState {
	st := t.pods[name]
	if st == nil {
		st = &podState{}
		t.pods[name] = st
	}
	st.remoteOnly = false
	return st
}

// Dispatched records that req was sent to pod: it counts it in flight,
// estimates how much of its prompt the pod has cached, and records its
// prefix blocks for pod in the index.
func (t *Tracker) Dispatched(pod string, req *Request) {
	uncached := max(req.PromptTokens, 0)
	if n := len(req.BlockHashes); n > 0 {
		var names [1]string
		var got [1]int
		names[0] = pod
		m := t.idx.Match(req.BlockHashes, names[:], got[:0])
		uncached -= int(float64(uncached) * t.dispatchFraction(pod, req, m[0]))
		t.record(pod, req.BlockHashes)
	}
	t.sessions.record(req.Session, pod)
	var marker [1]uint64
	if req.Session != "" {
		marker[0] = sessionMarker(req.Session)
		t.record(pod, marker[:])
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.reqs[req]; old != nil {
		t.doneLocked(req, old) // reported twice without Done: replace
	}
	st := t.pod(pod)
	t.reqs[req] = &flight{pod: pod, prompt: max(req.PromptTokens, 0), uncached: uncached, ahead: st.uncached + st.rsum.Uncached}
	st.inFlight++
	st.prefill++
	st.promptTokens += max(req.PromptTokens, 0)
	st.uncached += uncached
	if o := t.obs.Load(); o != nil {
		t.seq++
		st.version = t.seq
		// Under the lock, so the observer sees one pod's snapshots in
		// order; observers must not block (see Observer).
		o.Dispatched(pod, req.BlockHashes, st.local())
		if req.Session != "" {
			o.Dispatched(pod, marker[:], st.local())
		}
	}
}

// record puts hashes in the index for pod, through the asynchronous
// recorder when there is one (it copies them).
func (t *Tracker) record(pod string, hashes []uint64) {
	if t.rec != nil {
		t.rec.add(pod, hashes)
		return
	}
	t.idx.Record(pod, hashes)
}

// FirstToken records that req's first token arrived ttft after dispatch:
// its prompt leaves the pod's in-flight prefill, and the pod's prefill
// speed estimate learns from the sample.
func (t *Tracker) FirstToken(pod string, req *Request, ttft time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.reqs[req]
	if f == nil || f.first || f.pod != pod {
		return
	}
	st := t.pod(pod)
	t.firstLocked(st, f)
	t.notifyLocked(pod, st)
	if tokens := f.ahead + f.uncached; tokens >= t.opts.MinSampleTokens && ttft > 0 {
		st.speed.add(t.opts.Alpha, float64(tokens), ttft.Seconds())
		if o := t.obs.Load(); o != nil {
			o.Sampled(pod, tokens, ttft)
		}
	}
}

func (t *Tracker) firstLocked(st *podState, f *flight) {
	f.first = true
	st.prefill--
	st.promptTokens -= f.prompt
	st.uncached -= f.uncached
}

// Done records that req finished, failed or was cancelled on pod.
func (t *Tracker) Done(pod string, req *Request) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.reqs[req]; f != nil && f.pod == pod {
		t.doneLocked(req, f)
		if st := t.pods[pod]; st != nil {
			t.notifyLocked(pod, st)
		}
	}
}

func (t *Tracker) doneLocked(req *Request, f *flight) {
	delete(t.reqs, req)
	st := t.pods[f.pod]
	if st == nil {
		return // pod removed meanwhile
	}
	if !f.first {
		t.firstLocked(st, f)
	}
	st.inFlight--
}

// Apply fills the router-side fields of each pod snapshot. A pod's
// PrefillTokensPerSec is only overwritten once learned, so a caller may
// seed it with a prior (e.g. by GPU type).
func (t *Tracker) Apply(pods []*Pod) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, p := range pods {
		st := t.pods[p.Name]
		if st == nil {
			p.InFlight, p.InFlightPrefill, p.InFlightPromptTokens, p.InFlightUncachedTokens = 0, 0, 0, 0
			continue
		}
		p.InFlight = st.inFlight + st.rsum.InFlight
		p.InFlightPrefill = st.prefill + st.rsum.Prefill
		p.InFlightPromptTokens = st.promptTokens + st.rsum.PromptTokens
		p.InFlightUncachedTokens = st.uncached + st.rsum.Uncached
		if v := st.speed.value(); v > 0 {
			p.PrefillTokensPerSec = v
		}
	}
}

// PrefillTokensPerSec returns the learned prefill speed of pod (0 while
// unknown).
func (t *Tracker) PrefillTokensPerSec(pod string) float64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if st := t.pods[pod]; st != nil {
		return st.speed.value()
	}
	return 0
}

// InFlight returns pod's in-flight request count, peer replicas'
// included.
func (t *Tracker) InFlight(pod string) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if st := t.pods[pod]; st != nil {
		return st.inFlight + st.rsum.InFlight
	}
	return 0
}

// RemovePod forgets pod: its index entries and counters. Requests still in
// flight to it are ignored when they complete.
func (t *Tracker) RemovePod(pod string) {
	// Queued records of the pod must not land after its removal.
	t.Flush()
	t.idx.RemovePod(pod)
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.pods, pod)
}

// Flush records what Dispatched queued so far (RecordAsync) and returns
// once it is in the index; a no-op for a synchronous tracker.
func (t *Tracker) Flush() {
	if t.rec != nil {
		t.rec.flush()
	}
}

// RecordsDropped returns how many dispatches were not recorded in the
// prefix index because the RecordAsync queue was full.
func (t *Tracker) RecordsDropped() uint64 {
	if t.rec == nil {
		return 0
	}
	return t.rec.dropped.Load()
}

// recorder writes queued dispatches into the prefix index from one
// goroutine, started when work arrives and gone once the queue is empty,
// so a Tracker needs no Close. Batches are taken whole, so the
// request path only ever holds mu for an append.
type recorder struct {
	idx   *prefix.Index
	limit int

	mu      sync.Mutex
	queue   []pendingRecord
	spare   [][]uint64 // hash buffers of recorded batches, for reuse
	running bool       // a run goroutine is (or is about to be) draining

	// busy is held while a batch is recorded, so flush can wait for the
	// batch in progress.
	busy    sync.Mutex
	dropped atomic.Uint64
}

type pendingRecord struct {
	pod    string
	hashes []uint64 // a copy: the caller's slice is reused after dispatch
}

// maxSpare bounds the recycled hash buffers (4 KiB for an 8k-token prompt,
// 32 KiB at most).
const maxSpare = 64

func (r *recorder) add(pod string, hashes []uint64) {
	r.mu.Lock()
	if len(r.queue) >= r.limit {
		r.mu.Unlock()
		r.dropped.Add(1)
		return
	}
	var buf []uint64
	if n := len(r.spare); n > 0 {
		buf, r.spare = r.spare[n-1][:0], r.spare[:n-1]
	}
	r.queue = append(r.queue, pendingRecord{pod: pod, hashes: append(buf, hashes...)})
	start := !r.running
	r.running = true
	r.mu.Unlock()
	if start {
		go r.run()
	}
}

func (r *recorder) run() {
	var batch []pendingRecord
	for {
		r.busy.Lock()
		r.mu.Lock()
		for i := range batch {
			if len(r.spare) < maxSpare {
				r.spare = append(r.spare, batch[i].hashes)
			}
			batch[i] = pendingRecord{}
		}
		batch, r.queue = r.queue, batch[:0]
		if len(batch) == 0 {
			r.running = false
			r.mu.Unlock()
			r.busy.Unlock()
			return
		}
		r.mu.Unlock()
		for _, p := range batch {
			r.idx.Record(p.pod, p.hashes)
		}
		r.busy.Unlock()
	}
}

// flush records the queue now, after any batch in progress.
func (r *recorder) flush() {
	r.busy.Lock()
	defer r.busy.Unlock()
	r.mu.Lock()
	batch := r.queue
	r.queue = nil
	r.mu.Unlock()
	for _, p := range batch {
		r.idx.Record(p.pod, p.hashes)
	}
}

// speedEstimator learns tokens/s from (prefill tokens, TTFT) samples.
// TTFT ≈ overhead + tokens/speed, so it fits that line by exponentially
// weighted least squares: the intercept absorbs fixed costs (network,
// scheduling, a decode step) that would make a plain tokens/TTFT ratio
// underrate a pod serving short prompts. When the samples do not spread
// enough in size to fit a slope, it falls back to Σtokens/Σtime, which is
// dominated by the large, informative samples. Once warm, a sample is
// clipped to within 3× of the current prediction, so a stall (GC pause,
// preemption) moves the estimate a little, while a lasting change still
// moves it all the way over a few dozen samples.
type speedEstimator struct {
	n                int
	mx, my, mxx, mxy float64 // EW means of tokens, seconds, tokens², tokens·seconds
}

func (e *speedEstimator) add(alpha, tokens, secs float64) {
	if e.n >= 8 {
		if pred := e.predict(tokens); pred > 0 {
			secs = math.Min(math.Max(secs, pred/3), 3*pred)
		}
	}
	a := alpha
	if e.n < int(1/alpha) {
		a = 1 / float64(e.n+1) // plain mean until the EWMA has warmed up
	}
	e.n++
	e.mx += a * (tokens - e.mx)
	e.my += a * (secs - e.my)
	e.mxx += a * (tokens*tokens - e.mxx)
	e.mxy += a * (tokens*secs - e.mxy)
}

// fit returns the line's seconds-per-token slope and intercept, ok false
// when the samples do not determine a sensible line.
func (e *speedEstimator) fit() (slope, icept float64, ok bool) {
	if e.n < 8 {
		return 0, 0, false
	}
	vx := e.mxx - e.mx*e.mx
	if vx <= 0.01*e.mx*e.mx { // sizes too alike to fit a slope
		return 0, 0, false
	}
	slope = (e.mxy - e.mx*e.my) / vx
	icept = e.my - slope*e.mx
	// A negative intercept or a speed beyond 10× the plain ratio is
	// noise, not overhead.
	if slope <= 0 || icept < 0 || 1/slope > 10*e.mx/e.my {
		return 0, 0, false
	}
	return slope, icept, true
}

func (e *speedEstimator) predict(tokens float64) float64 {
	if slope, icept, ok := e.fit(); ok {
		return icept + slope*tokens
	}
	if v := e.value(); v > 0 {
		return tokens / v
	}
	return 0
}

func (e *speedEstimator) value() float64 {
	if e.n == 0 || e.my <= 0 {
		return 0
	}
	if slope, _, ok := e.fit(); ok {
		return 1 / slope
	}
	return e.mx / e.my
}
