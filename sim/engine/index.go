package engine

import "math/bits"

// blockIndex maps block hashes to cache entries: open addressing with
// linear probing and backward-shift deletion. The prefix cache inserts and
// evicts constantly at a steady size, which leaves Go maps probing through
// tombstones; this table has none, keeps key and value in one slot (one
// cache miss per probe) and never grows (at most one entry per KV block, so
// the load stays ≤ 1/2).
type blockIndex struct {
	slots []indexSlot
	shift uint
	mask  int
}

type indexSlot struct {
	key uint64
	val int32 // -1: empty
}

func newBlockIndex(maxEntries int) blockIndex {
	size := 16
	for size < 2*maxEntries {
		size <<= 1
	}
	t := blockIndex{
		slots: make([]indexSlot, size),
		shift: uint(64 - bits.TrailingZeros(uint(size))),
		mask:  size - 1,
	}
	for i := range t.slots {
		t.slots[i].val = -1
	}
	return t
}

// home is the key's preferred slot (Fibonacci hashing: the caller's hashes
// need not be well mixed).
func (t *blockIndex) home(k uint64) int { return int((k * 0x9E3779B97F4A7C15) >> t.shift) }

func (t *blockIndex) get(k uint64) (int32, bool) {
	for i := t.home(k); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.val < 0 {
			return -1, false
		}
		if s.key == k {
			return s.val, true
		}
	}
}

// putIfAbsent inserts k → v unless k is present; it reports whether it
// inserted. The table must have room (callers keep entries ≤ maxEntries).
func (t *blockIndex) putIfAbsent(k uint64, v int32) bool {
	i := t.home(k)
	for {
		s := &t.slots[i]
		if s.val < 0 {
			s.key, s.val = k, v
			return true
		}
		if s.key == k {
			return false
		}
		i = (i + 1) & t.mask
	}
}

// del removes k if present, shifting later entries of its probe run back.
func (t *blockIndex) del(k uint64) {
	i := t.home(k)
	for {
		s := &t.slots[i]
		if s.val < 0 {
			return
		}
		if s.key == k {
			break
		}
		i = (i + 1) & t.mask
	}
	for j := (i + 1) & t.mask; t.slots[j].val >= 0; j = (j + 1) & t.mask {
		// The entry at j may move to the hole at i unless its home lies
		// cyclically in (i, j].
		h := t.home(t.slots[j].key)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i].val = -1
}
