package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// checker walks a file's node tree against the schema of the type it is
// decoded into, collecting every unknown key and every value of the
// wrong kind, with its position.
type checker struct {
	file *File
	top  *schema
	errs Errors
	// aliases already checked: each anchor's value is checked once (at
	// the anchor), so that aliases cannot make the walk explode.
	aliases map[*yaml.Node]bool
}

func (c *checker) add(n *yaml.Node, path, format string, args ...any) {
	c.errs = append(c.errs, c.file.errorAt(n, path, fmt.Sprintf(format, args...)))
}

// got describes a node for "want X, got Y".
func got(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return quoteValue(n.Value)
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

func (c *checker) check(n *yaml.Node, s *schema, path string) {
	at := n
	if n.Kind == yaml.AliasNode {
		if c.aliases == nil {
			c.aliases = map[*yaml.Node]bool{}
		}
		if c.aliases[n.Alias] {
			return
		}
		c.aliases[n.Alias] = true
	}
	n = resolve(n)
	if n == nil || isNull(n) || s.kind == kindAny {
		return
	}
	if n.Anchor != "" {
		if c.aliases == nil {
			c.aliases = map[*yaml.Node]bool{}
		}
		c.aliases[n] = true
	}
	switch s.kind {
	case kindStruct:
		if n.Kind != yaml.MappingNode {
			c.add(at, path, "want %s, got %s", s.want(), got(n))
			return
		}
		c.checkMapping(n, s, path)
	case kindList:
		if n.Kind != yaml.SequenceNode {
			c.add(at, path, "want %s, got %s", s.want(), got(n))
			return
		}
		for i, e := range n.Content {
			c.check(e, s.elem, Index(path, i))
		}
	case kindMap:
		if n.Kind != yaml.MappingNode {
			c.add(at, path, "want %s, got %s", s.want(), got(n))
			return
		}
		keys, values := mappingPairs(n)
		seen := map[string]*yaml.Node{}
		for i, k := range keys {
			p := Key(path, k.Value)
			if prev := seen[k.Value]; prev != nil {
				c.add(k, p, "set twice (first at line %d)", prev.Line)
			}
			seen[k.Value] = k
			c.check(values[i], s.elem, p)
		}
	case kindStringOrList:
		switch n.Kind {
		case yaml.ScalarNode:
		case yaml.SequenceNode:
			for i, e := range n.Content {
				if e = resolve(e); e != nil && e.Kind != yaml.ScalarNode {
					c.add(e, Index(path, i), "want a string, got %s", got(e))
				}
			}
		default:
			c.add(at, path, "want %s, got %s", s.want(), got(n))
		}
	case kindScalar:
		c.checkScalar(at, n, s, path, nil)
	}
}

func (c *checker) checkMapping(n *yaml.Node, s *schema, path string) {
	keys, values := mappingPairs(n)
	seen := map[string]*yaml.Node{}
	for i, k := range keys {
		if k.Kind != yaml.ScalarNode {
			c.add(k, path, "a key must be a plain name, got %s", got(k))
			continue
		}
		p := Key(path, k.Value)
		if prev := seen[k.Value]; prev != nil {
			c.add(k, p, "set twice (first at line %d)", prev.Line)
			continue
		}
		seen[k.Value] = k
		f := s.byKey[k.Value]
		if f == nil {
			if s.extra != nil {
				c.check(values[i], s.extra, p)
				continue
			}
			c.add(k, p, "%s", c.unknownKey(k.Value, s, path))
			continue
		}
		if f.s.kind == kindScalar {
			c.checkScalar(values[i], resolve(values[i]), f.s, p, f.min)
			continue
		}
		c.check(values[i], f.s, p)
	}
}

// unknownKey says what is wrong with key in the mapping at path and
// which key was probably meant.
func (c *checker) unknownKey(key string, s *schema, path string) string {
	known := s.keyNames()
	if m := closest(key, known); m != "" {
		return fmt.Sprintf("unknown key %q; did you mean %q?", key, m)
	}
	// The right key in the wrong place: max_attempts at the top of the
	// file instead of under retry.
	var elsewhere []string
	for _, p := range c.top.everyKey() {
		// Only from the top of the file or within the same section:
		// pools[].capacity is not consul.capacity.
		if last(p) == key && p != joinPath(path, key) && (path == "" || firstKey(p) == firstKey(path)) {
			elsewhere = append(elsewhere, p)
		}
	}
	if len(elsewhere) > 0 && len(elsewhere) <= 3 {
		return fmt.Sprintf("unknown key %q here; did you mean %s?", key, strings.Join(elsewhere, " or "))
	}
	return fmt.Sprintf("unknown key %q (known keys here: %s)", key, strings.Join(known, ", "))
}

// firstKey returns a key path's first key.
func firstKey(p string) string {
	if i := strings.IndexAny(p, ".["); i >= 0 {
		return p[:i]
	}
	return p
}

// last returns a key path's last key.
func last(p string) string {
	if i := strings.LastIndexAny(p, ".]"); i >= 0 {
		return p[i+1:]
	}
	return p
}

func (c *checker) checkScalar(at, n *yaml.Node, s *schema, path string, min *float64) {
	if n == nil || isNull(n) {
		return
	}
	if n.Kind != yaml.ScalarNode {
		c.add(at, path, "want %s, got %s", s.want(), got(n))
		return
	}
	v := reflect.New(s.typ)
	if err := n.Decode(v.Interface()); err != nil {
		if s.typ == durationType && (n.Tag == "!!int" || n.Tag == "!!float") {
			c.add(at, path, "want a duration with a unit such as %ss, got %s", n.Value, n.Value)
			return
		}
		c.add(at, path, "want %s, got %s", s.want(), got(n))
		return
	}
	if min == nil {
		return
	}
	var x float64
	what, bound := "a whole number", strconv.FormatFloat(*min, 'f', -1, 64)
	switch e := v.Elem(); e.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		x = float64(e.Int())
		if s.typ == durationType {
			what, bound = "a duration", time.Duration(*min).String()
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		x = float64(e.Uint())
	case reflect.Float32, reflect.Float64:
		x, what = e.Float(), "a number"
	default:
		return
	}
	if x < *min {
		c.add(at, path, "want %s ≥ %s, got %s", what, bound, n.Value)
	}
}
