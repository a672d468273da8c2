package picker

import "time"

// This file is the tracker's side of state sharing between Tier 1
// replicas (tier1/peers, docs/tier1-replicas.md): each replica tells its
// peers its own per-pod in-flight counts, and adds theirs to its own.

// ReplicaLoad is one replica's own in-flight counts on one pod.
type ReplicaLoad struct {
	InFlight, Prefill      int
	PromptTokens, Uncached int
	// Version grows with every change on the replica that counted it; a
	// snapshot with a lower version than one already seen is stale.
	Version uint64
}

func (l ReplicaLoad) sub(o ReplicaLoad) ReplicaLoad {
	return ReplicaLoad{InFlight: l.InFlight - o.InFlight, Prefill: l.Prefill - o.Prefill,
		PromptTokens: l.PromptTokens - o.PromptTokens, Uncached: l.Uncached - o.Uncached}
}

func (l ReplicaLoad) add(o ReplicaLoad) ReplicaLoad {
	return ReplicaLoad{InFlight: l.InFlight + o.InFlight, Prefill: l.Prefill + o.Prefill,
		PromptTokens: l.PromptTokens + o.PromptTokens, Uncached: l.Uncached + o.Uncached}
}

func (st *podState) local() ReplicaLoad {
	return ReplicaLoad{InFlight: st.inFlight, Prefill: st.prefill, PromptTokens: st.promptTokens, Uncached: st.uncached, Version: st.version}
}

// Observer hears of changes to a tracker's local counts. Its methods are
// called with the tracker's lock held, in order per pod: they must return
// at once (copy what they keep, hand off without blocking) and must not
// call back into the tracker. hashes is only valid during the call.
type Observer interface {
	// Dispatched: a request with these prefix block hashes went to pod;
	// load is the pod's local counts after it.
	Dispatched(pod string, hashes []uint64, load ReplicaLoad)
	// Changed: the pod's local counts are now load (a first token or a
	// completion).
	Changed(pod string, load ReplicaLoad)
	// Sampled: the pod prefilled tokens (its own and those queued ahead)
	// in ttft, a sample its prefill-speed estimate learned from.
	Sampled(pod string, tokens int, ttft time.Duration)
}

type observerBox struct{ Observer }

// SetObserver sets (nil: clears) the observer of local changes.
func (t *Tracker) SetObserver(o Observer) {
	if o == nil {
		t.obs.Store(nil)
		return
	}
	t.obs.Store(&observerBox{o})
}

func (t *Tracker) notifyLocked(pod string, st *podState) {
	if o := t.obs.Load(); o != nil {
		t.seq++
		st.version = t.seq
		o.Changed(pod, st.local())
	}
}

// LocalLoads returns the tracker's own counts of every pod it has state
// for (peer replicas' excluded): what a replica re-announces periodically
// so that peers heal from lost updates.
func (t *Tracker) LocalLoads() map[string]ReplicaLoad {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]ReplicaLoad, len(t.pods))
	for name, st := range t.pods {
		out[name] = st.local()
	}
	return out
}

// SetRemote sets what replica origin has in flight on pod, replacing what
// it said before; a zero load forgets it. Stale versions are ignored.
// Scorers see the sum of the local and every replica's counts.
func (t *Tracker) SetRemote(origin, pod string, l ReplicaLoad) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.pods[pod]
	if st == nil {
		if l.InFlight == 0 && l.Prefill == 0 && l.PromptTokens == 0 && l.Uncached == 0 {
			return
		}
		st = t.remotePod(pod)
	}
	old, had := st.remote[origin]
	if had && l.Version != 0 && l.Version < old.Version {
		return
	}
	st.rsum = st.rsum.sub(old).add(l)
	if l.InFlight == 0 && l.Prefill == 0 && l.PromptTokens == 0 && l.Uncached == 0 && l.Version == 0 {
		delete(st.remote, origin)
		return
	}
	if st.remote == nil {
		st.remote = make(map[string]ReplicaLoad)
	}
	st.remote[origin] = l
}

// RecordRemote records that replica sent a request with these prefix
// blocks to pod, so local requests sharing the prefix follow it there.
// The hashes are as the peer's index holds them: keyed when the index has
// a key (prefix.Index.SetKey), which the peer shares.
func (t *Tracker) RecordRemote(pod string, hashes []uint64) {
	t.idx.RecordKeyed(pod, hashes)
}

// remotePod returns pod's state, creating it as one only peers' state
// holds (freed by DropRemote when no peer counts on it any more).
func (t *Tracker) remotePod(name string) *podState {
	st := t.pods[name]
	if st == nil {
		st = &podState{remoteOnly: true}
		t.pods[name] = st
	}
	return st
}

// DropRemote forgets everything replica origin said about in-flight work
// (it stopped, or has not been heard from within the TTL), and frees the
// entries of pods only peers' state held that no peer counts on any more
// (a peer naming pods this replica never used costs nothing once it
// expires). Prefix blocks it recorded stay: the pods still hold them.
func (t *Tracker) DropRemote(origin string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, st := range t.pods {
		if old, ok := st.remote[origin]; ok {
			st.rsum = st.rsum.sub(old)
			delete(st.remote, origin)
		}
		if st.remoteOnly && len(st.remote) == 0 {
			delete(t.pods, name)
		}
	}
}

// PodStates returns how many pods the tracker holds state for, its own
// or peers'.
func (t *Tracker) PodStates() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.pods)
}

// RemoteSample teaches pod's prefill-speed estimate a sample a peer
// replica measured (see Observer.Sampled), so every replica learns from
// every first token, not only its own share.
func (t *Tracker) RemoteSample(pod string, tokens int, ttft time.Duration) {
	if tokens < t.opts.MinSampleTokens || ttft <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.remotePod(pod).speed.add(t.opts.Alpha, float64(tokens), ttft.Seconds())
}

// RemoteInFlight returns what peer replicas have in flight on pod.
func (t *Tracker) RemoteInFlight(pod string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.pods[pod]; st != nil {
		return st.rsum.InFlight
	}
	return 0
}
