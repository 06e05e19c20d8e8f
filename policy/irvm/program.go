// Package irvm evaluates Rego policies compiled to OPA's intermediate
// representation (package github.com/open-policy-agent/opa/v1/ir, documented
// at https://www.openpolicyagent.org/docs/ir).
//
// OPA's own evaluator (topdown) walks the policy's syntax tree, unifying
// terms through bindings; a classification through it costs hundreds of
// allocations. The IR is what OPA's planner makes of the same policy for
// its Wasm compiler: blocks of statements over numbered locals. This
// package compiles that plan once into resolved instructions and runs them
// over OPA's own value types, calling OPA's own built-in function
// implementations, so values and built-ins behave exactly as in topdown
// while an evaluation allocates little. Its control flow follows OPA's
// Wasm compiler statement by statement and is checked against OPA's
// conformance suite.
//
// A Program is safe for concurrent use.
package irvm

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// ErrUnsupported is wrapped by Compile's error when the plan uses a
// statement or a built-in function this interpreter does not run; the
// caller then evaluates the policy with OPA's topdown instead.
var ErrUnsupported = errors.New("not supported by the IR interpreter")

// Program is a compiled IR policy.
type Program struct {
	npaths int          // number of distinct input and data paths with a cache slot
	input  *Need        // the part of the input the plans can see; nil: all
	inputs []*inputPath // by path slot, for evaluations on an InputSource; nil: all
	// parent and key spell each path slot from slot 2 on: the value at it
	// is the parent's value at key.
	parent []int
	key    []*ast.Term
	funcs  []*function
	plans  map[string]*function // a plan runs like a function of (input, data)
	names  []string
	files  []string
	dyn    *dynNode // Func.Path tree for CallDynamicStmt
}

// function is one planned function or plan.
type function struct {
	name    string
	index   int // in Program.funcs; -1 for a plan
	params  []int
	ret     int
	blocks  []*block
	guards  []*guard // by block: the guard to skip it on, if any; nil: none
	byGuard *guardIndex
	nlocals int
	// memo: the function takes only (input, data), so its value is fixed
	// for one evaluation (as in OPA's Wasm runtime).
	memo bool
	// constant: a memo function that reads no input, directly or through
	// what it calls, and calls nothing non-deterministic or printing: its
	// value depends on data alone and is kept across evaluations.
	constant bool
	slot     atomic.Pointer[constValue]
	// Facts gathered while compiling, for the constant analysis.
	readsInput bool
	impure     bool
	callees    []*function
}

// constValue is a constant function's value for one data document.
type constValue struct {
	data *ast.Term
	val  *ast.Term
}

type dynNode struct {
	children map[string]*dynNode
	fn       *function
}

type block struct{ instrs []instr }

// opcode is an instruction's operation: one per IR statement type.
type opcode uint8

const (
	opNop opcode = iota
	opCall
	opBuiltin
	opCallDynamic
	opDot
	opAssignVar
	opAssignVarOnce
	opResetLocal
	opIsDefined
	opIsUndefined
	opEqual
	opNotEqual
	opBlock
	opBreak
	opReturn
	opNot
	opScan
	opMakeObject
	opMakeArray
	opMakeSet
	opConst // MakeNull, MakeNumberInt, MakeNumberRef, AssignInt
	opLen
	opIsArray
	opIsObject
	opIsSet
	opArrayAppend
	opObjectInsert
	opObjectInsertOnce
	opObjectMerge
	opSetAdd
	opResultSetAdd
	opWith
)

// operand is a resolved IR operand: a local's slot, or a constant.
type operand struct {
	local int // -1: constant
	term  *ast.Term
}

// instr is one compiled statement. Which fields are used depends on op.
type instr struct {
	op      opcode
	a, b, c operand // sources; c is ObjectInsert's value
	target  int     // destination local (a second one, d, for Scan)
	d       int
	n       int // capacity, break index, or arity
	path    int // opDot: the cache slot of the path it reads, or -1
	guard   int // opEqual of a local at an input path with a constant: the path; else -1
	blocks  []*block
	fn      *function
	bi      *builtin
	args    []operand
	keys    []*ast.Term // WithStmt upsert path, CallDynamic path operands
	loc     *ir.Location
}

// builtin is a resolved call of one of OPA's built-in functions.
type builtin struct {
	name      string
	f         topdown.BuiltinFunc
	hasResult bool
	loc       *ast.Location
	// native, for a few built-ins rules use on every evaluation, answers
	// without OPA's calling convention; ok false: call f.
	native func(args []*ast.Term) (result *ast.Term, ok bool)
	// memo, for a memoized built-in, remembers this call site's calls.
	memo *memo
}

// nativeOf returns the direct implementation of a built-in, if it has
// one (see natives.go).
func nativeOf(name string) func([]*ast.Term) (*ast.Term, bool) {
	return natives[name]
}

// Compile checks p and compiles it. Every statement, operand, called
// function and built-in is resolved here, so evaluation never meets an
// unknown. A plan that uses what the interpreter does not run yields an
// error wrapping ErrUnsupported.
func Compile(p *ir.Policy) (*Program, error) {
	if p == nil || p.Static == nil || p.Plans == nil {
		return nil, errors.New("irvm: empty plan")
	}
	c := &compiler{prog: &Program{plans: map[string]*function{}, dyn: &dynNode{}}, byName: map[string]*function{},
		pathIDs: map[pathKey]int{}, needs: &Need{}, wholeRead: map[int]bool{}}
	c.prog.npaths = 2 // input and data
	for _, s := range p.Static.Strings {
		c.strings = append(c.strings, ast.StringTerm(s.Value))
	}
	for _, f := range p.Static.Files {
		c.prog.files = append(c.prog.files, f.Value)
	}
	var irfuncs []*ir.Func
	if p.Funcs != nil {
		irfuncs = p.Funcs.Funcs
	}
	// Declare every function first: calls may go forward.
	for i, f := range irfuncs {
		if len(f.Params) < 2 {
			return nil, fmt.Errorf("irvm: function %s: %d parameters, want at least input and data", f.Name, len(f.Params))
		}
		fn := &function{name: f.Name, index: i, ret: int(f.Return), memo: len(f.Params) == 2}
		for _, l := range f.Params {
			fn.params = append(fn.params, int(l))
		}
		c.prog.funcs = append(c.prog.funcs, fn)
		c.byName[f.Name] = fn
		if len(f.Path) > 0 {
			c.prog.dyn.insert(f.Path, fn)
		}
	}
	for i, f := range irfuncs {
		if err := c.function(c.prog.funcs[i], f.Blocks); err != nil {
			return nil, err
		}
	}
	for _, pl := range p.Plans.Plans {
		fn := &function{name: pl.Name, index: -1, params: []int{int(ir.Input), int(ir.Data)}, ret: -1}
		if err := c.function(fn, pl.Blocks); err != nil {
			return nil, err
		}
		c.prog.plans[pl.Name] = fn
		c.prog.names = append(c.prog.names, pl.Name)
	}
	markConstants(c.prog.funcs)
	c.prog.npaths = len(c.pathIDs) + 2
	for _, k := range c.pathOf {
		c.prog.parent = append(c.prog.parent, k.parent)
		c.prog.key = append(c.prog.key, ast.StringTerm(k.key))
	}
	if c.needs != nil && !c.needs.Whole {
		c.prog.input = c.needs
		c.prog.inputs = c.inputPaths()
	}
	return c.prog, nil
}

// Plans returns the names of the plans the program can run.
func (p *Program) Plans() []string { return slices.Clone(p.names) }

func (n *dynNode) insert(path []string, fn *function) {
	for _, seg := range path {
		if n.children == nil {
			n.children = map[string]*dynNode{}
		}
		c := n.children[seg]
		if c == nil {
			c = &dynNode{}
			n.children[seg] = c
		}
		n = c
	}
	n.fn = fn
}

// conflict is the error message of two values for one rule, or one
// function call, as topdown words it.
func (fn *function) conflict() string {
	name := strings.TrimPrefix(fn.name, "g0.")
	switch {
	case fn.index < 0:
		return "complete rules must not produce multiple outputs"
	case len(fn.params) > 2:
		return "function " + name + " produced conflicting values for the same inputs"
	}
	return "rule " + name + " produced conflicting values"
}

// markConstants finds the functions whose value depends on data alone.
// The call graph is acyclic, so repeating until nothing changes settles.
func markConstants(fns []*function) {
	for _, fn := range fns {
		fn.constant = fn.memo && !fn.readsInput && !fn.impure
	}
	for changed := true; changed; {
		changed = false
		for _, fn := range fns {
			if !fn.constant {
				continue
			}
			for _, g := range fn.callees {
				if !g.constant {
					fn.constant, changed = false, true
					break
				}
			}
		}
	}
}

// Need describes the part of the input document a program can see: the
// value at a path is needed whole, or only the listed fields of it.
type Need struct {
	Whole  bool
	Fields map[string]*Need
}

// Input returns the part of the input document the program's plans can
// see, or nil if they may see all of it. An evaluation on an input that
// keeps just this part, dropping every other field of the objects on the
// way, returns what it returns on the whole input.
func (p *Program) Input() *Need { return p.input }
