package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

type scorer struct {
	Name   string             `yaml:"name"`
	Weight float64            `yaml:"weight"`
	Params map[string]float64 `yaml:",inline"`
}

type pod struct {
	Name    string `yaml:"name"`
	Address string `yaml:"address"`
}

type listOrString []string

func (l *listOrString) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*l = listOrString{n.Value}
		return nil
	}
	var s []string
	err := n.Decode(&s)
	*l = s
	return err
}

type sample struct {
	Name  string `yaml:"name"`
	Port  int    `yaml:"port"`
	Inner struct {
		Weight float64 `yaml:"weight"`
	} `yaml:"inner"`
	Retry struct {
		MaxAttempts int           `yaml:"max_attempts" config:"min=1"`
		Budget      time.Duration `yaml:"budget"`
	} `yaml:"retry"`
	Capacity uint32            `yaml:"capacity"`
	Pods     []pod             `yaml:"pods"`
	Scorers  []scorer          `yaml:"scorers"`
	Labels   map[string]string `yaml:"labels"`
	Audience listOrString      `yaml:"audience"`
	CAFile   string            `yaml:"ca_file"`
}

func (s *sample) SetDefaults() {
	if s.Port == 0 {
		s.Port = 8080
	}
	if s.Retry.MaxAttempts == 0 {
		s.Retry.MaxAttempts = 3
	}
}

func (s *sample) Validate() error {
	var errs []error
	if s.Port < 0 || s.Port > 65535 {
		errs = append(errs, Errorf("port", "want a port number in [0, 65535], got %d", s.Port))
	}
	seen := map[string]int{}
	for i, p := range s.Pods {
		if j, ok := seen[p.Address]; ok {
			errs = append(errs, Errorf(Index("pods", i)+".address", "%q is also pods[%d]'s address", p.Address, j))
		}
		seen[p.Address] = i
		if p.Name == "" {
			errs = append(errs, Errorf(Index("pods", i)+".name", "required"))
		}
	}
	for _, sc := range s.Scorers {
		if sc.Weight < 0 {
			errs = append(errs, Errorf("scorers[name="+sc.Name+"].weight", "want a number ≥ 0, got %v", sc.Weight))
		}
	}
	if s.Name == "plain" {
		// An error from a package that knows no FieldError.
		errs = append(errs, fmt.Errorf("inner.weight %v: want more", s.Inner.Weight))
		errs = append(errs, errors.New("something about the whole file"))
	}
	return errors.Join(errs...)
}

// located matches "file:line:col: " at the start of every message.
var located = regexp.MustCompile(`^t\.yaml:\d+:\d+: `)

// goType matches what a message must never show: Go type names.
var goType = regexp.MustCompile(`uint32|int64|float64|time\.Duration|config\.|\bstruct\b|!!str|\[\]string|map\[`)

func TestDecode(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string // each must appear, one per problem, in this order
	}{
		{name: "defaults", in: "name: a\n"},
		{name: "empty", in: ""},
		{name: "null document", in: "~\n"},
		{name: "unknown key: did you mean", in: "name: a\ninner:\n  wieght: 2\n",
			want: []string{`t.yaml:3:3: inner.wieght: unknown key "wieght"; did you mean "weight"?`}},
		{name: "unknown key: another spelling", in: "retry:\n  maxAttempts: 2\n",
			want: []string{`t.yaml:2:3: retry.maxAttempts: unknown key "maxAttempts"; did you mean "max_attempts"?`}},
		{name: "unknown key: right key, wrong place", in: "max_attempts: 2\n",
			want: []string{`t.yaml:1:1: max_attempts: unknown key "max_attempts" here; did you mean retry.max_attempts?`}},
		{name: "unknown key: nothing close lists the keys", in: "inner:\n  zzz: 1\n",
			want: []string{`t.yaml:2:3: inner.zzz: unknown key "zzz" (known keys here: weight)`}},
		{name: "unsigned", in: "capacity: abc\n",
			want: []string{`t.yaml:1:11: capacity: want a whole number ≥ 0, got "abc"`}},
		{name: "negative unsigned", in: "capacity: -1\n",
			want: []string{`capacity: want a whole number ≥ 0, got "-1"`}},
		{name: "bad type", in: "port: abc\n", want: []string{`t.yaml:1:7: port: want a whole number, got "abc"`}},
		{name: "duration", in: "retry: {budget: soon}\n",
			want: []string{`retry.budget: want a duration such as 500ms, 10s or 1m30s, got "soon"`}},
		{name: "duration without a unit", in: "retry: {budget: 5}\n",
			want: []string{`retry.budget: want a duration with a unit such as 5s, got 5`}},
		{name: "zero duration", in: "retry: {budget: 0s}\n"},
		{name: "explicit zero below min", in: "retry:\n  max_attempts: 0\n",
			want: []string{`t.yaml:2:17: retry.max_attempts: want a whole number ≥ 1, got 0`}},
		{name: "mapping for a scalar", in: "name: {a: 1}\n", want: []string{`name: want a string, got a mapping`}},
		{name: "scalar for a list", in: "pods: p0\n", want: []string{`pods: want a list of mappings, got "p0"`}},
		{name: "scalar for a struct", in: "inner: 3\n", want: []string{`inner: want a mapping of keys (weight), got "3"`}},
		{name: "set twice", in: "name: a\nname: b\n", want: []string{`t.yaml:2:1: name: set twice (first at line 1)`}},
		{name: "inline map takes other keys", in: "scorers: [{name: prefix, weight: 1, guard: 0.5}]\n"},
		{name: "inline map values are typed", in: "scorers: [{name: prefix, guard: lots}]\n",
			want: []string{`scorers[0].guard: want a number, got "lots"`}},
		{name: "string or list", in: "audience: [a, b]\n"},
		{name: "string or list: nested list", in: "audience: [[a]]\n", want: []string{`audience[0]: want a string, got a list`}},
		{name: "map keys quoted", in: "labels: {a.b/c: 1}\n"},
		{name: "validation", in: "port: 70000\n", want: []string{`t.yaml:1:1: port: want a port number in [0, 65535], got 70000`}},
		{name: "validation at a list element's key", in: "pods:\n  - {name: a, address: x:1}\n  - {name: b, address: x:1}\n",
			want: []string{`t.yaml:3:15: pods[1].address: "x:1" is also pods[0]'s address`}},
		{name: "missing key is reported at its parent", in: "pods:\n  - address: x:1\n",
			want: []string{`t.yaml:2:5: pods[0].name: required`}},
		{name: "selector resolved to the file's index", in: "scorers:\n  - {name: a, weight: 1}\n  - {name: b, weight: -1}\n",
			want: []string{`t.yaml:3:15: scorers[1].weight: want a number ≥ 0, got -1`}},
		{name: "plain errors: leading key path found, else the file", in: "name: plain\ninner: {weight: 1}\n",
			want: []string{`t.yaml:1:1: something about the whole file`, `t.yaml:2:9: inner.weight 1: want more`}},
		{name: "every problem at once, in file order", in: "port: x\nname: a\ncapacity: -1\npods: [{address: a:1}]\nbogus: 1\n",
			want: []string{`t.yaml:1:7: port:`, `t.yaml:3:11: capacity:`, `t.yaml:4:8: pods[0].name: required`, `t.yaml:5:1: bogus: unknown key`}},
		{name: "type problem hides the validation problem it causes", in: "pods: [{name: a, address: [x]}]\n",
			want: []string{`pods[0].address: want a string, got a list`}},
		{name: "syntax", in: "name: a\n  port: 1\n", want: []string{`t.yaml:2: not valid YAML: mapping values are not allowed in this context`}},
		{name: "alias loop does not hang", in: "name: &a [*a]\n", want: []string{"t.yaml:1:7: name: want a string, got a list"}},
		{name: "merge keys", in: "base: &b {weight: 1}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got sample
			err := Decode("t.yaml", []byte(tt.in), &got)
			if len(tt.want) == 0 {
				if err != nil && tt.name != "merge keys" {
					t.Fatal(err)
				}
				return
			}
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("err = %v (%T), want Errors", err, err)
			}
			if len(errs) != len(tt.want) {
				t.Fatalf("%d problems, want %d:\n%v", len(errs), len(tt.want), err)
			}
			for i, e := range errs {
				if !strings.Contains(e.Error(), tt.want[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, e.Error(), tt.want[i])
				}
				if tt.name != "syntax" && !located.MatchString(e.Error()) {
					t.Errorf("problem %q has no file:line:column", e.Error())
				}
				if goType.MatchString(e.Error()) {
					t.Errorf("problem %q names a Go type", e.Error())
				}
			}
		})
	}
}

func TestDecodeDefaultsAndValues(t *testing.T) {
	var s sample
	if err := Decode("t.yaml", []byte("name: a\nlabels: {a.b: c}\naudience: x\nretry: {max_attempts: 1}\n"), &s); err != nil {
		t.Fatal(err)
	}
	if s.Port != 8080 || s.Retry.MaxAttempts != 1 || s.Labels["a.b"] != "c" || len(s.Audience) != 1 {
		t.Errorf("decoded %+v", s)
	}
}

func TestFileHasAndLocate(t *testing.T) {
	f, err := Parse("t.yaml", []byte("pods:\n  - name: a\n    address: x:1\nlabels: {\"a.b\": c}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		"pods": true, "pods[0].address": true, "pods[1]": false, "pods[0].port": false,
		`labels["a.b"]`: true, "pods[name=a].name": true, "pods[name=b]": false, "nope": false,
	} {
		if got := f.Has(path); got != want {
			t.Errorf("Has(%s) = %v, want %v", path, got, want)
		}
	}
	err = f.Locate(&sample{}, errors.Join(Errorf("pods[name=a].address", "bad"), At("labels", Errorf(Key("", "a.b"), "worse"))))
	want := "t.yaml:3:5: pods[0].address: bad\nt.yaml:4:10: labels[\"a.b\"]: worse"
	if err == nil || err.Error() != want {
		t.Errorf("Locate = %q, want %q", err, want)
	}
	if got := f.TopKeys(); strings.Join(got, ",") != "pods,labels" {
		t.Errorf("TopKeys = %v", got)
	}
}

func TestAt(t *testing.T) {
	f, err := Parse("t.yaml", []byte("pods:\n  - {name: a, address: b}\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = f.Locate(&sample{}, At("pods[0]", errors.Join(
		Errorf("address", "want host:port"),
		errors.New(`name "a": taken`),      // a key path at the front: located there
		errors.New("nonsense is required"), // not a key: at pods[0]
	)))
	want := `t.yaml:2:5: pods[0]: nonsense is required
t.yaml:2:6: pods[0].name "a": taken
t.yaml:2:15: pods[0].address: want host:port`
	if err == nil || err.Error() != want {
		t.Errorf("At, located:\n%v\nwant:\n%s", err, want)
	}
	if At("x", nil) != nil {
		t.Error("At(nil) is not nil")
	}
}

func TestClosest(t *testing.T) {
	known := []string{"weight", "max_attempts", "interval", "idle_interval", "tls", "name"}
	for in, want := range map[string]string{
		"wieght": "weight", "weigth": "weight", "MaxAttempts": "max_attempts", "max-attempts": "max_attempts",
		"intervall": "interval", "idle_intervl": "idle_interval", "tsl": "tls", "nmae": "name",
		"zzz": "", "completely_else": "", "a": "",
	} {
		if got := closest(in, known); got != want {
			t.Errorf("closest(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestKeys(t *testing.T) {
	keys := Keys(&sample{})
	byPath := map[string]KeyInfo{}
	for _, k := range keys {
		byPath[k.Path] = k
	}
	for path, want := range map[string]KeyInfo{
		"port":               {Type: "integer", Default: "8080", Leaf: true},
		"retry":              {Type: "mapping"},
		"retry.max_attempts": {Type: "integer", Default: "3", Min: "1", Leaf: true},
		"retry.budget":       {Type: "duration", Leaf: true},
		"capacity":           {Type: "integer ≥ 0", Leaf: true},
		"pods":               {Type: "list of mappings"},
		"pods[].address":     {Type: "string", Leaf: true},
		"scorers[].<name>":   {Type: "number", Leaf: true},
		"labels":             {Type: "map of names to strings", Leaf: true},
		"audience":           {Type: "string or list of strings", Leaf: true},
		"ca_file":            {Type: "string", File: true, Leaf: true},
	} {
		got, ok := byPath[path]
		if !ok {
			t.Errorf("no key %s", path)
			continue
		}
		if got.Type != want.Type || got.Default != want.Default || got.Min != want.Min || got.File != want.File || got.Leaf != want.Leaf {
			t.Errorf("%s = %+v, want %+v", path, got, want)
		}
	}
	if keys[0].Path != "name" || keys[0].Owner != reflect.TypeFor[sample]() {
		t.Errorf("first key %+v, want name declared by sample", keys[0])
	}
}

func TestJSONSchema(t *testing.T) {
	s := JSONSchema(&sample{})
	if s["additionalProperties"] != false {
		t.Error("top level takes unknown keys")
	}
	props := s["properties"].(map[string]any)
	retry := props["retry"].(map[string]any)["properties"].(map[string]any)
	if retry["max_attempts"].(map[string]any)["minimum"] != 1.0 {
		t.Errorf("max_attempts: %v", retry["max_attempts"])
	}
	scorers := props["scorers"].(map[string]any)["items"].(map[string]any)
	if _, ok := scorers["additionalProperties"].(map[string]any); !ok {
		t.Errorf("inline map: %v", scorers)
	}
}

func TestWalk(t *testing.T) {
	s := &sample{Pods: []pod{{Name: "a"}}, Labels: map[string]string{"x.y": "z"}}
	var paths []string
	Walk(s, func(path string, _ reflect.Value, _ reflect.StructField) { paths = append(paths, path) })
	got := strings.Join(paths, " ")
	for _, want := range []string{"pods[0].name", `labels["x.y"]`, "retry.max_attempts", "inner.weight"} {
		if !strings.Contains(got, want) {
			t.Errorf("Walk did not visit %s: %s", want, got)
		}
	}
}
