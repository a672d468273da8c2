package bench

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
)

// Replicas models Tier 1 running as several replicas behind one Service
// (docs/tier1-replicas.md): each arrival lands on a router chosen at
// random, and each router has its own tracker (prefix index, in-flight
// counts), scheduler and wait queue. With Share, a router tells the others
// what it dispatched where, and its in-flight counts, Delay after the fact
// in virtual time, as tier1/peers does. The zero value is one router.
type Replicas struct {
	N     int  // routers; ≤ 1 means one
	Share bool // share routing state between routers
	// Delay is the propagation delay of a frame once sent (network and
	// apply): 0 means DefaultShareDelay, negative means none.
	Delay time.Duration
	// Flush models tier1/peers' batching: a change is sent at once when
	// the router sent nothing for Flush, else with the batch that goes
	// Flush after the last one. 0 means DefaultShareFlush, negative none.
	Flush time.Duration
}

// Defaults of Replicas: a generous same-cluster one-way latency, and
// tier1/peers' default batch interval.
const (
	DefaultShareDelay = time.Millisecond
	DefaultShareFlush = 5 * time.Millisecond
)

// Name describes r for reports ("" for one router).
func (r Replicas) Name() string {
	if r.N <= 1 {
		return ""
	}
	if !r.Share {
		return fmt.Sprintf("%d routers, unshared", r.N)
	}
	return fmt.Sprintf("%d routers, shared (delay %s, flush %s)", r.N, orDefault(r.Delay, DefaultShareDelay), orDefault(r.Flush, DefaultShareFlush))
}

func orDefault(d, def time.Duration) time.Duration {
	switch {
	case d < 0:
		return 0
	case d == 0:
		return def
	}
	return d
}

// router is one replica's state. Router 0 is the sim's own tracker and
// scheduler, so one router runs exactly as before.
type router struct {
	id      string
	sent    time.Duration // when its last frame was (or will be) sent
	hasSent bool
	tracker *picker.Tracker
	sched   *picker.Scheduler
	queue   admission.Queue[int]
}

// replicaSet is the routers of one sim and which router each request
// arrived at.
type replicaSet struct {
	routers []*router
	cur     int
	of      []int // request index → router
}

// initReplicas builds routers 1..N-1 beside the sim's own and spreads the
// requests over them at random (seeded, so runs stay deterministic).
func (s *sim) initReplicas(seed uint64) error {
	r := s.opts.Replicas
	if r.N <= 1 {
		return nil
	}
	rs := &replicaSet{of: make([]int, len(s.states))}
	rng := rand.New(rand.NewPCG(seed, 0x7e91ca5))
	for i := range rs.of {
		rs.of[i] = rng.IntN(r.N)
	}
	for k := range r.N {
		rt := &router{id: fmt.Sprintf("router-%d", k), tracker: s.tracker, sched: s.sched}
		if k > 0 {
			rt.tracker = picker.NewTracker(s.trackerOptions())
			if s.pol.Profile != nil {
				h := fnv.New64a()
				h.Write([]byte(s.pol.Name))
				var err error
				rt.sched, err = picker.NewScheduler(*s.pol.Profile, picker.Options{Tracker: rt.tracker, Rand: rand.New(rand.NewPCG(seed+uint64(k)<<32, h.Sum64()))})
				if err != nil {
					return fmt.Errorf("policy %s: %w", s.pol.Name, err)
				}
			}
		}
		rs.routers = append(rs.routers, rt)
	}
	if r.Share {
		for _, rt := range rs.routers {
			rt.tracker.SetObserver(&shareObserver{s: s, from: rt, delay: orDefault(r.Delay, DefaultShareDelay), flush: orDefault(r.Flush, DefaultShareFlush)})
		}
	}
	s.rep = rs
	return nil
}

// use makes router k the sim's current router: its tracker, scheduler
// and queue are the ones the routing step works on.
func (s *sim) use(k int) {
	rs := s.rep
	if rs == nil || rs.cur == k {
		return
	}
	rs.routers[rs.cur].queue = s.queue
	rt := rs.routers[k]
	s.tracker, s.sched, s.queue = rt.tracker, rt.sched, rt.queue
	rs.cur = k
}

// useRouterOf makes request i's router current.
func (s *sim) useRouterOf(i int) {
	if s.rep != nil {
		s.use(s.rep.of[i])
	}
}

// drainQueues drains every router's queue (each router wakes its own on
// its scrape).
func (s *sim) drainQueues(now time.Duration) {
	if s.rep == nil {
		s.drainQueue(now)
		return
	}
	for k := range s.rep.routers {
		s.use(k)
		s.drainQueue(now)
	}
}

// shareObserver delivers one router's changes to the others as
// tier1/peers does: batched (see Replicas.Flush), then Delay later.
type shareObserver struct {
	s            *sim
	from         *router
	delay, flush time.Duration
}

// at is when a change made now reaches the other routers.
func (o *shareObserver) at() time.Duration {
	now, r := o.s.loop.Now(), o.from
	var t time.Duration
	switch {
	case r.hasSent && r.sent >= now:
		t = r.sent // joins the batch about to go
	case !r.hasSent || now-r.sent >= o.flush:
		t = now // idle: sent at once
	default:
		t = r.sent + o.flush
	}
	r.sent, r.hasSent = t, true
	return t + o.delay
}

func (o *shareObserver) Dispatched(pod string, hashes []uint64, l picker.ReplicaLoad) {
	h := slices.Clone(hashes)
	o.s.loop.At(o.at(), func(time.Duration) {
		for _, rt := range o.s.rep.routers {
			if rt != o.from {
				rt.tracker.RecordRemote(pod, h)
				rt.tracker.SetRemote(o.from.id, pod, l)
			}
		}
	})
}

func (o *shareObserver) Changed(pod string, l picker.ReplicaLoad) {
	o.s.loop.At(o.at(), func(time.Duration) {
		for _, rt := range o.s.rep.routers {
			if rt != o.from {
				rt.tracker.SetRemote(o.from.id, pod, l)
			}
		}
	})
}

func (o *shareObserver) Sampled(pod string, tokens int, ttft time.Duration) {
	o.s.loop.At(o.at(), func(time.Duration) {
		for _, rt := range o.s.rep.routers {
			if rt != o.from {
				rt.tracker.RemoteSample(pod, tokens, ttft)
			}
		}
	})
}
