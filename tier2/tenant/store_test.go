package tenant

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/testservice"
)

func newMemStore(t *testing.T, o Options) *Store {
	t.Helper()
	s, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newRedisStore(t *testing.T, addr string, o Options) (*Store, *redis.Client) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	o.Redis = rdb
	s, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, rdb
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		t     Tenant
		field string
	}{
		{"ok", Tenant{ID: "acme"}, ""},
		{"bad id", Tenant{ID: "a b"}, "id"},
		{"empty id", Tenant{}, "id"},
		{"brace id", Tenant{ID: "a{b}"}, "id"},
		{"bad policy", Tenant{ID: "a", Policy: "fastest"}, "policy"},
		{"pinned without region", Tenant{ID: "a", Policy: PolicyRegionPinned}, "region"},
		{"negative rpm", Tenant{ID: "a", Limits: Limits{RPM: -1}}, "limits.rpm"},
		{"negative tpm", Tenant{ID: "a", Limits: Limits{TPM: -1}}, "limits.tpm"},
		{"bad period", Tenant{ID: "a", Limits: Limits{TokenBudget: 5, BudgetPeriod: "week"}}, "limits.budget_period"},
		{"model limit", Tenant{ID: "a", ModelLimits: map[string]Limits{"m": {Concurrent: -2}}}, "model_limits.m.concurrent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tn := tt.t
			tn.Normalize()
			err := tn.Validate()
			var fe *FieldError
			switch {
			case tt.field == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tt.field != "" && (!errors.As(err, &fe) || fe.Field != tt.field):
				t.Fatalf("error %v, want field %q", err, tt.field)
			}
		})
	}
	tn := Tenant{ID: "a", Limits: Limits{TokenBudget: 10}}
	tn.Normalize()
	if tn.Policy != PolicyCostFirst || tn.Limits.BudgetPeriod != PeriodMonth {
		t.Fatalf("defaults not applied: %+v", tn)
	}
}

func TestStoreCRUDAndKeys(t *testing.T) {
	rs := testservice.StartRedis(t)
	for _, tc := range []struct {
		name string
		open func(t *testing.T) *Store
	}{
		{"memory", func(t *testing.T) *Store { return newMemStore(t, Options{}) }},
		{"redis", func(t *testing.T) *Store { s, _ := newRedisStore(t, rs.Addr(), Options{KeyPrefix: "crud:"}); return s }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := tc.open(t)
			if err := s.CreateTenant(ctx, Tenant{ID: "acme", Limits: Limits{RPM: 10}}); err != nil {
				t.Fatal(err)
			}
			if err := s.CreateTenant(ctx, Tenant{ID: "acme"}); !errors.Is(err, ErrExists) {
				t.Fatalf("duplicate create: %v", err)
			}
			if err := s.UpdateTenant(ctx, Tenant{ID: "ghost"}); !errors.Is(err, ErrNotFound) {
				t.Fatalf("update missing: %v", err)
			}
			if err := s.UpdateTenant(ctx, Tenant{ID: "acme", Limits: Limits{RPM: 20}}); err != nil {
				t.Fatal(err)
			}
			if got, _ := s.Tenant("acme"); got.Limits.RPM != 20 || got.Policy != PolicyCostFirst {
				t.Fatalf("after update: %+v", got)
			}
			raw, info, err := s.CreateKey(ctx, "acme", "ci")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(raw, info.Prefix) || len(raw) < 40 {
				t.Fatalf("key %q info %+v", raw, info)
			}
			if got, err := s.LookupKey(raw); err != nil || got.ID != "acme" {
				t.Fatalf("lookup: %v %v", got, err)
			}
			for _, bad := range []string{"", raw + "x", raw[:len(raw)-1] + "A", info.Prefix, "ig-000000000000-abc"} {
				if bad == raw {
					continue
				}
				if _, err := s.LookupKey(bad); !errors.Is(err, ErrUnauthenticated) {
					t.Fatalf("lookup %q: %v", bad, err)
				}
			}
			if keys := s.Keys("acme"); len(keys) != 1 || keys[0].ID != info.ID {
				t.Fatalf("keys: %+v", keys)
			}
			if _, _, err := s.CreateKey(ctx, "ghost", ""); !errors.Is(err, ErrNotFound) {
				t.Fatalf("key for missing tenant: %v", err)
			}
			// Disabled tenants cannot authenticate.
			if err := s.UpdateTenant(ctx, Tenant{ID: "acme", Disabled: true}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.LookupKey(raw); !errors.Is(err, ErrDisabled) || !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("disabled: %v", err)
			}
			if err := s.DeleteKey(ctx, "other", info.ID); !errors.Is(err, ErrNotFound) {
				t.Fatalf("delete key of another tenant: %v", err)
			}
			if err := s.DeleteKey(ctx, "acme", info.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := s.LookupKey(raw); !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("deleted key still works: %v", err)
			}
			// Overrides.
			w := 0.5
			if err := s.SetOverride(ctx, "us-east", ClusterOverride{Drain: true, Weight: &w}); err != nil {
				t.Fatal(err)
			}
			if o := s.Overrides()["us-east"]; !o.Drain || o.Weight == nil || *o.Weight != 0.5 {
				t.Fatalf("override: %+v", o)
			}
			neg := -1.0
			var fe *FieldError
			if err := s.SetOverride(ctx, "us-east", ClusterOverride{Cost: &neg}); !errors.As(err, &fe) || fe.Field != "cost" {
				t.Fatalf("negative cost: %v", err)
			}
			if err := s.DeleteOverride(ctx, "us-east"); err != nil {
				t.Fatal(err)
			}
			// Deleting a tenant revokes its keys.
			raw2, _, err := s.CreateKey(ctx, "acme", "")
			if err != nil {
				t.Fatal(err)
			}
			if err := s.DeleteTenant(ctx, "acme"); err != nil {
				t.Fatal(err)
			}
			if len(s.Keys("acme")) != 0 {
				t.Fatal("keys survive their tenant")
			}
			if _, err := s.LookupKey(raw2); !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("key of deleted tenant: %v", err)
			}
			if err := s.DeleteTenant(ctx, "acme"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("delete twice: %v", err)
			}
		})
	}
}

// TestRawKeyNeverInRedis dumps every key and value in Redis after a key
// is created and checks that only the SHA-256 is there.
func TestRawKeyNeverInRedis(t *testing.T) {
	rs := testservice.StartRedis(t)
	s, rdb := newRedisStore(t, rs.Addr(), Options{})
	ctx := context.Background()
	if err := s.CreateTenant(ctx, Tenant{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	raw, info, err := s.CreateKey(ctx, "acme", "prod")
	if err != nil {
		t.Fatal(err)
	}
	secret := raw[len(info.Prefix)+1:]
	sum := sha256.Sum256([]byte(raw))
	var all strings.Builder
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		all.WriteString(k + "\n")
		switch rdb.Type(ctx, k).Val() {
		case "hash":
			for f, v := range rdb.HGetAll(ctx, k).Val() {
				all.WriteString(f + "=" + v + "\n")
			}
		case "string":
			all.WriteString(rdb.Get(ctx, k).Val() + "\n")
		}
	}
	dump := all.String()
	if strings.Contains(dump, secret) || strings.Contains(dump, raw) {
		t.Fatalf("raw API key found in Redis:\n%s", dump)
	}
	if !strings.Contains(dump, hex.EncodeToString(sum[:])) {
		t.Fatalf("key hash not stored:\n%s", dump)
	}
}

// TestReplicasSeeChanges: three stores on one Redis; a change made
// through one is visible in the others' caches within 1s.
func TestReplicasSeeChanges(t *testing.T) {
	rs := testservice.StartRedis(t)
	var stores []*Store
	for i := 0; i < 3; i++ {
		s, _ := newRedisStore(t, rs.Addr(), Options{})
		stores = append(stores, s)
	}
	ctx := context.Background()
	waitAll := func(what string, ok func(s *Store) bool) {
		t.Helper()
		start := time.Now()
		for _, s := range stores {
			for !ok(s) {
				if time.Since(start) > time.Second {
					t.Fatalf("%s: not visible on every replica within 1s", what)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		t.Logf("%s visible on all replicas after %v", what, time.Since(start))
	}
	if err := stores[0].CreateTenant(ctx, Tenant{ID: "acme", Limits: Limits{RPM: 100}}); err != nil {
		t.Fatal(err)
	}
	waitAll("create", func(s *Store) bool { _, ok := s.Tenant("acme"); return ok })
	if err := stores[1].UpdateTenant(ctx, Tenant{ID: "acme", Limits: Limits{RPM: 7}}); err != nil {
		t.Fatal(err)
	}
	waitAll("limit change", func(s *Store) bool { tn, _ := s.Tenant("acme"); return tn.Limits.RPM == 7 })
	raw, _, err := stores[2].CreateKey(ctx, "acme", "")
	if err != nil {
		t.Fatal(err)
	}
	waitAll("new key", func(s *Store) bool { _, err := s.LookupKey(raw); return err == nil })
	if err := stores[0].SetOverride(ctx, "c1", ClusterOverride{Drain: true}); err != nil {
		t.Fatal(err)
	}
	waitAll("override", func(s *Store) bool { return s.Overrides()["c1"].Drain })
}

// TestReloadWithoutPubSub: the periodic version check alone propagates a
// change written behind the store's back (as if the message were lost).
func TestReloadWithoutPubSub(t *testing.T) {
	rs := testservice.StartRedis(t)
	s, rdb := newRedisStore(t, rs.Addr(), Options{ReloadInterval: 50 * time.Millisecond})
	ctx := context.Background()
	if err := rdb.HSet(ctx, "infergate:{tenants}:t", "quiet", `{"id":"quiet","limits":{}}`).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Incr(ctx, "infergate:{tenants}:v").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := s.Tenant("quiet"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("periodic reload never picked up the change")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCacheSurvivesRedisOutage: authentication keeps working from the
// local cache while Redis is down.
func TestCacheSurvivesRedisOutage(t *testing.T) {
	rs := testservice.StartRedis(t)
	s, _ := newRedisStore(t, rs.Addr(), Options{ReloadInterval: 20 * time.Millisecond, Timeout: 100 * time.Millisecond})
	ctx := context.Background()
	if err := s.CreateTenant(ctx, Tenant{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	raw, _, err := s.CreateKey(ctx, "acme", "")
	if err != nil {
		t.Fatal(err)
	}
	rs.Stop()
	time.Sleep(100 * time.Millisecond) // several failed reloads
	if tn, err := s.LookupKey(raw); err != nil || tn.ID != "acme" {
		t.Fatalf("lookup during outage: %v %v", tn, err)
	}
}

func TestSeed(t *testing.T) {
	h := sha256.Sum256([]byte("hashed-key"))
	s := newMemStore(t, Options{
		Seed:     []Tenant{{ID: "dev", Limits: Limits{RPM: 5}}},
		SeedKeys: []SeedKey{{TenantID: "dev", Key: "plain-dev-key"}, {TenantID: "dev", SHA256: hex.EncodeToString(h[:])}},
	})
	for _, k := range []string{"plain-dev-key", "hashed-key"} {
		if tn, err := s.LookupKey(k); err != nil || tn.ID != "dev" {
			t.Fatalf("seed key %q: %v %v", k, tn, err)
		}
	}
	if _, err := New(context.Background(), Options{SeedKeys: []SeedKey{{TenantID: "nobody", Key: "x"}}}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("seed key for unknown tenant: %v", err)
	}
}

// TestRedisClusterStore: the store's keys share one hash tag, so its
// MULTI reads and scripts work on Redis Cluster, and changes still reach
// other replicas through cluster-wide pub/sub.
func TestRedisClusterStore(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	rc := testservice.StartRedisCluster(t)
	var stores []*Store
	for i := 0; i < 2; i++ {
		rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: rc.Addrs()})
		t.Cleanup(func() { rdb.Close() })
		s, err := New(context.Background(), Options{Redis: rdb})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	ctx := context.Background()
	if err := stores[0].CreateTenant(ctx, Tenant{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	raw, _, err := stores[0].CreateKey(ctx, "acme", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := stores[0].UpdateTenant(ctx, Tenant{ID: "acme", Limits: Limits{RPM: 3}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		tn, err := stores[1].LookupKey(raw)
		if err == nil && tn.Limits.RPM == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("second replica: %v %v", tn, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := stores[1].DeleteTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
}

// TestSeedSurvivesEmptyRedis: when Redis comes back empty (a restart
// without persistence), the seeded tenants and keys are created again
// within the reload interval, so configured keys do not turn into 401s
// until Tier 2 restarts. Admin changes to a seeded tenant survive a
// re-seed, and a seeded key revoked through the store stays revoked.
func TestSeedSurvivesEmptyRedis(t *testing.T) {
	rs := testservice.StartRedis(t)
	const interval = 50 * time.Millisecond
	s, rdb := newRedisStore(t, rs.Addr(), Options{
		ReloadInterval: interval, Timeout: 200 * time.Millisecond,
		Seed:     []Tenant{{ID: "dev", Limits: Limits{RPM: 5}}, {ID: "ops"}},
		SeedKeys: []SeedKey{{TenantID: "dev", Key: "dev-key"}, {TenantID: "ops", Key: "ops-key"}},
	})
	ctx := context.Background()
	// An admin raises dev's limit and revokes ops's seeded key.
	if err := s.UpdateTenant(ctx, Tenant{ID: "dev", Limits: Limits{RPM: 50}}); err != nil {
		t.Fatal(err)
	}
	var opsKey string
	for _, k := range s.Keys("ops") {
		opsKey = k.ID
	}
	if err := s.DeleteKey(ctx, "ops", opsKey); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LookupKey("ops-key"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("revoked seed key: %v", err)
	}

	// A deliberate revocation is not undone by later reloads.
	time.Sleep(4 * interval)
	if _, err := s.LookupKey("ops-key"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("revoked seed key came back without a reset: %v", err)
	}

	rs.Stop()
	rs.Start() // empty: persistence is off
	// Within a couple of reload intervals (plus the client's reconnect),
	// the seeds are back. Polling stands in for "eventually": no timing
	// is asserted beyond the generous deadline.
	deadline := time.Now().Add(5 * time.Second)
	for {
		tn, err := s.LookupKey("dev-key")
		_, opsErr := s.LookupKey("ops-key")
		if err == nil && tn.ID == "dev" && opsErr == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after an empty Redis: dev-key %v %v, ops-key %v", tn, err, opsErr)
		}
		time.Sleep(interval / 2)
	}
	if n, err := rdb.HLen(ctx, "infergate:{tenants}:k").Result(); err != nil || n != 2 {
		t.Fatalf("seed keys in Redis: %d %v", n, err)
	}

	// Existing tenants are never overwritten by a re-seed: change dev,
	// wipe only the keys hash (counter kept, as after a partial restore
	// with a lower counter below), and check dev keeps the admin's limit.
	if err := s.UpdateTenant(ctx, Tenant{ID: "dev", Limits: Limits{RPM: 77}}); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, "infergate:{tenants}:k").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, "infergate:{tenants}:v", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		tn, err := s.LookupKey("dev-key")
		if err == nil {
			if tn.Limits.RPM != 77 {
				t.Fatalf("re-seed overwrote the tenant: %+v", tn.Limits)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a restore with a lower counter: %v", err)
		}
		time.Sleep(interval / 2)
	}
}

// TestWritesWhileRedisDown: every write fails with an error wrapping
// ErrUnavailable while Redis is down, and validation errors stay what they
// are; after Redis is back, writes work again.
func TestWritesWhileRedisDown(t *testing.T) {
	rs := testservice.StartRedis(t)
	s, _ := newRedisStore(t, rs.Addr(), Options{Timeout: 500 * time.Millisecond})
	ctx := context.Background()
	if err := s.CreateTenant(ctx, Tenant{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	writes := []struct {
		name string
		do   func() error
	}{
		{"create tenant", func() error { return s.CreateTenant(ctx, Tenant{ID: "beta"}) }},
		{"update tenant", func() error { return s.UpdateTenant(ctx, Tenant{ID: "acme", Policy: PolicyLatencyFirst}) }},
		{"create key", func() error { _, _, err := s.CreateKey(ctx, "acme", "ci"); return err }},
		{"delete key", func() error { return s.DeleteKey(ctx, "acme", "000000000000") }},
		{"set override", func() error { return s.SetOverride(ctx, "use1-a", ClusterOverride{Drain: true}) }},
		{"delete override", func() error { return s.DeleteOverride(ctx, "use1-a") }},
		{"delete tenant", func() error { return s.DeleteTenant(ctx, "beta") }},
		{"reload", func() error { return s.Reload(ctx) }},
	}
	rs.Stop()
	for _, w := range writes {
		t.Run("down/"+w.name, func(t *testing.T) {
			if err := w.do(); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("err = %v, want ErrUnavailable", err)
			}
		})
	}
	var fe *FieldError
	if err := s.CreateTenant(ctx, Tenant{ID: "bad id"}); !errors.As(err, &fe) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("invalid tenant while down: %v, want a FieldError", err)
	}
	rs.Start()
	// The client's pool redials in the background after failed dials, so
	// writes may still report ErrUnavailable for a moment.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.CreateTenant(ctx, Tenant{ID: "acme"})
		if err == nil || errors.Is(err, ErrExists) {
			break
		}
		if !errors.Is(err, ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.SetOverride(ctx, "use1-a", ClusterOverride{Drain: true}); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

// TestWriteTimeout: a Redis that accepts writes but never answers them
// (CLIENT PAUSE WRITE) fails each write within Options.Timeout with
// ErrUnavailable instead of hanging for the pause.
func TestWriteTimeout(t *testing.T) {
	rs := testservice.StartRedis(t)
	// No socket timeout of its own, so only the store's deadline applies.
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), ReadTimeout: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	s, err := New(context.Background(), Options{Redis: rdb, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	if err := s.CreateTenant(ctx, Tenant{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { admin.Close() })
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "600000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop) // before the clients close, so nothing waits for the pause
	for _, w := range []struct {
		name string
		do   func() error
	}{
		{"create tenant", func() error { return s.CreateTenant(ctx, Tenant{ID: "beta"}) }},
		{"set override", func() error { return s.SetOverride(ctx, "use1-a", ClusterOverride{Drain: true}) }},
		{"create key", func() error { _, _, err := s.CreateKey(ctx, "acme", ""); return err }},
	} {
		t.Run(w.name, func(t *testing.T) {
			if err := w.do(); !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want ErrUnavailable from the deadline", err)
			}
		})
	}
}
