package kvevents

import (
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // substring of the error naming the key; "" valid
	}{
		{"disabled is valid whatever it holds", Config{Mode: "nonsense"}, ""},
		{"connect defaults", Config{Enabled: true}, ""},
		{"bind", Config{Enabled: true, Mode: ModeBind, Listen: "tcp://0.0.0.0:5557"}, ""},
		{"bind without listen", Config{Enabled: true, Mode: ModeBind}, "listen: required"},
		{"bind with a bad listen", Config{Enabled: true, Mode: ModeBind, Listen: "0.0.0.0:5557"}, "listen:"},
		{"bind with a foreign topic", Config{Enabled: true, Mode: ModeBind, Listen: "tcp://*:5557", Topic: "events"}, "topic:"},
		{"listen in connect mode", Config{Enabled: true, Listen: "tcp://*:5557"}, "listen: only used"},
		{"unknown mode", Config{Enabled: true, Mode: "push"}, "mode:"},
		{"port", Config{Enabled: true, Port: 70000}, "port:"},
		{"replay port", Config{Enabled: true, ReplayPort: -1}, "replay_port:"},
		{"replay port equals port", Config{Enabled: true, Port: 5557, ReplayPort: 5557}, "replay_port: 5557 is the publisher port"},
		{"message limit", Config{Enabled: true, MaxMessageBytes: 10}, "max_message_bytes:"},
		{"block cap", Config{Enabled: true, MaxBlocksPerPod: -1}, "max_blocks_per_pod:"},
		{"negative duration", Config{Enabled: true, StaleAfter: -time.Second}, "stale_after:"},
		{"empty medium", Config{Enabled: true, Media: []string{"GPU", ""}}, "media[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			c.SetDefaults()
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestTargetFor(t *testing.T) {
	c := Config{Enabled: true, ReplayPort: 5558}
	c.SetDefaults()
	tg, err := c.TargetFor("pod-1", "10.1.2.3:8000", nil)
	if err != nil || tg.Endpoint != "tcp://10.1.2.3:5557" || tg.ReplayEndpoint != "tcp://10.1.2.3:5558" || tg.Address != "10.1.2.3:8000" {
		t.Fatalf("%+v %v", tg, err)
	}
	tg, err = c.TargetFor("pod-1", "[fd00::1]:8000", map[string]string{AnnotationPort: "6000", AnnotationReplayPort: "0"})
	if err != nil || tg.Endpoint != "tcp://[fd00::1]:6000" || tg.ReplayEndpoint != "" {
		t.Fatalf("annotations: %+v %v", tg, err)
	}
	if _, err := c.TargetFor("pod-1", "10.1.2.3:8000", map[string]string{AnnotationPort: "x"}); err == nil || !strings.Contains(err.Error(), AnnotationPort) {
		t.Fatalf("bad annotation: %v", err)
	}
	b := Config{Enabled: true, Mode: ModeBind, Listen: "tcp://*:5557"}
	b.SetDefaults()
	if tg, _ := b.TargetFor("pod-1", "10.1.2.3:8000", nil); tg.Endpoint != "" || tg.Address != "10.1.2.3:8000" {
		t.Fatalf("bind mode target %+v", tg)
	}
}
