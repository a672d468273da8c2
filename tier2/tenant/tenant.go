// Package tenant holds Tier 2's tenants, their API keys and limits, and the
// per-cluster overrides set through the admin API. A Store keeps them in
// memory (single replica) or in Redis (shared by every Tier 2 replica, with a
// local cache so authentication never waits for Redis).
package tenant

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"time"
	"unicode"
	"unicode/utf8"
)

// Policy says how Tier 2 picks a cluster for a tenant's requests.
type Policy string

// Routing policies.
const (
	PolicyCostFirst    Policy = "cost-first"
	PolicyLatencyFirst Policy = "latency-first"
	PolicyRegionPinned Policy = "region-pinned"
)

// Budget periods.
const (
	PeriodDay   = "day"
	PeriodMonth = "month"
)

// Limits caps a tenant's (or one model's) use. Zero means unlimited.
type Limits struct {
	RPM          int    `json:"rpm,omitempty" yaml:"rpm"`                     // requests per minute
	TPM          int    `json:"tpm,omitempty" yaml:"tpm"`                     // tokens (prompt + completion) per minute
	Concurrent   int    `json:"concurrent,omitempty" yaml:"concurrent"`       // requests in flight at once
	TokenBudget  int64  `json:"token_budget,omitempty" yaml:"token_budget"`   // tokens per budget period
	BudgetPeriod string `json:"budget_period,omitempty" yaml:"budget_period"` // day, or month (the default with a budget)
}

// IsZero reports whether no limit is set.
func (l Limits) IsZero() bool {
	return l.RPM == 0 && l.TPM == 0 && l.Concurrent == 0 && l.TokenBudget == 0
}

// Tenant is one customer of the gateway.
type Tenant struct {
	ID          string            `json:"id" yaml:"id"`                   // required, unique: letters, digits, . _ -
	Name        string            `json:"name,omitempty" yaml:"name"`     // display name
	Policy      Policy            `json:"policy,omitempty" yaml:"policy"` // cost-first (default), latency-first or region-pinned
	Region      string            `json:"region,omitempty" yaml:"region"` // home region; the only one with region-pinned
	Limits      Limits            `json:"limits" yaml:"limits"`
	ModelLimits map[string]Limits `json:"model_limits,omitempty" yaml:"model_limits"` // by model name; a base model's cover its adapters
	Disabled    bool              `json:"disabled,omitempty" yaml:"disabled"`         // refuse its keys (403)
}

// ClusterOverride is an operator's manual adjustment of one cluster: drain
// it, or replace its routing weight or cost. Nil pointers leave the
// discovered value alone.
type ClusterOverride struct {
	Drain  bool     `json:"drain"`
	Weight *float64 `json:"weight,omitempty"`
	Cost   *float64 `json:"cost,omitempty"`
}

// KeyInfo describes an API key without its secret.
type KeyInfo struct {
	ID       string    `json:"id"`
	TenantID string    `json:"tenant_id"`
	Name     string    `json:"name,omitempty"`
	Prefix   string    `json:"prefix"`
	Created  time.Time `json:"created"`
}

// Errors returned by the store and the authenticator.
var (
	ErrNotFound        = errors.New("tenant: not found")
	ErrExists          = errors.New("tenant: already exists")
	ErrUnauthenticated = errors.New("tenant: unauthenticated")
	// ErrUnavailable is wrapped by store errors caused by the backend (Redis)
	// being unreachable or unable to serve: the write did not happen, or
	// did but could not be read back, and may be retried later.
	ErrUnavailable = errors.New("tenant: store unavailable")
	// ErrDisabled wraps ErrUnauthenticated so callers that only check the
	// latter still reject; callers that care can answer 403 instead of 401.
	ErrDisabled = fmt.Errorf("%w: tenant disabled", ErrUnauthenticated)
)

// FieldError is a validation error naming the offending field, so the admin
// API can answer 400 with the field in "param".
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

var idRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

// ValidID reports whether s can name a tenant or a cluster. The character
// set keeps IDs safe inside Redis key names and hash tags.
func ValidID(s string) bool { return idRE.MatchString(s) }

// MaxNameLen bounds free-form names (a tenant's display name and region, an
// API key's name) in characters; MaxModelLen bounds a model name in
// model_limits. Names are stored in Redis and echoed in every listing, so an
// unbounded one (a 1 MB name was once accepted) costs every reader.
const (
	MaxNameLen  = 128
	MaxModelLen = 256
)

// ValidName reports whether s is a usable free-form name: valid UTF-8, at
// most max characters, and no control or format characters (which would
// break log lines and terminals).
func ValidName(s string, max int) bool {
	if !utf8.ValidString(s) || utf8.RuneCountInString(s) > max {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return false
		}
	}
	return true
}

// Normalize fills defaults (policy cost-first, budget period month).
func (t *Tenant) Normalize() {
	if t.Policy == "" {
		t.Policy = PolicyCostFirst
	}
	normLimits(&t.Limits)
	for m, l := range t.ModelLimits {
		normLimits(&l)
		t.ModelLimits[m] = l
	}
}

func normLimits(l *Limits) {
	if l.TokenBudget > 0 && l.BudgetPeriod == "" {
		l.BudgetPeriod = PeriodMonth
	}
}

// Validate checks the tenant after Normalize.
func (t *Tenant) Validate() error {
	if !ValidID(t.ID) {
		return &FieldError{"id", "must match " + idRE.String()}
	}
	if !ValidName(t.Name, MaxNameLen) {
		return &FieldError{"name", fmt.Sprintf("at most %d characters, no control characters", MaxNameLen)}
	}
	if !ValidName(t.Region, MaxNameLen) {
		return &FieldError{"region", fmt.Sprintf("at most %d characters, no control characters", MaxNameLen)}
	}
	switch t.Policy {
	case PolicyCostFirst, PolicyLatencyFirst:
	case PolicyRegionPinned:
		if t.Region == "" {
			return &FieldError{"region", "required when policy is region-pinned"}
		}
	default:
		return &FieldError{"policy", fmt.Sprintf("unknown policy %q (want cost-first, latency-first or region-pinned)", t.Policy)}
	}
	if err := t.Limits.Validate("limits"); err != nil {
		return err
	}
	models := make([]string, 0, len(t.ModelLimits))
	for m := range t.ModelLimits {
		models = append(models, m)
	}
	sort.Strings(models)
	for _, m := range models {
		if m == "" {
			return &FieldError{"model_limits", "empty model name"}
		}
		if !ValidName(m, MaxModelLen) {
			return &FieldError{"model_limits", fmt.Sprintf("model name: at most %d characters, no control characters", MaxModelLen)}
		}
		if err := t.ModelLimits[m].Validate("model_limits." + m); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks the limits; prefix names the field in errors.
func (l Limits) Validate(prefix string) error {
	switch {
	case l.RPM < 0:
		return &FieldError{prefix + ".rpm", "must be >= 0"}
	case l.TPM < 0:
		return &FieldError{prefix + ".tpm", "must be >= 0"}
	case l.Concurrent < 0:
		return &FieldError{prefix + ".concurrent", "must be >= 0"}
	case l.TokenBudget < 0:
		return &FieldError{prefix + ".token_budget", "must be >= 0"}
	}
	switch l.BudgetPeriod {
	case "", PeriodDay, PeriodMonth:
	default:
		return &FieldError{prefix + ".budget_period", `must be "day" or "month"`}
	}
	return nil
}

// Validate checks an override.
func (o ClusterOverride) Validate() error {
	if o.Weight != nil && *o.Weight < 0 {
		return &FieldError{"weight", "must be >= 0"}
	}
	if o.Cost != nil && *o.Cost < 0 {
		return &FieldError{"cost", "must be >= 0"}
	}
	return nil
}

// Clone returns a deep copy so cached tenants are never shared mutably.
func (t *Tenant) Clone() *Tenant {
	c := *t
	if t.ModelLimits != nil {
		c.ModelLimits = make(map[string]Limits, len(t.ModelLimits))
		for k, v := range t.ModelLimits {
			c.ModelLimits[k] = v
		}
	}
	return &c
}
