package tenant

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/shared/config"
)

// Options configure a Store.
type Options struct {
	// Redis shares tenants between replicas. Nil keeps them in memory,
	// which is only right for a single replica.
	Redis redis.UniversalClient
	// KeyPrefix starts every Redis key and channel. Default "infergate:".
	KeyPrefix string
	// ReloadInterval is how often a replica checks Redis for changes it may
	// have missed on pub/sub. Default 500ms, so a change is seen within 1s
	// even if the invalidation message is lost.
	ReloadInterval time.Duration
	// Timeout bounds each Redis call made by the store. Default 2s.
	Timeout time.Duration
	// Seed tenants are created at New when absent (e.g. from the config
	// file), and again whenever Redis comes back without them (see Reload).
	// Existing tenants are never overwritten.
	Seed []Tenant
	// SeedKeys are API keys created when absent, like Seed.
	SeedKeys []SeedKey
	Logger   *slog.Logger
}

// SeedKey is an API key given in configuration. Either Key (the raw key,
// hashed before it is stored) or SHA256 (hex of the key's SHA-256) is set.
type SeedKey struct {
	TenantID string `yaml:"tenant"` // the tenant's id; required
	Name     string `yaml:"name"`   // a label for the key
	Key      string `yaml:"key"`    // the raw key, hashed before it is stored
	SHA256   string `yaml:"sha256"` // or the hex SHA-256 of the key
}

func (o *Options) setDefaults() {
	config.Default(&o.KeyPrefix, "infergate:")
	config.Default(&o.ReloadInterval, 500*time.Millisecond)
	config.Default(&o.Timeout, 2*time.Second)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// keyRecord is what is stored for an API key: never the key itself.
type keyRecord struct {
	KeyInfo
	Hash string `json:"sha256"` // hex SHA-256 of the full key
}

// snapshot is an immutable view of everything the request path reads.
type snapshot struct {
	version   int64
	tenants   map[string]*Tenant
	keys      map[string]keyRecord // by key ID
	overrides map[string]ClusterOverride
}

func emptySnapshot() *snapshot {
	return &snapshot{tenants: map[string]*Tenant{}, keys: map[string]keyRecord{}, overrides: map[string]ClusterOverride{}}
}

// backend persists tenants. Reads on the request path use the snapshot only.
type backend interface {
	load(ctx context.Context) (*snapshot, error)
	version(ctx context.Context) (int64, error)
	putTenant(ctx context.Context, t *Tenant, create bool) error
	deleteTenant(ctx context.Context, id string) error
	putKey(ctx context.Context, rec keyRecord, onlyIfAbsent bool) error
	deleteKey(ctx context.Context, tenantID, keyID string) error
	putOverride(ctx context.Context, name string, o ClusterOverride) error
	deleteOverride(ctx context.Context, name string) error
	// watch delivers a value whenever another replica changed something; it
	// returns when ctx ends.
	watch(ctx context.Context, changed chan<- struct{})
}

// Store holds tenants, keys and overrides, cached locally.
type Store struct {
	opts   Options
	be     backend
	snap   atomic.Pointer[snapshot]
	reload sync.Mutex // serializes loads so an older load never replaces a newer one

	seedTenants []*Tenant   // Options.Seed, normalized
	seedKeys    []keyRecord // Options.SeedKeys as stored

	cancel context.CancelFunc
	done   chan struct{}
}

// New opens a Store, loads it, applies the seed, and (with Redis) starts
// watching for changes made by other replicas. Call Close when done.
func New(ctx context.Context, opts Options) (*Store, error) {
	opts.setDefaults()
	s := &Store{opts: opts, done: make(chan struct{})}
	if err := s.prepareSeeds(); err != nil {
		return nil, err
	}
	if opts.Redis != nil {
		s.be = newRedisBackend(opts)
	} else {
		s.be = newMemBackend()
	}
	s.snap.Store(emptySnapshot())
	if err := s.load(ctx, true); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.run(wctx)
	return s, nil
}

// Close stops watching Redis.
func (s *Store) Close() error {
	s.cancel()
	<-s.done
	return nil
}

// prepareSeeds validates the seed tenants and turns the seed keys into
// the records stored for them, once, so a later re-seed cannot fail on
// the configuration.
func (s *Store) prepareSeeds() error {
	for _, t := range s.opts.Seed {
		t := t.Clone()
		t.Normalize()
		if err := t.Validate(); err != nil {
			return fmt.Errorf("seed tenant %q: %w", t.ID, err)
		}
		s.seedTenants = append(s.seedTenants, t)
	}
	for i, k := range s.opts.SeedKeys {
		sum := k.SHA256
		if k.Key != "" {
			h := sha256.Sum256([]byte(k.Key))
			sum = hex.EncodeToString(h[:])
		}
		if b, err := hex.DecodeString(sum); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("seed key %d: need key or a hex sha256", i)
		}
		// Seeded keys are identified by their hash, so restarts and other
		// replicas seed the same record instead of duplicates.
		id := "seed" + sum[:8]
		s.seedKeys = append(s.seedKeys, keyRecord{KeyInfo: KeyInfo{ID: id, TenantID: k.TenantID, Name: k.Name, Prefix: "seed:" + sum[:8]}, Hash: sum})
	}
	return nil
}

// applySeeds creates the seed tenants and keys missing from snap, never
// touching ones that exist (an admin may have changed them). initial is
// New's call, where a key naming an unknown tenant is a configuration
// error; on a later re-seed that key is skipped and logged instead. It
// reports whether it wrote anything.
func (s *Store) applySeeds(ctx context.Context, snap *snapshot, initial bool) (bool, error) {
	wrote := false
	present := make(map[string]bool, len(snap.tenants)+len(s.seedTenants))
	for id := range snap.tenants {
		present[id] = true
	}
	for _, t := range s.seedTenants {
		if present[t.ID] {
			continue
		}
		err := s.be.putTenant(ctx, t, true)
		if err != nil && !errors.Is(err, ErrExists) {
			return wrote, fmt.Errorf("seed tenant %q: %w", t.ID, err)
		}
		wrote = wrote || err == nil
		present[t.ID] = true
	}
	for i, rec := range s.seedKeys {
		if _, ok := snap.keys[rec.ID]; ok {
			continue
		}
		if !present[rec.TenantID] {
			if initial {
				return wrote, fmt.Errorf("seed key %d: tenant %q: %w", i, rec.TenantID, ErrNotFound)
			}
			s.opts.Logger.Warn("tenant store: not re-seeding a key whose tenant is gone", "key", rec.Prefix, "tenant", rec.TenantID)
			continue
		}
		rec.Created = time.Now().UTC()
		if err := s.be.putKey(ctx, rec, true); err != nil {
			return wrote, fmt.Errorf("seed key %d: %w", i, err)
		}
		wrote = true
	}
	return wrote, nil
}

func (s *Store) run(ctx context.Context) {
	defer close(s.done)
	changed := make(chan struct{}, 1)
	go s.be.watch(ctx, changed)
	tick := time.NewTicker(s.opts.ReloadInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			s.reloadLogged(ctx, true)
		case <-tick.C:
			s.reloadLogged(ctx, false)
		}
	}
}

func (s *Store) reloadLogged(ctx context.Context, force bool) {
	if !force {
		cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
		v, err := s.be.version(cctx)
		cancel()
		if err != nil {
			s.opts.Logger.Warn("tenant store: version check failed; keeping cached tenants", "err", err)
			return
		}
		if v == s.snap.Load().version {
			return
		}
	}
	if err := s.Reload(ctx); err != nil && ctx.Err() == nil {
		s.opts.Logger.Warn("tenant store: reload failed; keeping cached tenants", "err", err)
	}
}

// Reload replaces the local cache with the backend's state now.
//
// When the backend looks reset — its change counter is gone or went
// backwards, as after a Redis restart without persistence or a restore
// from an older snapshot — the configured seed tenants and keys that are
// missing are created again first, so configured keys keep working without
// a Tier 2 restart. A tenant or key deleted through the admin API bumps the
// counter instead, so it stays deleted (until the next restart seeds it).
func (s *Store) Reload(ctx context.Context) error {
	return s.load(ctx, false)
}

func (s *Store) load(ctx context.Context, initial bool) error {
	s.reload.Lock()
	defer s.reload.Unlock()
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	snap, err := s.be.load(cctx)
	if err != nil {
		return fmt.Errorf("tenant store: load: %w", err)
	}
	prev := s.snap.Load()
	if reset := snap.version == 0 || snap.version < prev.version; initial || reset {
		wrote, err := s.applySeeds(cctx, snap, initial)
		if err != nil {
			if initial {
				return err
			}
			// Keep the new view anyway: it is what Redis holds, and the
			// next reload tries the seeds again.
			s.opts.Logger.Warn("tenant store: re-seeding failed", "err", err)
		}
		if wrote {
			if !initial {
				s.opts.Logger.Warn("tenant store: redis lost the seeded tenants or keys; re-created them", "version", snap.version, "was", prev.version)
			}
			if snap, err = s.be.load(cctx); err != nil {
				return fmt.Errorf("tenant store: load: %w", err)
			}
		}
	}
	s.snap.Store(snap)
	return nil
}

// callCtx bounds one write to the backend by Options.Timeout.
func (s *Store) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.Timeout)
}

// Version is the change counter of the cached state; it grows on every write.
func (s *Store) Version() int64 { return s.snap.Load().version }

// Tenant returns a copy of the cached tenant.
func (s *Store) Tenant(id string) (*Tenant, bool) {
	t, ok := s.snap.Load().tenants[id]
	if !ok {
		return nil, false
	}
	return t.Clone(), true
}

// Tenants returns copies of all cached tenants sorted by ID.
func (s *Store) Tenants() []*Tenant {
	snap := s.snap.Load()
	out := make([]*Tenant, 0, len(snap.tenants))
	for _, t := range snap.tenants {
		out = append(out, t.Clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Overrides returns a copy of the cluster overrides by cluster name.
func (s *Store) Overrides() map[string]ClusterOverride {
	snap := s.snap.Load()
	out := make(map[string]ClusterOverride, len(snap.overrides))
	for k, v := range snap.overrides {
		out[k] = v
	}
	return out
}

// CreateTenant adds a tenant; ErrExists if the ID is taken.
func (s *Store) CreateTenant(ctx context.Context, t Tenant) error {
	return s.putTenant(ctx, t, true)
}

// UpdateTenant replaces a tenant; ErrNotFound if absent.
func (s *Store) UpdateTenant(ctx context.Context, t Tenant) error {
	return s.putTenant(ctx, t, false)
}

func (s *Store) putTenant(ctx context.Context, t Tenant, create bool) error {
	tt := t.Clone()
	tt.Normalize()
	if err := tt.Validate(); err != nil {
		return err
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	if err := s.be.putTenant(cctx, tt, create); err != nil {
		return err
	}
	return s.Reload(ctx)
}

// DeleteTenant removes a tenant and its API keys.
func (s *Store) DeleteTenant(ctx context.Context, id string) error {
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	if err := s.be.deleteTenant(cctx, id); err != nil {
		return err
	}
	return s.Reload(ctx)
}

const keyPrefix = "ig-"

// CreateKey makes a new API key for a tenant. The raw key is returned once;
// only its SHA-256 is stored.
func (s *Store) CreateKey(ctx context.Context, tenantID, name string) (string, KeyInfo, error) {
	if !ValidName(name, MaxNameLen) {
		return "", KeyInfo{}, &FieldError{"name", fmt.Sprintf("at most %d characters, no control characters", MaxNameLen)}
	}
	if _, ok := s.Tenant(tenantID); !ok {
		if err := s.Reload(ctx); err != nil {
			return "", KeyInfo{}, err
		}
		if _, ok := s.Tenant(tenantID); !ok {
			return "", KeyInfo{}, ErrNotFound
		}
	}
	var idb [6]byte
	var secret [32]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return "", KeyInfo{}, fmt.Errorf("tenant: random key id: %w", err)
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", KeyInfo{}, fmt.Errorf("tenant: random key: %w", err)
	}
	id := hex.EncodeToString(idb[:])
	raw := keyPrefix + id + "-" + base64.RawURLEncoding.EncodeToString(secret[:])
	sum := sha256.Sum256([]byte(raw))
	rec := keyRecord{
		KeyInfo: KeyInfo{ID: id, TenantID: tenantID, Name: name, Prefix: keyPrefix + id, Created: time.Now().UTC().Truncate(time.Second)},
		Hash:    hex.EncodeToString(sum[:]),
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	if err := s.be.putKey(cctx, rec, false); err != nil {
		return "", KeyInfo{}, err
	}
	if err := s.Reload(ctx); err != nil {
		return "", KeyInfo{}, err
	}
	return raw, rec.KeyInfo, nil
}

// Keys lists a tenant's keys (prefixes only) from the cache.
func (s *Store) Keys(tenantID string) []KeyInfo {
	var out []KeyInfo
	for _, k := range s.snap.Load().keys {
		if k.TenantID == tenantID {
			out = append(out, k.KeyInfo)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// DeleteKey revokes one key of a tenant.
func (s *Store) DeleteKey(ctx context.Context, tenantID, keyID string) error {
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	if err := s.be.deleteKey(cctx, tenantID, keyID); err != nil {
		return err
	}
	return s.Reload(ctx)
}

// SetOverride sets the override for one cluster.
func (s *Store) SetOverride(ctx context.Context, cluster string, o ClusterOverride) error {
	if !ValidID(cluster) {
		return &FieldError{"name", "must match " + idRE.String()}
	}
	if err := o.Validate(); err != nil {
		return err
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	if err := s.be.putOverride(cctx, cluster, o); err != nil {
		return err
	}
	return s.Reload(ctx)
}

// DeleteOverride removes the override for one cluster.
func (s *Store) DeleteOverride(ctx context.Context, cluster string) error {
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	if err := s.be.deleteOverride(cctx, cluster); err != nil {
		return err
	}
	return s.Reload(ctx)
}

// LookupKey finds the tenant owning a raw API key, from the cache only.
// The hash comparison is constant-time.
func (s *Store) LookupKey(raw string) (*Tenant, error) {
	id, ok := parseKeyID(raw)
	snap := s.snap.Load()
	sum := sha256.Sum256([]byte(raw))
	var rec keyRecord
	if ok {
		rec, ok = snap.keys[id]
	}
	if !ok {
		// Seeded keys have no ID inside the key itself.
		rec, ok = snap.keys["seed"+hex.EncodeToString(sum[:4])]
	}
	if !ok {
		return nil, ErrUnauthenticated
	}
	want, err := hex.DecodeString(rec.Hash)
	if err != nil || subtle.ConstantTimeCompare(sum[:], want) != 1 {
		return nil, ErrUnauthenticated
	}
	t, ok := snap.tenants[rec.TenantID]
	if !ok {
		return nil, ErrUnauthenticated
	}
	if t.Disabled {
		return nil, ErrDisabled
	}
	return t.Clone(), nil
}

func parseKeyID(raw string) (string, bool) {
	rest, ok := strings.CutPrefix(raw, keyPrefix)
	if !ok {
		return "", false
	}
	id, _, ok := strings.Cut(rest, "-")
	return id, ok && len(id) == 12
}

// memBackend keeps state in process.
type memBackend struct {
	mu   sync.Mutex
	snap *snapshot
}

func newMemBackend() *memBackend { return &memBackend{snap: emptySnapshot()} }

func (m *memBackend) load(context.Context) (*snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return cloneSnapshot(m.snap), nil
}

func (m *memBackend) version(context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snap.version, nil
}

func cloneSnapshot(s *snapshot) *snapshot {
	c := &snapshot{version: s.version, tenants: make(map[string]*Tenant, len(s.tenants)), keys: make(map[string]keyRecord, len(s.keys)), overrides: make(map[string]ClusterOverride, len(s.overrides))}
	for k, v := range s.tenants {
		c.tenants[k] = v.Clone()
	}
	for k, v := range s.keys {
		c.keys[k] = v
	}
	for k, v := range s.overrides {
		c.overrides[k] = v
	}
	return c
}

func (m *memBackend) putTenant(_ context.Context, t *Tenant, create bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, exists := m.snap.tenants[t.ID]
	if create && exists {
		return ErrExists
	}
	if !create && !exists {
		return ErrNotFound
	}
	m.snap.tenants[t.ID] = t.Clone()
	m.snap.version++
	return nil
}

func (m *memBackend) deleteTenant(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.snap.tenants[id]; !ok {
		return ErrNotFound
	}
	delete(m.snap.tenants, id)
	for k, r := range m.snap.keys {
		if r.TenantID == id {
			delete(m.snap.keys, k)
		}
	}
	m.snap.version++
	return nil
}

func (m *memBackend) putKey(_ context.Context, rec keyRecord, onlyIfAbsent bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.snap.keys[rec.ID]; ok && onlyIfAbsent {
		return nil
	}
	m.snap.keys[rec.ID] = rec
	m.snap.version++
	return nil
}

func (m *memBackend) deleteKey(_ context.Context, tenantID, keyID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.snap.keys[keyID]
	if !ok || r.TenantID != tenantID {
		return ErrNotFound
	}
	delete(m.snap.keys, keyID)
	m.snap.version++
	return nil
}

func (m *memBackend) putOverride(_ context.Context, name string, o ClusterOverride) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snap.overrides[name] = o
	m.snap.version++
	return nil
}

func (m *memBackend) deleteOverride(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.snap.overrides[name]; !ok {
		return ErrNotFound
	}
	delete(m.snap.overrides, name)
	m.snap.version++
	return nil
}

func (m *memBackend) watch(ctx context.Context, _ chan<- struct{}) { <-ctx.Done() }
