package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/infergate/infergate/shared/config"
)

// The wire format, as vLLM defines it in vllm/distributed/kv_events.py
// (EventBatch, KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared;
// msgspec structs with tag=True and omit_defaults=True) and as
// llm-d-router reads it (pkg/kvevents/engineadapter/vllm_msgpack.go):
//
//	batch   [ts, events, data_parallel_rank]             (array_like, before vllm#42892)
//	        {"ts": …, "events": […], "data_parallel_rank": …} (since)
//	event   ["BlockStored", block_hashes, parent_block_hash, token_ids,
//	         block_size, lora_id, medium, lora_name, extra_keys, group_idx, …]
//	        {"type": "BlockStored", "block_hashes": …, …}      (since)
//	        ["BlockRemoved", block_hashes, medium, group_idx]
//	        ["AllBlocksCleared"]
//
// A block hash is an integer or, with vLLM's sha256 hashing, bytes.
// llm-d-inference-sim always sends nine BlockStored fields, nil where
// absent, and a parent hash of 0 for none. Trailing fields this decoder
// does not know are skipped, so a newer engine's additions do not break it.

// EventKind is the type of a KV-cache event.
type EventKind uint8

// Event kinds. KindUnknown is an event whose tag this decoder does not
// know: it is skipped, not an error, so a new event type does not make a
// whole batch unreadable.
const (
	KindUnknown EventKind = iota
	KindBlockStored
	KindBlockRemoved
	KindAllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case KindBlockStored:
		return "BlockStored"
	case KindBlockRemoved:
		return "BlockRemoved"
	case KindAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Event is one decoded KV-cache event.
type Event struct {
	Kind EventKind
	// BlockHashes are the engine's hashes of the stored or removed blocks
	// (bytes hashes longer than 8 bytes are reduced with xxhash64).
	BlockHashes []uint64
	// ParentHash is the engine hash of the block before the first stored
	// one; HasParent is false for nil and for 0 (llm-d-inference-sim's
	// "none").
	ParentHash uint64
	HasParent  bool
	// TokenIDs are the stored blocks' tokens, BlockSize per block.
	TokenIDs  []uint32
	BlockSize int
	// LoRAName (vLLM's lora_name) or, in older engines, LoRAID names the
	// adapter; neither set is the base model.
	LoRAID      int64
	HasLoRAID   bool
	LoRAName    string
	HasLoRAName bool
	// Medium is where the blocks live ("GPU", "CPU", …); "" when absent.
	Medium string
	// GroupIdx is the KV-cache group (hybrid models); HasGroupIdx false
	// when absent.
	GroupIdx    int64
	HasGroupIdx bool

	// extra holds one entry per block from extra_keys (nil when absent).
	extra []extraKey
	// tag is the raw tag of an unknown event (for logs).
	tag string
}

// extraKey is one block's extra_keys entry, reduced to what the chain
// needs: nothing, a lone string (vLLM puts the LoRA name there), or an
// opaque value identified by the hash of its encoding.
type extraKey struct {
	kind uint8 // extraNone, extraString, extraOpaque
	s    string
	h    uint64
}

const (
	extraNone = iota
	extraString
	extraOpaque
)

// blockSalt is the salt chainStep mixes into block i: zero unless the
// engine hashed that block with keys beyond its tokens and adapter.
func (e *Event) blockSalt(i int) uint64 {
	if i >= len(e.extra) {
		return 0
	}
	x := e.extra[i]
	switch x.kind {
	case extraNone:
		return 0
	case extraString:
		if e.HasLoRAName && x.s == e.LoRAName {
			return 0 // the adapter, already in the chain's seed
		}
		return xxhash.Sum64String(x.s) | 1
	}
	return x.h | 1
}

// Batch is one decoded message payload.
type Batch struct {
	TS        float64
	Events    []Event
	DPRank    int64
	HasDPRank bool
}

// Limits bound what one payload may decode into. The payload's size
// already bounds it, but a hash takes 8 bytes in memory for as little as
// one on the wire.
type Limits struct {
	MaxEvents int // events per batch
	MaxBlocks int // block hashes per batch, all events together
	MaxTokens int // token ids per batch, all events together
}

// DefaultLimits are generous for vLLM, whose batches hold one engine
// step's events: an 8,192-token prefill stores 512 blocks.
var DefaultLimits = Limits{MaxEvents: 16384, MaxBlocks: 1 << 17, MaxTokens: 1 << 21}

// Decode errors. Every error Decode returns wraps ErrMalformed or
// ErrTooLarge.
var (
	ErrMalformed = errors.New("kvevents: malformed payload")
	ErrTooLarge  = errors.New("kvevents: payload exceeds decode limits")
)

// maxDepth bounds nesting in skipped values (extra_keys, unknown fields):
// the payload comes from the network, and recursion must not be its to
// choose.
const maxDepth = 32

// maxStringBytes bounds strings this decoder keeps (tags, medium,
// lora_name, map keys, extra-key strings).
const maxStringBytes = 4096

// maxHashBytes bounds a bytes block hash (vLLM's sha256 hashes are 32).
const maxHashBytes = 64

// Decoder decodes batches. The zero value is not usable; use NewDecoder.
// A Decoder is not safe for concurrent use; it reuses its buffers.
type Decoder struct {
	limits  Limits
	r       bytes.Reader
	dec     *msgpack.Decoder
	payload []byte
	blocks  int
	tokens  int
	hashBuf [maxHashBytes]byte
}

// NewDecoder returns a decoder enforcing l (zero fields take
// DefaultLimits').
func NewDecoder(l Limits) *Decoder {
	config.Default(&l.MaxEvents, DefaultLimits.MaxEvents)
	config.Default(&l.MaxBlocks, DefaultLimits.MaxBlocks)
	config.Default(&l.MaxTokens, DefaultLimits.MaxTokens)
	d := &Decoder{limits: l}
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

func wrapMalformed(what string, err error) error {
	if errors.Is(err, ErrMalformed) || errors.Is(err, ErrTooLarge) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %v", ErrMalformed, what, err)
}

// Decode decodes payload (a batch in either wire form, with events in
// either form) into b, reusing b's storage. On error b holds a partial
// batch that must not be applied.
func (d *Decoder) Decode(payload []byte, b *Batch) error {
	d.payload = payload
	d.r.Reset(payload)
	d.dec.Reset(&d.r)
	d.blocks, d.tokens = 0, 0
	b.TS, b.DPRank, b.HasDPRank = 0, 0, false
	b.Events = b.Events[:0]

	code, err := d.dec.PeekCode()
	if err != nil {
		return wrapMalformed("batch", err)
	}
	switch {
	case isArrayCode(code):
		err = d.batchArray(b)
	case isMapCode(code):
		err = d.batchMap(b)
	default:
		return malformed("batch is neither an array nor a map (code %#x)", code)
	}
	if err != nil {
		return err
	}
	if d.r.Len() != 0 {
		return malformed("%d trailing bytes after the batch", d.r.Len())
	}
	return nil
}

func isArrayCode(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMapCode(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isIntCode(c byte) bool {
	if msgpcode.IsFixedNum(c) {
		return true
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64,
		msgpcode.Int8, msgpcode.Int16, msgpcode.Int32, msgpcode.Int64:
		return true
	}
	return false
}

func (d *Decoder) batchArray(b *Batch) error {
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return wrapMalformed("batch", err)
	}
	if n < 2 {
		return malformed("batch array has %d fields, want at least 2 (ts, events)", n)
	}
	if b.TS, err = d.number(); err != nil {
		return wrapMalformed("batch ts", err)
	}
	if err := d.events(b); err != nil {
		return err
	}
	if n >= 3 {
		if b.DPRank, b.HasDPRank, err = d.optInt(); err != nil {
			return wrapMalformed("batch data_parallel_rank", err)
		}
	}
	for range n - 3 {
		if err := d.skip(0); err != nil {
			return wrapMalformed("batch trailing field", err)
		}
	}
	return nil
}

func (d *Decoder) batchMap(b *Batch) error {
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return wrapMalformed("batch", err)
	}
	var haveTS, haveEvents bool
	for range n {
		key, err := d.str()
		if err != nil {
			return wrapMalformed("batch key", err)
		}
		switch key {
		case "ts":
			if haveTS {
				return malformed("batch has two %q keys", key)
			}
			haveTS = true
			if b.TS, err = d.number(); err != nil {
				return wrapMalformed("batch ts", err)
			}
		case "events":
			if haveEvents {
				return malformed("batch has two %q keys", key)
			}
			haveEvents = true
			if err := d.events(b); err != nil {
				return err
			}
		case "data_parallel_rank":
			if b.DPRank, b.HasDPRank, err = d.optInt(); err != nil {
				return wrapMalformed("batch data_parallel_rank", err)
			}
		default:
			if err := d.skip(0); err != nil {
				return wrapMalformed("batch field "+key, err)
			}
		}
	}
	if !haveEvents {
		return malformed("batch map has no %q key", "events")
	}
	return nil
}

func (d *Decoder) events(b *Batch) error {
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return wrapMalformed("events", err)
	}
	if n < 0 {
		return malformed("events is nil")
	}
	if n > d.limits.MaxEvents {
		return fmt.Errorf("%w: %d events in one batch (limit %d)", ErrTooLarge, n, d.limits.MaxEvents)
	}
	for i := range n {
		var ev *Event
		if len(b.Events) < cap(b.Events) {
			b.Events = b.Events[:len(b.Events)+1]
			ev = &b.Events[len(b.Events)-1]
			ev.reset()
		} else {
			b.Events = append(b.Events, Event{})
			ev = &b.Events[len(b.Events)-1]
		}
		if err := d.event(ev); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

func (e *Event) reset() {
	*e = Event{BlockHashes: e.BlockHashes[:0], TokenIDs: e.TokenIDs[:0], extra: e.extra[:0]}
}

func kindOf(tag string) EventKind {
	switch tag {
	case "BlockStored":
		return KindBlockStored
	case "BlockRemoved":
		return KindBlockRemoved
	case "AllBlocksCleared":
		return KindAllBlocksCleared
	}
	return KindUnknown
}

// Positional field orders (vLLM's struct field order).
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func (d *Decoder) event(ev *Event) error {
	code, err := d.dec.PeekCode()
	if err != nil {
		return wrapMalformed("event", err)
	}
	var seen fieldSet
	switch {
	case isArrayCode(code):
		n, err := d.dec.DecodeArrayLen()
		if err != nil {
			return wrapMalformed("event", err)
		}
		if n < 1 {
			return malformed("event array has no tag")
		}
		tag, err := d.str()
		if err != nil {
			return wrapMalformed("event tag", err)
		}
		ev.Kind = kindOf(tag)
		var names []string
		switch ev.Kind {
		case KindBlockStored:
			names = storedFields
		case KindBlockRemoved:
			names = removedFields
		default:
			ev.tag = tag
		}
		for i := 1; i < n; i++ {
			if i-1 < len(names) {
				if err := d.field(ev, names[i-1], &seen); err != nil {
					return err
				}
				continue
			}
			if err := d.skip(0); err != nil {
				return wrapMalformed("event trailing field", err)
			}
		}
	case isMapCode(code):
		n, err := d.dec.DecodeMapLen()
		if err != nil {
			return wrapMalformed("event", err)
		}
		haveTag := false
		for range n {
			key, err := d.str()
			if err != nil {
				return wrapMalformed("event key", err)
			}
			if key == "type" {
				if haveTag {
					return malformed("event has two %q keys", key)
				}
				haveTag = true
				tag, err := d.str()
				if err != nil {
					return wrapMalformed("event tag", err)
				}
				if ev.Kind = kindOf(tag); ev.Kind == KindUnknown {
					ev.tag = tag
				}
				continue
			}
			// msgspec writes the tag first; fields of an event already
			// known to be of an unknown type are not interpreted.
			if haveTag && ev.Kind == KindUnknown {
				if err := d.skip(0); err != nil {
					return wrapMalformed("event field "+key, err)
				}
				continue
			}
			if err := d.field(ev, key, &seen); err != nil {
				return err
			}
		}
		if !haveTag {
			return malformed("event map has no %q key", "type")
		}
	default:
		return malformed("event is neither an array nor a map (code %#x)", code)
	}
	return checkEvent(ev, seen)
}

// fieldSet records which required fields an event carried.
type fieldSet struct{ hashes, tokens, blockSize bool }

func checkEvent(ev *Event, seen fieldSet) error {
	switch ev.Kind {
	case KindBlockStored:
		switch {
		case !seen.hashes:
			return malformed("BlockStored without block_hashes")
		case !seen.tokens:
			return malformed("BlockStored without token_ids")
		case !seen.blockSize:
			return malformed("BlockStored without block_size")
		}
	case KindBlockRemoved:
		if !seen.hashes {
			return malformed("BlockRemoved without block_hashes")
		}
	}
	return nil
}

func (d *Decoder) field(ev *Event, name string, seen *fieldSet) error {
	var err error
	switch name {
	case "block_hashes":
		if seen.hashes {
			return malformed("event has two block_hashes")
		}
		seen.hashes = true
		err = d.hashes(ev)
	case "parent_block_hash":
		var isNil bool
		if isNil, err = d.nextIsNil(); err == nil && !isNil {
			ev.ParentHash, err = d.hash()
			ev.HasParent = err == nil && ev.ParentHash != 0
		}
	case "token_ids":
		if seen.tokens {
			return malformed("event has two token_ids")
		}
		seen.tokens = true
		err = d.tokenIDs(ev)
	case "block_size":
		seen.blockSize = true
		var v int64
		var ok bool
		if v, ok, err = d.optInt(); err == nil {
			if !ok || v <= 0 || v > math.MaxInt32 {
				return malformed("block_size %d out of range", v)
			}
			ev.BlockSize = int(v)
		}
	case "lora_id":
		ev.LoRAID, ev.HasLoRAID, err = d.optInt()
	case "medium":
		ev.Medium, _, err = d.optStr()
	case "lora_name":
		ev.LoRAName, ev.HasLoRAName, err = d.optStr()
	case "extra_keys":
		err = d.extraKeys(ev)
	case "group_idx":
		ev.GroupIdx, ev.HasGroupIdx, err = d.optInt()
	default:
		err = d.skip(0)
	}
	if err != nil {
		return wrapMalformed(name, err)
	}
	return nil
}

func (d *Decoder) hashes(ev *Event) error {
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 0 {
		return malformed("block_hashes is nil")
	}
	if d.blocks += n; d.blocks > d.limits.MaxBlocks {
		return fmt.Errorf("%w: more than %d block hashes in one batch", ErrTooLarge, d.limits.MaxBlocks)
	}
	for range n {
		h, err := d.hash()
		if err != nil {
			return err
		}
		ev.BlockHashes = append(ev.BlockHashes, h)
	}
	return nil
}

// hash reads an integer or bytes block hash.
func (d *Decoder) hash() (uint64, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if isIntCode(c) {
		return d.dec.DecodeUint64() // negative hashes keep their bits
	}
	if !msgpcode.IsBin(c) {
		return 0, malformed("block hash is neither an integer nor bytes (code %#x)", c)
	}
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return 0, err
	}
	if n <= 0 || n > maxHashBytes {
		return 0, malformed("block hash of %d bytes", n)
	}
	buf := d.hashBuf[:n]
	if err := d.dec.ReadFull(buf); err != nil {
		return 0, err
	}
	if n <= 8 {
		var v [8]byte
		copy(v[8-n:], buf)
		return binary.BigEndian.Uint64(v[:]), nil
	}
	return xxhash.Sum64(buf), nil
}

func (d *Decoder) tokenIDs(ev *Event) error {
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 0 {
		return malformed("token_ids is nil")
	}
	if d.tokens += n; d.tokens > d.limits.MaxTokens {
		return fmt.Errorf("%w: more than %d token ids in one batch", ErrTooLarge, d.limits.MaxTokens)
	}
	for range n {
		c, err := d.dec.PeekCode()
		if err != nil {
			return err
		}
		if !isIntCode(c) {
			return malformed("token id is not an integer (code %#x)", c)
		}
		v, err := d.dec.DecodeInt64()
		if err != nil {
			return err
		}
		if v < 0 || v > math.MaxUint32 {
			return malformed("token id %d out of range", v)
		}
		ev.TokenIDs = append(ev.TokenIDs, uint32(v))
	}
	return nil
}

// extraKeys reads extra_keys: nil, or one entry per block, each nil or a
// tuple (an array) of engine-specific values.
func (d *Decoder) extraKeys(ev *Event) error {
	n, err := d.dec.DecodeArrayLen()
	if err != nil || n < 0 {
		return err
	}
	if n > d.limits.MaxBlocks {
		return fmt.Errorf("%w: %d extra_keys entries", ErrTooLarge, n)
	}
	for range n {
		start := len(d.payload) - d.r.Len()
		c, err := d.dec.PeekCode()
		if err != nil {
			return err
		}
		var x extraKey
		switch {
		case c == msgpcode.Nil:
			err = d.dec.Skip()
		case isArrayCode(c):
			var m int
			if m, err = d.dec.DecodeArrayLen(); err != nil {
				return err
			}
			if m == 0 {
				break
			}
			if c2, perr := d.dec.PeekCode(); perr == nil && m == 1 && msgpcode.IsString(c2) {
				x.kind = extraString
				x.s, err = d.str()
				break
			}
			for range m {
				if err = d.skip(1); err != nil {
					break
				}
			}
			x.kind = extraOpaque
			x.h = xxhash.Sum64(d.payload[start : len(d.payload)-d.r.Len()])
		default:
			err = d.skip(0)
			x.kind = extraOpaque
			x.h = xxhash.Sum64(d.payload[start : len(d.payload)-d.r.Len()])
		}
		if err != nil {
			return err
		}
		ev.extra = append(ev.extra, x)
	}
	return nil
}

func (d *Decoder) nextIsNil() (bool, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, d.dec.Skip()
	}
	return false, nil
}

func (d *Decoder) number() (float64, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if isIntCode(c) {
		v, err := d.dec.DecodeInt64()
		return float64(v), err
	}
	if c == msgpcode.Float || c == msgpcode.Double {
		return d.dec.DecodeFloat64()
	}
	return 0, malformed("not a number (code %#x)", c)
}

func (d *Decoder) optInt() (int64, bool, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		return 0, false, d.dec.Skip()
	}
	if !isIntCode(c) {
		return 0, false, malformed("not an integer (code %#x)", c)
	}
	v, err := d.dec.DecodeInt64()
	return v, err == nil, err
}

func (d *Decoder) str() (string, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsString(c) {
		return "", malformed("not a string (code %#x)", c)
	}
	n, err := d.dec.DecodeBytesLen() // reads a str header too
	if err != nil {
		return "", err
	}
	if n < 0 || n > maxStringBytes {
		return "", malformed("string of %d bytes (limit %d)", n, maxStringBytes)
	}
	if n > d.r.Len() {
		return "", malformed("string of %d bytes with %d left", n, d.r.Len())
	}
	buf := make([]byte, n)
	if err := d.dec.ReadFull(buf); err != nil {
		return "", err
	}
	return string(buf), nil
}

func (d *Decoder) optStr() (string, bool, error) {
	isNil, err := d.nextIsNil()
	if err != nil || isNil {
		return "", false, err
	}
	s, err := d.str()
	return s, err == nil, err
}

// skip skips one value of any type, refusing nesting deeper than
// maxDepth (msgpack's own Skip recurses without a bound).
func (d *Decoder) skip(depth int) error {
	if depth > maxDepth {
		return malformed("values nested deeper than %d", maxDepth)
	}
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case isArrayCode(c):
		n, err := d.dec.DecodeArrayLen()
		if err != nil {
			return err
		}
		for range n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMapCode(c):
		n, err := d.dec.DecodeMapLen()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	return d.dec.Skip()
}
