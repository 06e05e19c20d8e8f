package schema

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	opa "github.com/open-policy-agent/opa/v1/rego"
)

// decisionCases are decisions near every boundary of schema/decision.json.
var decisionCases = []string{
	`{"class": "lc"}`,
	`{"class": "a-b-c", "priority": 0}`,
	`{"class": "-lc"}`,
	`{"class": ""}`,
	`{"class": "LC"}`,
	`{"class": "lc", "priority": 1000}`,
	`{"class": "lc", "priority": 1001}`,
	`{"class": "lc", "priority": 1.5}`,
	`{"class": "lc", "priority": -1}`,
	`{"class": "lc", "slo": {"latency_target_ms": 0, "percentile": 99, "window_s": 60}}`,
	`{"class": "lc", "slo": {"latency_target_ms": 0.001, "percentile": 100, "window_s": 60}}`,
	`{"class": "lc", "slo": {"latency_target_ms": 1, "percentile": 100.1, "window_s": 60}}`,
	`{"class": "lc", "slo": {"latency_target_ms": 1, "percentile": 99}}`,
	`{"class": "lc", "preemption": {"mode": "gate"}}`,
	`{"class": "lc", "preemption": {"mode": "pause"}}`,
	`{"class": "lc", "preemption": {"timeslice_us": 5}}`,
	`{"class": "lc", "preemption": {"mode": "suspend", "timeslice_us": 0}}`,
	`{"class": "lc", "preemption": {"mode": "suspend", "timeslice_us": 1000000, "interleave": "low", "pre_preemption_hint": false}}`,
	`{"class": "lc", "preemption": {"mode": "suspend", "interleave": "max"}}`,
	`{"class": "lc", "preemption": {"mode": "suspend", "pre_preemption_hint": "yes"}}`,
	`{"class": "lc", "quota": {"max_gpu_share": 0}}`,
	`{"class": "lc", "quota": {"max_gpu_share": 1.01}}`,
	`{"class": "lc", "quota": {}}`,
	`{"class": "lc", "observe": ["launch", "copy", "sync", "rm"]}`,
	`{"class": "lc", "observe": ["launch", "launch"]}`,
	`{"class": "lc", "observe": ["exec"]}`,
	`{"class": "lc", "observe": "launch"}`,
	`{"class": "lc", "reason": "` + strings.Repeat("x", 1024) + `"}`,
	`{"class": "lc", "reason": "` + strings.Repeat("x", 1025) + `"}`,
	`{"class": "lc", "extra": 1}`,
	`{"priority": 1}`,
	`[]`,
	`"lc"`,
	`null`,
}

// TestValidatorAgreesWithJSONSchema checks the fast Go validator against
// OPA's JSON Schema implementation (json.match_schema) on the published
// schema, so the two can never drift apart.
func TestValidatorAgreesWithJSONSchema(t *testing.T) {
	sch, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := JSON(Decision)
	var schemaDoc any
	if err := json.Unmarshal(raw, &schemaDoc); err != nil {
		t.Fatal(err)
	}
	q, err := opa.New(opa.Query("[ok, _] := json.match_schema(input.doc, input.schema)")).PrepareForEval(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range decisionCases {
		dec := json.NewDecoder(strings.NewReader(c))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		if _, isString := v.(string); isString || v == nil {
			// match_schema reads a string document as JSON text, and has no
			// answer for null.
			if sch.Decision.Validate(v) == nil {
				t.Errorf("%s accepted", c)
			}
			continue
		}
		rs, err := q.Eval(context.Background(), opa.EvalInput(map[string]any{"doc": v, "schema": schemaDoc}))
		if err != nil || len(rs) != 1 {
			t.Fatalf("%s: %v %v", c, rs, err)
		}
		want := rs[0].Bindings["ok"].(bool)
		fe := sch.Decision.Validate(v)
		if (fe == nil) != want {
			t.Errorf("%.80s: Go validator says %v, JSON Schema says valid=%v", c, fe, want)
		}
	}
}

func TestCompileRejects(t *testing.T) {
	if _, err := Compile([]byte(`{"type": "object", "oneOf": []}`)); err == nil || !strings.Contains(err.Error(), `unsupported JSON Schema keyword "oneOf"`) {
		t.Fatalf("unsupported keyword: %v", err)
	}
	if _, err := JSON("nope"); err == nil || !strings.Contains(err.Error(), `unknown schema "nope": want input, decision or victims`) {
		t.Fatalf("unknown schema name: %v", err)
	}
}
