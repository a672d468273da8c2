package gateway

// The status page's data, on the metrics listener (ServeMetrics): the page
// itself (shared/statusui) at /status holds no data; its JSON is under
// /status/api/ and needs a client token (auth), as the API does. /metrics
// stays token-free for Prometheus.
//
//	GET /status/api/summary    pools and GPU classes aggregated, the queue, the mesh
//	GET /status/api/pods       pods, filtered and paged (?q=&pool=&gpu=&state=&offset=&limit=)
//	GET /status/api/decisions  the last routing decisions, newest first (?limit=&pool=&pod=)
//	GET /status/api/mesh       the replica mesh's members
//	GET /status/api/queue      each pool's admission queue
//
// Everything is computed when asked, from the same snapshots the
// scheduler uses; nothing here runs on the request path.

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/shared/statusui"
	"github.com/infergate/infergate/tier1/scrape"
)

// Pod states on the status page, worst first.
const (
	stateNotScraped = "not_scraped" // no successful scrape yet
	stateUnready    = "unready"     // scrapes failing, or a connection refused moments ago
	stateStale      = "stale"       // metrics older than saturation.stale_after
	stateSaturated  = "saturated"   // ready, but its queue or KV cache is at the threshold
	stateReady      = "ready"
)

var podStates = []string{stateNotScraped, stateUnready, stateStale, stateSaturated, stateReady}

// Paging bounds of /status/api/pods and /status/api/decisions.
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// SetMeshStatus installs what /status/api/mesh reports: a snapshot of the
// replica mesh (tier1/peers' Node.Members), encoded as JSON. nil removes it.
func (g *Gateway) SetMeshStatus(members func() any) {
	if members == nil {
		g.mesh.Store(nil)
		return
	}
	g.mesh.Store(&members)
}

// statusRoutes adds the status page and its JSON to the metrics listener's
// mux.
func (g *Gateway) statusRoutes(mux *http.ServeMux) {
	ui := statusui.Handler(statusui.Tier1)
	mux.Handle(statusui.Path, ui)
	mux.Handle(statusui.AssetsPath, ui)
	api := map[string]func(w http.ResponseWriter, r *http.Request, st *state){
		"summary":   g.handleStatusSummary,
		"pods":      g.handleStatusPods,
		"decisions": func(w http.ResponseWriter, r *http.Request, _ *state) { g.writeDecisions(w, r) },
		"mesh":      func(w http.ResponseWriter, _ *http.Request, _ *state) { writeJSON(w, http.StatusOK, g.meshStatus()) },
		"queue": func(w http.ResponseWriter, _ *http.Request, st *state) {
			writeJSON(w, http.StatusOK, g.queueStatus(st))
		},
	}
	mux.HandleFunc(statusui.Path+"/api/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		st := g.state.Load()
		if !st.cfg.Auth.Disabled && !st.tokens.check(r) {
			closeAfter(w)
			w.Header().Set("WWW-Authenticate", `Bearer realm="infergate"`)
			openai.Errorf(w, http.StatusUnauthorized, "invalid_api_key", "missing or invalid bearer token (one of auth's tokens)")
			return
		}
		h := api[strings.TrimPrefix(r.URL.Path, statusui.Path+"/api/")]
		switch {
		case h == nil:
			openai.Errorf(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.URL.Path)
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			w.Header().Set("Allow", "GET, HEAD")
			openai.Errorf(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
		default:
			h(w, r, st)
		}
	})
}

// podStatus is one pod on the status page.
type podStatus struct {
	Name    string   `json:"name"`
	Address string   `json:"address"`
	Pool    string   `json:"pool"`
	Model   string   `json:"model"`
	Engine  string   `json:"engine"`
	GPU     string   `json:"gpu"`
	GPUs    int      `json:"gpus,omitempty"`
	State   string   `json:"state"`
	Ready   bool     `json:"ready"`
	Models  []string `json:"models"` // from /v1/models: the base model and adapters
	// Adapters loaded on the GPU and waiting to load (engines that export
	// LoRA state).
	ActiveAdapters  []string `json:"active_adapters"`
	WaitingAdapters []string `json:"waiting_adapters"`
	Running         int      `json:"running"`
	Waiting         int      `json:"waiting"`
	KVUsage         *float64 `json:"kv_usage"` // null when the engine does not export it
	InFlight        int      `json:"in_flight"`
	InFlightPrefill int      `json:"in_flight_prefill"`
	// MetricsAgeMS is the age of the metrics as routing weighs it (an
	// idle pod scraped on its slower schedule is not stale); -1 never
	// scraped. Idle says the pod is on that schedule.
	MetricsAgeMS        float64 `json:"metrics_age_ms"`
	LastScrapeMS        float64 `json:"last_scrape_ms"` // since the last successful scrape; -1 never
	Idle                bool    `json:"idle"`
	ScrapeError         string  `json:"scrape_error,omitempty"`
	ConsecutiveFailures int     `json:"consecutive_failures"`
	// ConnectFailed is set while the pod is kept unready after a refused
	// connection, until the scraper can tell.
	ConnectFailed bool `json:"connect_failed"`
	// Missing names metrics a scorer needs that the engine did not export.
	Missing []string `json:"missing_metrics,omitempty"`
}

// podRow is a pod with what aggregation needs besides its JSON.
type podRow struct {
	podStatus
	kvHas bool
	kv    float64
}

// podRows is every pod of st, in configuration order by pool.
func (g *Gateway) podRows(st *state) []podRow {
	sat := g.sched.Saturation()
	now := time.Now()
	var rows []podRow
	for _, ps := range st.poolList {
		cb := &cycleBuf{}
		g.snapshotAll(st, ps, cb)
		for i, rt := range ps.pods {
			p := &cb.pods[i]
			r := podRow{podStatus: podStatus{
				Name: rt.cfg.Name, Address: rt.cfg.Address, Pool: ps.cfg.Name, Model: ps.cfg.Model,
				Engine: p.Engine, GPU: rt.cfg.GPU, GPUs: rt.cfg.GPUs, Ready: p.Ready,
				Models: []string{}, ActiveAdapters: nonNil(p.Metrics.ActiveAdapters), WaitingAdapters: nonNil(p.Metrics.WaitingAdapters),
				Running: p.Metrics.Running, Waiting: p.Metrics.Waiting, InFlight: p.InFlight, InFlightPrefill: p.InFlightPrefill,
				MetricsAgeMS: -1, LastScrapeMS: -1, Missing: p.Metrics.Missing,
				ConnectFailed: now.UnixNano() < rt.downUntil.Load(),
			}}
			if p.Metrics.HasKV {
				kv := round4(p.Metrics.KVUsage)
				r.KVUsage, r.kvHas, r.kv = &kv, true, p.Metrics.KVUsage
			}
			s, scraped := g.scraper.Get(rt.cfg.Name)
			if scraped {
				r.fromScrape(s, now)
			}
			switch {
			case !scraped || s.LastSuccess.IsZero():
				r.State = stateNotScraped
			case !p.Ready:
				r.State = stateUnready
			case sat.Stale(p):
				r.State = stateStale
			case sat.Saturated(p):
				r.State = stateSaturated
			default:
				r.State = stateReady
			}
			rows = append(rows, r)
		}
	}
	return rows
}

func (r *podRow) fromScrape(s *scrape.PodState, now time.Time) {
	if !s.LastSuccess.IsZero() {
		r.MetricsAgeMS = ms(s.MetricsAge(now))
		r.LastScrapeMS = ms(s.Age(now))
	}
	r.Idle, r.ScrapeError, r.ConsecutiveFailures = s.Idle, s.LastError, s.ConsecutiveFailures
	for _, m := range s.Models {
		r.Models = append(r.Models, m.ID)
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// podFilter is the query of /status/api/pods.
type podFilter struct {
	q, pool, gpu, state string
}

func (f podFilter) match(r *podRow) bool {
	if (f.pool != "" && r.Pool != f.pool) || (f.gpu != "" && r.GPU != f.gpu) {
		return false
	}
	if f.state != "" && r.State != f.state && !(f.state == "problem" && r.State != stateReady && r.State != stateSaturated) {
		return false
	}
	if f.q == "" {
		return true
	}
	for _, s := range []string{r.Name, r.Address, r.Pool, r.Model, r.Engine, r.GPU, r.State, r.ScrapeError} {
		if strings.Contains(strings.ToLower(s), f.q) {
			return true
		}
	}
	return slices.ContainsFunc(r.Models, func(m string) bool { return strings.Contains(strings.ToLower(m), f.q) })
}

// page reads offset and limit from r's query.
func page(r *http.Request) (offset, limit int) {
	q := r.URL.Query()
	offset, _ = strconv.Atoi(q.Get("offset"))
	limit, err := strconv.Atoi(q.Get("limit"))
	if err != nil || limit <= 0 {
		limit = defaultPageSize
	}
	return max(offset, 0), min(limit, maxPageSize)
}

func (g *Gateway) handleStatusPods(w http.ResponseWriter, r *http.Request, st *state) {
	q := r.URL.Query()
	f := podFilter{q: strings.ToLower(strings.TrimSpace(q.Get("q"))), pool: q.Get("pool"), gpu: q.Get("gpu"), state: q.Get("state")}
	offset, limit := page(r)
	rows := g.podRows(st)
	out := struct {
		Total   int         `json:"total"`   // pods matching the filter
		All     int         `json:"all"`     // pods configured and discovered
		Offset  int         `json:"offset"`  // of the first pod below, in the matches
		Limit   int         `json:"limit"`   // page size
		Pods    []podStatus `json:"pods"`    // this page
		States  []string    `json:"states"`  // values of ?state= (and "problem": neither ready nor saturated)
		Updated time.Time   `json:"updated"` // when this was computed
	}{All: len(rows), Offset: offset, Limit: limit, Pods: []podStatus{}, States: podStates, Updated: time.Now().UTC()}
	for i := range rows {
		if !f.match(&rows[i]) {
			continue
		}
		if out.Total >= offset && len(out.Pods) < limit {
			out.Pods = append(out.Pods, rows[i].podStatus)
		}
		out.Total++
	}
	writeJSON(w, http.StatusOK, out)
}

// groupStatus aggregates pods: one pool, or one GPU class.
type groupStatus struct {
	Name     string         `json:"name"`
	Model    string         `json:"model,omitempty"`    // pools only
	Adapters []string       `json:"adapters,omitempty"` // pools only: configured
	Pods     int            `json:"pods"`
	States   map[string]int `json:"states"` // pods by state
	Running  int            `json:"running"`
	Waiting  int            `json:"waiting"` // queued on the pods' engines
	InFlight int            `json:"in_flight"`
	// KVUsageAvg is the mean KV-cache use of the ready pods that export
	// it; null when none does.
	KVUsageAvg *float64 `json:"kv_usage_avg"`
	// Queue is the pool's admission queue in this router (pools only).
	Queue *queueStatus `json:"queue,omitempty"`

	kvSum float64
	kvN   int
}

func (a *groupStatus) add(r *podRow) {
	a.Pods++
	a.States[r.State]++
	a.Running += r.Running
	a.Waiting += r.Waiting
	a.InFlight += r.InFlight
	if r.kvHas && r.Ready {
		a.kvSum += r.kv
		a.kvN++
	}
}

func (a *groupStatus) finish() {
	if a.kvN > 0 {
		v := round4(a.kvSum / float64(a.kvN))
		a.KVUsageAvg = &v
	}
}

func newGroup(name string) *groupStatus {
	return &groupStatus{Name: name, States: map[string]int{}}
}

func (g *Gateway) handleStatusSummary(w http.ResponseWriter, _ *http.Request, st *state) {
	rows := g.podRows(st)
	total := newGroup("all")
	pools := make([]*groupStatus, 0, len(st.poolList))
	byPool := map[string]*groupStatus{}
	queues := g.queueStatus(st)
	for i, ps := range st.poolList {
		a := newGroup(ps.cfg.Name)
		a.Model, a.Adapters, a.Queue = ps.cfg.Model, ps.cfg.Adapters, &queues.Pools[i]
		pools = append(pools, a)
		byPool[ps.cfg.Name] = a
	}
	gpus := map[string]*groupStatus{}
	for i := range rows {
		r := &rows[i]
		total.add(r)
		byPool[r.Pool].add(r)
		gpu := cmp.Or(r.GPU, "unknown")
		if gpus[gpu] == nil {
			gpus[gpu] = newGroup(gpu)
		}
		gpus[gpu].add(r)
	}
	total.finish()
	for _, a := range pools {
		a.finish()
	}
	gpuList := make([]*groupStatus, 0, len(gpus))
	for _, a := range gpus {
		a.finish()
		gpuList = append(gpuList, a)
	}
	slices.SortFunc(gpuList, func(a, b *groupStatus) int { return cmp.Compare(a.Name, b.Name) })
	_, recorded := g.decisions.latest(0, nil)
	writeJSON(w, http.StatusOK, map[string]any{
		"tier":      "tier1",
		"cluster":   st.cfg.Cluster,
		"region":    st.cfg.Region,
		"updated":   time.Now().UTC(),
		"total":     total,
		"pools":     pools,
		"gpus":      gpuList,
		"mesh":      g.meshStatus(),
		"decisions": map[string]any{"recorded": recorded, "kept": st.cfg.Status.Decisions},
		"profile":   map[string]any{"picker": g.sched.Profile().Picker},
	})
}

// queueStatus is one pool's admission queue.
type queueStatus struct {
	Pool         string         `json:"pool"`
	Waiting      int            `json:"waiting"`
	OldestWaitMS float64        `json:"oldest_wait_ms"` // 0 when empty
	ByPriority   map[string]int `json:"by_priority"`
	MaxLen       int            `json:"max_len"`
}

type queuesStatus struct {
	Pools []queueStatus `json:"pools"`
}

func (g *Gateway) queueStatus(st *state) queuesStatus {
	out := queuesStatus{Pools: make([]queueStatus, 0, len(st.poolList))}
	now := time.Now()
	for _, ps := range st.poolList {
		qs := queueStatus{Pool: ps.cfg.Name, ByPriority: map[string]int{}, MaxLen: st.cfg.Queue.MaxLen}
		for _, w := range ps.queue.waiters() {
			qs.Waiting++
			qs.ByPriority[strconv.Itoa(w.prio)]++
			qs.OldestWaitMS = max(qs.OldestWaitMS, ms(now.Sub(w.since)))
		}
		out.Pools = append(out.Pools, qs)
	}
	return out
}

// waiters copies the queue's waiters.
func (q *waitQueue) waiters() []*waiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.q.All()
}

func (g *Gateway) meshStatus() any {
	if f := g.mesh.Load(); f != nil {
		return (*f)()
	}
	return map[string]any{"enabled": false}
}

// writeDecisions answers /status/api/decisions and /debug/decisions:
// ?limit= (default 50), ?pool=, ?pod= (the pick, a candidate or an
// excluded pod), ?outcome= (dispatched, shed, failed).
func (g *Gateway) writeDecisions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	_, limit := page(r)
	pool, pod, outcome := q.Get("pool"), q.Get("pod"), q.Get("outcome")
	found, recorded := g.decisions.latest(limit, func(d *decision) bool {
		return (pool == "" || d.pool == pool) && (pod == "" || d.mentions(pod)) && (outcome == "" || d.outcome() == outcome)
	})
	out := struct {
		Recorded  uint64         `json:"recorded"` // since start
		Kept      int            `json:"kept"`     // status.decisions
		Decisions []decisionJSON `json:"decisions"`
	}{Recorded: recorded, Kept: g.state.Load().cfg.Status.Decisions, Decisions: make([]decisionJSON, 0, len(found))}
	for i := range found {
		out.Decisions = append(out.Decisions, found[i].toJSON())
	}
	writeJSON(w, http.StatusOK, out)
}

// mentions reports whether the decision names pod.
func (d *decision) mentions(pod string) bool {
	for i := range d.n {
		if d.cands[i].pod == pod {
			return true
		}
	}
	for _, e := range d.exPods[:d.exN] {
		if e.pod == pod {
			return true
		}
	}
	return d.served == pod
}

// handleDecisions is /debug/decisions on the API listener, for tooling.
func (g *Gateway) handleDecisions(w http.ResponseWriter, r *http.Request, _ *state, _ bool) {
	if r.Method != http.MethodGet {
		openai.Errorf(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
		return
	}
	g.writeDecisions(w, r)
}
