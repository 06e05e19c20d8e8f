package irvm

import (
	"slices"
	"strings"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
)

// natives answer a few built-ins that policies call on every evaluation
// directly, for the argument types they are meant for, giving exactly what
// OPA's implementation gives. For any other arguments (and so for every
// error) they decline, and OPA's implementation is called.
var natives = map[string]func(args []*ast.Term) (*ast.Term, bool){
	"startswith": stringTest(strings.HasPrefix),
	"endswith":   stringTest(strings.HasSuffix),
	"contains":   stringTest(strings.Contains),
}

func stringTest(test func(a, b string) bool) func([]*ast.Term) (*ast.Term, bool) {
	return func(args []*ast.Term) (*ast.Term, bool) {
		if len(args) != 2 {
			return nil, false
		}
		a, okA := args[0].Value.(ast.String)
		b, okB := args[1].Value.(ast.String)
		if !okA || !okB {
			return nil, false
		}
		return ast.InternedTerm(test(string(a), string(b))), true
	}
}

// memoized are built-ins worth remembering across evaluations: pure,
// costly, and called with few distinct arguments (object.union builds
// every decision of the shipped policies from a class template and a few
// fields). A call site keeps up to memoSize argument lists and results.
var memoized = map[string]bool{"object.union": true}

const memoSize = 32

// memo is one call site's remembered calls; entries are immutable and
// replaced whole, so lookups take no lock.
type memo struct {
	entries atomic.Pointer[[]memoEntry]
}

type memoEntry struct {
	args []*ast.Term
	out  *ast.Term
}

func (m *memo) get(args []*ast.Term) *ast.Term {
	es := m.entries.Load()
	if es == nil {
		return nil
	}
	for _, e := range *es {
		if sameArgs(e.args, args) {
			return e.out
		}
	}
	return nil
}

func (m *memo) put(args []*ast.Term, out *ast.Term) {
	old := m.entries.Load()
	var es []memoEntry
	if old != nil {
		if len(*old) >= memoSize {
			return
		}
		es = append(make([]memoEntry, 0, len(*old)+1), *old...)
	}
	es = append(es, memoEntry{args: slices.Clone(args), out: out})
	m.entries.CompareAndSwap(old, &es)
}

func sameArgs(a, b []*ast.Term) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && (a[i].Hash() != b[i].Hash() || ast.Compare(a[i].Value, b[i].Value) != 0) {
			return false
		}
	}
	return true
}
