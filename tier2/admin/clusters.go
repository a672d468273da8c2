package admin

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// ClusterReporter is what the router knows of the clusters; *route.Router
// implements it.
type ClusterReporter interface {
	Region() string
	RegionOrder() []string
	TokensPerGPUSecond() float64
	ClusterInfo() []route.ClusterInfo
}

// ClusterList is the body of GET /admin/v1/clusters (openapi.json).
type ClusterList struct {
	Object             string                            `json:"object"`
	Region             string                            `json:"region"`
	RegionOrder        []string                          `json:"region_order"`
	TokensPerGPUSecond float64                           `json:"tokens_per_gpu_second"`
	Regions            []RegionClusters                  `json:"regions"`
	Overrides          map[string]tenant.ClusterOverride `json:"overrides"`
}

// RegionClusters is one region's clusters.
type RegionClusters struct {
	Region   string          `json:"region"`
	Own      bool            `json:"own"`
	Clusters []ClusterStatus `json:"clusters"`
}

// ClusterStatus is one cluster as this replica sees it.
type ClusterStatus struct {
	ID        string                  `json:"id"`
	Name      string                  `json:"name"`
	Region    string                  `json:"region"`
	Address   string                  `json:"address"`
	Models    []string                `json:"models"`
	Capacity  int                     `json:"capacity"`
	Pricing   string                  `json:"pricing"`
	State     string                  `json:"state"`
	Drained   bool                    `json:"drained"`
	Health    ClusterHealth           `json:"health"`
	Load      ClusterLoad             `json:"load"`
	Cost      ClusterCost             `json:"cost"`
	Override  *tenant.ClusterOverride `json:"override"`
	Breakers  []ClusterBreaker        `json:"breakers"`
	LastError *ClusterError           `json:"last_error"`
}

// ClusterHealth is what the load polls say.
type ClusterHealth struct {
	ReadyPods               int        `json:"ready_pods"`
	Pods                    int        `json:"pods"`
	LoadFresh               bool       `json:"load_fresh"`
	LoadAt                  *time.Time `json:"load_at"`
	LoadAgeSeconds          *float64   `json:"load_age_seconds"`
	LastPollAt              *time.Time `json:"last_poll_at"`
	ConsecutivePollFailures int        `json:"consecutive_poll_failures"`
	LastPollError           string     `json:"last_poll_error"`
	LastPollErrorAt         *time.Time `json:"last_poll_error_at"`
}

// ClusterLoad is the cluster's load.
type ClusterLoad struct {
	Utilization float64                      `json:"utilization"`
	InFlight    int                          `json:"in_flight"`
	Models      map[string]cluster.ModelLoad `json:"models"`
}

// ClusterCost is the cluster's cost in both units.
type ClusterCost struct {
	Advertised float64  `json:"advertised"`
	Unit       string   `json:"unit"`
	Override   *float64 `json:"override"`
	Weight     float64  `json:"weight"`
	PerMTok    *float64 `json:"per_mtok"`
	PerGPUHour *float64 `json:"per_gpu_hour"`
	Effective  float64  `json:"effective"`
}

// ClusterBreaker is one (cluster, model) circuit breaker.
type ClusterBreaker struct {
	Model               string    `json:"model"`
	State               string    `json:"state"`
	ConsecutiveFailures uint32    `json:"consecutive_failures"`
	Since               time.Time `json:"since"`
}

// ClusterError is the last failure seen of a cluster.
type ClusterError struct {
	At      time.Time `json:"at"`
	Model   string    `json:"model,omitempty"`
	Message string    `json:"message"`
}

// timePtr is nil for the zero time, else t in UTC.
func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

func floatPtr(v float64, ok bool) *float64 {
	if !ok {
		return nil
	}
	return &v
}

// clusterStatus converts the router's view of one cluster.
func clusterStatus(ci route.ClusterInfo, overrides map[string]tenant.ClusterOverride, now time.Time) ClusterStatus {
	c := ci.Cluster
	cs := ClusterStatus{ID: c.ID, Name: c.Name, Region: c.Region, Address: c.Address, Models: ci.Models,
		Capacity: c.Capacity, Pricing: c.Pricing, State: ci.State, Drained: ci.Override.Drain,
		Breakers: []ClusterBreaker{}}
	if cs.Models == nil {
		cs.Models = []string{}
	}
	h := &cs.Health
	h.LoadFresh = ci.Fresh
	h.LoadAt = timePtr(ci.SummaryAt)
	if !ci.SummaryAt.IsZero() {
		age := now.Sub(ci.SummaryAt).Seconds()
		h.LoadAgeSeconds = &age
	}
	h.LastPollAt, h.LastPollErrorAt = timePtr(ci.PolledAt), timePtr(ci.PollErrorAt)
	h.ConsecutivePollFailures, h.LastPollError = ci.PollFailures, ci.PollError
	cs.Load = ClusterLoad{Utilization: ci.Utilization, InFlight: ci.InFlight, Models: map[string]cluster.ModelLoad{}}
	if ci.Summary != nil {
		for m, ml := range ci.Summary.Models {
			cs.Load.Models[m] = ml
			h.ReadyPods += ml.ReadyPods
			h.Pods += ml.Pods
		}
	}
	cs.Cost = ClusterCost{Advertised: c.Cost, Unit: c.CostUnit, Override: ci.Override.Cost, Weight: ci.Weight,
		PerMTok: floatPtr(ci.PerMTok, ci.HasMTok), PerGPUHour: floatPtr(ci.PerGPUHr, ci.HasGPUHr), Effective: ci.Effective}
	if ov, ok := overrides[c.Name]; ok {
		cs.Override = &ov
	}
	for _, b := range ci.Breakers {
		cs.Breakers = append(cs.Breakers, ClusterBreaker{Model: b.Model, State: b.State, ConsecutiveFailures: b.ConsecutiveFailures, Since: b.Since.UTC()})
	}
	if ci.LastError != "" {
		cs.LastError = &ClusterError{At: ci.LastErrorAt.UTC(), Model: ci.LastErrorFrom, Message: ci.LastError}
	}
	return cs
}

// clusters answers GET /clusters: the clusters by region, own region
// first, then the failover order (ClusterInfo's order), and every stored
// override. Without a router it lists the overrides alone.
func (s *Server) clusters(c echo.Context) error {
	overrides := s.opts.Store.Overrides()
	if overrides == nil {
		overrides = map[string]tenant.ClusterOverride{}
	}
	out := ClusterList{Object: "list", RegionOrder: []string{}, Regions: []RegionClusters{}, Overrides: overrides}
	if r := s.opts.Router; r != nil {
		out.Region, out.TokensPerGPUSecond = r.Region(), r.TokensPerGPUSecond()
		if ro := r.RegionOrder(); ro != nil {
			out.RegionOrder = ro
		}
		now := time.Now()
		for _, ci := range r.ClusterInfo() {
			n := len(out.Regions)
			if n == 0 || out.Regions[n-1].Region != ci.Cluster.Region {
				out.Regions = append(out.Regions, RegionClusters{Region: ci.Cluster.Region, Own: ci.Cluster.Region == out.Region, Clusters: []ClusterStatus{}})
				n++
			}
			out.Regions[n-1].Clusters = append(out.Regions[n-1].Clusters, clusterStatus(ci, overrides, now))
		}
	}
	return c.JSON(http.StatusOK, out)
}
