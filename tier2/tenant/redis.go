package tenant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisBackend stores everything in four keys sharing one hash tag, so
// multi-key transactions stay in one Redis Cluster slot:
//
//	<prefix>{tenants}:t  HASH id -> tenant JSON
//	<prefix>{tenants}:k  HASH key id -> key record JSON (SHA-256, never the key)
//	<prefix>{tenants}:o  HASH cluster -> override JSON
//	<prefix>{tenants}:v  change counter, bumped by every write
//
// and publishes on <prefix>tenants:changed after each write.
type redisBackend struct {
	rdb                        redis.UniversalClient
	tKey, kKey, oKey, vKey, ch string
	log                        *slog.Logger
}

func newRedisBackend(o Options) *redisBackend {
	base := o.KeyPrefix + "{tenants}:"
	return &redisBackend{
		rdb: o.Redis, log: o.Logger,
		tKey: base + "t", kKey: base + "k", oKey: base + "o", vKey: base + "v",
		ch: o.KeyPrefix + "tenants:changed",
	}
}

func (b *redisBackend) load(ctx context.Context) (*snapshot, error) {
	var tc, kc, oc *redis.MapStringStringCmd
	var vc *redis.StringCmd
	// MULTI so the three hashes and the version are one consistent view.
	_, err := b.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		vc = p.Get(ctx, b.vKey)
		tc = p.HGetAll(ctx, b.tKey)
		kc = p.HGetAll(ctx, b.kKey)
		oc = p.HGetAll(ctx, b.oKey)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, wrapRedis(err)
	}
	s := emptySnapshot()
	if v, err := vc.Int64(); err == nil {
		s.version = v
	}
	for id, js := range tc.Val() {
		var t Tenant
		if err := json.Unmarshal([]byte(js), &t); err != nil {
			b.log.Warn("tenant store: skipping undecodable tenant", "id", id, "err", err)
			continue
		}
		s.tenants[id] = &t
	}
	for id, js := range kc.Val() {
		var r keyRecord
		if err := json.Unmarshal([]byte(js), &r); err != nil {
			b.log.Warn("tenant store: skipping undecodable key record", "id", id, "err", err)
			continue
		}
		s.keys[id] = r
	}
	for name, js := range oc.Val() {
		var o ClusterOverride
		if err := json.Unmarshal([]byte(js), &o); err != nil {
			b.log.Warn("tenant store: skipping undecodable override", "cluster", name, "err", err)
			continue
		}
		s.overrides[name] = o
	}
	return s, nil
}

func (b *redisBackend) version(ctx context.Context) (int64, error) {
	v, err := b.rdb.Get(ctx, b.vKey).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, wrapRedis(err)
	}
	return v, nil
}

// changed bumps the version and notifies the other replicas.
func (b *redisBackend) changed(ctx context.Context) error {
	if err := b.rdb.Incr(ctx, b.vKey).Err(); err != nil {
		return fmt.Errorf("tenant store: bump version: %w", wrapRedis(err))
	}
	// Losing the message is fine: the periodic version check catches up.
	if err := b.rdb.Publish(ctx, b.ch, "1").Err(); err != nil {
		b.log.Warn("tenant store: publish change", "err", err)
	}
	return nil
}

func (b *redisBackend) putTenant(ctx context.Context, t *Tenant, create bool) error {
	js, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if create {
		ok, err := b.rdb.HSetNX(ctx, b.tKey, t.ID, js).Result()
		if err != nil {
			return fmt.Errorf("tenant store: create: %w", wrapRedis(err))
		}
		if !ok {
			return ErrExists
		}
		return b.changed(ctx)
	}
	// Replace only if present, atomically.
	n, err := replaceIfExists.Run(ctx, b.rdb, []string{b.tKey}, t.ID, js).Int()
	if err != nil {
		return fmt.Errorf("tenant store: update: %w", wrapRedis(err))
	}
	if n == 0 {
		return ErrNotFound
	}
	return b.changed(ctx)
}

var replaceIfExists = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1`)

// deleteTenantScript removes the tenant and every key record naming it.
var deleteTenantScript = redis.NewScript(`
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local ok, rec = pcall(cjson.decode, all[i+1])
  if ok and rec['tenant_id'] == ARGV[1] then redis.call('HDEL', KEYS[2], all[i]) end
end
return 1`)

func (b *redisBackend) deleteTenant(ctx context.Context, id string) error {
	n, err := deleteTenantScript.Run(ctx, b.rdb, []string{b.tKey, b.kKey}, id).Int()
	if err != nil {
		return fmt.Errorf("tenant store: delete: %w", wrapRedis(err))
	}
	if n == 0 {
		return ErrNotFound
	}
	return b.changed(ctx)
}

func (b *redisBackend) putKey(ctx context.Context, rec keyRecord, onlyIfAbsent bool) error {
	js, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	ok, err := b.rdb.HSetNX(ctx, b.kKey, rec.ID, js).Result()
	if err != nil {
		return fmt.Errorf("tenant store: put key: %w", wrapRedis(err))
	}
	if !ok {
		if onlyIfAbsent {
			return nil
		}
		return fmt.Errorf("tenant store: key id collision %s: %w", rec.ID, ErrExists)
	}
	return b.changed(ctx)
}

var deleteKeyScript = redis.NewScript(`
local js = redis.call('HGET', KEYS[1], ARGV[2])
if not js then return 0 end
local ok, rec = pcall(cjson.decode, js)
if not ok or rec['tenant_id'] ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[2])
return 1`)

func (b *redisBackend) deleteKey(ctx context.Context, tenantID, keyID string) error {
	n, err := deleteKeyScript.Run(ctx, b.rdb, []string{b.kKey}, tenantID, keyID).Int()
	if err != nil {
		return fmt.Errorf("tenant store: delete key: %w", wrapRedis(err))
	}
	if n == 0 {
		return ErrNotFound
	}
	return b.changed(ctx)
}

func (b *redisBackend) putOverride(ctx context.Context, name string, o ClusterOverride) error {
	js, err := json.Marshal(o)
	if err != nil {
		return err
	}
	if err := b.rdb.HSet(ctx, b.oKey, name, js).Err(); err != nil {
		return fmt.Errorf("tenant store: put override: %w", wrapRedis(err))
	}
	return b.changed(ctx)
}

func (b *redisBackend) deleteOverride(ctx context.Context, name string) error {
	n, err := b.rdb.HDel(ctx, b.oKey, name).Result()
	if err != nil {
		return fmt.Errorf("tenant store: delete override: %w", wrapRedis(err))
	}
	if n == 0 {
		return ErrNotFound
	}
	return b.changed(ctx)
}

// watch subscribes to change notifications, resubscribing after errors.
func (b *redisBackend) watch(ctx context.Context, changed chan<- struct{}) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		sub := b.rdb.Subscribe(ctx, b.ch)
		if _, err := sub.Receive(ctx); err != nil {
			_ = sub.Close()
			b.log.Debug("tenant store: subscribe failed", "err", err, "retry", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		// A reload after (re)subscribing covers messages missed meanwhile.
		notify(changed)
		ch := sub.Channel()
		func() {
			defer func() { _ = sub.Close() }() // unsubscribing on the way out; the loop subscribes afresh
			for {
				select {
				case <-ctx.Done():
					return
				case _, ok := <-ch:
					if !ok {
						return
					}
					notify(changed)
				}
			}
		}()
	}
}

// wrapRedis marks an error from a Redis call that means Redis cannot serve
// right now — unreachable, timed out, a closed client, or a server reply
// such as LOADING, READONLY or CLUSTERDOWN — as ErrUnavailable, so callers
// can tell "try again later" from a bad request or a bug. Other server
// replies (a script error, say) are returned as they are.
func wrapRedis(err error) error {
	var re redis.Error
	if errors.As(err, &re) && !redis.IsLoadingError(err) && !redis.IsReadOnlyError(err) &&
		!redis.IsClusterDownError(err) && !redis.IsTryAgainError(err) &&
		!redis.IsMasterDownError(err) && !redis.IsMaxClientsError(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

func notify(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
