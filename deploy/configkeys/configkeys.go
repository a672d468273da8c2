// Package configkeys lists the YAML keys a configuration type accepts, read
// by reflection from the real type, so deployment templates (Helm values,
// Terraform locals) can be checked against what infergate decodes strictly.
package configkeys

import (
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

// Node is the key tree of one struct type. A nil *Node stands for a value
// whose keys are not checked: scalars, maps with free-form keys and types
// that decode themselves (yaml.Unmarshaler).
type Node struct {
	fields map[string]*Node
}

// Of returns the key tree of t (a struct, or a pointer, slice or array of
// one); nil when t has no fixed keys.
func Of(t reflect.Type) *Node {
	return of(t, map[reflect.Type]*Node{})
}

var unmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

func of(t reflect.Type, seen map[reflect.Type]*Node) *Node {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.Implements(unmarshaler) || reflect.PointerTo(t).Implements(unmarshaler) {
		return nil
	}
	if n, ok := seen[t]; ok {
		return n
	}
	n := &Node{fields: map[string]*Node{}}
	seen[t] = n
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() && !f.Anonymous { // yaml.v3 reads embedded structs even when unexported
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			if sub := of(f.Type, seen); sub != nil {
				for k, v := range sub.fields {
					n.fields[k] = v
				}
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name) // yaml.v3's default key
		}
		n.fields[name] = of(f.Type, seen)
	}
	return n
}

// Field returns the key tree under key and whether n accepts key at all.
// A nil n accepts every key.
func (n *Node) Field(key string) (*Node, bool) {
	if n == nil {
		return nil, true
	}
	sub, ok := n.fields[key]
	return sub, ok
}

// Checked reports whether n's keys are checked (n is a struct).
func (n *Node) Checked() bool { return n != nil }
