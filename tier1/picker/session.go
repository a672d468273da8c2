package picker

import (
	"container/list"
	"hash/maphash"
	"math"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/infergate/infergate/shared/config"
)

var sessionBalanceSpec = scorerSpec{
	build: func(bc buildContext) scorer { return &sessionBalanceScorer{tracker: bc.tracker} },
}

// sessionBalanceScorer places new conversations. A session's later turns
// follow its first to the same pod (their cached history, through the
// prefix index), so where a session starts sets that
// pod's load for minutes, which the instantaneous load scorers cannot see;
// and the prefix and latency scorers pull every new session towards the
// pod already holding its system prompt, whose sessions' turns then
// collide. For a request whose session the Tracker does not know, it
// scores the pods of the leading pod's hardware class (GPU and GPUs per
// pod; the leader is the best by the scorers run before it) by the
// sessions live on them (a turn within SessionOptions.Live), fewest best,
// min-max; pods of other classes score 0. So the other scorers choose the
// hardware and this one the pod within it: balancing counts across
// classes would start sessions on pods many times slower, whose every
// turn is then slow (measured: docs/tier1-scheduling.md). Every other
// request scores 0 on every pod. The key is client-supplied: a client that
// sends a new key with every request only spreads its own requests.
type sessionBalanceScorer struct {
	tracker *Tracker
}

func (*sessionBalanceScorer) Name() string { return ScorerSessionBalance }

func (*sessionBalanceScorer) Consumes() MetricSet { return 0 } // the Tracker's sessions

func (*sessionBalanceScorer) afterOthers() {}

func (s *sessionBalanceScorer) Score(cs *cycleState, req *Request, pods []*Pod, out []float64) {
	if req.Session == "" || s.tracker == nil {
		return
	}
	if s.tracker.sessionKnown(cs, req.Session, pods) {
		return // a known session: the prefix index places it
	}
	s.tracker.sessions.liveOn(pods, out)
	var classes speedClasses
	const other = len(classes.gpu) // pods of no class, or past the slots
	class := func(p *Pod) int {
		if k := classes.find(p, true); k >= 0 {
			return k
		}
		return other
	}
	// The leading class; all of them when the others left no preference
	// (no scorer ran before, or every pod tied).
	lead := -1
	if len(cs.total) == len(pods) {
		best, worst := 0, 0
		for i, v := range cs.total {
			if v > cs.total[best] {
				best = i
			}
			if v < cs.total[worst] {
				worst = i
			}
		}
		if cs.total[best] > cs.total[worst] {
			lead = class(pods[best])
		}
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, p := range pods {
		if lead < 0 || class(p) == lead {
			lo, hi = min(lo, out[i]), max(hi, out[i])
		}
	}
	for i, p := range pods {
		switch {
		case lead >= 0 && class(p) != lead:
			out[i] = 0
		case hi > lo:
			out[i] = (hi - out[i]) / (hi - lo)
		default:
			out[i] = 1
		}
	}
}

// sessionMarker is the prefix-index entry recording that a session's turn
// went to a pod: a hash in its own domain, recorded like a one-block
// prompt. Peer replicas record it too (Observer.Dispatched, RecordRemote),
// so a replica that never served the session still knows it exists: with
// several replicas a conversation's turns reach different ones, and a
// later turn taken for a new session would be balanced away from its
// cached history.
func sessionMarker(session string) uint64 {
	return xxhash.Sum64String("infergate/session\x00" + session)
}

// sessionKnown reports whether this replica served session within the
// session TTL, or any replica sent one of its turns to one of pods (its
// marker is in the index).
func (t *Tracker) sessionKnown(cs *cycleState, session string, pods []*Pod) bool {
	if _, ok := t.sessions.lookup(session); ok {
		return true
	}
	var buf []int
	if cs.cyc != nil {
		buf = cs.cyc.marker
	}
	marker := [1]uint64{sessionMarker(session)}
	buf = cs.match(t, marker[:], pods, buf)
	if cs.cyc != nil {
		cs.cyc.marker = buf
	}
	for _, n := range buf {
		if n > 0 {
			return true
		}
	}
	return false
}

// SessionOptions bound the Tracker's session → pod memory.
type SessionOptions struct {
	Max int           // sessions remembered, least recently used evicted first; default 65536
	TTL time.Duration // a session idle this long is forgotten; default 30m
	// Live is how long after its last turn a session counts as live on
	// its pod, for the session-balance scorer; default 30s (a chat user's
	// think time plus the reply, with room).
	Live time.Duration
	// Now is the clock; nil means time.Now (the benchmark passes virtual
	// time).
	Now func() time.Time
}

// sessionStore remembers the pod that served each session's last turn: a
// bounded LRU with TTL. Keys are hashed with a per-store seed, so the
// memory per session is fixed whatever the client sends. The zero value is
// usable (defaults apply).
type sessionStore struct {
	mu   sync.Mutex
	opts SessionOptions
	seed maphash.Seed
	init bool
	m    map[uint64]*list.Element
	lru  list.List // of *sessionEntry, most recent first
	// Live sessions are a run at the front of lru (it is ordered by
	// seen): oldestLive ends it (nil when none is live) and live counts
	// them per pod, so counting costs O(1) per turn, not a walk.
	live       map[string]int
	oldestLive *list.Element
}

type sessionEntry struct {
	key  uint64
	pod  string
	seen time.Time
	live bool
}

func (s *sessionStore) setup() {
	if s.init {
		return
	}
	s.init = true
	config.Default(&s.opts.Max, 65536)
	config.Default(&s.opts.TTL, 30*time.Minute)
	config.Default(&s.opts.Live, 30*time.Second)
	if s.opts.Now == nil {
		s.opts.Now = time.Now
	}
	s.seed = maphash.MakeSeed()
	s.m = make(map[uint64]*list.Element)
	s.live = make(map[string]int)
}

// expire ends the liveness of sessions whose last turn is older than
// opts.Live, oldest first.
func (s *sessionStore) expire(now time.Time) {
	for e := s.oldestLive; e != nil; e = s.oldestLive {
		ent := e.Value.(*sessionEntry)
		if now.Sub(ent.seen) <= s.opts.Live {
			return
		}
		s.unlive(e)
	}
}

// unlive takes e, a live entry, out of the live run and counts.
func (s *sessionStore) unlive(e *list.Element) {
	ent := e.Value.(*sessionEntry)
	ent.live = false
	if s.live[ent.pod]--; s.live[ent.pod] <= 0 {
		delete(s.live, ent.pod)
	}
	if s.oldestLive == e {
		s.oldestLive = e.Prev() // the run is contiguous from the front
	}
}

// record notes that session's latest turn went to pod.
func (s *sessionStore) record(session, pod string) {
	if session == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setup()
	k := maphash.String(s.seed, session)
	now := s.opts.Now()
	s.expire(now)
	e, ok := s.m[k]
	if ok {
		if ent := e.Value.(*sessionEntry); ent.live {
			s.unlive(e)
		}
		s.lru.MoveToFront(e)
	} else {
		for s.lru.Len() >= s.opts.Max {
			s.evict(s.lru.Back())
		}
		e = s.lru.PushFront(&sessionEntry{key: k})
		s.m[k] = e
	}
	ent := e.Value.(*sessionEntry)
	ent.pod, ent.seen, ent.live = pod, now, true
	s.live[pod]++
	if s.oldestLive == nil {
		s.oldestLive = e
	}
}

// liveOn writes into out the number of live sessions (a turn within
// opts.Live) whose last turn went to each pod.
func (s *sessionStore) liveOn(pods []*Pod, out []float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setup()
	s.expire(s.opts.Now())
	for i, p := range pods {
		out[i] = float64(s.live[p.Name])
	}
}

// lookup returns the pod of session's last turn, if remembered and fresh.
func (s *sessionStore) lookup(session string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setup()
	e, ok := s.m[maphash.String(s.seed, session)]
	if !ok {
		return "", false
	}
	ent := e.Value.(*sessionEntry)
	if s.opts.Now().Sub(ent.seen) > s.opts.TTL {
		s.evict(e)
		return "", false
	}
	return ent.pod, true
}

func (s *sessionStore) evict(e *list.Element) {
	if e.Value.(*sessionEntry).live {
		s.unlive(e)
	}
	delete(s.m, e.Value.(*sessionEntry).key)
	s.lru.Remove(e)
}

// len returns the number of sessions remembered.
func (s *sessionStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lru.Len()
}
