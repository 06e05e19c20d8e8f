package irvm

import "github.com/open-policy-agent/opa/v1/ast"

// InputSource supplies the input document part by part. A program that
// needs only part of its input (Input is not nil) asks a source for the
// values it reads and never builds the objects on the way to them; a
// source answers for the document it stands for as if it were built
// whole.
type InputSource interface {
	// Value returns the value at path, built whole; nil if there is none.
	// The empty path is the whole document.
	Value(path []string) *ast.Term
	// Has says whether there is a value at path.
	Has(path []string) bool
}

// fromStand looks up key in the value a stand-in stands for: the source
// is asked for that one field. A key that is not a string is no field
// name: the value is an array (input.process.cmdline[0]), a set, or an
// object with keys of other types, so it is asked for whole and looked
// into.
func (v *vm) fromStand(s stand, key *ast.Term) *ast.Term {
	if v.source == nil {
		return nil
	}
	k, ok := key.Value.(ast.String)
	if !ok {
		return dot(v.source.Value(s.path), key)
	}
	path := make([]string, len(s.path)+1)
	copy(path, s.path)
	path[len(s.path)] = string(k)
	return v.source.Value(path)
}

// inputPath is how an evaluation on an InputSource gets the value at one
// path of the input.
type inputPath struct {
	path []string
	// whole: the value is read as a value, so it is asked for; otherwise
	// only looked into, so the local holds a stand-in (placeholder) that
	// only further lookups by path ever see.
	whole       bool
	placeholder *ast.Term
}

// stand is the value of a placeholder. The compiler's analysis
// guarantees that it never reaches a built-in, a comparison or a result;
// its String says what it stands for, should that ever be wrong.
type stand struct{ path []string }

func (s stand) Compare(other ast.Value) int {
	if o, ok := other.(stand); ok && len(o.path) == len(s.path) {
		for i := range s.path {
			if s.path[i] != o.path[i] {
				return 1
			}
		}
		return 0
	}
	return 1
}
func (stand) Find(ast.Ref) (ast.Value, error) { return nil, errStand }
func (s stand) Hash() int                     { return len(s.path) }
func (stand) IsGround() bool                  { return true }
func (s stand) String() string                { return "<input." + join(s.path) + " stand-in>" }
func (s stand) StringLength() int             { return len(s.String()) }

var errStand = &Error{Code: "eval_internal_error", Message: "an input stand-in was read as a value"}

func join(path []string) string {
	out := ""
	for i, p := range path {
		if i > 0 {
			out += "."
		}
		out += p
	}
	return out
}

// inputPaths prepares, for every path slot under input, how a source is
// asked for it; nil when the program needs the whole input.
func (c *compiler) inputPaths() []*inputPath {
	if c.needs == nil || c.needs.Whole {
		return nil
	}
	out := make([]*inputPath, c.prog.npaths)
	var path func(id int) []string
	path = func(id int) []string {
		if id == pathInput {
			return nil
		}
		k := c.pathOf[id-2]
		return append(append([]string(nil), path(k.parent)...), k.key)
	}
	for id := range out {
		if id == pathData {
			continue
		}
		if id >= 2 && !c.underInput(id) {
			continue
		}
		p := path(id)
		ip := &inputPath{path: p, whole: c.readWhole(id)}
		if !ip.whole {
			ip.placeholder = ast.NewTerm(stand{p})
		}
		out[id] = ip
	}
	return out
}

// readWhole says whether the value at path id, or at a path above it, is
// read as a value.
func (c *compiler) readWhole(id int) bool {
	for {
		if c.wholeRead[id] {
			return true
		}
		if id < 2 {
			return false
		}
		id = c.pathOf[id-2].parent
	}
}

func (c *compiler) underInput(id int) bool {
	for id >= 2 {
		id = c.pathOf[id-2].parent
	}
	return id == pathInput
}
