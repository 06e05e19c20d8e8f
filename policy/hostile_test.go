package policy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/gpu-arbiter/arbiter/policy/input"
)

// TestHostileInput feeds the loader and the evaluator what an attacker, a
// broken editor or a fat-fingered operator might: each case must end in a
// clear error or a correct decision, quickly, and never in a panic.
func TestHostileInput(t *testing.T) {
	garbage := make([]byte, 4096)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range garbage {
		garbage[i] = byte(r.IntN(256))
	}
	var huge strings.Builder
	huge.WriteString(header + "classify := default_decision\n")
	for i := 0; huge.Len() < 10<<20; i++ {
		fmt.Fprintf(&huge, "rule_%d := %d\n", i, i)
	}
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	tests := []struct {
		name  string
		files map[string]string
		opts  *Options
		want  string // substring of the load error; "" loads fine
	}{
		{"empty file", map[string]string{"p.rego": ""}, nil, "p.rego: rego_parse_error: empty module"},
		{"no rego files", map[string]string{"data.json": "{}"}, nil, "arbiter_load_error: no .rego files found"},
		{"binary garbage", map[string]string{"p.rego": string(garbage)}, nil, "rego_parse_error"},
		{"NUL bytes", map[string]string{"p.rego": "package arbiter\n\x00\x01"}, nil, "p.rego:2:1: rego_parse_error: binary content (NUL byte at offset 16)"},
		{"10 MB policy over the file limit", map[string]string{"p.rego": huge.String()}, nil, "over the 4194304-byte limit for one policy file (Options.MaxFileBytes)"},
		{"deeply nested rule value", map[string]string{"p.rego": header + "classify := default_decision\nx := " + deep + "\n"}, nil, "rego_parse_error"},
		{"self recursion", map[string]string{"p.rego": header + "classify := f(1)\nf(x) := f(x)\n"}, nil, "rego_recursion_error: rule data.arbiter.f is recursive: data.arbiter.f -> data.arbiter.f"},
		{"mutual recursion via lib", map[string]string{"p.rego": header + "classify := default_decision if a\na if b\nb if a\n"}, nil, "rego_recursion_error"},
		{"invalid UTF-8 in source", map[string]string{"p.rego": header + "classify := {\"class\": \"\xff\xfe\"}\n"}, nil, "rego_parse_error"},
		{"data not an object", map[string]string{"p.rego": header + "classify := default_decision\n", "data.json": "[1]"}, nil, "the top level must be an object, got array"},
		{"yaml garbage", map[string]string{"p.rego": header + "classify := default_decision\n", "data.yaml": "a: [\n"}, nil, "data.yaml: arbiter_data_error: yaml"},
		{"yaml key out of place", map[string]string{"p.rego": header + "classify := default_decision\n", "data.yaml": "classes:\n  a: 1\n  b: 2\n  - c\n"}, nil,
			"data.yaml: arbiter_data_error: yaml: line 4: did not find expected key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := Load(context.Background(), writeDir(t, tc.files), tc.opts)
			if el := time.Since(start); el > 20*time.Second {
				t.Errorf("took %v", el)
			}
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	t.Run("10 MB policy with a raised limit", func(t *testing.T) {
		if testing.Short() {
			t.Skip("parses 10 MB of Rego") // not a privileged test: plain testing.Short
		}
		start := time.Now()
		p, err := Load(context.Background(), writeDir(t, map[string]string{"p.rego": huge.String()}), &Options{MaxFileBytes: 16 << 20})
		if err != nil {
			t.Fatal(err)
		}
		d, err := p.Classify(context.Background(), testInput(1, "x"))
		if err != nil || d.Class != "best-effort" {
			t.Fatalf("%+v %v", d, err)
		}
		t.Logf("loaded and classified a 10 MB policy in %v", time.Since(start))
	})
}

func TestHostileProcessInput(t *testing.T) {
	p, err := LoadFS(context.Background(), defaultPolicyFS(), "default", nil)
	if err != nil {
		t.Fatal(err)
	}
	in := testInput(1, "py\uFFFD\uFFFDthon")
	in.Process.Cmdline = []string{strings.ToValidUTF8("/usr/bin/\xff\xfepython", "\uFFFD"), strings.Repeat("A", 1<<20)}
	in.Process.Env = map[string]string{"ARBITER_CLASS": strings.ToValidUTF8("latency-critical\xff", "\uFFFD")}
	labels := map[string]string{}
	for i := range 10000 {
		labels[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 100)
	}
	labels["arbiter.io/class"] = "latency-critical"
	in.Process.Pod = &input.Pod{UID: "u", Labels: labels}
	d, err := p.Classify(context.Background(), in)
	if err != nil || d.Class != "latency-critical" || d.Reason != "pod label arbiter.io/class" {
		t.Fatalf("%+v %v", d, err)
	}
	in.Process.Pod = nil
	d, err = p.Classify(context.Background(), in)
	if err != nil || d.Class != "best-effort" {
		t.Fatalf("unknown class with replaced bytes: %+v %v", d, err)
	}
}

func TestDecodeInputHostile(t *testing.T) {
	tests := []struct{ name, doc, want string }{
		{"deep nesting", strings.Repeat("[", 100000) + strings.Repeat("]", 100000), "nested 100000 levels deep, more than 1000"},
		{"deep in a label", `{"apiVersion":"arbiter.io/v1","node":{"hostname":"n","time":"t","gpus":[]},"process":{"pid":1,"comm":"x","env":{"A":` + strings.Repeat("[", 2000) + strings.Repeat("]", 2000) + `}}}`, "nested 2003 levels deep"},
		{"not json", "\xff\xfe", "input: not valid JSON: byte offset 1"},
		{"cut short", `{"apiVersion":`, "input: not valid JSON: unexpected EOF"},
		{"empty", " \n", "input: empty: an input document is a JSON object"},
		{"huge", `{"x": "` + strings.Repeat("a", MaxInputBytes) + `"}`, "input: more than 16777216 bytes"},
		{"wrong api version", `{"apiVersion":"v0","node":{"hostname":"n","time":"t","gpus":[]}}`, `apiVersion: "v0" is not one of arbiter.io/v1`},
		{"bad pid type", `{"apiVersion":"arbiter.io/v1","node":{"hostname":"n","time":"t","gpus":[]},"process":{"pid":"1","comm":"x"}}`, `process.pid: want integer, got string "1"`},
		{"unknown field", `{"apiVersion":"arbiter.io/v1","node":{"hostname":"n","time":"t","gpus":[]},"process":{"pid":1,"comm":"x","pidd":2}}`, `process.pidd: unknown field (did you mean "pid"?)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeInput(strings.NewReader(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	// Nesting within the limit evaluates correctly.
	p, err := LoadFS(context.Background(), defaultPolicyFS(), "default", nil)
	if err != nil {
		t.Fatal(err)
	}
	doc := `{"apiVersion":"arbiter.io/v1","node":{"hostname":"n","time":"2026-01-10T12:00:00Z","gpus":[]},"process":{"pid":1,"comm":"x","env":{"ARBITER_CLASS":"latency-critical"}}}`
	v, err := DecodeInput(strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Eval(context.Background(), v, true)
	if err != nil || res.Decision.Class != "latency-critical" || res.Error != "" || len(res.Trace) == 0 {
		t.Fatalf("%+v %v", res, err)
	}
	if _, err := p.Eval(context.Background(), map[string]any{"apiVersion": "arbiter.io/v1"}, false); err == nil {
		t.Fatal("input without process or state accepted")
	}
	var de *DecisionError
	if errors.As(err, &de) {
		t.Fatal("unexpected decision error")
	}
}

// FuzzLoad loads arbitrary module text and data: a clear error or a policy,
// never a panic.
func FuzzLoad(f *testing.F) {
	f.Add(header+"classify := default_decision\n", `{"a": 1}`)
	f.Add(header+"classify := {\"class\": input.process.comm}\n", `{}`)
	f.Add("package arbiter\n\x00", `[`)
	f.Add(header+"classify := x if { x := y }\ny := z\nz := y\n", `{"a": {"b": 1}}`)
	f.Fuzz(func(t *testing.T, module, data string) {
		fsys := fstest.MapFS{"p.rego": {Data: []byte(module)}, "data.json": {Data: []byte(data)}}
		p, err := LoadFS(context.Background(), fsys, "fuzz", &Options{EvalTimeout: 50 * time.Millisecond})
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || len(pe.Diagnostics) == 0 {
				t.Fatalf("error without diagnostics: %v", err)
			}
			return
		}
		if _, err := p.Classify(context.Background(), testInput(1, "x")); err != nil {
			var de *DecisionError
			if !errors.As(err, &de) {
				t.Fatalf("classify error of type %T: %v", err, err)
			}
		}
	})
}
