package config

import (
	"errors"
	"strings"
	"testing"
)

type sample struct {
	Name  string `yaml:"name"`
	Port  int    `yaml:"port"`
	Inner struct {
		Weight float64 `yaml:"weight"`
	} `yaml:"inner"`
}

func (s *sample) SetDefaults() {
	if s.Port == 0 {
		s.Port = 8080
	}
}

func (s *sample) Validate() error {
	if s.Port < 0 || s.Port > 65535 {
		return errors.New("port: must be in [0, 65535]")
	}
	return nil
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string
		want    sample
	}{
		{name: "defaults", in: "name: a\n", want: sample{Name: "a", Port: 8080}},
		{name: "empty", in: "", want: sample{Port: 8080}},
		{name: "unknown field names field and line", in: "name: a\ninner:\n  wieght: 2\n", wantErr: "line 3: field wieght not found"},
		{name: "validation", in: "port: 70000\n", wantErr: "port: must be in"},
		{name: "bad type", in: "port: abc\n", wantErr: "line 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got sample
			err := Decode("test.yaml", []byte(tt.in), &got)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != tt.want.Name || got.Port != tt.want.Port {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
