package gateway

import (
	"net"
	"slices"
)

// SetDiscoveredPods replaces the pods a discovery source (tier1/kube) found,
// keeping the static pods of the configuration. It rebuilds the routing
// state the way a configuration reload does: a pod that is gone leaves the
// candidate set at once and its prefix-index entries are dropped, while
// requests already sent to it finish; a new pod is scraped at once and
// becomes routable on its first successful scrape. A discovered pod named
// like a static one, or in a pool the configuration does not have, is
// skipped.
func (g *Gateway) SetDiscoveredPods(pods []PodConfig) error {
	g.applyMu.Lock()
	defer g.applyMu.Unlock()
	g.discovered = slices.Clone(pods)
	return g.applyLocked(g.state.Load().base)
}

// SetDiscoveryProblem records why discovery is not working ("" when it is);
// /ready reports it.
func (g *Gateway) SetDiscoveryProblem(problem string) {
	g.discoveryProblem.Store(&problem)
}

func (g *Gateway) discoveryStatus() string {
	if p := g.discoveryProblem.Load(); p != nil {
		return *p
	}
	return ""
}

// withDiscovered returns cfg with the discovered pods appended (cfg itself
// when there are none). Called with applyMu held.
func (g *Gateway) withDiscovered(cfg *Config) *Config {
	if len(g.discovered) == 0 {
		return cfg
	}
	merged := *cfg
	merged.Pods = make([]PodConfig, 0, len(cfg.Pods)+len(g.discovered))
	merged.Pods = append(merged.Pods, cfg.Pods...)
	names := make(map[string]bool, cap(merged.Pods))
	for _, p := range cfg.Pods {
		names[p.Name] = true
	}
	for _, p := range g.discovered {
		_, port, err := net.SplitHostPort(p.Address)
		switch {
		case names[p.Name]:
			g.log.Warn("discovered pod skipped: a static pod has its name", "pod", p.Name)
			continue
		case cfg.Pool(p.Pool) == nil:
			g.log.Warn("discovered pod skipped: unknown pool", "pod", p.Name, "pool", p.Pool)
			continue
		case err != nil || port == "":
			g.log.Warn("discovered pod skipped: bad address", "pod", p.Name, "address", p.Address)
			continue
		case p.Engine != "" && !isEngine(p.Engine):
			p.Engine = "" // detect from its metrics instead
		}
		names[p.Name] = true
		merged.Pods = append(merged.Pods, p)
	}
	return &merged
}
