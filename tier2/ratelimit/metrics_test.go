package ratelimit

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/tier2/tenant"
)

func TestCollector(t *testing.T) {
	l := New(Options{})
	defer l.Close()
	tn := &tenant.Tenant{ID: "m", Limits: tenant.Limits{RPM: 5}}
	for i := 0; i < 3; i++ {
		_, _, _ = l.Admit(context.Background(), tn, "x", 0)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(l.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	n := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			n++
			if c := m.GetCounter(); c != nil && len(m.GetLabel()) == 0 {
				got[mf.GetName()] = c.GetValue()
			}
		}
	}
	if got["infergate_tier2_ratelimit_admissions_total"] != 3 || n != 7 {
		t.Fatalf("metrics: %v (%d series)", got, n)
	}
}
