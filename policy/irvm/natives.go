package irvm

import (
	"strings"

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
