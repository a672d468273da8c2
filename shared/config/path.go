package config

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// A key path: keys joined by dots, list indices in brackets, map keys
// that are not plain words quoted in brackets:
//
//	pools[1].model   tenants[0].model_limits["meta-llama/Llama-3.1-8B"].rpm
//
// plus, in paths built by Validate methods, [name=x] for the element of
// a list whose name is x.
type segment struct {
	key    string // a mapping key; "" for an index or a selector
	index  int    // [n]; -1 for [] or a selector
	selKey string // [selKey=selVal]
	selVal string
	quoted bool // key written ["..."]
}

func (s segment) isIndex() bool { return s.key == "" && !s.quoted }

var plainKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Key returns the path element for a map key: .key for a plain word,
// ["key"] for anything else (a model name with dots or slashes).
func Key(parent, key string) string {
	if plainKey.MatchString(key) {
		return joinPath(parent, key)
	}
	return parent + "[" + strconv.Quote(key) + "]"
}

// Index returns parent[i].
func Index(parent string, i int) string { return fmt.Sprintf("%s[%d]", parent, i) }

func parsePath(p string) ([]segment, error) {
	var segs []segment
	for i := 0; i < len(p); {
		switch p[i] {
		case '.':
			i++
		case '[':
			end := strings.IndexByte(p[i:], ']')
			if i+1 < len(p) && p[i+1] == '"' {
				// A quoted key may hold ']' itself: find the closing quote.
				q, err := strconv.QuotedPrefix(p[i+1:])
				if err != nil {
					return nil, fmt.Errorf("path %q: %w", p, err)
				}
				k, _ := strconv.Unquote(q)
				segs = append(segs, segment{key: k, index: -1, quoted: true})
				i += 1 + len(q)
				if i >= len(p) || p[i] != ']' {
					return nil, fmt.Errorf("path %q: no ] after a quoted key", p)
				}
				i++
				continue
			}
			if end < 0 {
				return nil, fmt.Errorf("path %q: no ]", p)
			}
			in := p[i+1 : i+end]
			i += end + 1
			switch k, v, ok := strings.Cut(in, "="); {
			case ok:
				segs = append(segs, segment{index: -1, selKey: k, selVal: v})
			case in == "":
				segs = append(segs, segment{index: -1})
			default:
				n, err := strconv.Atoi(in)
				if err != nil || n < 0 {
					return nil, fmt.Errorf("path %q: bad index %q", p, in)
				}
				segs = append(segs, segment{index: n})
			}
		default:
			end := strings.IndexAny(p[i:], ".[")
			if end < 0 {
				end = len(p) - i
			}
			segs = append(segs, segment{key: p[i : i+end], index: -1})
			i += end
		}
	}
	return segs, nil
}

func formatPath(segs []segment) string {
	var b strings.Builder
	for _, s := range segs {
		switch {
		case s.quoted || (s.key != "" && !plainKey.MatchString(s.key)):
			b.WriteString("[" + strconv.Quote(s.key) + "]")
		case s.key != "":
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s.key)
		case s.selKey != "":
			fmt.Fprintf(&b, "[%s=%s]", s.selKey, s.selVal)
		case s.index < 0:
			b.WriteString("[]")
		default:
			fmt.Fprintf(&b, "[%d]", s.index)
		}
	}
	return b.String()
}

func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && (n.Kind == yaml.AliasNode || n.Kind == yaml.DocumentNode) {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
		} else if len(n.Content) > 0 {
			n = n.Content[0]
		} else {
			return nil
		}
	}
	return n
}

// mappingPairs returns a mapping's key and value nodes, merge keys
// (<<: *anchor) expanded after the mapping's own keys.
func mappingPairs(n *yaml.Node) (keys, values []*yaml.Node) {
	return mergedPairs(n, map[*yaml.Node]bool{})
}

func mergedPairs(n *yaml.Node, seen map[*yaml.Node]bool) (keys, values []*yaml.Node) {
	if seen[n] { // a mapping merging itself
		return nil, nil
	}
	seen[n] = true
	var merged []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			merged = append(merged, v)
			continue
		}
		keys, values = append(keys, k), append(values, v)
	}
	for _, m := range merged {
		m = resolve(m)
		var srcs []*yaml.Node
		if m != nil && m.Kind == yaml.SequenceNode {
			for _, e := range m.Content {
				srcs = append(srcs, resolve(e))
			}
		} else {
			srcs = []*yaml.Node{m}
		}
		for _, s := range srcs {
			if s != nil && s.Kind == yaml.MappingNode {
				k, v := mergedPairs(s, seen)
				keys, values = append(keys, k...), append(values, v...)
			}
		}
	}
	return keys, values
}

// find follows path in the tree from root as far as the file has it. It
// returns the node where it stopped (the key's node for a key, the
// element for a list element; root when nothing matched) and the path
// as reported: indices in place of selectors the file resolves. complete
// is whether the file has the whole path.
func find(root *yaml.Node, path string) (at *yaml.Node, shown string, complete bool) {
	segs, err := parsePath(path)
	if err != nil {
		return root, path, false
	}
	cur := resolve(root)
	at = cur
	found := 0
	for i, s := range segs {
		if cur == nil {
			break
		}
		var next, pos *yaml.Node
		switch {
		case !s.isIndex() && cur.Kind == yaml.MappingNode:
			keys, values := mappingPairs(cur)
			for j, k := range keys {
				if k.Value == s.key {
					next, pos = values[j], k
					break
				}
			}
		case s.isIndex() && cur.Kind == yaml.SequenceNode:
			switch {
			case s.selKey != "":
				for j, e := range cur.Content {
					e = resolve(e)
					if e == nil || e.Kind != yaml.MappingNode {
						continue
					}
					keys, values := mappingPairs(e)
					for m, k := range keys {
						if k.Value == s.selKey && resolve(values[m]) != nil && resolve(values[m]).Value == s.selVal {
							next, pos = e, cur.Content[j]
							segs[i] = segment{index: j}
							break
						}
					}
					if next != nil {
						break
					}
				}
			case s.index >= 0 && s.index < len(cur.Content):
				next, pos = resolve(cur.Content[s.index]), cur.Content[s.index]
			}
		}
		if next == nil {
			break
		}
		cur, at = resolve(next), pos
		found++
	}
	return at, formatPath(segs), root != nil && found == len(segs)
}

// keyAtLine returns the path and node of the first mapping key on line,
// for errors that know only their line.
func keyAtLine(root *yaml.Node, line int) (string, *yaml.Node) {
	var walk func(n *yaml.Node, path string) (string, *yaml.Node)
	walk = func(n *yaml.Node, path string) (string, *yaml.Node) {
		// Aliases are not followed: the key is where the anchor is.
		if n != nil && n.Kind == yaml.DocumentNode {
			n = resolve(n)
		}
		if n == nil || n.Line > line && n.Kind != yaml.MappingNode && n.Kind != yaml.SequenceNode {
			return "", nil
		}
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := Key(path, k.Value)
				if k.Line == line {
					return p, k
				}
				if k.Line < line {
					if sp, sn := walk(v, p); sn != nil {
						return sp, sn
					}
				}
			}
		case yaml.SequenceNode:
			for i, e := range n.Content {
				if sp, sn := walk(e, Index(path, i)); sn != nil {
					return sp, sn
				}
			}
		}
		return "", nil
	}
	return walk(root, "")
}
