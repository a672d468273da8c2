package picker

import (
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The defaults the manuals state are DefaultProfile()'s and the scorers'
// own: README.md's default weights, and in docs/tier1-scheduling.md the
// profile YAML block, the built-in profiles table and the scorers table's
// parameter defaults. Changing a default without the docs (or the docs
// without the code) fails here.

func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// weightList parses "queue 2, kv-cache 2, prefix 3" into name → weight.
func weightList(t *testing.T, where, s string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, item := range strings.Split(s, ",") {
		name, w, ok := strings.Cut(strings.TrimSpace(item), " ")
		v, err := strconv.ParseFloat(w, 64)
		if !ok || err != nil {
			t.Fatalf("%s: %q is not `scorer weight`", where, item)
		}
		out[name] = v
	}
	return out
}

// defaultWeights is DefaultProfile()'s enabled scorers and weights.
func defaultWeights() map[string]float64 {
	out := map[string]float64{}
	for _, s := range DefaultProfile().Scorers {
		if s.On() {
			out[s.Name] = s.Weight
		}
	}
	return out
}

func TestReadmeDefaultWeights(t *testing.T) {
	text := strings.Join(strings.Fields(readDoc(t, "../../README.md")), " ")
	m := regexp.MustCompile(`default weights ((?:[a-z-]+ [0-9.]+, )*[a-z-]+ [0-9.]+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal(`README.md: no "default weights <scorer> <weight>, ..." sentence`)
	}
	if got, want := weightList(t, "README.md", m[1]), defaultWeights(); !maps.Equal(got, want) {
		t.Errorf("README.md states default weights %v; DefaultProfile() has %v", got, want)
	}
}

const schedulingDoc = "../../docs/tier1-scheduling.md"

// The profile YAML block lists every key of the default profile at its
// default, every scorer of it with all its parameters at theirs.
func TestSchedulingDocProfileBlock(t *testing.T) {
	doc := readDoc(t, schedulingDoc)
	_, rest, ok := strings.Cut(doc, "## Profile YAML")
	if !ok {
		t.Fatal("no ## Profile YAML section")
	}
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("no yaml block under ## Profile YAML")
	}
	var o profileOverlay
	dec := yaml.NewDecoder(strings.NewReader(block))
	dec.KnownFields(true)
	if err := dec.Decode(&o); err != nil {
		t.Fatalf("profile block: %v", err)
	}
	want := DefaultProfile()
	want.SetDefaults()
	if o.Base != BaseDefault || o.Filters == nil || !slices.Equal(*o.Filters, want.Filters) || o.Picker != want.Picker {
		t.Errorf("base %q, filters %v, picker %q; want %q, %v, %q", o.Base, o.Filters, o.Picker, BaseDefault, want.Filters, want.Picker)
	}
	if o.StaleAfter == nil || *o.StaleAfter != want.StaleAfter || o.MaxRanked == nil || *o.MaxRanked != want.MaxRanked {
		t.Errorf("stale_after %v, max_ranked %v; want %v, %d", o.StaleAfter, o.MaxRanked, want.StaleAfter, want.MaxRanked)
	}
	if o.SpeedPooling == nil || *o.SpeedPooling != want.SpeedPooling {
		t.Errorf("speed_pooling %v, want %v", o.SpeedPooling, want.SpeedPooling)
	}
	if sat := o.Saturation; sat == nil || sat.PrefillWait == nil || sat.SheddableWait == nil ||
		(SaturationConfig{sat.QueueThreshold, sat.KVThreshold, *sat.PrefillWait, *sat.SheddableWait}) != want.Saturation {
		t.Errorf("saturation %+v, want every key of %+v", sat, want.Saturation)
	}
	listed := map[string]bool{}
	for _, s := range o.Scorers {
		listed[s.Name] = true
		if s.Weight == nil || *s.Weight != want.Weight(s.Name) || s.Enabled != nil {
			t.Errorf("scorer %s: weight %v, want %v", s.Name, s.Weight, want.Weight(s.Name))
		}
		spec := scorerSpecs[s.Name]
		i := slices.IndexFunc(want.Scorers, func(c ScorerConfig) bool { return c.Name == s.Name })
		var own map[string]float64
		if i >= 0 {
			own = want.Scorers[i].Params
		}
		if params := spec.withDefaults(own); !maps.Equal(s.Params, params) && (len(s.Params) > 0 || len(params) > 0) {
			t.Errorf("scorer %s: parameters %v, want every one at its default %v", s.Name, s.Params, params)
		}
	}
	for name := range defaultWeights() {
		if !listed[name] {
			t.Errorf("scorer %s of the default profile is not in the block", name)
		}
	}
}

// tableRows returns the cells of the Markdown table rows under heading
// whose first cell starts with prefix.
func tableRows(t *testing.T, doc, heading string) [][]string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, heading+"\n")
	if !ok {
		t.Fatalf("no %q", heading)
	}
	var rows [][]string
	started := false
	for _, line := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(line, "|") {
			if started {
				break
			}
			continue
		}
		started = true
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	return rows[2:] // header and rule
}

var tick = regexp.MustCompile("`([^`]*)`")

func TestSchedulingDocBuiltinProfiles(t *testing.T) {
	rows := tableRows(t, readDoc(t, schedulingDoc), "### Built-in profiles")
	check := func(prefix string, p ProfileConfig, extra string) {
		t.Helper()
		i := slices.IndexFunc(rows, func(r []string) bool { return strings.HasPrefix(r[0], prefix) })
		if i < 0 {
			t.Errorf("built-in profiles: no row for %s", prefix)
			return
		}
		r := rows[i]
		p.SetDefaults()
		if got := strings.Split(r[1], ", "); !slices.Equal(got, p.Filters) {
			t.Errorf("%s: filters %v, want %v", prefix, got, p.Filters)
		}
		scorers, note, _ := strings.Cut(r[2], " (")
		want := map[string]float64{}
		for _, s := range p.Scorers {
			if s.On() {
				want[s.Name] = s.Weight
			}
		}
		if len(want) == 0 {
			if scorers != "—" {
				t.Errorf("%s: scorers %q, want —", prefix, scorers)
			}
		} else if got := weightList(t, prefix, scorers); !maps.Equal(got, want) {
			t.Errorf("%s: scorers %v, want %v", prefix, got, want)
		}
		if !strings.Contains(note, extra) {
			t.Errorf("%s: %q does not say %q", prefix, note, extra)
		}
		if r[3] != p.Picker || !strings.HasPrefix(r[4], p.StaleAfter.String()) {
			t.Errorf("%s: picker %q, stale_after %q; want %s, %v", prefix, r[3], r[4], p.Picker, p.StaleAfter)
		}
	}
	d := DefaultProfile()
	check("`DefaultProfile()`", d, fmt.Sprintf("holds at `prefill_wait` %s; `speed_pooling` %v", d.Saturation.PrefillWait, d.SpeedPooling))
	check("`GIEDefaultProfile()`", GIEDefaultProfile(), "guard off, short-prompt scaling off")
	check("`RoundRobinProfile()`", RoundRobinProfile(), "")
	if len(rows) != 3 {
		t.Errorf("built-in profiles: %d rows, want the 3 built-in profiles", len(rows))
	}
}

// The scorers table lists every registered scorer once, with each of its
// parameters at its default.
func TestSchedulingDocScorerParams(t *testing.T) {
	rows := tableRows(t, readDoc(t, schedulingDoc), "## Scorers\n\nEvery score is clamped to [0,1] (NaN → 0) by the scheduler; `Total` is\nΣ weight × score.\n")
	pair := regexp.MustCompile("`([a-z_]+)` (-?[0-9.]+)")
	seen := map[string]bool{}
	for _, r := range rows {
		m := tick.FindStringSubmatch(r[0])
		if m == nil {
			t.Fatalf("scorers table: row %q names no scorer", r[0])
		}
		name := m[1]
		spec, ok := scorerSpecs[name]
		if !ok || seen[name] {
			t.Errorf("scorers table: %q is not a scorer, or listed twice", name)
			continue
		}
		seen[name] = true
		got := map[string]float64{}
		for _, pm := range pair.FindAllStringSubmatch(r[len(r)-1], -1) {
			v, _ := strconv.ParseFloat(pm[2], 64)
			got[pm[1]] = v
		}
		if want := spec.withDefaults(nil); !maps.Equal(got, want) {
			t.Errorf("scorers table: %s's parameters %v, want %v", name, got, want)
		}
	}
	for name := range scorerSpecs {
		if !seen[name] {
			t.Errorf("scorers table: no row for scorer %s", name)
		}
	}
}
