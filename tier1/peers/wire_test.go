package peers

import (
	"bytes"
	"slices"
	"testing"

	"github.com/infergate/infergate/tier1/picker"
)

func TestBatchRoundTrip(t *testing.T) {
	in := batch{
		loads: map[string]picker.ReplicaLoad{
			"pod-a": {InFlight: 3, Prefill: 1, PromptTokens: 4000, Uncached: 1200, Version: 77},
			"pod-b": {},
		},
		records: []record{{pod: "pod-a", hashes: []uint64{1, 1 << 63, 42}}, {pod: "pod-b", hashes: nil}},
		samples: []sample{{pod: "pod-b", tokens: 2048, micros: 153000}},
	}
	f := encodeBatch(nil, &in)
	p, err := readFrame(bytes.NewReader(f), nil, DefaultMaxFrameBytes)
	if err != nil {
		t.Fatal(err)
	}
	loads := map[string]picker.ReplicaLoad{}
	var recs []record
	var smps []sample
	if _, err := decodeBatch(p, nil,
		func(pod string, l picker.ReplicaLoad) { loads[pod] = l },
		func(pod string, h []uint64) { recs = append(recs, record{pod, slices.Clone(h)}) },
		func(s sample) { smps = append(smps, s) }); err != nil {
		t.Fatal(err)
	}
	if len(loads) != 2 || loads["pod-a"] != in.loads["pod-a"] || loads["pod-b"] != in.loads["pod-b"] {
		t.Fatalf("loads = %+v", loads)
	}
	if len(recs) != 2 || recs[0].pod != "pod-a" || !slices.Equal(recs[0].hashes, in.records[0].hashes) || len(recs[1].hashes) != 0 {
		t.Fatalf("records = %+v", recs)
	}
	if !slices.Equal(smps, in.samples) {
		t.Fatalf("samples = %+v, want %+v", smps, in.samples)
	}
}

func TestDecodeMalformed(t *testing.T) {
	good := encodeBatch(nil, &batch{loads: map[string]picker.ReplicaLoad{"p": {InFlight: 1}}, records: []record{{pod: "p", hashes: []uint64{9, 8}}}})[4:]
	tests := []struct {
		name string
		p    []byte
	}{
		{"empty", nil},
		{"wrong type", append([]byte{frameHello}, good[1:]...)},
		{"truncated", good[:len(good)-3]},
		{"trailing bytes", append(slices.Clone(good), 0)},
		{"huge count", []byte{frameBatch, 0xff, 0xff, 0xff, 0xff, 0x0f}},
		{"too many hashes", []byte{frameBatch, 0, 1, 1, 'p', 0xff, 0xff, 0x03}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nop := func(string, picker.ReplicaLoad) {}
			if _, err := decodeBatch(tt.p, nil, nop, func(string, []uint64) {}, func(sample) {}); err == nil {
				t.Fatal("decoded without error")
			}
		})
	}
	if _, err := readFrame(bytes.NewReader([]byte{0x7f, 0, 0, 0}), nil, DefaultMaxFrameBytes); err == nil {
		t.Fatal("oversized frame accepted")
	}
}

// FuzzDecode: any bytes from an authenticated peer decode or fail, never
// panic or allocate beyond the payload.
func FuzzDecode(f *testing.F) {
	f.Add(encodeBatch(nil, &batch{loads: map[string]picker.ReplicaLoad{"p": {InFlight: 1, Version: 3}}, records: []record{{pod: "p", hashes: []uint64{1, 2}}}, samples: []sample{{pod: "p", tokens: 100, micros: 5000}}})[4:])
	f.Add(encodeHello("replica-1", make([]byte, 32))[4:])
	f.Fuzz(func(t *testing.T, p []byte) {
		_, _ = decodeBatch(p, nil, func(string, picker.ReplicaLoad) {}, func(string, []uint64) {}, func(sample) {})
		_, _, _ = decodeHello(p)
		_, _ = readFrame(bytes.NewReader(p), nil, 1<<16)
	})
}
