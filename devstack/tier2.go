package devstack

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/infergate/infergate/shared/cluster"
	"github.com/infergate/infergate/tier2/discovery"
	"github.com/infergate/infergate/tier2/server"
	"github.com/infergate/infergate/tier2/tenant"
)

// tier2Config is Tier 2's configuration for the local stack: in-memory
// tenants and limits (one replica), the stack's clusters as the static
// list, the admin API, and the dev tenant with its key.
func (st *Stack) tier2Config(ls server.Listeners, opts Options) server.Config {
	cfg := server.Config{
		Listen: ls.API.Addr().String(), Metrics: server.MetricsConfig{Listen: ls.Metrics.Addr().String()}, Region: HomeRegion, RegionOrder: []string{FailoverRegion},
		Tier1: server.Tier1Config{Token: st.Tier1Token, PollInterval: 500 * time.Millisecond},
		Tenants: []tenant.Tenant{{ID: TenantID, Name: "Local developer", Policy: tenant.PolicyCostFirst,
			// Generous, but present, so the admin API's usage shows something.
			Limits: tenant.Limits{RPM: 1200, TPM: 2_000_000, Concurrent: 128}}},
		Keys:  []tenant.SeedKey{{TenantID: TenantID, Name: "dev", Key: opts.APIKey}},
		Admin: server.AdminConfig{Listen: ls.Admin.Addr().String(), Token: opts.AdminToken},
	}
	for _, c := range st.Clusters {
		cfg.Clusters = append(cfg.Clusters, discovery.Cluster{ID: c.Name, Name: c.Name, Region: c.Region, Address: c.URL,
			Models: c.Models(), Cost: c.Cost, CostUnit: cluster.CostPerGPUHour, Pricing: c.Pricing})
	}
	return cfg
}

// startTier2 builds Tier 2 through tier2/server, as `infergate tier2` does,
// and serves it on the stack's listeners until ctx ends.
func (st *Stack) startTier2(ctx context.Context, ls server.Listeners, opts Options, log *slog.Logger) error {
	srv, err := server.New(ctx, st.tier2Config(ls, opts), server.Options{Logger: log, ShutdownTimeout: 5 * time.Second,
		TracerProvider: opts.TracerProvider})
	if err != nil {
		return err
	}
	st.cleanups = append(st.cleanups, srv.Close)
	st.run("tier2", func() error { return srv.ServeListeners(ctx, ls) })
	return nil
}

func server2Listeners(api, admin, metrics net.Listener) server.Listeners {
	return server.Listeners{API: api, Admin: admin, Metrics: metrics}
}
