package server

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/shared/openai"
	"github.com/infergate/infergate/sim/engine"
	"github.com/infergate/infergate/sim/kvpub"
)

// kvSink turns the engine's prefix-cache changes into KV-cache events on
// the pod's publisher. Its methods run under the Realtime's lock.
type kvSink struct {
	pub     atomic.Pointer[kvpub.Publisher]
	loraIDs map[string]int // adapter → vLLM-style integer id, from 1
}

func (k *kvSink) BlockStored(r *engine.Request, i int, hash, parent uint64, hasParent bool) {
	p := k.pub.Load()
	lo, hi := i*engine.BlockSize, (i+1)*engine.BlockSize
	if p == nil || hi > len(r.TokenIDs) {
		return // a request without token ids cannot be reported
	}
	id := 0
	if r.Adapter != "" {
		if id = k.loraIDs[r.Adapter]; id == 0 {
			id = len(k.loraIDs) + 1
			k.loraIDs[r.Adapter] = id
		}
	}
	p.Stored(hash, parent, hasParent, r.TokenIDs[lo:hi], r.Adapter, id)
}

func (k *kvSink) BlockRemoved(hash uint64) {
	if p := k.pub.Load(); p != nil {
		p.Removed(hash)
	}
}

func (k *kvSink) AllBlocksCleared() {
	if p := k.pub.Load(); p != nil {
		p.Cleared()
	}
}

// openKVEvents opens the publisher if one is configured and not yet open
// (Listen opens it before serving, so its addresses are known on return).
func (s *Server) openKVEvents(ctx context.Context) error {
	if s.kv == nil {
		return nil
	}
	s.kvMu.Lock()
	defer s.kvMu.Unlock()
	if s.kv.pub.Load() != nil {
		return nil
	}
	cfg := s.cfg.KVEvents
	if cfg.Logger == nil {
		cfg.Logger = s.log
	}
	p, err := kvpub.Open(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pod %s: %w", s.cfg.Name, err)
	}
	s.kv.pub.Store(p)
	s.log.Info("publishing KV-cache events", "endpoint", cfg.Endpoint, "bound", p.Addr(),
		"replay", p.ReplayAddr(), "topic", cfg.Topic, "legacy", cfg.Legacy)
	return nil
}

func (s *Server) closeKVEvents() {
	if s.kv == nil {
		return
	}
	s.kvMu.Lock()
	defer s.kvMu.Unlock()
	if p := s.kv.pub.Swap(nil); p != nil {
		_ = p.Close()
	}
}

// KVEventsAddr is the bound address of the pod's KV-event publisher
// (tcp://host:port), "" when it publishes none or connects instead.
func (s *Server) KVEventsAddr() string {
	if s.kv == nil {
		return ""
	}
	if p := s.kv.pub.Load(); p != nil {
		return p.Addr()
	}
	return ""
}

// KVEventsReplayAddr is the bound address of the replay socket, "" when
// there is none.
func (s *Server) KVEventsReplayAddr() string {
	if s.kv == nil {
		return ""
	}
	if p := s.kv.pub.Load(); p != nil {
		return p.ReplayAddr()
	}
	return ""
}

// KVEventsSubscribed reports whether a subscriber is listening to the
// pod's KV events (tests wait for it: events published before are lost).
func (s *Server) KVEventsSubscribed() bool {
	if s.kv == nil {
		return false
	}
	p := s.kv.pub.Load()
	return p != nil && p.Subscribed()
}

// handleResetPrefixCache is vLLM's POST /reset_prefix_cache: it drops the
// prefix cache (AllBlocksCleared), refused while requests hold KV blocks.
func (s *Server) handleResetPrefixCache(w http.ResponseWriter, _ *http.Request) {
	var ok bool
	s.rt.Do(func(e *engine.Engine, _ time.Duration) { ok = e.ResetPrefixCache() })
	if !ok {
		openai.Errorf(w, http.StatusConflict, "busy", "the prefix cache cannot be reset while requests hold KV blocks; retry when the pod is idle")
		return
	}
	w.WriteHeader(http.StatusOK)
}
