package picker

import (
	"errors"
	"os"
	"testing"
	"time"
)

func uncachedQueued(n int) func(*Pod) { return func(p *Pod) { p.InFlightUncachedTokens = n } }

func TestBusy(t *testing.T) {
	d := SaturationDetector{PrefillWait: 400 * time.Millisecond}
	tests := []struct {
		name  string
		det   SaturationDetector
		pod   *Pod
		speed float64 // the scheduler's estimate for the pod; 0: its own learned speed
		want  bool
	}{
		{"off", SaturationDetector{}, mkPod("a", prefill(10000), uncachedQueued(1e6)), 0, false},
		{"under the wait", d, mkPod("a", prefill(10000), uncachedQueued(3999)), 0, false},
		{"at the wait", d, mkPod("a", prefill(10000), uncachedQueued(4000)), 0, true},
		{"the given speed wins over the pod's own", d, mkPod("a", prefill(20000), uncachedQueued(5000)), 10000, true},
		{"own speed when none is given", d, mkPod("a", prefill(20000), uncachedQueued(5000)), 0, false},
		{"mean speed when unlearned", d, mkPod("a", uncachedQueued(5000)), 10000, true},
		{"no speed known: never busy", d, mkPod("a", uncachedQueued(1e6)), 0, false},
		{"scraped queue alone is not prefill", d, mkPod("a", prefill(10000), waiting(4)), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.det.Busy(tt.pod, tt.speed); got != tt.want {
				t.Fatalf("Busy = %v, want %v", got, tt.want)
			}
		})
	}
}

// With saturation.prefill_wait the scheduler holds (ErrBusy) only when
// every candidate is busy or saturated, and still ranks them all.
func TestScheduleBusy(t *testing.T) {
	cfg := DefaultProfile()
	cfg.Saturation.PrefillWait = 400 * time.Millisecond
	if DefaultProfile().Saturation.PrefillWait != DefaultPrefillWait {
		t.Fatal("default profile does not hold")
	}
	busy := func(name string) *Pod { return mkPod(name, prefill(10000), uncachedQueued(6000)) }
	free := func(name string) *Pod { return mkPod(name, prefill(10000), uncachedQueued(1000)) }
	full := func(name string) *Pod { return mkPod(name, prefill(10000), waiting(9)) }
	// Sheddable requests busy at 300 ms: mid (350 ms queued) is busy for
	// them but not at prefill_wait (400 ms).
	shedLow := cfg
	shedLow.Saturation.SheddableWait = 300 * time.Millisecond
	mid := func(name string) *Pod { return mkPod(name, prefill(10000), uncachedQueued(3500)) }
	tests := []struct {
		name      string
		cfg       ProfileConfig
		pods      []*Pod
		sheddable bool
		want      error
	}{
		{"one pod drained", cfg, []*Pod{busy("a"), free("b")}, false, nil},
		{"every pod busy", cfg, []*Pod{busy("a"), busy("b")}, false, ErrBusy},
		{"busy and saturated", cfg, []*Pod{busy("a"), full("b")}, false, ErrBusy},
		{"every pod saturated", cfg, []*Pod{full("a"), full("b")}, false, ErrSaturated},
		{"holding off", GIEDefaultProfile(), []*Pod{busy("a"), busy("b")}, false, nil},
		{"sheddable at prefill_wait", cfg, []*Pod{busy("a"), mid("b")}, true, nil},
		{"sheddable at its own lower wait", shedLow, []*Pod{busy("a"), mid("b")}, true, ErrBusy},
		{"sheddable wait leaves standard alone", shedLow, []*Pod{busy("a"), mid("b")}, false, nil},
		{"sheddable wait under a drained pod", shedLow, []*Pod{busy("a"), free("b")}, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustScheduler(t, tt.cfg, Options{Rand: seeded(1)})
			res, err := s.Schedule(&Request{Model: "llama", PromptTokens: 100, Sheddable: tt.sheddable}, tt.pods)
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if len(res.Ranked) != len(tt.pods) {
				t.Fatalf("ranked %d pods, want %d", len(res.Ranked), len(tt.pods))
			}
			if res.Busy != errors.Is(tt.want, ErrBusy) || res.Saturated != errors.Is(tt.want, ErrSaturated) {
				t.Fatalf("Busy %v Saturated %v for %v", res.Busy, res.Saturated, tt.want)
			}
		})
	}
}

func TestPrefillTime(t *testing.T) {
	tr := NewTracker(TrackerOptions{})
	hashes := []uint64{1, 2, 3, 4}
	// b holds half the prompt's blocks; c is twice as fast as a.
	tr.Dispatched("b", &Request{PromptTokens: 100, BlockHashes: hashes[:2]})
	s := mustScheduler(t, DefaultProfile(), Options{Tracker: tr, Rand: seeded(1)})
	req := &Request{Model: "llama", PromptTokens: 8000, BlockHashes: hashes}
	tests := []struct {
		name string
		pods []*Pod
		want time.Duration
	}{
		{"no pods", nil, 0},
		{"cold pod at its speed", []*Pod{mkPod("a", prefill(8000))}, time.Second},
		{"fastest pod", []*Pod{mkPod("a", prefill(8000)), mkPod("c", prefill(16000))}, 500 * time.Millisecond},
		{"cached half", []*Pod{mkPod("a", prefill(8000)), mkPod("b", prefill(8000))}, 500 * time.Millisecond},
		{"unlearned pod at the others' mean", []*Pod{mkPod("a", prefill(4000)), mkPod("d")}, 2 * time.Second},
		{"nothing learned: default speed", []*Pod{mkPod("d")}, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.PrefillTime(req, tt.pods); got != tt.want {
				t.Fatalf("PrefillTime = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestProfileHoldYAML(t *testing.T) {
	c, err := ParseProfile("t", []byte("saturation: {prefill_wait: 400ms}\nwait_order: {shortest_prefill: 4}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Saturation.PrefillWait != 400*time.Millisecond || c.WaitOrder.ShortestPrefill != 4 || c.Saturation.QueueThreshold != DefaultQueueThreshold {
		t.Fatalf("parsed %+v %+v", c.Saturation, c.WaitOrder)
	}
	if c, err := ParseProfile("t", []byte("saturation: {prefill_wait: 0s}\n")); err != nil || c.Saturation.PrefillWait != 0 {
		t.Fatalf("prefill_wait 0 does not turn holding off: %v %v", c.Saturation.PrefillWait, err)
	}
	if c, err := ParseProfile("t", []byte("saturation: {queue_threshold: 7}\n")); err != nil || c.Saturation.PrefillWait != DefaultPrefillWait {
		t.Fatalf("default holding lost: %v %v", c.Saturation.PrefillWait, err)
	}
	if c, err := ParseProfile("t", []byte("saturation: {sheddable_wait: 100ms}\n")); err != nil || c.Saturation.SheddableWait != 100*time.Millisecond || c.Saturation.PrefillWait != DefaultPrefillWait {
		t.Fatalf("sheddable_wait: %+v %v", c.Saturation, err)
	}
	if c, err := ParseProfile("t", []byte("saturation: {slower_gpu_wait: 1s}\n")); err != nil || c.Saturation.SlowerGPUWait != time.Second || c.Saturation.PrefillWait != DefaultPrefillWait {
		t.Fatalf("slower_gpu_wait: %+v %v", c.Saturation, err)
	}
	if DefaultProfile().Saturation.SlowerGPUWait != 0 || GIEDefaultProfile().Saturation.SlowerGPUWait != 0 {
		t.Fatal("slower_gpu_wait is opt-in")
	}
	if c, err := ParseProfile("t", []byte("base: gie\n")); err != nil || c.Saturation.PrefillWait != 0 {
		t.Fatalf("GIE's profile holds: %v %v", c.Saturation.PrefillWait, err)
	}
	for _, bad := range []string{"saturation: {prefill_wait: -1s}\n", "saturation: {sheddable_wait: -1ms}\n", "saturation: {slower_gpu_wait: -1s}\n", "wait_order: {shortest_prefill: -1}\n", "wait_order: {shortest: 1}\n"} {
		if _, err := ParseProfile("t", []byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestHoldExampleProfiles(t *testing.T) {
	tests := []struct {
		file   string
		wait   time.Duration
		order  float64
		slower time.Duration
	}{
		{"picker-no-hold.yaml", 0, 0, 0},
		{"picker-shortest-prefill.yaml", DefaultPrefillWait, 4, 0},
		{"picker-hold-for-fast-gpus.yaml", DefaultPrefillWait, 0, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			data, err := os.ReadFile("../../examples/" + tt.file)
			if err != nil {
				t.Fatal(err)
			}
			c, err := ParseProfile(tt.file, data)
			if err != nil {
				t.Fatal(err)
			}
			if c.Saturation.PrefillWait != tt.wait || c.WaitOrder.ShortestPrefill != tt.order || c.Saturation.SlowerGPUWait != tt.slower {
				t.Fatalf("prefill_wait %v, shortest_prefill %v, slower_gpu_wait %v", c.Saturation.PrefillWait, c.WaitOrder.ShortestPrefill, c.Saturation.SlowerGPUWait)
			}
		})
	}
}

// With saturation.slower_gpu_wait a pod of a slower hardware class is busy
// for a request whose extra prefill there would reach the wait, so the
// request is held for a fast pod rather than sent to an idle slow one.
func TestScheduleBusySlowerGPU(t *testing.T) {
	cfg := DefaultProfile()
	cfg.Saturation.PrefillWait = 400 * time.Millisecond
	cfg.Saturation.SlowerGPUWait = time.Second
	off := cfg
	off.Saturation.SlowerGPUWait = 0
	h100 := func(name string, mods ...func(*Pod)) *Pod {
		return mkPod(name, append([]func(*Pod){gpu("h100"), gpus(1), prefill(10000)}, mods...)...)
	}
	a10g := func(name string, mods ...func(*Pod)) *Pod {
		return mkPod(name, append([]func(*Pod){gpu("a10g"), gpus(1), prefill(1000)}, mods...)...)
	}
	busyH := h100("h", uncachedQueued(6000)) // 600 ms queued
	tests := []struct {
		name      string
		cfg       ProfileConfig
		pods      []*Pod
		tokens    int
		sheddable bool
		want      error
	}{
		// 2,000 tokens: 2 s on the A10G against 0.2 s on an H100.
		{"long prompt held for the fast pod", cfg, []*Pod{busyH, a10g("a")}, 2000, false, ErrBusy},
		{"off: the idle slow pod takes it", off, []*Pod{busyH, a10g("a")}, 2000, false, nil},
		// 800 tokens: 0.72 s extra, under the second, unless the slow pod
		// has 0.35 s queued (itself under prefill_wait).
		{"short prompt goes to the slow pod", cfg, []*Pod{busyH, a10g("a")}, 800, false, nil},
		{"slow pod's queue counts", cfg, []*Pod{busyH, a10g("a", uncachedQueued(350))}, 800, false, ErrBusy},
		{"sheddable requests still use slow pods", cfg, []*Pod{busyH, a10g("a")}, 2000, true, nil},
		{"fast pod free", cfg, []*Pod{h100("h"), a10g("a")}, 2000, false, nil},
		// One class: learned speeds differ, the class does not.
		{"same class, slower learned speed", cfg, []*Pod{busyH, h100("h2", prefill(1000))}, 2000, false, nil},
		{"no known class", cfg, []*Pod{busyH, mkPod("x", prefill(1000))}, 2000, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustScheduler(t, tt.cfg, Options{Rand: seeded(1)})
			_, err := s.Schedule(&Request{Model: "llama", PromptTokens: tt.tokens, Sheddable: tt.sheddable}, tt.pods)
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

// HoldKey is the same for requests that only differ in what the hold
// decision does not read, and absent when slower_gpu_wait reads the prompt.
func TestHoldKey(t *testing.T) {
	s, err := NewScheduler(DefaultProfile(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	r1 := &Request{ID: "1", Model: "lora-a", BaseModel: "llama", Adapter: "lora-a", PromptTokens: 10, Priority: 1}
	r2 := &Request{ID: "2", Model: "lora-a", BaseModel: "llama", Adapter: "lora-a", PromptTokens: 9000, BlockHashes: []uint64{1, 2}}
	r3 := &Request{ID: "3", Model: "lora-b", BaseModel: "llama", Adapter: "lora-b", PromptTokens: 10}
	k1, ok1 := s.HoldKey(r1)
	k2, ok2 := s.HoldKey(r2)
	k3, _ := s.HoldKey(r3)
	if !ok1 || !ok2 || k1 != k2 {
		t.Errorf("same kind: keys %+v %v, %+v %v", k1, ok1, k2, ok2)
	}
	if k1 == k3 {
		t.Error("different adapters share a key")
	}
	prof := DefaultProfile()
	prof.Saturation.SlowerGPUWait = time.Second
	if err := s.Update(prof); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.HoldKey(r1); ok {
		t.Error("keyed with slower_gpu_wait on")
	}
	if _, ok := s.HoldKey(&Request{Sheddable: true}); !ok {
		t.Error("sheddable request keyless with slower_gpu_wait (it is exempt from the rule)")
	}
}
