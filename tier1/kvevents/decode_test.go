package kvevents

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func decodeOK(t *testing.T, payload []byte) Batch {
	t.Helper()
	var b Batch
	if err := NewDecoder(Limits{}).Decode(payload, &b); err != nil {
		t.Fatalf("decode: %v\npayload % x", err, payload)
	}
	return b
}

// TestDecodeWireForms decodes golden payloads of every wire form: vLLM's
// tagged maps (since vllm#42892), the positional arrays before it and of
// llm-d-inference-sim, and mixtures, to the same events.
func TestDecodeWireForms(t *testing.T) {
	toks := seqTokens(100, 32)
	wantStored := Event{Kind: KindBlockStored, BlockHashes: []uint64{0xdeadbeefcafe, 7}, TokenIDs: toks, BlockSize: 16, Medium: "GPU"}
	wantRemoved := Event{Kind: KindBlockRemoved, BlockHashes: []uint64{7}, Medium: "GPU"}
	wantCleared := Event{Kind: KindAllBlocksCleared}

	tagged := mp{}.storedMap([]uint64{0xdeadbeefcafe, 7}, 0, toks, 16, "").removedMap(7).clearedMap()
	positional := mp{}.storedArray([]uint64{0xdeadbeefcafe, 7}, 0, toks, 16, "").removedArray(7).clearedArray()
	// vLLM before medium and lora_name existed: six BlockStored fields,
	// parent nil; BlockRemoved with only its hashes.
	oldVLLM := mp{}.arr(6).str("BlockStored").uints(0xdeadbeefcafe, 7).null().tokens(toks).uint(16).null().
		arr(2).str("BlockRemoved").uints(7).clearedArray()

	for _, tc := range []struct {
		name    string
		payload mp
		medium  string
	}{
		{"tagged maps (vLLM since #42892)", batchMap(3, tagged), "GPU"},
		{"positional arrays (llm-d-inference-sim)", batchArray(3, positional), "GPU"},
		{"old vLLM arrays", batchArray(3, oldVLLM), ""},
		{"map batch, array events", batchMap(3, positional), "GPU"},
		{"array batch, map events", batchArray(3, tagged), "GPU"},
		{"two-field batch", append(mp{}.arr(2).f64(1).arr(3), tagged...), "GPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := decodeOK(t, tc.payload)
			if len(b.Events) != 3 {
				t.Fatalf("%d events, want 3", len(b.Events))
			}
			ws, wr := wantStored, wantRemoved
			ws.Medium, wr.Medium = tc.medium, tc.medium
			for i, want := range []Event{ws, wr, wantCleared} {
				got := b.Events[i]
				got.extra = nil
				if got.Kind != want.Kind || !slices.Equal(got.BlockHashes, want.BlockHashes) || got.HasParent ||
					!slices.Equal(got.TokenIDs, want.TokenIDs) || got.BlockSize != want.BlockSize ||
					got.Medium != want.Medium || got.HasLoRAID || got.HasLoRAName {
					t.Errorf("event %d = %+v, want %+v", i, got, want)
				}
			}
		})
	}
}

func TestDecodeFields(t *testing.T) {
	toks := seqTokens(0, 16)
	sha := bytes.Repeat([]byte{0xab}, 32)
	short := []byte{0x01, 0x02}
	t.Run("parent, LoRA, bytes and negative hashes", func(t *testing.T) {
		ev := mp{}.mapn(8).str("type").str("BlockStored").
			str("block_hashes").arr(3).bin(sha).bin(short).i64(-5).
			str("parent_block_hash").uint(99).
			str("token_ids").tokens(slices.Concat(toks, toks, toks)).
			str("block_size").uint(16).
			str("lora_id").uint(3).
			str("medium").str("CPU").
			str("lora_name").str("sql-adapter")
		b := decodeOK(t, batchMap(1, ev))
		e := b.Events[0]
		want := []uint64{xxhash.Sum64(sha), 0x0102, uint64(0xfffffffffffffffb)}
		if !slices.Equal(e.BlockHashes, want) {
			t.Errorf("hashes %x, want %x", e.BlockHashes, want)
		}
		if !e.HasParent || e.ParentHash != 99 || !e.HasLoRAID || e.LoRAID != 3 || !e.HasLoRAName ||
			e.LoRAName != "sql-adapter" || e.Medium != "CPU" {
			t.Errorf("event %+v", e)
		}
	})
	t.Run("tag not first, unknown fields skipped", func(t *testing.T) {
		ev := mp{}.mapn(7).str("block_hashes").uints(1).
			str("group_idx").uint(2).
			str("kv_cache_spec_kind").str("full_attention").
			str("future_field").mapn(1).str("x").arr(2).uint(1).uint(2).
			str("token_ids").tokens(toks).str("type").str("BlockStored").str("block_size").uint(16)
		b := decodeOK(t, batchMap(1, ev))
		if e := b.Events[0]; e.Kind != KindBlockStored || !e.HasGroupIdx || e.GroupIdx != 2 || len(e.TokenIDs) != 16 {
			t.Errorf("event %+v", e)
		}
	})
	t.Run("unknown event type is skipped, not an error", func(t *testing.T) {
		evs := mp{}.mapn(2).str("type").str("BlockPromoted").str("block_hashes").str("not even hashes").
			arr(3).str("BlockMoved").uint(1).uint(2).removedMap(4)
		b := decodeOK(t, batchMap(3, evs))
		if b.Events[0].Kind != KindUnknown || b.Events[1].Kind != KindUnknown || b.Events[2].Kind != KindBlockRemoved {
			t.Errorf("kinds %v %v %v", b.Events[0].Kind, b.Events[1].Kind, b.Events[2].Kind)
		}
	})
	t.Run("extra keys", func(t *testing.T) {
		ev := mp{}.mapn(5).str("type").str("BlockStored").str("block_hashes").uints(1, 2, 3).
			str("token_ids").tokens(slices.Concat(toks, toks, toks)).str("block_size").uint(16).
			str("extra_keys").arr(3).
			arr(1).str("lora-a"). // the LoRA name: no salt
			null().               // nothing
			arr(2).str("mm-hash").uint(0)
		b := decodeOK(t, batchMap(1, ev))
		e := b.Events[0]
		e.LoRAName, e.HasLoRAName = "lora-a", true
		if e.blockSalt(0) != 0 || e.blockSalt(1) != 0 || e.blockSalt(2) == 0 {
			t.Errorf("salts %x %x %x", e.blockSalt(0), e.blockSalt(1), e.blockSalt(2))
		}
		e.LoRAName = "other" // then the lone string is a cache salt
		if e.blockSalt(0) == 0 {
			t.Error("a lone string other than the LoRA name did not salt the block")
		}
	})
	t.Run("parent 0 is none", func(t *testing.T) {
		b := decodeOK(t, batchArray(1, mp{}.storedArray([]uint64{5}, 0, toks, 16, "")))
		if b.Events[0].HasParent {
			t.Error("parent 0 decoded as a parent")
		}
	})
	t.Run("decoder reuse", func(t *testing.T) {
		d := NewDecoder(Limits{})
		var b Batch
		big := batchMap(1, mp{}.storedMap([]uint64{1, 2}, 0, slices.Concat(toks, toks), 16, "x"))
		small := batchMap(1, mp{}.removedMap(9))
		for _, p := range []mp{big, small} {
			if err := d.Decode(p, &b); err != nil {
				t.Fatal(err)
			}
		}
		if e := b.Events[0]; e.Kind != KindBlockRemoved || !slices.Equal(e.BlockHashes, []uint64{9}) || len(e.TokenIDs) != 0 || e.HasLoRAName {
			t.Errorf("reused event kept old fields: %+v", e)
		}
	})
}

func TestDecodeErrors(t *testing.T) {
	toks := seqTokens(0, 16)
	good := batchMap(1, mp{}.storedMap([]uint64{1}, 0, toks, 16, ""))
	deep := mp{}
	for range 100 {
		deep = deep.arr(1)
	}
	deep = deep.uint(1)
	for _, tc := range []struct {
		name    string
		payload []byte
		limits  Limits
		want    error
	}{
		{"empty", nil, Limits{}, ErrMalformed},
		{"not a batch", mp{}.str("hello"), Limits{}, ErrMalformed},
		{"truncated", good[:len(good)-3], Limits{}, ErrMalformed},
		{"trailing bytes", append(bytes.Clone(good), 0x01), Limits{}, ErrMalformed},
		{"no events key", mp{}.mapn(1).str("ts").f64(1), Limits{}, ErrMalformed},
		{"two events keys", mp{}.mapn(2).str("events").arr(0).str("events").arr(0), Limits{}, ErrMalformed},
		{"events nil", mp{}.arr(2).f64(1).null(), Limits{}, ErrMalformed},
		{"event without tag", batchMap(1, mp{}.mapn(1).str("block_hashes").uints(1)), Limits{}, ErrMalformed},
		{"stored without tokens", batchMap(1, mp{}.mapn(3).str("type").str("BlockStored").str("block_hashes").uints(1).str("block_size").uint(16)), Limits{}, ErrMalformed},
		{"stored too short", batchArray(1, mp{}.arr(3).str("BlockStored").uints(1).null()), Limits{}, ErrMalformed},
		{"block size 0", batchArray(1, mp{}.arr(5).str("BlockStored").uints(1).null().tokens(toks).uint(0)), Limits{}, ErrMalformed},
		{"string hash", batchArray(1, mp{}.arr(2).str("BlockRemoved").arr(1).str("abc")), Limits{}, ErrMalformed},
		{"huge bytes hash", batchArray(1, mp{}.arr(2).str("BlockRemoved").arr(1).bin(make([]byte, 65))), Limits{}, ErrMalformed},
		{"negative token", batchArray(1, mp{}.arr(5).str("BlockStored").uints(1).null().arr(1).i64(-1).uint(1)), Limits{}, ErrMalformed},
		{"token over 32 bits", batchArray(1, mp{}.arr(5).str("BlockStored").uints(1).null().arr(1).uint(1<<32).uint(1)), Limits{}, ErrMalformed},
		{"truncated unknown field", batchMap(1, mp{}.mapn(2).str("type").str("BlockRemoved").str("x").arr(1)), Limits{}, ErrMalformed},
		{"deep nesting", append(mp{}.mapn(2).str("events").arr(0).str("x"), deep...), Limits{}, ErrMalformed},
		{"declared huge array", append(mp{}.arr(2).f64(1), 0xdd, 0xff, 0xff, 0xff, 0xff), Limits{}, ErrTooLarge},
		{"declared huge string key", append(mp{}.mapn(1), 0xdb, 0xff, 0xff, 0xff, 0xff), Limits{}, ErrMalformed},
		{"too many events", batchArray(3, mp{}.clearedArray().clearedArray().clearedArray()), Limits{MaxEvents: 2}, ErrTooLarge},
		{"too many blocks", batchArray(2, mp{}.removedArray(1, 2, 3).removedArray(4, 5)), Limits{MaxBlocks: 4}, ErrTooLarge},
		{"too many tokens", good, Limits{MaxTokens: 15}, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			err := NewDecoder(tc.limits).Decode(tc.payload, &b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

// FuzzDecode feeds arbitrary payloads to the decoder and applies what
// decodes to a capped index: no input may panic, exceed the cap, or make
// the decoder return an error it does not classify.
func FuzzDecode(f *testing.F) {
	toks := seqTokens(7, 32)
	for _, seed := range [][]byte{
		batchMap(3, mp{}.storedMap([]uint64{1, 2}, 0, toks, 16, "").removedMap(1).clearedMap()),
		batchArray(2, mp{}.storedArray([]uint64{3, 4}, 9, toks, 16, "a").removedArray(3)),
		batchMap(1, mp{}.mapn(3).str("type").str("BlockStored").str("extra_keys").arr(1).arr(2).str("m").uint(1).str("block_hashes").uints(1)),
		{0x93, 0xcb}, {0xdd, 0xff, 0xff, 0xff, 0xff},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		d := NewDecoder(Limits{MaxEvents: 64, MaxBlocks: 256, MaxTokens: 4096})
		var b Batch
		err := d.Decode(payload, &b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		x := NewIndex(IndexOptions{MaxBlocksPerPod: 100, Media: []string{"GPU", "CPU"}})
		for range 3 {
			x.Apply("p", &b)
		}
		if st := x.Stats(); len(st) != 1 || st[0].Blocks > 100 || st[0].Blocks < 0 {
			t.Fatalf("stats %+v", st)
		}
		hashes := AppendHashTokens(nil, toks, 16, "")
		x.Match(hashes, 16, []string{"p"}, nil)
	})
}
