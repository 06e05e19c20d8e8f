package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sim/report"
	"github.com/gpu-arbiter/arbiter/sim/whatif"
)

func runSimCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newSimCmd()
	cmd.SilenceUsage, cmd.SilenceErrors = true, true // as under the root command
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestSimCommand(t *testing.T) {
	spec := filepath.Join("..", "..", "examples", "workloads", "timeslice-inflation.yaml")
	dirs := []string{t.TempDir(), t.TempDir()}
	var reports [][]byte
	for _, dir := range dirs {
		out, err := runSimCmd(t, "--workload", spec, "--duration", "5s", "--seed", "42", "--quiet",
			"--baselines", "exclusive,timeslice,priority,scripted-suspend", "--out", dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"seed 42", "exclusive", "timeslice", "priority", "scripted-suspend", "resnet-infer", "llm-train", "p99/excl"} {
			if !strings.Contains(out, want) {
				t.Errorf("table lacks %q:\n%s", want, out)
			}
		}
		for _, name := range []string{"report.json", "latency.svg", "timeline.svg"} {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil || len(b) == 0 {
				t.Fatalf("%s: %v", name, err)
			}
			if strings.HasSuffix(name, ".svg") && !bytes.HasPrefix(b, []byte("<svg")) {
				t.Errorf("%s is not SVG", name)
			}
		}
		b, _ := os.ReadFile(filepath.Join(dir, "report.json"))
		reports = append(reports, b)
	}
	if !bytes.Equal(reports[0], reports[1]) {
		t.Error("same seed, different report.json")
	}
}

func TestSimCommandErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("gpus: 1\nbe:\n  - name: x\n    gpu: 0\n    kernel: -3ms\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join("..", "..", "examples", "workloads", "timeslice-inflation.yaml")
	badPolicy := t.TempDir()
	if err := os.WriteFile(filepath.Join(badPolicy, "p.rego"), []byte("package arbiter\n\nclassify := {\"class\": }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--workload", bad}, "bad.yaml:5: be[0].kernel: -3ms: a duration must not be negative"},
		{[]string{"--workload", spec, "--baselines", "nope"}, `unknown baseline "nope"`},
		{[]string{"--workload", spec, "--baselines", "exclusive,timeslice,exclusive"}, `--baselines: baseline "exclusive" given twice`},
		{[]string{"--workload", spec, "--policy", badPolicy}, "p.rego:3:"},
		{[]string{"--workload", spec, "--baselines", "timeslice,arbiter"}, "--policy DIR"},
		{[]string{"--workload", filepath.Join(t.TempDir(), "missing.yaml")}, "no such file"},
		{[]string{}, `required flag(s) "workload" not set`},
		{[]string{spec}, `sim takes no arguments; the workload spec goes in --workload FILE`},
	}
	for _, c := range cases {
		_, err := runSimCmd(t, append(c.args, "--quiet")...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want %q", c.args, err, c.want)
		}
		var ue *usageError
		if strings.HasPrefix(c.want, "--baselines") && !errors.As(err, &ue) {
			t.Errorf("%v: %v is not a usage error", c.args, err)
		}
	}
}

// TestSimCommandFlagWarnings: a 0 that means the default where 0 was
// likely meant, and a mistyped baseline, are said before anything else;
// negative durations name their flag.
func TestSimCommandFlagWarnings(t *testing.T) {
	spec := filepath.Join("..", "..", "examples", "workloads", "timeslice-inflation.yaml")
	overload := filepath.Join(t.TempDir(), "overload.yaml")
	if err := os.WriteFile(overload, []byte("gpus: 1\nlc:\n  - name: a\n    gpu: 0\n    arrival: {process: poisson, rate: 50000}\n"+
		"    request:\n      - kernel: {count: 10, duration: 1ms}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		cmd := newSimCmd()
		var errOut bytes.Buffer
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&errOut)
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(t.Context())
		return errOut.String(), err
	}
	stderr, err := run("--workload", spec, "--duration", "0", "--baselines", "exclusive")
	if err != nil || !strings.Contains(stderr, "warning: --duration 0 means the default: each run simulates 1m0s") {
		t.Errorf("--duration 0: %v, stderr %q", err, stderr)
	}
	stderr, err = run("--workload", spec, "--duration", "100ms", "--baselines", "exclusive", "--timeline-window", "0", "--out", t.TempDir())
	if err != nil || !strings.Contains(stderr, "warning: --timeline-window 0: timeline.svg shows no timeline") {
		t.Errorf("--timeline-window 0: %v, stderr %q", err, stderr)
	}
	stderr, err = run("--workload", overload, "--duration", "1s", "--baselines", "exclusive,fifo")
	if err == nil || !strings.Contains(err.Error(), `--baselines: unknown baseline "fifo"`) || strings.Contains(stderr, "warning") {
		t.Errorf("a mistyped baseline: %v, stderr %q (want the error, no warning)", err, stderr)
	}
	for _, c := range [][]string{{"--duration", "-1s"}, {"--timeline-window", "-1s"}} {
		if _, err := run(append([]string{"--workload", spec}, c...)...); err == nil || !strings.HasPrefix(err.Error(), c[0]+" -1s: must not be negative") {
			t.Errorf("%v: %v", c, err)
		}
	}
}

// TestSimCommandInterrupted: a cancelled run (Ctrl-C) stops with exit
// status 130 and a short message, and writes no output files.
func TestSimCommandInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := filepath.Join(t.TempDir(), "out")
	cmd := newSimCmd()
	var errOut bytes.Buffer
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--workload", filepath.Join("..", "..", "examples", "workloads", "timeslice-inflation.yaml"),
		"--duration", "1h", "--out", dir})
	err := cmd.ExecuteContext(ctx)
	var ec exitCoder
	if !errors.As(err, &ec) || ec.ExitCode() != 130 || err.Error() != "interrupted: no output written" {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("output directory created on an interrupted run: %v", err)
	}
}

// TestSimCommandJSON: --format json prints the report.json content.
func TestSimCommandJSON(t *testing.T) {
	spec := filepath.Join("..", "..", "examples", "workloads", "timeslice-inflation.yaml")
	out, err := runSimCmd(t, "--workload", spec, "--duration", "1s", "--quiet", "--baselines", "exclusive,timeslice", "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Baselines []struct{ Name string } `json:"baselines"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Baselines) != 2 || rep.Baselines[1].Name != "timeslice" {
		t.Errorf("stdout is not the report: %v\n%.300s", err, out)
	}
	if !strings.Contains(out, `"p99_ratio"`) {
		t.Errorf("with exclusive run, no p99_ratio:\n%.600s", out)
	}
	// Without the exclusive run there is no ratio: the field is absent,
	// not 0 (which would read as infinitely faster).
	out, err = runSimCmd(t, "--workload", spec, "--duration", "1s", "--quiet", "--baselines", "timeslice", "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, `"p99_ratio"`) || !strings.Contains(out, `"p99_ns"`) {
		t.Errorf("without exclusive: want p99_ns and no p99_ratio:\n%.600s", out)
	}
}

// TestSimCommandTrace: given a recorded trace instead of a spec, sim says
// so and prints a spec that replays it on stdout, alone, so that it can be
// redirected into a file, and that spec runs.
func TestSimCommandTrace(t *testing.T) {
	trace := filepath.Join("..", "..", "examples", "workloads", "recorded", "stub-infer-train.arbt")
	spec, err := runSimCmd(t, "--workload", trace, "--quiet")
	if err == nil || !strings.Contains(err.Error(), "is a trace recorded by arbiter trace --record, not a workload spec") ||
		!strings.Contains(err.Error(), "on stdout") || strings.Contains(err.Error(), "control characters") || strings.Contains(err.Error(), "name: ") {
		t.Fatalf("got %v", err)
	}
	if !strings.HasPrefix(spec, "name: ") {
		t.Fatalf("stdout is not the spec alone:\n%s", spec)
	}
	for _, want := range []string{"file: stub-infer-train.arbt", "comm: infer, name: infer, class: be", "driver calls",
		"duration: 3.065s   # the trace's calls span 3.064", "request_end: sync"} {
		if !strings.Contains(spec, want) {
			t.Errorf("suggested spec lacks %q:\n%s", want, spec)
		}
	}
	dir := t.TempDir()
	data, _ := os.ReadFile(trace)
	_ = os.WriteFile(filepath.Join(dir, "stub-infer-train.arbt"), data, 0o644)
	_ = os.WriteFile(filepath.Join(dir, "s.yaml"), []byte(spec), 0o644)
	if _, err := runSimCmd(t, "--workload", filepath.Join(dir, "s.yaml"), "--duration", "1s", "--quiet", "--baselines", "timeslice"); err != nil {
		t.Errorf("the suggested spec does not run: %v\n%s", err, spec)
	}
	// A process the trace does not hold: the error has the line and
	// names the processes it does hold.
	bad := strings.Replace(spec, "comm: train, name: train", "comm: tran, name: tran", 1)
	_ = os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte(bad), 0o644)
	_, err = runSimCmd(t, "--workload", filepath.Join(dir, "bad.yaml"), "--duration", "1s", "--quiet", "--baselines", "timeslice")
	if err == nil || !strings.Contains(err.Error(), "bad.yaml:9: replay[0].processes[0]: no driver calls of this process in ") ||
		!strings.Contains(err.Error(), "; it holds those of comm train (pid 4472), 186 calls; comm infer (pid 4473), 4186 calls") {
		t.Errorf("a process the trace does not hold: %v\n%s", err, bad)
	}
	// A trace whose file name is no spec name (too long, ": " and '#' in
	// it): the suggested spec still runs as it is printed.
	odd := strings.Repeat("t", 140) + ": #1\a.arbt"
	_ = os.WriteFile(filepath.Join(dir, odd), data, 0o644)
	spec, _ = runSimCmd(t, "--workload", filepath.Join(dir, odd), "--quiet")
	_ = os.WriteFile(filepath.Join(dir, "odd.yaml"), []byte(spec), 0o644)
	if _, err := runSimCmd(t, "--workload", filepath.Join(dir, "odd.yaml"), "--duration", "1s", "--quiet", "--baselines", "timeslice"); err != nil {
		t.Errorf("the spec suggested for %q does not run: %v\n%s", odd, err, spec)
	}
}

// TestProgress: a line at most once a second of wall time, saying how many
// baselines are done of how many, which run and how far, and an estimate
// of the time left.
func TestSimProgress(t *testing.T) {
	var b bytes.Buffer
	now := time.Unix(1000, 0)
	p := newProgress(&b, func() time.Time { return now }, 0)
	s := whatif.Progress{Baselines: 7, Done: 2, Running: []whatif.Running{{Baseline: "timeslice", Fraction: 0.5}, {Baseline: "mps", Fraction: 0.25}},
		Simulated: 30, Total: 100}
	p.report(s) // at once: nothing yet
	now = now.Add(3 * time.Second)
	p.report(s)
	now = now.Add(500 * time.Millisecond)
	p.report(s) // within a second of the last line: nothing
	want := "sim: 2/7 baselines done, 30% of all runs, about 7s left; running timeslice 50%, mps 25%\n"
	if got := b.String(); got != want {
		t.Errorf("progress\n got %q\nwant %q", got, want)
	}
	// Nearly done: less than half a second left is not "about 0s".
	b.Reset()
	now = now.Add(time.Second)
	s.Simulated = 95
	p.report(s)
	if want := ", 95% of all runs, under a second left; running timeslice 50%, mps 25%\n"; !strings.HasSuffix(b.String(), want) {
		t.Errorf("progress near the end %q, want it to end %q", b.String(), want)
	}

	// On a terminal, each report replaces the last on one line, cut to
	// its width, which done ends; the cut takes the list of runs first.
	b.Reset()
	now = time.Unix(1000, 0)
	p = newProgress(&b, func() time.Time { return now }, 61)
	for range 2 {
		now = now.Add(2 * time.Second)
		p.report(s)
	}
	p.done()
	p.done() // once
	// Cut to 60 columns: one less than the terminal's, so that the
	// cursor stays on the line.
	line := "sim: 2/7 baselines done, 95% of all runs, under a second lef"
	if want := "\r\033[K" + line + "\r\033[K" + line + "\n"; b.String() != want {
		t.Errorf("progress on a terminal\n got %q\nwant %q", b.String(), want)
	}
}

// TestSimProgressSlowRun: the time left is the slowest run's at its own
// pace, not the share of all simulated time left: nine runs that finish
// fast and one at a tenth of their pace (the arbiter baseline runs the
// policy and the engine on every event) leave most of the wall time
// after the share done passes 90%; and once the slow run has a thread to
// itself, its faster recent pace counts.
func TestSimProgressSlowRun(t *testing.T) {
	var b bytes.Buffer
	now := time.Unix(1000, 0)
	p := newProgress(&b, func() time.Time { return now }, 0)
	const total = 100
	runs := make([]whatif.RunProgress, 10)
	for i := range runs {
		runs[i] = whatif.RunProgress{Baseline: "b" + strconv.Itoa(i), Total: total, Started: true}
	}
	report := func() string {
		s := whatif.Progress{Baselines: len(runs), Total: total * uint64(len(runs)), Runs: runs}
		for _, r := range runs {
			s.Simulated += r.Simulated
			if r.Done {
				s.Done++
			}
		}
		b.Reset()
		p.report(s)
		return b.String()
	}
	// After 2 s: the nine fast runs at 40 of 100 (20 a second), the slow
	// one at 4 (2 a second): 96 to go, 48 s.
	now = now.Add(2 * time.Second)
	for i := range runs {
		runs[i].Simulated = 40
	}
	runs[9].Simulated = 4
	if got := report(); !strings.Contains(got, "0/10 baselines done, 36% of all runs, about 48s left") {
		t.Errorf("slow run at 2 a second with 96 to go: %q, want about 48s left", got)
	}
	// After 10 s: the nine done, the slow one at 20, still 2 a second:
	// 80 to go, 40 s, though 92% of all simulated time is done.
	now = now.Add(8 * time.Second)
	for i := range 9 {
		runs[i].Simulated, runs[i].Done = total, true
	}
	runs[9].Simulated = 20
	if got := report(); !strings.Contains(got, "9/10 baselines done, 92% of all runs, about 40s left") {
		t.Errorf("the slow run alone at 20 of 100: %q, want about 40s left", got)
	}
	// After 11 s: with a thread to itself it went 10 in the last second;
	// its pace, smoothed, is 6 a second (faster than its average since
	// the start): 70 to go, about 12 s.
	now = now.Add(time.Second)
	runs[9].Simulated = 30
	if got := report(); !strings.Contains(got, "about 12s left") {
		t.Errorf("the slow run sped up to 10 a second: %q, want about 12s left", got)
	}
	// Without the runs' own progress, the share of all runs done is all
	// there is: 93% done in 12 s, about a second left.
	p2 := newProgress(&b, func() time.Time { return now }, 0)
	now = now.Add(12 * time.Second)
	b.Reset()
	p2.report(whatif.Progress{Baselines: 10, Done: 9, Simulated: 930, Total: 1000})
	if got := b.String(); !strings.Contains(got, "93% of all runs, about 1s left") {
		t.Errorf("without runs: %q", got)
	}
}

// simPolicyReport runs timeslice-inflation.yaml for duration under
// baselines with the default policy (--policy rego/default) and returns
// the report.
func simPolicyReport(t *testing.T, baselines, duration string) report.Report {
	t.Helper()
	out, err := runSimCmd(t, "--workload", filepath.Join("..", "..", "examples", "workloads", "timeslice-inflation.yaml"),
		"--policy", filepath.Join("..", "..", "rego", "default"), "--baselines", baselines, "--duration", duration,
		"--format", "json", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	var r report.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	return r
}

// TestSimArbiterBaseline: --policy runs the real policy and the engine in
// the loop as the arbiter baseline: the default policy classifies the
// spec's latency-critical workload by its label, and the engine keeps its
// p99 near exclusive where time-slicing inflates it by multiples.
func TestSimArbiterBaseline(t *testing.T) {
	r := simPolicyReport(t, "exclusive,timeslice", "10s")
	rows := map[string]report.Baseline{}
	for _, b := range r.Baselines {
		rows[b.Name] = b
	}
	a, ts := rows["arbiter"], rows["timeslice"]
	if len(a.LC) != 1 || len(a.BE) != 1 || a.LC[0].Class != "latency-critical" || a.BE[0].Class != "best-effort" {
		t.Fatalf("arbiter baseline rows: %+v", a)
	}
	if a.LC[0].P99Ratio > 1.1 || ts.LC[0].P99Ratio < 3 {
		t.Errorf("LC p99/exclusive: arbiter %.2f, time-slicing %.2f", a.LC[0].P99Ratio, ts.LC[0].P99Ratio)
	}
	if a.Controller == nil || a.Controller.Suspends == 0 || a.Controller.Suspends != a.Controller.Resumes {
		t.Errorf("engine actions %+v", a.Controller)
	}
}

// TestSimArbiterBaselineNamed: a --baselines list that names arbiter,
// with --policy, runs it once, where the list puts it.
func TestSimArbiterBaselineNamed(t *testing.T) {
	r := simPolicyReport(t, "arbiter,exclusive", "2s")
	var names []string
	for _, b := range r.Baselines {
		names = append(names, b.Name)
	}
	if !slices.Equal(names, []string{"arbiter", "exclusive"}) {
		t.Errorf("baselines %v, want [arbiter exclusive]", names)
	}
}

// TestSimDocSpec: the spec docs/simulator.md shows, every field in it,
// runs as shown (its replay file where the examples keep it).
func TestSimDocSpec(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "simulator.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "\n```yaml\n")
	spec, _, ok2 := strings.Cut(rest, "\n```\n")
	if !ok || !ok2 || !strings.Contains(spec, "replay:") {
		t.Fatal("docs/simulator.md has no spec with a replay section in a yaml block")
	}
	dir := t.TempDir()
	recorded, err := filepath.Abs(filepath.Join("..", "..", "examples", "workloads", "recorded"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(recorded, filepath.Join(dir, "recorded")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "spec.yaml")
	if err := os.WriteFile(path, []byte(spec+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runSimCmd(t, "--workload", path, "--duration", "20ms", "--quiet")
	if err != nil {
		t.Fatalf("the documented spec: %v", err)
	}
	for _, want := range []string{"infer", "train", "infer-rec", "train-rec"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
}

// TestSimPolicyFailingTests: a policy whose own Rego tests fail is
// refused before the run, as the daemon refuses it, naming the test.
func TestSimPolicyFailingTests(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"policy.rego", "policy_test.rego"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "rego", "default", name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "policy_test.rego" {
			b = bytes.Replace(b, []byte(`d.class == "best-effort"`), []byte(`d.class == "latency-critical"`), 1)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec := filepath.Join("..", "..", "examples", "workloads", "timeslice-inflation.yaml")
	_, err := runSimCmd(t, "--workload", spec, "--duration", "10ms", "--quiet", "--policy", dir)
	if err == nil {
		t.Fatal("a policy whose tests fail was used")
	}
	for _, want := range []string{"daemon would refuse it", "policy_test.rego:", "arbiter_test_failure", "test_best_effort_by_default"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// TestSimPolicyBestEffortAlone: under the default policy, best-effort
// trainers sharing a GPU with no latency-critical process share it as
// the driver's time-slicing does: their short timeslice, for a
// latency-critical process to wait little, is not set with none there.
func TestSimPolicyBestEffortAlone(t *testing.T) {
	spec := filepath.Join(t.TempDir(), "bebe.yaml")
	if err := os.WriteFile(spec, []byte(`gpus: 1
be:
  - name: train-a
    gpu: 0
    kernel: {dist: lognormal, mean: 5ms, cv: 0.2}
    sync_every: 8
  - name: train-b
    gpu: 0
    kernel: {dist: lognormal, mean: 5ms, cv: 0.2}
    sync_every: 8
`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runSimCmd(t, "--workload", spec, "--duration", "5s", "--quiet", "--format", "json",
		"--policy", filepath.Join("..", "..", "rego", "default"), "--baselines", "timeslice,arbiter")
	if err != nil {
		t.Fatal(err)
	}
	var rep report.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Baselines) != 2 {
		t.Fatalf("%d baselines, want 2", len(rep.Baselines))
	}
	ts, arb := rep.Baselines[0], rep.Baselines[1]
	if arb.Name != "arbiter" || len(arb.BE) != 2 || len(ts.BE) != 2 {
		t.Fatalf("baselines %s, %s; BE rows %d, %d", ts.Name, arb.Name, len(ts.BE), len(arb.BE))
	}
	for i := range arb.BE {
		if a, b := arb.BE[i].Throughput, ts.BE[i].Throughput; a < 0.99*b {
			t.Errorf("%s under the policy: throughput %.3f, under time-slicing %.3f", arb.BE[i].Name, a, b)
		}
	}
	if arb.PreemptionsPerS > 1.01*ts.PreemptionsPerS {
		t.Errorf("%.0f preemptions/s under the policy, %.0f under time-slicing", arb.PreemptionsPerS, ts.PreemptionsPerS)
	}
}

// TestSimPolicyClassMismatch: before the run, --policy says which spec
// workloads the policy puts in another kind of class than the spec does
// (an LC workload without the labels the policy reads, a BE workload
// labelled latency-critical), with the policy's reason and what to add;
// a workload the policy classes as the spec does gets no word, and every
// shipped example labels its LC workloads for the default policy.
func TestSimPolicyClassMismatch(t *testing.T) {
	dir := t.TempDir()
	spec := filepath.Join(dir, "mixed.yaml")
	if err := os.WriteFile(spec, []byte(`gpus: 1
lc:
  - name: unlabelled
    gpu: 0
    replicas: 2
    arrival: {process: poisson, rate: 10}
    request:
      - kernel: {count: 2, duration: 100us}
  - name: labelled
    gpu: 0
    labels: {arbiter.io/class: latency-critical}
    arrival: {process: poisson, rate: 10}
    request:
      - kernel: {count: 2, duration: 100us}
be:
  - name: posing
    gpu: 0
    env: {ARBITER_CLASS: latency-critical}
    kernel: 1ms
  - name: train
    gpu: 0
    kernel: 1ms
`), 0o644); err != nil {
		t.Fatal(err)
	}
	policyDir := filepath.Join("..", "..", "rego", "default")
	run := func(spec string) string {
		t.Helper()
		cmd := newSimCmd()
		var errOut bytes.Buffer
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&errOut)
		cmd.SetArgs([]string{"--workload", spec, "--policy", policyDir, "--baselines", "exclusive", "--duration", "100ms"})
		if err := cmd.ExecuteContext(t.Context()); err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		return errOut.String()
	}
	stderr := run(spec)
	var warnings []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "warning: --policy") {
			warnings = append(warnings, l)
		}
	}
	if len(warnings) != 2 {
		t.Fatalf("want two class warnings (unlabelled once for its two replicas, posing), got %d in:\n%s", len(warnings), stderr)
	}
	for _, want := range []string{
		"warning: --policy " + policyDir + " does not make unlabelled, an LC workload in the spec, latency-critical (class best-effort; reason: default",
		"the spec gives it none; for rego/default add labels: {arbiter.io/class: latency-critical} to it",
	} {
		if !strings.Contains(warnings[0], want) {
			t.Errorf("first warning %q lacks %q", warnings[0], want)
		}
	}
	if want := "makes posing, a BE workload in the spec, latency-critical (class latency-critical; reason: env ARBITER_CLASS)"; !strings.Contains(warnings[1], want) {
		t.Errorf("second warning %q lacks %q", warnings[1], want)
	}
	// A policy whose rules conflict for the BE workload (two values for
	// one comm): its failure is said as such, with the fallback class,
	// not taken for a class the spec disagrees with.
	broken := filepath.Join(dir, "broken")
	if err := os.MkdirAll(broken, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, "policy.rego"), []byte(`package arbiter

import data.arbiter.lib

default_decision := lib.with_reason(lib.classes["best-effort"], "default")

classify := object.union(lib.classes["latency-critical"], {"reason": "labelled"}) if lib.label("arbiter.io/class") == "latency-critical"

classify := object.union(lib.classes["best-effort"], {"reason": "a"}) if input.process.comm == "train"

classify := object.union(lib.classes["best-effort"], {"reason": "b"}) if startswith(input.process.comm, "tr")
`), 0o644); err != nil {
		t.Fatal(err)
	}
	policyDir = broken
	stderr = run(spec)
	if want := "warning: --policy " + broken + " failed to classify train ("; !strings.Contains(stderr, want) ||
		!strings.Contains(stderr, "the engine applies its fallback, class best-effort") || strings.Contains(stderr, "makes train") {
		t.Errorf("a policy that fails for train: want %q and its fallback, not a class mismatch, in:\n%s", want, stderr)
	}
	policyDir = filepath.Join("..", "..", "rego", "default")
	examples, err := filepath.Glob(filepath.Join("..", "..", "examples", "workloads", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	published, _ := filepath.Glob(filepath.Join("..", "..", "examples", "workloads", "published", "*.yaml"))
	for _, ex := range append(examples, published...) {
		if stderr := run(ex); strings.Contains(stderr, "warning: --policy") {
			t.Errorf("%s: the default policy classes a workload against its spec:\n%s", ex, stderr)
		}
	}
}
