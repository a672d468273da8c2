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
func (st *Stack) tier2Config(ln, adminLn net.Listener, opts Options) server.Config {
	cfg := server.Config{
		Listen: ln.Addr().String(), Region: HomeRegion, RegionOrder: []string{FailoverRegion},
		Tier1: server.Tier1Config{Token: st.Tier1Token, PollInterval: 500 * time.Millisecond},
		Tenants: []tenant.Tenant{{ID: TenantID, Name: "Local developer", Policy: tenant.PolicyCostFirst,
			// Generous, but present, so the admin API's usage shows something.
			Limits: tenant.Limits{RPM: 1200, TPM: 2_000_000, Concurrent: 128}}},
		Keys:  []tenant.SeedKey{{TenantID: TenantID, Name: "dev", Key: opts.APIKey}},
		Admin: server.AdminConfig{Listen: adminLn.Addr().String(), Token: opts.AdminToken},
	}
	for _, c := range st.Clusters {
		cfg.Clusters = append(cfg.Clusters, discovery.Cluster{ID: c.Name, Name: c.Name, Region: c.Region, Address: c.URL,
			Models: c.Models(), Cost: c.Cost, CostUnit: cluster.CostPerGPUHour, Pricing: c.Pricing})
	}
	return cfg
}

// startTier2 builds Tier 2 through tier2/server, as `infergate tier2` does,
// and serves it on the stack's listeners until ctx ends.
func (st *Stack) startTier2(ctx context.Context, ln, adminLn net.Listener, opts Options, log *slog.Logger) error {
	srv, err := server.New(ctx, st.tier2Config(ln, adminLn, opts), server.Options{Logger: log, ShutdownTimeout: 5 * time.Second,
		TracerProvider: opts.TracerProvider})
	if err != nil {
		return err
	}
	st.cleanups = append(st.cleanups, srv.Close)
	st.run("tier2", func() error { return srv.Serve(ctx, ln, adminLn) })
	return nil
}
