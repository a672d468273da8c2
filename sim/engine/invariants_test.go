package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// checkInvariants verifies the engine's block and slot accounting.
func checkInvariants(e *Engine) error {
	refs := map[int32]int32{}
	anon := 0
	slotRunning := make([]int, len(e.slots))
	for _, s := range e.running {
		if s.state != stateRunning {
			return fmt.Errorf("running request %d in state %d", s.id, s.state)
		}
		tokens := s.computed
		if e.busy {
			tokens += s.sched // the step in flight writes these
		}
		if s.nblocks < blocksFor(tokens) {
			return fmt.Errorf("request %d holds %d blocks for %d tokens", s.id, s.nblocks, tokens)
		}
		hashed := 0
		for _, b := range s.ents {
			if b >= 0 {
				refs[b]++
				hashed++
			}
		}
		if hashed != s.nHashed {
			return fmt.Errorf("request %d: nHashed %d, counted %d", s.id, s.nHashed, hashed)
		}
		anon += s.nblocks - s.nHashed
		if s.slot >= 0 {
			slotRunning[s.slot]++
			if e.slots[s.slot].name != s.adapter {
				return fmt.Errorf("request %d (adapter %q) in slot of %q", s.id, s.adapter, e.slots[s.slot].name)
			}
		} else if s.adapter != "" {
			return fmt.Errorf("running request %d with adapter %q has no slot", s.id, s.adapter)
		}
	}
	for b, n := range refs {
		if got := e.kv.entries[b].ref; got != n {
			return fmt.Errorf("entry %d ref %d, %d holders", b, got, n)
		}
	}
	if used := len(refs) + anon; used != e.kv.used {
		return fmt.Errorf("used %d, accounted %d", e.kv.used, used)
	}
	if e.kv.used+e.kv.nLRU > e.kv.n {
		return fmt.Errorf("used %d + cached %d > %d blocks", e.kv.used, e.kv.nLRU, e.kv.n)
	}
	for i, n := range slotRunning {
		if e.slots[i].running != n {
			return fmt.Errorf("slot %d running %d, counted %d", i, e.slots[i].running, n)
		}
	}
	if len(e.running) > e.cfg.MaxNumSeqs {
		return fmt.Errorf("%d running > MaxNumSeqs %d", len(e.running), e.cfg.MaxNumSeqs)
	}
	waiting := 0
	for s := e.waiting.head; s != nil; s = s.next {
		if s.state != stateWaiting || s.nblocks != 0 {
			return fmt.Errorf("waiting request %d state %d holds %d blocks", s.id, s.state, s.nblocks)
		}
		waiting++
	}
	if waiting != e.waiting.n || waiting+len(e.running) != len(e.seqs) {
		return fmt.Errorf("waiting %d (list %d) + running %d != %d live requests", e.waiting.n, waiting, len(e.running), len(e.seqs))
	}
	return nil
}

// churnConfig is a small-KV H100 pod with two LoRA slots for three
// adapters and small steps: it preempts, loads adapters and evicts often.
func churnConfig(t testing.TB) Config {
	cfg := mustConfig(t, "llama-3.1-8b", "h100", 1)
	cfg.NumBlocks = 400
	cfg.MaxNumSeqs = 24
	cfg.MaxBatchedTokens = 512
	cfg.MaxLoras = 2
	cfg.Adapters = []string{"a", "b", "c"}
	return cfg
}

// TestInvariantsUnderChurn runs a small-KV pod with adapters, shared
// prefixes, cancellations and preemptions, checking the accounting every
// 50 ms of simulated time, with and without coalescing.
func TestInvariantsUnderChurn(t *testing.T) {
	for _, cap := range []time.Duration{0, time.Nanosecond} {
		t.Run(fmt.Sprint("coalesce cap ", cap), func(t *testing.T) {
			e := mustEngine(t, churnConfig(t))
			e.maxCoalesce = cap
			l := NewLoop()
			l.Add(e)
			rng := rand.New(rand.NewPCG(5, 6))
			adapters := []string{"", "", "a", "b", "c"}
			finished, submitted := 0, 0
			var at time.Duration
			for i := range 600 {
				at += time.Duration(rng.ExpFloat64() * float64(40*time.Millisecond))
				prompt := 20 + rng.IntN(1500)
				r := &Request{ID: uint64(i), PromptTokens: prompt, MaxTokens: 1 + rng.IntN(300),
					Adapter:     adapters[rng.IntN(len(adapters))],
					BlockHashes: hashes(uint64(rng.IntN(5)), prompt/BlockSize),
					OnDone: func(time.Duration, Result) {
						finished++
					}}
				l.At(at, func(now time.Duration) {
					if err := e.Submit(now, r); err != nil {
						t.Error(err)
					}
					submitted++
				})
				if rng.IntN(10) == 0 {
					l.At(at+time.Duration(rng.IntN(3000))*time.Millisecond, func(now time.Duration) { e.Cancel(now, r.ID) })
				}
			}
			for l.Run(l.Now() + 50*time.Millisecond); ; l.Run(l.Now() + 50*time.Millisecond) {
				if err := checkInvariants(e); err != nil {
					t.Fatalf("at %v: %v", l.Now(), err)
				}
				if _, busy := e.NextEventTime(); !busy && l.Now() > at {
					break
				}
			}
			st := e.Stats()
			if st.Preemptions == 0 || st.LoraLoads == 0 || st.PrefixCacheHits == 0 {
				t.Errorf("workload did not exercise preemption/LoRA/prefix cache: %+v", st)
			}
			if finished+len(e.seqs) > submitted || st.Running+st.Waiting != 0 || st.UsedBlocks != 0 {
				t.Errorf("finished %d of %d, stats %+v", finished, submitted, st)
			}
		})
	}
}
