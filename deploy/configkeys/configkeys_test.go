package configkeys

import (
	"reflect"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

type selfDecoding struct{ X int }

func (s *selfDecoding) UnmarshalYAML(*yaml.Node) error { return nil }

type inner struct {
	Weight float64 `yaml:"weight"`
}

type base struct {
	Shared string `yaml:"shared"`
}

type sample struct {
	base     `yaml:",inline"`
	Name     string            `yaml:"name"`
	Wait     time.Duration     `yaml:"wait"`
	Inner    *inner            `yaml:"inner"`
	List     []inner           `yaml:"list"`
	Free     map[string]inner  `yaml:"free"`
	Self     selfDecoding      `yaml:"self"`
	Skipped  string            `yaml:"-"`
	Untagged int               // yaml.v3 decodes it as "untagged"
	Labels   map[string]string `yaml:"labels"`
	hidden   int               // unexported: never a key
}

func TestOf(t *testing.T) {
	n := Of(reflect.TypeFor[sample]())
	tests := []struct {
		path      []string
		known     bool
		checkedAt bool // whether the node at path checks its own keys
	}{
		{[]string{"name"}, true, false},
		{[]string{"shared"}, true, false},
		{[]string{"wait"}, true, false},
		{[]string{"inner"}, true, true},
		{[]string{"inner", "weight"}, true, false},
		{[]string{"inner", "wieght"}, false, false},
		{[]string{"list", "weight"}, true, false},
		{[]string{"free", "anything"}, true, false},
		{[]string{"self", "anything"}, true, false},
		{[]string{"untagged"}, true, false},
		{[]string{"skipped"}, false, false},
		{[]string{"Skipped"}, false, false},
		{[]string{"hidden"}, false, false},
		{[]string{"nope"}, false, false},
	}
	for _, tt := range tests {
		cur, known := n, true
		for _, k := range tt.path {
			cur, known = cur.Field(k)
			if !known {
				break
			}
		}
		if known != tt.known {
			t.Errorf("%v: known = %v, want %v", tt.path, known, tt.known)
		}
		if known && cur.Checked() != tt.checkedAt {
			t.Errorf("%v: checked = %v, want %v", tt.path, cur.Checked(), tt.checkedAt)
		}
	}
	_ = sample{hidden: 1} // keep the unexported field used
	if Of(reflect.TypeFor[[]*inner]()) == nil {
		t.Error("a slice of struct pointers has no key tree")
	}
	if Of(reflect.TypeFor[string]()).Checked() {
		t.Error("a string has keys")
	}
}
