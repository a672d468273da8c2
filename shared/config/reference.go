package config

import (
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// KeyInfo describes one key of a configuration type, for the
// configuration reference.
type KeyInfo struct {
	Path    string // pools[].model; the keys of a map are written <name>
	Type    string // what it takes, in words: "duration", "list of strings"
	Default string // what an empty file gets (after SetDefaults), when a scalar; "" if none
	Min     string // the least value accepted when set explicitly (config:"min=N")
	File    bool   // names a file
	Leaf    bool   // has no keys below it
	// Field is the Go struct field and Owner the struct type declaring it,
	// whose doc comment describes the key.
	Field reflect.StructField
	Owner reflect.Type
}

// Keys lists every key of the configuration type of v (a pointer to a
// struct) in declaration order, each with its defaults as SetDefaults
// fills an empty file.
func Keys(v any) []KeyInfo {
	t := reflect.TypeOf(v)
	s := schemaFor(t)
	zero := reflect.New(t.Elem())
	if d, ok := zero.Interface().(Defaulter); ok {
		d.SetDefaults()
	}
	var out []KeyInfo
	var walk func(s *schema, val reflect.Value, path string, depth int)
	walk = func(s *schema, val reflect.Value, path string, depth int) {
		if depth > 12 { // recursive types
			return
		}
		for val.IsValid() && val.Kind() == reflect.Pointer {
			if val.IsNil() {
				val = reflect.Value{}
				break
			}
			val = val.Elem()
		}
		switch s.kind {
		case kindStruct:
			for _, f := range s.fields {
				p := joinPath(path, f.key)
				var fv reflect.Value
				if val.IsValid() {
					fv, _ = val.FieldByIndexErr(f.index)
				}
				k := KeyInfo{Path: p, Type: f.s.words(), File: f.file, Field: f.sf, Owner: f.owner,
					Leaf: f.s.kind == kindScalar || f.s.kind == kindAny || f.s.kind == kindStringOrList ||
						(f.s.kind == kindList && f.s.elem.kind != kindStruct) || (f.s.kind == kindMap && f.s.elem.kind != kindStruct)}
				if f.min != nil {
					k.Min = strconv.FormatFloat(*f.min, 'f', -1, 64)
				}
				if fv.IsValid() {
					k.Default = formatDefault(fv)
				}
				out = append(out, k)
				walk(f.s, fv, p, depth+1)
			}
			if s.extra != nil {
				out = append(out, KeyInfo{Path: joinPath(path, "<name>"), Type: s.extra.words(), Leaf: s.extra.kind != kindStruct})
				walk(s.extra, reflect.Value{}, joinPath(path, "<name>"), depth+1)
			}
		case kindList:
			walk(s.elem, reflect.Value{}, path+"[]", depth+1)
		case kindMap:
			walk(s.elem, reflect.Value{}, joinPath(path, "<name>"), depth+1)
		}
	}
	walk(s, zero, "", 0)
	return out
}

// formatDefault writes a scalar default as it would be written in the
// file; "" for the zero value (but false for a boolean) and for values
// that are not scalars or lists of them.
func formatDefault(v reflect.Value) string {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	if v.Type() == durationType {
		if v.Int() == 0 {
			return ""
		}
		return FormatDuration(time.Duration(v.Int()))
	}
	switch v.Kind() {
	case reflect.Bool:
		return strconv.FormatBool(v.Bool())
	case reflect.String:
		return v.String()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Int() != 0 {
			return strconv.FormatInt(v.Int(), 10)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if v.Uint() != 0 {
			return strconv.FormatUint(v.Uint(), 10)
		}
	case reflect.Float32, reflect.Float64:
		if v.Float() != 0 {
			return strconv.FormatFloat(v.Float(), 'g', -1, 64)
		}
	case reflect.Slice:
		if v.Len() == 0 || v.Type().Elem().Kind() != reflect.String {
			return ""
		}
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = v.Index(i).String()
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return ""
}

// FormatDuration writes d as a person would in the file: 2m rather than
// time.Duration's 2m0s.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// JSONSchema returns a JSON schema (draft-07 subset) of the configuration
// type of v (a pointer to a struct): the same keys Decode accepts
// (additionalProperties false), the kinds of values, min= bounds. Every
// value may be null, as in the file. Helm checks a chart's values against
// it at install, template and lint.
func JSONSchema(v any) map[string]any {
	return jsonSchema(schemaFor(reflect.TypeOf(v)), nil)
}

func jsonSchema(s *schema, min *float64) map[string]any {
	out := map[string]any{}
	switch s.kind {
	case kindAny:
		return out
	case kindStruct:
		out["type"] = []any{"object", "null"}
		props := map[string]any{}
		for _, f := range s.fields {
			props[f.key] = jsonSchema(f.s, f.min)
		}
		out["properties"] = props
		if s.extra != nil {
			out["additionalProperties"] = jsonSchema(s.extra, nil)
		} else {
			out["additionalProperties"] = false
		}
	case kindList:
		out["type"] = []any{"array", "null"}
		out["items"] = jsonSchema(s.elem, nil)
	case kindMap:
		out["type"] = []any{"object", "null"}
		out["additionalProperties"] = jsonSchema(s.elem, nil)
	case kindStringOrList:
		out["type"] = []any{"string", "array", "null"}
		out["items"] = map[string]any{"type": "string"}
	case kindScalar:
		if s.typ == durationType {
			out["type"] = []any{"string", "null"}
			out["pattern"] = `^-?([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+$|^0$`
			break
		}
		switch s.typ.Kind() {
		case reflect.String:
			// yaml.v3 reads any scalar into a string (port: 8080).
			out["type"] = []any{"string", "number", "boolean", "null"}
		case reflect.Bool:
			out["type"] = []any{"boolean", "null"}
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			out["type"] = []any{"integer", "null"}
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			out["type"] = []any{"integer", "null"}
			out["minimum"] = 0
		case reflect.Float32, reflect.Float64:
			out["type"] = []any{"number", "null"}
		}
		if min != nil && s.typ != durationType {
			out["minimum"] = *min
		}
	}
	return out
}

// Walk calls fn for every key of the decoded configuration v (a pointer
// to a struct), with its path in the file (pods[2].address) and its value,
// parents before children. check uses it to find the files a
// configuration names.
func Walk(v any, fn func(path string, val reflect.Value, f reflect.StructField)) {
	rv := reflect.ValueOf(v)
	walkValue(schemaFor(rv.Type()), rv, "", fn)
}

func walkValue(s *schema, v reflect.Value, path string, fn func(string, reflect.Value, reflect.StructField)) {
	for v.IsValid() && (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	if !v.IsValid() {
		return
	}
	switch s.kind {
	case kindStruct:
		for _, f := range s.fields {
			fv, err := v.FieldByIndexErr(f.index)
			if err != nil {
				continue
			}
			p := joinPath(path, f.key)
			fn(p, fv, f.sf)
			walkValue(f.s, fv, p, fn)
		}
	case kindList:
		for i := range v.Len() {
			walkValue(s.elem, v.Index(i), Index(path, i), fn)
		}
	case kindMap:
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
		for _, k := range keys {
			p := Key(path, k.String())
			fn(p, v.MapIndex(k), reflect.StructField{})
			walkValue(s.elem, v.MapIndex(k), p, fn)
		}
	}
}
