package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"
)

// The schema of a configuration type is read from the type itself: the
// keys are the yaml tags of its structs' fields (yaml.v3's rules:
// `,inline` structs add their keys, an `,inline` map takes every other
// key), the kinds of values are the fields' types. It drives the checks
// of Decode, the configuration reference (Keys) and the Helm charts' JSON
// schema (JSONSchema), so the three cannot disagree.
//
// A field may carry a `config` tag with comma-separated options:
//
//	min=N   an explicit value below N is refused, although the zero
//	        value left out of the file takes a default (max_attempts: 0)
//	file    the value names a file (keys ending in _file always do)

type kind int

const (
	kindScalar kind = iota
	kindStruct
	kindList
	kindMap
	kindAny          // decodes itself; not checked here
	kindStringOrList // a string or a list of strings (decodes itself)
)

type schema struct {
	kind   kind
	typ    reflect.Type // the value's type, pointers removed
	fields []*field     // kindStruct, in declaration order
	byKey  map[string]*field
	extra  *schema // kindStruct with an inline map: the other keys' values
	elem   *schema // kindList, kindMap
}

type field struct {
	key   string
	sf    reflect.StructField
	owner reflect.Type // the struct that declares the field
	index []int        // from the schema's struct, through inline structs
	s     *schema
	min   *float64
	file  bool
}

var (
	durationType    = reflect.TypeFor[time.Duration]()
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	nodeType        = reflect.TypeFor[yaml.Node]()
)

// schemas caches the schema of each type: types do not change while the
// program runs, and a reload decodes the same type again.
var schemas sync.Map // reflect.Type -> *schema

func schemaFor(t reflect.Type) *schema {
	if s, ok := schemas.Load(t); ok {
		return s.(*schema)
	}
	s := build(t, map[reflect.Type]*schema{})
	schemas.Store(t, s)
	return s
}

func build(t reflect.Type, memo map[reflect.Type]*schema) *schema {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if s, ok := memo[t]; ok {
		return s
	}
	s := &schema{typ: t}
	memo[t] = s
	custom := t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType)
	switch {
	case t == durationType:
		s.kind = kindScalar
	case t == nodeType || t.Kind() == reflect.Interface:
		s.kind = kindAny
	case custom && t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		s.kind = kindStringOrList
	case custom && t.Kind() != reflect.Struct:
		s.kind = kindAny
	case t.Kind() == reflect.Struct:
		// A struct that decodes itself is checked by its fields' keys
		// too: its YAML shape is its fields' (picker.ProfileConfig).
		s.kind = kindStruct
		s.byKey = map[string]*field{}
		addFields(s, t, nil, memo)
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		s.kind = kindList
		s.elem = build(t.Elem(), memo)
	case t.Kind() == reflect.Map:
		s.kind = kindMap
		s.elem = build(t.Elem(), memo)
	default:
		s.kind = kindScalar
	}
	return s
}

func addFields(s *schema, t reflect.Type, index []int, memo map[reflect.Type]*schema) {
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() && !sf.Anonymous { // yaml.v3 reads embedded structs even when unexported
			continue
		}
		name, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		idx := append(append([]int(nil), index...), i)
		if strings.Contains(opts, "inline") {
			ft := sf.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Map {
				s.extra = build(ft.Elem(), memo)
			} else {
				addFields(s, ft, idx, memo)
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(sf.Name) // yaml.v3's default key
		}
		f := &field{key: name, sf: sf, owner: t, index: idx, s: build(sf.Type, memo)}
		for _, o := range strings.Split(sf.Tag.Get("config"), ",") {
			switch k, v, _ := strings.Cut(strings.TrimSpace(o), "="); k {
			case "min":
				if n, err := strconv.ParseFloat(v, 64); err == nil {
					f.min = &n
				}
			case "file":
				f.file = true
			}
		}
		if strings.HasSuffix(name, "_file") {
			f.file = true
		}
		s.fields = append(s.fields, f)
		s.byKey[name] = f
	}
}

// keyNames lists a struct schema's keys in declaration order.
func (s *schema) keyNames() []string {
	out := make([]string, len(s.fields))
	for i, f := range s.fields {
		out[i] = f.key
	}
	return out
}

// words names the kind of value s accepts, as a reader of the file
// would: "duration", "list of strings".
func (s *schema) words() string {
	switch s.kind {
	case kindStruct:
		return "mapping"
	case kindList:
		return "list of " + s.elem.plural()
	case kindMap:
		return "map of names to " + s.elem.plural()
	case kindAny:
		return "any value"
	case kindStringOrList:
		return "string or list of strings"
	}
	if s.typ == durationType {
		return "duration"
	}
	switch s.typ.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer ≥ 0"
	case reflect.Float32, reflect.Float64:
		return "number"
	}
	return "value"
}

func (s *schema) plural() string {
	switch w := s.words(); w {
	case "mapping":
		return "mappings"
	case "string", "boolean", "integer", "number", "duration":
		return w + "s"
	case "integer ≥ 0":
		return "integers ≥ 0"
	default:
		return w
	}
}

// want says what s accepts in an error message: "want <want>, got ...".
func (s *schema) want() string {
	switch s.kind {
	case kindStruct:
		return "a mapping of keys (" + strings.Join(s.keyNames(), ", ") + ")"
	case kindList:
		return "a list of " + s.elem.plural()
	case kindMap:
		return "a mapping of names to " + s.elem.plural()
	case kindStringOrList:
		return "a string or a list of strings"
	}
	if s.typ == durationType {
		return "a duration such as 500ms, 10s or 1m30s"
	}
	switch w := s.words(); w {
	case "string", "number", "mapping":
		return "a " + w
	case "boolean":
		return "true or false"
	case "integer":
		return "a whole number"
	case "integer ≥ 0":
		return "a whole number ≥ 0"
	default:
		return w
	}
}

// has reports whether path names a key of the schema (indices and
// selectors are not checked against a file).
func (s *schema) has(path string) bool {
	segs, err := parsePath(path)
	if err != nil {
		return false
	}
	cur := s
	for _, sg := range segs {
		switch {
		case cur.kind == kindAny:
			return true
		case sg.isIndex():
			if cur.kind != kindList && cur.kind != kindStringOrList {
				return false
			}
			if cur.kind == kindStringOrList {
				return true
			}
			cur = cur.elem
		case cur.kind == kindMap:
			cur = cur.elem
		case cur.kind == kindStruct:
			f := cur.byKey[sg.key]
			switch {
			case f != nil:
				cur = f.s
			case cur.extra != nil:
				cur = cur.extra
			default:
				return false
			}
		default:
			return false
		}
	}
	return true
}

// everyKey lists every key path of the schema: pools[].model,
// tenants[].model_limits.<name>.rpm.
func (s *schema) everyKey() []string {
	var out []string
	seen := map[*schema]bool{}
	var walk func(s *schema, path string)
	walk = func(s *schema, path string) {
		if seen[s] { // recursive types: list each key once
			return
		}
		switch s.kind {
		case kindStruct:
			seen[s] = true
			for _, f := range s.fields {
				p := joinPath(path, f.key)
				out = append(out, p)
				walk(f.s, p)
			}
			delete(seen, s)
		case kindList:
			walk(s.elem, path+"[]")
		case kindMap:
			walk(s.elem, joinPath(path, "<name>"))
		}
	}
	walk(s, "")
	return out
}

func (s *schema) String() string { return fmt.Sprintf("schema(%s)", s.words()) }
