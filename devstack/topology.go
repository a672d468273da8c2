package devstack

import (
	"github.com/infergate/infergate/sim/fleet"
	"github.com/infergate/infergate/tier1/gateway"
)

// Model names the local stack serves, as clients send them.
const (
	LlamaModel  = "meta-llama/Llama-3.1-8B-Instruct"
	QwenModel   = "Qwen/Qwen3-32B"
	SQLLoRA     = "sql-lora"
	SupportLoRA = "support-lora"
)

// Regions of the default topology; Tier 2 lives in HomeRegion and fails over
// to FailoverRegion.
const (
	HomeRegion     = "us-east"
	FailoverRegion = "eu-west"
)

// Cluster is one simulated Tier 1 cluster: its pods and what Tier 2 is told
// about it.
type Cluster struct {
	Name    string
	Region  string
	Cost    float64 // per GPU-hour
	Pricing string  // spot or on-demand
	// Pools are the Tier 1 pools; every pod of Pods belongs to the pool
	// whose Model is the pod's served model name.
	Pools []gateway.PoolConfig
	Pods  []fleet.PodSpec
}

// Models lists every model and adapter the cluster serves, for Tier 2.
func (c Cluster) Models() []string {
	var out []string
	for _, p := range c.Pools {
		out = append(out, p.Model)
		out = append(out, p.Adapters...)
	}
	return out
}

// Pool returns the name of the pool serving model, or "".
func (c Cluster) Pool(model string) string {
	for _, p := range c.Pools {
		if p.Model == model {
			return p.Name
		}
	}
	return ""
}

// Topology is the default local stack: two regions of two clusters each,
// mixed GPU generations and metric dialects, a couple of LoRA adapters, and
// Qwen3-32B in one cluster only. Costs differ per cluster so cost-first
// routing has something to choose: cluster-a is the cheapest, then
// cluster-b, cluster-c and cluster-d, so traffic stays in the home region
// until both of its clusters are full or down.
//
// The pods are simulated (sim/server); they stand in for GPUs.
func Topology() []Cluster {
	llama := func(name, gpu, engine string, replicas, maxSeqs int, loras ...string) fleet.PodSpec {
		p := fleet.PodSpec{Name: name, Model: "llama-3.1-8b", ServedModelName: LlamaModel, GPU: gpu, Engine: engine,
			MaxNumSeqs: maxSeqs, Replicas: replicas, LoRAModules: loras}
		if len(loras) > 0 {
			p.MaxLoras = len(loras)
		}
		return p
	}
	llamaPool := func(adapters ...string) gateway.PoolConfig {
		return gateway.PoolConfig{Name: "llama", Model: LlamaModel, Adapters: adapters}
	}
	return []Cluster{
		{
			Name: "cluster-a", Region: HomeRegion, Cost: 1.80, Pricing: "spot",
			Pools: []gateway.PoolConfig{llamaPool(SQLLoRA, SupportLoRA)},
			Pods:  []fleet.PodSpec{llama("a-llama-h100", "h100", "vllm", 2, 256, SQLLoRA, SupportLoRA)},
		},
		{
			Name: "cluster-b", Region: HomeRegion, Cost: 2.40, Pricing: "on-demand",
			Pools: []gateway.PoolConfig{llamaPool(SQLLoRA), {Name: "qwen", Model: QwenModel}},
			Pods: []fleet.PodSpec{
				llama("b-llama-a10g", "a10g", "vllm-legacy", 2, 64, SQLLoRA),
				{Name: "b-qwen-a10g-tp4", Model: "qwen3-32b", ServedModelName: QwenModel, GPU: "a10g", TP: 4,
					Engine: "vllm", MaxNumSeqs: 128},
			},
		},
		{
			Name: "cluster-c", Region: FailoverRegion, Cost: 2.70, Pricing: "spot",
			Pools: []gateway.PoolConfig{llamaPool()},
			Pods: []fleet.PodSpec{
				llama("c-llama-l4-sglang", "l4", "sglang", 1, 64),
				llama("c-llama-l4-tgi", "l4", "tgi", 1, 64),
			},
		},
		{
			Name: "cluster-d", Region: FailoverRegion, Cost: 3.10, Pricing: "on-demand",
			Pools: []gateway.PoolConfig{llamaPool(SupportLoRA)},
			Pods: []fleet.PodSpec{
				llama("d-llama-h100", "h100", "vllm", 1, 256, SupportLoRA),
				llama("d-llama-a10g", "a10g", "vllm-legacy", 1, 64, SupportLoRA),
			},
		},
	}
}
