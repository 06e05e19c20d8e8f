package irvm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/compile"
	"github.com/open-policy-agent/opa/v1/ir"

	"github.com/gpu-arbiter/arbiter/policy/irvm"
)

// plan compiles Rego source with OPA's planner for the entrypoint
// test/result, as the policy package does for its entry points.
func plan(t testing.TB, src string) *ir.Policy {
	t.Helper()
	m, err := ast.ParseModuleWithOpts("p.rego", src, ast.ParserOptions{RegoVersion: ast.RegoV1})
	if err != nil {
		t.Fatal(err)
	}
	c := compile.New().WithTarget(compile.TargetPlan).WithEntrypoints("test/result").WithPruneUnused(true).
		WithBundle(&bundle.Bundle{Modules: []bundle.ModuleFile{{Path: "p.rego", URL: "p.rego", Raw: []byte(src), Parsed: m}}, Data: map[string]any{}}).
		WithEnablePrintStatements(true).WithRegoVersion(ast.RegoV1).WithOutput(&bytes.Buffer{})
	if err := c.Build(context.Background()); err != nil {
		t.Fatal(err)
	}
	var p ir.Policy
	if err := json.Unmarshal(c.Bundle().PlanModules[0].Raw, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

func program(t testing.TB, src string) *irvm.Program {
	t.Helper()
	p, err := irvm.Compile(plan(t, src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func term(t testing.TB, s string) *ast.Term {
	t.Helper()
	v, err := ast.ParseTerm(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// result evaluates test/result and returns its value, nil if undefined.
func result(t testing.TB, p *irvm.Program, o *irvm.Options) *ast.Term {
	t.Helper()
	rs, err := p.Eval(context.Background(), "test/result", o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) == 0 {
		return nil
	}
	return rs[0].Value.(ast.Object).Get(ast.StringTerm("result"))
}

func TestInputNeeds(t *testing.T) {
	tests := []struct {
		name, rego string
		want       string // the need tree as JSON; "null": the whole input
	}{
		{"static refs", `result := [input.a.b, input.c] if input.d.e == 1`,
			`{"a":{"b":true},"c":true,"d":{"e":true}}`},
		{"dynamic key needs the whole object", `result := input.labels[k] if k := input.key`,
			`{"key":true,"labels":true}`},
		{"a function of a value needs all of it", `result := count(input.process.cmdline) if input.process.pid > 0`,
			`{"process":{"cmdline":true,"pid":true}}`},
		{"through a helper rule", `f(x) := x.name
result := f(input.pod)`, `{"pod":true}`},
		{"iteration", `result := [x | some x in input.items; x.ok]`, `{"items":true}`},
		{"the whole input", `result := json.marshal(input)`, `null`},
		{"with replaces the input", `r if input.x == 1
result := true if { r with input.x as 1; input.y }`, `null`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := program(t, "package test\n\n"+tt.rego+"\n")
			got := needJSON(p.Input())
			if got != tt.want {
				t.Fatalf("need %s, want %s", got, tt.want)
			}
		})
	}
}

// needJSON renders a need tree compactly: true for a whole value.
func needJSON(n *irvm.Need) string {
	var render func(n *irvm.Need) any
	render = func(n *irvm.Need) any {
		if n.Whole {
			return true
		}
		m := map[string]any{}
		for k, c := range n.Fields {
			m[k] = render(c)
		}
		return m
	}
	if n == nil {
		return "null"
	}
	b, _ := json.Marshal(render(n))
	return string(b)
}

// TestPrunedInputGivesTheSameResult evaluates on the whole input and on
// the input cut down to what Input reports, for inputs that take every
// branch.
func TestPrunedInputGivesTheSameResult(t *testing.T) {
	p := program(t, `package test

result := {"who": input.user, "n": count(input.tags), "lc": lc} if input.kind == "job"
result := {"who": input.user} if input.kind == "svc"
lc if input.labels["class"] == "lc"
`)
	need := p.Input()
	for _, in := range []string{
		`{"kind": "job", "user": "a", "tags": [1, 2], "labels": {"class": "lc", "x": 1}, "junk": {"deep": [1]}}`,
		`{"kind": "job", "user": "a", "tags": [], "labels": {"class": "be"}}`,
		`{"kind": "svc", "user": "b", "tags": [1]}`,
		`{"kind": "other", "user": "c"}`,
	} {
		whole := term(t, in)
		pruned := ast.NewTerm(prune(whole.Value, need))
		src := &termSource{doc: whole}
		a, b := result(t, p, &irvm.Options{Input: whole}), result(t, p, &irvm.Options{Input: pruned})
		c := result(t, p, &irvm.Options{Source: src})
		if (a == nil) != (b == nil) || (a != nil && !a.Equal(b)) {
			t.Fatalf("input %s: whole gives %v, pruned (%v) gives %v", in, a, pruned, b)
		}
		if (a == nil) != (c == nil) || (a != nil && !a.Equal(c)) {
			t.Fatalf("input %s: whole gives %v, from a source %v (asked %v)", in, a, c, src.asked)
		}
		if strings.Contains(pruned.String(), "junk") || strings.Contains(fmt.Sprint(src.asked), "junk") {
			t.Fatalf("an unread field was kept (%v) or asked for (%v)", pruned, src.asked)
		}
		for _, q := range src.asked {
			if q == "value " || q == "value tags" && !strings.Contains(in, "job") {
				t.Fatalf("input %s: asked %v: the document whole, or tags where no rule reads them", in, src.asked)
			}
		}
	}
}

// termSource serves a document held as a term, recording what it is
// asked for.
type termSource struct {
	doc   *ast.Term
	asked []string
}

func (s *termSource) at(path []string) *ast.Term {
	t := s.doc
	for _, k := range path {
		if t == nil {
			return nil // no input at all
		}
		obj, ok := t.Value.(ast.Object)
		if !ok {
			return nil
		}
		if t = obj.Get(ast.StringTerm(k)); t == nil {
			return nil
		}
	}
	return t
}

func (s *termSource) Value(path []string) *ast.Term {
	s.asked = append(s.asked, "value "+strings.Join(path, "."))
	return s.at(path)
}

func (s *termSource) Has(path []string) bool {
	s.asked = append(s.asked, "has "+strings.Join(path, "."))
	return s.at(path) != nil
}

func prune(v ast.Value, n *irvm.Need) ast.Value {
	obj, ok := v.(ast.Object)
	if n == nil || n.Whole || !ok {
		return v
	}
	out := ast.NewObject()
	for k, c := range n.Fields {
		if x := obj.Get(ast.StringTerm(k)); x != nil {
			out.Insert(ast.StringTerm(k), ast.NewTerm(prune(x.Value, c)))
		}
	}
	return out
}

// TestConstantsAreKept checks that a rule depending on data alone is
// computed once per data document, and that one printing or reading the
// clock is computed on every evaluation.
func TestConstantsAreKept(t *testing.T) {
	p := program(t, `package test

classes := {"lc": {"priority": 900, "limit": data.limit}, "be": {"priority": 100}}
stamp := {"at": time.now_ns()}
result := [classes[input.c], stamp]
`)
	data := term(t, `{"limit": 3}`)
	first := result(t, p, &irvm.Options{Input: term(t, `{"c": "lc"}`), Data: data, Time: time.Unix(1, 0)})
	second := result(t, p, &irvm.Options{Input: term(t, `{"c": "lc"}`), Data: data, Time: time.Unix(2, 0)})
	arr1, arr2 := first.Value.(*ast.Array), second.Value.(*ast.Array)
	if arr1.Elem(0) != arr2.Elem(0) {
		t.Fatal("a rule of data alone was computed again for the same data")
	}
	if arr1.Elem(1).Equal(arr2.Elem(1)) {
		t.Fatalf("a rule reading the clock was kept: %v and %v", arr1.Elem(1), arr2.Elem(1))
	}
	other := result(t, p, &irvm.Options{Input: term(t, `{"c": "lc"}`), Data: term(t, `{"limit": 4}`)})
	if got := other.Value.(*ast.Array).Elem(0).Value.(ast.Object).Get(ast.StringTerm("limit")); !got.Equal(ast.IntNumberTerm(4)) {
		t.Fatalf("other data gave limit %v, want 4", got)
	}
}

func TestErrors(t *testing.T) {
	p := program(t, `package test

result := 1 if input.a
result := 2 if input.b
`)
	_, err := p.Eval(context.Background(), "test/result", &irvm.Options{Input: term(t, `{"a": true, "b": true}`)})
	var e *irvm.Error
	if !errors.As(err, &e) || e.Code != irvm.CodeConflict || e.Location == nil || e.Location.File != "p.rego" {
		t.Fatalf("conflict: %v", err)
	}
	if got := result(t, p, &irvm.Options{Input: term(t, `{"a": true}`)}); !got.Equal(ast.IntNumberTerm(1)) {
		t.Fatalf("no conflict: %v", got)
	}

	if _, err := p.Eval(context.Background(), "nope", nil); err == nil || !strings.Contains(err.Error(), `no plan "nope"`) {
		t.Fatalf("unknown plan: %v", err)
	}
	if _, err := irvm.Compile(nil); err == nil {
		t.Fatal("nil plan compiled")
	}
	walk := plan(t, "package test\n\nresult := [p | walk(input, [p, _])]\n")
	if _, err := irvm.Compile(walk); !errors.Is(err, irvm.ErrUnsupported) || !strings.Contains(err.Error(), "walk") {
		t.Fatalf("walk: %v", err)
	}
}

func TestCancel(t *testing.T) {
	p := program(t, `package test

result := count([1 | some i in numbers.range(1, 2000); some j in numbers.range(1, 2000); i != j])
`)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var e *irvm.Error
	if _, err := p.Eval(ctx, "test/result", nil); !errors.As(err, &e) || e.Code != irvm.CodeCancel {
		t.Fatalf("cancelled context: %v", err)
	}
	start := time.Now()
	_, err := p.Eval(context.Background(), "test/result", &irvm.Options{Deadline: time.Now().Add(10 * time.Millisecond)})
	if !errors.As(err, &e) || e.Code != irvm.CodeCancel || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("deadline: %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("stopped after %v for a 10ms deadline", el)
	}
}

// TestConcurrentEvaluations shares one program between goroutines, each
// with its own input; every result must be its own.
func TestConcurrentEvaluations(t *testing.T) {
	p := program(t, `package test

base := {"n": 1}
result := sprintf("%s-%d-%d", [input.name, count([x | some x in input.xs]), base.n])
`)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				name := fmt.Sprintf("g%d", g)
				in := term(t, fmt.Sprintf(`{"name": %q, "xs": %s}`, name, strings.Repeat("[1", 1)+strings.Repeat(",1", i%5)+"]"))
				rs, err := p.Eval(context.Background(), "test/result", &irvm.Options{Input: in})
				if err != nil {
					errs <- err
					return
				}
				want := fmt.Sprintf("%s-%d-1", name, 1+i%5)
				if got := rs[0].Value.(ast.Object).Get(ast.StringTerm("result")); !got.Equal(ast.StringTerm(want)) {
					errs <- fmt.Errorf("goroutine %d, round %d: %v, want %s", g, i, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestInputNeedsAcrossJoins builds plans by hand in which a lookup's
// value is read only after ways through the code join: the value may
// still be in the local, so the input must carry all of it.
func TestInputNeedsAcrossJoins(t *testing.T) {
	loc := func(l int) ir.Operand { return ir.Operand{Value: ir.Local(l)} }
	str := func(i int) ir.Operand { return ir.Operand{Value: ir.StringIndex(i)} }
	dot := func(src, key, dst int) ir.Stmt {
		return &ir.DotStmt{Source: loc(src), Key: str(key), Target: ir.Local(dst)}
	}
	result := func(l int) []ir.Stmt {
		return []ir.Stmt{&ir.MakeObjectStmt{Target: 9}, &ir.ObjectInsertStmt{Key: str(2), Value: loc(l), Object: 9}, &ir.ResultSetAddStmt{Value: 9}}
	}
	policy := func(blocks ...*ir.Block) *ir.Policy {
		return &ir.Policy{
			Static: &ir.Static{Strings: []*ir.StringConst{{Value: "a"}, {Value: "b"}, {Value: "result"}}},
			Plans:  &ir.Plans{Plans: []*ir.Plan{{Name: "test/result", Blocks: blocks}}},
		}
	}
	tests := []struct {
		name string
		p    *ir.Policy
		want string
	}{
		{"straight line: only the field read", policy(&ir.Block{Stmts: append([]ir.Stmt{dot(0, 0, 2), dot(2, 1, 3)}, result(3)...)}),
			`{"a":{"b":true}}`},
		{"after a nested block", policy(&ir.Block{Stmts: append([]ir.Stmt{
			&ir.BlockStmt{Blocks: []*ir.Block{{Stmts: []ir.Stmt{dot(0, 0, 2)}}}},
		}, result(2)...)}), `{"a":true}`},
		{"in a later block", policy(&ir.Block{Stmts: []ir.Stmt{dot(0, 0, 2)}}, &ir.Block{Stmts: result(2)}),
			`{"a":true}`},
		{"a lookup in it after a join", policy(&ir.Block{Stmts: append([]ir.Stmt{
			&ir.NotStmt{Block: &ir.Block{Stmts: []ir.Stmt{dot(0, 0, 2), &ir.BreakStmt{}}}},
			dot(2, 1, 3),
		}, result(3)...)}), `{"a":true}`},
		{"overwritten before the read", policy(&ir.Block{Stmts: append([]ir.Stmt{
			&ir.BlockStmt{Blocks: []*ir.Block{{Stmts: []ir.Stmt{dot(0, 0, 2)}}}},
			&ir.MakeNullStmt{Target: 2},
		}, result(2)...)}), `{"a":{}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := irvm.Compile(tt.p)
			if err != nil {
				t.Fatal(err)
			}
			if got := needJSON(p.Input()); got != tt.want {
				t.Fatalf("need %s, want %s", got, tt.want)
			}
		})
	}
}
