package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// The full run is tested in bench/load (TestRunTiny); here only the flag
// checks, which fail before any process starts.
func TestLoadbenchFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--rates", "500,abc"}, `--rates: "abc"`},
		{[]string{"--rates", "0"}, `--rates: "0"`},
		{[]string{"--stream-percent", "101"}, "--stream-percent"},
		{[]string{"extra"}, "unexpected arguments"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		err := runLoadbench(context.Background(), tt.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: err %v, want it to contain %q", tt.args, err, tt.want)
		}
	}
}
