package engine

import (
	"math/rand/v2"
	"testing"
)

// TestBlockIndexMatchesMap drives the index and a Go map with the same
// random inserts and deletes at a steady size (the prefix cache's pattern)
// and checks every lookup agrees.
func TestBlockIndexMatchesMap(t *testing.T) {
	tests := []struct {
		name    string
		entries int
		keySpan uint64 // small spans force collisions and long probe runs
	}{
		{"dense keys", 64, 200},
		{"sparse keys", 1000, 1 << 62},
		{"sequential", 500, 600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			idx := newBlockIndex(tt.entries)
			ref := map[uint64]int32{}
			for step := range 200_000 {
				k := rng.Uint64N(tt.keySpan)
				if _, ok := ref[k]; ok {
					idx.del(k)
					delete(ref, k)
				} else if len(ref) < tt.entries {
					if !idx.putIfAbsent(k, int32(step)) {
						t.Fatalf("putIfAbsent(%d) found an absent key", k)
					}
					ref[k] = int32(step)
				}
				if v, ok := ref[k]; ok && idx.putIfAbsent(k, -5) {
					t.Fatalf("putIfAbsent(%d) inserted over %d", k, v)
				}
				probe := rng.Uint64N(tt.keySpan)
				got, ok := idx.get(probe)
				want, wok := ref[probe]
				if ok != wok || (ok && got != want) {
					t.Fatalf("step %d get(%d) = %d,%v want %d,%v", step, probe, got, ok, want, wok)
				}
			}
			for k, v := range ref {
				if got, ok := idx.get(k); !ok || got != v {
					t.Fatalf("final get(%d) = %d,%v want %d", k, got, ok, v)
				}
			}
		})
	}
}
