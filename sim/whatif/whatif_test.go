package whatif

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/sim/report"
	"github.com/gpu-arbiter/arbiter/sim/scripted"
	"github.com/gpu-arbiter/arbiter/sim/workload"
)

func examples(t testing.TB, name string) *workload.File {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	f, err := workload.Load(filepath.Join(filepath.Dir(here), "..", "..", "examples", "workloads", name))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func config(t testing.TB, f *workload.File, d time.Duration, seed uint64, baselines ...string) *Config {
	t.Helper()
	ws, err := f.Workloads()
	if err != nil {
		t.Fatal(err)
	}
	opts, err := f.Options()
	if err != nil {
		t.Fatal(err)
	}
	return &Config{Name: f.Spec.Name, Workloads: ws, Options: opts, ControlLatency: f.ControlLatency(), Seed: seed, Duration: d, Baselines: baselines,
		TimelineWindow: 20 * time.Millisecond}
}

func lc(t *testing.T, r *report.Report, baseline, name string) report.LC {
	t.Helper()
	for _, b := range r.Baselines {
		if b.Name != baseline {
			continue
		}
		for _, l := range b.LC {
			if l.Name == name {
				return l
			}
		}
	}
	t.Fatalf("no %s/%s in report", baseline, name)
	return report.LC{}
}

// TestTimesliceInflation reproduces the classic result on the shipped
// example: default time-slicing inflates the LC tail by multiples next to
// 20 ms BE kernels, ideal priority keeps it near exclusive, and the
// scripted suspend policy, driven through engine.Source/Enforcer, gets
// close to ideal.
func TestTimesliceInflation(t *testing.T) {
	f := examples(t, "timeslice-inflation.yaml")
	r, err := Run(context.Background(), config(t, f, 20*time.Second, 1, Exclusive, Timeslice, Priority, ScriptedSuspend, MPS))
	if err != nil {
		t.Fatal(err)
	}
	ts := lc(t, r, Timeslice, "resnet-infer")
	pr := lc(t, r, Priority, "resnet-infer")
	sc := lc(t, r, ScriptedSuspend, "resnet-infer")
	t.Logf("p99 ratio: timeslice %.2f, priority %.2f, scripted-suspend %.2f", ts.P99Ratio, pr.P99Ratio, sc.P99Ratio)
	if ts.P99Ratio < 4 {
		t.Errorf("timeslice p99 ratio %.2f: want ≥ 4 (multiples)", ts.P99Ratio)
	}
	if pr.P99Ratio < 1 || pr.P99Ratio > 1.2 {
		t.Errorf("priority p99 ratio %.2f: want within [1, 1.2]", pr.P99Ratio)
	}
	if sc.P99Ratio > 1.25 {
		t.Errorf("scripted-suspend p99 ratio %.2f: want ≤ 1.25", sc.P99Ratio)
	}
	if !pr.SLOMet || ts.SLOMet {
		t.Errorf("SLO met: priority %v (want true), timeslice %v (want false)", pr.SLOMet, ts.SLOMet)
	}
	for _, b := range r.Baselines {
		if b.Name == ScriptedSuspend && (b.Controller == nil || b.Controller.Suspends == 0 || b.Controller.Resumes == 0) {
			t.Errorf("closed loop did not act: %+v", b.Controller)
		}
		if b.Name != Exclusive && (len(b.BE) != 1 || b.BE[0].Fraction == nil || *b.BE[0].Fraction <= 0.5 || *b.BE[0].Fraction > 1) {
			t.Errorf("%s: BE fraction %+v", b.Name, b.BE)
		}
	}
}

// TestGPreemptPreset: GPreempt's preset (BE timeslice 1 µs, LC 1 s, set
// once) makes the GPU's own time-slicing yield BE to LC within a
// microsecond plus a save and a switch: on the shipped example, the LC
// tail stays near exclusive where the driver's default 1 ms slices
// inflate it by multiples, and BE keeps what ideal priority leaves it.
// With the default slices, or with 1 ms LC slices that let BE back in
// mid-request, the LC tail would grow past the bound.
func TestGPreemptPreset(t *testing.T) {
	if gpreemptSlices(sim.ClassBE) != time.Microsecond || gpreemptSlices(sim.ClassLC) != time.Second {
		t.Fatalf("preset: BE %v, LC %v; want 1µs and 1s", gpreemptSlices(sim.ClassBE), gpreemptSlices(sim.ClassLC))
	}
	f := examples(t, "timeslice-inflation.yaml")
	r, err := Run(context.Background(), config(t, f, 20*time.Second, 1, Exclusive, Timeslice, Priority, GPreempt))
	if err != nil {
		t.Fatal(err)
	}
	gp, ts := lc(t, r, GPreempt, "resnet-infer"), lc(t, r, Timeslice, "resnet-infer")
	if gp.P99Ratio < 1 || gp.P99Ratio > 1.2 || ts.P99Ratio < 4 {
		t.Errorf("p99/exclusive: gpreempt %.2f (want within [1, 1.2]), timeslice %.2f (want ≥ 4)", gp.P99Ratio, ts.P99Ratio)
	}
	be := map[string]float64{}
	for _, b := range r.Baselines {
		if len(b.BE) == 1 && b.BE[0].Fraction != nil {
			be[b.Name] = *b.BE[0].Fraction
		}
	}
	if d := be[GPreempt] - be[Priority]; d < -0.05 || d > 0.05 {
		t.Errorf("BE throughput/exclusive: gpreempt %.3f, priority %.3f: want within 0.05", be[GPreempt], be[Priority])
	}

	// An LC request of 5 ms of kernels with no synchronization between
	// them outlasts the driver's 1 ms slice: under the preset its 1 s
	// slice keeps BE off until it ends, as ideal priority does.
	long, err := workload.Parse([]byte(`gpus: 1
lc:
  - name: long
    gpu: 0
    arrival: {process: poisson, rate: 20}
    request:
      - kernel: {count: 50, duration: 100us}
be:
  - name: train
    gpu: 0
    kernel: {dist: lognormal, mean: 20ms, cv: 0.1}
    sync_every: 8
`), "long.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err = Run(context.Background(), config(t, long, 20*time.Second, 1, Exclusive, Priority, GPreempt))
	if err != nil {
		t.Fatal(err)
	}
	gp, pr := lc(t, r, GPreempt, "long"), lc(t, r, Priority, "long")
	if gp.P50NS > pr.P50NS*102/100 {
		t.Errorf("a 5 ms LC request: p50 %v under the preset, %v under ideal priority: want within 2%% (BE back in at each LC slice's end?)",
			time.Duration(gp.P50NS), time.Duration(pr.P50NS))
	}
}

// TestDeterministic: the same seed gives the same report.json bytes
// however many runs go at once; a different seed gives different ones.
func TestDeterministic(t *testing.T) {
	f := examples(t, "inference-mix.yaml")
	all := Names()[:len(Names())-1]
	parallel := 0
	js := func(seed uint64) []byte {
		cfg := config(t, f, 3*time.Second, seed, all...)
		cfg.Parallel = parallel
		r, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := r.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		var svg bytes.Buffer
		if err := r.WriteLatency(&svg); err != nil {
			t.Fatal(err)
		}
		if err := r.WriteTimeline(&svg, uint64(20*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		return append(b.Bytes(), svg.Bytes()...)
	}
	parallel = 1
	a := js(7)
	parallel = 3
	b := js(7)
	parallel = 0
	c := js(8)
	if !bytes.Equal(a, b) {
		t.Error("same seed, different output one run at a time and three at once")
	}
	if bytes.Equal(a, c) {
		t.Error("different seeds, same output")
	}
}

// TestConservation: every kernel submitted is completed or in flight at
// the end, for every baseline; runs are cut mid-request.
func TestConservation(t *testing.T) {
	f := examples(t, "inference-mix.yaml")
	r, err := Run(context.Background(), config(t, f, 1234567*time.Microsecond, 3,
		Exclusive, Timeslice, MPS, Priority, ScriptedSuspend, ScriptedTimeslice))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range r.Baselines {
		k := b.Kernels
		if k.Submitted == 0 || k.Submitted != k.Completed+k.InFlight {
			t.Errorf("%s: submitted %d ≠ completed %d + in flight %d", b.Name, k.Submitted, k.Completed, k.InFlight)
		}
		if b.Name != Exclusive {
			var u float64
			for _, g := range b.PerGPU {
				u += g.Utilization
				if g.Utilization+g.SwitchShare+g.PreemptShare > 1 {
					t.Errorf("%s gpu %d: shares add up past 1: %+v", b.Name, g.Index, g)
				}
			}
			if len(b.PerGPU) != 2 || u/2-b.GPUUtilization > 1e-9 || b.GPUUtilization-u/2 > 1e-9 {
				t.Errorf("%s: per-GPU %+v against %v", b.Name, b.PerGPU, b.GPUUtilization)
			}
		}
		if k.InFlight == 0 {
			t.Errorf("%s: nothing in flight at a cut of 1.234567 s: the check proves nothing", b.Name)
		}
	}
}

func TestBadConfig(t *testing.T) {
	f := examples(t, "timeslice-inflation.yaml")
	cases := []struct {
		baselines []string
		d         time.Duration
		want      string
	}{
		{[]string{"fifo"}, time.Second, `unknown baseline "fifo"`},
		{[]string{Timeslice, Timeslice}, time.Second, "given twice"},
		{[]string{Timeslice}, 0, "duration 0s: must be positive"},
	}
	for _, c := range cases {
		_, err := Run(context.Background(), config(t, f, c.d, 1, c.baselines...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want %q", c.baselines, err, c.want)
		}
	}
	_, err := Run(context.Background(), config(t, f, time.Second, 1, Timeslice, Arbiter))
	if !errors.Is(err, ErrNeedsPolicy) || !strings.Contains(err.Error(), "--policy DIR") {
		t.Errorf("arbiter baseline: %v", err)
	}
}

// TestOverloadBound: an LC stream the GPU cannot serve holds at most
// max_pending requests waiting; later arrivals are turned away and
// counted, the row is flagged, and the run goes on (no memory grows).
func TestOverloadBound(t *testing.T) {
	spec := `
gpus: 1
lc:
  - name: flood
    gpu: 0
    max_pending: 1000
    slo: {target: 1ms}
    arrival: {process: poisson, rate: 100000}
    request:
      - kernel: {count: 4, duration: 100us}
`
	f, err := workload.Parse([]byte(spec), "flood.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(context.Background(), config(t, f, 2*time.Second, 1, Timeslice))
	if err != nil {
		t.Fatal(err)
	}
	l := lc(t, r, Timeslice, "flood")
	if l.Waiting != 1000 || l.Rejected < 190000 || l.Arrived != l.Requests+l.InFlight+l.Waiting+l.Rejected || l.Arrived < 199000 || l.Arrived > 201000 {
		t.Errorf("arrived %d: done %d, in service %d, waiting %d, rejected %d", l.Arrived, l.Requests, l.InFlight, l.Waiting, l.Rejected)
	}
	if !l.Backlog || l.SLOJudged < l.Rejected || l.Attainment > 0.01 {
		t.Errorf("backlog %v, judged %d, attainment %v: the rejected requests are not misses", l.Backlog, l.SLOJudged, l.Attainment)
	}
}

func TestCancel(t *testing.T) {
	f := examples(t, "timeslice-inflation.yaml")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, b := range []string{Timeslice, ScriptedSuspend} {
		_, err := Run(ctx, config(t, f, time.Hour, 1, b))
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s: got %v", b, err)
		}
	}
}

// TestArbiterSeam: a controller supplied through Config.Arbiter runs in the
// loop as the arbiter baseline and sees every process with its class, GPU
// and SLO.
func TestArbiterSeam(t *testing.T) {
	f := examples(t, "timeslice-inflation.yaml")
	cfg := config(t, f, 2*time.Second, 1, Exclusive, Arbiter)
	var seen []Process
	cfg.Extra = []Extra{{Name: Arbiter, Description: "test", Controller: func(src engine.DeadlineSource, enf engine.Enforcer, procs []Process) (Controller, error) {
		seen = procs
		c, err := scriptedController(scripted.SuspendBE)(cfg)(src, enf, procs)
		return classified{c}, err
	}}}
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || seen[0].Name != "resnet-infer" || seen[0].Class != sim.ClassLC || seen[0].SLO == nil || seen[1].Class != sim.ClassBE {
		t.Errorf("controller saw %+v", seen)
	}
	a := lc(t, r, Arbiter, "resnet-infer")
	if a.P99Ratio == 0 || a.P99Ratio > 1.25 || r.Baselines[1].Controller == nil || r.Baselines[1].Controller.Suspends == 0 {
		t.Errorf("arbiter baseline: %+v, controller %+v", a, r.Baselines[1].Controller)
	}
	if a.Class != "inference" || r.Baselines[1].BE[0].Class != "batch" || lc(t, r, Exclusive, "resnet-infer").Class != "lc" {
		t.Errorf("classes: arbiter %q/%q, exclusive %q: want the policy's for arbiter only",
			a.Class, r.Baselines[1].BE[0].Class, lc(t, r, Exclusive, "resnet-infer").Class)
	}
}

// classified is a controller whose "policy" names the classes itself.
type classified struct{ Controller }

func (c classified) Actions() report.Actions { return c.Controller.(ActionCounter).Actions() }

func (classified) Class(pid uint32) (string, bool) {
	if pid == sim.FirstPID {
		return "inference", true
	}
	return "batch", true
}

// TestReplayFidelity: the shipped trace, recorded with `arbiter trace
// --record` from the stub driver's infer program, replayed alone, gives
// back the latencies that program measured itself while it was recorded
// (it printed p50 1174 µs, p99 3265 µs over 322 requests).
func TestReplayFidelity(t *testing.T) {
	f := examples(t, "replay-stub.yaml")
	r, err := Run(context.Background(), config(t, f, 3*time.Second, 1, Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	l := lc(t, r, Exclusive, "infer")
	near := func(got uint64, want float64) bool { return float64(got) > want*0.95 && float64(got) < want*1.05 }
	if l.Requests < 315 || !near(l.P50NS, 1174e3) || !near(l.P99NS, 3265e3) {
		t.Errorf("replayed alone: %d requests, p50 %d ns, p99 %d ns; recorded 322, 1174 µs, 3265 µs", l.Requests, l.P50NS, l.P99NS)
	}
}

// TestReplicas: a service bound by host work (3 ms of CPU, 1 ms of GPU per
// request) that one server barely keeps up with serves the same requests
// with two replicas, and its tail shrinks.
func TestReplicas(t *testing.T) {
	spec := func(n int) string {
		return fmt.Sprintf(`
gpus: 1
lc:
  - name: svc
    gpu: 0
    replicas: %d
    arrival: {process: poisson, rate: 230}
    request:
      - kernel: {count: 4, duration: {dist: exp, mean: 250us}}
      - host: {duration: 3ms}
`, n)
	}
	p99 := map[int]uint64{}
	reqs := map[int]uint64{}
	for _, n := range []int{1, 2} {
		f, err := workload.Parse([]byte(spec(n)), "svc.yaml")
		if err != nil {
			t.Fatal(err)
		}
		r, err := Run(context.Background(), config(t, f, 5*time.Second, 1, Exclusive, Timeslice))
		if err != nil {
			t.Fatal(err)
		}
		l := lc(t, r, Timeslice, "svc")
		if len(r.Baselines[1].LC) != 1 {
			t.Fatalf("replicas not merged: %+v", r.Baselines[1].LC)
		}
		p99[n], reqs[n] = l.P99NS, l.Requests+l.InFlight
	}
	if reqs[1] < reqs[2]-5 || reqs[1] > reqs[2] {
		t.Errorf("requests: %d with one server, %d with two", reqs[1], reqs[2])
	}
	t.Logf("p99: one server %v, two %v", time.Duration(p99[1]), time.Duration(p99[2]))
	if p99[2]*2 > p99[1] {
		t.Errorf("p99 %d ns with two replicas, %d with one: want at least halved", p99[2], p99[1])
	}
}

// TestStarvedBestEffort: a best-effort workload that a baseline keeps off
// the GPU reads 0 of its exclusive throughput, in the table and the JSON,
// not "-", which is kept for a report with nothing to compare with (no
// exclusive run); and the note on exclusive's GPU util says that a solo
// run counts at most its whole GPU.
func TestStarvedBestEffort(t *testing.T) {
	spec := `
gpus: 1
lc:
  - {name: s, gpu: 0, slo: {target: 5s}, arrival: {process: periodic, rate: 1}, request: [{kernel: {duration: 3s}}]}
be:
  - {name: t, gpu: 0, kernel: 10s}
`
	f, err := workload.Parse([]byte(spec), "bestarve.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rows := func(r *report.Report) (map[string]*float64, string) {
		t.Helper()
		got := map[string]*float64{}
		for _, b := range r.Baselines {
			got[b.Name] = b.BE[0].Fraction
		}
		var table bytes.Buffer
		if err := r.WriteTable(&table); err != nil {
			t.Fatal(err)
		}
		return got, table.String()
	}
	r, err := Run(context.Background(), config(t, f, 20*time.Second, 1, Exclusive, Priority))
	if err != nil {
		t.Fatal(err)
	}
	got, table := rows(r)
	if got[Priority] == nil || *got[Priority] != 0 || got[Exclusive] == nil || *got[Exclusive] != 1 {
		t.Errorf("BE share of exclusive: priority %v, exclusive %v; want 0 and 1", got[Priority], got[Exclusive])
	}
	if !regexp.MustCompile(`(?m)^\s*priority\s+t\s+be(\s+-){8}\s+0\.00$`).MatchString(table) {
		t.Errorf("the starved BE row does not read 0.00:\n%s", table)
	}
	// The LC workload asks 300% of its GPU: its solo run counts 100%, and
	// the note says a solo run counts at most its GPU.
	if !strings.Contains(table, "200.0%*") || !strings.Contains(table, "each solo run at most its whole GPU (one that cannot keep up alone asks more than it counts for)") {
		t.Errorf("the exclusive util note does not say a solo run counts at most its GPU:\n%s", table)
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"fraction_of_exclusive": 0,`) {
		t.Errorf("JSON lacks the starved workload's 0:\n%s", js.String())
	}

	alone, err := Run(context.Background(), config(t, f, 20*time.Second, 1, Priority))
	if err != nil {
		t.Fatal(err)
	}
	got, table = rows(alone)
	if got[Priority] != nil {
		t.Errorf("no exclusive run, yet a share of it: %v", *got[Priority])
	}
	if !regexp.MustCompile(`(?m)^\s*priority\s+t\s+be(\s+-){9}$`).MatchString(table) {
		t.Errorf("without an exclusive run the BE row should read -:\n%s", table)
	}
	js.Reset()
	if err := alone.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(js.String(), "fraction_of_exclusive") {
		t.Errorf("JSON carries a share of an exclusive run that did not happen")
	}
}

// TestUnservedRequests: a server that cannot keep up leaves requests that
// arrived but never began. They are counted (arrived = done + in service
// + waiting), those older than the SLO target count as misses, the
// percentiles become lower bounds and the row is flagged; a healthy run
// is not flagged.
func TestUnservedRequests(t *testing.T) {
	spec := `
gpus: 1
lc:
  - name: slow
    gpu: 0
    slo: {target: 3s}
    arrival: {process: periodic, rate: 20}
    request:
      - kernel: {duration: 2s}
be:
  - {name: train, gpu: 0, kernel: 10s}
`
	f, err := workload.Parse([]byte(spec), "starve.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(context.Background(), config(t, f, 5*time.Second, 1, Exclusive, Timeslice))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{Exclusive, Timeslice} {
		l := lc(t, r, name, "slow")
		if l.Arrived != 100 || l.Requests+l.InFlight+l.Waiting != l.Arrived || l.Waiting < 95 {
			t.Errorf("%s: arrived %d = done %d + in service %d + waiting %d?", name, l.Arrived, l.Requests, l.InFlight, l.Waiting)
		}
		// Completed requests alone would read 50% or better: the requests
		// that waited past the 3 s target are misses.
		if !l.Backlog || !l.LowerBound || l.UnservedLate < 30 || l.Attainment > 0.05 || l.SLOMet {
			t.Errorf("%s: backlog %v, lower bound %v, late unserved %d, attainment %.3f", name, l.Backlog, l.LowerBound, l.UnservedLate, l.Attainment)
		}
		if l.P99NS < uint64(4*time.Second) || l.OldestUnservedNS < uint64(4*time.Second) {
			t.Errorf("%s: p99 %v, oldest unserved %v: the waiting requests' ages are not counted", name, time.Duration(l.P99NS), time.Duration(l.OldestUnservedNS))
		}
	}
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"slow!", "! timeslice/slow: ", "requests not served at the end", "past the SLO target count as misses", "≥",
		"arrived = done + waiting + in service at the end + turned away (max_pending)"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	// Nothing was turned away: the note does not say so.
	if strings.Contains(table.String(), "turned away or past") {
		t.Errorf("the note speaks of requests turned away where none was:\n%s", table.String())
	}
	healthy, err := Run(context.Background(), config(t, examples(t, "timeslice-inflation.yaml"), 2*time.Second, 1, Exclusive, Priority))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range healthy.Baselines {
		if l := b.LC[0]; l.Backlog || l.LowerBound || l.Arrived < l.Requests || l.Arrived > l.Requests+2 {
			t.Errorf("%s: a healthy run reads %+v", b.Name, l)
		}
	}
}

// TestBEPartialKernel: a BE kernel still running at the end of a run
// counts for the work it did; a run shorter than one kernel is not a
// throughput of zero.
func TestBEPartialKernel(t *testing.T) {
	f, err := workload.Parse([]byte("gpus: 1\nbe:\n  - {name: long, gpu: 0, kernel: 10s}\n"), "long.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(context.Background(), config(t, f, time.Second, 1, Exclusive, Timeslice))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range r.Baselines {
		if e := b.BE[0]; e.Kernels != 0 || e.Throughput < 0.97 || e.Throughput > 1 {
			t.Errorf("%s: %d kernels, throughput %.3f: want the running kernel's work (≈0.98)", b.Name, e.Kernels, e.Throughput)
		}
	}
}

// TestClosedArrivals: with process closed each server sends its next
// request think after the previous one ends, so a 2 ms request and 1 ms
// of think time make 333 requests a second, none waiting, at 2 ms each.
func TestClosedArrivals(t *testing.T) {
	spec := "gpus: 1\nlc:\n  - name: loop\n    gpu: 0\n    arrival: {process: closed, think: 1ms}\n    request:\n      - kernel: {count: 4, duration: 500us}\n"
	f, err := workload.Parse([]byte(spec), "closed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(context.Background(), config(t, f, time.Second, 1, Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	l := lc(t, r, Exclusive, "loop")
	if l.Requests != 333 || l.Waiting != 0 || l.Arrived != l.Requests+l.InFlight || l.P50NS < 1990e3 || l.P50NS > 2010e3 || l.Backlog {
		t.Errorf("closed loop: %+v", l)
	}
}
