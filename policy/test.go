package policy

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/cover"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// TestOptions tune Test; nil means defaults.
type TestOptions struct {
	// Run selects tests by a regular expression on their names.
	Run string
	// Coverage computes line coverage of the policy's non-test files.
	Coverage bool
	// Trace keeps each failing test's evaluation trace.
	Trace bool
	// Timeout bounds each test; default 5s.
	Timeout time.Duration
}

// TestReport is the outcome of a policy's Rego tests.
type TestReport struct {
	Results []TestResult `json:"results"`
	Passed  int          `json:"passed"`
	Failed  int          `json:"failed"`
	Errored int          `json:"errored"`
	Skipped int          `json:"skipped"`
	// Coverage is the percentage of the policy's lines (test files and the
	// embedded library excluded) evaluated by the tests, a line holding
	// several rules or branches counting once for each; -1 when not asked.
	Coverage float64 `json:"coverage"`
	// NotCovered lists what the tests did not evaluate, in file order.
	NotCovered []Uncovered `json:"not_covered,omitempty"`
}

// TestResult is one Rego test.
type TestResult struct {
	Package  string           `json:"package"`
	Name     string           `json:"name"`
	File     string           `json:"file"`
	Row      int              `json:"row"`
	Outcome  string           `json:"outcome"` // pass, fail, error or skip
	Error    string           `json:"error,omitempty"`
	Duration time.Duration    `json:"duration_ns"`
	Output   string           `json:"output,omitempty"` // print() output
	Trace    []*topdown.Event `json:"-"`
}

// OK says whether every test ran and passed, and there was at least one.
func (r *TestReport) OK() bool {
	return r.Failed == 0 && r.Errored == 0 && r.Passed > 0
}

// Test compiles src as Load does and runs its Rego tests (rules named
// test_*) with OPA's test runner, the engine behind `opa test`.
func Test(ctx context.Context, src *Source, opts *TestOptions) (*TestReport, error) {
	var o TestOptions
	if opts != nil {
		o = *opts
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	c, err := newCompiler()
	if err != nil {
		return nil, err
	}
	r := tester.NewRunner().SetCompiler(c).SetStore(inmem.NewFromObject(src.Data)).
		SetModules(src.Modules).CapturePrintOutput(true).EnableTracing(o.Trace).
		SetTimeout(o.Timeout).Filter(o.Run).SetParallel(1)
	var cov *cover.Cover
	if o.Coverage {
		cov = cover.New()
		r.SetCoverageQueryTracer(cov)
	}
	ch, err := r.RunTests(ctx, nil)
	if err != nil {
		return nil, diagnose(src.Name, err)
	}
	rep := &TestReport{Coverage: -1}
	for res := range ch {
		tr := TestResult{Package: strings.TrimPrefix(res.Package, "data."), Name: res.Name, Duration: res.Duration, Output: string(res.Output), Trace: res.Trace}
		if res.Location != nil {
			tr.File, tr.Row = res.Location.File, res.Location.Row
		}
		switch {
		case res.Error != nil:
			tr.Outcome, tr.Error = "error", res.Error.Error()
			rep.Errored++
		case res.Fail:
			tr.Outcome = "fail"
			rep.Failed++
		case res.Skip:
			tr.Outcome = "skip"
			rep.Skipped++
		default:
			tr.Outcome = "pass"
			rep.Passed++
		}
		rep.Results = append(rep.Results, tr)
	}
	sort.Slice(rep.Results, func(i, j int) bool {
		a, b := rep.Results[i], rep.Results[j]
		if a.File != b.File {
			return a.File < b.File
		}
		return a.Row < b.Row
	})
	if cov != nil {
		rep.Coverage, rep.NotCovered = coverage(cov, src)
	}
	return rep, nil
}
