package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	opa "github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/topdown/print"

	"github.com/gpu-arbiter/arbiter/policy/irvm"
	"github.com/gpu-arbiter/arbiter/policy/schema"
)

// Entry points a policy defines in package arbiter.
const (
	// EntryClassify is required: the decision for one process.
	EntryClassify = "classify"
	// EntryDefault is required: the decision used when classify fails.
	EntryDefault = "default_decision"
	// EntryVictims is optional: which processes to suspend or throttle now.
	EntryVictims = "victims"
)

// DefaultEvalTimeout bounds one evaluation unless Options says otherwise.
// It is there to stop a pathological policy, not to police ordinary ones:
// a 100 ms bound was seen to trip on scheduling stalls of a busy 2-core
// guest, and a tripped bound costs a latency-critical process its class.
const DefaultEvalTimeout = 500 * time.Millisecond

// Options tune loading and evaluation; nil means defaults.
type Options struct {
	// EvalTimeout bounds every evaluation; an evaluation past it fails with
	// a clear error and its caller falls back. Default DefaultEvalTimeout.
	EvalTimeout time.Duration
	// Print receives the output of the policy's print() calls with their
	// location; nil drops it.
	Print func(Print)
	// MaxFileBytes and MaxTotalBytes bound what is read; defaults
	// DefaultMaxFileBytes and DefaultMaxTotalBytes.
	MaxFileBytes, MaxTotalBytes int64
	// Library replaces the embedded helper library (package arbiter.lib)
	// added to policies that do not bring their own; nil means embedded.
	Library fs.FS
	// NoLibrary adds no helper library at all.
	NoLibrary bool
	// Evaluator chooses how entry points are evaluated; the default uses
	// the compiled plan whenever the policy can be planned.
	Evaluator Evaluator
}

// Print is one line printed by a policy.
type Print struct {
	File    string
	Row     int
	Message string
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.EvalTimeout <= 0 {
		r.EvalTimeout = DefaultEvalTimeout
	}
	if r.MaxFileBytes <= 0 {
		r.MaxFileBytes = DefaultMaxFileBytes
	}
	if r.MaxTotalBytes <= 0 {
		r.MaxTotalBytes = DefaultMaxTotalBytes
	}
	return r
}

// Policy is a loaded, compiled and checked policy. It is safe for
// concurrent use and never changes; a reload builds a new one.
type Policy struct {
	src      *Source
	opts     Options
	schemas  *schema.Set
	compiler *ast.Compiler
	store    storage.Store
	classify opa.PreparedEvalQuery
	victims  *opa.PreparedEvalQuery // nil: the policy has no victims rule
	def      Decision
	// planned is the policy compiled to OPA's IR, nil when it runs on
	// topdown; planErr says why it does.
	planned *planned
	planErr error
	decided decisionCache
	// gpus caches the node's GPU list as a value: it rarely changes and is
	// the costliest part of the input to build.
	gpus atomic.Pointer[gpuCache]
}

type gpuCache struct {
	gpus []GPU
	val  ast.Value
}

// gpusValue returns the GPU list as a value, from the cache when unchanged.
func (p *Policy) gpusValue(gpus []GPU) ast.Value {
	if c := p.gpus.Load(); c != nil && slices.EqualFunc(c.gpus, gpus, func(a, b GPU) bool {
		return a.Index == b.Index && a.UUID == b.UUID && a.Name == b.Name && a.MemoryBytes == b.MemoryBytes &&
			a.NUMANode == b.NUMANode && slices.Equal(a.NVLinkPeers, b.NVLinkPeers)
	}) {
		return c.val
	}
	c := &gpuCache{gpus: make([]GPU, len(gpus)), val: gpusValue(gpus)}
	for i, g := range gpus {
		c.gpus[i] = g
		c.gpus[i].NVLinkPeers = slices.Clone(g.NVLinkPeers)
	}
	p.gpus.Store(c)
	return c.val
}

// Load reads, compiles and checks the policy at path (a directory or a
// .tar.gz bundle). Errors are *Error with every problem's location.
func Load(ctx context.Context, path string, opts *Options) (*Policy, error) {
	src, err := Read(path, opts)
	if err != nil {
		return nil, err
	}
	return New(ctx, src, opts)
}

// LoadFS is Load for a policy at the root of fsys.
func LoadFS(ctx context.Context, fsys fs.FS, name string, opts *Options) (*Policy, error) {
	src, err := ReadFS(fsys, name, opts)
	if err != nil {
		return nil, err
	}
	return New(ctx, src, opts)
}

// New compiles and checks src: strict compilation, the input schema for
// every input reference, literal decisions against the decision schema, and
// a default decision that evaluates and fits.
func New(ctx context.Context, src *Source, opts *Options) (*Policy, error) {
	o := opts.withDefaults()
	sch, err := schema.Load()
	if err != nil {
		return nil, err
	}
	p := &Policy{src: src, opts: o, schemas: sch}
	if p.compiler, err = compile(src.Modules); err != nil {
		return nil, diagnose(src.Name, err)
	}
	if diags := p.checkEntrypoints(); len(diags) > 0 {
		return nil, &Error{Source: src.Name, Diagnostics: diags}
	}
	p.store = inmem.NewFromObject(src.Data)
	if p.classify, err = p.prepare(ctx, EntryClassify); err != nil {
		return nil, diagnose(src.Name, err)
	}
	if len(p.compiler.GetRules(entryRef(EntryVictims))) > 0 {
		q, err := p.prepare(ctx, EntryVictims)
		if err != nil {
			return nil, diagnose(src.Name, err)
		}
		p.victims = &q
	}
	if err := p.loadDefault(ctx); err != nil {
		return nil, err
	}
	switch o.Evaluator {
	case EvaluatorTopdown:
		p.planErr = errors.New("topdown chosen in the options")
	case EvaluatorAuto, EvaluatorPlan:
		if p.planned, p.planErr = p.plan(ctx); p.planErr != nil && o.Evaluator == EvaluatorPlan {
			return nil, &Error{Source: src.Name, Diagnostics: []Diagnostic{{Code: CodeEntrypoint,
				Message: "the policy cannot be evaluated as a compiled plan (evaluator plan): " + p.planErr.Error()}}}
		}
	default:
		return nil, fmt.Errorf("unknown evaluator %q: want plan or topdown", o.Evaluator)
	}
	return p, nil
}

// Evaluator says how the policy's entry points are evaluated: EvaluatorPlan
// (OPA's planner and the IR interpreter) or EvaluatorTopdown, with the
// reason the plan is not used.
func (p *Policy) Evaluator() (Evaluator, error) {
	if p.planned != nil {
		return EvaluatorPlan, nil
	}
	return EvaluatorTopdown, p.planErr
}

// deniedBuiltins are left out of the capabilities: a classification must
// not wait on the network or depend on the daemon's own configuration.
var deniedBuiltins = map[string]bool{"http.send": true, "net.lookup_ip_addr": true, "opa.runtime": true}

func newCompiler() (*ast.Compiler, error) {
	caps := ast.CapabilitiesForThisVersion()
	kept := caps.Builtins[:0]
	for _, b := range caps.Builtins {
		if !deniedBuiltins[b.Name] {
			kept = append(kept, b)
		}
	}
	caps.Builtins = kept
	b, err := schema.JSON(schema.Input)
	if err != nil {
		return nil, err
	}
	var in any
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("input schema: %w", err)
	}
	ss := ast.NewSchemaSet()
	ss.Put(ast.SchemaRootRef, in)
	return ast.NewCompiler().WithStrict(true).WithEnablePrintStatements(true).
		WithCapabilities(caps).WithSchemas(ss).WithDefaultRegoVersion(ast.RegoV1), nil
}

func compile(mods map[string]*ast.Module) (*ast.Compiler, error) {
	c, err := newCompiler()
	if err != nil {
		return nil, err
	}
	if c.Compile(mods); c.Failed() {
		return nil, c.Errors
	}
	return c, nil
}

func entryRef(name string) ast.Ref {
	return ast.MustParseRef("data.arbiter." + name)
}

func (p *Policy) prepare(ctx context.Context, entry string) (opa.PreparedEvalQuery, error) {
	return opa.New(
		opa.Query("data.arbiter."+entry),
		opa.Compiler(p.compiler),
		opa.Store(p.store),
		opa.EnablePrintStatements(true),
		opa.PrintHook(printHook{p.opts.Print}),
	).PrepareForEval(ctx)
}

// loadDefault evaluates default_decision, which must not depend on input,
// and checks it: it is what every failed classification falls back to.
func (p *Policy) loadDefault(ctx context.Context) error {
	q, err := p.prepare(ctx, EntryDefault)
	if err != nil {
		return diagnose(p.src.Name, err)
	}
	loc := p.ruleLocation(EntryDefault)
	diag := func(msg string) error {
		d := Diagnostic{Code: CodeEntrypoint, Message: msg}
		if loc != nil {
			d.File, d.Row, d.Col = loc.File, loc.Row, loc.Col
		}
		return &Error{Source: p.src.Name, Diagnostics: []Diagnostic{d}}
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.EvalTimeout)
	defer cancel()
	rs, err := q.Eval(ctx)
	if err != nil {
		return diag(fmt.Sprintf("evaluating data.arbiter.default_decision: %v", p.evalError(err)))
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return diag("data.arbiter.default_decision is undefined without input: it must be a constant decision")
	}
	v := rs[0].Expressions[0].Value
	if fe := p.schemas.Decision.Validate(v); fe != nil {
		return diag("data.arbiter.default_decision: " + fe.Error())
	}
	p.def = decodeDecision(schema.JSONDoc{}, v)
	return nil
}

func (p *Policy) ruleLocation(entry string) *ast.Location {
	rules := p.compiler.GetRules(entryRef(entry))
	if len(rules) == 0 {
		return nil
	}
	return rules[0].Location
}

// Name returns the directory or bundle the policy came from.
func (p *Policy) Name() string { return p.src.Name }

// Revision identifies the policy's content.
func (p *Policy) Revision() string { return p.src.Revision }

// Source returns what the policy was built from.
func (p *Policy) Source() *Source { return p.src }

// Default returns the policy's default decision.
func (p *Policy) Default() Decision { return p.def }

// HasVictims says whether the policy defines data.arbiter.victims.
func (p *Policy) HasVictims() bool { return p.victims != nil }

// Classify decides the class of one process. It never fails to return a
// usable decision: when evaluation fails, times out, or yields a value that
// does not fit schema/decision.json, the policy's default decision is
// returned together with a *DecisionError naming the process and the field.
// An undefined classify also yields the default decision, without error.
func (p *Policy) Classify(ctx context.Context, in Input) (Decision, error) {
	var (
		v       ast.Value
		defined bool
		err     error
	)
	if p.planned != nil {
		// The plan asks for what the policy reads, path by path.
		v, defined, err = p.evalPlanned(ctx, EntryClassify, &irvm.Options{Source: &inputSource{in: &in, gpus: p.gpusValue(in.Node.GPUs)}})
	} else {
		v, defined, err = p.eval(ctx, EntryClassify, in.value(p.gpusValue(in.Node.GPUs)), nil)
	}
	return p.decide(v, defined, err, in.Process.PID, in.Process.Comm)
}

func (p *Policy) decide(v ast.Value, defined bool, err error, pid int, comm string) (Decision, error) {
	fail := func(field string, err error) (Decision, error) {
		return p.def, &DecisionError{Entrypoint: EntryClassify, PID: pid, Comm: comm, Field: field, Fallback: p.def.Class, Err: err}
	}
	if err != nil {
		return fail("", err)
	}
	if !defined {
		return p.def, nil
	}
	if d, ok := p.decided.get(v); ok {
		return d, nil
	}
	if fe := p.schemas.Decision.ValidateAST(p.schemas.AST, v); fe != nil {
		return fail(fe.Field, errors.New(fe.Message))
	}
	d := decodeDecision(p.schemas.AST, v)
	p.decided.put(v, d)
	return d, nil
}

// Victims evaluates the control-loop entry point. A policy without one, or
// an undefined result, asks for nothing. A failed evaluation or a value
// that does not fit schema/victims.json (or names a process not in s)
// yields an empty decision and a *DecisionError: no process is ever
// suspended on a guess.
func (p *Policy) Victims(ctx context.Context, s State) (VictimDecision, error) {
	if p.victims == nil {
		return VictimDecision{}, nil
	}
	v, defined, err := p.eval(ctx, EntryVictims, s.value(p.gpusValue(s.Node.GPUs)), nil)
	var pids map[int]bool
	return p.decideVictims(v, defined, err, func(pid int) bool {
		if pids == nil {
			pids = make(map[int]bool, len(s.Processes))
			for i := range s.Processes {
				pids[s.Processes[i].PID] = true
			}
		}
		return pids[pid]
	})
}

func (p *Policy) decideVictims(v ast.Value, defined bool, err error, known func(int) bool) (VictimDecision, error) {
	fail := func(field string, err error) (VictimDecision, error) {
		return VictimDecision{}, &DecisionError{Entrypoint: EntryVictims, Field: field, Err: err}
	}
	if err != nil {
		return fail("", err)
	}
	if !defined {
		return VictimDecision{}, nil
	}
	if fe := p.schemas.Victims.ValidateAST(p.schemas.AST, v); fe != nil {
		return fail(fe.Field, errors.New(fe.Message))
	}
	d := decodeVictims(p.schemas.AST, v)
	if known != nil {
		for i, s := range d.Suspend {
			if !known(s.PID) {
				return fail(fmt.Sprintf("suspend[%d].pid", i), fmt.Errorf("pid %d is not a managed process", s.PID))
			}
		}
		for i, t := range d.Throttle {
			if !known(t.PID) {
				return fail(fmt.Sprintf("throttle[%d].pid", i), fmt.Errorf("pid %d is not a managed process", t.PID))
			}
		}
	}
	return d, nil
}

// eval runs an entry point (classify or victims) on input under the
// evaluation deadline: through the compiled plan when there is one and no
// trace is asked for, else through topdown.
func (p *Policy) eval(ctx context.Context, entry string, input ast.Value, tracer topdown.QueryTracer) (ast.Value, bool, error) {
	if p.planned != nil && tracer == nil {
		return p.evalPlanned(ctx, entry, &irvm.Options{Input: ast.NewTerm(input)})
	}
	q := p.classify
	if entry == EntryVictims {
		q = *p.victims
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.EvalTimeout)
	defer cancel()
	opts := []opa.EvalOption{opa.EvalParsedInput(input)}
	if tracer != nil {
		opts = append(opts, opa.EvalQueryTracer(tracer))
	}
	rs, err := q.Eval(ctx, opts...)
	if err != nil {
		return nil, false, p.evalError(err)
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return nil, false, nil
	}
	// The decision is read as OPA's AST on both paths.
	v, err := ast.InterfaceToValue(rs[0].Expressions[0].Value)
	if err != nil {
		return nil, false, fmt.Errorf("data.arbiter.%s: %w", entry, err)
	}
	return v, true, nil
}

// evalPlanned runs an entry point's plan. The deadline is checked by the
// interpreter itself, so no timer is set up per call.
func (p *Policy) evalPlanned(ctx context.Context, entry string, o *irvm.Options) (ast.Value, bool, error) {
	plan := planClassify
	if entry == EntryVictims {
		plan = planVictims
	}
	o.Data, o.Deadline, o.Print = p.planned.data, time.Now().Add(p.opts.EvalTimeout), printHook{p.opts.Print}
	rs, err := p.planned.prog.Eval(ctx, plan, o)
	if err != nil {
		var ie *irvm.Error
		if errors.As(err, &ie) && ie.Code == irvm.CodeCancel {
			return nil, false, fmt.Errorf("evaluation stopped after %v (Options.EvalTimeout): %w", p.opts.EvalTimeout, err)
		}
		return nil, false, err
	}
	if len(rs) == 0 {
		return nil, false, nil
	}
	obj, ok := rs[0].Value.(ast.Object)
	if !ok {
		return nil, false, fmt.Errorf("plan %s returned %v, not a result object", plan, rs[0])
	}
	res := obj.Get(resultKey)
	if res == nil {
		return nil, false, nil
	}
	return res.Value, true, nil
}

var resultKey = ast.StringTerm("result")

func (p *Policy) evalError(err error) error {
	if topdown.IsCancel(err) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("evaluation stopped after %v (Options.EvalTimeout): %w", p.opts.EvalTimeout, err)
	}
	return err
}

type printHook struct{ f func(Print) }

func (h printHook) Print(ctx print.Context, msg string) error {
	if h.f == nil {
		return nil
	}
	pr := Print{Message: msg}
	if ctx.Location != nil {
		pr.File, pr.Row = ctx.Location.File, ctx.Location.Row
	}
	h.f(pr)
	return nil
}
