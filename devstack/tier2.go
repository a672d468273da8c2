package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/tier1/register"
	"github.com/infergate/infergate/tier2/admin"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/gateway"
	"github.com/infergate/infergate/tier2/ratelimit"
	"github.com/infergate/infergate/tier2/route"
	"github.com/infergate/infergate/tier2/tenant"
)

// startTier2 wires Tier 2 on its embedded defaults: in-memory tenants and
// limits (one replica), the static cluster list, the admin API.
//
// It mirrors what `infergate tier2` builds from its config file for this one
// case; once that construction is exported from a package, this should call
// it instead.
func (st *Stack) startTier2(ctx context.Context, ln, adminLn net.Listener, opts Options, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	store, err := tenant.New(ctx, tenant.Options{
		Seed: []tenant.Tenant{{ID: TenantID, Name: "Local developer", Policy: tenant.PolicyCostFirst,
			// Generous, but present, so the admin API's usage shows something.
			Limits: tenant.Limits{RPM: 1200, TPM: 2_000_000, Concurrent: 128}}},
		SeedKeys: []tenant.SeedKey{{TenantID: TenantID, Name: "dev", Key: opts.APIKey}},
		Logger:   log.With("component", "tenant"),
	})
	if err != nil {
		return fmt.Errorf("tenant store: %w", err)
	}
	st.cleanups = append(st.cleanups, store.Close)
	auth, err := tenant.NewAuthenticator(store, nil)
	if err != nil {
		return fmt.Errorf("authenticator: %w", err)
	}
	limiter := ratelimit.New(ratelimit.Options{Logger: log.With("component", "ratelimit")})
	st.cleanups = append(st.cleanups, limiter.Close)

	var static []discovery.Cluster
	for _, c := range st.Clusters {
		static = append(static, discovery.Cluster{ID: c.Name, Name: c.Name, Region: c.Region, Address: c.URL,
			Models: c.Models(), Cost: c.Cost, CostUnit: register.CostPerGPUHour, Pricing: c.Pricing})
	}
	disc, err := discovery.New(discovery.Options{Static: static, Registry: reg, Logger: log})
	if err != nil {
		return err
	}
	router, err := route.New(disc, route.Options{
		Region: HomeRegion, RegionOrder: []string{FailoverRegion}, Token: st.Tier1Token,
		PollInterval: 500 * time.Millisecond,
		Overrides:    func() map[string]route.Override { return overrides(store) },
		Registry:     reg, Logger: log,
	})
	if err != nil {
		return err
	}
	gw, err := gateway.New(gateway.Options{
		Router: router, Auth: auth, Limiter: gateway.RateLimiter(limiter), Tier1Token: st.Tier1Token,
		Registry: reg, Gatherer: reg, Logger: log,
	})
	if err != nil {
		return err
	}
	adm := admin.New(admin.Options{Store: store, Limiter: limiter, Token: opts.AdminToken,
		Breakers: breakers{router}, Logger: log.With("component", "admin")})

	st.run("tier2 discovery", func() error { return ignoreCanceled(disc.Run(ctx)) })
	st.run("tier2 route", func() error { return ignoreCanceled(router.Run(ctx)) })
	st.run("tier2 admin", func() error { return ignoreCanceled(adm.Serve(ctx, adminLn)) })
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
	st.run("tier2", func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	st.run("tier2 shutdown", func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
		return nil
	})
	return nil
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// overrides converts the admin API's cluster overrides for the router.
func overrides(s *tenant.Store) map[string]route.Override {
	src := s.Overrides()
	m := make(map[string]route.Override, len(src))
	for name, o := range src {
		m[name] = route.Override{Drain: o.Drain, Weight: o.Weight, Cost: o.Cost}
	}
	return m
}

// breakers exposes the router's breakers to the admin API.
type breakers struct{ r *route.Router }

func (b breakers) Breakers() []admin.BreakerState {
	var out []admin.BreakerState
	for _, br := range b.r.Breakers() {
		out = append(out, admin.BreakerState{Cluster: br.Cluster, Model: br.Model, State: br.State,
			ConsecutiveFailures: br.ConsecutiveFailures, Since: br.Since})
	}
	return out
}
