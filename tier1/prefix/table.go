package prefix

// headTable maps a block hash to its chain head. It replaces a
// map[uint64]head in each shard (issue 13: the map probe was 13.5 % of
// Tier 1's CPU at 2,000 req/s). Keys are already uniformly distributed
// xxhash values, so the table uses them as they are, with no rehashing:
// open addressing with linear probing on the key's high bits (the shard was
// chosen by its low bits), and backward-shift deletion, so there are no
// tombstones and a lookup stops at the first empty slot. It also lets
// Record find a slot once and then fill it, where the map needed a lookup
// and an insert.
//
// The zero value is an empty table; it allocates on the first insert.
type headTable struct {
	slots []slot // len is a power of two, or 0
	shift uint   // 64 − log2(len(slots))
	n     int    // occupied slots
}

// slot is one entry: 16 bytes, four to a cache line. An empty slot has
// n == 0 (a stored head always has n ≥ 1), so every key value, 0 included,
// can be stored.
type slot struct {
	key uint64
	head
}

const minTableSlots = 64

// home returns the slot where probing for h starts.
func (t *headTable) home(h uint64) int { return int(h >> t.shift) }

// get returns h's head.
func (t *headTable) get(h uint64) (head, bool) {
	if t.n == 0 {
		return head{}, false
	}
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.n == 0 {
			return head{}, false
		}
		if s.key == h {
			return s.head, true
		}
	}
}

// find returns the index of h's slot and true, or of the empty slot where
// h would go and false. Call reserve first if h may then be inserted: the
// table must have an empty slot.
func (t *headTable) find(h uint64) (int, bool) {
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.n == 0 {
			return i, false
		}
		if s.key == h {
			return i, true
		}
	}
}

// reserve makes room for one more key, keeping the load at most 3/4 so
// that probe runs stay short. It invalidates slot indexes from find.
func (t *headTable) reserve() {
	if (t.n+1)*4 <= len(t.slots)*3 {
		return
	}
	size := max(2*len(t.slots), minTableSlots)
	old := t.slots
	t.slots = make([]slot, size)
	t.shift = uint(64 - log2(size))
	mask := size - 1
	for _, s := range old {
		if s.n == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].n != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}

// setAt stores hd (hd.n ≥ 1) for h at slot i, which find returned for h.
func (t *headTable) setAt(i int, h uint64, hd head) {
	if t.slots[i].n == 0 {
		t.n++
	}
	t.slots[i] = slot{key: h, head: hd}
}

// deleteAt empties slot i and shifts later entries of its probe run back
// over the hole, so that every key stays reachable from its home without
// tombstones. It invalidates other slot indexes from find.
func (t *headTable) deleteAt(i int) {
	mask := len(t.slots) - 1
	hole := i
	for j := (i + 1) & mask; t.slots[j].n != 0; j = (j + 1) & mask {
		// The entry at j may fill the hole unless its home lies cyclically
		// in (hole, j]: then it would move before its home.
		if (j-t.home(t.slots[j].key))&mask >= (j-hole)&mask {
			t.slots[hole] = t.slots[j]
			hole = j
		}
	}
	t.slots[hole] = slot{}
	t.n--
}

// len returns the number of keys held.
func (t *headTable) len() int { return t.n }

func log2(n int) int {
	k := 0
	for 1<<k < n {
		k++
	}
	return k
}
