package tokenize

import (
	"hash/maphash"
	"strings"
	"sync/atomic"
)

// pieceCache remembers the ids of recently encoded pieces, as the Hugging
// Face library's BPE cache does: words repeat, and a hit costs one hash
// instead of a lookup per byte pair. It is direct-mapped and lock-free: a
// slot holds the last piece hashed to it, so concurrent requests never
// wait on each other, and its size is fixed (cacheSlots entries of pieces
// up to cacheMaxPiece bytes, about 2 MB at most).
type pieceCache struct {
	seed  maphash.Seed
	slots []atomic.Pointer[cacheEntry]
}

type cacheEntry struct {
	piece string
	ids   []uint32
}

const (
	cacheSlots    = 1 << 14
	cacheMaxPiece = 48
)

func newPieceCache() *pieceCache {
	return &pieceCache{seed: maphash.MakeSeed(), slots: make([]atomic.Pointer[cacheEntry], cacheSlots)}
}

func (c *pieceCache) slot(piece string) *atomic.Pointer[cacheEntry] {
	return &c.slots[maphash.String(c.seed, piece)&(cacheSlots-1)]
}

func (c *pieceCache) get(piece string) ([]uint32, bool) {
	if e := c.slot(piece).Load(); e != nil && e.piece == piece {
		return e.ids, true
	}
	return nil, false
}

// put stores a copy of piece (a substring of a request's text, which must
// not be kept alive) and ids.
func (c *pieceCache) put(piece string, ids []uint32) {
	c.slot(piece).Store(&cacheEntry{piece: strings.Clone(piece), ids: append([]uint32(nil), ids...)})
}
