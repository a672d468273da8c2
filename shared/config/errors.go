package config

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// FieldError is a problem with one key of a configuration, named by its
// path from the top of the file: "pools[1].model",
// "tenants[0].limits.rpm". Validate methods return these (joined with
// errors.Join) so that the loader can point at the key's line.
//
// A path element written [name=x] selects the list element whose name
// is x, for errors found after a list was merged or reordered; it is
// reported with the element's index in the file.
type FieldError struct {
	Path string // "" for the file as a whole
	Msg  string // what is wrong and what is allowed, without the path

	// guessed: Path was read off the front of a plain error's message
	// (Msg, which still starts with it, relative to base). It is kept
	// only if the schema has such a key, else the error is reported at
	// base.
	guessed bool
	base    string
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Errorf returns a *FieldError at path.
func Errorf(path, format string, args ...any) error {
	return &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)}
}

// At puts every problem in err under path: a FieldError's path is
// prefixed with it, any other error becomes a FieldError at path (or
// deeper, when its message starts with a key below path). It returns nil
// for a nil err, and keeps a joined error's parts apart.
func At(path string, err error) error {
	if err == nil {
		return nil
	}
	var out []error
	for _, e := range flatten(err) {
		fe := asField(e)
		out = append(out, &FieldError{Path: joinPath(path, fe.Path), Msg: fe.Msg,
			guessed: fe.guessed, base: joinPath(path, fe.base)})
	}
	return errors.Join(out...)
}

// flatten splits joined errors into their parts, recursively.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// leadingPath matches a message that starts with a key path, as in
// `tracing.exporter "x": want ...` or `peers.tls: cert_file ...`.
var leadingPath = regexp.MustCompile(`^([a-z][a-z0-9_]*(?:\[\d+\])?(?:\.[a-z][a-z0-9_]*(?:\[\d+\])?)*)(?::\s*|\s+|$)`)

// asField returns err as a FieldError: itself, or a plain error whose
// message starts with something shaped like a key path split into path
// and message (the caller checks the path against the file), else the
// whole message with no path.
func asField(err error) *FieldError {
	var fe *FieldError
	if errors.As(err, &fe) && fe == err {
		return fe
	}
	msg := err.Error()
	if m := leadingPath.FindStringSubmatch(msg); m != nil && strings.TrimSpace(msg[len(m[0]):]) != "" {
		return &FieldError{Path: m[1], Msg: msg, guessed: true}
	}
	return &FieldError{Msg: msg}
}

func joinPath(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	case strings.HasPrefix(b, "["):
		return a + b
	}
	return a + "." + b
}

// Error is one problem in a configuration file, located.
type Error struct {
	File   string
	Line   int // 1-based; 0 when unknown
	Column int // 1-based; 0 when unknown
	Path   string
	Msg    string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	b.WriteString(": ")
	if e.Path != "" && !startsWithPath(e.Msg, e.Path) {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one file, in the order of the file.
// Its message has one problem per line.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the problems, for errors.As.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// startsWithPath reports whether msg already begins with the key path, as
// in `upstream.scheme "ftp": want http or https`.
func startsWithPath(msg, path string) bool {
	rest, ok := strings.CutPrefix(msg, path)
	return ok && (rest == "" || rest[0] == ' ' || rest[0] == ':')
}

func (es Errors) sort() {
	sort.SliceStable(es, func(i, j int) bool {
		a, b := es[i], es[j]
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
}

// List joins the names of items, as an error message lists the valid
// choices ("unknown pool "x" (pools: a, b)"), or returns none when there
// are no items, so that the message still reads.
func List[T any](items []T, name func(T) string, none string) string {
	if len(items) == 0 {
		return none
	}
	names := make([]string, len(items))
	for i, it := range items {
		names[i] = name(it)
	}
	return strings.Join(names, ", ")
}
