package schema

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Document reads a JSON-like value for the validator and for decoders of
// validated documents: decoded JSON (any, as encoding/json with UseNumber
// or ast.JSON make it; JSONDoc) or OPA's AST (ast.Value, as a compiled
// plan returns it; ASTDoc). Reading the AST directly spares every decision
// a conversion; the AST is read as ast.JSON would convert it (sets as
// arrays in sorted order, non-string keys as their JSON text).
type Document[V any] interface {
	Kind(v V) Kind
	// Field returns an object's field.
	Field(v V, key string) (V, bool)
	// Size is an object's number of fields or an array's of items.
	Size(v V) int
	// Keys returns an object's keys, sorted.
	Keys(v V) []string
	// Item returns an array's i-th item.
	Item(v V, i int) V
	// Str returns a string; Num a number; Bool a boolean.
	Str(v V) string
	Num(v V) (float64, bool)
	Bool(v V) bool
	// Text renders v, for messages and to tell array items apart.
	Text(v V) string
}

// Kind is the JSON type of a value.
type Kind uint8

// Kinds of value. KindUnknown is a value not known before evaluation
// (Unknown); KindOther one that is not JSON.
const (
	KindOther Kind = iota
	KindUnknown
	KindObject
	KindArray
	KindString
	KindNumber
	KindBool
	KindNull
)

// JSONDoc reads decoded JSON.
type JSONDoc struct{}

// Kind implements Document.
func (JSONDoc) Kind(v any) Kind {
	switch v.(type) {
	case Unknown:
		return KindUnknown
	case map[string]any:
		return KindObject
	case []any:
		return KindArray
	case string:
		return KindString
	case bool:
		return KindBool
	case nil:
		return KindNull
	}
	if _, ok := number(v); ok {
		return KindNumber
	}
	return KindOther
}

// Field implements Document.
func (JSONDoc) Field(v any, key string) (any, bool) {
	x, ok := v.(map[string]any)[key]
	return x, ok
}

// Size implements Document.
func (JSONDoc) Size(v any) int {
	switch x := v.(type) {
	case map[string]any:
		return len(x)
	case []any:
		return len(x)
	}
	return 0
}

// Keys implements Document.
func (JSONDoc) Keys(v any) []string {
	m := v.(map[string]any)
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Item implements Document.
func (JSONDoc) Item(v any, i int) any { return v.([]any)[i] }

// Str implements Document.
func (JSONDoc) Str(v any) string { s, _ := v.(string); return s }

// Num implements Document.
func (JSONDoc) Num(v any) (float64, bool) { return number(v) }

// Bool implements Document.
func (JSONDoc) Bool(v any) bool { b, _ := v.(bool); return b }

// Text implements Document.
func (JSONDoc) Text(v any) string { return fmt.Sprint(v) }

// ASTDoc reads OPA's AST. It holds the field names it looks up (the
// schemas' property names) as terms, built once by Load: a lookup then
// allocates nothing. The zero ASTDoc works, allocating per lookup.
type ASTDoc struct{ names map[string]*ast.Term }

// Kind implements Document.
func (ASTDoc) Kind(v ast.Value) Kind {
	switch v.(type) {
	case ast.Object:
		return KindObject
	case *ast.Array, ast.Set:
		return KindArray
	case ast.String:
		return KindString
	case ast.Number:
		return KindNumber
	case ast.Boolean:
		return KindBool
	case ast.Null:
		return KindNull
	}
	return KindOther
}

// Field implements Document.
func (d ASTDoc) Field(v ast.Value, key string) (ast.Value, bool) {
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

// Size implements Document.
func (ASTDoc) Size(v ast.Value) int {
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

// Keys implements Document.
func (ASTDoc) Keys(v ast.Value) []string {
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

// Item implements Document.
func (ASTDoc) Item(v ast.Value, i int) ast.Value {
	switch x := v.(type) {
	case *ast.Array:
		return x.Elem(i).Value
	case ast.Set:
		return x.Sorted().Elem(i).Value
	}
	return nil
}

// Str implements Document.
func (ASTDoc) Str(v ast.Value) string { s, _ := v.(ast.String); return string(s) }

// Num implements Document.
func (ASTDoc) Num(v ast.Value) (float64, bool) {
	n, ok := v.(ast.Number)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(n), 64)
	return f, err == nil
}

// Bool implements Document.
func (ASTDoc) Bool(v ast.Value) bool { b, _ := v.(ast.Boolean); return bool(b) }

// Text implements Document.
func (ASTDoc) Text(v ast.Value) string {
	if s, ok := v.(ast.String); ok {
		return string(s) // as fmt.Sprint prints a decoded string
	}
	return v.String()
}
