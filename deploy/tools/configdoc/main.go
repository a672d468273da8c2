// Command configdoc generates the configuration reference
// (docs/configuration-tier1.md, docs/configuration-tier2.md) and the
// `config` property of each Helm chart's values.schema.json from the
// configuration types themselves: the keys, their kinds and defaults by
// reflection (shared/config.Keys, JSONSchema), the descriptions from the
// fields' doc comments (go/ast). A test fails when the files are not
// current; regenerate with
//
//	go generate ./deploy/tools/configdoc
package main

//go:generate go run . -root ../../..

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"

	"github.com/infergate/infergate/shared/config"
	tier1 "github.com/infergate/infergate/tier1/config"
	tier2 "github.com/infergate/infergate/tier2/server"
)

const module = "github.com/infergate/infergate"

// tier is one configuration file format.
type tier struct {
	name  string // tier1
	title string
	doc   string // docs/configuration-tier1.md
	chart string // deploy/helm/infergate-tier1
	cfg   any    // a pointer to the zero configuration
	intro string
}

var tiers = []tier{
	{
		name: "tier1", title: "Tier 1", doc: "docs/configuration-tier1.md", chart: "deploy/helm/infergate-tier1",
		cfg: &tier1.Config{},
		intro: "The file `infergate tier1 --config` reads (the per-cluster router, [tier1.md](tier1.md)). " +
			"It is reloaded when it changes, except the keys noted as read at start.",
	},
	{
		name: "tier2", title: "Tier 2", doc: "docs/configuration-tier2.md", chart: "deploy/helm/infergate-tier2",
		cfg:   &tier2.Config{},
		intro: "The file `infergate tier2 --config` reads (the regional front door, [tier2.md](tier2.md)). It is read at start.",
	},
}

func main() {
	root := flag.String("root", ".", "the repository's root")
	flag.Parse()
	files, err := Generate(*root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "configdoc:", err)
		os.Exit(1)
	}
	for _, name := range sortedKeys(files) {
		if err := os.WriteFile(filepath.Join(*root, name), files[name], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "configdoc:", err)
			os.Exit(1)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Generate returns every generated file's content by its path from root.
func Generate(root string) (map[string][]byte, error) {
	docs := &comments{root: root, pkgs: map[string]map[string]*ast.StructType{}, typeDocs: map[string]string{}, fset: token.NewFileSet()}
	out := map[string][]byte{}
	for _, t := range tiers {
		md, err := reference(t, docs)
		if err != nil {
			return nil, err
		}
		out[t.doc] = md
		schemaPath := filepath.Join(t.chart, "values.schema.json")
		old, err := os.ReadFile(filepath.Join(root, schemaPath))
		if err != nil {
			return nil, err
		}
		js, err := withConfigSchema(old, t)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", schemaPath, err)
		}
		out[schemaPath] = js
	}
	return out, nil
}

// comments reads the doc comments of struct fields from the source.
type comments struct {
	root     string
	fset     *token.FileSet
	pkgs     map[string]map[string]*ast.StructType // import path -> type name -> struct
	typeDocs map[string]string                     // import path + "." + type name -> its doc
}

func (c *comments) structOf(t reflect.Type) (*ast.StructType, error) {
	pkg := t.PkgPath()
	types, ok := c.pkgs[pkg]
	if !ok {
		rel, found := strings.CutPrefix(pkg, module+"/")
		if !found {
			return nil, nil // outside the module: no comments
		}
		types = map[string]*ast.StructType{}
		files, err := filepath.Glob(filepath.Join(c.root, rel, "*.go"))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(c.fset, f, nil, parser.ParseComments)
			if err != nil {
				return nil, err
			}
			for _, d := range af.Decls {
				gd, ok := d.(*ast.GenDecl)
				if !ok || gd.Tok != token.TYPE {
					continue
				}
				for _, sp := range gd.Specs {
					ts := sp.(*ast.TypeSpec)
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					types[ts.Name.Name] = st
					doc := ts.Doc
					if doc == nil && len(gd.Specs) == 1 {
						doc = gd.Doc
					}
					c.typeDocs[pkg+"."+ts.Name.Name] = strings.TrimSpace(doc.Text())
				}
			}
		}
		c.pkgs[pkg] = types
	}
	return types[t.Name()], nil
}

// fieldDoc returns the comment of a struct field: the doc above it or the
// comment after it. A field with neither that directly follows one whose
// doc names it ("HashKeyFile or HashKeyEnv holds ...") shares that doc
// (shared reports it).
func (c *comments) fieldDoc(owner reflect.Type, name string) (text string, shared bool, err error) {
	st, err := c.structOf(owner)
	if err != nil || st == nil {
		return "", false, err
	}
	var prev string
	prevLine := -10
	for _, f := range st.Fields.List {
		line := c.fset.Position(f.Pos()).Line
		text := strings.TrimSpace(f.Doc.Text())
		if cm := strings.TrimSpace(f.Comment.Text()); cm != "" {
			if text != "" {
				cm = strings.ToUpper(cm[:1]) + cm[1:]
			}
			text = strings.TrimSpace(text + " " + cm)
		}
		shared := false
		if text == "" && line == prevLine+1 && len(f.Names) == 1 && regexp.MustCompile(`\b`+f.Names[0].Name+`\b`).MatchString(prev) {
			text, shared = prev, true
		}
		for _, n := range f.Names {
			if n.Name == name {
				return text, shared, nil
			}
		}
		prev, prevLine = text, c.fset.Position(f.End()).Line
	}
	return "", false, nil
}

// typeDoc returns a struct type's doc comment as a description of a key
// of that type: "RetryConfig bounds retries ..." becomes "Bounds retries
// ...", "PodConfig is one pod" becomes "One pod".
func (c *comments) typeDoc(t reflect.Type) (string, error) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return "", nil
	}
	if _, err := c.structOf(t); err != nil {
		return "", err
	}
	doc := strings.Join(strings.Fields(c.typeDocs[t.PkgPath()+"."+t.Name()]), " ")
	rest, ok := strings.CutPrefix(doc, t.Name()+" ")
	if !ok {
		return doc, nil
	}
	for _, verb := range []string{"is ", "are "} {
		rest = strings.TrimPrefix(rest, verb)
	}
	if rest == "" {
		return "", nil
	}
	return strings.ToUpper(rest[:1]) + rest[1:], nil
}

// describe turns a doc comment into one line of the reference: the Go
// names of the struct's fields become their keys. The field's own name
// does only the first time: in "GPUs is how many GPUs the pod runs on"
// the second is English.
func describe(doc string, keyOf map[string]string, self string) string {
	s := strings.Join(strings.Fields(doc), " ")
	var b strings.Builder
	if rest, ok := strings.CutPrefix(s, self+" "); ok && keyOf[self] != "" {
		// An all-capitals name (JWKSURL) that goWord does not match.
		s = "`" + keyOf[self] + "` " + rest
	}
	last, selfSeen := 0, strings.HasPrefix(s, "`")
	for _, m := range goWord.FindAllStringIndex(s, -1) {
		w := s[m[0]:m[1]]
		k, ok := keyOf[w]
		if !ok || (w == self && selfSeen) {
			continue
		}
		selfSeen = selfSeen || w == self
		b.WriteString(s[last:m[0]])
		b.WriteString("`" + k + "`")
		last = m[1]
	}
	b.WriteString(s[last:])
	return strings.ReplaceAll(b.String(), "|", `\|`)
}

var goWord = regexp.MustCompile(`\b[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*\b`)

// defaultIn finds "default X" in a description.
var defaultIn = regexp.MustCompile(`\b[Dd]efault:?\s+(.+?)(?:[;,)]|\.\s|\.$|$)`)

// valueLike is what a default found in a description must look like to
// go in the default column: a number, a quoted string, a list, a word.
var valueLike = regexp.MustCompile(`^("[^"]*"|\[[^\]]*\]|[0-9][0-9.:]*[A-Za-z]*( [KMG]i?B)?|[a-z0-9][a-z0-9._:/-]*)$`)

// defaultOf returns the default a description states ("default 30s"),
// if it looks like a value; "the default user" is not one.
func defaultOf(desc string) string {
	for _, m := range defaultIn.FindAllStringSubmatchIndex(desc, -1) {
		if strings.HasSuffix(desc[:m[0]], "the ") {
			continue
		}
		if v := strings.TrimSpace(desc[m[2]:m[3]]); valueLike.MatchString(v) {
			return v
		}
	}
	return ""
}

// sentence makes a doc comment's fragment read as a sentence in the
// table: "dialling a pod; default 2s" gets a capital and a full stop,
// "http, or https" (a value first) becomes "`scheme` is http, or https.".
func sentence(s, key string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return s
	}
	if word, rest, _ := strings.Cut(s, " "); plainWord.MatchString(word) && !valueList.MatchString(rest) {
		s = strings.ToUpper(s[:1]) + s[1:]
	} else if c := s[0]; c >= 'a' && c <= 'z' || c == '"' {
		s = "`" + key + "` is " + s
	}
	if !strings.HasSuffix(s, ".") && !strings.HasSuffix(s, "?") && !strings.HasSuffix(s, "!") {
		s += "."
	}
	return s
}

// plainWord is a first word that is English, not a value: "dialling"
// is capitalised, "http," "gpu-hour" and "host:port" are not.
var plainWord = regexp.MustCompile(`^[a-z]+$`)

// valueList is what follows a value listed as a first word: "connect
// (default) or bind", "nil = enabled".
var valueList = regexp.MustCompile(`^(\(|=|or )`)

// valueDefault finds a default written after its value, `"1.3" (default)`,
// `http (the default)`, or as what an absent key means, `absent means 1`.
var valueDefault = regexp.MustCompile(`("[^"]*"|\b[a-z0-9][a-z0-9._-]*) \((?:the )?default\)|\babsent means ([0-9]+(?:\.[0-9]+)?|[a-z][a-z0-9-]*)`)

// required is a description saying the key itself is required ("Required,
// unique", "host:port; required", "(required)"), not a condition ("port
// is then required", "required (https) with oidc_discovery").
var required = regexp.MustCompile(`(^|; |\(|, )[Rr]equired([.,;)]|$)`)

// defaultMention is a description speaking of a default it does not state
// as a value.
var defaultMention = regexp.MustCompile(`\b(the )?default\b|\bDefault:? [a-z]`)

// fallbackDefault is the default column of a key whose value after
// SetDefaults is the zero value: what the description says when it says
// it, "required" for a required key, else the zero value in words. A
// description that mentions a default it does not state plainly (a
// conditional one: "https (the default when tls is set)") is referred to
// rather than contradicted by a zero value.
func fallbackDefault(k config.KeyInfo, desc string) string {
	if m := valueDefault.FindStringSubmatch(desc); m != nil {
		return m[1] + m[2]
	}
	if k.Type == "mapping" {
		return "*see its keys*"
	}
	if strings.Contains(desc, "default the ") || strings.Contains(desc, "Default the ") {
		i := strings.Index(strings.ToLower(desc), "default the ")
		phrase := desc[i+len("default "):]
		if j := strings.IndexAny(phrase, ";,.)"); j >= 0 {
			phrase = phrase[:j]
		}
		return "*" + strings.TrimSpace(phrase) + "*"
	}
	if required.MatchString(desc) {
		return "*required*"
	}
	if defaultMention.MatchString(strings.ReplaceAll(desc, "the default user", "")) {
		return "*see description*"
	}
	switch {
	case strings.HasSuffix(k.Path, "<name>"):
		return "*none*"
	case k.Field.Type != nil && k.Field.Type.Kind() == reflect.Pointer:
		// Absent and zero differ; the description says what absent is.
		return "*see description*"
	case k.Type == "boolean":
		return "false"
	case strings.HasPrefix(k.Type, "integer"), strings.HasPrefix(k.Type, "number"), strings.HasPrefix(k.Type, "duration"):
		return "0"
	case strings.HasPrefix(k.Type, "list of"), strings.HasPrefix(k.Type, "map of"):
		return "*none*"
	default:
		return "*empty*"
	}
}

// lastKey is the last key of a path: timeouts.connect -> connect.
func lastKey(path string) string {
	path = strings.TrimSuffix(path, "[]")
	return path[strings.LastIndex(path, ".")+1:]
}

type row struct {
	key, typ, def, desc string
}

func reference(t tier, docs *comments) ([]byte, error) {
	keys := config.Keys(t.cfg)
	var b bytes.Buffer
	fmt.Fprintf(&b, "<!-- Generated by deploy/tools/configdoc from the configuration types; do not edit. -->\n")
	fmt.Fprintf(&b, "<!-- Regenerate: go generate ./deploy/tools/configdoc -->\n\n")
	fmt.Fprintf(&b, "# %s configuration reference\n\n", t.title)
	fmt.Fprintf(&b, "%s Check a file without starting anything with `infergate check --config FILE`; "+
		"[configuration.md](configuration.md) explains the notation. Every key is optional unless its "+
		"description says it is required.\n\n", t.intro)

	type section struct {
		key, desc string
		rows      []row
	}
	var top []row
	var sections []*section
	bySection := map[string]*section{}
	keyOfCache := map[reflect.Type]map[string]string{}
	for _, k := range keys {
		desc, shared := "", false
		if k.Owner != nil {
			doc, sh, err := docs.fieldDoc(k.Owner, k.Field.Name)
			if err != nil {
				return nil, err
			}
			keyOf, ok := keyOfCache[k.Owner]
			if !ok {
				keyOf = fieldKeys(k.Owner)
				keyOfCache[k.Owner] = keyOf
			}
			if doc == "" && !k.Leaf {
				// The type's doc names the type's fields, not the
				// owner's: its words stay as written.
				if doc, err = docs.typeDoc(k.Field.Type); err != nil {
					return nil, err
				}
				keyOf = nil
			}
			shared = sh
			desc = describe(doc, keyOf, k.Field.Name)
		} else {
			desc = "a parameter of its own, by name (see the owner's description)"
		}
		def := k.Default
		if def == "" && k.Leaf && !shared {
			def = defaultOf(desc)
		}
		if def == "" {
			def = fallbackDefault(k, desc)
		}
		desc = sentence(desc, lastKey(k.Path))
		typ := k.Type
		if k.Min != "" {
			typ += ", ≥ " + k.Min
		}
		if k.File {
			typ += " (file)"
		}
		r := row{key: k.Path, typ: typ, def: def, desc: desc}
		name, _, nested := strings.Cut(strings.SplitN(k.Path, "[", 2)[0], ".")
		if !nested && !strings.Contains(k.Path, "[") {
			if k.Leaf {
				top = append(top, r)
				continue
			}
			s := &section{key: k.Path, desc: desc}
			sections = append(sections, s)
			bySection[k.Path] = s
			if strings.HasPrefix(typ, "list of") || strings.HasPrefix(typ, "map of") {
				s.rows = append(s.rows, r)
			}
			continue
		}
		s := bySection[name]
		if s == nil {
			return nil, fmt.Errorf("%s: no section for %s", t.name, k.Path)
		}
		s.rows = append(s.rows, r)
	}
	b.WriteString("## Top-level keys\n\n")
	writeTable(&b, top)
	for _, s := range sections {
		fmt.Fprintf(&b, "\n## `%s`\n\n", s.key)
		if s.desc != "" {
			fmt.Fprintf(&b, "%s\n\n", s.desc)
		}
		writeTable(&b, s.rows)
	}
	return b.Bytes(), nil
}

func writeTable(b *bytes.Buffer, rows []row) {
	b.WriteString("| key | type | default | description |\n|---|---|---|---|\n")
	for _, r := range rows {
		def := r.def
		if !strings.HasPrefix(def, "*") { // *words*, not a value
			def = "`" + strings.ReplaceAll(def, "|", `\|`) + "`"
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", r.key, r.typ, def, r.desc)
	}
}

// fieldKeys maps a struct's Go field names to their YAML keys.
func fieldKeys(t reflect.Type) map[string]string {
	out := map[string]string{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			out[f.Name] = name
		}
	}
	return out
}

// withConfigSchema returns the chart's values.schema.json with its
// top-level config property replaced by the configuration's schema; the
// rest of the file is kept byte for byte.
func withConfigSchema(old []byte, t tier) ([]byte, error) {
	start, end, err := configSpan(old)
	if err != nil {
		return nil, err
	}
	s := config.JSONSchema(t.cfg)
	s["type"] = "object"
	s["minProperties"] = 1
	s["description"] = fmt.Sprintf("The %s configuration file (docs/configuration-%s.md), written into the ConfigMap; "+
		"its keys are checked here, generated from the Go types by deploy/tools/configdoc.", t.title, t.name)
	js, err := json.MarshalIndent(s, "    ", "  ")
	if err != nil {
		return nil, err
	}
	out := append([]byte(nil), old[:start]...)
	out = append(out, js...)
	return append(out, old[end:]...), nil
}

var configKey = regexp.MustCompile(`(?m)^    "config": `)

// configSpan finds the value of the top-level properties' "config" key:
// from its opening brace to just after its closing one.
func configSpan(b []byte) (int, int, error) {
	loc := configKey.FindIndex(b)
	if loc == nil {
		return 0, 0, errors.New(`no top-level "config" property`)
	}
	start := loc[1]
	if start >= len(b) || b[start] != '{' {
		return 0, 0, errors.New(`"config" is not an object`)
	}
	depth, inString := 0, false
	for i := start; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{':
			depth++
		case c == '}':
			depth--
			if depth == 0 {
				return start, i + 1, nil
			}
		}
	}
	return 0, 0, errors.New(`"config" is not closed`)
}
