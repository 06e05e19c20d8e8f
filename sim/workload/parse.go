package workload

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
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
}

// Load reads, checks and validates a spec file.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read workload: %w", err)
	}
	return Parse(data, path)
}

// Parse checks and validates a spec (YAML or JSON). name is used in errors
// and to resolve relative file names.
func Parse(data []byte, name string) (*File, error) {
	if len(data) > maxSpecBytes {
		return nil, &FieldError{File: name, Msg: fmt.Sprintf("spec is %d bytes, more than %d", len(data), maxSpecBytes)}
	}
	var root yamlv3.Node
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		return nil, &FieldError{File: name, Msg: "not valid YAML or JSON: " + strings.TrimPrefix(err.Error(), "yaml: ")}
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
	f := &File{Path: name, Dir: filepath.Dir(name)}
	if err := yaml.UnmarshalStrict(data, &f.Spec); err != nil {
		return nil, &FieldError{File: name, Msg: err.Error()}
	}
	if f.Spec.Name == "" && name != "" {
		f.Spec.Name = strings.TrimSuffix(filepath.Base(name), filepath.Ext(name))
	}
	if err := f.Spec.validate(); err != nil {
		err.File = name
		err.Line = lineOf(lines, err.Path)
		return nil, err
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
			child := joinPath(path, k.Value)
			f, ok := fields[k.Value]
			if !ok {
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
			return fail(fmt.Sprintf("integer %s out of range for this field", n.Value))
		}
	case reflect.Float64:
		if n.Kind != yamlv3.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
			return fail("want a number, got " + describe(n))
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
		return fmt.Sprintf("string %q", n.Value)
	case "!!int", "!!float":
		return "number " + n.Value
	case "!!bool":
		return "boolean " + n.Value
	}
	return n.Value
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
