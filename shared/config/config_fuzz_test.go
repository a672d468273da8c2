package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/sim/fleet"
	"github.com/infergate/infergate/tier1/picker"
	tier1 "github.com/infergate/infergate/tier1/server"
	tier2 "github.com/infergate/infergate/tier2/server"
)

// FuzzDecode decodes arbitrary YAML into every configuration type the
// binaries load (Tier 1, Tier 2, the simulator fleet, a picker profile).
// Config files are operator input, but a typo must be an error naming the
// file, never a panic in a SetDefaults or Validate, and an accepted config
// must stay valid.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"tier1.yaml", "tier2.yaml", "fleet.yaml"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "examples", name))
		if err != nil {
			f.Fatal(err)
		}
		for kind := range uint8(4) {
			f.Add(kind, data)
		}
	}
	for _, s := range []string{
		"", "---\n", "~", "[]", "a: &a [*a]", "listen: [1, 2]\n", "scrape:\n  interval: -1s\n",
		"a: &a {b: &b [*a, *a]}\nc: *b\n", "profile: {weights: {queue: .nan, kv-cache: -.inf}}\n",
		"clusters:\n- {name: x, region: r, address: 'http://[::1%25eth0]:1', cost: .nan}\n",
		"pools:\n- {model: m, replicas: 99999999999}\n", "!!binary AAAA", "? [a]\n: b\n",
	} {
		for kind := range uint8(4) {
			f.Add(kind, []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		var v interface{ Validate() error }
		switch kind % 4 {
		case 0:
			v = &tier1.Config{}
		case 1:
			v = &tier2.Config{}
		case 2:
			v = &fleet.Config{}
		case 3:
			v = &picker.ProfileConfig{}
		}
		err := config.Decode("fuzz.yaml", data, v)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if err := v.Validate(); err != nil {
			t.Fatalf("accepted config fails its own validation: %v", err)
		}
	})
}
