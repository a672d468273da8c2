// Package config decodes infergate's YAML configuration files strictly
// and reports every problem at once, each with its file, line and column,
// the key's path (pools[1].model) and what the key accepts: unknown keys
// with the key probably meant, values of the wrong kind in words
// ("want a whole number ≥ 0, got "abc""), and what the configuration's
// Validate method refuses, located by the key paths of its FieldErrors.
//
// The key schema is read from the configuration type by reflection (see
// schema.go); Keys and JSONSchema give it to the configuration reference
// and the Helm charts.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Validator is implemented by configuration types that can check themselves
// after defaults are applied. Return FieldErrors (joined with errors.Join)
// so that each problem is reported at its key; a plain error whose message
// starts with a key path (`tracing.exporter "x": ...`) is located by it.
type Validator interface {
	Validate() error
}

// Defaulter is implemented by configuration types that fill in zero fields.
type Defaulter interface {
	SetDefaults()
}

// File is a configuration file parsed into its YAML node tree, which is
// kept so that problems found after decoding are reported at their line.
type File struct {
	Name string
	data []byte
	root *yaml.Node // the document's top node; nil for an empty file
}

// Parse parses data (the file's content; name is used in messages). A
// YAML syntax error is returned as Errors.
func Parse(name string, data []byte) (*File, error) {
	f := &File{Name: name, data: data}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, Errors{f.syntaxError(err)}
	}
	if f.root = resolve(&doc); f.root != nil && f.root.Kind == 0 {
		f.root = nil // an empty file
	}
	return f, nil
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

func (f *File) syntaxError(err error) *Error {
	msg := err.Error()
	e := &Error{File: f.Name}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
	}
	e.Msg = "not valid YAML: " + strings.TrimPrefix(msg, "yaml: ")
	return e
}

// Load reads the file at path and decodes it with Decode.
func Load(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	return Decode(path, data, v)
}

// Decode strictly decodes YAML data into v (a pointer to a struct), then
// applies defaults and validates when v implements Defaulter or
// Validator. name is used in error messages (usually the file path). The
// error, when there is one, is Errors: every problem found.
func Decode(name string, data []byte, v any) error {
	f, err := Parse(name, data)
	if err != nil {
		return err
	}
	return f.Decode(v)
}

// Decode decodes the file into v (a pointer to a struct): the keys and
// kinds of values are checked against v's type, then the file is decoded,
// defaults applied and v validated. Every problem is returned, as Errors.
func (f *File) Decode(v any) error {
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer {
		return fmt.Errorf("config: Decode needs a pointer, got %T", v)
	}
	s := schemaFor(t)
	var errs Errors
	if f.root != nil {
		c := &checker{file: f, top: s}
		c.check(f.root, s, "")
		errs = c.errs
	}
	if len(errs) == 0 {
		dec := yaml.NewDecoder(bytes.NewReader(f.data))
		dec.KnownFields(true)
		if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
			errs = append(errs, f.translate(err)...)
			errs.sort()
			return errs
		}
	} else if f.root != nil {
		// Decode what can be, to report the Validate problems too;
		// a type that fails to decode itself leaves v half set.
		var te *yaml.TypeError
		if err := f.root.Decode(v); err != nil && !errors.As(err, &te) {
			errs.sort()
			return errs
		}
	}
	if d, ok := v.(Defaulter); ok {
		d.SetDefaults()
	}
	if val, ok := v.(Validator); ok {
		for _, e := range f.locate(s, val.Validate()) {
			if !coveredBy(e.Path, errs) {
				errs = append(errs, e)
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	errs.sort()
	return errs
}

// Locate returns the problems in err (FieldErrors, joined) located in
// the file, as Errors; v is the configuration they were found in (its
// type's schema tells a key path from the first word of a message).
// It returns nil for a nil err.
func (f *File) Locate(v any, err error) error {
	if err == nil {
		return nil
	}
	errs := f.locate(schemaFor(reflect.TypeOf(v)), err)
	errs.sort()
	return errs
}

func (f *File) locate(s *schema, err error) Errors {
	var out Errors
	for _, e := range flatten(err) {
		fe := asField(e)
		path, msg := fe.Path, fe.Msg
		if fe.guessed {
			if s.has(path) {
				// The message names the key relative to base.
				msg = joinPath(fe.base, msg)
			} else {
				path = fe.base
			}
		}
		at, shown, _ := find(f.root, path)
		out = append(out, f.errorAt(at, shown, msg))
	}
	return out
}

func (f *File) errorAt(n *yaml.Node, path, msg string) *Error {
	e := &Error{File: f.Name, Path: path, Msg: msg, Line: 1, Column: 1}
	if n != nil && n.Line > 0 {
		e.Line, e.Column = n.Line, n.Column
	}
	return e
}

// coveredBy reports whether path is at or under the path of a problem
// already found (a value of the wrong kind also fails validation).
func coveredBy(path string, errs Errors) bool {
	for _, e := range errs {
		if e.Path == "" {
			continue
		}
		if path == e.Path || strings.HasPrefix(path, e.Path+".") || strings.HasPrefix(path, e.Path+"[") {
			return true
		}
	}
	return false
}

// TopKeys returns the keys at the top of the file, in order.
func (f *File) TopKeys() []string {
	if f.root == nil || f.root.Kind != yaml.MappingNode {
		return nil
	}
	keys, _ := mappingPairs(f.root)
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.Value
	}
	return out
}

// Has reports whether the file sets the key at path.
func (f *File) Has(path string) bool {
	_, _, complete := find(f.root, path)
	return complete
}

// translate turns a yaml.v3 decoding error (which names Go types) into
// located problems in the file's terms.
func (f *File) translate(err error) Errors {
	var te *yaml.TypeError
	var msgs []string
	if errors.As(err, &te) {
		msgs = te.Errors
	} else {
		msgs = []string{err.Error()}
	}
	var out Errors
	for _, m := range msgs {
		line := 0
		if lm := lineRef.FindStringSubmatch(m); lm != nil {
			line, _ = strconv.Atoi(lm[2])
			m = strings.Replace(m, lm[0], lm[1], 1)
		}
		m = strings.TrimPrefix(m, "yaml: ")
		if um := unmarshalMsg.FindStringSubmatch(m); um != nil {
			m = fmt.Sprintf("want %s, got %s", goTypeWords(um[3]), quoteValue(um[2]))
		} else if fm := fieldMsg.FindStringSubmatch(m); fm != nil {
			m = fmt.Sprintf("unknown key %q", fm[1])
		}
		m = inType.ReplaceAllString(m, "")
		e := &Error{File: f.Name, Line: line, Msg: m}
		if line > 0 {
			if p, k := keyAtLine(f.root, line); k != nil {
				e.Path, e.Column = p, k.Column
			}
		}
		out = append(out, e)
	}
	return out
}

var (
	// "line 3: ", "profile at line 3: "
	lineRef      = regexp.MustCompile(`^(?:(.*?)\s*at )?line (\d+):\s*`)
	unmarshalMsg = regexp.MustCompile("^cannot unmarshal !!(\\w+) `(.*)` into (\\S+)$")
	fieldMsg     = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
	inType       = regexp.MustCompile(` in type [\w.*\[\]/]+`)
)

// goTypeWords says in words what a Go type named in a yaml.v3 message
// accepts.
func goTypeWords(t string) string {
	switch {
	case t == "time.Duration":
		return "a duration such as 500ms, 10s or 1m30s"
	case t == "string":
		return "a string"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "uint"):
		return "a whole number ≥ 0"
	case strings.HasPrefix(t, "int"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	}
	return "a mapping"
}

func quoteValue(v string) string {
	const max = 60
	if len(v) > max {
		v = v[:max] + "…"
	}
	return strconv.Quote(v)
}
