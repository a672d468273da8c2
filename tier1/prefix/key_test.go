package prefix

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestKey(t *testing.T) {
	if _, err := NewKey([]byte("fifteen bytes!!")); err == nil {
		t.Fatal("a 15-byte secret was accepted")
	}
	k1, err := NewKey([]byte("a per-deployment secret"))
	if err != nil {
		t.Fatal(err)
	}
	k1b, _ := NewKey([]byte("a per-deployment secret"))
	k2, _ := NewKey([]byte("another deployment's secret"))
	raw := Hash("model", []byte(string(make([]byte, 64*8))), 64, 0, nil)
	a, b, c := slices.Clone(raw), slices.Clone(raw), slices.Clone(raw)
	k1.Apply(a)
	k1b.Apply(b)
	k2.Apply(c)
	if !slices.Equal(a, b) {
		t.Fatal("the same secret keyed differently (replicas would never match)")
	}
	for i := range raw {
		if a[i] == raw[i] || a[i] == c[i] {
			t.Fatalf("block %d: keyed %x, raw %x, other key %x", i, a[i], raw[i], c[i])
		}
		if k1.Sum(raw[i]) != a[i] {
			t.Fatalf("Sum and Apply disagree at block %d", i)
		}
	}
	if string(k1.ID()) != string(k1b.ID()) || string(k1.ID()) == string(k2.ID()) || len(k1.ID()) != 8 {
		t.Fatalf("key IDs %x %x %x", k1.ID(), k1b.ID(), k2.ID())
	}
	var none *Key
	none.Apply(raw)
	if none.Sum(7) != 7 || none.ID() != nil || !slices.Equal(raw, Hash("model", make([]byte, 64*8), 64, 0, nil)) {
		t.Fatal("a nil Key changed something")
	}
}

// TestKeyedIndexMatchesAsPlain: with a key the index answers every Match
// as without one, stores only keyed values, and RecordKeyed takes what a
// peer keyed with the same key.
func TestKeyedIndexMatchesAsPlain(t *testing.T) {
	k, _ := NewKey([]byte("0123456789abcdef"))
	rng := rand.New(rand.NewPCG(3, 4))
	for _, opts := range []IndexOptions{{MaxBlocks: 1 << 10, MaxBlocksPerPod: 1 << 8, Stride: 1}, {MaxBlocks: 1 << 10, MaxBlocksPerPod: 1 << 8}, {}} {
		plain, keyed, fromPeer := NewIndex(opts), NewIndex(opts), NewIndex(opts)
		keyed.SetKey(k)
		fromPeer.SetKey(k)
		pods := []string{"a", "b", "c", "d"}
		var prompts [][]uint64
		for range 40 {
			p := make([]byte, 64*(1+rng.IntN(60)))
			for i := range p {
				p[i] = byte(rng.IntN(3)) // few distinct texts: shared prefixes
			}
			h := Hash("m", p, 64, 0, nil)
			prompts = append(prompts, h)
			pod := pods[rng.IntN(len(pods))]
			plain.Record(pod, h)
			keyed.Record(pod, h)
			kh := slices.Clone(h)
			k.Apply(kh)
			fromPeer.RecordKeyed(pod, kh)
		}
		for _, h := range prompts {
			want := plain.Match(h, pods, nil)
			if got := keyed.Match(h, pods, nil); !slices.Equal(got, want) {
				t.Fatalf("keyed match %v, plain %v", got, want)
			}
			if got := fromPeer.Match(h, pods, nil); !slices.Equal(got, want) {
				t.Fatalf("match of a peer's keyed records %v, plain %v", got, want)
			}
		}
		if keyed.Len() != plain.Len() {
			t.Fatalf("keyed index holds %d entries, plain %d", keyed.Len(), plain.Len())
		}
	}
	// The keyed index holds keyed values and keys what it looks up: an
	// already-keyed value given as raw does not match.
	x := NewIndex(IndexOptions{})
	x.SetKey(k)
	x.Record("a", []uint64{42})
	if got := x.Match([]uint64{42}, []string{"a"}, nil); got[0] != 1 {
		t.Fatalf("keyed index does not find what it recorded: %v", got)
	}
	if got := x.Match([]uint64{k.Sum(42)}, []string{"a"}, nil); got[0] != 0 {
		t.Fatalf("keyed index matched an already-keyed value as raw: %v", got)
	}
}

// BenchmarkIndexKey is what a key costs a request: Record and Match of a
// 2k-token prompt (128 blocks), with and without a key.
func BenchmarkIndexKey(b *testing.B) {
	h := Hash("m", make([]byte, 64*128), 64, 0, nil)
	k, _ := NewKey([]byte("0123456789abcdef"))
	for _, key := range []*Key{nil, k} {
		name := "plain"
		if key != nil {
			name = "keyed"
		}
		b.Run(name, func(b *testing.B) {
			x := NewIndex(IndexOptions{})
			x.SetKey(key)
			pods := []string{"a", "b", "c", "d"}
			dst := make([]int, len(pods))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				x.Record(pods[i%4], h)
				dst = x.Match(h, pods, dst)
			}
		})
	}
}
