package policy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/policy/irvm"
	"github.com/gpu-arbiter/arbiter/rego"
)

// corpus generates classification inputs that reach every branch of the
// shipped policies: pods with and without class labels (known, unknown,
// empty), SLO overrides (valid, malformed, out of range), env classes,
// systemd and cgroup naming, users and uids of the team example,
// namespaces of the namespace example, day and night, GPUs and NVLink,
// and names that are not UTF-8.
func corpus(n int) []Input {
	r := rand.New(rand.NewPCG(1, 2))
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	out := make([]Input, 0, n)
	for i := range n {
		in := testInput(1000+i, pick("python3", "job-0", "job-4", "trainer", "\xff\xfebad", "triton"))
		in.Process.PPID = 1
		in.Process.Exe = pick("/usr/bin/python3", "/opt/app-2/bin/serve", "/opt/app-6/x", "")
		in.Process.Cmdline = []string{in.Process.Comm, pick("--serve", "\xc3\x28", "")}
		in.Process.UID = []int{0, 1000, 1001, 2001, 4242}[r.IntN(5)]
		in.Process.User = pick("alice", "bob", "carol", "dave", "user-3", "")
		in.Process.Cgroup = input.ParseCgroup(pick(
			"/user.slice/user-1000.slice/session-1.scope",
			"/inference.slice/vllm.service",
			"/latency-critical/triton",
			"/lcd/x",
			"/system.slice/arbiter-lc-web.service",
			"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8c4a7f3e_1b2c_4d5e_8f90_123456789abc.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope"))
		if r.IntN(3) > 0 {
			in.Process.Pod = &input.Pod{UID: "u", Namespace: pick("inference", "search-serving", "research", "default", "ns-3"), Name: "p", Labels: map[string]string{}}
			if c := pick("latency-critical", "best-effort", "gold", "", "-"); c != "-" {
				in.Process.Pod.Labels["arbiter.io/class"] = c
			}
			if s := pick("40", "fast", "99999999", "0.5", "-"); s != "-" {
				in.Process.Pod.Labels["arbiter.io/slo-ms"] = s
			}
			in.Process.Pod.Labels["team"] = pick("team-1", "team-5", "serving")
		}
		if c := pick("latency-critical", "best-effort", "gold", "-"); c != "-" {
			in.Process.Env["ARBITER_CLASS"] = c
		}
		if s := pick("25", "x", "-"); s != "-" {
			in.Process.Env["ARBITER_SLO_MS"] = s
		}
		in.Process.GPUs = []int{r.IntN(4)}
		in.Node.Time = time.Date(2026, 1, 10, r.IntN(24), r.IntN(60), 0, 0, time.UTC)
		for g := range 4 {
			in.Node.GPUs = append(in.Node.GPUs, GPU{Index: g, UUID: fmt.Sprintf("GPU-%d", g), Name: "H100", MemoryBytes: 80 << 30, NVLinkPeers: []int{g ^ 1}})
		}
		out = append(out, in)
	}
	return out
}

// states generates control-loop states: latency-critical and best-effort
// processes sharing GPUs, active requests, SLO attainment above and below
// target, and multi-GPU demands.
func states(n int) []State {
	r := rand.New(rand.NewPCG(3, 4))
	classes := []string{"latency-critical", "best-effort"}
	out := make([]State, 0, n)
	for range n {
		s := State{Node: Node{Hostname: "n", Time: time.Date(2026, 1, 10, r.IntN(24), 0, 0, 0, time.UTC)}, SLO: map[string]SLOState{}}
		for g := range 4 {
			s.Node.GPUs = append(s.Node.GPUs, GPU{Index: g, UUID: fmt.Sprintf("GPU-%d", g), NVLinkPeers: []int{g ^ 1}})
		}
		for p := range 1 + r.IntN(8) {
			c := classes[r.IntN(2)]
			mode := ModeSuspend
			if c == "latency-critical" {
				mode = ModeTimeslice
			}
			s.Processes = append(s.Processes, ProcessState{PID: 100 + p, Comm: "w", Class: c, Priority: 100 * (1 + r.IntN(9)),
				Mode: mode, GPUs: []int{r.IntN(4)}, Suspended: r.IntN(4) == 0, GPUShare: float64(r.IntN(10)) / 10})
		}
		for range r.IntN(4) {
			s.Requests = append(s.Requests, Request{PID: 100 + r.IntN(8), Class: "latency-critical", GPU: r.IntN(4), AgeUS: int64(r.IntN(5000))})
		}
		s.SLO["latency-critical"] = SLOState{Attainment: 0.9 + float64(r.IntN(10))/100, Target: 0.99, LatencyMS: 20, Requests: r.IntN(100)}
		if r.IntN(2) == 0 {
			s.Demands = append(s.Demands, Demand{PID: 100, Class: "latency-critical", GPUsNeeded: 2, NVLink: true})
		}
		out = append(out, s)
	}
	return out
}

// edgePolicies exercise what the shipped policies do not: conflicting
// rule values, with, comprehensions and every, built-in errors, print.
var edgePolicies = map[string]string{
	"conflict": header + `classify := {"class": "a"} if input.process.comm == "job-0"
classify := {"class": "b"} if startswith(input.process.comm, "job")
`,
	"with": header + `lc if input.process.comm == "lc"
classify := {"class": "with", "reason": r} if {
	lc with input.process.comm as "lc"
	r := sprintf("%s/%d", [input.process.comm, count(input.process.cmdline)])
}
`,
	"comprehensions": header + `names := {n | some n in input.process.cmdline; n != ""}
envs := [k | some k, _ in input.process.env]
classify := {"class": "c", "priority": count(names) + count(envs), "observe": ["launch"]} if {
	every g in input.process.gpus { g < 4 }
	some i, g in input.node.gpus
	g.index == input.process.gpus[0]
	i >= 0
}
`,
	"builtin errors": header + `classify := {"class": "n", "priority": to_number(input.process.comm)}
`,
	"print": header + `classify := default_decision if {
	print("pid", input.process.pid, "user", input.process.user, input.process.pod.labels)
}
`,
	"wrong decision": header + `classify := {"class": "x", "priority": input.process.comm} if input.process.user == "alice"
classify := {"class": "x", "preemption": {"mode": input.process.user}} if input.process.user == "bob"
`,
}

type evaluated struct {
	d      Decision
	v      VictimDecision
	field  string
	failed bool
	prints []Print
}

func classifyAll(t *testing.T, p *Policy, ins []Input) []evaluated {
	t.Helper()
	out := make([]evaluated, len(ins))
	for i, in := range ins {
		d, err := p.Classify(context.Background(), in)
		out[i] = evaluated{d: d, failed: err != nil}
		var de *DecisionError
		if errors.As(err, &de) {
			out[i].field = de.Field
		}
	}
	return out
}

func loadBoth(t *testing.T, fsys fs.FS, name string) (plan, top *Policy, prints *[2][]Print) {
	t.Helper()
	prints = &[2][]Print{}
	var err error
	if plan, err = LoadFS(context.Background(), fsys, name, &Options{Evaluator: EvaluatorPlan, Print: func(p Print) { prints[0] = append(prints[0], p) }}); err != nil {
		t.Fatal(err)
	}
	if e, err := plan.Evaluator(); e != EvaluatorPlan || err != nil {
		t.Fatalf("evaluator %q, %v; want the plan", e, err)
	}
	if top, err = LoadFS(context.Background(), fsys, name, &Options{Evaluator: EvaluatorTopdown, Print: func(p Print) { prints[1] = append(prints[1], p) }}); err != nil {
		t.Fatal(err)
	}
	if e, _ := top.Evaluator(); e != EvaluatorTopdown {
		t.Fatalf("evaluator %q, want topdown", e)
	}
	return plan, top, prints
}

// TestPlanMatchesTopdown holds the compiled plan (OPA's planner and the IR
// interpreter, on the pruned input) to OPA's topdown evaluator (on the
// whole input) as the reference: every shipped policy and every edge
// policy must give the same decision, the same fallback and the same
// print output on every generated input, and the same victims on every
// generated state.
func TestPlanMatchesTopdown(t *testing.T) {
	policies := map[string]fs.FS{"default": rego.Default()}
	for _, name := range rego.Examples() {
		fsys, err := rego.Example(name)
		if err != nil {
			t.Fatal(err)
		}
		policies[name] = fsys
	}
	policies["200 rules"] = dirFS(t, map[string]string{"p.rego": rules200()})
	for name, src := range edgePolicies {
		policies[name] = dirFS(t, map[string]string{"p.rego": src})
	}
	ins, sts := corpus(400), states(200)
	for name, fsys := range policies {
		t.Run(name, func(t *testing.T) {
			plan, top, prints := loadBoth(t, fsys, ".")
			got, want := classifyAll(t, plan, ins), classifyAll(t, top, ins)
			failed, defaults := 0, 0
			for i := range ins {
				if !reflect.DeepEqual(got[i], want[i]) {
					t.Fatalf("input %d (%+v):\nplan:    %+v\ntopdown: %+v", i, ins[i].Process, got[i], want[i])
				}
				if got[i].failed {
					failed++
				}
				if got[i].d.Class == plan.Default().Class {
					defaults++
				}
			}
			if !reflect.DeepEqual(prints[0], prints[1]) {
				t.Fatalf("print output differs:\nplan:    %v\ntopdown: %v", prints[0], prints[1])
			}
			t.Logf("%d inputs: %d fell back on an error, %d got the default class, %d print lines", len(ins), failed, defaults, len(prints[0]))
			if !plan.HasVictims() {
				return
			}
			suspended := 0
			for i, s := range sts {
				gv, gerr := plan.Victims(context.Background(), s)
				wv, werr := top.Victims(context.Background(), s)
				if !reflect.DeepEqual(gv, wv) || (gerr == nil) != (werr == nil) {
					t.Fatalf("state %d: plan %+v, %v; topdown %+v, %v", i, gv, gerr, wv, werr)
				}
				suspended += len(gv.Suspend)
			}
			t.Logf("%d states: %d suspensions", len(sts), suspended)
		})
	}
}

// TestPlanCorpusReachesBranches guards the equivalence test against a
// corpus that stops exercising the policies: the default policy must see
// every way to a class, and the edge policies their errors.
func TestPlanCorpusReachesBranches(t *testing.T) {
	p, err := LoadFS(context.Background(), rego.Default(), ".", &Options{Evaluator: EvaluatorPlan})
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]bool{}
	for _, e := range classifyAll(t, p, corpus(400)) {
		r, _, _ := strings.Cut(e.d.Reason, " ")
		reasons[r+" "+e.d.Class] = true
	}
	for _, want := range []string{"pod latency-critical", "pod best-effort", "env latency-critical", "systemd latency-critical", "cgroup latency-critical", "default: best-effort"} {
		if !reasons[want] {
			t.Errorf("no input reached %q; reached %v", want, reasons)
		}
	}
	for name, field := range map[string]string{"conflict": "", "wrong decision": "priority"} {
		p, err := LoadFS(context.Background(), dirFS(t, map[string]string{"p.rego": edgePolicies[name]}), ".", &Options{Evaluator: EvaluatorPlan})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range classifyAll(t, p, corpus(400)) {
			if e.failed && e.field == field {
				n++
			}
		}
		if n == 0 {
			t.Errorf("%s: no input failed on field %q", name, field)
		}
	}
}

func dirFS(t testing.TB, files map[string]string) fs.FS {
	t.Helper()
	return os.DirFS(writeDir(t, files))
}

// walk is a relation: OPA plans it, the interpreter does not run it.
const unplannable = header + `classify := default_decision if {
	walk(input.process, [_, v])
	v == "x"
}
`

func TestEvaluatorChoice(t *testing.T) {
	dir := writeDir(t, map[string]string{"p.rego": unplannable})
	p, err := Load(context.Background(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e, why := p.Evaluator(); e != EvaluatorTopdown || why == nil || !strings.Contains(why.Error(), "walk") {
		t.Fatalf("auto on a policy using walk: %q, %v; want topdown, naming walk", e, why)
	}
	if d, err := p.Classify(context.Background(), testInput(1, "x")); err != nil || d.Class != "best-effort" {
		t.Fatalf("topdown fallback: %+v, %v", d, err)
	}

	_, err = Load(context.Background(), dir, &Options{Evaluator: EvaluatorPlan})
	var pe *Error
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "cannot be evaluated as a compiled plan") || !strings.Contains(err.Error(), "walk") {
		t.Fatalf("evaluator plan on a policy using walk: %v", err)
	}

	p, err = LoadFS(context.Background(), rego.Default(), ".", nil)
	if err != nil {
		t.Fatal(err)
	}
	if e, why := p.Evaluator(); e != EvaluatorPlan || why != nil {
		t.Fatalf("default policy: %q, %v; want the plan", e, why)
	}
	p, err = LoadFS(context.Background(), rego.Default(), ".", &Options{Evaluator: EvaluatorTopdown})
	if err != nil {
		t.Fatal(err)
	}
	if e, why := p.Evaluator(); e != EvaluatorTopdown || why == nil {
		t.Fatalf("default policy, topdown asked: %q, %v", e, why)
	}

	for in, want := range map[string]Evaluator{"": EvaluatorAuto, "auto": EvaluatorAuto, "plan": EvaluatorPlan, "topdown": EvaluatorTopdown} {
		if got, err := ParseEvaluator(in); err != nil || got != want {
			t.Errorf("ParseEvaluator(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseEvaluator("wasm"); err == nil || !strings.Contains(err.Error(), "auto, plan or topdown") {
		t.Errorf("ParseEvaluator(wasm): %v", err)
	}
	if _, err := Load(context.Background(), dir, &Options{Evaluator: "wasm"}); err == nil || !strings.Contains(err.Error(), "unknown evaluator") {
		t.Errorf("Options.Evaluator wasm: %v", err)
	}
}

// TestInputSourceMatchesInput holds the path-by-path input a compiled
// plan reads to the whole input document: at every path of every
// generated input, the same value; nothing where there is nothing.
func TestInputSourceMatchesInput(t *testing.T) {
	for i, in := range append(corpus(50), benchInput()) {
		src := &inputSource{in: &in}
		whole := ast.NewTerm(in.value(nil))
		paths := 0
		var walk func(path []string, want *ast.Term)
		walk = func(path []string, want *ast.Term) {
			paths++
			if got := src.Value(path); got == nil || !got.Equal(want) {
				t.Fatalf("input %d, path %v: source gives %v, the document %v", i, path, got, want)
			}
			if !src.Has(path) {
				t.Fatalf("input %d, path %v: source says there is nothing", i, path)
			}
			if obj, ok := want.Value.(ast.Object); ok {
				obj.Foreach(func(k, v *ast.Term) { walk(append(slices.Clone(path), string(k.Value.(ast.String))), v) })
			}
		}
		walk(nil, whole)
		if paths < 25 {
			t.Fatalf("input %d: only %d paths walked", i, paths)
		}
		for _, absent := range [][]string{{"nope"}, {"process", "nope"}, {"process", "pid", "x"}, {"process", "env", "NOPE"},
			{"process", "cgroup", "path", "x"}, {"node", "gpus", "0"}, {"apiVersion", "x"}} {
			if src.Value(absent) != nil || src.Has(absent) {
				t.Fatalf("input %d: source has a value at %v", i, absent)
			}
		}
		if in.Process.Pod == nil && (src.Has([]string{"process", "pod"}) || src.Value([]string{"process", "pod", "labels"}) != nil) {
			t.Fatalf("input %d: a pod where there is none", i)
		}
	}
}

// askedSource records what a plan asks an inputSource for.
type askedSource struct {
	inputSource
	asked []string
}

func (s *askedSource) Value(path []string) *ast.Term {
	s.asked = append(s.asked, strings.Join(path, "."))
	return s.inputSource.Value(path)
}

// TestPlanReadsOnlyWhatThePolicyUses checks that a classification through
// the plan asks for no more of the input than the policy references.
func TestPlanReadsOnlyWhatThePolicyUses(t *testing.T) {
	p, err := LoadFS(context.Background(), dirFS(t, map[string]string{"p.rego": rules200()}), ".", nil)
	if err != nil {
		t.Fatal(err)
	}
	in := benchInput()
	src := &askedSource{inputSource: inputSource{in: &in}}
	if _, _, err := p.evalPlanned(context.Background(), EntryClassify, &irvm.Options{Source: src}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(src.asked)
	// user is read only by rules whose namespace matched: none here.
	want := []string{"process.comm", "process.exe", "process.pod.labels.team", "process.pod.namespace"}
	if !slices.Equal(src.asked, want) {
		t.Fatalf("asked for %v, want %v", src.asked, want)
	}
}

// TestConcurrentClassify classifies from many goroutines at once on one
// policy (shared plan, evaluation pool, decision cache): every decision
// must be the one a lone call gives.
func TestConcurrentClassify(t *testing.T) {
	p, err := LoadFS(context.Background(), rego.Default(), ".", nil)
	if err != nil {
		t.Fatal(err)
	}
	ins := corpus(200)
	want := classifyAll(t, p, ins)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range ins {
				k := (i + 25*g) % len(ins)
				d, err := p.Classify(context.Background(), ins[k])
				if !reflect.DeepEqual(d, want[k].d) || (err != nil) != want[k].failed {
					errs <- fmt.Sprintf("goroutine %d, input %d: %+v, %v; alone: %+v", g, k, d, err, want[k])
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// TestPlanLooksUpArraysByIndex: a policy that reads an array of the input
// by index only (the first argument of the command line, a GPU by a
// computed index) decides through the compiled plan, which asks for the
// input path by path, as topdown does on the whole document.
func TestPlanLooksUpArraysByIndex(t *testing.T) {
	for _, tc := range []struct {
		rule    string
		cmdline []string
		gpus    []int
		want    string
	}{
		{`classify := {"class": "python"} if input.process.cmdline[0] == "python3"`, []string{"python3", "-m", "x"}, nil, "python"},
		{`classify := {"class": "python"} if input.process.cmdline[0] == "python3"`, []string{"java"}, nil, "best-effort"},
		{`classify := {"class": "gpu-3"} if {
	some i in numbers.range(0, 7)
	input.process.gpus[i] == 3
}`, nil, []int{0, 3}, "gpu-3"},
		{`classify := {"class": "gpu-3"} if {
	some i in numbers.range(0, 7)
	input.process.gpus[i] == 3
}`, nil, []int{1}, "best-effort"},
	} {
		dir := writeDir(t, map[string]string{"p.rego": header + tc.rule + "\n"})
		plan, err := Load(context.Background(), dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ev, why := plan.Evaluator(); ev != EvaluatorPlan {
			t.Fatalf("%s: evaluated by %s: %v", tc.rule, ev, why)
		}
		topdown, err := Load(context.Background(), dir, &Options{Evaluator: EvaluatorTopdown})
		if err != nil {
			t.Fatal(err)
		}
		in := testInput(1, "x")
		in.Process.Cmdline, in.Process.GPUs = tc.cmdline, tc.gpus
		got, err := plan.Classify(context.Background(), in)
		ref, refErr := topdown.Classify(context.Background(), in)
		if err != nil || refErr != nil || got.Class != tc.want || ref.Class != tc.want {
			t.Errorf("%s\ncmdline %q, gpus %v: plan %q (%v), topdown %q (%v), want %q", tc.rule, tc.cmdline, tc.gpus, got.Class, err, ref.Class, refErr, tc.want)
		}
	}
}
