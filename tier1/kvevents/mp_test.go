package kvevents

import (
	"encoding/binary"
	"math"
)

// mp assembles msgpack by hand, byte by byte from the format's spec
// (github.com/msgpack/msgpack/blob/master/spec.md), so golden payloads do
// not depend on the msgpack library the decoder uses.
type mp []byte

func (b mp) arr(n int) mp {
	if n < 16 {
		return append(b, 0x90|byte(n))
	}
	return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
}

func (b mp) mapn(n int) mp {
	if n < 16 {
		return append(b, 0x80|byte(n))
	}
	return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
}

func (b mp) str(s string) mp {
	if len(s) < 32 {
		return append(append(b, 0xa0|byte(len(s))), s...)
	}
	return append(append(b, 0xd9, byte(len(s))), s...)
}

func (b mp) null() mp { return append(b, 0xc0) }

// uint writes v in the smallest unsigned form, as msgspec does.
func (b mp) uint(v uint64) mp {
	switch {
	case v < 128:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

func (b mp) i64(v int64) mp { return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v)) }

func (b mp) f64(v float64) mp {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(v))
}

func (b mp) bin(p []byte) mp { return append(append(b, 0xc4, byte(len(p))), p...) }

func (b mp) uints(vs ...uint64) mp {
	b = b.arr(len(vs))
	for _, v := range vs {
		b = b.uint(v)
	}
	return b
}

func (b mp) tokens(ts []uint32) mp {
	b = b.arr(len(ts))
	for _, t := range ts {
		b = b.uint(uint64(t))
	}
	return b
}

// storedMap is vLLM's BlockStored since vllm#42892 (msgspec, tag first,
// fields in declaration order, defaults omitted). parent 0 is nil.
func (b mp) storedMap(hashes []uint64, parent uint64, tokens []uint32, bs int, lora string) mp {
	b = b.mapn(8).str("type").str("BlockStored")
	b = b.str("block_hashes").uints(hashes...)
	b = b.str("parent_block_hash")
	if parent == 0 {
		b = b.null()
	} else {
		b = b.uint(parent)
	}
	b = b.str("token_ids").tokens(tokens).str("block_size").uint(uint64(bs))
	b = b.str("lora_id")
	if lora == "" {
		b = b.null()
	} else {
		b = b.uint(1)
	}
	b = b.str("medium").str("GPU").str("lora_name")
	if lora == "" {
		return b.null()
	}
	return b.str(lora)
}

// storedArray is llm-d-inference-sim's positional BlockStored: nine
// fields, nil where absent, parent 0 for none.
func (b mp) storedArray(hashes []uint64, parent uint64, tokens []uint32, bs int, lora string) mp {
	b = b.arr(9).str("BlockStored").uints(hashes...).uint(parent).tokens(tokens).uint(uint64(bs))
	if lora == "" {
		return b.null().str("GPU").null().null()
	}
	return b.uint(1).str("GPU").str(lora).null()
}

func (b mp) removedMap(hashes ...uint64) mp {
	return b.mapn(3).str("type").str("BlockRemoved").str("block_hashes").uints(hashes...).str("medium").str("GPU")
}

func (b mp) removedArray(hashes ...uint64) mp {
	return b.arr(3).str("BlockRemoved").uints(hashes...).str("GPU")
}

func (b mp) clearedMap() mp   { return b.mapn(1).str("type").str("AllBlocksCleared") }
func (b mp) clearedArray() mp { return b.arr(1).str("AllBlocksCleared") }

// batchMap wraps n already-encoded events in vLLM's current batch map.
func batchMap(n int, events mp) mp {
	b := mp{}.mapn(3).str("ts").f64(1750000000.25).str("events").arr(n)
	b = append(b, events...)
	return b.str("data_parallel_rank").uint(0)
}

// batchArray wraps events in the positional batch [ts, events, rank].
func batchArray(n int, events mp) mp {
	b := mp{}.arr(3).f64(1750000000.25).arr(n)
	b = append(b, events...)
	return b.uint(0)
}

func seqTokens(start, n int) []uint32 {
	ts := make([]uint32, n)
	for i := range ts {
		ts[i] = uint32(start + i)
	}
	return ts
}
