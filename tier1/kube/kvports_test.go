package kube

import (
	"log/slog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/infergate/infergate/tier1/config"
	"github.com/infergate/infergate/tier1/kvevents"
)

// A pod's KV-events port annotations become its kv_events ports; a value
// that is not a port is ignored (the kv_events default), and a replay port
// of 0 turns replay off for the pod.
func TestKVEventsPortAnnotations(t *testing.T) {
	d := &Discoverer{log: slog.New(slog.DiscardHandler), warned: map[string]bool{}}
	tests := []struct {
		name             string
		ann              map[string]string
		wantPort, wantRp int
	}{
		{"none", nil, 0, 0},
		{"both", map[string]string{kvevents.AnnotationPort: "6001", kvevents.AnnotationReplayPort: " 6002 "}, 6001, 6002},
		{"replay off", map[string]string{kvevents.AnnotationReplayPort: "0"}, 0, -1},
		{"publisher port 0 is not a port", map[string]string{kvevents.AnnotationPort: "0"}, 0, 0},
		{"garbage", map[string]string{kvevents.AnnotationPort: "http", kvevents.AnnotationReplayPort: "70000"}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: tt.ann}}
			port := d.portAnnotation(pod, kvevents.AnnotationPort, 1)
			rp := d.portAnnotation(pod, kvevents.AnnotationReplayPort, 0)
			if port != tt.wantPort || rp != tt.wantRp {
				t.Errorf("ports %d, %d; want %d, %d", port, rp, tt.wantPort, tt.wantRp)
			}
		})
	}
	a := config.PodConfig{Name: "p", KVEventsPort: 1}
	if b := a; !podEqual(a, b) {
		t.Error("equal pods differ")
	}
	if b := (config.PodConfig{Name: "p", KVEventsPort: 2}); podEqual(a, b) {
		t.Error("a changed kv-events port is not a change: discovery would keep the old endpoint")
	}
}
