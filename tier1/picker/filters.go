package picker

import "slices"

// buildContext is what plugin factories get: the profile, the router-side
// state and the scorer's parameters with defaults applied.
type buildContext struct {
	cfg     ProfileConfig
	tracker *Tracker
	sat     SaturationDetector
	params  map[string]float64
}

var filterFactories = map[string]func(buildContext) filter{
	FilterModel: func(buildContext) filter { return modelFilter{} },
	FilterReady: func(buildContext) filter { return readyFilter{} },
	FilterFresh: func(bc buildContext) filter { return freshFilter{sat: bc.sat} },
	FilterLoRA:  func(buildContext) filter { return loraFilter{} },
}

// Built-in filters compact the slice they are given in place: it belongs to
// the cycle (a copy of the caller's pods), so this costs no allocation.
func keep(pods []*Pod, ok func(*Pod) bool) []*Pod {
	out := pods[:0]
	for _, p := range pods {
		if ok(p) {
			out = append(out, p)
		}
	}
	clear(pods[len(out):]) // drop references for the GC
	return out
}

// keepOrAll is keep, except that when no pod qualifies all are kept: a
// fallback filter degrades instead of failing the request.
func keepOrAll(pods []*Pod, ok func(*Pod) bool) []*Pod {
	if !slices.ContainsFunc(pods, ok) {
		return pods
	}
	return keep(pods, ok)
}

// modelFilter keeps pods serving the request's base model (Request.Model
// when BaseModel is empty) and, if Request.Pool is set, in that pool. A
// pod with an empty BaseModel is assumed to serve anything.
type modelFilter struct{}

func (modelFilter) Name() string { return FilterModel }

func (modelFilter) Consumes() MetricSet { return 0 } // configuration and /v1/models

func (modelFilter) Filter(_ *cycleState, req *Request, pods []*Pod) []*Pod {
	model := req.BaseModel
	if model == "" {
		model = req.Model
	}
	return keep(pods, func(p *Pod) bool {
		return (model == "" || p.BaseModel == "" || p.BaseModel == model) &&
			(req.Pool == "" || p.Pool == req.Pool)
	})
}

// readyFilter keeps pods whose readiness probe passes.
type readyFilter struct{}

func (readyFilter) Name() string { return FilterReady }

func (readyFilter) Consumes() MetricSet { return 0 } // whether scrapes succeed

func (readyFilter) Filter(_ *cycleState, _ *Request, pods []*Pod) []*Pod {
	return keep(pods, func(p *Pod) bool { return p.Ready })
}

// freshFilter drops pods whose metrics are older than StaleAfter, unless
// every pod is stale: then all stay (their scores rest on old data and the
// saturation detector reports them saturated, so the caller is warned).
type freshFilter struct{ sat SaturationDetector }

func (freshFilter) Name() string { return FilterFresh }

func (freshFilter) Consumes() MetricSet { return 0 } // the age of the last scrape, not a metric

func (f freshFilter) Filter(_ *cycleState, _ *Request, pods []*Pod) []*Pod {
	after := f.sat.withDefaults().StaleAfter // once per cycle, not per pod
	return keepOrAll(pods, func(p *Pod) bool { return p.MetricsAge <= after })
}

// loraFilter, for adapter requests, keeps pods that have the adapter
// loaded or loading, or a free adapter slot (GIE's lora-affinity filter);
// pods that do not export LoRA state are kept as unknown. If no pod
// qualifies all stay: one will have to swap an adapter out.
type loraFilter struct{}

func (loraFilter) Name() string { return FilterLoRA }

func (loraFilter) Consumes() MetricSet { return MetricLoRA }

func (loraFilter) Filter(_ *cycleState, req *Request, pods []*Pod) []*Pod {
	if req.Adapter == "" {
		return pods
	}
	return keepOrAll(pods, func(p *Pod) bool {
		st := loraStateOf(p, req.Adapter)
		return st != loraSwap
	})
}

type loraState int

const (
	loraSwap     loraState = iota // all slots taken by other adapters
	loraUnknown                   // engine exports no LoRA state
	loraFreeSlot                  // not loaded, a slot is free
	loraWaiting                   // requested, being loaded / queued
	loraActive                    // loaded and running
)

func loraStateOf(p *Pod, adapter string) loraState {
	m := &p.Metrics
	if slices.Contains(m.ActiveAdapters, adapter) {
		return loraActive
	}
	if slices.Contains(m.WaitingAdapters, adapter) {
		return loraWaiting
	}
	if !m.HasLoRA {
		return loraUnknown
	}
	used := len(m.ActiveAdapters)
	for _, a := range m.WaitingAdapters {
		if !slices.Contains(m.ActiveAdapters, a) {
			used++
		}
	}
	if m.MaxLoras <= 0 || used < m.MaxLoras {
		return loraFreeSlot
	}
	return loraSwap
}
