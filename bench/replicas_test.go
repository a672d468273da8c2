package bench

import (
	"context"
	"reflect"
	"testing"
)

func TestOneReplicaIsTheDefault(t *testing.T) {
	setup := Setup{Name: "test", Fleet: smallFleet()}
	st := smallStream(5)
	pol := mustPolicy(t, PolicyInfergate)
	a, err := Run(context.Background(), setup, pol, 5, st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(context.Background(), setup, pol, 5, st, Options{Replicas: Replicas{N: 1, Share: true}})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatal("one router differs from the default run")
	}
}

// TestReplicasShareThePrefix: one long shared prefix over 8 pods, arrivals
// split over 4 routers. Without sharing each router learns the prefix on
// its own pods; with sharing they keep it together as one router does.
func TestReplicasShareThePrefix(t *testing.T) {
	f, st := oneLongPrefix()
	run := func(r Replicas) (pods int, hit float64) {
		t.Helper()
		opts := Options{Replicas: r}
		a, err := Run(context.Background(), Setup{Name: "prefix", Fleet: f}, mustPolicy(t, PolicyInfergate), 3, st, opts)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Run(context.Background(), Setup{Name: "prefix", Fleet: f}, mustPolicy(t, PolicyInfergate), 3, st, opts)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%+v: two runs of the same seed differ", r)
		}
		for _, c := range a.PodRequests {
			if c > 0 {
				pods++
			}
		}
		return pods, a.PrefixHitRate
	}
	onePods, oneHit := run(Replicas{})
	sepPods, sepHit := run(Replicas{N: 4})
	shPods, shHit := run(Replicas{N: 4, Share: true})
	t.Logf("pods used / prefix hit: one router %d/%.3f, 4 unshared %d/%.3f, 4 shared %d/%.3f", onePods, oneHit, sepPods, sepHit, shPods, shHit)
	if sepPods <= onePods {
		t.Errorf("4 unshared routers used %d pods, one router %d: want the prefix scattered", sepPods, onePods)
	}
	if shPods > 3 || shHit <= sepHit {
		t.Errorf("4 shared routers used %d pods with prefix hit %.3f (unshared %.3f); want ≤ 3 pods and more hits", shPods, shHit, sepHit)
	}
}
