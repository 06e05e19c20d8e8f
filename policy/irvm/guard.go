package irvm

import (
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
)

// A policy of many rules compiles to a function of many top-level blocks,
// one per rule body, most of which start by comparing one input field
// with a constant (input.process.comm == "job-7") and fail for all but a
// few inputs. Such a block has a guard: before running it, the field is
// compared with the constant (the field's value is cached for the
// evaluation), and when they differ the block is skipped. That is exact
// when nothing the block does before the comparison is seen afterwards:
// its first statements only reset locals and look up input paths, and no
// later block reads those locals before writing them.
type guard struct {
	path int       // the input path compared
	want *ast.Term // the constant it must equal
}

// guardOf returns the guard of a compiled top-level block, or nil. The
// block must open with resets and input lookups only, then compare a
// local known to hold an input path with a constant.
func guardOf(b *block, inputs func(path int) bool) (*guard, []int) {
	var writes []int
	for _, in := range b.instrs {
		switch in.op {
		case opResetLocal:
			writes = append(writes, in.target)
		case opDot:
			if in.path < 0 || !inputs(in.path) {
				return nil, nil
			}
			writes = append(writes, in.target)
		case opEqual:
			if in.guard < 0 {
				return nil, nil
			}
			want := in.b.term
			if in.a.local < 0 {
				want = in.a.term
			}
			return &guard{path: in.guard, want: want}, writes
		default:
			return nil, nil
		}
	}
	return nil, nil
}

// guardIndex groups a function's guards by the path they compare, so that
// the path is read once per call and the blocks whose constant it holds
// are found by one map lookup.
type guardIndex struct {
	unguarded []int // blocks that always run, in order
	groups    []guardGroup
}

type guardGroup struct {
	path    int
	strings map[string][]int // blocks by the string they want
	others  []int            // blocks wanting something else (compared one by one)
}

func (fn *function) indexGuards() {
	if fn.guards == nil {
		return
	}
	x := &guardIndex{}
	byPath := map[int]int{}
	for i, g := range fn.guards {
		if g == nil {
			x.unguarded = append(x.unguarded, i)
			continue
		}
		gi, ok := byPath[g.path]
		if !ok {
			gi = len(x.groups)
			byPath[g.path] = gi
			x.groups = append(x.groups, guardGroup{path: g.path, strings: map[string][]int{}})
		}
		grp := &x.groups[gi]
		if s, ok := g.want.Value.(ast.String); ok {
			grp.strings[string(s)] = append(grp.strings[string(s)], i)
		} else {
			grp.others = append(grp.others, i)
		}
	}
	fn.byGuard = x
}

// guards finds the blocks of fn that can be skipped on their guard.
func (c *compiler) guards(fn *function, irblocks []*ir.Block) {
	// live[i]: the locals block i may read before writing them.
	live := make([]map[int]bool, len(irblocks))
	for i, b := range irblocks {
		live[i] = liveIn(b)
	}
	for i, b := range fn.blocks {
		g, writes := guardOf(b, c.underInput)
		if g == nil {
			continue
		}
		seen := false
		for _, l := range writes {
			if l == fn.ret || slices.Contains(fn.params, l) {
				seen = true
			}
			for _, later := range live[i+1:] {
				seen = seen || later[l]
			}
		}
		if !seen {
			if fn.guards == nil {
				fn.guards = make([]*guard, len(fn.blocks))
			}
			fn.guards[i] = g
		}
	}
	fn.indexGuards()
}

// liveIn returns the locals b may read before it has surely written them:
// a write inside a nested block may not happen, a read anywhere counts.
func liveIn(b *ir.Block) map[int]bool {
	live, written := map[int]bool{}, map[int]bool{}
	for _, s := range b.Stmts {
		for _, l := range stmtReads(s) {
			if !written[l] {
				live[l] = true
			}
		}
		switch s.(type) {
		case *ir.BlockStmt, *ir.NotStmt, *ir.ScanStmt, *ir.WithStmt:
			continue // its writes may not happen
		}
		w := map[int]int{}
		countWrites(&ir.Block{Stmts: []ir.Stmt{s}}, w)
		for l := range w {
			written[l] = true
		}
	}
	return live
}

// stmtReads lists the locals s reads, nested blocks included.
func stmtReads(s ir.Stmt) []int {
	var out []int
	ops := func(os ...ir.Operand) {
		for _, o := range os {
			if l, ok := localOf(o); ok {
				out = append(out, int(l))
			}
		}
	}
	locals := func(ls ...ir.Local) {
		for _, l := range ls {
			out = append(out, int(l))
		}
	}
	nested := func(bs ...*ir.Block) {
		for _, b := range bs {
			for _, s := range b.Stmts {
				out = append(out, stmtReads(s)...)
			}
		}
	}
	switch s := s.(type) {
	case *ir.ReturnLocalStmt:
		locals(s.Source)
	case *ir.CallStmt:
		ops(s.Args...)
	case *ir.CallDynamicStmt:
		locals(s.Args...)
		ops(s.Path...)
	case *ir.BlockStmt:
		nested(s.Blocks...)
	case *ir.DotStmt:
		ops(s.Source, s.Key)
	case *ir.LenStmt:
		ops(s.Source)
	case *ir.ScanStmt:
		locals(s.Source)
		nested(s.Block)
	case *ir.NotStmt:
		nested(s.Block)
	case *ir.AssignVarStmt:
		ops(s.Source)
	case *ir.AssignVarOnceStmt:
		ops(s.Source)
		locals(s.Target) // compared with what it holds
	case *ir.EqualStmt:
		ops(s.A, s.B)
	case *ir.NotEqualStmt:
		ops(s.A, s.B)
	case *ir.IsArrayStmt:
		ops(s.Source)
	case *ir.IsObjectStmt:
		ops(s.Source)
	case *ir.IsSetStmt:
		ops(s.Source)
	case *ir.IsDefinedStmt:
		locals(s.Source)
	case *ir.IsUndefinedStmt:
		locals(s.Source)
	case *ir.ArrayAppendStmt:
		ops(s.Value)
		locals(s.Array)
	case *ir.ObjectInsertStmt:
		ops(s.Key, s.Value)
		locals(s.Object)
	case *ir.ObjectInsertOnceStmt:
		ops(s.Key, s.Value)
		locals(s.Object)
	case *ir.ObjectMergeStmt:
		locals(s.A, s.B)
	case *ir.SetAddStmt:
		ops(s.Value)
		locals(s.Set)
	case *ir.ResultSetAddStmt:
		locals(s.Value)
	case *ir.WithStmt:
		locals(s.Local)
		ops(s.Value)
		nested(s.Block)
	}
	return out
}
