package irvm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
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

// conformanceCounts are the outcomes of OPA's conformance cases.
type conformanceCounts struct {
	Cases     int // in OPA's suite
	Passed    int // run by the interpreter as OPA wants, on both inputs
	Unplanned int // OPA's planner refuses them
	Strict    int // strict built-in errors or environment variables: topdown modes
	Excepted  int // answered differently, for a listed reason
	// Unsupported counts the cases the interpreter does not run (a policy
	// using one is evaluated by topdown, the slow path), by what it
	// lacks: "relation walk", "built-in function foo", ...
	Unsupported map[string]int
}

// TestOPAConformance runs OPA's own conformance cases (the suite OPA's
// evaluators and its Wasm and IR runtimes are held to) through the
// interpreter: every case OPA can plan and the interpreter accepts must
// give the wanted result or error, and the same one with the input given
// whole and from an InputSource (the path the classifier takes, asking
// for the input path by path). The counts of each outcome are pinned: a
// case that silently leaves the interpreter for topdown fails the test as
// surely as a wrong answer.
func TestOPAConformance(t *testing.T) {
	// Pinned for OPA v1.22.2. Update only after reading why they moved.
	want := conformanceCounts{Cases: 2400, Passed: 2159, Unplanned: 1, Strict: 224, Excepted: 2,
		Unsupported: map[string]int{"relation walk": 14}}

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
	got := conformanceCounts{Cases: len(all), Unsupported: map[string]int{}}
	var unsupportedWhy []string
	for _, tc := range all {
		if tc.StrictError || len(tc.Env) > 0 {
			got.Strict++ // strict built-in errors: a topdown mode, not part of the IR semantics
			continue
		}
		p, err := planQuery(tc)
		if err != nil {
			got.Unplanned++
			continue
		}
		prog, err := irvm.Compile(p)
		if errors.Is(err, irvm.ErrUnsupported) {
			got.Unsupported[unsupportedWhat(err)]++
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
			got.Excepted++
			continue
		}
		if msg != "" {
			t.Errorf("%s\n  query: %s\n  %s", tc.Note, tc.Query, msg)
			continue
		}
		got.Passed++
	}
	t.Logf("%d cases: %d passed, %d not plannable by OPA, %d not run by the interpreter (topdown runs those) %v, %d for strict built-in errors or environment variables, %d known exceptions",
		got.Cases, got.Passed, got.Unplanned, len(unsupportedWhy), got.Unsupported, got.Strict, got.Excepted)
	if testing.Verbose() {
		for _, w := range unsupportedWhy {
			t.Log("not run: " + w)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("OPA's conformance cases moved:\n  got    %+v\n  pinned %+v\n"+
			"Fewer passed or more unsupported means cases that now break or fall back to topdown, the slow path: "+
			"go test -v -run TestOPAConformance ./policy/irvm lists every case not run, and why. "+
			"If the change is expected (an OPA upgrade that adds, drops or plans cases differently, or an interpreter that runs more), "+
			"set the pins at the top of TestOPAConformance (policy/irvm/cases_test.go) to the counts got, with the OPA version they are for.",
			got, want)
	}
}

// unsupportedWhat is what an ErrUnsupported error says the interpreter
// lacks: "relation walk" from "irvm: g0.data.test.p: relation walk: not
// supported by the IR interpreter".
func unsupportedWhat(err error) string {
	msg := strings.TrimSuffix(err.Error(), ": "+irvm.ErrUnsupported.Error())
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

// runCase evaluates one case twice, with its input given whole and from
// an InputSource, and says how the two differ, or else what differs from
// what the case wants; "" when nothing does.
func runCase(tc cases.TestCase, prog *irvm.Program, plan string) string {
	var in *ast.Term
	switch {
	case tc.InputTerm != nil:
		t, err := ast.ParseTerm(*tc.InputTerm)
		if err != nil {
			return "input term: " + err.Error()
		}
		in = t
	case tc.Input != nil:
		in = ast.NewTerm(ast.MustInterfaceToValue(*tc.Input))
	}
	data := ast.NewTerm(ast.NewObject())
	if tc.Data != nil {
		data = ast.NewTerm(ast.MustInterfaceToValue(*tc.Data))
	}
	rs, err := prog.Eval(context.Background(), plan, &irvm.Options{Data: data, Input: in})
	srcRS, srcErr := prog.Eval(context.Background(), plan, &irvm.Options{Data: data, Source: &termSource{doc: in}})
	if d := disagreement(rs, err, srcRS, srcErr); d != "" {
		return "the input given whole and from an InputSource disagree: " + d
	}
	return judge(tc, rs, err)
}

// disagreement says how two evaluations of one case differ, in their
// errors or their results; "" when they agree.
func disagreement(a []*ast.Term, aErr error, b []*ast.Term, bErr error) string {
	if (aErr == nil) != (bErr == nil) || aErr != nil && aErr.Error() != bErr.Error() {
		return fmt.Sprintf("whole: error %v\n  from the source: error %v", aErr, bErr)
	}
	if len(a) != len(b) || ast.NewSet(a...).Compare(ast.NewSet(b...)) != 0 {
		return fmt.Sprintf("whole: %v\n  from the source: %v", a, b)
	}
	return ""
}

// judge says what differs from what a case wants in its evaluation's
// results or error; "" when nothing does.
func judge(tc cases.TestCase, rs []*ast.Term, err error) string {
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
