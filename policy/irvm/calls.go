package irvm

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/topdown/builtins"
)

// callDynamic calls the function at the path the operands spell. As in
// OPA's Wasm compiler: no such function fails the current block (the
// planner follows it with a lookup in data); a function that is found but
// undefined leaves the enclosing reference's block, three levels up.
func (v *vm) callDynamic(in *instr) int {
	n, dyn := v.prog.dyn, in.args[in.n:]
	for _, seg := range in.keys {
		if seg == nil {
			seg, dyn = v.get(dyn[0]), dyn[1:]
		}
		if seg == nil || n.children == nil {
			return 0
		}
		s, ok := seg.Value.(ast.String)
		if !ok {
			return 0
		}
		if n = n.children[string(s)]; n == nil {
			return 0
		}
	}
	if n.fn == nil || len(n.fn.params) != in.n {
		return 0
	}
	t := v.invoke(n.fn, in.args[:in.n])
	if v.err != nil {
		return returned
	}
	if t == nil {
		return 3
	}
	v.set(in.target, t)
	return done
}

func (v *vm) call(in *instr) *ast.Term {
	fn := in.fn
	if fn.memo && v.memoOK[fn.index] {
		return v.memo[fn.index]
	}
	if fn.constant && !v.inWith {
		if cv := fn.slot.Load(); cv != nil && cv.data == v.data {
			return cv.val
		}
	}
	return v.invoke(fn, in.args)
}

// invoke runs a planned function on args, read in the caller's frame.
func (v *vm) invoke(fn *function, args []operand) *ast.Term {
	old := v.base
	top := len(v.stack)
	for range fn.nlocals {
		v.stack = append(v.stack, nil)
	}
	for i, l := range fn.params {
		v.stack[top+l] = v.get(args[i]) // v.base is still the caller's
	}
	v.base = top
	var out *ast.Term
	run, mark := v.runnable(fn)
	for i, b := range fn.blocks {
		if run != nil && !run[i] {
			continue
		}
		r := v.block(b)
		if v.err != nil {
			v.unmark(mark)
			v.pop(old)
			return nil
		}
		if r == returned {
			out, v.ret = v.ret, nil
			break
		}
	}
	v.pop(old)
	if fn.memo {
		v.memo[fn.index], v.memoOK[fn.index] = out, true
	}
	if fn.constant && !v.inWith {
		fn.slot.Store(&constValue{data: v.data, val: out})
	}
	return out
}

// builtin calls OPA's implementation of a built-in function. As in
// topdown without strict built-in errors, a built-in's error makes the
// call undefined unless the built-in halts the evaluation.
func (v *vm) builtin(in *instr) *ast.Term {
	args := v.bargs[:0]
	for _, a := range in.args {
		t := v.get(a)
		if t == nil {
			return nil
		}
		args = append(args, t)
	}
	v.bargs = args[:0]
	if in.bi.native != nil {
		if t, ok := in.bi.native(args); ok {
			clear(args)
			return t
		}
	}
	if in.bi.memo != nil {
		if t := in.bi.memo.get(args); t != nil {
			clear(args)
			return t
		}
	}
	if v.bctx.Context == nil {
		// The context built-ins see, made once per evaluation on its
		// first call.
		t := v.opts.Time
		if t.IsZero() {
			t = time.Now()
		}
		seed := v.opts.Seed
		if seed == nil {
			seed = rand.Reader
		}
		v.bctx = topdown.BuiltinContext{
			Context:   v.ctx,
			Metrics:   noMetrics,
			Seed:      seed,
			Time:      ast.NumberTerm(json.Number(strconv.FormatInt(t.UnixNano(), 10))),
			Cache:     builtins.Cache{},
			PrintHook: v.opts.Print,
		}
	}
	v.bctx.Location = in.bi.loc
	v.out, v.hasResult = nil, in.bi.hasResult
	err := in.bi.f(v.bctx, args, v.onOut)
	out := v.out
	v.out = nil
	if err == nil && out != nil && in.bi.memo != nil {
		in.bi.memo.put(args, out)
	}
	clear(args)
	if err != nil {
		var h topdown.Halt
		if errors.As(err, &h) {
			v.failErr(h.Err, in.loc)
		}
		return nil
	}
	return out
}

// output receives a built-in's result; one without a result (print)
// reports success.
func (v *vm) output(t *ast.Term) error {
	if !v.hasResult {
		t = ast.InternedTerm(true)
	}
	v.out = t
	return nil
}

func (v *vm) failErr(err error, loc *ir.Location) {
	var te *topdown.Error
	if errors.As(err, &te) {
		v.fail(te.Code, te.Message, loc)
		return
	}
	v.fail(CodeBuiltin, err.Error(), loc)
}
