package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runPolicy runs `arbiter policy ARGS...` and returns its output and exit
// status (0 on success).
func runPolicy(t *testing.T, stdin string, args ...string) (string, int) {
	t.Helper()
	cmd := newPolicyCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(context.Background())
	if err == nil {
		return out.String(), 0
	}
	var pe *policyExit
	if !errors.As(err, &pe) {
		return out.String() + err.Error(), 2 // cobra usage errors
	}
	return out.String() + err.Error(), pe.ExitCode()
}

// jsonPart is the JSON document at the start of out, without the error
// text runPolicy appends.
func jsonPart(out string) []byte {
	return []byte(out[:strings.LastIndex(out, "}")+1])
}

func policyDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const policyHeader = "package arbiter\n\ndefault_decision := {\"class\": \"best-effort\"}\n\n"

func TestPolicyTestEveryEmbeddedPolicy(t *testing.T) {
	dirs, _ := filepath.Glob("../../rego/examples/*")
	dirs = append(dirs, "../../rego/default", "../../rego/lib")
	if len(dirs) != 6 {
		t.Fatalf("found %v", dirs)
	}
	for _, d := range dirs {
		out, code := runPolicy(t, "", "test", d)
		if code != 0 || !strings.Contains(out, "PASS: ") || !strings.Contains(out, "coverage: ") || strings.Contains(out, "FAIL") {
			t.Errorf("%s: exit %d\n%s", d, code, out)
		}
	}
	// Several policies in one run: each under its name, exit 0 when all
	// pass; with --format json an array of their reports, with paths.
	out, code := runPolicy(t, "", "test", "../../rego/default", "../../rego/examples/diurnal")
	if code != 0 || !strings.Contains(out, "== ../../rego/default\n") || !strings.Contains(out, "== ../../rego/examples/diurnal\n") ||
		strings.Count(out, "PASS: ") != 2 {
		t.Errorf("two policies: exit %d\n%s", code, out)
	}
	out, code = runPolicy(t, "", "test", "--format", "json", "../../rego/default", "../../rego/examples/diurnal")
	var reps []struct {
		Path   string
		OK     bool
		Passed int
	}
	if code != 0 || json.Unmarshal([]byte(out), &reps) != nil || len(reps) != 2 || reps[1].Path != "../../rego/examples/diurnal" || !reps[0].OK || reps[0].Passed == 0 {
		t.Errorf("two policies, json: exit %d %+v\n%s", code, reps, out)
	}
	out, code = runPolicy(t, "", "test", "-v", "../../rego/default")
	if code != 0 || !strings.Contains(out, "policy_test.rego:9: arbiter_test.test_best_effort_by_default: PASS") || !strings.Contains(out, "not covered:") {
		t.Errorf("-v: exit %d\n%s", code, out)
	}
	out, code = runPolicy(t, "", "test", "--run", "slo_override", "../../rego/default")
	if code != 0 || !strings.Contains(out, "PASS: 4/4") {
		t.Errorf("--run: exit %d\n%s", code, out)
	}
}

func TestPolicyTestFailures(t *testing.T) {
	dir := policyDir(t, map[string]string{
		"p.rego":      policyHeader + "classify := default_decision\n",
		"p_test.rego": "package arbiter_test\nimport data.arbiter\ntest_ok if arbiter.classify.class == \"best-effort\"\ntest_bad if {\n\tprint(\"looking\")\n\tarbiter.classify.class == \"lc\"\n}\n",
	})
	out, code := runPolicy(t, "", "test", dir)
	if code != 1 || !strings.Contains(out, "p_test.rego:4: arbiter_test.test_bad: FAIL") || !strings.Contains(out, "print: looking") || !strings.Contains(out, "PASS: 1/2  FAIL: 1/2") {
		t.Fatalf("exit %d\n%s", code, out)
	}
	out, code = runPolicy(t, "", "test", "--format", "json", dir)
	var rep struct {
		Passed, Failed int
		Coverage       float64
	}
	if code != 1 || json.Unmarshal(jsonPart(out), &rep) != nil || rep.Passed != 1 || rep.Failed != 1 || rep.Coverage != 100 {
		t.Fatalf("json: exit %d %+v\n%s", code, rep, out)
	}
	empty := policyDir(t, map[string]string{"p.rego": policyHeader + "classify := default_decision\n"})
	if out, code := runPolicy(t, "", "test", empty); code != 1 || !strings.Contains(out, "PASS: 0/0") {
		t.Fatalf("no tests: exit %d\n%s", code, out)
	}
	broken := policyDir(t, map[string]string{"p.rego": "package arbiter\nx := {\n"})
	if out, code := runPolicy(t, "", "test", broken); code != 1 || !strings.Contains(out, "p.rego:3: rego_parse_error") {
		t.Fatalf("broken: exit %d\n%s", code, out)
	}
	// Every policy named is tested, whichever fail: exit 1 naming each
	// that did.
	out, code = runPolicy(t, "", "test", dir, "../../rego/default", broken)
	if code != 1 || !strings.Contains(out, "p_test.rego:4: arbiter_test.test_bad: FAIL") || !strings.Contains(out, "p.rego:3: rego_parse_error") ||
		!strings.Contains(out, "== ../../rego/default\n") || !strings.Contains(out, "policy "+dir+": 1 of 2 tests failed; policy "+broken+" has 2 errors") {
		t.Fatalf("three policies, two failing: exit %d\n%s", code, out)
	}
}

func TestPolicyCheck(t *testing.T) {
	out, code := runPolicy(t, "", "check", "../../rego/default")
	if code != 0 || !strings.HasPrefix(out, "ok: ../../rego/default revision ") || !strings.Contains(out, `, 2 files (1 test file) + the embedded library arbiter.lib, default class "best-effort", victims rule, evaluated by its compiled plan`) {
		t.Fatalf("exit %d\n%s", code, out)
	}
	// text, as every command calls it, and human, its older name here.
	for _, f := range []string{"text", "human"} {
		if o, c := runPolicy(t, "", "check", "--format", f, "../../rego/default"); c != 0 || !strings.HasPrefix(o, "ok: ") {
			t.Errorf("--format %s: exit %d\n%s", f, c, o)
		}
	}
	if o, c := runPolicy(t, "", "check", "--format", "xml", "../../rego/default"); c != 2 || !strings.Contains(o, `--format "xml": want text or json`) {
		t.Errorf("--format xml: exit %d\n%s", c, o)
	}
	out, code = runPolicy(t, "", "check", "--evaluator", "topdown", "../../rego/default")
	if code != 0 || !strings.Contains(out, "evaluated by topdown: topdown chosen in the options") {
		t.Fatalf("--evaluator topdown: exit %d\n%s", code, out)
	}
	if out, code := runPolicy(t, "", "check", "--evaluator", "wasm", "../../rego/default"); code != 2 || !strings.Contains(out, "auto, plan or topdown") {
		t.Fatalf("--evaluator wasm: exit %d\n%s", code, out)
	}
	// One file is one file: the embedded library is named, not counted.
	one := policyDir(t, map[string]string{"p.rego": policyHeader + "classify := default_decision\n"})
	if out, code := runPolicy(t, "", "check", one); code != 0 || !strings.Contains(out, " revision ") || !strings.Contains(out, ", 1 file + the embedded library arbiter.lib, default class") {
		t.Fatalf("one file: exit %d\n%s", code, out)
	}
	own := policyDir(t, map[string]string{"p.rego": policyHeader + "import data.arbiter.lib\n\nclassify := lib.d\n", "lib.rego": "package arbiter.lib\n\nd := {\"class\": \"x\"}\n"})
	out, code = runPolicy(t, "", "check", "--format", "json", own)
	var files struct {
		Files   []string
		Library string
	}
	if code != 0 || json.Unmarshal(jsonPart(out), &files) != nil || len(files.Files) != 2 || files.Files[0] != filepath.Join(own, "lib.rego") || files.Library != "own" {
		t.Fatalf("own library: exit %d %+v\n%s", code, files, out)
	}
	if out, code := runPolicy(t, "", "check", own); code != 0 || !strings.Contains(out, ", 2 files, with its own arbiter.lib, default class") {
		t.Fatalf("own library: exit %d\n%s", code, out)
	}
	walk := policyDir(t, map[string]string{"p.rego": policyHeader + "classify := default_decision if {\n\twalk(input.process, [_, v])\n\tv == \"x\"\n}\n"})
	if out, code := runPolicy(t, "", "check", "--format", "json", walk); code != 0 || !strings.Contains(out, `"evaluator": "topdown"`) || !strings.Contains(out, "walk") {
		t.Fatalf("unplannable, auto: exit %d\n%s", code, out)
	}
	if out, code := runPolicy(t, "", "check", "--evaluator", "plan", walk); code != 1 || !strings.Contains(out, "cannot be evaluated as a compiled plan") {
		t.Fatalf("unplannable, plan: exit %d\n%s", code, out)
	}
	dir := policyDir(t, map[string]string{"p.rego": policyHeader + "classify := {\"class\": \"lc\", \"priority\": \"high\"}\nvictims := input.nope\n"})
	out, code = runPolicy(t, "", "check", dir)
	want := filepath.Join(dir, "p.rego") + ":6:12: rego_type_error: undefined ref: input.nope"
	if code != 1 || !strings.Contains(out, want) {
		t.Fatalf("exit %d\n%s\nwant %s", code, out, want)
	}
	out, code = runPolicy(t, "", "check", "--format", "json", dir)
	var res struct {
		OK     bool
		Errors []struct {
			Code, Message, File string
			Row, Col            int
		}
	}
	if code != 1 || json.Unmarshal(jsonPart(out), &res) != nil || res.OK || len(res.Errors) == 0 || res.Errors[0].Code != "rego_type_error" || res.Errors[0].Row != 6 {
		t.Fatalf("json: exit %d %+v\n%s", code, res, out)
	}
	out, code = runPolicy(t, "", "check", "--format", "json", "../../rego/examples/namespace")
	if code != 0 || !strings.Contains(out, `"ok": true`) || !strings.Contains(out, `"class": "best-effort"`) {
		t.Fatalf("json ok: exit %d\n%s", code, out)
	}
	if _, code := runPolicy(t, "", "check", "--format", "xml", dir); code != 2 {
		t.Fatalf("bad format: exit %d", code)
	}
	if _, code := runPolicy(t, "", "check"); code != 2 {
		t.Fatalf("no dir: exit %d", code)
	}
	// A --run that is no regular expression is the flag's fault, not the
	// policy's.
	if out, code := runPolicy(t, "", "test", "--run", "bogus[", "../../rego/default"); code != 2 || !strings.Contains(out, `--run "bogus[": error parsing regexp`) ||
		strings.Contains(out, "rego/default") {
		t.Fatalf("bad --run: exit %d\n%s", code, out)
	}
	if out, code := runPolicy(t, "", "check", filepath.Join(t.TempDir(), "missing")); code == 0 || !strings.Contains(out, "no such file") {
		t.Fatalf("missing dir: exit %d %s", code, out)
	}
}

// TestPolicyCheckSeveralPolicies: a directory of policies is one policy
// to check, as to the daemon, and the error says how to check each; naming
// each checks each.
func TestPolicyCheckSeveralPolicies(t *testing.T) {
	out, code := runPolicy(t, "", "check", "../../rego")
	if code != 1 || !strings.Contains(out, "5 policies loaded as one") || !strings.Contains(out, "A directory holds ONE policy") ||
		!strings.Contains(out, "arbiter policy check ../../rego/default ../../rego/examples/diurnal ../../rego/examples/namespace") ||
		!strings.Contains(out, "../../rego/examples/topology/policy.rego:13:1: arbiter_load_error: the policy in ../../rego/examples/topology defines") ||
		strings.Contains(out, "redeclared") {
		t.Fatalf("exit %d\n%s", code, out)
	}
	dirs, _ := filepath.Glob("../../rego/examples/*")
	args := append([]string{"check", "../../rego/default"}, dirs...)
	out, code = runPolicy(t, "", args...)
	if code != 0 || strings.Count(out, "ok: ") != 5 {
		t.Fatalf("each named: exit %d\n%s", code, out)
	}
	out, code = runPolicy(t, "", "check", "--format", "json", "../../rego/default", "../../rego")
	var res []struct {
		Path string
		OK   bool
	}
	if code != 1 || json.Unmarshal([]byte(out[:strings.LastIndex(out, "\n]")+2]), &res) != nil || len(res) != 2 || !res[0].OK || res[1].OK || res[1].Path != "../../rego" {
		t.Fatalf("json: exit %d %+v\n%s", code, res, out)
	}
}

const evalInput = `{"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": "2026-01-10T12:00:00Z", "gpus": []},
 "process": {"pid": 42, "comm": "vllm", "env": {"ARBITER_CLASS": "latency-critical"}}}`

func TestPolicyEval(t *testing.T) {
	in := filepath.Join(t.TempDir(), "in.json")
	os.WriteFile(in, []byte(evalInput), 0o644)
	out, code := runPolicy(t, "", "eval", "../../rego/default", "--input", in)
	var res struct {
		Entrypoint string
		Evaluator  string
		Defined    bool
		Decision   struct{ Class, Reason string }
		Error      string
	}
	if code != 0 || json.Unmarshal(jsonPart(out), &res) != nil || res.Entrypoint != "classify" || res.Evaluator != "plan" || !res.Defined || res.Decision.Class != "latency-critical" || res.Decision.Reason != "env ARBITER_CLASS" {
		t.Fatalf("exit %d %+v\n%s", code, res, out)
	}
	out, code = runPolicy(t, "", "eval", "../../rego/default", "--input", in, "--evaluator", "topdown")
	if code != 0 || !strings.Contains(out, `"evaluator": "topdown"`) || !strings.Contains(out, `"reason": "env ARBITER_CLASS"`) {
		t.Fatalf("--evaluator topdown: exit %d\n%s", code, out)
	}
	out, code = runPolicy(t, evalInput, "eval", "../../rego/default", "--input", "-", "--explain")
	if code != 0 || !strings.Contains(out, "policy.rego:") || !strings.Contains(out, "Enter data.arbiter.classify") || !strings.Contains(out, `"evaluator": "topdown"`) {
		t.Fatalf("explain: exit %d\n%.2000s", code, out)
	}
	state := `{"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": "2026-01-10T12:00:00Z", "gpus": []}, "state": {
	  "processes": [{"pid": 1, "class": "latency-critical", "mode": "timeslice", "gpus": [0]}, {"pid": 2, "class": "best-effort", "mode": "suspend", "gpus": [0]}],
	  "requests": [{"pid": 1, "gpu": 0}]}}`
	out, code = runPolicy(t, state, "eval", "../../rego/default", "-i", "-")
	if code != 0 || !strings.Contains(out, `"entrypoint": "victims"`) || !strings.Contains(out, `"pid": 2`) {
		t.Fatalf("victims: exit %d\n%s", code, out)
	}
	// A malformed decision: printed, with the fallback, and exit 1.
	dir := policyDir(t, map[string]string{"p.rego": policyHeader + "classify := {\"class\": input.process.comm, \"priority\": 5000}\n"})
	out, code = runPolicy(t, evalInput, "eval", dir, "-i", "-")
	if code != 1 || !strings.Contains(out, `"error": "policy classify for pid 42 (comm \"vllm\"): decision field priority: 5000 is above the maximum 1000; using default class \"best-effort\""`) {
		t.Fatalf("malformed: exit %d\n%s", code, out)
	}
	if out, code := runPolicy(t, `{"apiVersion": "arbiter.io/v1"}`, "eval", dir, "-i", "-"); code != 2 || !strings.Contains(out, "node: required field missing") {
		t.Fatalf("bad input: exit %d\n%s", code, out)
	}
	// Every schema error at once, not the first alone.
	bad := `{"apiVersion": "arbiter.io/v1", "process": {"pid": "42", "comm": "vllm", "pidd": 1}}`
	if out, code := runPolicy(t, bad, "eval", dir, "-i", "-"); code != 2 || !strings.Contains(out, "3 errors:") || !strings.Contains(out, "\n  node: required field missing") ||
		!strings.Contains(out, "\n  process.pid: want integer") || !strings.Contains(out, "\n  process.pidd: unknown field") {
		t.Fatalf("several errors: exit %d\n%s", code, out)
	}
	if out, code := runPolicy(t, "", "eval", dir, "input.json"); code != 2 || !strings.Contains(out, `one policy, not 2 arguments: the input document goes in --input FILE ("input.json"?)`) {
		t.Fatalf("input as an argument: exit %d\n%s", code, out)
	}
	if _, code := runPolicy(t, "", "eval", dir); code != 2 {
		t.Fatalf("no --input: exit %d", code)
	}
}

func TestPolicySchema(t *testing.T) {
	out, code := runPolicy(t, "", "schema", "decision")
	var s map[string]any
	if code != 0 || json.Unmarshal(jsonPart(out), &s) != nil || s["$id"] != "https://arbiter.io/schema/v1/decision.json" {
		t.Fatalf("exit %d\n%.300s", code, out)
	}
	out, code = runPolicy(t, "", "schema")
	if code != 0 || strings.Count(out, `"$schema"`) != 3 {
		t.Fatalf("all: exit %d", code)
	}
	if _, code := runPolicy(t, "", "schema", "nope"); code != 2 {
		t.Fatalf("unknown: exit %d", code)
	}
}
