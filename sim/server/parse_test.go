package server

import "testing"

func TestParseLoRAModule(t *testing.T) {
	tests := []struct {
		in      string
		want    LoRAModule
		wantErr bool
	}{
		{in: "sql=/adapters/sql", want: LoRAModule{Name: "sql", Path: "/adapters/sql"}},
		{in: "bare", want: LoRAModule{Name: "bare", Path: "bare"}},
		{in: " spaced = /p ", want: LoRAModule{Name: "spaced", Path: "/p"}},
		{in: "a=b=c", want: LoRAModule{Name: "a", Path: "b=c"}},
		{in: "", wantErr: true},
		{in: "=path", wantErr: true},
		{in: "name=", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseLoRAModule(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("ParseLoRAModule(%q) = %+v, %v", tt.in, got, err)
			}
		})
	}
}

func TestParseFlavor(t *testing.T) {
	for _, f := range Flavors() {
		if got, err := ParseFlavor(string(f)); err != nil || got != f {
			t.Errorf("ParseFlavor(%q) = %q, %v", f, got, err)
		}
	}
	for _, bad := range []string{"", "VLLM", "trtllm"} {
		if _, err := ParseFlavor(bad); err == nil {
			t.Errorf("ParseFlavor(%q) accepted", bad)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"unknown model", Config{Model: "gpt-5"}},
		{"unknown gpu", Config{GPU: "tpu"}},
		{"unknown flavor", Config{Flavor: "trtllm"}},
		{"negative time scale", Config{TimeScale: -1}},
		{"adapter named like the model", Config{ServedModelName: "m", LoRAModules: []LoRAModule{{Name: "m"}}}},
		{"duplicate adapter", Config{LoRAModules: []LoRAModule{{Name: "a"}, {Name: "a"}}}},
		{"model does not fit", Config{Model: "llama-3.1-70b", GPU: "l4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Logger = quietLogger()
			if _, err := New(tt.cfg); err == nil {
				t.Fatal("New accepted a bad config")
			}
		})
	}
}
