// Package cluster is the contract between the tiers: what a Tier 1 cluster
// tells Tier 2 about itself. Tier 1 announces itself in Consul as the
// service ServiceName with the Meta* keys (consul.go) and serves a compact
// LoadSummary at LoadPath that Tier 2 polls to route across clusters. Both
// tiers import this package and nothing else of each other.
package cluster

import "time"

// LoadPath is where Tier 1 serves its LoadSummary (GET, same bearer token as
// the OpenAI API).
const LoadPath = "/infergate/load"

// LoadSummary is one Tier 1 cluster's load, per model it serves.
type LoadSummary struct {
	Cluster string               `json:"cluster"`
	Region  string               `json:"region"`
	At      time.Time            `json:"at"`
	Models  map[string]ModelLoad `json:"models"` // keyed by served model name (base models and adapters)
}

// ModelLoad summarises the pods of one pool as Tier 2 needs it.
type ModelLoad struct {
	Pool       string  `json:"pool"`
	ReadyPods  int     `json:"ready_pods"`
	Pods       int     `json:"pods"`
	Queue      int     `json:"queue"`       // waiting requests on the servers plus the router's own queue
	Running    int     `json:"running"`     // requests running on the servers
	InFlight   int     `json:"in_flight"`   // requests the router has dispatched and not finished
	KVHeadroom float64 `json:"kv_headroom"` // mean over ready pods of 1 - KV-cache usage, in [0,1]
	Saturated  bool    `json:"saturated"`   // every ready pod is saturated
	// Base is, for a LoRA adapter, the base model it runs on (the same
	// pods); empty for a base model. Tier 2 applies a base model's
	// per-model limits to its adapters too.
	Base string `json:"base,omitempty"`
}
