package cluster

// ServiceName is the Consul service every Tier 1 registers as.
const ServiceName = "infergate-tier1"

// Metadata keys of an infergate-tier1 instance.
const (
	MetaRegion   = "region"
	MetaCluster  = "cluster"
	MetaModels   = "models"    // comma-separated served model names
	MetaCost     = "cost"      // decimal, in CostUnit
	MetaCostUnit = "cost_unit" // CostPerGPUHour or CostPerMTok
	MetaPricing  = "pricing"   // spot or on-demand, informational
	MetaCapacity = "capacity"  // concurrent requests the cluster is sized for
	MetaScheme   = "scheme"    // http (default) or https
)

// Cost units (the value of MetaCostUnit).
const (
	CostPerGPUHour = "gpu-hour"
	CostPerMTok    = "mtok"
)
