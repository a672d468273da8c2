package gateway

import (
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/tier1/picker"
	"github.com/infergate/infergate/tier1/scrape"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// modelEntry is one /v1/models item (OpenAI shape, plus vLLM's root,
// parent and max_model_len so clients can tell adapters from base models
// and size their requests).
type modelEntry struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int64   `json:"max_model_len,omitempty"`
}

// servedModels lists every model name the router routes: each pool's base
// model, its configured adapters and the adapters its pods report.
func (g *Gateway) servedModels(st *state) map[string]*poolState {
	out := map[string]*poolState{}
	for name, rt := range st.routes {
		out[name] = rt.pool
	}
	for name, ps := range g.adapterIndex(st).byName {
		out[name] = ps
	}
	return out
}

func (g *Gateway) handleModels(w http.ResponseWriter, r *http.Request, st *state, _ bool) {
	if r.Method != http.MethodGet {
		openai.Errorf(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
		return
	}
	served := g.servedModels(st)
	names := make([]string, 0, len(served))
	for n := range served {
		names = append(names, n)
	}
	sort.Strings(names)
	list := struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{Object: "list", Data: []modelEntry{}}
	for _, n := range names {
		e := modelEntry{ID: n, Object: "model", OwnedBy: "infergate", Root: n}
		if base := served[n].cfg.Model; base != n {
			e.Parent = &base
		}
		if card, ok := g.modelCard(served[n], n); ok {
			// The engine's own card: its max_model_len, creation time,
			// owner and root (an adapter's path, a model's weights).
			e.Created, e.MaxModelLen = int64(card.Created), int64(card.MaxModelLen)
			if card.OwnedBy != "" {
				e.OwnedBy = card.OwnedBy
			}
			if card.Root != "" {
				e.Root = card.Root
			}
		}
		list.Data = append(list.Data, e)
	}
	writeJSON(w, http.StatusOK, list)
}

// modelCard is the card a pod of ps lists for model, preferring ready
// pods, in the pool's order.
func (g *Gateway) modelCard(ps *poolState, model string) (scrape.Model, bool) {
	var found scrape.Model
	ok := false
	for _, rt := range ps.pods {
		s, have := g.scraper.Get(rt.cfg.Name)
		if !have {
			continue
		}
		for _, m := range s.Models {
			if m.ID != model {
				continue
			}
			if s.ConsecutiveFailures == 0 && !s.LastSuccess.IsZero() {
				return m, true
			}
			if !ok {
				found, ok = m, true
			}
		}
	}
	return found, ok
}

// podDebug is one pod in /debug/pods.
type podDebug struct {
	Name                string            `json:"name"`
	Address             string            `json:"address"`
	Pool                string            `json:"pool"`
	Model               string            `json:"model"`
	Engine              string            `json:"engine"`
	GPU                 string            `json:"gpu,omitempty"`
	GPUs                int               `json:"gpus,omitempty"`
	Labels              map[string]string `json:"labels,omitempty"`
	Ready               bool              `json:"ready"`
	Saturated           bool              `json:"saturated"`
	MetricsAgeMS        float64           `json:"metrics_age_ms"` // -1: never scraped
	ScrapeError         string            `json:"scrape_error,omitempty"`
	ConsecutiveFailures int               `json:"consecutive_failures"`
	Scrapes             uint64            `json:"scrapes"`
	ScrapeErrors        uint64            `json:"scrape_errors"`
	Metrics             picker.Metrics    `json:"metrics"`
	Models              []string          `json:"models,omitempty"`
	InFlight            int               `json:"in_flight"`
	InFlightPrefill     int               `json:"in_flight_prefill"`
	PrefillTokensPerSec float64           `json:"prefill_tokens_per_sec"`
	// SchedulingPrefillTokensPerSec is the speed the scheduler uses: the
	// learned one pooled with the pod's hardware class, or the GPU prior.
	SchedulingPrefillTokensPerSec float64      `json:"scheduling_prefill_tokens_per_sec"`
	LastScores                    *scoresDebug `json:"last_scores,omitempty"`
	// KVEvents is the pod's KV-event state and the prefix evidence in use
	// for it, with kv_events on (kvroute.go).
	KVEvents *kvPodDebug `json:"kv_events,omitempty"`
}

type scoresDebug struct {
	At     time.Time          `json:"at"`
	Picked bool               `json:"picked"`
	Total  float64            `json:"total"`
	Scores map[string]float64 `json:"scores"`
}

func (g *Gateway) handleDebugPods(w http.ResponseWriter, r *http.Request, st *state, _ bool) {
	sat := g.sched.Saturation()
	kvStats := g.kv.podStats()
	var out []podDebug
	for _, ps := range st.poolList {
		cb := &cycleBuf{}
		g.snapshotAll(st, ps, cb)
		speeds := g.sched.PrefillSpeeds(cb.ptrs, nil)
		for i, rt := range ps.pods {
			p := &cb.pods[i]
			d := podDebug{
				Name: rt.cfg.Name, Address: rt.cfg.Address, Pool: ps.cfg.Name, Model: ps.cfg.Model,
				Engine: p.Engine, GPU: rt.cfg.GPU, GPUs: rt.cfg.GPUs, Labels: rt.cfg.Labels, Ready: p.Ready,
				Saturated: p.Ready && sat.Saturated(p), Metrics: p.Metrics, MetricsAgeMS: -1,
				InFlight: p.InFlight, InFlightPrefill: p.InFlightPrefill, PrefillTokensPerSec: p.PrefillTokensPerSec,
				SchedulingPrefillTokensPerSec: speeds[i],
				KVEvents:                      g.kv.podDebug(kvStats, st, ps.cfg.Name, rt.cfg.Name),
			}
			if s, ok := g.scraper.Get(rt.cfg.Name); ok {
				if !s.LastSuccess.IsZero() {
					d.MetricsAgeMS = float64(time.Since(s.LastSuccess).Microseconds()) / 1000
				}
				d.ScrapeError, d.ConsecutiveFailures, d.Scrapes, d.ScrapeErrors = s.LastError, s.ConsecutiveFailures, s.Scrapes, s.Errors
				for _, m := range s.Models {
					d.Models = append(d.Models, m.ID)
				}
			}
			rt.mu.Lock()
			if !rt.scores.At.IsZero() {
				sd := &scoresDebug{At: rt.scores.At, Picked: rt.scores.Picked, Total: rt.scores.Total, Scores: map[string]float64{}}
				for k, name := range rt.scores.Scorers {
					if k < len(rt.scores.Scores) {
						sd.Scores[name] = rt.scores.Scores[k]
					}
				}
				d.LastScores = sd
			}
			rt.mu.Unlock()
			out = append(out, d)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"pods": out, "profile": g.sched.Profile()})
}

// snapshotAll is snapshot without request-specific filtering: one entry per
// configured pod of the pool, in order.
func (g *Gateway) snapshotAll(st *state, ps *poolState, cb *cycleBuf) {
	cb.pods = make([]picker.Pod, len(ps.pods))
	cb.ptrs = cb.ptrs[:0]
	now := time.Now()
	for i, rt := range ps.pods {
		p := &cb.pods[i]
		g.fillPod(p, st, ps, rt, now)
		cb.ptrs = append(cb.ptrs, p)
	}
	g.tracker.Apply(cb.ptrs)
}

// Load returns the cluster's load summary for Tier 2.
func (g *Gateway) Load() cluster.LoadSummary {
	st := g.state.Load()
	sat := g.sched.Saturation()
	sum := cluster.LoadSummary{Cluster: st.cfg.Cluster, Region: st.cfg.Region, At: time.Now().UTC(), Models: map[string]cluster.ModelLoad{}}
	perPool := map[*poolState]cluster.ModelLoad{}
	for _, ps := range st.poolList {
		cb := &cycleBuf{}
		g.snapshotAll(st, ps, cb)
		ml := cluster.ModelLoad{Pool: ps.cfg.Name, Pods: len(ps.pods), Queue: ps.queue.len(), Saturated: true}
		var headroom float64
		var kvPods int
		for _, p := range cb.ptrs {
			ml.InFlight += p.InFlight
			if !p.Ready {
				continue
			}
			ml.ReadyPods++
			ml.Queue += p.Metrics.Waiting
			ml.Running += p.Metrics.Running
			if p.Metrics.HasKV {
				headroom += 1 - p.Metrics.KVUsage
				kvPods++
			}
			if !sat.Saturated(p) {
				ml.Saturated = false
			}
		}
		switch {
		case kvPods > 0:
			ml.KVHeadroom = headroom / float64(kvPods)
		case ml.ReadyPods > 0:
			ml.KVHeadroom = 1 // no engine reports KV usage; assume room
		}
		perPool[ps] = ml
	}
	for name, ps := range g.servedModels(st) {
		ml := perPool[ps]
		if name != ps.cfg.Model {
			ml.Base = ps.cfg.Model // an adapter on the pool's base model
		}
		sum.Models[name] = ml
	}
	return sum
}

func (g *Gateway) handleLoad(w http.ResponseWriter, r *http.Request, _ *state, _ bool) {
	if r.Method != http.MethodGet {
		openai.Errorf(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
		return
	}
	writeJSON(w, http.StatusOK, g.Load())
}

// handleReady is 200 once at least one pod of some pool is ready; either
// way it says why discovery is not working, if it is not.
func (g *Gateway) handleReady(w http.ResponseWriter, r *http.Request) {
	st := g.state.Load()
	for _, ps := range st.poolList {
		cb := &cycleBuf{}
		g.snapshotAll(st, ps, cb)
		if slices.ContainsFunc(cb.ptrs, func(p *picker.Pod) bool { return p.Ready }) {
			body := map[string]string{"status": "ready"}
			if why := g.discoveryStatus(); why != "" {
				body["discovery"] = why // serving on the last view, or static pods
			}
			writeJSON(w, http.StatusOK, body)
			return
		}
	}
	msg := "no model server is ready yet"
	if why := g.discoveryStatus(); why != "" {
		msg += "; discovery: " + why
	}
	openai.Errorf(w, http.StatusServiceUnavailable, "not_ready", msg)
}

// podCollector exports per-pod readiness and router-side in-flight counts
// at collection time.
type podCollector struct{ g *Gateway }

var (
	podReadyDesc = prometheus.NewDesc("infergate_tier1_pod_ready", "1 when the pod can receive requests.",
		[]string{"pod", "pool"}, nil)
	podInFlightDesc = prometheus.NewDesc("infergate_tier1_pod_in_flight", "Requests the router has dispatched to the pod and not finished.",
		[]string{"pod", "pool"}, nil)
)

func (c podCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- podReadyDesc
	ch <- podInFlightDesc
}

func (c podCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.g.state.Load()
	if st == nil {
		return
	}
	for _, ps := range st.poolList {
		cb := &cycleBuf{}
		c.g.snapshotAll(st, ps, cb)
		for _, p := range cb.ptrs {
			ready := 0.0
			if p.Ready {
				ready = 1
			}
			ch <- prometheus.MustNewConstMetric(podReadyDesc, prometheus.GaugeValue, ready, p.Name, ps.cfg.Name)
			ch <- prometheus.MustNewConstMetric(podInFlightDesc, prometheus.GaugeValue, float64(p.InFlight), p.Name, ps.cfg.Name)
		}
	}
}
