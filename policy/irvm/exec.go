package irvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/topdown/print"
)

// Options are the inputs of one evaluation.
type Options struct {
	// Input is the input document; nil leaves input undefined.
	Input *ast.Term
	// Source, when set, supplies the input instead of Input: a program
	// that needs only part of its input asks it for just what it reads.
	Source InputSource
	// Data is the base data document; nil means an empty object. Values
	// that depend on data alone are kept across evaluations while the same
	// *ast.Term is passed.
	Data *ast.Term
	// Time is what time.now_ns returns; zero means the time of the first
	// call that asks.
	Time time.Time
	// Deadline stops the evaluation with an eval_cancel_error once passed;
	// zero means none (ctx still cancels).
	Deadline time.Time
	// Print receives print() output; nil drops it.
	Print print.Hook
	// Seed feeds the rand.* built-ins; nil means crypto/rand.
	Seed io.Reader
}

// Error codes, as topdown names them.
const (
	CodeConflict = "eval_conflict_error"
	CodeBuiltin  = "eval_builtin_error"
	CodeType     = "eval_type_error"
	CodeCancel   = "eval_cancel_error"
)

// Error is an evaluation error.
type Error struct {
	Code     string
	Message  string
	Location *ast.Location
}

func (e *Error) Error() string {
	if e.Location != nil && e.Location.File != "" {
		return fmt.Sprintf("%s:%d: %s: %s", e.Location.File, e.Location.Row, e.Code, e.Message)
	}
	return e.Code + ": " + e.Message
}

// How a block ended: it ran to its end (done), returned from the
// function (returned), or was left by a break with n ≥ 0 enclosing blocks
// still to leave (an undefined statement is a break of 0).
const (
	done     = -1
	returned = -2
)

// checkEvery is how many instructions run between deadline checks.
const checkEvery = 256

// vm is the state of one evaluation; vms are pooled.
type vm struct {
	prog    *Program
	ctx     context.Context
	opts    *Options
	stack   []*ast.Term
	base    int // current frame's first slot
	memo    []*ast.Term
	memoOK  []bool
	results []*ast.Term
	steps   int
	err     error
	data    *ast.Term // the data document the evaluation started with
	inWith  bool      // inside a WithStmt: input or data may be replaced
	ret     *ast.Term // value of the last return
	// paths caches lookups in input and data by path for one evaluation;
	// a slot is valid when its gen is the evaluation's.
	paths []pathSlot
	gen   uint64
	// runs holds, for the functions being run, which blocks to run.
	runs []bool
	// source supplies the input path by path, when the program allows it;
	// root is the input document otherwise.
	source InputSource
	root   *ast.Term
	bctx   topdown.BuiltinContext // zero until the first built-in call
	bargs  []*ast.Term            // built-in arguments: built-ins never call back in
	// The built-in output callback and its state live here so that a call
	// does not allocate a closure.
	onOut     func(*ast.Term) error
	out       *ast.Term
	hasResult bool
}

var emptyData = ast.NewTerm(ast.NewObject())

// pool recycles evaluation states; a pooled vm holds no values.
var pool = sync.Pool{New: func() any {
	v := &vm{}
	v.onOut = v.output
	return v
}}

type pathSlot struct {
	gen uint64
	t   *ast.Term
}

// noMetrics is given to every built-in call: the interpreter keeps none.
var noMetrics = metrics.NoOp()

// Eval runs one plan and returns the values it added to its result set,
// in order. An entrypoint plan adds one object {"result": value} when the
// entrypoint is defined and none when it is not.
func (p *Program) Eval(ctx context.Context, plan string, o *Options) ([]*ast.Term, error) {
	fn, ok := p.plans[plan]
	if !ok {
		return nil, fmt.Errorf("irvm: no plan %q (have %v)", plan, p.names)
	}
	if o == nil {
		o = &Options{}
	}
	v := pool.Get().(*vm)
	defer pool.Put(v)
	defer v.release()
	v.start(ctx, p, o)
	v.push(fn.nlocals)
	v.stack[v.base+int(ir.Input)] = v.input(o)
	v.stack[v.base+int(ir.Data)] = v.data
	v.root = o.Input
	run, mark := v.runnable(fn)
	for i, b := range fn.blocks {
		if run != nil && !run[i] {
			continue
		}
		if r := v.block(b); r == returned || v.err != nil {
			break
		}
	}
	v.unmark(mark)
	if v.err != nil {
		return nil, v.err
	}
	out := v.results
	v.results = nil
	return out, nil
}

// input is the value of the input local at the start: the document, or
// with a source, a stand-in for it when the program only looks into it.
func (v *vm) input(o *Options) *ast.Term {
	if o.Source == nil {
		return o.Input
	}
	if v.prog.inputs == nil {
		return o.Source.Value(nil)
	}
	v.source = o.Source
	if root := v.prog.inputs[pathInput]; !root.whole {
		return root.placeholder
	}
	return o.Source.Value(nil)
}

func (v *vm) start(ctx context.Context, p *Program, o *Options) {
	v.prog, v.ctx, v.opts = p, ctx, o
	v.stack, v.base, v.steps, v.runs = v.stack[:0], 0, 0, v.runs[:0]
	if cap(v.memo) < len(p.funcs) {
		v.memo, v.memoOK = make([]*ast.Term, len(p.funcs)), make([]bool, len(p.funcs))
	}
	v.memo, v.memoOK = v.memo[:len(p.funcs)], v.memoOK[:len(p.funcs)]
	v.data = o.Data
	if v.data == nil {
		v.data = emptyData
	}
	v.gen++
	if len(v.paths) < p.npaths {
		v.paths = make([]pathSlot, p.npaths)
	}
}

// release drops every reference so a pooled vm keeps no values alive.
func (v *vm) release() {
	clear(v.stack[:cap(v.stack)])
	clear(v.memo)
	clear(v.memoOK)
	clear(v.bargs[:cap(v.bargs)])
	clear(v.paths)
	v.prog, v.ctx, v.opts, v.results, v.err, v.data, v.ret, v.out = nil, nil, nil, nil, nil, nil, nil, nil
	v.bctx = topdown.BuiltinContext{}
	v.inWith, v.source, v.root = false, nil, nil
}

func (v *vm) push(n int) int {
	old := v.base
	v.base = len(v.stack)
	for range n {
		v.stack = append(v.stack, nil)
	}
	return old
}

func (v *vm) pop(old int) {
	clear(v.stack[v.base:])
	v.stack = v.stack[:v.base]
	v.base = old
}

func (v *vm) get(o operand) *ast.Term {
	if o.local < 0 {
		return o.term
	}
	return v.stack[v.base+o.local]
}

func (v *vm) set(l int, t *ast.Term) { v.stack[v.base+l] = t }

func (v *vm) local(l int) *ast.Term { return v.stack[v.base+l] }

func (v *vm) fail(code, msg string, loc *ir.Location) {
	if v.err == nil {
		v.err = &Error{Code: code, Message: msg, Location: v.location(loc)}
	}
}

func (v *vm) location(loc *ir.Location) *ast.Location {
	if loc == nil {
		return nil
	}
	l := &ast.Location{Row: loc.Row, Col: loc.Col}
	if loc.File >= 0 && loc.File < len(v.prog.files) {
		l.File = v.prog.files[loc.File]
	}
	return l
}

// expired checks cancellation and the deadline.
func (v *vm) expired(loc *ir.Location) bool {
	if err := v.ctx.Err(); err != nil {
		v.fail(CodeCancel, "evaluation cancelled: "+err.Error(), loc)
		return true
	}
	if d := v.opts.Deadline; !d.IsZero() && time.Now().After(d) {
		v.fail(CodeCancel, "evaluation deadline passed", loc)
		return true
	}
	return false
}

// block runs b and says how it ended.
func (v *vm) block(b *block) int {
	for i := range b.instrs {
		if r := v.exec(&b.instrs[i]); r != done {
			return r
		}
	}
	return done
}

//nolint:gocyclo // one case per instruction reads best as one switch.
func (v *vm) exec(in *instr) int {
	if v.steps++; v.steps%checkEvery == 0 && v.expired(in.loc) {
		return returned
	}
	switch in.op {
	case opDot:
		var t *ast.Term
		if v.source != nil && in.path >= 0 && v.prog.inputs[in.path] != nil {
			// From a source: the input is never replaced (a program
			// that replaces it reads it whole), so the slot holds even
			// inside a with.
			slot := &v.paths[in.path]
			if slot.gen != v.gen {
				slot.gen, slot.t = v.gen, v.fromSource(v.prog.inputs[in.path])
			}
			t = slot.t
		} else if in.path >= 0 && !v.inWith {
			slot := &v.paths[in.path]
			if slot.gen != v.gen {
				slot.gen, slot.t = v.gen, dot(v.get(in.a), v.get(in.b))
			}
			t = slot.t
		} else {
			t = v.dot(v.get(in.a), v.get(in.b))
		}
		if t == nil {
			return 0
		}
		v.set(in.target, t)
	case opCall, opBuiltin:
		var t *ast.Term
		if in.op == opCall {
			t = v.call(in)
		} else {
			t = v.builtin(in)
		}
		if v.err != nil {
			return returned
		}
		if t == nil {
			return 0
		}
		v.set(in.target, t)
	case opAssignVar:
		v.set(in.target, v.get(in.a))
	case opAssignVarOnce:
		src := v.get(in.a)
		if cur := v.local(in.target); cur != nil && !cur.Equal(src) {
			v.fail(CodeConflict, in.fn.conflict(), in.loc)
			return returned
		}
		v.set(in.target, src)
	case opConst:
		v.set(in.target, in.a.term)
	case opResetLocal:
		v.set(in.target, nil)
	case opIsDefined:
		if v.get(in.a) == nil {
			return 0
		}
	case opIsUndefined:
		if v.get(in.a) != nil {
			return 0
		}
	case opEqual:
		a, b := v.get(in.a), v.get(in.b)
		if a == nil || b == nil || !equal(a, b) {
			return 0
		}
	case opNotEqual:
		a, b := v.get(in.a), v.get(in.b)
		if a == nil || b == nil || equal(a, b) {
			return 0
		}
	case opBlock:
		for _, b := range in.blocks {
			switch r := v.block(b); {
			case r == returned:
				return returned
			case r > 0:
				return r - 1 // the break climbs past this block too
			}
		}
	case opBreak:
		return in.n
	case opReturn:
		v.ret = v.get(in.a)
		return returned
	case opNot:
		switch r := v.block(in.blocks[0]); {
		case r == returned:
			return returned
		case r == done:
			return 0 // the negated block held: not fails
		case r > 0:
			return r - 1
		}
	case opScan:
		return v.scan(in)
	case opMakeObject:
		v.set(in.target, ast.NewTerm(ast.NewObject()))
	case opMakeArray:
		v.set(in.target, ast.NewTerm(ast.NewArrayWithCapacity(in.n)))
	case opMakeSet:
		v.set(in.target, ast.NewTerm(ast.NewSet()))
	case opLen:
		n, ok := length(v.get(in.a))
		if !ok {
			return 0
		}
		v.set(in.target, ast.InternedTerm(n))
	case opIsArray:
		if _, ok := value[*ast.Array](v.get(in.a)); !ok {
			return 0
		}
	case opIsObject:
		if _, ok := value[ast.Object](v.get(in.a)); !ok {
			return 0
		}
	case opIsSet:
		if _, ok := value[ast.Set](v.get(in.a)); !ok {
			return 0
		}
	case opArrayAppend:
		arr, ok := value[*ast.Array](v.local(in.target))
		val := v.get(in.a)
		if !ok || val == nil {
			return 0
		}
		*arr = *arr.Append(val) // in place: every alias sees it, as in Wasm
	case opObjectInsert:
		obj, ok := value[ast.Object](v.local(in.target))
		k, val := v.get(in.a), v.get(in.b)
		if !ok || k == nil || val == nil {
			return 0
		}
		obj.Insert(k, val)
	case opObjectInsertOnce:
		obj, ok := value[ast.Object](v.local(in.target))
		k, val := v.get(in.a), v.get(in.b)
		if !ok || k == nil || val == nil {
			return 0
		}
		if cur := obj.Get(k); cur != nil {
			if !cur.Equal(val) {
				v.fail(CodeConflict, "object keys must be unique", in.loc)
				return returned
			}
			return done
		}
		obj.Insert(k, val)
	case opObjectMerge:
		a, okA := value[ast.Object](v.get(in.a))
		b, okB := value[ast.Object](v.get(in.b))
		if !okA || !okB {
			return 0
		}
		v.set(in.target, ast.NewTerm(mergeBase(a, b)))
	case opSetAdd:
		set, ok := value[ast.Set](v.local(in.target))
		val := v.get(in.a)
		if !ok || val == nil {
			return 0
		}
		set.Add(val)
	case opResultSetAdd:
		if t := v.get(in.a); t != nil {
			v.results = append(v.results, t)
		}
	case opWith:
		return v.with(in)
	case opCallDynamic:
		return v.callDynamic(in)
	case opNop:
	}
	return done
}

// runnable marks which of fn's blocks to run, when fn has guards: each
// guarded path is read once, and a guarded block runs only when the path
// holds its constant (see guard). Inside a with the input may be
// replaced, and guards are not used, unless the input comes from a source
// (a program that replaces it cannot read it from a source). The marks
// live on a stack in the vm; unmark(mark) pops them.
func (v *vm) runnable(fn *function) (run []bool, mark int) {
	mark = len(v.runs)
	x := fn.byGuard
	if x == nil || (v.inWith && v.source == nil) {
		return nil, mark
	}
	for range fn.blocks {
		v.runs = append(v.runs, false)
	}
	run = v.runs[mark:]
	for _, i := range x.unguarded {
		run[i] = true
	}
	for gi := range x.groups {
		g := &x.groups[gi]
		t := v.pathValue(g.path)
		if t == nil {
			continue
		}
		if s, ok := t.Value.(ast.String); ok {
			for _, i := range g.strings[string(s)] {
				run[i] = true
			}
		}
		for _, i := range g.others {
			run[i] = equal(t, fn.guards[i].want)
		}
	}
	return run, mark
}

func (v *vm) unmark(mark int) { v.runs = v.runs[:mark] }

// pathValue is the value at an input path, through the path cache.
func (v *vm) pathValue(id int) *ast.Term {
	if id == pathInput {
		if v.source != nil {
			return v.fromSource(v.prog.inputs[pathInput])
		}
		return v.root
	}
	slot := &v.paths[id]
	if slot.gen == v.gen {
		return slot.t
	}
	var t *ast.Term
	if v.source != nil {
		t = v.fromSource(v.prog.inputs[id])
	} else {
		t = dot(v.pathValue(v.prog.parent[id-2]), v.prog.key[id-2])
	}
	slot.gen, slot.t = v.gen, t
	return t
}

func (v *vm) fromSource(ip *inputPath) *ast.Term {
	if ip.whole {
		return v.source.Value(ip.path)
	}
	if v.source.Has(ip.path) {
		return ip.placeholder
	}
	return nil
}

// scan runs the instruction's block once per element of the source. As in
// OPA's Wasm compiler, the block is one level and the scan another: a
// break of 0 moves on to the next element, a break of 1 ends the scan.
func (v *vm) scan(in *instr) int {
	body := in.blocks[0]
	out := done
	each := func(k, val *ast.Term) bool {
		v.set(in.target, k)
		v.set(in.d, val)
		switch r := v.block(body); {
		case r == returned:
			out = returned
		case r == 1:
			out = done // stop, and carry on after the scan
			return false
		case r > 1:
			out = r - 2
		}
		return out == done
	}
	switch x := v.get(in.a).Value.(type) {
	case *ast.Array:
		for i := 0; i < x.Len(); i++ {
			if !each(ast.InternedTerm(i), x.Elem(i)) {
				break
			}
		}
	case ast.Object:
		_ = x.Iter(func(k, val *ast.Term) error {
			if !each(k, val) {
				return errStop
			}
			return nil
		})
	case ast.Set:
		_ = x.Iter(func(e *ast.Term) error {
			if !each(e, e) {
				return errStop
			}
			return nil
		})
	}
	return out
}

var errStop = errors.New("stop")

// with runs the instruction's block with a local replaced, or with a value
// upserted at a path inside it, and then restores the local. Values
// memoized under the replacement are dropped when it ends.
func (v *vm) with(in *instr) int {
	saved := v.local(in.target)
	val := v.get(in.a)
	if len(in.keys) == 0 {
		v.set(in.target, val)
	} else {
		v.set(in.target, upsert(saved, in.keys, val))
	}
	memo, memoOK, inWith := v.memo, v.memoOK, v.inWith
	v.memo, v.memoOK, v.inWith = make([]*ast.Term, len(memo)), make([]bool, len(memo)), true
	r := v.block(in.blocks[0])
	v.memo, v.memoOK, v.inWith = memo, memoOK, inWith
	v.set(in.target, saved)
	switch {
	case r == done, r == returned, r == 0:
		return r
	}
	return r - 1
}

// upsert returns a copy of doc with val at path, copying each object on
// the way and creating the missing ones; doc itself is not changed.
func upsert(doc *ast.Term, path []*ast.Term, val *ast.Term) *ast.Term {
	root := ast.NewObject()
	if obj, ok := value[ast.Object](doc); ok {
		root = obj.Copy()
	}
	cur := root
	for _, k := range path[:len(path)-1] {
		next := ast.NewObject()
		if obj, ok := value[ast.Object](cur.Get(k)); ok {
			next = obj.Copy()
		}
		cur.Insert(k, ast.NewTerm(next))
		cur = next
	}
	cur.Insert(path[len(path)-1], val)
	return ast.NewTerm(root)
}
