package irvm

import (
	"math/rand/v2"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// TestNativesMatchOPA holds every native built-in to OPA's own
// implementation on generated arguments: where the native answers, the
// answer must be OPA's; where OPA fails, the native must decline.
func TestNativesMatchOPA(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var gen func(depth int) *ast.Term
	gen = func(depth int) *ast.Term {
		switch n := r.IntN(7); {
		case n < 2:
			return ast.StringTerm([]string{"", "a", "ab", "ba", "abc", "b"}[r.IntN(6)])
		case n == 2:
			return ast.IntNumberTerm(r.IntN(3))
		case n == 3:
			return ast.BooleanTerm(r.IntN(2) == 0)
		case n == 4 && depth > 0:
			return ast.ArrayTerm(gen(depth-1), gen(depth-1))
		default:
			if depth == 0 {
				return ast.NullTerm()
			}
			obj := ast.NewObject()
			for range r.IntN(4) {
				obj.Insert(ast.StringTerm([]string{"x", "y", "z", "w"}[r.IntN(4)]), gen(depth-1))
			}
			return ast.NewTerm(obj)
		}
	}
	for name, native := range natives {
		f := topdown.GetBuiltin(name)
		answered := 0
		for range 3000 {
			args := []*ast.Term{gen(3), gen(3)}
			var want *ast.Term
			err := f(topdown.BuiltinContext{}, args, func(t *ast.Term) error { want = t; return nil })
			got, ok := native(args)
			switch {
			case err != nil && ok:
				t.Fatalf("%s%v: OPA fails (%v), native answers %v", name, args, err, got)
			case ok && !got.Equal(want):
				t.Fatalf("%s%v: OPA %v, native %v", name, args, want, got)
			case ok:
				answered++
			}
		}
		if answered < 200 {
			t.Fatalf("%s: the native answered only %d of 3000 calls", name, answered)
		}
		t.Logf("%s: %d of 3000 answered natively", name, answered)
	}
}

// TestMemoKeepsResults checks that a remembered call gives the result of
// the first call for equal arguments, and nothing for other arguments.
func TestMemoKeepsResults(t *testing.T) {
	m := &memo{}
	a := []*ast.Term{ast.MustParseTerm(`{"a": 1, "b": {"c": 2}}`), ast.MustParseTerm(`{"b": {"d": 3}}`)}
	out := ast.MustParseTerm(`{"a": 1, "b": {"c": 2, "d": 3}}`)
	m.put(a, out)
	equalArgs := []*ast.Term{ast.MustParseTerm(`{"b": {"c": 2}, "a": 1}`), ast.MustParseTerm(`{"b": {"d": 3}}`)}
	if got := m.get(equalArgs); got != out {
		t.Fatalf("equal arguments: %v", got)
	}
	if got := m.get([]*ast.Term{a[0], ast.MustParseTerm(`{"b": {"d": 4}}`)}); got != nil {
		t.Fatalf("other arguments: %v", got)
	}
	for i := range memoSize + 5 {
		m.put([]*ast.Term{ast.IntNumberTerm(i)}, ast.IntNumberTerm(i))
	}
	if n := len(*m.entries.Load()); n != memoSize {
		t.Fatalf("%d entries kept, want at most %d", n, memoSize)
	}
	if got := m.get(equalArgs); got != out {
		t.Fatal("an entry was lost when the memo filled")
	}
}
