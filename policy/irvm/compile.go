package irvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// compiler turns IR statements into instructions.
type compiler struct {
	prog    *Program
	strings []*ast.Term
	byName  map[string]*function
	fn      *function
	max     int
	// Paths in input and data are numbered by pathIDs; they name the
	// cache slots of lookups and the parts of the input the program needs.
	// flow is what is known of them at the statement being compiled.
	pathIDs map[pathKey]int
	pathOf  []pathKey // by path slot, from slot 2
	flow    flow
	logs    []writeLog // the write logs of the code being compiled, innermost last
	// needs is the part of the input the program can see; nil once it
	// may see all of it. wholeRead holds the paths whose values are read
	// as values (a path only looked up in, by constant or run-time keys,
	// is not).
	needs     *Need
	wholeRead map[int]bool
}

// need returns the node of the input need tree for a path slot, adding
// it; nil for a path in data, or when the whole input is needed.
func (c *compiler) need(id int) *Need {
	if c.needs == nil || c.needs.Whole || id == pathData {
		return nil
	}
	if id == pathInput {
		return c.needs
	}
	k := c.pathOf[id-2]
	parent := c.need(k.parent)
	if parent == nil || parent.Whole {
		return nil
	}
	if parent.Fields == nil {
		parent.Fields = map[string]*Need{}
	}
	n := parent.Fields[k.key]
	if n == nil {
		n = &Need{}
		parent.Fields[k.key] = n
	}
	return n
}

type pathKey struct {
	parent int
	key    string
}

// Cache slots of the roots.
const (
	pathInput = 0
	pathData  = 1
)

func (c *compiler) function(fn *function, blocks []*ir.Block) error {
	c.fn, c.max = fn, int(ir.Data)
	writes := map[int]int{}
	for _, b := range blocks {
		countWrites(b, writes)
	}
	// Input and data are known at the start of the function, unless it
	// replaces them (with).
	start := newFlow()
	if writes[fn.params[0]] == 0 {
		start.must[fn.params[0]], start.may[fn.params[0]] = pathInput, []int{pathInput}
	} else {
		// What is read of the original input cannot be told apart any more.
		c.needs = nil
	}
	if writes[fn.params[1]] == 0 {
		start.must[fn.params[1]], start.may[fn.params[1]] = pathData, []int{pathData}
	}
	for _, l := range fn.params {
		c.see(l)
	}
	c.see(fn.ret)
	// The blocks run in turn; each may see what those before it wrote.
	before := writeLog{}
	for _, b := range blocks {
		c.flow = start.clone()
		c.flow.join(before)
		var cb *block
		w, err := c.logged(func() (err error) { cb, err = c.block(b); return err })
		if err != nil {
			return fmt.Errorf("irvm: %s: %w", fn.name, err)
		}
		before.add(w)
		fn.blocks = append(fn.blocks, cb)
	}
	fn.nlocals = c.max + 1
	c.guards(fn, blocks)
	return nil
}

// see notes a local's use: the frame must hold it.
func (c *compiler) see(l int) {
	if l > c.max {
		c.max = l
	}
}

// local resolves a local that the statement reads.
func (c *compiler) local(l ir.Local) int {
	c.peek(l)
	c.read(int(l))
	return int(l)
}

// peek resolves a local that is read only to look up a constant key in
// it, or to pass the input on to a function: that needs only part of it.
func (c *compiler) peek(l ir.Local) int {
	c.see(int(l))
	if c.fn.index >= 0 && int(l) == c.fn.params[0] {
		c.fn.readsInput = true
	}
	return int(l)
}

// target resolves a local that the statement writes.
func (c *compiler) target(l ir.Local) int {
	c.see(int(l))
	return int(l)
}

func (c *compiler) operand(o ir.Operand) (operand, error) {
	// A plan read from JSON holds pointers; one built in memory, values.
	switch v := o.Value.(type) {
	case ir.Local:
		return operand{local: c.local(v)}, nil
	case *ir.Local:
		return operand{local: c.local(*v)}, nil
	case ir.StringIndex:
		return c.str(int(v))
	case *ir.StringIndex:
		return c.str(int(*v))
	case ir.Bool:
		return operand{local: -1, term: ast.InternedTerm(bool(v))}, nil
	case *ir.Bool:
		return operand{local: -1, term: ast.InternedTerm(bool(*v))}, nil
	}
	return operand{}, fmt.Errorf("operand %T: %w", o.Value, ErrUnsupported)
}

func (c *compiler) str(i int) (operand, error) {
	if i < 0 || i >= len(c.strings) {
		return operand{}, fmt.Errorf("string index %d out of range (%d strings)", i, len(c.strings))
	}
	return operand{local: -1, term: c.strings[i]}, nil
}

func (c *compiler) operands(os ...ir.Operand) ([]operand, error) {
	out := make([]operand, len(os))
	for i, o := range os {
		var err error
		if out[i], err = c.operand(o); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (c *compiler) block(b *ir.Block) (*block, error) {
	if b == nil {
		return nil, errors.New("nil block")
	}
	out := &block{instrs: make([]instr, 0, len(b.Stmts))}
	for _, s := range b.Stmts {
		in, err := c.stmt(s)
		if err != nil {
			return nil, err
		}
		switch in.op {
		case opDot, opBlock, opNot, opScan, opWith:
			// These record their writes themselves.
		default:
			w := map[int]int{}
			countWrites(&ir.Block{Stmts: []ir.Stmt{s}}, w)
			for l := range w {
				c.assign(l, -1)
			}
		}
		if in.op != opDot {
			in.path = -1
		}
		if in.op != opEqual {
			in.guard = -1
		}
		in.loc = s.GetLocation()
		out.instrs = append(out.instrs, in)
	}
	return out, nil
}

// nested compiles the block of a not, scan or with statement. The block
// starts with what holds before the statement (for a loop body, also what
// an earlier pass through the body may have left), and after the
// statement its writes may or may not have happened.
func (c *compiler) nested(b *ir.Block, loop bool, inside func()) ([]*block, error) {
	entry := c.flow.clone()
	var carried writeLog
	if loop {
		// A first pass learns what the body writes; its code is dropped.
		c.flow = entry.clone()
		inside()
		w, err := c.logged(func() error { _, err := c.block(b); return err })
		if err != nil {
			return nil, err
		}
		carried = w
	}
	c.flow = entry.clone()
	c.flow.join(carried)
	inside()
	var nb *block
	w, err := c.logged(func() (err error) { nb, err = c.block(b); return err })
	if err != nil {
		return nil, err
	}
	c.flow = entry
	c.flow.join(carried)
	c.flow.join(w)
	return []*block{nb}, nil
}

// constant makes an instruction that sets target to a fixed value.
func constant(target int, t *ast.Term) instr {
	return instr{op: opConst, target: target, a: operand{local: -1, term: t}}
}

//nolint:gocyclo // one case per IR statement reads best as one switch.
func (c *compiler) stmt(s ir.Stmt) (instr, error) {
	var (
		in  instr
		err error
		ops []operand
	)
	two := func(op opcode, a, b ir.Operand) (instr, error) {
		ops, err := c.operands(a, b)
		if err != nil {
			return instr{}, err
		}
		return instr{op: op, a: ops[0], b: ops[1]}, nil
	}
	one := func(op opcode, a ir.Operand) (instr, error) {
		o, err := c.operand(a)
		return instr{op: op, a: o}, err
	}
	switch s := s.(type) {
	case *ir.CallStmt:
		return c.call(s)
	case *ir.CallDynamicStmt:
		c.fn.impure = true // the callee is only known at run time
		in = instr{op: opCallDynamic, target: c.target(s.Result)}
		for i, l := range s.Args {
			if i == 0 {
				in.args = append(in.args, operand{local: c.peek(l)}) // the input, passed on
				continue
			}
			in.args = append(in.args, operand{local: c.local(l)})
		}
		if ops, err = c.operands(s.Path...); err != nil {
			return in, err
		}
		for _, o := range ops {
			if o.local >= 0 {
				in.args = append(in.args, o) // dynamic path segments follow the arguments
				in.keys = append(in.keys, nil)
			} else {
				in.keys = append(in.keys, o.term)
			}
		}
		in.n = len(s.Args)
		return in, nil
	case *ir.DotStmt:
		l, isLocal := localOf(s.Source)
		switch {
		case isLocal && isString(c.strings, s.Key):
			in = instr{op: opDot, a: operand{local: c.peek(l)}}
			in.b, err = c.operand(s.Key)
		case isLocal:
			// A lookup by a key known only at run time: in a value at an
			// input path, any field of it may be needed, but one at a
			// time (the source is asked for just that field).
			in = instr{op: opDot, a: operand{local: c.peek(l)}}
			if id, ok := c.flow.must[int(l)]; ok {
				c.keyed(id)
			} else {
				c.read(int(l))
			}
			in.b, err = c.operand(s.Key)
		default:
			in, err = two(opDot, s.Source, s.Key)
		}
		in.target = c.target(s.Target)
		in.path = c.dotPath(in)
	case *ir.AssignVarStmt:
		in, err = one(opAssignVar, s.Source)
		in.target = c.target(s.Target)
	case *ir.AssignVarOnceStmt:
		in, err = one(opAssignVarOnce, s.Source)
		in.target = c.target(s.Target)
		in.fn = c.fn // names the rule in a conflict
	case *ir.ResetLocalStmt:
		in = instr{op: opResetLocal, target: c.target(s.Target)}
	case *ir.IsDefinedStmt:
		in = instr{op: opIsDefined, a: operand{local: c.local(s.Source)}}
	case *ir.IsUndefinedStmt:
		in = instr{op: opIsUndefined, a: operand{local: c.local(s.Source)}}
	case *ir.EqualStmt:
		in, err = two(opEqual, s.A, s.B)
		in.guard = c.guardPath(in)
	case *ir.NotEqualStmt:
		in, err = two(opNotEqual, s.A, s.B)
	case *ir.BlockStmt:
		// The blocks run in turn, each possibly cut short: each sees what
		// held before the statement and what the blocks before it wrote.
		in.op = opBlock
		entry, written := c.flow.clone(), writeLog{}
		for _, b := range s.Blocks {
			c.flow = entry.clone()
			c.flow.join(written)
			var nb *block
			w, err := c.logged(func() (err error) { nb, err = c.block(b); return err })
			if err != nil {
				return in, err
			}
			in.blocks = append(in.blocks, nb)
			written.add(w)
		}
		c.flow = entry
		c.flow.join(written)
	case *ir.BreakStmt:
		in = instr{op: opBreak, n: int(s.Index)}
	case *ir.ReturnLocalStmt:
		in = instr{op: opReturn, a: operand{local: c.local(s.Source)}}
	case *ir.NotStmt:
		in.op = opNot
		in.blocks, err = c.nested(s.Block, false, func() {})
	case *ir.ScanStmt:
		in = instr{op: opScan, a: operand{local: c.local(s.Source)}, target: c.target(s.Key), d: c.target(s.Value)}
		in.blocks, err = c.nested(s.Block, true, func() {
			c.assign(in.target, -1)
			c.assign(in.d, -1)
		})
	case *ir.MakeObjectStmt:
		in = instr{op: opMakeObject, target: c.target(s.Target)}
	case *ir.MakeArrayStmt:
		in = instr{op: opMakeArray, target: c.target(s.Target), n: int(s.Capacity)}
	case *ir.MakeSetStmt:
		in = instr{op: opMakeSet, target: c.target(s.Target)}
	case *ir.MakeNullStmt:
		in = constant(c.target(s.Target), ast.InternedNullTerm)
	case *ir.MakeNumberIntStmt:
		in = constant(c.target(s.Target), ast.InternedTerm(int(s.Value)))
	case *ir.AssignIntStmt:
		in = constant(c.target(s.Target), ast.InternedTerm(int(s.Value)))
	case *ir.MakeNumberRefStmt:
		if s.Index < 0 || s.Index >= len(c.strings) {
			return in, fmt.Errorf("number string index %d out of range", s.Index)
		}
		lit := string(c.strings[s.Index].Value.(ast.String))
		if _, ok := new(big.Float).SetString(lit); !ok {
			return in, fmt.Errorf("number constant %q is not a number", lit)
		}
		in = constant(c.target(s.Target), ast.NumberTerm(json.Number(lit)))
	case *ir.LenStmt:
		in, err = one(opLen, s.Source)
		in.target = c.target(s.Target)
	case *ir.IsArrayStmt:
		in, err = one(opIsArray, s.Source)
	case *ir.IsObjectStmt:
		in, err = one(opIsObject, s.Source)
	case *ir.IsSetStmt:
		in, err = one(opIsSet, s.Source)
	case *ir.ArrayAppendStmt:
		in, err = one(opArrayAppend, s.Value)
		in.target = c.target(s.Array)
	case *ir.ObjectInsertStmt:
		in, err = two(opObjectInsert, s.Key, s.Value)
		in.target = c.target(s.Object)
	case *ir.ObjectInsertOnceStmt:
		in, err = two(opObjectInsertOnce, s.Key, s.Value)
		in.target = c.target(s.Object)
	case *ir.ObjectMergeStmt:
		in = instr{op: opObjectMerge, a: operand{local: c.local(s.A)}, b: operand{local: c.local(s.B)}, target: c.target(s.Target)}
	case *ir.SetAddStmt:
		in, err = one(opSetAdd, s.Value)
		in.target = c.target(s.Set)
	case *ir.ResultSetAddStmt:
		in = instr{op: opResultSetAdd, a: operand{local: c.local(s.Value)}}
	case *ir.WithStmt:
		c.fn.impure = true
		in, err = one(opWith, s.Value)
		if err != nil {
			return in, err
		}
		in.target = c.target(s.Local)
		c.local(s.Local)
		for _, i := range s.Path {
			o, err := c.str(i)
			if err != nil {
				return in, err
			}
			in.keys = append(in.keys, o.term)
		}
		local := in.target
		in.blocks, err = c.nested(s.Block, false, func() { c.assign(local, -1) })
	case *ir.NopStmt:
		in.op = opNop
	default:
		return in, fmt.Errorf("statement %T: %w", s, ErrUnsupported)
	}
	return in, err
}

func (c *compiler) call(s *ir.CallStmt) (instr, error) {
	in := instr{target: c.target(s.Result)}
	if fn, ok := c.byName[s.Func]; ok {
		if len(s.Args) != len(fn.params) {
			return in, fmt.Errorf("call of %s with %d arguments, want %d", s.Func, len(s.Args), len(fn.params))
		}
		c.fn.callees = append(c.fn.callees, fn)
		args := s.Args
		in.args = make([]operand, len(args))
		if isLocal(args[0], c.fn.params[0]) {
			// Passing the input on is not reading it: the callee's own
			// constness and input needs decide.
			in.args[0] = operand{local: c.peek(ir.Local(c.fn.params[0]))}
			args = args[1:]
		}
		ops, err := c.operands(args...)
		if err != nil {
			return in, err
		}
		copy(in.args[len(in.args)-len(ops):], ops)
		in.op, in.fn = opCall, fn
		return in, nil
	}
	decl, ok := ast.BuiltinMap[s.Func]
	f := topdown.GetBuiltin(s.Func)
	if !ok || f == nil {
		return in, fmt.Errorf("built-in function %s: %w", s.Func, ErrUnsupported)
	}
	if decl.Relation {
		return in, fmt.Errorf("relation %s: %w", s.Func, ErrUnsupported)
	}
	if decl.Nondeterministic || s.Func == ast.InternalPrint.Name {
		c.fn.impure = true
	}
	ops, err := c.operands(s.Args...)
	if err != nil {
		return in, err
	}
	loc := &ast.Location{Row: s.Row, Col: s.Col}
	if s.File >= 0 && s.File < len(c.prog.files) {
		loc.File = c.prog.files[s.File]
	}
	in.op, in.args = opBuiltin, ops
	in.bi = &builtin{name: s.Func, f: f, hasResult: decl.Decl.Result() != nil, loc: loc, native: nativeOf(s.Func)}
	if memoized[s.Func] {
		in.bi.memo = &memo{}
	}
	return in, nil
}

// dotPath returns the cache slot of a lookup, or -1 when its value may
// vary within one evaluation, and records the lookup's write.
func (c *compiler) dotPath(in instr) int {
	parent, known := -1, false
	if in.a.local >= 0 {
		parent, known = c.flow.must[in.a.local]
	}
	var key ast.String
	isStr := false
	if in.b.local < 0 {
		key, isStr = in.b.term.Value.(ast.String)
	}
	if in.b.local >= 0 || !known || !isStr {
		if in.a.local >= 0 && in.b.local < 0 {
			c.read(in.a.local) // a lookup in a value not known: all of it may be needed
		}
		c.assign(in.target, -1)
		return -1
	}
	k := pathKey{parent, string(key)}
	id, ok := c.pathIDs[k]
	if !ok {
		id = len(c.pathIDs) + 2
		c.pathIDs[k] = id
		c.pathOf = append(c.pathOf, k)
	}
	c.need(id) // the input must carry the path, if it is in the input
	c.assign(in.target, id)
	return id
}

// countWrites adds up, per local, the statements in b that write it or
// change the value it holds.
func countWrites(b *ir.Block, n map[int]int) {
	for _, s := range b.Stmts {
		var ls []ir.Local
		switch s := s.(type) {
		case *ir.CallStmt:
			ls = []ir.Local{s.Result}
		case *ir.CallDynamicStmt:
			ls = []ir.Local{s.Result}
		case *ir.DotStmt:
			ls = []ir.Local{s.Target}
		case *ir.AssignVarStmt:
			ls = []ir.Local{s.Target}
		case *ir.AssignVarOnceStmt:
			ls = []ir.Local{s.Target}
		case *ir.ResetLocalStmt:
			ls = []ir.Local{s.Target}
		case *ir.MakeNullStmt:
			ls = []ir.Local{s.Target}
		case *ir.MakeNumberIntStmt:
			ls = []ir.Local{s.Target}
		case *ir.MakeNumberRefStmt:
			ls = []ir.Local{s.Target}
		case *ir.AssignIntStmt:
			ls = []ir.Local{s.Target}
		case *ir.MakeArrayStmt:
			ls = []ir.Local{s.Target}
		case *ir.MakeObjectStmt:
			ls = []ir.Local{s.Target}
		case *ir.MakeSetStmt:
			ls = []ir.Local{s.Target}
		case *ir.LenStmt:
			ls = []ir.Local{s.Target}
		case *ir.ObjectMergeStmt:
			ls = []ir.Local{s.Target}
		case *ir.ArrayAppendStmt:
			ls = []ir.Local{s.Array}
		case *ir.ObjectInsertStmt:
			ls = []ir.Local{s.Object}
		case *ir.ObjectInsertOnceStmt:
			ls = []ir.Local{s.Object}
		case *ir.SetAddStmt:
			ls = []ir.Local{s.Set}
		case *ir.ScanStmt:
			ls = []ir.Local{s.Key, s.Value}
			countWrites(s.Block, n)
		case *ir.WithStmt:
			ls = []ir.Local{s.Local}
			countWrites(s.Block, n)
		case *ir.NotStmt:
			countWrites(s.Block, n)
		case *ir.BlockStmt:
			for _, b := range s.Blocks {
				countWrites(b, n)
			}
		}
		for _, l := range ls {
			n[int(l)]++
		}
	}
}

func localOf(o ir.Operand) (ir.Local, bool) {
	switch x := o.Value.(type) {
	case ir.Local:
		return x, true
	case *ir.Local:
		return *x, true
	}
	return 0, false
}

func isString(strs []*ast.Term, o ir.Operand) bool {
	var i int
	switch x := o.Value.(type) {
	case ir.StringIndex:
		i = int(x)
	case *ir.StringIndex:
		i = int(*x)
	default:
		return false
	}
	return i >= 0 && i < len(strs)
}

// guardPath returns the input path an equality compares with a constant,
// or -1.
func (c *compiler) guardPath(in instr) int {
	local := in.a
	if in.a.local < 0 {
		local = in.b
	} else if in.b.local >= 0 {
		return -1
	}
	if local.local < 0 {
		return -1
	}
	id, ok := c.flow.must[local.local]
	if !ok || id < 2 || !c.underInput(id) {
		return -1
	}
	return id
}

func isLocal(o ir.Operand, l int) bool {
	switch x := o.Value.(type) {
	case ir.Local:
		return int(x) == l
	case *ir.Local:
		return int(*x) == l
	}
	return false
}
