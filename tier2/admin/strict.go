package admin

import (
	"bytes"
	"net/http"
	"reflect"
	"strings"
	"sync"

	"github.com/infergate/infergate/shared/jsonkeys"
)

// checkKeys walks a JSON body against the Go type it will be decoded into
// and refuses what encoding/json would accept silently:
//
//   - a key that is not exactly a field's JSON name: encoding/json matches
//     names case-insensitively, so {"Limits":...} or {"LIMITS":...} would
//     set limits;
//   - a key given twice (or twice in different cases): encoding/json lets
//     the last one win, so {"limits":{...},"limits":null} ends unlimited;
//   - null for a field that is not a pointer: encoding/json leaves the
//     field at its zero value, which for limits means unlimited. Only
//     pointer fields take null, and there null means unset (the cluster
//     override's weight and cost: use the discovered value).
//
// Unknown keys are refused too (with the nearest spelling when only the
// case differs). Maps (model_limits) are checked for duplicate keys and
// their values recursively. data has passed jsonkeys.Members' syntax
// checks by the time a nested value is reached.
func checkKeys(data []byte, t reflect.Type, path string) error {
	val := bytes.TrimSpace(data)
	isNull := string(val) == "null"
	if t.Kind() == reflect.Pointer {
		if isNull {
			return nil
		}
		t = t.Elem()
	}
	if isNull {
		return nullErr(path, t)
	}
	switch t.Kind() {
	case reflect.Struct:
		if len(val) == 0 || val[0] != '{' {
			return nil // a type error encoding/json reports with the field
		}
		fields := fieldsOf(t)
		seen := map[string]bool{}
		return jsonkeys.Members(val, func(name, value []byte) error {
			key := string(name)
			ft, ok := fields[key]
			if !ok {
				for f := range fields {
					if strings.EqualFold(f, key) {
						return errf(http.StatusBadRequest, "unknown_field", join(path, key),
							"unknown field %q: keys are case-sensitive; did you mean %q?", join(path, key), join(path, f))
					}
				}
				return errf(http.StatusBadRequest, "unknown_field", join(path, key), "unknown field %q", join(path, key))
			}
			if seen[key] {
				return errf(http.StatusBadRequest, jsonkeys.CodeDuplicateKey, join(path, key),
					"field %q appears more than once", join(path, key))
			}
			seen[key] = true
			return checkKeys(value, ft, join(path, key))
		})
	case reflect.Map:
		if len(val) == 0 || val[0] != '{' {
			return nil
		}
		seen := map[string]bool{}
		return jsonkeys.Members(val, func(name, value []byte) error {
			key := string(name)
			if seen[key] {
				return errf(http.StatusBadRequest, jsonkeys.CodeDuplicateKey, join(path, key),
					"key %q appears more than once in %q", key, path)
			}
			seen[key] = true
			return checkKeys(value, t.Elem(), join(path, key))
		})
	}
	return nil
}

func nullErr(path string, t reflect.Type) error {
	what := "a value"
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		what = "an object"
	case reflect.Slice, reflect.Array:
		what = "an array"
	case reflect.String:
		what = "a string"
	case reflect.Bool:
		what = "true or false"
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Float64:
		what = "a number"
	}
	return errf(http.StatusBadRequest, "invalid_field", path,
		"field %q: null is not allowed, want %s (omit the field to leave it unset)", path, what)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var fieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// fieldsOf maps a struct's JSON member names to their types, following
// embedded structs as encoding/json does.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range fieldsOf(ft) {
					if _, ok := m[k]; !ok {
						m[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	fieldCache.Store(t, m)
	return m
}

// checkBody is checkKeys for a whole request body decoded into v.
func checkBody(data []byte, v any) error {
	if err := jsonkeys.Members(data, func(_, _ []byte) error { return nil }); err != nil {
		if je, ok := err.(*jsonkeys.Error); ok {
			return errf(http.StatusBadRequest, "invalid_json", "", "%s", je.Error())
		}
		return err
	}
	err := checkKeys(data, reflect.TypeOf(v).Elem(), "")
	if err != nil {
		if _, ok := err.(*apiError); !ok {
			return errf(http.StatusBadRequest, "invalid_json", "", "%v", err)
		}
	}
	return err
}
