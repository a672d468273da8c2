package picker

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/infergate/infergate/tier1/prefix"
)

// benchFixture: n pods with varied load, a tracker whose index holds
// prefixes of earlier requests, and an 8k-token (32 KiB, 512-block)
// request sharing a system prompt with them.
func benchFixture(b *testing.B, n int) (*Scheduler, *Request, []*Pod) {
	r := rand.New(rand.NewPCG(1, uint64(n)))
	tr := NewTracker(TrackerOptions{})
	sys := bytes.Repeat([]byte("system prompt, tools and few-shot examples. "), 200) // ~9 KiB
	text := append(append([]byte{}, sys...), bytes.Repeat([]byte("user turn "), 2400)...)
	text = text[:32<<10]
	req := &Request{Model: "llama", BaseModel: "llama", PromptTokens: 8192, MaxTokens: 256}
	req.BlockHashes = prefix.Hash("llama", text, 64, 512, nil)
	pods := make([]*Pod, n)
	for i := range pods {
		pods[i] = mkPod(podN(i), waiting(r.IntN(8)), running(r.IntN(32)), kv(r.Float64()),
			inflight(r.IntN(10)), prefill(5000+r.Float64()*20000))
		pods[i].Metrics.HasLoRA = true
		pods[i].Metrics.MaxLoras = 4
		pods[i].Metrics.ActiveAdapters = []string{"a1", "a2"}
		// Earlier requests: each pod saw the system prompt; some saw more.
		other := append(append([]byte{}, sys...), fmt.Sprintf("user %d ", i)...)
		tr.Index().Record(pods[i].Name, prefix.Hash("llama", other, 64, 512, nil))
		if i%10 == 0 {
			tr.Index().Record(pods[i].Name, req.BlockHashes[:r.IntN(512)])
		}
	}
	s, err := NewScheduler(DefaultProfile(), Options{Tracker: tr, Rand: rand.New(rand.NewPCG(1, 1))})
	if err != nil {
		b.Fatal(err)
	}
	return s, req, pods
}

func BenchmarkPick(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			s, req, pods := benchFixture(b, n)
			loopPick(b, s, req, pods)
		})
	}
}

// loopPick times ScheduleInto with a reused Result.
func loopPick(b *testing.B, s *Scheduler, req *Request, pods []*Pod) {
	var res Result
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		if err := s.ScheduleInto(&res, req, pods); err != nil && err != ErrSaturated {
			b.Fatal(err)
		}
	}
	cpu.report(b)
}

// BenchmarkPickSession is BenchmarkPick for requests with a session key:
// "new" is a session no replica has served (the session-balance scorer
// counts live sessions and checks the index), "known" one this replica
// has (a lookup only). 2,000 live sessions are spread over the pods.
func BenchmarkPickSession(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		for _, kind := range []string{"new", "known"} {
			b.Run(fmt.Sprintf("pods=%d/%s", n, kind), func(b *testing.B) {
				s, req, pods := benchFixture(b, n)
				tr := s.opts.Tracker
				for i := range 2000 {
					r := &Request{Session: fmt.Sprint("live-", i)}
					tr.Dispatched(pods[i%n].Name, r)
					tr.Done(pods[i%n].Name, r)
				}
				req.Session = "live-7"
				if kind == "new" {
					req.Session = "never-seen"
				}
				loopPick(b, s, req, pods)
			})
		}
	}
}

// BenchmarkSchedule is BenchmarkPick through Schedule, which returns a fresh
// Result each time (allocations grow with pods only in bytes, not count).
func BenchmarkSchedule(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			s, req, pods := benchFixture(b, n)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Schedule(req, pods); err != nil && err != ErrSaturated {
					b.Fatal(err)
				}
			}
		})
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
