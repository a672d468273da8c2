package gateway

import (
	"slices"

	"github.com/infergate/infergate/tier1/config"
	"github.com/infergate/infergate/tier1/scrape"
)

// The schema of Tier 1's configuration file is tier1/config's; these names
// keep the gateway's code and its callers reading as before.
type (
	Config           = config.Config
	PoolConfig       = config.PoolConfig
	PodConfig        = config.PodConfig
	ModelConfig      = config.ModelConfig
	AuthConfig       = config.AuthConfig
	UpstreamConfig   = config.UpstreamConfig
	TimeoutConfig    = config.TimeoutConfig
	RetryConfig      = config.RetryConfig
	QueueConfig      = config.QueueConfig
	ScrapeConfig     = config.ScrapeConfig
	ConsulConfig     = config.ConsulConfig
	KubernetesConfig = config.KubernetesConfig
	DiscoverySource  = config.DiscoverySource
	PeersConfig      = config.PeersConfig
	PeersTLS         = config.PeersTLS
)

// Defaults, as tier1/config has them.
const (
	DefaultListen         = config.DefaultListen
	DefaultMetricsListen  = config.DefaultMetricsListen
	DefaultPodHeader      = config.DefaultPodHeader
	DefaultMaxBodyBytes   = config.DefaultMaxBodyBytes
	DefaultReloadInterval = config.DefaultReloadInterval
)

// isEngine reports whether e names an engine dialect the scraper knows.
func isEngine(e string) bool { return slices.Contains(scrape.Engines, e) }
