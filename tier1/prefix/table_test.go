package prefix

import (
	"math/rand/v2"
	"testing"
)

// key returns a hash whose home slot in a minTableSlots table is home; low
// makes keys with the same home distinct.
func key(home int, low uint64) uint64 { return uint64(home)<<(64-6) | low }

func tablePut(t *headTable, h uint64, n int32) {
	t.reserve()
	i, _ := t.find(h)
	t.setAt(i, h, head{first: n, n: n})
}

func tableDelete(t *headTable, h uint64) bool {
	if t.n == 0 {
		return false
	}
	i, ok := t.find(h)
	if ok {
		t.deleteAt(i)
	}
	return ok
}

func TestHeadTable(t *testing.T) {
	type op struct {
		del bool
		h   uint64
	}
	cases := []struct {
		name string
		ops  []op
	}{
		{"zero key", []op{{h: 0}, {h: key(0, 1)}, {del: true, h: 0}}},
		{"collisions", []op{{h: key(5, 1)}, {h: key(5, 2)}, {h: key(5, 3)}, {h: key(6, 1)}}},
		{"delete first of run", []op{{h: key(5, 1)}, {h: key(5, 2)}, {h: key(5, 3)}, {del: true, h: key(5, 1)}}},
		{"delete middle of run", []op{{h: key(5, 1)}, {h: key(5, 2)}, {h: key(6, 1)}, {h: key(5, 3)}, {del: true, h: key(5, 2)}}},
		// key(7,1) sits in slot 7 of its own; key(6,2) probes past it to
		// slot 8. Deleting key(6,1) must move key(6,2) back, not key(7,1).
		{"shift only displaced", []op{{h: key(6, 1)}, {h: key(7, 1)}, {h: key(6, 2)}, {del: true, h: key(6, 1)}}},
		{"wraparound", []op{{h: key(63, 1)}, {h: key(63, 2)}, {h: key(63, 3)}, {h: key(0, 1)}, {h: key(1, 1)}}},
		{"delete across wrap", []op{{h: key(62, 1)}, {h: key(63, 1)}, {h: key(62, 2)}, {h: key(63, 2)}, {h: key(0, 1)},
			{del: true, h: key(62, 1)}, {del: true, h: key(63, 1)}}},
		{"delete absent", []op{{h: key(3, 1)}, {del: true, h: key(3, 2)}, {del: true, h: key(4, 1)}}},
		{"reinsert after delete", []op{{h: key(9, 1)}, {h: key(9, 2)}, {del: true, h: key(9, 1)}, {h: key(9, 1)}, {del: true, h: key(9, 2)}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var tab headTable
			want := map[uint64]int32{}
			for k, o := range c.ops {
				if o.del {
					_, had := want[o.h]
					if got := tableDelete(&tab, o.h); got != had {
						t.Fatalf("op %d: delete %#x = %v, want %v", k, o.h, got, had)
					}
					delete(want, o.h)
				} else {
					want[o.h] = int32(k + 1)
					tablePut(&tab, o.h, int32(k+1))
				}
				checkTable(t, &tab, want)
			}
			if len(tab.slots) != minTableSlots {
				t.Fatalf("table grew to %d slots; the crafted homes assume %d", len(tab.slots), minTableSlots)
			}
		})
	}
}

// checkTable compares tab with want: same keys and values, nothing else
// findable, and every key placed at or after its home with no empty slot
// in between (the invariant lookups rely on).
func checkTable(t *testing.T, tab *headTable, want map[uint64]int32) {
	t.Helper()
	if tab.len() != len(want) {
		t.Fatalf("len = %d, want %d", tab.len(), len(want))
	}
	for h, v := range want {
		hd, ok := tab.get(h)
		if !ok || hd.first != v || hd.n != v {
			t.Fatalf("get(%#x) = %+v, %v; want %d", h, hd, ok, v)
		}
	}
	mask := len(tab.slots) - 1
	n := 0
	for i, s := range tab.slots {
		if s.n == 0 {
			continue
		}
		n++
		if _, ok := want[s.key]; !ok {
			t.Fatalf("slot %d holds stale key %#x", i, s.key)
		}
		for j := tab.home(s.key); j != i; j = (j + 1) & mask {
			if tab.slots[j].n == 0 {
				t.Fatalf("key %#x in slot %d unreachable: slot %d on its probe path is empty", s.key, i, j)
			}
		}
	}
	if n != len(want) {
		t.Fatalf("%d occupied slots, want %d", n, len(want))
	}
}

// TestHeadTableRandom runs random inserts, updates and deletes against a
// plain map, over few enough distinct keys that deletes often hit and
// probe runs grow long and wrap, and through several growths.
func TestHeadTableRandom(t *testing.T) {
	for _, keys := range []int{40, 1000, 20000} {
		r := rand.New(rand.NewPCG(11, uint64(keys)))
		pool := make([]uint64, keys)
		for i := range pool {
			pool[i] = r.Uint64()
			if i%7 == 0 && i > 0 { // same high bits as another key: same home at every size
				pool[i] = pool[i-1]&^0xffff | r.Uint64()&0xffff
			}
		}
		var tab headTable
		want := map[uint64]int32{}
		for step := range 20 * keys {
			h := pool[r.IntN(keys)]
			if r.IntN(3) == 0 {
				_, had := want[h]
				if got := tableDelete(&tab, h); got != had {
					t.Fatalf("keys=%d step %d: delete = %v, want %v", keys, step, got, had)
				}
				delete(want, h)
			} else {
				v := int32(step + 1)
				want[h] = v
				tablePut(&tab, h, v)
			}
			if step%(keys/4+1) == 0 {
				checkTable(t, &tab, want)
			}
			if tab.len()*4 > len(tab.slots)*3 {
				t.Fatalf("load %d/%d above 3/4", tab.len(), len(tab.slots))
			}
		}
		checkTable(t, &tab, want)
		for h := range want {
			if !tableDelete(&tab, h) {
				t.Fatalf("delete %#x: not found", h)
			}
		}
		checkTable(t, &tab, map[uint64]int32{})
	}
}
