package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	opacompile "github.com/open-policy-agent/opa/v1/compile"
	"github.com/open-policy-agent/opa/v1/ir"

	"github.com/gpu-arbiter/arbiter/policy/irvm"
)

// Evaluator names how a policy's entry points are evaluated.
type Evaluator string

// Evaluators.
const (
	// EvaluatorAuto uses the compiled plan when the policy can be planned
	// and OPA's topdown evaluator otherwise. The default.
	EvaluatorAuto Evaluator = ""
	// EvaluatorPlan requires the compiled plan: a policy that cannot be
	// planned fails to load.
	EvaluatorPlan Evaluator = "plan"
	// EvaluatorTopdown always uses OPA's topdown evaluator.
	EvaluatorTopdown Evaluator = "topdown"
)

// ParseEvaluator checks a user-given evaluator name.
func ParseEvaluator(s string) (Evaluator, error) {
	switch e := Evaluator(s); e {
	case "auto":
		return EvaluatorAuto, nil
	case EvaluatorAuto, EvaluatorPlan, EvaluatorTopdown:
		return e, nil
	}
	return "", fmt.Errorf("unknown evaluator %q: want auto, plan or topdown", s)
}

// planned is a policy compiled to OPA's intermediate representation and
// prepared for the IR interpreter.
type planned struct {
	prog *irvm.Program
	data *ast.Term
}

// Plan names inside the compiled IR.
const (
	planClassify = "arbiter/" + EntryClassify
	planVictims  = "arbiter/" + EntryVictims
)

// plan compiles the policy's entry points to OPA's IR with OPA's own
// planner (the one its Wasm compiler uses) and prepares the result for
// the interpreter.
func (p *Policy) plan(ctx context.Context) (*planned, error) {
	names := make([]string, 0, len(p.src.Modules))
	for name := range p.src.Modules {
		names = append(names, name)
	}
	sort.Strings(names)
	b := &bundle.Bundle{Data: p.src.Data}
	if b.Data == nil {
		b.Data = map[string]any{}
	}
	for _, name := range names {
		m := p.src.Modules[name]
		b.Modules = append(b.Modules, bundle.ModuleFile{Path: name, URL: name, Parsed: m, Raw: []byte(m.String())})
	}
	entries := []string{planClassify}
	if p.victims != nil {
		entries = append(entries, planVictims)
	}
	// WithPruneUnused: plan what the entry points need, not also every
	// rule that depends on them (the policy's tests).
	c := opacompile.New().WithTarget(opacompile.TargetPlan).WithEntrypoints(entries...).WithBundle(b).WithPruneUnused(true).
		WithCapabilities(p.compiler.Capabilities()).WithEnablePrintStatements(true).
		WithRegoVersion(ast.RegoV1).WithOutput(io.Discard)
	if err := c.Build(ctx); err != nil {
		return nil, fmt.Errorf("planning: %w", err)
	}
	out := c.Bundle()
	if out == nil || len(out.PlanModules) == 0 {
		return nil, errors.New("planning produced no plan")
	}
	var pol ir.Policy
	if err := json.Unmarshal(out.PlanModules[0].Raw, &pol); err != nil {
		return nil, fmt.Errorf("reading the plan: %w", err)
	}
	prog, err := irvm.Compile(&pol)
	if err != nil {
		return nil, err
	}
	data, err := ast.InterfaceToValue(b.Data)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	return &planned{prog: prog, data: ast.NewTerm(data)}, nil
}
