// Package ratelimit enforces Tier 2's per-tenant limits — requests and
// tokens per minute, concurrent requests and a day/month token budget —
// exactly across every replica that shares one Redis.
//
// Each replica leases small slices of a tenant's limits from Redis (one Lua
// script call per lease, covering every limit of the tenant at once) and
// admits requests from its local slice, so most admissions never touch
// Redis. A lease is counted in Redis the moment it is granted and may only
// be used for LeaseTTL; windows count every grant for at least one minute
// plus LeaseTTL, which is what keeps the total across replicas at or under
// the limit (see docs/tier2-limits.md for the bound).
//
// A reader's map: ratelimit.go is the exported API (Limiter, Admit,
// Reservation.Finish) and the Redis outage handling; state.go one tenant's
// local view and the assembly of a script call; rates.go, budgets.go and
// concurrency.go what is particular to each kind of limit, lease.go the
// leases rates and budgets share. protocol.go defines the call to Redis
// once (op, result) and sync.lua runs it; membackend.go is the same
// protocol in process for a single replica, checked against the script by
// protocol_test.go. usage.go reads use for the admin API.
package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/infergate/infergate/shared/clock"
	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier2/tenant"
)

// Options configure a Limiter.
type Options struct {
	// Redis shares limits between replicas (single node or cluster through
	// redis.NewUniversalClient; RedisConfig.Client builds one with TLS and
	// AUTH). Nil keeps limits in memory: right for one replica only, since
	// N replicas would each allow the whole limit.
	Redis redis.UniversalClient
	// KeyPrefix starts every key. Default "infergate:rl:".
	KeyPrefix string
	// Replicas is the number of Tier 2 replicas; while Redis is unreachable
	// each replica enforces limit ÷ Replicas locally. Default 1.
	Replicas int
	// FailClosed rejects requests while Redis is unreachable. The default
	// (false) fails open to the local limits.
	FailClosed bool
	// FailAfter is how many Redis calls in a row must fail before the
	// limiter marks Redis down and stops calling it. A call that fails
	// below it answers only its own admission from the local limits
	// (reconciled later), so one stall of a loaded machine does not switch
	// the replica to local limits. Default 3.
	FailAfter int
	// Timeout bounds every Redis call on the request path. Default 50ms.
	// It holds against a hung Redis only if the client honours context
	// deadlines (redis.Options.ContextTimeoutEnabled; RedisConfig.Client
	// sets it); New logs a warning otherwise.
	Timeout time.Duration
	// SyncInterval is how often the background loop returns expired
	// leases, flushes refunds, renews concurrency holdings and refills
	// leases. Default 250ms.
	SyncInterval time.Duration
	// FlushInterval is how often refunds (unused leases, tokens estimated
	// but not used) and charges go back to Redis when no other call
	// carries them. Default 1s.
	FlushInterval time.Duration
	// LeaseTTL is how long a leased slice may be used; it lengthens the
	// counting window (see package doc). Default 2s.
	LeaseTTL time.Duration
	// MaxLeaseFraction caps one replica's lease at this fraction of a
	// limit divided by Replicas. Default 0.5.
	MaxLeaseFraction float64
	// SlotTTL is how long a replica's concurrency holdings survive without
	// renewal, so a crashed replica's slots come back. Default 5s.
	SlotTTL time.Duration
	// Backoff is the first wait before probing Redis again after a failure;
	// it doubles up to MaxBackoff. Defaults 500ms and 5s.
	Backoff, MaxBackoff time.Duration
	// ReplicaID names this replica's concurrency holdings. Default random.
	ReplicaID string
	// BaseModel returns the base model of a LoRA adapter ("" for other
	// models), so a per-model limit on a base model also covers its
	// adapters, which run on the same pods. Nil: no adapters known.
	// tier2/route's Router.BaseModel implements it.
	BaseModel func(model string) string
	Logger    *slog.Logger

	window, bucket time.Duration // tests only
	idleAfter      time.Duration // forget a tenant's local state; default 5m
}

func (o *Options) setDefaults() {
	config.Default(&o.KeyPrefix, "infergate:rl:")
	config.Default(&o.Replicas, 1)
	config.Default(&o.FailAfter, 3)
	config.Default(&o.Timeout, 50*time.Millisecond)
	config.Default(&o.SyncInterval, 250*time.Millisecond)
	config.Default(&o.idleAfter, 5*time.Minute)
	config.Default(&o.FlushInterval, time.Second)
	config.Default(&o.LeaseTTL, 2*time.Second)
	if o.MaxLeaseFraction <= 0 || o.MaxLeaseFraction > 1 {
		o.MaxLeaseFraction = 0.5
	}
	config.Default(&o.SlotTTL, 5*time.Second)
	if o.SlotTTL < 3*o.SyncInterval {
		o.SlotTTL = 3 * o.SyncInterval
	}
	config.Default(&o.Backoff, 500*time.Millisecond)
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = max(5*time.Second, o.Backoff)
	}
	if o.ReplicaID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.ReplicaID = hex.EncodeToString(b[:])
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Window geometry, fixed so every replica agrees on bucket boundaries
// whatever its other options: 2s buckets, a grant counted until its
// bucket's start plus the window (58-60 s after it), so a refused client
// waits at most the window and every reset is within it. Tests shrink
// both through Options' unexported fields.
const (
	window      = time.Minute
	bucketWidth = 2 * time.Second
)

func (l *Limiter) win() time.Duration {
	if l.opts.window > 0 {
		return l.opts.window
	}
	return window
}

// geometry returns the bucket width in ms and how many buckets a window
// sums, the current one included: window ÷ width, so a grant leaves the
// sum at most one window after it was made (docs/tier2-limits.md, "The
// bound", for what that means with leases).
func (l *Limiter) geometry() (w, n int64) {
	win, bw := l.win(), l.opts.bucket
	if bw <= 0 {
		bw = bucketWidth
	}
	return bw.Milliseconds(), max(int64(math.Ceil(float64(win)/float64(bw))), 1)
}

// Decision reasons.
const (
	ReasonRPM         = "rpm"
	ReasonTPM         = "tpm"
	ReasonConcurrency = "concurrency"
	ReasonBudget      = "budget"
	ReasonUnavailable = "unavailable" // fail-closed while Redis is down
)

// ErrUnavailable is returned (wrapped) when Redis is unreachable and the
// limiter fails closed.
var ErrUnavailable = errors.New("ratelimit: limits store unavailable")

// Window describes one limit for response headers. Limit 0 = not limited.
type Window struct {
	Limit, Remaining int64
	Reset            time.Duration
}

// Decision is the outcome of Admit.
type Decision struct {
	Allowed bool
	// Reason names the limit that rejected the request (empty if allowed).
	Reason string
	// Model is set when the rejecting limit is a per-model one.
	Model string
	// Limit, Remaining and Reset describe the rejecting limit, or the
	// tightest one when allowed.
	Limit, Remaining int64
	// Need is what the request asked of the rejecting limit: one request,
	// one slot, or its estimated tokens (prompt plus max output).
	Need int64
	// Period is the rejecting budget's period (day or month).
	Period     string
	RetryAfter time.Duration
	Reset      time.Duration
	// Requests and Tokens feed OpenAI's x-ratelimit-* headers, Budget the
	// x-ratelimit-*-budget-tokens ones (the tightest token budget).
	Requests, Tokens, Budget Window
	// Degraded is set when the decision came from local fail-open limits.
	Degraded bool
}

// Error codes of a refusal (Decision.Code), as the gateway answers them.
const (
	CodeRateLimited    = "rate_limit_exceeded" // requests or tokens per minute, concurrency
	CodeBudgetExceeded = "budget_exceeded"     // the day's or month's token budget
)

// Code is the OpenAI error code of a refusal.
func (d Decision) Code() string {
	if d.Reason == ReasonBudget {
		return CodeBudgetExceeded
	}
	return CodeRateLimited
}

// Message says, for the 429's body, which limit refused the request, what
// is left of it, and what the client can do: wait (how long), or ask for
// fewer tokens — tokens are reserved at the request's estimate (prompt
// plus max_tokens) and settled to the real count when it ends.
func (d Decision) Message() string {
	scope := "tenant-wide"
	if d.Model != "" {
		scope = fmt.Sprintf("for model %q", d.Model)
	}
	const est = "prompt estimate + max_tokens"
	var msg string
	switch d.Reason {
	case ReasonRPM:
		msg = fmt.Sprintf("rate limit exceeded: %d requests per minute (%s); retry in %s", d.Limit, scope, humanDuration(d.RetryAfter))
	case ReasonConcurrency:
		msg = fmt.Sprintf("rate limit exceeded: %d concurrent requests (%s) are in flight; retry when one finishes", d.Limit, scope)
	case ReasonTPM:
		if d.Need > d.Limit {
			msg = fmt.Sprintf("rate limit exceeded: this request may use up to %d tokens (%s), more than the limit of %d tokens per minute (%s); lower max_tokens",
				d.Need, est, d.Limit, scope)
		} else {
			msg = fmt.Sprintf("rate limit exceeded: this request may use up to %d tokens (%s; what it does not use is given back when it ends) and %d of %d tokens per minute (%s) remain; retry in %s or lower max_tokens",
				d.Need, est, d.Remaining, d.Limit, scope, humanDuration(d.RetryAfter))
		}
	case ReasonBudget:
		per, at := "monthly", "midnight UTC of the 1st"
		if d.Period == tenant.PeriodDay {
			per, at = "daily", "midnight UTC"
		}
		if d.Need > d.Limit {
			msg = fmt.Sprintf("token budget exceeded: this request may use up to %d tokens (%s), more than the whole %s budget of %d tokens (%s); lower max_tokens",
				d.Need, est, per, d.Limit, scope)
		} else {
			msg = fmt.Sprintf("token budget exceeded: this request may use up to %d tokens (%s; what it does not use is given back when it ends) and %d of the %s budget of %d tokens (%s) remain; the budget resets in %s (at %s). Lower max_tokens, or wait for the reset",
				d.Need, est, d.Remaining, per, d.Limit, scope, humanDuration(d.RetryAfter), at)
		}
	case ReasonUnavailable:
		return "rate limiting is unavailable; try again shortly"
	default:
		return "rate limit exceeded"
	}
	if d.Degraded {
		msg += " (the limits store is unreachable: this replica enforces its share of the limit)"
	}
	return msg
}

// humanDuration rounds d for a message: whole seconds, at least 1s.
func humanDuration(d time.Duration) string {
	if d <= time.Second {
		return "1s"
	}
	return d.Round(time.Second).String()
}

// SetHeaders writes Retry-After (when rejected) and OpenAI's
// x-ratelimit-{limit,remaining,reset}-{requests,tokens} headers, and the
// same for the token budget (x-ratelimit-*-budget-tokens).
func (d Decision) SetHeaders(h http.Header) {
	if !d.Allowed && d.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(d.RetryAfter.Seconds())), 10))
		h.Set("retry-after-ms", strconv.FormatInt(d.RetryAfter.Milliseconds(), 10))
	}
	set := func(kind string, w Window) {
		if w.Limit <= 0 {
			return
		}
		h.Set("x-ratelimit-limit-"+kind, strconv.FormatInt(w.Limit, 10))
		h.Set("x-ratelimit-remaining-"+kind, strconv.FormatInt(max(w.Remaining, 0), 10))
		h.Set("x-ratelimit-reset-"+kind, formatReset(w.Reset))
	}
	set("requests", d.Requests)
	set("tokens", d.Tokens)
	set("budget-tokens", d.Budget)
}

// formatReset renders durations the way OpenAI does ("1s", "6m0s", "20ms").
func formatReset(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if d < time.Second {
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	}
	return d.Round(time.Second).String()
}

// Limiter admits requests against tenants' limits.
type Limiter struct {
	opts   Options
	be     backend
	shared bool // Redis-backed (the memory backend leases the same way)

	mu     sync.Mutex
	states map[string]*tenantState

	down      atomic.Bool
	downMu    sync.Mutex
	nextProbe time.Time
	backoff   time.Duration
	fails     int    // consecutive failed calls; guarded by downMu
	probeKey  string // a key of the last failed call: the probe touches its slot

	closing                                    atomic.Bool
	admits, redisCalls                         atomic.Int64
	admitSyncs, prefetchSyncs, backgroundSyncs atomic.Int64
	degraded, redisErrors                      atomic.Int64

	cancel context.CancelFunc
	done   chan struct{}
}

// New starts a Limiter and its background sync loop; call Close to stop it.
func New(opts Options) *Limiter {
	opts.setDefaults()
	l := &Limiter{opts: opts, states: map[string]*tenantState{}, done: make(chan struct{})}
	if opts.Redis != nil {
		l.be = redisBackend{rdb: opts.Redis}
		l.shared = true
		if !contextTimeouts(opts.Redis) {
			opts.Logger.Warn("ratelimit: redis client ignores context deadlines (ContextTimeoutEnabled is off); a hung Redis holds requests until the client's ReadTimeout, not Options.Timeout")
		}
	} else {
		l.be = newMemBackend()
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go l.loop(ctx)
	return l
}

// contextTimeouts reports whether rdb bounds socket I/O by the context's
// deadline, which is what makes Options.Timeout hold against a hung Redis.
func contextTimeouts(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return true // unknown kind: trust the caller
}

// Close stops the background loop after returning unused leases and
// releasing concurrency holdings, best effort.
func (l *Limiter) Close() error {
	l.closing.Store(true)
	l.cancel()
	<-l.done
	if !l.down.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*l.opts.Timeout)
		defer cancel()
		for _, st := range l.snapshotStates() {
			st.mu.Lock()
			for _, r := range st.res {
				r.expireAll()
			}
			st.mu.Unlock()
			_, _ = l.sync(ctx, st, nil, false, &l.backgroundSyncs)
		}
	}
	return nil
}

// Stats counts admissions and Redis script calls made by this limiter.
// RedisCalls = AdmitSyncs (an admission waited) + PrefetchSyncs (an
// admission started a refill) + BackgroundSyncs (expiry, refunds,
// heartbeats), counting only calls that reached the backend.
type Stats struct {
	Admits, RedisCalls                         int64
	AdmitSyncs, PrefetchSyncs, BackgroundSyncs int64
	// Degraded counts admissions decided by the local fail-open limits;
	// RedisErrors counts failed or timed-out calls.
	Degraded, RedisErrors int64
	RedisDown             bool
}

// Stats returns counters since New.
func (l *Limiter) Stats() Stats {
	return Stats{
		Admits: l.admits.Load(), RedisCalls: l.redisCalls.Load(), RedisDown: l.down.Load(),
		AdmitSyncs: l.admitSyncs.Load(), PrefetchSyncs: l.prefetchSyncs.Load(), BackgroundSyncs: l.backgroundSyncs.Load(),
		Degraded: l.degraded.Load(), RedisErrors: l.redisErrors.Load(),
	}
}

// kind of a limited resource.
type kind uint8

const (
	kRPM kind = iota
	kTPM
	kConc
	kBudget
)

func (k kind) reason() string {
	return [...]string{ReasonRPM, ReasonTPM, ReasonConcurrency, ReasonBudget}[k]
}

// need is one resource a request draws on.
type need struct {
	k     kind
	scope string // "" for tenant-wide, else the model
	limit int64
	n     int64
	per   string // budget period
}

// needsFor lists the limits a request for model draws on: the tenant's,
// the model's, and for a LoRA adapter its base model's (base "" if none).
func needsFor(t *tenant.Tenant, model, base string, est int64) []need {
	var out []need
	add := func(scope string, lim tenant.Limits) {
		if lim.Concurrent > 0 {
			out = append(out, need{k: kConc, scope: scope, limit: int64(lim.Concurrent), n: 1})
		}
		if lim.RPM > 0 {
			out = append(out, need{k: kRPM, scope: scope, limit: int64(lim.RPM), n: 1})
		}
		if lim.TPM > 0 {
			out = append(out, need{k: kTPM, scope: scope, limit: int64(lim.TPM), n: est})
		}
		if lim.TokenBudget > 0 {
			p := lim.BudgetPeriod
			if p == "" {
				p = tenant.PeriodMonth
			}
			out = append(out, need{k: kBudget, scope: scope, limit: lim.TokenBudget, n: est, per: p})
		}
	}
	add("", t.Limits)
	if ml, ok := t.ModelLimits[model]; ok && model != "" {
		add(model, ml)
	}
	if ml, ok := t.ModelLimits[base]; ok && base != "" && base != model {
		add(base, ml)
	}
	return out
}

// Admit decides whether t may send a request for model that is expected to
// use estTokens tokens (prompt plus max output). When allowed, the returned
// Reservation must be finished exactly once with the real token count. The
// error is non-nil only when the limiter could not decide (fail-closed with
// Redis down, or ctx ended); the Decision is then a rejection.
func (l *Limiter) Admit(ctx context.Context, t *tenant.Tenant, model string, estTokens int) (*Reservation, Decision, error) {
	if t == nil {
		return nil, Decision{}, errors.New("ratelimit: nil tenant")
	}
	l.admits.Add(1)
	est := int64(max(estTokens, 0))
	base := ""
	if l.opts.BaseModel != nil && len(t.ModelLimits) > 0 {
		base = l.opts.BaseModel(model)
	}
	needs := needsFor(t, model, base, est)
	if len(needs) == 0 {
		return &Reservation{}, Decision{Allowed: true}, nil
	}
	st := l.state(t.ID)
	now := time.Now()
	st.mu.Lock()
	for st.evicted {
		// The loop dropped this idle state between lookup and lock.
		st.mu.Unlock()
		st = l.state(t.ID)
		st.mu.Lock()
	}
	rs := st.resolve(l, needs, now)
	if st.fits(rs, now) {
		res, d := st.consume(l, rs, now)
		prefetch := st.wantsRefill(l, now)
		st.mu.Unlock()
		if prefetch {
			l.prefetch(st)
		}
		return res, d, nil
	}
	if d, ok := st.cachedDenial(rs, now); ok {
		st.mu.Unlock()
		return nil, d, nil
	}
	st.mu.Unlock()

	if l.down.Load() {
		return l.fallback(st, rs)
	}
	st.fetchMu.Lock()
	defer st.fetchMu.Unlock()
	// Admissions on the local fast path do not wait for fetchMu, so a
	// fresh grant can be spent by them before we use it: try a few times.
	for attempt := 0; ; attempt++ {
		now = time.Now()
		st.mu.Lock()
		if st.fits(rs, now) {
			res, d := st.consume(l, rs, now)
			st.mu.Unlock()
			return res, d, nil
		}
		if d, ok := st.cachedDenial(rs, now); ok {
			st.mu.Unlock()
			return nil, d, nil
		}
		if attempt == 3 {
			// Still short after three grants: reject, naming the limit.
			d := st.decision(rs, now)
			if r := st.short(rs, now); r != nil {
				d = st.refusal(rs, r, now)
			}
			d.RetryAfter = l.opts.SyncInterval
			st.mu.Unlock()
			return nil, d, nil
		}
		st.mu.Unlock()
		if l.down.Load() {
			return l.fallback(st, rs)
		}
		denied, err := l.sync(ctx, st, rs, false, &l.admitSyncs)
		if err != nil {
			if ctx.Err() != nil {
				return nil, Decision{Reason: ReasonUnavailable}, fmt.Errorf("ratelimit: %w", ctx.Err())
			}
			return l.fallback(st, rs)
		}
		if denied != nil {
			now = time.Now()
			st.mu.Lock()
			d := st.refusal(rs, denied, now)
			d.RetryAfter = max(denied.retryAt.Sub(now), 0)
			st.mu.Unlock()
			return nil, d, nil
		}
	}
}

// sync runs one script call for st: the needs in rs (nil for background
// work), plus every pending refund, debt, expiry and heartbeat.
func (l *Limiter) sync(ctx context.Context, st *tenantState, rs []item, refill bool, counter *atomic.Int64) (*resource, error) {
	st.mu.Lock()
	now := time.Now()
	keys, ops := st.buildOps(l, rs, now, refill)
	st.mu.Unlock()
	if len(ops) == 0 {
		return nil, nil
	}
	cctx := ctx
	if l.shared {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, l.opts.Timeout)
		defer cancel()
		l.redisCalls.Add(1)
		counter.Add(1)
	}
	sent := time.Now()
	results, err := l.be.run(cctx, keys, ops, l.opts.ReplicaID)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.lastSync = time.Now()
	if err != nil {
		l.redisErrors.Add(1)
		st.restore(ops)
		if ctx.Err() == nil && l.shared {
			l.failed(err, keys)
		}
		return nil, err
	}
	if l.shared {
		l.succeeded()
	}
	return st.apply(l, ops, results, sent, time.Now()), nil
}

func (l *Limiter) prefetch(st *tenantState) {
	if !st.prefetching.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer st.prefetching.Store(false)
		if l.down.Load() || l.closing.Load() {
			return
		}
		st.fetchMu.Lock()
		defer st.fetchMu.Unlock()
		_, _ = l.sync(context.Background(), st, nil, true, &l.prefetchSyncs)
	}()
}

// failed counts a failed call and marks Redis down after FailAfter in a
// row. On a Redis Cluster it also asks the client to reload the slot map:
// go-redis reloads it on MOVED or READONLY replies, not on a connection
// error, so after a failover it would keep calling the dead master.
func (l *Limiter) failed(err error, keys []string) {
	if cc, ok := l.opts.Redis.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background()) // asynchronous, coalesced
	}
	l.downMu.Lock()
	defer l.downMu.Unlock()
	l.fails++
	if len(keys) > 0 {
		l.probeKey = keys[0]
	}
	if l.fails < l.opts.FailAfter || l.down.Load() {
		if !l.down.Load() {
			l.opts.Logger.Debug("ratelimit: redis call failed", "err", err, "in_a_row", l.fails)
		}
		return
	}
	l.backoff = l.opts.Backoff
	l.nextProbe = time.Now().Add(l.backoff)
	l.down.Store(true)
	mode := "open"
	if l.opts.FailClosed {
		mode = "closed"
	}
	l.opts.Logger.Warn("ratelimit: redis unreachable; using local limits", "fail", mode, "err", err, "in_a_row", l.fails, "retry_in", l.backoff)
}

func (l *Limiter) succeeded() {
	l.downMu.Lock()
	l.fails = 0
	l.downMu.Unlock()
}

// probe is called by the loop while down; no request waits on it. It
// reads a key of the call that failed last (EXISTS), so on a Redis Cluster
// it reaches the node serving that slot: a PING, which any live node
// answers, would declare Redis back while that slot's master is dead.
func (l *Limiter) probe(ctx context.Context) {
	l.downMu.Lock()
	if time.Now().Before(l.nextProbe) {
		l.downMu.Unlock()
		return
	}
	key := l.probeKey
	l.downMu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, max(l.opts.Timeout, 100*time.Millisecond))
	var err error
	if key != "" {
		err = l.opts.Redis.Exists(cctx, key).Err()
	} else {
		err = l.opts.Redis.Ping(cctx).Err()
	}
	cancel()
	if err != nil {
		if cc, ok := l.opts.Redis.(*redis.ClusterClient); ok {
			cc.ReloadState(context.Background())
		}
	}
	l.downMu.Lock()
	defer l.downMu.Unlock()
	if err != nil {
		l.backoff = min(2*l.backoff, l.opts.MaxBackoff)
		l.nextProbe = time.Now().Add(l.backoff)
		return
	}
	l.opts.Logger.Info("ratelimit: redis reachable again")
	l.fails = 0
	l.down.Store(false)
}

func (l *Limiter) loop(ctx context.Context) {
	defer close(l.done)
	for range clock.Ticks(ctx, l.opts.SyncInterval) {
		if l.down.Load() {
			l.probe(ctx)
			continue
		}
		now := time.Now()
		for _, st := range l.snapshotStates() {
			st.mu.Lock()
			due := st.backgroundDue(l, now)
			idle := st.idle(now, l.opts.idleAfter)
			st.mu.Unlock()
			if idle {
				l.mu.Lock()
				// Re-check under both locks so a new admission is not lost.
				st.mu.Lock()
				if st.idle(now, l.opts.idleAfter) {
					delete(l.states, st.id)
					st.evicted = true
				}
				st.mu.Unlock()
				l.mu.Unlock()
				continue
			}
			if !due {
				continue
			}
			if !st.fetchMu.TryLock() {
				continue // an admission is syncing this tenant right now
			}
			_, _ = l.sync(ctx, st, nil, true, &l.backgroundSyncs)
			st.fetchMu.Unlock()
			if l.down.Load() {
				break
			}
		}
	}
}

func (l *Limiter) snapshotStates() []*tenantState {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*tenantState, 0, len(l.states))
	for _, st := range l.states {
		out = append(out, st)
	}
	return out
}

func (l *Limiter) state(id string) *tenantState {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.states[id]
	if st == nil {
		st = &tenantState{id: id, res: map[resKey]*resource{}}
		l.states[id] = st
	}
	return st
}

// fallback admits against per-replica local limits (limit ÷ Replicas)
// while Redis is unreachable, or rejects when failing closed.
func (l *Limiter) fallback(st *tenantState, rs []item) (*Reservation, Decision, error) {
	if l.opts.FailClosed {
		return nil, Decision{Reason: ReasonUnavailable, RetryAfter: l.opts.Backoff}, ErrUnavailable
	}
	now := time.Now()
	st.mu.Lock()
	defer st.mu.Unlock()
	n := float64(l.opts.Replicas)
	var reserved []*rate.Reservation
	cancel := func() {
		for _, r := range reserved {
			r.CancelAt(now)
		}
	}
	for _, it := range rs {
		r := it.r
		share := max(1, int64(math.Ceil(float64(r.limit)/n)))
		var ok bool
		switch r.k {
		case kRPM, kTPM:
			lim := r.localLimiter(share, l.win())
			amount := int(min(it.n, share))
			res := lim.ReserveN(now, amount)
			ok = res.OK() && res.DelayFrom(now) == 0
			if res.OK() && !ok {
				res.CancelAt(now)
			}
			if ok {
				reserved = append(reserved, res)
			}
		case kConc:
			ok = r.inUse < share
		case kBudget:
			ok = r.lastRemaining < 0 || r.outageSpent+it.n <= r.lastRemaining/int64(l.opts.Replicas)
		}
		if !ok {
			cancel()
			d := st.refusal(rs, r, now)
			d.RetryAfter, d.Degraded = time.Second, true
			return nil, d, nil
		}
	}
	res := &Reservation{l: l, st: st, local: true}
	for _, it := range rs {
		r := it.r
		p := part{r: r, n: it.n}
		switch r.k {
		case kRPM, kTPM:
			// Counted in Redis as a charge to the current bucket with the
			// next call that succeeds, so the window sees what the local
			// limits let through (TPM settles to the actual count).
			r.addLocal(it.n, now, l.win())
		case kConc:
			r.inUse++
		case kBudget:
			r.outageSpent += it.n
		}
		res.parts = append(res.parts, p)
	}
	d := st.decision(rs, now)
	d.Allowed, d.Degraded = true, true
	l.degraded.Add(1)
	return res, d, nil
}

// Reservation is an admitted request's hold on its tenant's limits.
type Reservation struct {
	l     *Limiter
	st    *tenantState
	parts []part
	local bool // admitted by fail-open local limits
	done  atomic.Bool
}

type part struct {
	r    *resource
	n    int64
	uses []chunkUse
}

type chunkUse struct {
	bucket int64
	period string
	n      int64
}

// Finish reconciles the estimate with actualTokens — refunding or charging
// the difference against TPM and the budget — and frees the concurrency
// slot. Later calls do nothing; a nil Reservation is fine. It never waits
// for Redis: refunds travel with the next sync.
func (r *Reservation) Finish(ctx context.Context, actualTokens int) {
	if r == nil || r.st == nil || !r.done.CompareAndSwap(false, true) {
		return
	}
	actual := int64(max(actualTokens, 0))
	st := r.st
	now := time.Now()
	st.mu.Lock()
	st.lastUse = now
	for _, p := range r.parts {
		st.finishPart(p, actual, r.local, now, r.l.win())
	}
	st.mu.Unlock()
}

// ReplicaID names this replica's concurrency holdings in Redis.
func (l *Limiter) ReplicaID() string { return l.opts.ReplicaID }

// Replicas is the configured number of replicas sharing Redis.
func (l *Limiter) Replicas() int { return l.opts.Replicas }

// FailClosed reports whether the limiter refuses requests while Redis is
// unreachable (otherwise it falls back to local limits).
func (l *Limiter) FailClosed() bool { return l.opts.FailClosed }
