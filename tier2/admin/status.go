package admin

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/infergate/infergate/tier2/ratelimit"
	"github.com/infergate/infergate/tier2/tenant"
)

// Status is the body of GET /admin/v1/status (openapi.json): this
// replica and what it depends on.
type Status struct {
	Region        string        `json:"region"`
	ReplicaID     string        `json:"replica_id"`
	Version       string        `json:"version"`
	StartedAt     time.Time     `json:"started_at"`
	UptimeSeconds float64       `json:"uptime_seconds"`
	Redis         RedisStatus   `json:"redis"`
	Limiter       LimiterStatus `json:"limiter"`
	Consul        ConsulStatus  `json:"consul"`
}

// RedisStatus is Redis as a PING made for the request found it.
type RedisStatus struct {
	Mode      string   `json:"mode"` // memory, standalone, cluster
	Reachable *bool    `json:"reachable"`
	LatencyMS *float64 `json:"latency_ms"`
	Error     string   `json:"error"`
}

// LimiterStatus is the rate limiter's view of Redis and its counters.
type LimiterStatus struct {
	RedisDown          bool  `json:"redis_down"`
	FailClosed         bool  `json:"fail_closed"`
	Replicas           int   `json:"replicas"`
	Admissions         int64 `json:"admissions"`
	DegradedAdmissions int64 `json:"degraded_admissions"`
	RedisErrors        int64 `json:"redis_errors"`
}

// ConsulStatus is discovery's view of Consul.
type ConsulStatus struct {
	Mode          string     `json:"mode"` // consul, static
	Address       string     `json:"address"`
	Reachable     *bool      `json:"reachable"`
	LastSuccessAt *time.Time `json:"last_success_at"`
	LastError     string     `json:"last_error"`
	LastErrorAt   *time.Time `json:"last_error_at"`
	ClustersFound int        `json:"clusters_found"`
}

// StatusReporter reports the replica's status; Tier 2's server
// implements it (it knows Redis, the limiter and discovery).
type StatusReporter interface {
	Status(ctx context.Context) Status
}

// status answers GET /status.
func (s *Server) status(c echo.Context) error {
	if s.opts.Status == nil {
		return errf(http.StatusNotImplemented, "status_unavailable", "", "no status reporter configured")
	}
	st := s.opts.Status.Status(c.Request().Context())
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusOK, st)
}

// TenantUsage is one tenant's line of GET /admin/v1/usage.
type TenantUsage struct {
	ratelimit.Usage
	Name     string `json:"name,omitempty"`
	Disabled bool   `json:"disabled"`
}

// UsageList is the body of GET /admin/v1/usage.
type UsageList struct {
	Object    string        `json:"object"`
	Data      []TenantUsage `json:"data"`
	HasMore   bool          `json:"has_more"`
	NextAfter string        `json:"next_after"`
}

// Page size bounds of GET /usage.
const (
	defaultUsagePage = 100
	maxUsagePage     = 1000
)

// usageList answers GET /usage: every tenant's use, in ID order, a page
// at a time (each tenant is one read of Redis per limit scope).
func (s *Server) usageList(c echo.Context) error {
	if s.opts.Limiter == nil {
		return errf(http.StatusNotImplemented, "usage_unavailable", "", "no limiter configured")
	}
	limit := defaultUsagePage
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxUsagePage {
			return errf(http.StatusBadRequest, "invalid_parameter", "limit", "limit must be an integer from 1 to %d", maxUsagePage)
		}
		limit = n
	}
	after := c.QueryParam("after")
	ts := s.opts.Store.Tenants()
	sort.Slice(ts, func(i, j int) bool { return ts[i].ID < ts[j].ID })
	out := UsageList{Object: "list", Data: []TenantUsage{}}
	var page []*tenant.Tenant
	for _, t := range ts {
		if t.ID <= after {
			continue
		}
		if len(page) == limit {
			out.HasMore = true
			break
		}
		page = append(page, t)
	}
	for _, t := range page {
		u, err := s.opts.Limiter.Usage(c.Request().Context(), t)
		if err != nil {
			ae := errf(http.StatusServiceUnavailable, "usage_unavailable", "", "usage unavailable; retry later").(*apiError)
			ae.cause = err
			return ae
		}
		out.Data = append(out.Data, TenantUsage{Usage: u, Name: t.Name, Disabled: t.Disabled})
	}
	if out.HasMore {
		out.NextAfter = page[len(page)-1].ID
	}
	return c.JSON(http.StatusOK, out)
}
