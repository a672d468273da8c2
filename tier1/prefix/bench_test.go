package prefix

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkPrefixHash hashes an 8k-token prompt: 32 KiB, 512 blocks.
func BenchmarkPrefixHash(b *testing.B) { benchHash(b, 32<<10) }

// BenchmarkPrefixHashLong hashes a 34k-token prompt (the Mooncake trace's
// longest on the bench's fleet): 136 KiB, 2,176 blocks.
func BenchmarkPrefixHashLong(b *testing.B) { benchHash(b, 136<<10) }

func benchHash(b *testing.B, size int) {
	data := bytes.Repeat([]byte("The quick brown fox jumps over the lazy dog. "), size/44+1)[:size]
	dst := make([]uint64, 0, DefaultPromptBlocks)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		dst = Hash("meta-llama/Llama-3.1-8B-Instruct", data, DefaultBlockBytes, DefaultPromptBlocks, dst)
	}
	cpu.report(b)
}

// indexFixture: pods pods that each saw a shared 128-block system prompt
// plus their own conversations; one pod in ten also saw part of the query.
func indexFixture(pods int) (*Index, []uint64, []string) {
	r := rand.New(rand.NewPCG(1, uint64(pods)))
	sys := bytes.Repeat([]byte("system prompt and tool definitions "), 240)[:128*64]
	query := Hash("m", append(append([]byte{}, sys...), bytes.Repeat([]byte("q"), 384*64)...), 64, 512, nil)
	x := NewIndex(IndexOptions{})
	names := make([]string, pods)
	for i := range names {
		names[i] = fmt.Sprintf("pod-%d", i)
		conv := append(append([]byte{}, sys...), fmt.Sprintf("%-6400d", i)...)
		x.Record(names[i], Hash("m", conv, 64, 512, nil))
		if i%10 == 0 {
			x.Record(names[i], query[:128+r.IntN(384)])
		}
	}
	return x, query, names
}

func BenchmarkIndexMatch(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			x, q, names := indexFixture(n)
			dst := make([]int, n)
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				dst = x.Match(q, names, dst)
			}
			cpu.report(b)
		})
	}
}

// BenchmarkIndexRecord records 512-block requests sharing a 128-block
// prefix, round-robin over pods, into a full index (evicting).
func BenchmarkIndexRecord(b *testing.B) {
	for _, n := range []int{10, 100} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			x := NewIndex(IndexOptions{MaxBlocks: 200_000, MaxBlocksPerPod: 20_000})
			r := rand.New(rand.NewPCG(1, 2))
			reqs := make([][]uint64, 61) // coprime with the pod counts
			sys := bytes.Repeat([]byte("s"), 128*64)
			for i := range reqs {
				tail := make([]byte, 384*64)
				for j := range tail {
					tail[j] = byte(r.Uint32())
				}
				reqs[i] = Hash("m", append(append([]byte{}, sys...), tail...), 64, 512, nil)
			}
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("pod-%d", i)
			}
			i := 0
			for i < 1000 { // reach steady state: full, evicting
				x.Record(names[i%n], reqs[i%len(reqs)])
				i++
			}
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				x.Record(names[i%n], reqs[i%len(reqs)])
				i++
			}
			cpu.report(b)
		})
	}
}

// BenchmarkIndexRecordUnique is the load of issue 13 at the default
// capacity: 100 pods, 512-block requests that share one of 8 128-block
// system prompts and are otherwise new, so past the first few thousand
// requests every new block evicts an old one.
func BenchmarkIndexRecordUnique(b *testing.B) {
	const pods = 100
	x := NewIndex(IndexOptions{})
	r := rand.New(rand.NewPCG(7, 8))
	sys := make([][]uint64, 8)
	for i := range sys {
		sys[i] = Hash("m", bytes.Repeat([]byte{byte('a' + i)}, 128*64), 64, 128, nil)
	}
	names := make([]string, pods)
	for i := range names {
		names[i] = fmt.Sprintf("pod-%d", i)
	}
	req := make([]uint64, 512)
	next := func(i int) []uint64 {
		copy(req, sys[i%len(sys)])
		for j := 128; j < len(req); j++ {
			req[j] = r.Uint64() // chained hashes of a new tail: as good as random
		}
		return req
	}
	i := 0
	for ; i < 2*x.Options().MaxBlocks/384; i++ { // fill: every block evicts from now on
		x.Record(names[i%pods], next(i))
	}
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		b.StopTimer()
		h := next(i)
		b.StartTimer()
		x.Record(names[i%pods], h)
		i++
	}
	cpu.report(b)
}

// BenchmarkIndexMemory reports heap bytes per (block, pod) entry of a full
// 1M-entry index over 100 pods.
func BenchmarkIndexMemory(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b.StartTimer()
		x := NewIndex(IndexOptions{MaxBlocks: 1 << 20, MaxBlocksPerPod: 1 << 20 / 100})
		r := rand.New(rand.NewPCG(3, 4))
		h := make([]uint64, 512)
		for p := range 100 {
			name := fmt.Sprintf("pod-%d", p)
			for x.PodLen(name) < x.Options().MaxBlocksPerPod/x.Options().Stride {
				for i := range h {
					h[i] = r.Uint64()
				}
				x.Record(name, h)
			}
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(x.Len()), "bytes/entry")
		b.ReportMetric(float64(x.Len()), "entries")
		runtime.KeepAlive(x)
		b.StartTimer()
	}
}

// cpuClock reports process CPU time per op next to wall time: on a shared,
// oversubscribed machine wall time includes waiting for a core, CPU time
// does not.
type cpuClock struct{ start time.Duration }

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU() cpuClock { return cpuClock{processCPU()} }

func (c cpuClock) report(b *testing.B) {
	b.ReportMetric(float64(processCPU()-c.start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkPrefixHashGeneric is the streaming-Digest path (any block size
// other than 64), for comparison with the unrolled 64-byte path.
func BenchmarkPrefixHashGeneric(b *testing.B) {
	data := bytes.Repeat([]byte("The quick brown fox jumps over the lazy dog. "), 1000)[:32<<10]
	dst := make([]uint64, 0, DefaultPromptBlocks)
	b.SetBytes(int64(len(data)))
	cpu := startCPU()
	for b.Loop() {
		dst = Hash("meta-llama/Llama-3.1-8B-Instruct", data, 63, DefaultPromptBlocks, dst)
	}
	cpu.report(b)
}

// BenchmarkIndexParallel is the picker's use under load: every request is
// matched against all pods and then recorded for the chosen one, from many
// goroutines at once. Requests share a 128-block system prompt and each
// has 384 blocks of its own; one in four goes to a random pod rather than
// its usual one. With 128 distinct requests every pod's share fits in its
// capacity (mostly hits); with 1024 the pods churn (mostly new blocks and
// evictions). Run with -cpu 1,2,8 to see how it scales.
func BenchmarkIndexParallel(b *testing.B) {
	for _, nreq := range []int{128, 1024} {
		b.Run(fmt.Sprintf("requests=%d", nreq), func(b *testing.B) { benchIndexParallel(b, nreq) })
	}
}

func benchIndexParallel(b *testing.B, nreq int) {
	const pods = 8
	names := make([]string, pods)
	for i := range names {
		names[i] = fmt.Sprintf("pod-%d", i)
	}
	r := rand.New(rand.NewPCG(5, 6))
	sys := bytes.Repeat([]byte("system prompt and tool definitions "), 240)[:128*64]
	reqs := make([][]uint64, nreq)
	for i := range reqs {
		tail := make([]byte, 384*64)
		for j := range tail {
			tail[j] = byte(r.Uint32())
		}
		reqs[i] = Hash("m", append(append([]byte{}, sys...), tail...), 64, 512, nil)
	}
	x := NewIndex(IndexOptions{})
	for i, h := range reqs { // warm: every request seen once
		x.Record(names[i%pods], h)
	}
	var seed atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(seed.Add(1), 7))
		dst := make([]int, pods)
		for pb.Next() {
			i := r.IntN(nreq)
			h := reqs[i]
			dst = x.Match(h, names, dst)
			pod := i % pods
			if r.IntN(4) == 0 {
				pod = r.IntN(pods)
			}
			x.Record(names[pod], h)
		}
	})
	cpu.report(b)
}

// BenchmarkIndexRecordPool16 is BenchmarkIndexRecordUnique on the load
// benchmark's pool (infergate-lab loadbench cpu: 16 pods): each pod fills
// its own per-pod bound, so every new block evicts that pod's oldest one
// and the index never reaches MaxBlocks.
func BenchmarkIndexRecordPool16(b *testing.B) {
	for _, stride := range []int{1, DefaultStride} {
		b.Run(fmt.Sprintf("stride=%d", stride), func(b *testing.B) { benchRecordPool16(b, stride) })
	}
}

func benchRecordPool16(b *testing.B, stride int) {
	const pods = 16
	x := NewIndex(IndexOptions{Stride: stride})
	r := rand.New(rand.NewPCG(7, 8))
	sys := make([][]uint64, 8)
	for i := range sys {
		sys[i] = Hash("m", bytes.Repeat([]byte{byte('a' + i)}, 128*64), 64, 128, nil)
	}
	names := make([]string, pods)
	for i := range names {
		names[i] = fmt.Sprintf("pod-%d", i)
	}
	req := make([]uint64, 512)
	next := func(i int) []uint64 {
		copy(req, sys[i%len(sys)])
		for j := 128; j < len(req); j++ {
			req[j] = r.Uint64()
		}
		return req
	}
	i := 0
	for ; i < 2*pods*x.Options().MaxBlocksPerPod/384; i++ { // fill every pod: each new block evicts
		x.Record(names[i%pods], next(i))
	}
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		b.StopTimer()
		h := next(i)
		b.StartTimer()
		x.Record(names[i%pods], h)
		i++
	}
	cpu.report(b)
}
