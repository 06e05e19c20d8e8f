package irvm

import (
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
)

// mergeBase merges a virtual document b into the base document a at the
// same path, as OPA's Wasm runtime does: objects under one key merge,
// otherwise the base document's value stays.
func mergeBase(a, b ast.Object) ast.Object {
	out, _ := a.MergeWith(b, func(x, y *ast.Term) (*ast.Term, bool) {
		xo, okX := x.Value.(ast.Object)
		yo, okY := y.Value.(ast.Object)
		if okX && okY {
			return ast.NewTerm(mergeBase(xo, yo)), false
		}
		return x, false
	})
	return out
}

// equal is ast.Compare(a, b) == 0, with the common cases first: a string
// equals only a string, a boolean only a boolean.
func equal(a, b *ast.Term) bool {
	if a == b {
		return true
	}
	switch x := a.Value.(type) {
	case ast.String:
		y, ok := b.Value.(ast.String)
		return ok && x == y
	case ast.Boolean:
		y, ok := b.Value.(ast.Boolean)
		return ok && x == y
	}
	return ast.Compare(a.Value, b.Value) == 0
}

// dot is a lookup in src, or through the source in what a stand-in
// stands for.
func (v *vm) dot(src, key *ast.Term) *ast.Term {
	if src != nil && key != nil {
		if s, ok := src.Value.(stand); ok {
			return v.fromStand(s, key)
		}
	}
	return dot(src, key)
}

func dot(src, key *ast.Term) *ast.Term {
	if src == nil || key == nil {
		return nil
	}
	switch x := src.Value.(type) {
	case ast.Object:
		return x.Get(key)
	case *ast.Array:
		n, ok := key.Value.(ast.Number)
		if !ok {
			return nil
		}
		i, ok := n.Int()
		if !ok || i < 0 || i >= x.Len() {
			return nil
		}
		return x.Elem(i)
	case ast.Set:
		if x.Contains(key) {
			return key
		}
	}
	return nil
}

func length(t *ast.Term) (int, bool) {
	if t == nil {
		return 0, false
	}
	switch x := t.Value.(type) {
	case *ast.Array:
		return x.Len(), true
	case ast.Object:
		return x.Len(), true
	case ast.Set:
		return x.Len(), true
	case ast.String:
		return utf8.RuneCountInString(string(x)), true
	}
	return 0, false
}

// value returns t's value as a T, if t is defined and holds one.
func value[T ast.Value](t *ast.Term) (T, bool) {
	var zero T
	if t == nil {
		return zero, false
	}
	x, ok := t.Value.(T)
	return x, ok
}
