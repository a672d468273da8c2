package gateway

// The routing decision log behind the status page and /debug/decisions:
// the last N admission decisions, each with the pick, its runners-up's
// score breakdown, the pods the filters left out and why, and how the
// request got there (queued, queue full, wait expired, retried).
//
// Recording is on the request path, so it copies one fixed-size struct
// into a ring under a mutex held for that copy only: strings are headers
// of names the configuration already holds, numbers are numbers, and
// nothing is formatted until someone reads the log.

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/tier1/admission"
	"github.com/infergate/infergate/tier1/picker"
)

const (
	// decCands is how many candidates a decision keeps with their score
	// breakdown: the ranked ones (the pick and its fallbacks), and every
	// candidate when there are no more than this.
	decCands = 8
	// decScorers bounds the scorers kept per candidate (there are seven
	// built in).
	decScorers = 8
	// decExcluded is how many excluded pods a decision names; the rest
	// are only counted by reason.
	decExcluded = 4
)

// Why a pod was not a candidate. The order is the filters' (model and
// pool, ready, fresh, LoRA).
const (
	exOther   uint8 = iota // another pool or model, or a filter without a known cause
	exUnready              // scrapes failing (scrape.unready_after)
	exDown                 // a connection to it was refused moments ago
	exStale                // metrics older than saturation.stale_after
	exLoRA                 // every adapter slot holds another adapter
	exNoState              // not scraped yet, or does not list the adapter
	nExcl
)

var exclNames = [nExcl]string{"filtered", "unready", "connect_failed", "stale_metrics", "lora_slots_full", "no_metrics_or_adapter"}

// How the request reached its decision.
const (
	howQueued    uint8 = 1 << iota // waited in the pool's queue
	howQueueFull                   // the queue was full: sent without waiting
	howExpired                     // the wait ran out: sent to the best pod anyway
)

// decision is one routing decision as recorded.
type decision struct {
	seq     uint64
	at      int64 // unix nanos
	id      string
	model   string
	adapter string
	pool    string
	action  admission.Action
	status  int
	code    string
	how     uint8
	cycles  uint16        // scheduling cycles run
	waited  time.Duration // in the queue
	scorers []string      // the profile's, shared read-only
	weights []float64

	podsN, snapN, candN, rankN int // pool's pods, with state, candidates, ranked
	n                          int // cands recorded
	cands                      [decCands]decCand
	best                       float64 // highest total among all candidates
	atBest                     int     // candidates with that total
	excl                       [nExcl]int
	exN                        int
	exPods                     [decExcluded]decExcl

	// Set when the request ends after a retry, or with no pod answering.
	amended  bool
	served   string
	attempts int
	final    string // the request's status label
}

type decCand struct {
	pod    string
	total  float64
	ranked int // 1-based position in the ranking, 0: not ranked
	scores [decScorers]float32
}

type decExcl struct {
	pod string
	why uint8
}

// waitNote is how a call's admission went, for its decision.
type waitNote struct {
	since time.Time // when it entered the queue (zero: it did not)
	how   uint8     // how* flags
}

// decisionLog is a ring of the last decisions.
type decisionLog struct {
	mu   sync.Mutex
	ring []decision
	n    uint64 // decisions ever recorded; the next one's seq
	held int    // valid entries: the newest held of them are in the ring
}

func newDecisionLog(size int) *decisionLog {
	return &decisionLog{ring: make([]decision, max(size, 1))}
}

// add copies d into the ring and returns its sequence number.
func (l *decisionLog) add(d *decision) uint64 {
	l.mu.Lock()
	seq := l.n
	d.seq = seq
	l.ring[seq%uint64(len(l.ring))] = *d
	l.n++
	l.held = min(l.held+1, len(l.ring))
	l.mu.Unlock()
	return seq
}

// amend records how the request of decision seq ended, if the ring still
// holds it.
func (l *decisionLog) amend(seq uint64, served string, attempts int, final string) {
	l.mu.Lock()
	d := &l.ring[seq%uint64(len(l.ring))]
	if d.seq == seq && l.n > seq && l.n-seq <= uint64(l.held) {
		d.amended, d.served, d.attempts, d.final = true, served, attempts, final
	}
	l.mu.Unlock()
}

// resize keeps the newest min(size, kept) decisions.
func (l *decisionLog) resize(size int) {
	size = max(size, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if size == len(l.ring) {
		return
	}
	kept := l.latestLocked(size, nil)
	l.ring = make([]decision, size)
	for _, d := range kept {
		l.ring[d.seq%uint64(size)] = d
	}
	l.held = len(kept)
}

// latest returns up to limit decisions that keep accepts (nil: all),
// newest first, and how many were ever recorded. keep runs under the
// log's lock: it must be quick.
func (l *decisionLog) latest(limit int, keep func(*decision) bool) ([]decision, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.latestLocked(limit, keep), l.n
}

func (l *decisionLog) latestLocked(limit int, keep func(*decision) bool) []decision {
	size := uint64(len(l.ring))
	var out []decision
	for i := uint64(0); i < uint64(l.held) && len(out) < limit; i++ {
		d := &l.ring[(l.n-1-i)%size]
		if keep == nil || keep(d) {
			out = append(out, *d)
		}
	}
	return out
}

// recordDecision logs the admission decision d of the call. It runs once
// per routed request, after admission: the scheduling result in c.cb is
// the last cycle's (none when c.cycles is 0).
func (c *call) recordDecision(d admission.Decision) {
	g := c.g
	var rec decision
	rec.at = time.Now().UnixNano()
	rec.id, rec.model, rec.adapter, rec.pool = c.id, c.req.Model, c.req.Adapter, c.pool.cfg.Name
	rec.action, rec.status, rec.code = d.Action, d.Status, d.Code
	rec.how, rec.cycles = c.wait.how, c.cycles
	if !c.wait.since.IsZero() {
		rec.waited = time.Since(c.wait.since)
	}
	rec.podsN = len(c.pool.pods)
	if c.cycles > 0 {
		res := &c.cb.res
		rec.scorers, rec.weights = res.Scorers, res.Weights
		rec.snapN, rec.candN, rec.rankN = len(c.cb.ptrs), len(res.Candidates), len(res.Ranked)
		rec.fillCandidates(res)
		if rec.candN < rec.snapN {
			rec.fillExcluded(c.st, c.req, c.cb.ptrs, res.Candidates, g.sched.Saturation())
		}
		if n := rec.podsN - rec.snapN; n > 0 {
			rec.excl[exNoState] += n
		}
	}
	c.decSeq = g.decisions.add(&rec)
	c.decided = true
}

// fillCandidates keeps the ranked candidates' scores (all candidates' when
// few) and the best total.
func (rec *decision) fillCandidates(res *picker.Result) {
	k := min(len(res.Ranked), decCands)
	var idx [decCands]int
	for r := range idx {
		idx[r] = -1
	}
	rec.best, rec.atBest = math.Inf(-1), 0
	for i, p := range res.Candidates {
		if t := res.Total[i]; t > rec.best {
			rec.best, rec.atBest = t, 1
		} else if t == rec.best {
			rec.atBest++
		}
		for r := range k {
			if res.Ranked[r] == p {
				idx[r] = i
				break
			}
		}
	}
	add := func(i, rank int) {
		cd := &rec.cands[rec.n]
		cd.pod, cd.total, cd.ranked = res.Candidates[i].Name, res.Total[i], rank
		for s := range min(len(res.Scores), decScorers) {
			cd.scores[s] = float32(res.Scores[s][i])
		}
		rec.n++
	}
	for r := range k {
		if idx[r] >= 0 {
			add(idx[r], r+1)
		}
	}
	if len(res.Candidates) <= decCands {
		for i := range res.Candidates {
			if !slices.Contains(idx[:k], i) && rec.n < decCands {
				add(i, 0)
			}
		}
	}
}

// fillExcluded counts the pods of the snapshot that are not candidates, by
// reason. The filters keep the snapshot's order, so one merge walk finds
// them.
func (rec *decision) fillExcluded(st *state, req *picker.Request, snap, cands []*picker.Pod, sat picker.SaturationDetector) {
	now := time.Now().UnixNano()
	j := 0
	for _, p := range snap {
		if j < len(cands) && cands[j] == p {
			j++
			continue
		}
		why := exclusion(st, req, p, sat, now)
		rec.excl[why]++
		if rec.exN < decExcluded {
			rec.exPods[rec.exN] = decExcl{pod: p.Name, why: why}
			rec.exN++
		}
	}
}

// exclusion is why the filters left p out, checked in the filters' order.
func exclusion(st *state, req *picker.Request, p *picker.Pod, sat picker.SaturationDetector, now int64) uint8 {
	base := req.BaseModel
	if base == "" {
		base = req.Model
	}
	switch {
	case (req.Pool != "" && p.Pool != req.Pool) || (p.BaseModel != "" && base != "" && p.BaseModel != base):
		return exOther
	case !p.Ready:
		if rt := st.pods[p.Name]; rt != nil && now < rt.downUntil.Load() {
			return exDown
		}
		return exUnready
	case sat.Stale(p):
		return exStale
	case req.Adapter != "" && loraFull(p, req.Adapter):
		return exLoRA
	}
	return exOther
}

// loraFull reports whether every adapter slot of p holds another adapter
// than the one wanted (the LoRA filter's test).
func loraFull(p *picker.Pod, adapter string) bool {
	m := &p.Metrics
	if !m.HasLoRA || m.MaxLoras <= 0 || slices.Contains(m.ActiveAdapters, adapter) || slices.Contains(m.WaitingAdapters, adapter) {
		return false
	}
	used := len(m.ActiveAdapters)
	for _, a := range m.WaitingAdapters {
		if !slices.Contains(m.ActiveAdapters, a) {
			used++
		}
	}
	return used >= m.MaxLoras
}

// endDecision amends the call's decision when the request needed more
// than one attempt or no pod answered it: the rest are as decided.
func (c *call) endDecision(status string) {
	if !c.decided || (c.attempts <= 1 && c.served != "") {
		return
	}
	c.g.decisions.amend(c.decSeq, c.served, c.attempts, status)
}

// refusalReason is the message of a refusal for admission decision d:
// d's own, and for no_ready_pod what the pool's pods are doing instead.
func (c *call) refusalReason(d admission.Decision) string {
	if d.Code != "no_ready_pod" {
		return d.Message
	}
	return d.Message + ": " + c.g.whyNoPod(c.st, c.pool, c.req)
}

// whyNoPod explains why no pod of pool can take req: the pool's pods
// counted by state, with the first scrape error seen. It reads the
// scraper afresh (this is the refusal path, not the hot one).
func (g *Gateway) whyNoPod(st *state, pool *poolState, req *picker.Request) string {
	if len(pool.pods) == 0 {
		return fmt.Sprintf("pool %q has no pods (none configured or discovered)", pool.cfg.Name)
	}
	now := time.Now()
	sat := g.sched.Saturation()
	var counts [nExcl]int
	var ready int
	var firstErr, firstErrPod string
	for _, rt := range pool.pods {
		var p picker.Pod
		ps := g.fillPod(&p, st, pool, rt, now)
		switch {
		case ps == nil || ps.LastSuccess.IsZero():
			counts[exNoState]++
		case req.Adapter != "" && ps.Models != nil && !ps.Serves(req.Adapter):
			counts[exOther]++
		case p.Ready && !sat.Stale(&p) && (req.Adapter == "" || !loraFull(&p, req.Adapter)):
			ready++
		default:
			counts[exclusion(st, req, &p, sat, now.UnixNano())]++
		}
		if ps != nil && ps.LastError != "" && firstErr == "" {
			firstErr, firstErrPod = ps.LastError, rt.cfg.Name
		}
	}
	parts := make([]string, 0, nExcl)
	add := func(n int, what string) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(counts[exUnready], "unready (scrapes failing)")
	add(counts[exDown], "refusing connections")
	add(counts[exStale], "with stale metrics")
	add(counts[exLoRA], "with every LoRA slot taken by other adapters")
	add(counts[exNoState], "not scraped successfully yet")
	if req.Adapter != "" {
		add(counts[exOther], fmt.Sprintf("not serving adapter %q", req.Adapter))
	} else {
		add(counts[exOther], "filtered out")
	}
	add(ready, "ready")
	msg := fmt.Sprintf("pool %q has %d pods: %s", pool.cfg.Name, len(pool.pods), strings.Join(parts, ", "))
	if firstErr != "" {
		msg += fmt.Sprintf("; last scrape error (%s): %s", firstErrPod, firstErr)
	}
	return msg
}

// The decision log as JSON (GET /status/api/decisions, /debug/decisions).

type decisionJSON struct {
	Seq       uint64    `json:"seq"`
	At        time.Time `json:"at"`
	RequestID string    `json:"request_id"`
	Model     string    `json:"model"`
	Adapter   string    `json:"adapter,omitempty"`
	Pool      string    `json:"pool"`
	// Outcome is dispatched, shed or failed.
	Outcome string `json:"outcome"`
	// Pod is the pick ("" unless dispatched).
	Pod string `json:"pod,omitempty"`
	// Status and Code are the refusal's, for shed and failed.
	Status int    `json:"status,omitempty"`
	Code   string `json:"code,omitempty"`
	// Reason says why this pod, or why none, in words.
	Reason   string          `json:"reason"`
	Queued   bool            `json:"queued"`
	WaitedMS float64         `json:"waited_ms"`
	Cycles   int             `json:"scheduling_cycles"`
	Scorers  []scorerJSON    `json:"scorers"`
	Pods     int             `json:"pool_pods"`
	Cands    int             `json:"candidates_total"`
	Ranked   int             `json:"ranked_total"`
	Top      []candidateJSON `json:"candidates"`
	Excluded map[string]int  `json:"excluded"`
	ExPods   []excludedJSON  `json:"excluded_pods"`
	// Set when the request took more than one attempt or none answered.
	Served   *string `json:"served_by,omitempty"`
	Attempts int     `json:"attempts,omitempty"`
	Final    string  `json:"final_status,omitempty"`
}

type scorerJSON struct {
	Name   string  `json:"name"`
	Weight float64 `json:"weight"`
}

type candidateJSON struct {
	Pod    string             `json:"pod"`
	Rank   int                `json:"rank"` // 1: the pick; 0: not ranked
	Total  float64            `json:"total"`
	Scores map[string]float64 `json:"scores"` // unweighted, in [0,1]
}

type excludedJSON struct {
	Pod    string `json:"pod"`
	Reason string `json:"reason"`
}

func (d *decision) toJSON() decisionJSON {
	out := decisionJSON{
		Seq: d.seq, At: time.Unix(0, d.at).UTC(), RequestID: d.id, Model: d.model, Adapter: d.adapter, Pool: d.pool,
		Status: d.status, Code: d.code, Queued: d.how&howQueued != 0, WaitedMS: ms(d.waited), Cycles: int(d.cycles),
		Scorers: []scorerJSON{}, Pods: d.podsN, Cands: d.candN, Ranked: d.rankN, Top: []candidateJSON{},
		Excluded: map[string]int{}, ExPods: []excludedJSON{},
	}
	out.Outcome = d.outcome()
	for s, name := range d.scorers {
		out.Scorers = append(out.Scorers, scorerJSON{Name: name, Weight: d.weights[s]})
	}
	for i := range d.n {
		cd := &d.cands[i]
		cj := candidateJSON{Pod: cd.pod, Rank: cd.ranked, Total: round4(cd.total), Scores: make(map[string]float64, len(d.scorers))}
		for s, name := range d.scorers[:min(len(d.scorers), decScorers)] {
			cj.Scores[name] = round4(float64(cd.scores[s]))
		}
		out.Top = append(out.Top, cj)
	}
	for why, n := range d.excl {
		if n > 0 {
			out.Excluded[exclNames[why]] = n
		}
	}
	for _, e := range d.exPods[:d.exN] {
		out.ExPods = append(out.ExPods, excludedJSON{Pod: e.pod, Reason: exclNames[e.why]})
	}
	if d.action == admission.Dispatch && d.n > 0 && d.cands[0].ranked == 1 {
		out.Pod = d.cands[0].pod
	}
	if d.amended {
		served := d.served
		out.Served, out.Attempts, out.Final = &served, d.attempts, d.final
	}
	out.Reason = d.reason(out.Pod)
	return out
}

// outcome is dispatched, shed or failed.
func (d *decision) outcome() string {
	switch d.action {
	case admission.Dispatch:
		return "dispatched"
	case admission.Shed:
		return "shed"
	}
	return "failed"
}

// reason puts the decision in words.
func (d *decision) reason(pick string) string {
	var b strings.Builder
	switch {
	case d.action == admission.Shed:
		b.WriteString("shed (sheddable request, every pod saturated or busy)")
	case d.action != admission.Dispatch:
		fmt.Fprintf(&b, "refused %d %s", d.status, d.code)
		if d.candN == 0 && d.cycles > 0 {
			fmt.Fprintf(&b, ": no candidate among %d pods", d.podsN)
		}
	case pick == "":
		b.WriteString("dispatched")
	case d.n > 0 && d.cands[0].total < d.best-1e-9:
		fmt.Fprintf(&b, "%s picked by the ranker's order, not the highest total (%.3f < %.3f)", pick, d.cands[0].total, d.best)
	case d.atBest > 1:
		fmt.Fprintf(&b, "%s: tie on the highest total %.3f among %d candidates, broken at random", pick, d.best, d.atBest)
	default:
		fmt.Fprintf(&b, "%s: highest total %.3f of %d candidates", pick, d.best, d.candN)
	}
	switch {
	case d.how&howQueueFull != 0:
		b.WriteString("; the queue was full, so sent without waiting")
	case d.how&howExpired != 0:
		fmt.Fprintf(&b, "; queued %s, the wait bound passed, so sent to the best pod anyway", d.waited.Round(time.Millisecond))
	case d.how&howQueued != 0:
		fmt.Fprintf(&b, "; queued %s for capacity", d.waited.Round(time.Millisecond))
	}
	if excluded := d.snapN - d.candN + d.excl[exNoState]; excluded > 0 && d.cycles > 0 {
		fmt.Fprintf(&b, "; %d pods filtered out", excluded)
	}
	if d.amended {
		if d.served == "" {
			fmt.Fprintf(&b, "; no pod answered after %d attempts (%s)", d.attempts, d.final)
		} else {
			fmt.Fprintf(&b, "; retried: served by %s on attempt %d", d.served, d.attempts)
		}
	}
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func round4(v float64) float64 { return math.Round(v*1e4) / 1e4 }
