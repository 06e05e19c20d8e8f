package irvm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/test/cases"
	"github.com/open-policy-agent/opa/v1/test/cases/testdata"
	"go.yaml.in/yaml/v3"

	"github.com/gpu-arbiter/arbiter/policy/irvm"
)

// planCapture is an OPA target plugin that keeps the plan OPA's planner
// makes for a query instead of evaluating it: the way to plan an
// arbitrary query with OPA's public API.
type planCapture struct {
	mu   sync.Mutex
	plan *ir.Policy
}

const captureTarget = "arbiter-irvm-cases"

func (*planCapture) IsTarget(t string) bool { return t == captureTarget }

func (c *planCapture) PrepareForEval(_ context.Context, p *ir.Policy, _ ...rego.PrepareOption) (rego.TargetPluginEval, error) {
	c.plan = p
	return c, nil
}

func (*planCapture) Eval(context.Context, *rego.EvalContext, ast.Value) (ast.Value, error) {
	return nil, errors.New("plans only")
}

var (
	captureOnce sync.Once
	capture     = &planCapture{}
)

// planQuery plans a conformance case's query and modules.
func planQuery(tc cases.TestCase) (*ir.Policy, error) {
	captureOnce.Do(func() { rego.RegisterPlugin(captureTarget, capture) })
	capture.mu.Lock()
	defer capture.mu.Unlock()
	capture.plan = nil
	opts := []func(*rego.Rego){rego.Target(captureTarget), rego.Query(tc.Query), rego.SetRegoVersion(ast.RegoV1)}
	if tc.ExperimentalKeywords {
		opts = append(opts, rego.Capabilities(ast.CapabilitiesForThisVersion(ast.CapabilitiesExperimentalKeywords(true))))
	}
	for i, m := range tc.Modules {
		opts = append(opts, rego.Module(fmt.Sprintf("module-%d.rego", i), m))
	}
	if _, err := rego.New(opts...).PrepareForEval(context.Background()); err != nil {
		return nil, err
	}
	if capture.plan == nil || capture.plan.Plans == nil || len(capture.plan.Plans.Plans) != 1 {
		return nil, errors.New("no single plan")
	}
	return capture.plan, nil
}

// TestOPAConformance runs OPA's own conformance cases (the suite OPA's
// evaluators and its Wasm and IR runtimes are held to) through the
// interpreter: every case OPA can plan and the interpreter accepts must
// give the wanted result or error. Cases are counted by outcome; a case
// that fails fails the test with its note, query, and what was wanted and
// got.
func TestOPAConformance(t *testing.T) {
	var all []cases.TestCase
	err := fs.WalkDir(testdata.V1, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		b, err := testdata.V1.ReadFile(path)
		if err != nil {
			return err
		}
		set, err := decodeCases(b)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		all = append(all, set.Cases...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("testdata/conformance-exceptions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var exceptions map[string]string
	if err := yaml.Unmarshal(b, &exceptions); err != nil {
		t.Fatal(err)
	}
	var passed, unplanned, unsupported, strict, excepted int
	var unsupportedWhy []string
	for _, tc := range all {
		if tc.StrictError || len(tc.Env) > 0 {
			strict++ // strict built-in errors: a topdown mode, not part of the IR semantics
			continue
		}
		p, err := planQuery(tc)
		if err != nil {
			unplanned++
			continue
		}
		prog, err := irvm.Compile(p)
		if errors.Is(err, irvm.ErrUnsupported) {
			unsupported++
			unsupportedWhy = append(unsupportedWhy, tc.Note+": "+err.Error())
			continue
		}
		if err != nil {
			t.Errorf("%s: compile: %v", tc.Note, err)
			continue
		}
		msg := runCase(tc, prog, p.Plans.Plans[0].Name)
		if why, ok := exceptions[tc.Note]; ok {
			if msg == "" {
				t.Errorf("%s: passes, but is listed as an exception (%s): remove it from the list", tc.Note, why)
			}
			excepted++
			continue
		}
		if msg != "" {
			t.Errorf("%s\n  query: %s\n  %s", tc.Note, tc.Query, msg)
			continue
		}
		passed++
	}
	t.Logf("%d cases: %d passed, %d not plannable by OPA, %d not run by the interpreter (topdown runs those), %d for strict built-in errors or environment variables, %d known exceptions",
		len(all), passed, unplanned, unsupported, strict, excepted)
	if testing.Verbose() {
		for _, w := range unsupportedWhy {
			t.Log("not run: " + w)
		}
	}
	if passed < len(all)/2 {
		t.Fatalf("only %d of %d cases ran: the suite or the planning broke", passed, len(all))
	}
}

// runCase evaluates one case and says what differs from what it wants.
func runCase(tc cases.TestCase, prog *irvm.Program, plan string) string {
	o := &irvm.Options{Data: ast.NewTerm(ast.NewObject())}
	switch {
	case tc.InputTerm != nil:
		in, err := ast.ParseTerm(*tc.InputTerm)
		if err != nil {
			return "input term: " + err.Error()
		}
		o.Input = in
	case tc.Input != nil:
		o.Input = ast.NewTerm(ast.MustInterfaceToValue(*tc.Input))
	}
	if tc.Data != nil {
		o.Data = ast.NewTerm(ast.MustInterfaceToValue(*tc.Data))
	}
	rs, err := prog.Eval(context.Background(), plan, o)
	var ie *irvm.Error
	switch {
	case tc.WantErrorCode != nil || tc.WantError != nil:
		if err == nil {
			return fmt.Sprintf("want error %v %v, got result %v", deref(tc.WantErrorCode), deref(tc.WantError), rs)
		}
		if tc.WantErrorCode != nil && (!errors.As(err, &ie) || ie.Code != *tc.WantErrorCode) {
			return fmt.Sprintf("want error code %s, got %v", *tc.WantErrorCode, err)
		}
		if tc.WantError != nil && !strings.Contains(err.Error(), *tc.WantError) {
			return fmt.Sprintf("want error %q, got %v", *tc.WantError, err)
		}
		return ""
	case err != nil:
		return "unexpected error: " + err.Error()
	case tc.WantDefined != nil:
		if (len(rs) > 0) != *tc.WantDefined {
			return fmt.Sprintf("want defined %v, got %v", *tc.WantDefined, rs)
		}
		return ""
	case tc.WantResult != nil:
		want := ast.NewSet()
		for _, b := range *tc.WantResult {
			obj := ast.NewObject()
			for k, v := range b {
				obj.Insert(ast.StringTerm(k), ast.NewTerm(ast.MustInterfaceToValue(v)))
			}
			want.Add(ast.NewTerm(obj))
		}
		got := ast.NewSet()
		for _, r := range rs {
			obj := ast.NewObject()
			r.Value.(ast.Object).Foreach(func(k, v *ast.Term) {
				name := string(k.Value.(ast.String))
				if tc.IgnoreGeneratedVars && strings.HasPrefix(name, "__localq") {
					return
				}
				j, err := ast.JSON(v.Value)
				if err != nil {
					return
				}
				if tc.SortBindings {
					if arr, ok := j.([]any); ok {
						slices.SortFunc(arr, func(a, b any) int { return ast.Compare(ast.MustInterfaceToValue(a), ast.MustInterfaceToValue(b)) })
					}
				}
				obj.Insert(k, ast.NewTerm(ast.MustInterfaceToValue(j)))
			})
			got.Add(ast.NewTerm(obj))
		}
		if want.Compare(got) != 0 {
			return fmt.Sprintf("want %v\n  got  %v", want, got)
		}
	}
	return ""
}

// decodeCases reads a case file as OPA's runners do: YAML 1.2 (so that a
// key such as on stays a string) with numbers kept exact.
func decodeCases(b []byte) (cases.Set, error) {
	var set cases.Set
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return set, err
	}
	v, err := nodeValue(&doc)
	if err != nil {
		return set, err
	}
	j, err := json.Marshal(v)
	if err != nil {
		return set, err
	}
	d := json.NewDecoder(bytes.NewReader(j))
	d.UseNumber()
	return set, d.Decode(&set)
}

func nodeValue(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return nodeValue(n.Content[0])
	case yaml.AliasNode:
		return nodeValue(n.Alias)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			v, err := nodeValue(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[n.Content[i].Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := nodeValue(c)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	switch n.ShortTag() {
	case "!!int", "!!float":
		return json.Number(n.Value), nil
	case "!!bool":
		var b bool
		err := n.Decode(&b)
		return b, err
	case "!!null":
		return nil, nil
	}
	return n.Value, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
