package config

import (
	"strings"
	"testing"

	loader "github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/tier1/kvevents"
)

func TestKVEventsConfig(t *testing.T) {
	var c Config
	data := base + `kv_events: {enabled: true, replay_port: 5558}
`
	if err := loader.Decode("t.yaml", []byte(data), &c); err != nil {
		t.Fatal(err)
	}
	kv := c.KVEvents
	if !kv.Enabled || kv.Mode != kvevents.ModeConnect || kv.Port != kvevents.DefaultPort || kv.ReplayPort != 5558 ||
		kv.StaleAfter != kvevents.DefaultStaleAfter || len(kv.Media) != 1 {
		t.Errorf("kv_events defaults not applied: %+v", kv)
	}

	var off Config
	if err := loader.Decode("t.yaml", []byte(base), &off); err != nil {
		t.Fatal(err)
	}
	if off.KVEvents.Enabled {
		t.Error("kv_events on by default")
	}

	var tok Config
	data = `auth: {tokens: [t1]}
kv_events: {enabled: true}
pools:
  - name: llama
    model: llama-3.1-8b
    tokenizer: {file: /t/tokenizer.json, config_file: /t/tokenizer_config.json, chat_template_file: /t/chat.jinja}
pods:
  - {name: p0, address: "127.0.0.1:8101", pool: llama, kv_events_port: 6000, kv_events_replay_port: -1}
`
	if err := loader.Decode("t.yaml", []byte(data), &tok); err != nil {
		t.Fatal(err)
	}
	if tc := tok.Pools[0].Tokenizer; tc.File != "/t/tokenizer.json" || tc.ConfigFile != "/t/tokenizer_config.json" || tc.ChatTemplateFile != "/t/chat.jinja" {
		t.Errorf("tokenizer block: %+v", tc)
	}
	if p := tok.Pods[0]; p.KVEventsPort != 6000 || p.KVEventsReplayPort != -1 {
		t.Errorf("pod kv ports: %+v", p)
	}
}

func TestKVEventsValidate(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string // every one in the error; none: valid
	}{
		{"enabled", base + "kv_events: {enabled: true}\n", nil},
		{"disabled block is not checked", base + "kv_events: {mode: sideways}\n", nil},
		{"bad mode names the key", base + "kv_events: {enabled: true, mode: sideways}\n", []string{"kv_events.mode", `"sideways"`}},
		{"bind needs listen", base + "kv_events: {enabled: true, mode: bind}\n", []string{"kv_events.listen: required"}},
		{"two keys at once", base + "kv_events: {enabled: true, port: 70000, stale_after: -1s}\n", []string{"kv_events.port: 70000", "kv_events.stale_after"}},
		{"unknown key", base + "kv_events: {enabled: true, prot: 1}\n", []string{"prot"}},
		{"tokenizer without file", "auth: {tokens: [t]}\npools: [{name: llama, model: m, tokenizer: {config_file: /c.json}}]\n",
			[]string{"pools[0].tokenizer.file: required"}},
		{"tokenizer unknown key", "auth: {tokens: [t]}\npools: [{name: llama, model: m, tokenizer: {path: /t.json}}]\n", []string{"path"}},
		{"pod kv port out of range", base + "  - {name: p1, address: \"127.0.0.1:1\", pool: llama, kv_events_port: 70000}\n",
			[]string{"pods[1].kv_events_port: 70000"}},
		{"pod replay port out of range", base + "  - {name: p1, address: \"127.0.0.1:1\", pool: llama, kv_events_replay_port: -2}\n",
			[]string{"pods[1].kv_events_replay_port: -2"}},
		{"precise-prefix without kv_events", base + "scheduler: {scorers: [{name: prefix, enabled: false}, {name: precise-prefix, weight: 3}]}\n",
			[]string{"precise-prefix needs kv_events.enabled"}},
		{"precise-prefix with kv_events", base + "kv_events: {enabled: true}\nscheduler: {scorers: [{name: prefix, enabled: false}, {name: precise-prefix, weight: 3}]}\n", nil},
		{"prefix and precise-prefix both on", base + "kv_events: {enabled: true}\nscheduler: {scorers: [{name: precise-prefix, weight: 3}]}\n",
			[]string{"prefix and precise-prefix are one scorer"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Config
			err := loader.Decode("t.yaml", []byte(tt.yaml), &c)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
