package policy

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"
)

// The schema validator and the decision decoders read a JSON-like value
// through a document: decoded JSON (any, as encoding/json with UseNumber
// or ast.JSON make it) or OPA's AST (ast.Value, as the compiled plan
// returns it). Reading the AST directly spares every decision a
// conversion; the AST is read as ast.JSON would convert it (sets as
// arrays in sorted order, non-string keys as their JSON text).
type document[V any] interface {
	kind(v V) kind
	// field returns an object's field.
	field(v V, key string) (V, bool)
	// size is an object's number of fields or an array's of items.
	size(v V) int
	// keys returns an object's keys, sorted.
	keys(v V) []string
	// item returns an array's i-th item.
	item(v V, i int) V
	str(v V) string
	num(v V) (float64, bool)
	boolean(v V) bool
	// text renders v, for messages and to tell array items apart.
	text(v V) string
}

type kind uint8

const (
	kindOther kind = iota
	kindUnknown
	kindObject
	kindArray
	kindString
	kindNumber
	kindBool
	kindNull
)

// jsonDoc reads decoded JSON.
type jsonDoc struct{}

func (jsonDoc) kind(v any) kind {
	switch v.(type) {
	case unknownValue:
		return kindUnknown
	case map[string]any:
		return kindObject
	case []any:
		return kindArray
	case string:
		return kindString
	case bool:
		return kindBool
	case nil:
		return kindNull
	}
	if _, ok := number(v); ok {
		return kindNumber
	}
	return kindOther
}

func (jsonDoc) field(v any, key string) (any, bool) {
	x, ok := v.(map[string]any)[key]
	return x, ok
}

func (jsonDoc) size(v any) int {
	switch x := v.(type) {
	case map[string]any:
		return len(x)
	case []any:
		return len(x)
	}
	return 0
}

func (jsonDoc) keys(v any) []string {
	m := v.(map[string]any)
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (jsonDoc) item(v any, i int) any     { return v.([]any)[i] }
func (jsonDoc) str(v any) string          { s, _ := v.(string); return s }
func (jsonDoc) num(v any) (float64, bool) { return number(v) }
func (jsonDoc) boolean(v any) bool        { b, _ := v.(bool); return b }
func (jsonDoc) text(v any) string         { return fmt.Sprint(v) }

// astDoc reads OPA's AST. names holds the field names it looks up (the
// schemas' property names) as terms, built once: a lookup then allocates
// nothing.
type astDoc struct{ names map[string]*ast.Term }

func (astDoc) kind(v ast.Value) kind {
	switch v.(type) {
	case ast.Object:
		return kindObject
	case *ast.Array, ast.Set:
		return kindArray
	case ast.String:
		return kindString
	case ast.Number:
		return kindNumber
	case ast.Boolean:
		return kindBool
	case ast.Null:
		return kindNull
	}
	return kindOther
}

func (d astDoc) field(v ast.Value, key string) (ast.Value, bool) {
	k := d.names[key]
	if k == nil {
		k = ast.StringTerm(key)
	}
	t := v.(ast.Object).Get(k)
	if t == nil {
		return nil, false
	}
	return t.Value, true
}

func (astDoc) size(v ast.Value) int {
	switch x := v.(type) {
	case ast.Object:
		return x.Len()
	case *ast.Array:
		return x.Len()
	case ast.Set:
		return x.Len()
	}
	return 0
}

func (astDoc) keys(v ast.Value) []string {
	obj := v.(ast.Object)
	out := make([]string, 0, obj.Len())
	obj.Foreach(func(k, _ *ast.Term) {
		if s, ok := k.Value.(ast.String); ok {
			out = append(out, string(s))
			return
		}
		b, err := json.Marshal(ast.MustJSON(k.Value))
		if err != nil {
			b = []byte(k.String())
		}
		out = append(out, string(b))
	})
	sort.Strings(out)
	return out
}

func (astDoc) item(v ast.Value, i int) ast.Value {
	switch x := v.(type) {
	case *ast.Array:
		return x.Elem(i).Value
	case ast.Set:
		return x.Sorted().Elem(i).Value
	}
	return nil
}

func (astDoc) str(v ast.Value) string { s, _ := v.(ast.String); return string(s) }

func (astDoc) num(v ast.Value) (float64, bool) {
	n, ok := v.(ast.Number)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(n), 64)
	return f, err == nil
}

func (astDoc) boolean(v ast.Value) bool { b, _ := v.(ast.Boolean); return bool(b) }

func (astDoc) text(v ast.Value) string {
	if s, ok := v.(ast.String); ok {
		return string(s) // as fmt.Sprint prints a decoded string
	}
	return v.String()
}
