package workload

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"

	"github.com/gpu-arbiter/arbiter/internal/yamlsyntax"
)

// maxSpecBytes bounds a spec file.
const maxSpecBytes = 8 << 20

// FieldError is a problem with one field of a spec: its file, its path
// (for example "lc[0].arrival.rate") and, where known, its line.
type FieldError struct {
	File string
	Path string
	Line int
	Msg  string
}

// Error formats the problem as FILE:LINE: PATH: message.
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// File is a loaded spec with where it came from.
type File struct {
	Spec Spec
	// Path is the spec's file name ("" when parsed from memory); relative
	// files it names are resolved against Dir.
	Path string
	Dir  string
	// Warnings are things the spec says that are valid but probably not
	// meant (FILE:LINE: PATH: message), for the caller to show.
	Warnings []string
	// lines maps field paths to their lines, for errors found later.
	lines map[string]int
}

// Load reads, checks and validates a spec file. It reads at most one byte
// more than a spec may hold, so that a huge file, a device or a pipe that
// never ends is refused instead of filling memory.
func Load(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read workload: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSpecBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read workload: %w", err)
	}
	return Parse(data, path)
}

// Parse checks and validates a spec (YAML or JSON). name is used in errors
// and to resolve relative file names.
func Parse(data []byte, name string) (*File, error) {
	if len(data) > maxSpecBytes {
		if msg := binaryAt(data[:64<<10], true); msg != "" {
			return nil, &FieldError{File: name, Msg: msg}
		}
		return nil, &FieldError{File: name, Msg: fmt.Sprintf("more than %d bytes (8 MiB): a workload spec is a small YAML or JSON text; "+
			"recorded calls go in a trace file that the spec's replay section names", maxSpecBytes)}
	}
	if IsTrace(data) {
		return nil, &FieldError{File: name, Msg: "this is a trace recorded by arbiter trace --record, not a workload spec: " +
			"replay it from a spec's replay section (docs/simulator.md, \"Replaying a recorded trace\")"}
	}
	if msg := binaryAt(data, false); msg != "" {
		return nil, &FieldError{File: name, Msg: msg}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &FieldError{File: name, Msg: "empty: a workload spec gives gpus and at least one workload (docs/simulator.md, \"Workload specs\")"}
	}
	var root yamlv3.Node
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		return nil, &FieldError{File: name, Msg: "not valid YAML or JSON: " + clip(yamlsyntax.Message(err, data), 200)}
	}
	lines := map[string]int{}
	doc := &root
	if doc.Kind == yamlv3.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	if err := walk(doc, reflect.TypeFor[Spec](), "", lines); err != nil {
		err.File = name
		return nil, err
	}
	f := &File{Path: name, Dir: filepath.Dir(name), lines: lines}
	if err := yaml.UnmarshalStrict(data, &f.Spec); err != nil {
		return nil, &FieldError{File: name, Msg: clip(err.Error(), 200)}
	}
	for _, w := range f.Spec.warnings(lines) {
		w.File, w.Line = name, lineOf(lines, w.Path)
		f.Warnings = append(f.Warnings, w.Error())
	}
	if err := f.Spec.validate(); err != nil {
		err.File = name
		err.Line = lineOf(lines, err.Path)
		return nil, err
	}
	if f.Spec.Name == "" && name != "" {
		f.Spec.Name = NameFrom(name)
	}
	return f, nil
}

// lineOf finds the line of path or of its nearest recorded ancestor.
func lineOf(lines map[string]int, path string) int {
	for path != "" {
		if l, ok := lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// walk checks node n against Go type t before decoding, so that unknown
// fields and wrong kinds are reported with their full path and line
// (encoding/json reports neither), and records each path's line.
func walk(n *yamlv3.Node, t reflect.Type, path string, lines map[string]int) *FieldError {
	if n.Kind == yamlv3.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	lines[path] = n.Line
	fail := func(msg string) *FieldError { return &FieldError{Path: pathOr(path), Line: n.Line, Msg: msg} }
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yamlv3.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	switch t {
	case reflect.TypeFor[Duration]():
		if n.Kind != yamlv3.ScalarNode || n.Tag != "!!str" {
			return fail(fmt.Sprintf("want a duration string with a unit such as \"250us\", got %s", describe(n)))
		}
		if _, err := parseDuration(n.Value); err != nil {
			return fail(err.Error())
		}
		return nil
	case reflect.TypeFor[Dist]():
		if n.Kind == yamlv3.ScalarNode {
			return walk(n, reflect.TypeFor[Duration](), path, lines)
		}
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yamlv3.MappingNode {
			return fail("want a mapping, got " + describe(n))
		}
		fields := jsonFields(t)
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			child := joinPath(path, clip(k.Value, 40))
			f, ok := fields[k.Value]
			if !ok {
				if len(fields) == 0 {
					return &FieldError{Path: child, Line: k.Line, Msg: fmt.Sprintf("unknown field: %s takes no fields (write %s: {})", pathOr(path), lastName(path))}
				}
				return &FieldError{Path: child, Line: k.Line, Msg: fmt.Sprintf("unknown field (known: %s)", knownList(t))}
			}
			if seen[k.Value] {
				return &FieldError{Path: child, Line: k.Line, Msg: "field given twice"}
			}
			seen[k.Value] = true
			if err := walk(v, f.Type, child, lines); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yamlv3.SequenceNode {
			return fail("want a list, got " + describe(n))
		}
		for i, c := range n.Content {
			if err := walk(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), lines); err != nil {
				return err
			}
		}
	case reflect.String:
		if n.Kind != yamlv3.ScalarNode {
			return fail("want a string, got " + describe(n))
		}
	case reflect.Bool:
		if n.Kind != yamlv3.ScalarNode || n.Tag != "!!bool" {
			return fail("want true or false, got " + describe(n))
		}
	case reflect.Int, reflect.Int64, reflect.Uint32, reflect.Uint64:
		if n.Kind != yamlv3.ScalarNode || n.Tag != "!!int" {
			return fail("want an integer, got " + describe(n))
		}
		bits := t.Bits()
		var err error
		if t.Kind() == reflect.Uint32 || t.Kind() == reflect.Uint64 {
			_, err = strconv.ParseUint(n.Value, 0, bits)
		} else {
			_, err = strconv.ParseInt(n.Value, 0, bits)
		}
		if err != nil {
			return fail(fmt.Sprintf("integer %s out of range for this field", clip(n.Value, 40)))
		}
	case reflect.Float64:
		if n.Kind != yamlv3.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
			return fail("want a number, got " + describe(n))
		}
		var v float64
		if err := n.Decode(&v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return fail(fmt.Sprintf("%s: want a finite number", clip(n.Value, 40)))
		}
	}
	return nil
}

func pathOr(p string) string {
	if p == "" {
		return "(top level)"
	}
	return p
}

func joinPath(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// describe names what a node holds, for messages.
func describe(n *yamlv3.Node) string {
	switch n.Kind {
	case yamlv3.MappingNode:
		return "a mapping"
	case yamlv3.SequenceNode:
		return "a list"
	}
	switch n.Tag {
	case "!!str":
		return "string " + quote(n.Value)
	case "!!int", "!!float":
		return "number " + clip(n.Value, 40)
	case "!!bool":
		return "boolean " + n.Value
	}
	return clip(n.Value, 40)
}

// quote quotes a value from the spec for a message, cut to 40 characters
// so that a stray binary or minified blob does not fill the screen.
func quote(s string) string {
	r := []rune(s)
	if len(r) <= 40 {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q… (%d bytes)", string(r[:40]), len(s))
}

// clip cuts a message to n bytes on a character boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// lastName is the last field name of a path.
func lastName(path string) string {
	if i := strings.LastIndexAny(path, ".]"); i >= 0 {
		return path[i+1:]
	}
	return path
}

// binaryAt says where data stops being text (its first NUL byte or byte
// of invalid UTF-8, whichever comes first), or "" where it is text
// throughout. With head (data is the start of a longer file), a
// multi-byte character cut at data's end is text.
func binaryAt(data []byte, head bool) string {
	text := data
	if nul := bytes.IndexByte(data, 0); nul >= 0 {
		text = data[:nul]
	}
	off := len(text)
	if !utf8.Valid(text) {
		off = invalidUTF8At(text)
	}
	switch {
	case off == len(data):
		return ""
	case off < len(text) && head && len(data)-off < utf8.UTFMax && !utf8.FullRune(data[off:]):
		return "" // a character cut where the head ends
	}
	return fmt.Sprintf("not a text file (binary data at byte offset %d): a workload spec is YAML or JSON text", off)
}

// invalidUTF8At finds the first byte of b that is not valid UTF-8
// (len(b) if there is none).
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}

type fieldInfo struct{ Type reflect.Type }

// jsonFields maps a struct's JSON names to its fields.
func jsonFields(t reflect.Type) map[string]fieldInfo {
	m := map[string]fieldInfo{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		m[name] = fieldInfo{Type: f.Type}
	}
	return m
}

func knownList(t reflect.Type) string {
	var names []string
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return strings.Join(names, ", ")
}
