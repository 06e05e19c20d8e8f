package policy

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sched"

	"github.com/open-policy-agent/opa/v1/ast"
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
	sch, err := loadSchemas()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := SchemaJSON(SchemaDecision)
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
			if sch.decision.validate(v) == nil {
				t.Errorf("%s accepted", c)
			}
			continue
		}
		rs, err := q.Eval(context.Background(), opa.EvalInput(map[string]any{"doc": v, "schema": schemaDoc}))
		if err != nil || len(rs) != 1 {
			t.Fatalf("%s: %v %v", c, rs, err)
		}
		want := rs[0].Bindings["ok"].(bool)
		fe := sch.decision.validate(v)
		if (fe == nil) != want {
			t.Errorf("%.80s: Go validator says %v, JSON Schema says valid=%v", c, fe, want)
		}
	}
}

func TestSchemasCompileAndDescribeInput(t *testing.T) {
	sch, err := loadSchemas()
	if err != nil {
		t.Fatal(err)
	}
	// A real input, as the evaluator builds it, fits the published schema.
	in := testInput(1, "x")
	in.Process.Pod = &Pod{UID: "u", Labels: map[string]string{"a": "b"}}
	in.Node.GPUs = []GPU{{Index: 0, UUID: "GPU-0", MemoryBytes: 80 << 30, NUMANode: 0, NVLinkPeers: []int{1}}}
	for name, v := range map[string]ast.Value{"classify": in.value(nil), "victims": State{Node: in.Node, Processes: []ProcessState{{PID: 1, Class: "lc", Mode: ModeSuspend, GPUShare: 0.5}},
		Requests: []Request{{PID: 1, GPU: 0, AgeUS: 10}}, SLO: map[string]SLOState{"lc": {Attainment: 0.9, Target: 0.99}}, Demands: []Demand{{PID: 1, GPUsNeeded: 2, NVLink: true}}}.value(nil)} {
		j, err := ast.JSONWithOpt(v, ast.JSONOpt{})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(j)
		doc, err := DecodeInput(strings.NewReader(string(b)))
		if err != nil {
			t.Fatalf("%s input does not fit its schema: %v\n%s", name, err, b)
		}
		if fe := sch.input.validate(doc); fe != nil {
			t.Fatal(fe)
		}
	}
	if _, err := compileSchema([]byte(`{"type": "object", "oneOf": []}`)); err == nil || !strings.Contains(err.Error(), `unsupported JSON Schema keyword "oneOf"`) {
		t.Fatalf("unsupported keyword: %v", err)
	}
	if _, err := SchemaJSON("nope"); err == nil {
		t.Fatal("unknown schema name accepted")
	}
}

func FuzzDecodeInput(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"arbiter.io/v1","node":{"hostname":"n","time":"t","gpus":[]},"process":{"pid":1,"comm":"x"}}`))
	f.Add([]byte(`[[[[`))
	f.Add([]byte(`{"apiVersion":"arbiter.io/v1","node":{"hostname":"n","time":"t","gpus":[{"index":-1}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := DecodeInput(strings.NewReader(string(b)))
		if err == nil && v == nil {
			t.Fatal("nil document without error")
		}
	})
}

func FuzzDecisionValidate(f *testing.F) {
	for _, c := range decisionCases {
		f.Add([]byte(c))
	}
	sch, err := loadSchemas()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) != nil {
			return
		}
		if sch.decision.validate(v) == nil {
			d := decodeDecision(jsonDoc{}, v) // must not panic on anything accepted
			if d.Class == "" {
				t.Fatalf("accepted %s with no class", b)
			}
		}
	})
}

func TestCompile(t *testing.T) {
	lc := Decision{Class: "lc", Priority: 900, SLO: &SLO{100, 99, 60}, Preemption: Preemption{Mode: ModeTimeslice, TimesliceUS: 16000, Interleave: "high"}, Observe: []string{"launch", "sync"}}
	be := Decision{Class: "be", Preemption: Preemption{Mode: ModeSuspend, Interleave: "low"}, Quota: &Quota{0.3}}
	gate := Decision{Class: "g", Preemption: Preemption{Mode: ModeGate}}
	if p := lc.Compile(); p.Level != sched.LevelTimeslice || !p.LatencyCritical || !p.HasSLO || p.LatencyTarget != 100*time.Millisecond ||
		p.Percentile != 99 || p.Window != time.Minute || p.Timeslice != 16*time.Millisecond || p.Interleave != sched.InterleaveHigh ||
		p.Observe != sched.ObserveLaunch|sched.ObserveSync || p.MaxGPUShare != 1 || p.Priority != 900 {
		t.Fatalf("lc %+v", p)
	}
	if p := be.Compile(); p.Level != sched.LevelSuspend || p.Interleave != sched.InterleaveLow || p.MaxGPUShare != 0.3 || p.HasSLO || p.LatencyCritical {
		t.Fatalf("be %+v", p)
	}
	if p := gate.Compile(); p.Level != sched.LevelGate {
		t.Fatalf("gate %+v", p)
	}
	if p := (Decision{Class: "x"}).Compile(); p.Level != sched.LevelObserve || p.Interleave != sched.InterleaveMedium || p.MaxGPUShare != 1 {
		t.Fatalf("zero decision %+v", p)
	}
}

// TestDecodeInputReportsEveryError: an input written by hand gets every
// mistake reported at once, in the schema's order, not the first alone.
func TestDecodeInputReportsEveryError(t *testing.T) {
	in := `{"apiVersion": "arbiter.io/v1", "process": {"pid": "42", "comm": "vllm", "pidd": 1, "gpus": [0, "one"], "env": {"ARBITER_CLASS": 5}}}`
	_, err := DecodeInput(strings.NewReader(in))
	var ie *InputError
	if !errors.As(err, &ie) {
		t.Fatalf("%v", err)
	}
	var got []string
	for _, fe := range ie.Fields {
		got = append(got, fe.Error())
	}
	want := []string{
		"node: required field missing",
		"process.env.ARBITER_CLASS: want string, got number 5",
		"process.gpus[1]: want integer, got string \"one\"",
		"process.pid: want integer, got string \"42\"",
		"process.pidd: unknown field (did you mean \"pid\"?)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if !strings.HasPrefix(err.Error(), "input does not fit schema/input.json (arbiter policy schema input), 5 errors:\n  node: required field missing\n") {
		t.Fatalf("%v", err)
	}
	_, err = DecodeInput(strings.NewReader(`{"apiVersion": "arbiter.io/v1", "node": {"hostname": "n", "time": "2026-01-10T12:00:00Z", "gpus": []}, "process": {"pid": 1, "comm": "x", "gpus": [` + strings.Repeat(`"a", `, 99) + `"a"]}}`))
	if !errors.As(err, &ie) || len(ie.Fields) != 100 || !strings.HasSuffix(err.Error(), "\n  and 50 more") {
		t.Fatalf("100 errors: %v", err)
	}
}
