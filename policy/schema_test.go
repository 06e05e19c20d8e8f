package policy

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/policy/schema"
	"github.com/gpu-arbiter/arbiter/sched"

	"github.com/open-policy-agent/opa/v1/ast"
)

func TestInputFitsSchema(t *testing.T) {
	sch, err := schema.Load()
	if err != nil {
		t.Fatal(err)
	}
	// A real input, as the evaluator builds it, fits the published schema.
	in := testInput(1, "x")
	in.Process.Pod = &input.Pod{UID: "u", Labels: map[string]string{"a": "b"}}
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
		if fe := sch.Input.Validate(doc); fe != nil {
			t.Fatal(fe)
		}
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

// FuzzDecisionValidate decodes every decision the schema accepts.
func FuzzDecisionValidate(f *testing.F) {
	for _, c := range []string{`{"class": "lc"}`, `{"class": "lc", "priority": 1000, "slo": {"latency_target_ms": 0.001, "percentile": 100, "window_s": 60}}`,
		`{"class": "lc", "preemption": {"mode": "suspend", "timeslice_us": 1000000, "interleave": "low", "pre_preemption_hint": false}}`,
		`{"class": "lc", "quota": {"max_gpu_share": 1}, "observe": ["launch", "copy", "sync", "rm"], "reason": "r"}`, `{"priority": 1}`, `[]`} {
		f.Add([]byte(c))
	}
	sch, err := schema.Load()
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
		if sch.Decision.Validate(v) == nil {
			d := decodeDecision(schema.JSONDoc{}, v) // must not panic on anything accepted
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
