package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/sched"
)

// header is a minimal valid policy; tests append rules to it.
const header = `package arbiter

default_decision := {"class": "best-effort", "preemption": {"mode": "suspend"}}

`

func writeDir(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func testInput(pid int, comm string) Input {
	return Input{
		Process: input.Process{PID: pid, Comm: comm, Env: map[string]string{}},
		Node:    Node{Hostname: "n1", Time: time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)},
	}
}

func TestLoadErrorLocations(t *testing.T) {
	tests := []struct {
		name, rego string
		code       string
		row, col   int
		msg        string
	}{
		{"syntax", header + "classify := {\n", "rego_parse_error", 6, 0, "unexpected eof"},
		{"type", header + "classify := d if {\n\td := {\"class\": \"x\"}\n\tcount(42) > 1\n}\n", "rego_type_error", 7, 2, "count"},
		{"undefined function", header + "classify := x if { x := data.arbiter.lib.nope(1) }\n", "rego_type_error", 5, 25, "undefined function data.arbiter.lib.nope"},
		{"unsafe var", header + "classify := x if { y == 1 }\n", "rego_unsafe_var_error", 5, 13, "var x is unsafe"},
		{"undefined input field", header + "classify := default_decision if { input.process.pidd == 1 }\n", "rego_type_error", 5, 35, "undefined ref: input.process.pidd"},
		{"conflicting complete rules", header + "classify := {\"class\": \"a\"}\nclassify contains 1\n", "rego_type_error", 5, 1, "conflicting rules data.arbiter.classify"},
		{"two defaults", header + "default classify := {\"class\": \"a\"}\ndefault classify := {\"class\": \"b\"}\n", "rego_type_error", 1, 1, "multiple default rules data.arbiter.classify found at"},
		{"recursion", header + "classify := x if { x := y }\ny := z\nz := y\n", "rego_recursion_error", 6, 1, "rule data.arbiter.y is recursive"},
		{"strict unused var", header + "classify := default_decision if { x := 1 }\n", "rego_compile_error", 5, 35, "assigned var x unused"},
		{"network builtin", header + "classify := r.body if { r := http.send({\"method\": \"get\", \"url\": \"http://x\"}) }\n", "rego_type_error", 5, 30, "undefined function http.send"},
		{"wrong decision type", header + "classify := {\"class\": \"lc\", \"priority\": \"high\"}\n", CodeDecision, 5, 41, "priority: want integer, got string \"high\""},
		{"decision not an object", header + "classify := \"latency-critical\"\n", CodeDecision, 5, 13, "want object, got string"},
		{"unknown decision field", header + "classify := {\"class\": \"lc\", \"preemption\": {\"mode\": \"suspend\", \"timeslice_ms\": 2}}\n", CodeDecision, 5, 79, `preemption.timeslice_ms: unknown field (did you mean "timeslice_us"?)`},
		{"bad mode", header + "classify := {\"class\": \"lc\", \"preemption\": {\"mode\": \"pause\"}}\n", CodeDecision, 5, 52, `"pause" is not one of observe|timeslice|suspend|gate`},
		{"bad victims", header + "classify := default_decision\nvictims := {\"suspend\": [{\"pid\": 0}]}\n", CodeDecision, 6, 33, "suspend[0].pid: 0 is below the minimum 1"},
		{"bad else branch", header + "classify := default_decision if input.process.pid == 1\nelse := {\"class\": \"lc\", \"observe\": [\"kernels\"]}\n", CodeDecision, 6, 37, `observe[0]: "kernels" is not one of launch|copy|sync|rm`},
		{"missing classify", header, CodeEntrypoint, 0, 0, "no rule data.arbiter.classify"},
		{"bad default", "package arbiter\ndefault_decision := {\"class\": \"Best Effort\"}\nclassify := default_decision\n", CodeDecision, 2, 31, `class: "Best Effort" does not match`},
		{"default depends on input", "package arbiter\ndefault_decision := {\"class\": input.process.comm}\nclassify := default_decision\n", CodeEntrypoint, 2, 1, "undefined without input"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeDir(t, map[string]string{"p.rego": tc.rego})
			_, err := Load(context.Background(), dir, nil)
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("Load: %v, want *Error", err)
			}
			d := pe.Diagnostics[0]
			if d.Code != tc.code || !strings.Contains(d.Message, tc.msg) {
				t.Fatalf("got %s, want code %s message containing %q", d, tc.code, tc.msg)
			}
			if tc.row > 0 {
				if d.File != filepath.Join(dir, "p.rego") || d.Row != tc.row || d.Col != tc.col {
					t.Fatalf("at %s:%d:%d, want %s:%d:%d (%s)", d.File, d.Row, d.Col, filepath.Join(dir, "p.rego"), tc.row, tc.col, d)
				}
			}
			if !strings.Contains(err.Error(), d.String()) {
				t.Fatalf("error %q does not carry diagnostic %q", err, d)
			}
		})
	}
}

func TestClassifyFallsBackOnMalformedDecision(t *testing.T) {
	tests := []struct {
		name, rule, field, msg string
	}{
		{"bad priority", `classify := {"class": "lc", "priority": input.process.pid}`, "priority", "4242 is above the maximum 1000"},
		{"bad class", `classify := {"class": input.process.comm}`, "class", `"Python 3" does not match`},
		{"not an object", `classify := input.process.comm`, "", "want object, got string"},
		{"bad quota", `classify := {"class": "lc", "quota": {"max_gpu_share": count(input.process.comm)}}`, "quota.max_gpu_share", "8 is above the maximum 1"},
		{"missing slo field", `classify := {"class": "lc", "slo": {k: v | some k, v in {"latency_target_ms": count(input.process.comm)}}}`, "slo.percentile", "required field missing"},
		{"duplicate observe", `classify := {"class": "lc", "observe": ["launch", lower("LAUNCH")]}`, "observe[1]", "duplicate item launch"},
		{"conflict", "classify := {\"class\": \"a\"} if input.process.pid > 0\nclassify := {\"class\": \"b\"} if input.process.pid > 1", "", "eval_conflict_error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Load(context.Background(), writeDir(t, map[string]string{"p.rego": header + tc.rule + "\n"}), nil)
			if err != nil {
				t.Fatal(err)
			}
			d, err := p.Classify(context.Background(), testInput(4242, "Python 3"))
			if d.Class != "best-effort" || d.Preemption.Mode != ModeSuspend {
				t.Fatalf("decision %+v, want the default", d)
			}
			var de *DecisionError
			if !errors.As(err, &de) {
				t.Fatalf("err %v, want *DecisionError", err)
			}
			if de.PID != 4242 || de.Comm != "Python 3" || de.Field != tc.field || de.Fallback != "best-effort" || !strings.Contains(de.Err.Error(), tc.msg) {
				t.Fatalf("got %+v (%v), want field %q and %q", de, de.Err, tc.field, tc.msg)
			}
			if !strings.Contains(err.Error(), `pid 4242 (comm "Python 3")`) || !strings.Contains(err.Error(), `using default class "best-effort"`) {
				t.Fatalf("error text %q does not name the process and fallback", err)
			}
		})
	}
}

func TestClassifyDecodesEveryField(t *testing.T) {
	p, err := Load(context.Background(), writeDir(t, map[string]string{"p.rego": header + `classify := {
	"class": "latency-critical", "priority": 900,
	"slo": {"latency_target_ms": 12.5, "percentile": 99.9, "window_s": 30},
	"preemption": {"mode": "timeslice", "timeslice_us": 16000, "interleave": "high", "pre_preemption_hint": true},
	"quota": {"max_gpu_share": 0.5}, "observe": ["launch", "sync"], "reason": sprintf("pid %d", [input.process.pid]),
} if input.process.comm == "vllm"
`}), nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := p.Classify(context.Background(), testInput(7, "vllm"))
	if err != nil {
		t.Fatal(err)
	}
	want := Decision{Class: "latency-critical", Priority: 900, SLO: &SLO{12.5, 99.9, 30},
		Preemption: Preemption{ModeTimeslice, 16000, "high", true}, Quota: &Quota{0.5}, Observe: []string{"launch", "sync"}, Reason: "pid 7"}
	if !equalJSON(t, d, want) {
		t.Fatalf("got %+v", d)
	}
	// Undefined classify: the default, no error.
	d, err = p.Classify(context.Background(), testInput(8, "train"))
	if err != nil || d.Class != "best-effort" {
		t.Fatalf("undefined: %+v %v", d, err)
	}
	pp := want.Compile()
	if pp.Timeslice != 16*time.Millisecond || pp.Interleave != sched.InterleaveHigh || pp.LatencyTarget != 12500*time.Microsecond ||
		pp.Window != 30*time.Second || pp.Observe != sched.ObserveLaunch|sched.ObserveSync || pp.MaxGPUShare != 0.5 || !pp.HasSLO {
		t.Fatalf("plan %+v", pp)
	}
}

func TestEvalTimeout(t *testing.T) {
	slow := header + `classify := default_decision if {
	n := count([1 | some i in numbers.range(1, 3000); some j in numbers.range(1, 3000); i != j])
	n > input.process.pid
}
`
	for _, ev := range []Evaluator{EvaluatorPlan, EvaluatorTopdown} {
		t.Run(string(ev), func(t *testing.T) {
			p, err := Load(context.Background(), writeDir(t, map[string]string{"p.rego": slow}), &Options{EvalTimeout: 20 * time.Millisecond, Evaluator: ev})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			d, err := p.Classify(context.Background(), testInput(1, "x"))
			if el := time.Since(start); el > 2*time.Second {
				t.Fatalf("evaluation took %v despite a 20ms deadline", el)
			}
			if d.Class != "best-effort" || err == nil || !strings.Contains(err.Error(), "evaluation stopped after 20ms") {
				t.Fatalf("got %+v, %v", d, err)
			}
		})
	}
}

func TestPrintGoesToCallback(t *testing.T) {
	var mu sync.Mutex
	var got []Print
	opts := &Options{Print: func(p Print) { mu.Lock(); got = append(got, p); mu.Unlock() }}
	dir := writeDir(t, map[string]string{"p.rego": header + "classify := default_decision if {\n\tprint(\"hello\", input.process.pid)\n}\n"})
	p, err := Load(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Classify(context.Background(), testInput(3, "x")); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Message != "hello 3" || got[0].Row != 6 || got[0].File != filepath.Join(dir, "p.rego") {
		t.Fatalf("print: %+v", got)
	}
}

func TestVictims(t *testing.T) {
	rules := map[string]struct {
		rule, err string
		want      VictimDecision
	}{
		"none":      {"", "", VictimDecision{}},
		"undefined": {"victims := {} if false", "", VictimDecision{}},
		"ok": {`victims := {"suspend": [{"pid": p.pid, "gpus": p.gpus} | some p in input.state.processes; p.class == "be"], "throttle": [{"pid": 1, "max_gpu_share": 0.5}]}`, "",
			VictimDecision{Suspend: []Suspension{{PID: 2, GPUs: []int{0, 1}}}, Throttle: []Throttle{{PID: 1, MaxGPUShare: 0.5}}}},
		"unknown pid": {`victims := {"suspend": [{"pid": 99}]}`, "decision field suspend[0].pid: pid 99 is not a managed process", VictimDecision{}},
		"bad share":   {`victims := {"throttle": [{"pid": 1, "max_gpu_share": count(input.state.processes)}]}`, "throttle[0].max_gpu_share: 2 is above the maximum 1", VictimDecision{}},
	}
	st := State{Processes: []ProcessState{{PID: 1, Class: "lc", GPUs: []int{0}}, {PID: 2, Class: "be", GPUs: []int{0, 1}}}}
	for name, tc := range rules {
		t.Run(name, func(t *testing.T) {
			p, err := Load(context.Background(), writeDir(t, map[string]string{"p.rego": header + "classify := default_decision\n" + tc.rule + "\n"}), nil)
			if err != nil {
				t.Fatal(err)
			}
			v, err := p.Victims(context.Background(), st)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err %v, want %q", err, tc.err)
			}
			if !equalJSON(t, v, tc.want) {
				t.Fatalf("got %+v, want %+v", v, tc.want)
			}
		})
	}
}

func TestDataFiles(t *testing.T) {
	dir := writeDir(t, map[string]string{
		"p.rego":            header + "classify := {\"class\": data.classes[input.process.comm]}\n",
		"data.yaml":         "classes:\n  vllm: latency-critical\n",
		"teams/data.json":   `{"serving": {"quota": 0.5}}`,
		".swp/ignored.rego": "garbage",
		".p.rego.swp":       "garbage",
		"README.md":         "not policy",
	})
	p, err := Load(context.Background(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := p.Classify(context.Background(), testInput(1, "vllm"))
	if err != nil || d.Class != "latency-critical" {
		t.Fatalf("%+v %v", d, err)
	}
	if files := p.Source().Files(); len(files) != 1 || files[0] != filepath.Join(dir, "p.rego") || p.Source().Library != LibraryEmbedded {
		t.Fatalf("files %v, library %q: want the policy's one file, and the embedded library apart", files, p.Source().Library)
	}
	if got := p.Source().Data["teams"]; !equalJSON(t, got, map[string]any{"serving": map[string]any{"quota": 0.5}}) {
		t.Fatalf("teams data %v", got)
	}
	bad := writeDir(t, map[string]string{"p.rego": header + "classify := default_decision\n", "data.json": `{"a": [1, 2,}`})
	_, err = Load(context.Background(), bad, nil)
	if err == nil || !strings.Contains(err.Error(), "data.json: arbiter_data_error: json at byte offset 13") {
		t.Fatalf("bad data: %v", err)
	}
}

func TestBundle(t *testing.T) {
	files := map[string]string{
		"/.manifest":           `{"revision": "v42", "roots": ["arbiter", "arbiter_test", "classes"]}`,
		"/arbiter/p.rego":      header + "classify := {\"class\": data.classes.default}\n",
		"/arbiter/p_test.rego": "package arbiter_test\nimport data.arbiter\ntest_x if arbiter.classify.class == \"batch\"\n",
		"/classes/data.json":   `{"default": "batch"}`,
	}
	path := filepath.Join(t.TempDir(), "policy.tar.gz")
	writeBundle(t, path, files)
	p, err := Load(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Revision() != "v42" {
		t.Fatalf("revision %q", p.Revision())
	}
	d, err := p.Classify(context.Background(), testInput(1, "x"))
	if err != nil || d.Class != "batch" {
		t.Fatalf("%+v %v", d, err)
	}
	rep, err := Test(context.Background(), p.Source(), nil)
	if err != nil || !rep.OK() || rep.Passed != 1 {
		t.Fatalf("bundle tests: %+v %v", rep, err)
	}
	// A syntax error inside a bundle carries the bundle path and row.
	files["/arbiter/p.rego"] = header + "classify := {\n"
	writeBundle(t, path, files)
	_, err = Load(context.Background(), path, nil)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(path, "arbiter/p.rego")+":6: rego_parse_error") {
		t.Fatalf("bad bundle: %v", err)
	}
	if err := os.WriteFile(path, []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(context.Background(), path, nil); err == nil {
		t.Fatal("garbage bundle loaded")
	}
}

func writeBundle(t *testing.T, path string, files map[string]string) {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	zw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCopiedPolicyFile: a copy of a policy file left in its directory
// repeats its package METADATA block, which OPA reports only as "package
// annotation redeclared"; the loader names both files and the likely
// cause. The helper library alone, files of another package, and a
// single file, given where a policy is expected, say what they are.
func TestCopiedPolicyFile(t *testing.T) {
	one := "# METADATA\n# title: a policy\n" + header + "classify := default_decision\n"
	dir := writeDir(t, map[string]string{"policy.rego": one, "policy-copy.rego": one})
	_, err := Load(context.Background(), dir, nil)
	diags := Diagnostics(err)
	if len(diags) != 1 || diags[0].File != filepath.Join(dir, "policy.rego") || diags[0].Row != 1 ||
		!strings.Contains(diags[0].Message, "a second METADATA block of scope package for package arbiter (the first is in "+filepath.Join(dir, "policy-copy.rego")+")") ||
		!strings.Contains(diags[0].Message, "remove the copy") {
		t.Fatalf("%v", err)
	}

	lib := writeDir(t, map[string]string{"lib.rego": "package arbiter.lib\n\nx := 1\n"})
	_, err = Load(context.Background(), lib, nil)
	if diags := Diagnostics(err); len(diags) != 1 || diags[0].Code != CodeEntrypoint ||
		!strings.Contains(diags[0].Message, "these files are the helper library (package arbiter.lib), not a policy") {
		t.Fatalf("the library alone: %v", err)
	}
	other := writeDir(t, map[string]string{"p.rego": "package foo\n\nx := 1\n"})
	_, err = Load(context.Background(), other, nil)
	if diags := Diagnostics(err); len(diags) != 1 || diags[0].Code != CodeEntrypoint ||
		!strings.Contains(diags[0].Message, "the policy's files are in package foo, not package arbiter") || strings.Contains(diags[0].Message, "helper library") {
		t.Fatalf("a policy in another package: %v", err)
	}

	file := filepath.Join(dir, "policy.rego")
	if _, err := Load(context.Background(), file, nil); err == nil ||
		!strings.Contains(err.Error(), "a file, not a policy") || !strings.HasSuffix(err.Error(), "give the directory that holds it, "+dir) {
		t.Fatalf("a single file: %v", err)
	}
}

// TestSeveralPoliciesInOneDirectory: a directory of policy directories
// (the repository's rego/) is one policy to the loader; the error says so
// and names each policy's files instead of OPA's "package annotation
// redeclared".
func TestSeveralPoliciesInOneDirectory(t *testing.T) {
	one := "# METADATA\n# title: a policy\n" + header + "classify := default_decision\n"
	dir := writeDir(t, map[string]string{
		"a/policy.rego":      one,
		"b/policy.rego":      one,
		"b/more/helper.rego": "package arbiter\n\nhelper := 1\n",
		"c/data.json":        `{"x": 1}`,
	})
	_, err := Load(context.Background(), dir, nil)
	diags := Diagnostics(err)
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if len(diags) != 3 || diags[0].File != dir || diags[0].Code != CodeLoad ||
		!strings.Contains(diags[0].Message, "2 policies loaded as one: "+a+" and "+b+" each define data.arbiter.default_decision") ||
		!strings.Contains(diags[0].Message, "A directory holds ONE policy") ||
		!strings.Contains(diags[0].Message, "arbiter policy check "+a+" "+b) {
		t.Fatalf("%v", err)
	}
	if d := diags[1]; d.File != filepath.Join(a, "policy.rego") || d.Row != 5 || d.Col != 1 || !strings.Contains(d.Message, "the policy in "+a) {
		t.Fatalf("%v", d)
	}
	if _, err := Load(context.Background(), b, nil); err != nil {
		t.Fatalf("one of them alone: %v", err)
	}
	// Rules spread over subdirectories are still one policy.
	split := writeDir(t, map[string]string{"p.rego": header, "rules/classify.rego": "package arbiter\n\nclassify := default_decision\n"})
	if _, err := Load(context.Background(), split, nil); err != nil {
		t.Fatalf("one policy over two directories: %v", err)
	}
}
