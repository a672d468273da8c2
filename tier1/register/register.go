// Package register announces a Tier 1 router to Consul so that Tier 2 can
// find it: one instance of the service infergate-tier1 per Tier 1 replica,
// with what Tier 2 routes on (region, cluster, models, cost, capacity) in
// its metadata (keys in shared/cluster) and a health check (HTTP, or TCP
// where the router requires client certificates).
package register

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/shared/config"
)

// The service name, metadata keys and cost units are the contract with
// Tier 2 and live in shared/cluster.
const (
	ServiceName    = cluster.ServiceName
	CostPerGPUHour = cluster.CostPerGPUHour
	CostPerMTok    = cluster.CostPerMTok
)

// Consul limits metadata values to 512 characters.
const maxMetaValue = 512

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// Registration describes one Tier 1 instance.
type Registration struct {
	ID       string // Consul service ID; default "infergate-tier1-<cluster>"
	Address  string // address Tier 2 dials (IP or DNS name)
	Port     int
	Scheme   string // http (default) or https
	Region   string
	Cluster  string
	Models   []string
	Cost     float64
	CostUnit string // CostPerGPUHour (default) or CostPerMTok
	Pricing  string // spot or on-demand (optional)
	Capacity int    // concurrent requests; 0 = unknown
	Tags     []string

	CheckHTTP string // health-check URL, e.g. http://10.0.0.5:8080/ready
	// CheckTLSSkipVerify makes an https CheckHTTP skip verifying the
	// router's certificate (as a Kubernetes HTTPS probe does): the agent
	// may not trust the CA that issued it, and the check sends no secret.
	CheckTLSSkipVerify bool
	// CheckTCP, instead of CheckHTTP, is a host:port the agent connects
	// to: for a listener that requires client certificates, which the
	// agent's HTTP check cannot present.
	CheckTCP string
	// InitialStatus is the check's status until it first runs: "critical"
	// (default: Tier 2 sends nothing until the check passes, up to one
	// interval after registering) or "passing" (register only once ready).
	InitialStatus string
	CheckInterval time.Duration // default 5s
	CheckTimeout  time.Duration // default 2s
	// DeregisterCriticalAfter removes an instance whose check stays critical
	// this long, so a crashed Tier 1 that never deregistered goes away.
	// Default 10m; Consul enforces a minimum of one minute.
	DeregisterCriticalAfter time.Duration
}

func (r *Registration) setDefaults() {
	config.Default(&r.ID, ServiceName+"-"+r.Cluster)
	config.Default(&r.Scheme, "http")
	config.Default(&r.CostUnit, CostPerGPUHour)
	config.Default(&r.CheckInterval, 5*time.Second)
	config.Default(&r.InitialStatus, api.HealthCritical)
	config.Default(&r.CheckTimeout, 2*time.Second)
	config.Default(&r.DeregisterCriticalAfter, 10*time.Minute)
}

func (r *Registration) validate() error {
	var errs []error
	if r.Address == "" {
		errs = append(errs, errors.New("address is required"))
	}
	if r.Port <= 0 || r.Port > 65535 {
		errs = append(errs, fmt.Errorf("port %d out of range", r.Port))
	}
	if !nameRE.MatchString(r.Region) {
		errs = append(errs, fmt.Errorf("region %q: want letters, digits, '.', '_' or '-'", r.Region))
	}
	if !nameRE.MatchString(r.Cluster) {
		errs = append(errs, fmt.Errorf("cluster %q: want letters, digits, '.', '_' or '-'", r.Cluster))
	}
	if len(r.Models) == 0 {
		errs = append(errs, errors.New("at least one model is required"))
	}
	for _, m := range r.Models {
		if m == "" || strings.Contains(m, ",") {
			errs = append(errs, fmt.Errorf("model %q: must be non-empty without commas", m))
		}
	}
	if n := len(strings.Join(r.Models, ",")); n > maxMetaValue {
		errs = append(errs, fmt.Errorf("models list is %d characters; Consul metadata allows %d", n, maxMetaValue))
	}
	if r.Cost < 0 {
		errs = append(errs, fmt.Errorf("cost %v is negative", r.Cost))
	}
	if r.CostUnit != CostPerGPUHour && r.CostUnit != CostPerMTok {
		errs = append(errs, fmt.Errorf("cost_unit %q: want %q or %q", r.CostUnit, CostPerGPUHour, CostPerMTok))
	}
	if r.Scheme != "http" && r.Scheme != "https" {
		errs = append(errs, fmt.Errorf("scheme %q: want http or https", r.Scheme))
	}
	if r.Capacity < 0 {
		errs = append(errs, fmt.Errorf("capacity %d is negative", r.Capacity))
	}
	if r.InitialStatus != api.HealthCritical && r.InitialStatus != api.HealthPassing && r.InitialStatus != api.HealthWarning {
		errs = append(errs, fmt.Errorf("initial status %q: want critical, warning or passing", r.InitialStatus))
	}
	if (r.CheckHTTP == "") == (r.CheckTCP == "") {
		errs = append(errs, errors.New("exactly one of the check URL and the TCP check address is required"))
	}
	return errors.Join(errs...)
}

// Meta returns the service metadata for r (defaults applied).
func (r Registration) Meta() map[string]string {
	r.setDefaults()
	m := map[string]string{
		cluster.MetaRegion:   r.Region,
		cluster.MetaCluster:  r.Cluster,
		cluster.MetaModels:   strings.Join(r.Models, ","),
		cluster.MetaCost:     strconv.FormatFloat(r.Cost, 'g', -1, 64),
		cluster.MetaCostUnit: r.CostUnit,
		cluster.MetaCapacity: strconv.Itoa(r.Capacity),
		cluster.MetaScheme:   r.Scheme,
	}
	if r.Pricing != "" {
		m[cluster.MetaPricing] = r.Pricing
	}
	return m
}

// Register registers reg with the local Consul agent behind client and
// returns a function that deregisters it (call it on shutdown with a
// context that outlives the server's).
func Register(ctx context.Context, client *api.Client, reg Registration) (deregister func(context.Context) error, err error) {
	reg.setDefaults()
	if err := reg.validate(); err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}
	svc := &api.AgentServiceRegistration{
		ID:      reg.ID,
		Name:    ServiceName,
		Address: reg.Address,
		Port:    reg.Port,
		Tags:    append([]string{"region-" + reg.Region}, reg.Tags...),
		Meta:    reg.Meta(),
		Check: &api.AgentServiceCheck{
			Name:                           "infergate tier1 ready",
			HTTP:                           reg.CheckHTTP,
			TLSSkipVerify:                  reg.CheckTLSSkipVerify,
			TCP:                            reg.CheckTCP,
			Interval:                       reg.CheckInterval.String(),
			Timeout:                        reg.CheckTimeout.String(),
			Status:                         reg.InitialStatus,
			DeregisterCriticalServiceAfter: reg.DeregisterCriticalAfter.String(),
		},
	}
	opts := api.ServiceRegisterOpts{ReplaceExistingChecks: true}.WithContext(ctx)
	if err := client.Agent().ServiceRegisterOpts(svc, opts); err != nil {
		return nil, fmt.Errorf("register %s with consul: %w", reg.ID, err)
	}
	id := reg.ID
	return func(ctx context.Context) error {
		q := (&api.QueryOptions{}).WithContext(ctx)
		if err := client.Agent().ServiceDeregisterOpts(id, q); err != nil {
			return fmt.Errorf("deregister %s from consul: %w", id, err)
		}
		return nil
	}, nil
}

// Keep registers reg, re-registers it whenever the agent has lost it (an
// agent restarted without its data directory forgets local services), and
// deregisters it when ctx ends. It checks every interval (default the
// check interval) and returns only when ctx ends, after deregistering.
// Registration errors are retried at the next check and reported to
// onError (may be nil).
func Keep(ctx context.Context, client *api.Client, reg Registration, interval time.Duration, onError func(error)) error {
	reg.setDefaults()
	if err := reg.validate(); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	if interval <= 0 {
		interval = reg.CheckInterval
	}
	report := func(err error) {
		if err != nil && onError != nil && ctx.Err() == nil {
			onError(err)
		}
	}
	registered := false
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		q := (&api.QueryOptions{}).WithContext(ctx)
		svc, _, err := client.Agent().Service(reg.ID, q)
		switch {
		case err == nil && svc != nil:
		case err != nil && !isNotFound(err):
			report(fmt.Errorf("look up %s in consul: %w", reg.ID, err))
		default:
			if _, err := Register(ctx, client, reg); err != nil {
				report(err)
			} else {
				registered = true
			}
		}
		select {
		case <-ctx.Done():
			if !registered {
				return nil
			}
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := client.Agent().ServiceDeregisterOpts(reg.ID, (&api.QueryOptions{}).WithContext(dctx)); err != nil {
				return fmt.Errorf("deregister %s from consul: %w", reg.ID, err)
			}
			return nil
		case <-t.C:
		}
	}
}

func isNotFound(err error) bool {
	var se api.StatusError
	return errors.As(err, &se) && se.Code == 404
}
