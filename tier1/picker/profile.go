package picker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"gopkg.in/yaml.v3"
)

// Plugin names accepted in a ProfileConfig.
const (
	FilterModel = "model" // base model (and pool) match
	FilterReady = "ready" // pod Ready
	FilterFresh = "fresh" // metrics younger than StaleAfter, if any are
	FilterLoRA  = "lora"  // adapter loaded or loadable

	ScorerQueue            = "queue"
	ScorerKVCache          = "kv-cache"
	ScorerRunning          = "running"
	ScorerLoRAAffinity     = "lora-affinity"
	ScorerPrefix           = "prefix"
	ScorerPredictedLatency = "predicted-latency"
	ScorerSessionBalance   = "session-balance"

	PickerMaxScore   = "max-score"
	PickerRandom     = "random"
	PickerRoundRobin = "round-robin"
)

// Profile bases a YAML profile can start from.
const (
	BaseDefault = "default"
	BaseGIE     = "gie"
	BaseEmpty   = "empty"
)

// ScorerConfig enables one scorer with a weight. Params are the scorer's
// own numeric parameters, written inline next to name and weight in YAML.
type ScorerConfig struct {
	Name    string             `yaml:"name"`              // the scorer (docs/tier1-scheduling.md)
	Weight  float64            `yaml:"weight"`            // its weight in the sum; 0 turns it off
	Enabled *bool              `yaml:"enabled,omitempty"` // false turns the scorer off without removing it; default true
	Params  map[string]float64 `yaml:",inline"`
}

// On reports whether the scorer takes part in scheduling.
func (s ScorerConfig) On() bool {
	return (s.Enabled == nil || *s.Enabled) && s.Weight != 0
}

// SaturationConfig sets the thresholds of the saturation detector.
// Zero fields take GIE's defaults.
type SaturationConfig struct {
	QueueThreshold int     `yaml:"queue_threshold"` // a pod whose effective queue reaches this is saturated; default 5
	KVThreshold    float64 `yaml:"kv_threshold"`    // a pod whose KV-cache usage reaches this is saturated; default 0.8
	// PrefillWait holds requests in the router while every pod has this
	// much prefill queued (SaturationDetector.Busy, ErrBusy); 0 = off.
	// The default profile's is DefaultPrefillWait; GIE's is off.
	PrefillWait time.Duration `yaml:"prefill_wait"`
	// SheddableWait refuses a sheddable request (429) once every pod is
	// saturated or has this much prefill queued; sheddable requests never
	// wait in the router. 0 = PrefillWait, so a sheddable request is not
	// sent to pods that would hold a standard one. Lower sheds batch work
	// sooner to keep the others' TTFT down (docs/tier1-scheduling.md).
	SheddableWait time.Duration `yaml:"sheddable_wait"`
}

// ProfileConfig is one scheduling profile: filters run in order, enabled
// scorers are summed with their weights, one picker chooses.
type ProfileConfig struct {
	// Base names the profile the YAML overrides are merged onto:
	// "default" (when empty), "gie" or "empty". Go callers building a
	// ProfileConfig literal can ignore it.
	Base       string           `yaml:"base,omitempty"`
	Filters    []string         `yaml:"filters"` // run in order; replace the base's
	Scorers    []ScorerConfig   `yaml:"scorers"`
	Picker     string           `yaml:"picker"`      // max-score, random or round-robin
	StaleAfter time.Duration    `yaml:"stale_after"` // metrics older than this are stale
	MaxRanked  int              `yaml:"max_ranked"`  // how many ranked pods a decision keeps for retries; 0 = 5, < 0 = all
	Saturation SaturationConfig `yaml:"saturation"`
	// SpeedPooling (0..1) is the weight of a pod's hardware class in its
	// learned prefill speed: pods with the same GPU and GPUs per pod (both
	// known) use (1−w)·own + w·class mean, so that estimation noise does
	// not make one of several identical pods look twice as fast. 0 keeps
	// each pod's own speed; 1 gives the class one speed, hiding a pod
	// that is really slower. The default profile's is DefaultSpeedPooling.
	SpeedPooling float64 `yaml:"speed_pooling"`
}

// Default values of ProfileConfig fields.
const (
	DefaultStaleAfter     = 500 * time.Millisecond
	GIEStaleAfter         = 200 * time.Millisecond
	DefaultMaxRanked      = 5
	DefaultQueueThreshold = 5
	DefaultKVThreshold    = 0.8
	// DefaultPrefillWait is the default profile's saturation.prefill_wait,
	// chosen with the routing benchmark on its training seeds
	// (docs/benchmarks.md, "Admission order and holding").
	DefaultPrefillWait = 250 * time.Millisecond
	// DefaultSpeedPooling is the default profile's speed_pooling, chosen
	// with the routing benchmark on its training seeds (docs/benchmarks.md,
	// "Pooled prefill speeds").
	DefaultSpeedPooling = 0.5
)

// DefaultProfile is infergate's default: every filter, GIE's three scorers
// at GIE's weights plus running requests, LoRA affinity and predicted
// latency. The extra weights were chosen with the routing benchmark
// (docs/tier1-scheduling.md#how-the-default-weights-were-chosen):
// predicted latency 5 cut the bursty and trace tails, LoRA affinity 4 keeps
// adapter placement ahead of it on many-lora, running 0.5 and the prefix
// guard (its default parameters) were kept because changing them helped no
// scenario beyond its CI and disabling the guard hurt multi-turn chat.
// It holds requests in the router while every pod has DefaultPrefillWait
// of prefill queued, which cut bursty-70b's P99 TTFT by ~14%.
func DefaultProfile() ProfileConfig {
	return ProfileConfig{
		Base:    BaseDefault,
		Filters: []string{FilterModel, FilterReady, FilterFresh, FilterLoRA},
		Scorers: []ScorerConfig{
			{Name: ScorerQueue, Weight: 2},
			{Name: ScorerKVCache, Weight: 2},
			{Name: ScorerPrefix, Weight: 3},
			{Name: ScorerRunning, Weight: 0.5},
			{Name: ScorerLoRAAffinity, Weight: 4},
			{Name: ScorerPredictedLatency, Weight: 5},
			{Name: ScorerSessionBalance, Weight: 8},
		},
		Picker:       PickerMaxScore,
		StaleAfter:   DefaultStaleAfter,
		MaxRanked:    DefaultMaxRanked,
		Saturation:   SaturationConfig{QueueThreshold: DefaultQueueThreshold, KVThreshold: DefaultKVThreshold, PrefillWait: DefaultPrefillWait},
		SpeedPooling: DefaultSpeedPooling,
	}
}

// GIEDefaultProfile mirrors GIE v1.5's default profile: queue 2, kv-cache 2,
// prefix 3, no guard against hot prefixes, no stale-pod filter (GIE's
// scheduler trusts stale metrics; only its saturation detector does not).
func GIEDefaultProfile() ProfileConfig {
	return ProfileConfig{
		Base:    BaseGIE,
		Filters: []string{FilterModel, FilterReady, FilterLoRA},
		Scorers: []ScorerConfig{
			{Name: ScorerQueue, Weight: 2},
			{Name: ScorerKVCache, Weight: 2},
			{Name: ScorerPrefix, Weight: 3, Params: map[string]float64{
				ParamGuardDiscount: 1, ParamShortPromptBlocks: 0,
			}},
		},
		Picker:     PickerMaxScore,
		StaleAfter: GIEStaleAfter,
		MaxRanked:  DefaultMaxRanked,
		Saturation: SaturationConfig{QueueThreshold: DefaultQueueThreshold, KVThreshold: DefaultKVThreshold},
	}
}

// RoundRobinProfile is the Kubernetes-Service baseline: model and ready
// filters, no scorers, round-robin picker.
func RoundRobinProfile() ProfileConfig {
	return ProfileConfig{
		Base:       BaseEmpty,
		Filters:    []string{FilterModel, FilterReady},
		Picker:     PickerRoundRobin,
		StaleAfter: DefaultStaleAfter,
		MaxRanked:  DefaultMaxRanked,
	}
}

// Clone returns a deep copy, so edits do not alias the receiver's slices.
func (c ProfileConfig) Clone() ProfileConfig {
	c.Filters = slices.Clone(c.Filters)
	c.Scorers = slices.Clone(c.Scorers)
	for i := range c.Scorers {
		if p := c.Scorers[i].Params; p != nil {
			m := make(map[string]float64, len(p))
			for k, v := range p {
				m[k] = v
			}
			c.Scorers[i].Params = m
		}
		if e := c.Scorers[i].Enabled; e != nil {
			v := *e
			c.Scorers[i].Enabled = &v
		}
	}
	return c
}

// WithWeight returns a copy with scorer name's weight set to w (enabling it,
// or appending it if absent). w = 0 disables it.
func (c ProfileConfig) WithWeight(name string, w float64) ProfileConfig {
	c = c.Clone()
	for i := range c.Scorers {
		if c.Scorers[i].Name == name {
			c.Scorers[i].Weight = w
			c.Scorers[i].Enabled = nil
			return c
		}
	}
	c.Scorers = append(c.Scorers, ScorerConfig{Name: name, Weight: w})
	return c
}

// WithParam returns a copy with one parameter of scorer name set (appending
// the scorer with weight 0, i.e. off, if absent).
func (c ProfileConfig) WithParam(name, param string, v float64) ProfileConfig {
	c = c.Clone()
	for i := range c.Scorers {
		if c.Scorers[i].Name == name {
			if c.Scorers[i].Params == nil {
				c.Scorers[i].Params = map[string]float64{}
			}
			c.Scorers[i].Params[param] = v
			return c
		}
	}
	c.Scorers = append(c.Scorers, ScorerConfig{Name: name, Params: map[string]float64{param: v}})
	return c
}

// Weight returns the effective weight of scorer name (0 when off or absent).
func (c ProfileConfig) Weight(name string) float64 {
	for _, s := range c.Scorers {
		if s.Name == name && s.On() {
			return s.Weight
		}
	}
	return 0
}

// SetDefaults fills zero fields.
func (c *ProfileConfig) SetDefaults() {
	if c.Picker == "" {
		c.Picker = PickerMaxScore
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.MaxRanked == 0 {
		c.MaxRanked = DefaultMaxRanked
	}
	if c.Saturation.QueueThreshold == 0 {
		c.Saturation.QueueThreshold = DefaultQueueThreshold
	}
	if c.Saturation.KVThreshold == 0 {
		c.Saturation.KVThreshold = DefaultKVThreshold
	}
}

// Validate reports unknown plugin names and parameters, negative weights
// and duplicate scorers. Errors name the offending plugin.
func (c *ProfileConfig) Validate() error {
	var errs []error
	for _, f := range c.Filters {
		if _, ok := filterFactories[f]; !ok {
			errs = append(errs, fmt.Errorf("unknown filter %q (known: %s, %s, %s, %s)", f, FilterModel, FilterReady, FilterFresh, FilterLoRA))
		}
	}
	seen := map[string]bool{}
	for _, s := range c.Scorers {
		spec, ok := scorerSpecs[s.Name]
		if !ok {
			errs = append(errs, fmt.Errorf("unknown scorer %q (known: %s)", s.Name, knownScorers()))
			continue
		}
		if seen[s.Name] {
			errs = append(errs, fmt.Errorf("scorer %q listed twice", s.Name))
		}
		seen[s.Name] = true
		if s.Weight < 0 {
			errs = append(errs, fmt.Errorf("scorer %q: weight %v is negative", s.Name, s.Weight))
		}
		for p := range s.Params {
			if _, ok := spec.params[p]; !ok {
				errs = append(errs, fmt.Errorf("scorer %q: unknown parameter %q", s.Name, p))
			}
		}
		if v, ok := s.Params[ParamKVFull]; ok && !(v >= 0 && v <= 1) {
			errs = append(errs, fmt.Errorf("scorer %q: %s %v must be in [0, 1]", s.Name, ParamKVFull, v))
		}
		if v, ok := s.Params[ParamKVFullWaitMs]; ok && !(v >= 0) {
			errs = append(errs, fmt.Errorf("scorer %q: %s %v must not be negative", s.Name, ParamKVFullWaitMs, v))
		}
	}
	if _, ok := pickerFactories[c.Picker]; !ok && c.Picker != "" {
		errs = append(errs, fmt.Errorf("unknown picker %q (known: %s, %s, %s)", c.Picker, PickerMaxScore, PickerRandom, PickerRoundRobin))
	}
	if c.StaleAfter < 0 {
		errs = append(errs, fmt.Errorf("stale_after %v is negative", c.StaleAfter))
	}
	if c.Saturation.QueueThreshold < 0 || c.Saturation.KVThreshold < 0 || c.Saturation.PrefillWait < 0 || c.Saturation.SheddableWait < 0 {
		errs = append(errs, errors.New("saturation thresholds must not be negative"))
	}
	if !(c.SpeedPooling >= 0 && c.SpeedPooling <= 1) {
		errs = append(errs, fmt.Errorf("speed_pooling %v must be in [0, 1]", c.SpeedPooling))
	}
	return errors.Join(errs...)
}

// profileOverlay is the YAML shape: every field optional so that what is
// absent keeps the base's value.
type profileOverlay struct {
	Base       string             `yaml:"base"`
	Filters    *[]string          `yaml:"filters"`
	Scorers    []scorerOverlay    `yaml:"scorers"`
	Picker     string             `yaml:"picker"`
	StaleAfter *time.Duration     `yaml:"stale_after"`
	MaxRanked  *int               `yaml:"max_ranked"`
	Saturation *saturationOverlay `yaml:"saturation"`
	// SpeedPooling is a pointer so that 0 turns the default's pooling off.
	SpeedPooling *float64 `yaml:"speed_pooling"`
}

// saturationOverlay is SaturationConfig's YAML shape: prefill_wait is a
// pointer so that 0 turns the default profile's holding off.
type saturationOverlay struct {
	QueueThreshold int            `yaml:"queue_threshold"`
	KVThreshold    float64        `yaml:"kv_threshold"`
	PrefillWait    *time.Duration `yaml:"prefill_wait"`
	SheddableWait  *time.Duration `yaml:"sheddable_wait"`
}

type scorerOverlay struct {
	Name    string             `yaml:"name"`
	Weight  *float64           `yaml:"weight"`
	Enabled *bool              `yaml:"enabled"`
	Params  map[string]float64 `yaml:",inline"`
}

// UnmarshalYAML merges the YAML onto the base profile it names (default
// when absent): filters and picker replace the base's when given; scorers
// are merged by name (weight, enabled and parameters override; new names
// are appended). Unknown keys are errors.
func (c *ProfileConfig) UnmarshalYAML(n *yaml.Node) error {
	// yaml.v3 does not pass KnownFields down to custom unmarshalers, so
	// re-decode strictly.
	raw, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	var o profileOverlay
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&o); err != nil {
		return fmt.Errorf("profile at line %d: %w", n.Line, err)
	}
	var base ProfileConfig
	switch o.Base {
	case "", BaseDefault:
		base = DefaultProfile()
	case BaseGIE:
		base = GIEDefaultProfile()
	case BaseEmpty:
		base = ProfileConfig{Base: BaseEmpty}
	default:
		return fmt.Errorf("profile at line %d: unknown base %q (known: %s, %s, %s)", n.Line, o.Base, BaseDefault, BaseGIE, BaseEmpty)
	}
	if o.Filters != nil {
		base.Filters = *o.Filters
	}
	if o.Picker != "" {
		base.Picker = o.Picker
	}
	if o.StaleAfter != nil {
		base.StaleAfter = *o.StaleAfter
	}
	if o.MaxRanked != nil {
		base.MaxRanked = *o.MaxRanked
	}
	if o.Saturation != nil {
		if o.Saturation.QueueThreshold != 0 {
			base.Saturation.QueueThreshold = o.Saturation.QueueThreshold
		}
		if o.Saturation.KVThreshold != 0 {
			base.Saturation.KVThreshold = o.Saturation.KVThreshold
		}
		if o.Saturation.PrefillWait != nil {
			base.Saturation.PrefillWait = *o.Saturation.PrefillWait
		}
		if o.Saturation.SheddableWait != nil {
			base.Saturation.SheddableWait = *o.Saturation.SheddableWait
		}
	}
	if o.SpeedPooling != nil {
		base.SpeedPooling = *o.SpeedPooling
	}
	for _, so := range o.Scorers {
		i := slices.IndexFunc(base.Scorers, func(s ScorerConfig) bool { return s.Name == so.Name })
		if i < 0 {
			base.Scorers = append(base.Scorers, ScorerConfig{Name: so.Name})
			i = len(base.Scorers) - 1
		}
		s := &base.Scorers[i]
		if so.Weight != nil {
			s.Weight = *so.Weight
		}
		if so.Enabled != nil {
			v := *so.Enabled
			s.Enabled = &v
		}
		for k, v := range so.Params {
			if s.Params == nil {
				s.Params = map[string]float64{}
			}
			s.Params[k] = v
		}
	}
	*c = base
	return nil
}

// ParseProfile decodes a profile YAML document (merged onto its base),
// applies defaults and validates it. name is used in errors.
func ParseProfile(name string, data []byte) (ProfileConfig, error) {
	var c ProfileConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		if !errors.Is(err, io.EOF) {
			return ProfileConfig{}, fmt.Errorf("%s: %w", name, err)
		}
		c = DefaultProfile()
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return ProfileConfig{}, fmt.Errorf("%s: invalid profile: %w", name, err)
	}
	return c, nil
}
