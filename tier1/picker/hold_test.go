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

func TestProfileHoldYAML(t *testing.T) {
	c, err := ParseProfile("t", []byte("saturation: {prefill_wait: 400ms}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Saturation.PrefillWait != 400*time.Millisecond || c.Saturation.QueueThreshold != DefaultQueueThreshold {
		t.Fatalf("parsed %+v", c.Saturation)
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
	if c, err := ParseProfile("t", []byte("base: gie\n")); err != nil || c.Saturation.PrefillWait != 0 {
		t.Fatalf("GIE's profile holds: %v %v", c.Saturation.PrefillWait, err)
	}
	// The removed experimental keys are refused like any unknown key.
	for _, bad := range []string{"saturation: {prefill_wait: -1s}\n", "saturation: {sheddable_wait: -1ms}\n", "saturation: {slower_gpu_wait: 1s}\n", "wait_order: {shortest_prefill: 4}\n"} {
		if _, err := ParseProfile("t", []byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestHoldExampleProfiles(t *testing.T) {
	tests := []struct {
		file string
		wait time.Duration
	}{
		{"picker-no-hold.yaml", 0},
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
			if c.Saturation.PrefillWait != tt.wait {
				t.Fatalf("prefill_wait %v, want %v", c.Saturation.PrefillWait, tt.wait)
			}
		})
	}
}

// HoldKey is the same for requests that only differ in what the hold
// decision does not read.
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
}
