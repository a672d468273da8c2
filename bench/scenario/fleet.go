package scenario

import (
	"errors"
	"fmt"
	"time"

	"github.com/infergate/infergate/shared/config"
)

// PodGroup is Count identical pods.
type PodGroup struct {
	GPU            string `yaml:"gpu"` // sim/profile GPU name
	Count          int    `yaml:"count"`
	TensorParallel int    `yaml:"tensor_parallel"` // 0 means 1
	MaxNumSeqs     int    `yaml:"max_num_seqs"`    // 0 means the engine default
	MaxLoras       int    `yaml:"max_loras"`       // adapter slots, 0 = no LoRA
	// MaxBatchedTokens is vLLM's --max-num-batched-tokens, the token
	// budget of one step (0 means the engine default: 8192, or 2048 on
	// GPUs under 70 GB and on A100s).
	MaxBatchedTokens int `yaml:"max_num_batched_tokens"`
}

// Fleet is the simulated pool: one base model on groups of pods. It is also
// the --fleet YAML file for trace runs.
type Fleet struct {
	Model    string     `yaml:"model"` // sim/profile model name
	Pods     []PodGroup `yaml:"pods"`
	Adapters []string   `yaml:"adapters"` // LoRA adapters requests may name
	// TTFTSLO is the goodput objective; 0 means 2 s.
	TTFTSLO time.Duration `yaml:"ttft_slo"`
	// Noise is engine noise the pods have on top of the run's realism
	// knobs (which cannot turn it off: it is the pods' own). Zero: none.
	Noise Noise `yaml:"noise"`
}

// Noise is heavy-tailed engine noise (sim/engine Config's fields of the
// same meaning): what a router's estimates must hold under when the
// engine's timing is not the tidy one they were written for.
type Noise struct {
	// StepJitter is σ of each step's mean-one lognormal time factor; it
	// replaces the realism's when larger.
	StepJitter float64 `yaml:"step_jitter"`
	// StallProb is the probability that a step also stalls, for a
	// Pareto-tailed time of mean StallMean (0: 20 ms).
	StallProb float64       `yaml:"stall_prob"`
	StallMean time.Duration `yaml:"stall_mean"`
	// PrefillNoise is σ of a per-request mean-one lognormal factor on the
	// compute of its prompt.
	PrefillNoise float64 `yaml:"prefill_noise"`
}

// SetDefaults implements config.Defaulter.
func (f *Fleet) SetDefaults() {
	for i := range f.Pods {
		if f.Pods[i].TensorParallel == 0 {
			f.Pods[i].TensorParallel = 1
		}
	}
	if f.TTFTSLO == 0 {
		f.TTFTSLO = 2 * time.Second
	}
}

// Validate implements config.Validator.
func (f *Fleet) Validate() error {
	var errs []error
	if f.Model == "" {
		errs = append(errs, errors.New("model is required"))
	}
	if len(f.Pods) == 0 {
		errs = append(errs, errors.New("pods: at least one group is required"))
	}
	for i, g := range f.Pods {
		if g.GPU == "" {
			errs = append(errs, fmt.Errorf("pods[%d].gpu is required", i))
		}
		if g.Count < 1 {
			errs = append(errs, fmt.Errorf("pods[%d].count must be ≥ 1", i))
		}
		if g.TensorParallel < 1 || g.MaxNumSeqs < 0 || g.MaxLoras < 0 || g.MaxBatchedTokens < 0 {
			errs = append(errs, fmt.Errorf("pods[%d]: tensor_parallel must be ≥ 1, max_num_seqs, max_loras and max_num_batched_tokens ≥ 0", i))
		}
	}
	if n := f.Noise; !(n.StepJitter >= 0 && n.StepJitter <= 1) || !(n.StallProb >= 0 && n.StallProb <= 1) || n.StallMean < 0 || !(n.PrefillNoise >= 0 && n.PrefillNoise <= 2) {
		errs = append(errs, errors.New("noise: step_jitter and stall_prob must be in [0, 1], stall_mean ≥ 0, prefill_noise in [0, 2]"))
	}
	return errors.Join(errs...)
}

// Size is the number of pods.
func (f Fleet) Size() int {
	n := 0
	for _, g := range f.Pods {
		n += g.Count
	}
	return n
}

// LoadFleet reads a fleet YAML file strictly.
func LoadFleet(path string) (Fleet, error) {
	var f Fleet
	if err := config.Load(path, &f); err != nil {
		return Fleet{}, fmt.Errorf("fleet: %w", err)
	}
	return f, nil
}
