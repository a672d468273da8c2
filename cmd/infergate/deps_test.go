package main

import (
	"os/exec"
	"strings"
	"testing"
)

// module is this repository's module path.
const module = "github.com/infergate/infergate"

// labOnly reports whether pkg, a package of this module, belongs to the
// lab and not to the production binary: the simulator (sim/...), the
// benchmarks (bench/...), the local stack (devstack), the lab tree and
// command (lab/..., cmd/infergate-lab) and test helpers (internal/testpki,
// internal/testservice, internal/admissiontest: an element that starts or
// ends with "test").
func labOnly(pkg string) bool {
	rel, ok := strings.CutPrefix(pkg, module+"/")
	if !ok {
		return false
	}
	elems := strings.Split(rel, "/")
	switch elems[0] {
	case "sim", "bench", "devstack", "lab":
		return true
	}
	if rel == "cmd/infergate-lab" || strings.HasPrefix(rel, "cmd/infergate-lab/") {
		return true
	}
	for _, e := range elems {
		if strings.HasPrefix(e, "test") || strings.HasSuffix(e, "test") {
			return true
		}
	}
	return false
}

func TestLabOnly(t *testing.T) {
	tests := []struct {
		pkg  string
		want bool
	}{
		{module + "/sim/engine", true},
		{module + "/bench", true},
		{module + "/bench/report", true},
		{module + "/devstack", true},
		{module + "/lab/bounds", true},
		{module + "/cmd/infergate-lab", true},
		{module + "/internal/testservice", true},
		{module + "/internal/testpki", true},
		{module + "/internal/admissiontest", true},
		{module + "/tier1/picker", false},
		{module + "/tier2/server", false},
		{module + "/shared/config", false},
		{module + "/cmd/internal/cli", false},
		{module + "/simulate", false}, // a whole element, not a prefix
		{"github.com/other/sim", false},
		{"testing", false}, // the standard library is not this module's to judge
	}
	for _, tt := range tests {
		if got := labOnly(tt.pkg); got != tt.want {
			t.Errorf("labOnly(%q) = %v, want %v", tt.pkg, got, tt.want)
		}
	}
}

// TestNoLabDependencies keeps the simulator, the benchmarks, the local
// stack and test helpers out of the production binary: they belong to
// infergate-lab. It asks the go command for the binary's dependencies, as
// `go list -deps ./cmd/infergate` prints them.
func TestNoLabDependencies(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not on PATH")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 || deps[len(deps)-1] != module+"/cmd/infergate" {
		t.Fatalf("go list -deps printed no dependencies of %s/cmd/infergate:\n%s", module, out)
	}
	for _, p := range deps {
		if labOnly(p) {
			t.Errorf("the production binary depends on %s, a lab or test package (see `go list -deps ./cmd/infergate`)", p)
		}
	}
}
