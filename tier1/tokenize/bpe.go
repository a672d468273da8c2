package tokenize

import (
	"container/heap"
	"math"
)

// byteLevelRunes is GPT-2's bytes_to_unicode: the printable character that
// stands for each byte in a byte-level vocabulary ("Ġ" for a space).
var byteLevelRunes = func() (m [256]rune) {
	n := 0
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}()

// byteLevelDecode maps a vocabulary entry back to the raw bytes it stands
// for; ok is false when the entry has a character outside the byte-level
// alphabet (such an entry can never be produced from text).
func byteLevelDecode(s string, inverse map[rune]byte) (raw string, ok bool) {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		c, found := inverse[r]
		if !found {
			return "", false
		}
		b = append(b, c)
	}
	return string(b), true
}

// noRank marks "no merge for this pair".
const noRank = math.MaxUint32

// bpe is a byte-level BPE model whose vocabulary is keyed by the raw bytes
// each token stands for, so a piece of text is looked up without mapping it
// to byte-level characters first.
type bpe struct {
	vocab        map[string]uint32 // raw bytes → id
	byteIDs      [256]uint32       // the id of each single byte
	merges       map[uint64]uint64 // left<<32|right → rank<<32|merged id
	ignoreMerges bool              // a piece found whole in vocab is one token (Llama-3)
	cache        *pieceCache       // nil: none
}

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

func (m *bpe) merge(a, b uint32) (rank, id uint32) {
	v, ok := m.merges[pairKey(a, b)]
	if !ok {
		return noRank, 0
	}
	return uint32(v >> 32), uint32(v)
}

// heapThreshold is the piece length (in bytes) above which encode switches
// from the quadratic scan to a heap. The scan is faster on the short pieces
// that make up nearly all text; the heap bounds the cost of a pathological
// piece (a 32 KB run of letters) at O(n log n).
const heapThreshold = 128

// encode appends the ids of one pre-tokenized piece. Merges apply lowest
// rank first, leftmost first among equal ranks, which is the order the
// Hugging Face tokenizers library's priority queue produces.
func (m *bpe) encode(dst []uint32, piece string) []uint32 {
	if len(piece) == 1 {
		return append(dst, m.byteIDs[piece[0]])
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[piece]; ok {
			return append(dst, id)
		}
	}
	if len(piece) > heapThreshold {
		return m.encodeHeap(dst, piece)
	}
	cacheable := m.cache != nil && len(piece) <= cacheMaxPiece
	if cacheable {
		if ids, ok := m.cache.get(piece); ok {
			return append(dst, ids...)
		}
	}
	var idBuf, rankBuf [heapThreshold]uint32
	n := len(piece)
	ids, ranks := idBuf[:n], rankBuf[:n-1]
	for i := range n {
		ids[i] = m.byteIDs[piece[i]]
	}
	for i := range n - 1 {
		ranks[i], _ = m.merge(ids[i], ids[i+1])
	}
	for len(ranks) > 0 {
		best, bestRank := -1, uint32(noRank)
		for i, r := range ranks {
			if r < bestRank {
				best, bestRank = i, r
			}
		}
		if best < 0 {
			break
		}
		_, ids[best] = m.merge(ids[best], ids[best+1])
		copy(ids[best+1:], ids[best+2:])
		ids = ids[:len(ids)-1]
		copy(ranks[best:], ranks[best+1:])
		ranks = ranks[:len(ranks)-1]
		if best > 0 {
			ranks[best-1], _ = m.merge(ids[best-1], ids[best])
		}
		if best < len(ranks) {
			ranks[best], _ = m.merge(ids[best], ids[best+1])
		}
	}
	if cacheable {
		m.cache.put(piece, ids)
	}
	return append(dst, ids...)
}

// mergeHeap holds candidate merges as rank<<32|position, so the smallest
// value is the lowest rank and, among equal ranks, the leftmost pair.
type mergeHeap []uint64

func (h mergeHeap) Len() int           { return len(h) }
func (h mergeHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h mergeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)        { *h = append(*h, x.(uint64)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// encodeHeap is encode for long pieces: symbols in a linked list, candidate
// merges in a heap; a popped candidate whose pair has since changed is
// skipped, as in the Hugging Face implementation.
func (m *bpe) encodeHeap(dst []uint32, piece string) []uint32 {
	n := len(piece)
	ids := make([]uint32, n)
	next := make([]int32, n)
	prev := make([]int32, n)
	alive := make([]bool, n)
	h := make(mergeHeap, 0, n)
	for i := range n {
		ids[i] = m.byteIDs[piece[i]]
		next[i] = int32(i + 1)
		prev[i] = int32(i - 1)
		alive[i] = true
	}
	next[n-1] = -1
	for i := range n - 1 {
		if r, _ := m.merge(ids[i], ids[i+1]); r != noRank {
			h = append(h, uint64(r)<<32|uint64(i))
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		top := heap.Pop(&h).(uint64)
		rank, pos := uint32(top>>32), int32(uint32(top))
		if !alive[pos] || next[pos] < 0 {
			continue
		}
		right := next[pos]
		r, id := m.merge(ids[pos], ids[right])
		if r != rank {
			continue // stale: the pair at pos changed since it was queued
		}
		ids[pos] = id
		alive[right] = false
		next[pos] = next[right]
		if next[pos] >= 0 {
			prev[next[pos]] = pos
		}
		if p := prev[pos]; p >= 0 {
			if r, _ := m.merge(ids[p], ids[pos]); r != noRank {
				heap.Push(&h, uint64(r)<<32|uint64(p))
			}
		}
		if nx := next[pos]; nx >= 0 {
			if r, _ := m.merge(ids[pos], ids[nx]); r != noRank {
				heap.Push(&h, uint64(r)<<32|uint64(pos))
			}
		}
	}
	for i := int32(0); i >= 0; i = next[i] {
		dst = append(dst, ids[i])
	}
	return dst
}
