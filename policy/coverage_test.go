package policy

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
)

// coverTests are the tests of the one-rule policies below: test_be takes
// classify's else branch, test_lc its first.
const coverTests = `package arbiter_test

import data.arbiter

doc(comm) := {"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": "2026-01-10T12:00:00Z", "gpus": []}, "process": {"pid": 7, "comm": comm}}

test_be if arbiter.classify.class == "best-effort" with input as doc("python3")

test_lc if arbiter.classify.class == "latency-critical" with input as doc("vllm")
`

// TestCoverageOfOneLineElse: a test that takes the else branch of a rule
// written on one line covers that branch; what it leaves is the first
// branch, by column, and the figure is the one the same rule gets written
// over several lines.
func TestCoverageOfOneLineElse(t *testing.T) {
	const lc = `{"class": "latency-critical"}`
	oneLine := header + "classify := " + lc + ` if input.process.comm == "vllm" else := default_decision` + "\n"
	lines := header + "classify := " + lc + " if {\n\tinput.process.comm == \"vllm\"\n} else := default_decision\n"
	run := func(policy, tests string) *TestReport {
		t.Helper()
		src, err := Read(writeDir(t, map[string]string{"p.rego": policy, "p_test.rego": tests}), nil)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Test(context.Background(), src, &TestOptions{Run: "test_be", Coverage: true})
		if err != nil || !rep.OK() {
			t.Fatalf("%+v %v", rep, err)
		}
		for i := range rep.NotCovered {
			rep.NotCovered[i].File = filepath.Base(rep.NotCovered[i].File)
		}
		return rep
	}
	rep := run(oneLine, coverTests)
	want := []Uncovered{{File: "p.rego", Row: 5, FromCol: 1, ToCol: 73}}
	if !slices.Equal(rep.NotCovered, want) || !rep.NotCovered[0].Partial() || rep.NotCovered[0].String() != "p.rego:5:1-73" {
		t.Errorf("one line, else taken: not covered %v, want only the first branch %v", rep.NotCovered, want)
	}
	multi := run(lines, coverTests)
	if !slices.Equal(multi.NotCovered, []Uncovered{{File: "p.rego", Row: 5}, {File: "p.rego", Row: 6}}) {
		t.Errorf("several lines, else taken: not covered %v", multi.NotCovered)
	}
	if rep.Coverage != multi.Coverage || rep.Coverage != 50 {
		t.Errorf("coverage %.1f%% on one line, %.1f%% over several; want 50%% for both (default_decision and the else branch of four)", rep.Coverage, multi.Coverage)
	}
	both := writeDir(t, map[string]string{"p.rego": oneLine, "p_test.rego": coverTests})
	src, err := Read(both, nil)
	if err != nil {
		t.Fatal(err)
	}
	all, err := Test(context.Background(), src, &TestOptions{Coverage: true})
	if err != nil || all.Coverage != 100 || len(all.NotCovered) != 0 {
		t.Fatalf("both branches taken: %.1f%%, not covered %v, %v", all.Coverage, all.NotCovered, err)
	}
}
