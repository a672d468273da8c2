package picker

import (
	"container/list"
	"hash/maphash"
	"math"
	"sync"
	"time"
)

// session-affinity parameter names.
const (
	ParamSessionLoadAbs   = "load_abs"   // the sticky pod loses its bonus when its Load exceeds the minimum by more than this
	ParamSessionLoadRatio = "load_ratio" // and by more than this factor
)

var sessionSpec = scorerSpec{
	params: map[string]float64{
		ParamSessionLoadAbs:   8,
		ParamSessionLoadRatio: 2,
	},
	build: func(bc buildContext) scorer {
		return &sessionScorer{
			tracker:   bc.tracker,
			loadAbs:   bc.params[ParamSessionLoadAbs],
			loadRatio: bc.params[ParamSessionLoadRatio],
		}
	},
}

// sessionScorer is soft session stickiness (llm-d's session affinity,
// AIBrix's x-session-id): the pod that served the session's last turn
// (Request.Session, remembered by the Tracker at dispatch) scores 1, every
// other pod 0, so a conversation's turns find their KV cache. It is only a
// score, never a filter: the key comes from the client and must not let
// it bypass load balancing. When the sticky pod's Load exceeds the
// candidates' minimum by more than load_abs and by more than load_ratio×,
// it scores 0 like the rest and the other scorers decide.
type sessionScorer struct {
	tracker   *Tracker
	loadAbs   float64
	loadRatio float64
}

func (*sessionScorer) Name() string { return ScorerSessionAffinity }

func (s *sessionScorer) Score(_ *cycleState, req *Request, pods []*Pod, out []float64) {
	if req.Session == "" || s.tracker == nil {
		return
	}
	pod, ok := s.tracker.sessions.lookup(req.Session)
	if !ok {
		return
	}
	minLoad := math.Inf(1)
	for _, p := range pods {
		minLoad = min(minLoad, float64(Load(p)))
	}
	for i, p := range pods {
		if p.Name != pod {
			continue
		}
		if l := float64(Load(p)); l-minLoad > s.loadAbs && l > s.loadRatio*minLoad {
			return // much more loaded: no bonus
		}
		out[i] = 1
	}
}

// SessionOptions bound the Tracker's session → pod memory.
type SessionOptions struct {
	Max int           // sessions remembered, least recently used evicted first; default 65536
	TTL time.Duration // a session idle this long is forgotten; default 30m
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
}

type sessionEntry struct {
	key  uint64
	pod  string
	seen time.Time
}

func (s *sessionStore) setup() {
	if s.init {
		return
	}
	s.init = true
	if s.opts.Max <= 0 {
		s.opts.Max = 65536
	}
	if s.opts.TTL <= 0 {
		s.opts.TTL = 30 * time.Minute
	}
	if s.opts.Now == nil {
		s.opts.Now = time.Now
	}
	s.seed = maphash.MakeSeed()
	s.m = make(map[uint64]*list.Element)
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
	if e, ok := s.m[k]; ok {
		ent := e.Value.(*sessionEntry)
		ent.pod, ent.seen = pod, now
		s.lru.MoveToFront(e)
		return
	}
	for s.lru.Len() >= s.opts.Max {
		s.evict(s.lru.Back())
	}
	s.m[k] = s.lru.PushFront(&sessionEntry{key: k, pod: pod, seen: now})
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
	delete(s.m, e.Value.(*sessionEntry).key)
	s.lru.Remove(e)
}

// len returns the number of sessions remembered.
func (s *sessionStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lru.Len()
}
