package bench

import (
	"fmt"
	"time"

	"github.com/infergate/infergate/bench/report"
	"github.com/infergate/infergate/tier1/picker"
)

// speedWarmup is the share of a stream's arrival window after which the
// learned speeds are sampled (sampleSpeeds): before it the estimates are
// still converging from their first samples.
const speedWarmup = 0.2

// speedSamples accumulates, per pod, the learned prefill speed at every
// tick between the warm-up and the end of the arrival window.
type speedSamples struct {
	sum []float64
	n   []int
}

// routing returns the tracker and scheduler whose speeds are reported:
// router 0's when there are replicas.
func (s *sim) routing() (*picker.Tracker, *picker.Scheduler) {
	if s.rep != nil {
		return s.rep.routers[0].tracker, s.rep.routers[0].sched
	}
	return s.tracker, s.sched
}

// sampleSpeeds records each pod's learned speed at now when now is past
// the warm-up and within the arrival window (after it, load drains and
// the estimates stop moving). A time average over the run tells a
// router that mistakes engine noise for a difference between pods (its
// estimates stay apart) from one whose estimates only wobble around the
// same value, which an end-of-run snapshot alone cannot.
func (s *sim) sampleSpeeds(now time.Duration) {
	tr, sched := s.routing()
	d := s.stream.Duration
	if sched == nil || d <= 0 || now < time.Duration(speedWarmup*float64(d)) || now > d {
		return
	}
	if s.speeds.sum == nil {
		s.speeds = speedSamples{sum: make([]float64, len(s.views)), n: make([]int, len(s.views))}
	}
	for k, v := range s.views {
		if x := tr.PrefillTokensPerSec(v.Name); x > 0 {
			s.speeds.sum[k] += x
			s.speeds.n[k]++
		}
	}
}

// learnedSpeeds is what the router (router 0 when there are replicas)
// learned of its pods' prefill speeds: each pod's own estimate at the end
// of the run, its time average after warm-up, and the speed its scheduler
// uses at the end (pooled with the pod's hardware class), so a report can
// say whether identical pods agree. Nil for a policy that learns nothing
// (no picker profile, or none learned).
func (s *sim) learnedSpeeds() *report.Speeds {
	tr, sched := s.routing()
	if sched == nil {
		return nil
	}
	s.refresh(s.loop.Now())
	tr.Apply(s.views)
	sp := &report.Speeds{}
	any := false
	for k, v := range s.views {
		own := tr.PrefillTokensPerSec(v.Name)
		any = any || own > 0
		sp.Pods = append(sp.Pods, v.Name)
		sp.Classes = append(sp.Classes, fmt.Sprintf("%s×%d", v.GPU, v.GPUs))
		sp.Learned = append(sp.Learned, report.Num(own))
		var avg float64
		if s.speeds.sum != nil && s.speeds.n[k] > 0 {
			avg = s.speeds.sum[k] / float64(s.speeds.n[k])
		}
		sp.WarmMean = append(sp.WarmMean, report.Num(avg))
	}
	if !any {
		return nil
	}
	for _, v := range sched.PrefillSpeeds(s.views, nil) {
		sp.Used = append(sp.Used, report.Num(v))
	}
	return sp
}
