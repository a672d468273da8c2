package kvpub

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// replayAll asks p's replay socket for everything from start on, over a
// real DEALER socket, as a subscriber that missed events would.
func replayAll(t *testing.T, p *Publisher, start uint64) (seqs []uint64, payloads [][]byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(p.ReplayAddr()); err != nil {
		t.Fatal(err)
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], start)
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, b[:])); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[0]) != 0 || len(msg.Frames[1]) != 8 {
			t.Fatalf("reply frames %q", msg.Frames)
		}
		if len(msg.Frames[2]) == 0 {
			if binary.BigEndian.Uint64(msg.Frames[1]) != ^uint64(0) {
				t.Fatalf("end marker %x", msg.Frames[1])
			}
			return seqs, payloads
		}
		seqs = append(seqs, binary.BigEndian.Uint64(msg.Frames[1]))
		payloads = append(payloads, msg.Frames[2])
	}
}

func waitSeq(t *testing.T, p *Publisher, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.NextSeq() < n {
		if time.Now().After(deadline) {
			t.Fatalf("publisher stuck at seq %d, want %d", p.NextSeq(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReplayAndShapes: batches are kept for replay (the ring drops the
// oldest), a chain of stored blocks is one BlockStored, and the two wire
// forms have vLLM's and llm-d-inference-sim's shapes.
func TestReplayAndShapes(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		p, err := Open(context.Background(), Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Legacy: legacy, BufferSteps: 2})
		if err != nil {
			t.Fatal(err)
		}
		toks := make([]uint32, 16)
		p.Stored(1, 0, false, toks, "", 0)
		waitSeq(t, p, 1)
		p.Removed(1)
		waitSeq(t, p, 2)
		// One batch: three chained blocks of adapter "a", then a clear.
		p.mu.Lock()
		p.merge(event{kind: stored, hashes: []uint64{5}, tokens: toks, blockSize: 16, lora: "a", loraID: 1})
		p.merge(event{kind: stored, hashes: []uint64{6}, parent: 5, hasParent: true, tokens: toks, blockSize: 16, lora: "a", loraID: 1})
		p.merge(event{kind: stored, hashes: []uint64{7}, parent: 6, hasParent: true, tokens: toks, blockSize: 16, lora: "a", loraID: 1})
		p.merge(event{kind: cleared})
		p.mu.Unlock()
		p.wake <- struct{}{}
		waitSeq(t, p, 3)

		seqs, payloads := replayAll(t, p, 0)
		if len(seqs) != 2 || seqs[0] != 1 || seqs[1] != 2 {
			t.Fatalf("legacy=%v: replayed seqs %v, want the last two", legacy, seqs)
		}
		var batch any
		if err := msgpack.Unmarshal(payloads[len(payloads)-1], &batch); err != nil {
			t.Fatal(err)
		}
		var events []any
		if legacy {
			arr := batch.([]any)
			if len(arr) != 3 {
				t.Fatalf("legacy batch %v", arr)
			}
			events = arr[1].([]any)
			st := events[0].([]any)
			if len(st) != 9 || st[0] != "BlockStored" || len(st[1].([]any)) != 3 || st[7] != "a" {
				t.Errorf("legacy BlockStored %v", st)
			}
		} else {
			m := batch.(map[string]any)
			events = m["events"].([]any)
			st := events[0].(map[string]any)
			if st["type"] != "BlockStored" || len(st["block_hashes"].([]any)) != 3 || st["parent_block_hash"] != nil ||
				st["lora_name"] != "a" || len(st["token_ids"].([]any)) != 48 || len(st["extra_keys"].([]any)) != 3 {
				t.Errorf("BlockStored %v", st)
			}
		}
		if len(events) != 2 {
			t.Errorf("legacy=%v: %d events in the batch, want BlockStored and AllBlocksCleared", legacy, len(events))
		}
		_ = p.Close()
	}
}
