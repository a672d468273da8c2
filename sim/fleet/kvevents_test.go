package fleet

import (
	"context"
	"strings"
	"testing"
)

func TestKVEventsSpec(t *testing.T) {
	c, err := Load(writeFile(t, `pods:
  - name: a
    port: 9100
    replicas: 2
    served_model_name: llama
    kv_events: {endpoint: "tcp://*:5600", replay_endpoint: "tcp://*:5700", topic: "kv@{addr}@{model}", legacy: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	reps := expand(c.Pods[0])
	for i, want := range []struct{ ep, replay, topic string }{
		{"tcp://*:5600", "tcp://*:5700", "kv@127.0.0.1:9100@llama"},
		{"tcp://*:5601", "tcp://*:5701", "kv@127.0.0.1:9101@llama"},
	} {
		sc, err := reps[i].serverConfig(1, c.Host, quiet())
		if err != nil {
			t.Fatal(err)
		}
		kv := sc.KVEvents
		if kv.Endpoint != want.ep || kv.ReplayEndpoint != want.replay || kv.Topic != want.topic || !kv.Legacy || kv.Connect {
			t.Errorf("replica %d: %+v, want %+v bound, legacy", i, kv, want)
		}
	}
	// A host that is not a wildcard is dialled (vLLM's rule): a router
	// that binds.
	if kv := (KVEventsSpec{Endpoint: "tcp://router:5557"}).ServerConfig("h:1", "m"); !kv.Connect {
		t.Error("tcp://router:5557 bound, want dialled")
	}
	for _, tt := range []struct{ yaml, want string }{
		{"pods:\n  - name: a\n    kv_events: {replay_endpoint: \"tcp://*:1\"}\n", "pods[0].kv_events.endpoint: required"},
		{"pods:\n  - name: a\n    kv_events: {endpoint: \"*:1\"}\n", "pods[0].kv_events.endpoint"},
		{"pods:\n  - name: a\n    kv_events: {endpoint: \"tcp://*:1\", topic: \"kv@{addr}\"}\n", "{addr} needs a fixed port"},
	} {
		if _, err := Load(writeFile(t, tt.yaml)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want %q", tt.yaml, err, tt.want)
		}
	}
}

// A fleet pod with kv_events publishes: its publisher is bound when Start
// returns.
func TestStartPublishesKVEvents(t *testing.T) {
	f, err := Start(context.Background(), Config{Logger: quiet(), Pods: []PodSpec{{Name: "a",
		KVEvents: KVEventsSpec{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if p := f.Pods[0]; !strings.HasPrefix(p.KVEventsAddr(), "tcp://") || !strings.HasPrefix(p.KVEventsReplayAddr(), "tcp://") {
		t.Errorf("publisher %q, replay %q", p.KVEventsAddr(), p.KVEventsReplayAddr())
	}
}
