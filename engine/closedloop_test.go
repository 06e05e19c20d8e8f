package engine_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/sim/report"
	"github.com/gpu-arbiter/arbiter/sim/whatif"
	"github.com/gpu-arbiter/arbiter/sim/workload"
)

// lcPlan and bePlan are the default policy's two classes.
var (
	lcPlan = sched.Plan{Class: "latency-critical", Priority: 900, Level: sched.LevelTimeslice, Timeslice: 16 * time.Millisecond,
		Interleave: sched.InterleaveHigh, PrePreemptionHint: true, LatencyCritical: true, HasSLO: true,
		LatencyTarget: 100 * time.Millisecond, Percentile: 99, Window: time.Minute, MaxGPUShare: 1}
	bePlan = sched.Plan{Class: "best-effort", Priority: 100, Level: sched.LevelSuspend, Timeslice: 50 * time.Microsecond,
		Interleave: sched.InterleaveLow, MaxGPUShare: 1}
)

// byClass plans LC spec workloads with lc and BE ones with be.
func byClass(lc, be sched.Plan) whatif.PlanFunc {
	return func(p whatif.Process) (sched.Plan, string, error) {
		if p.Class == sim.ClassLC {
			return lc, "spec class lc", nil
		}
		return be, "spec class be", nil
	}
}

func loadExample(t testing.TB, name string) *workload.File {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	f, err := workload.Load(filepath.Join(filepath.Dir(here), "..", "examples", "workloads", name))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// compare runs the example under the given baselines plus the engine as
// "arbiter", and returns the report and the engine of the (last) run.
func compare(t testing.TB, example string, d time.Duration, plan whatif.PlanFunc, opts engine.Options, baselines ...string) (*report.Report, *engine.Engine) {
	t.Helper()
	f := loadExample(t, example)
	ws, err := f.Workloads()
	if err != nil {
		t.Fatal(err)
	}
	so, err := f.Options()
	if err != nil {
		t.Fatal(err)
	}
	var eng *engine.Engine
	ctl := whatif.EngineController(plan, opts)
	cfg := &whatif.Config{Name: f.Spec.Name, Workloads: ws, Options: so, ControlLatency: f.ControlLatency(), Seed: 1, Duration: d,
		Baselines: append(baselines, whatif.Arbiter), Parallel: 1,
		Extra: []whatif.Extra{{Name: whatif.Arbiter, Description: "the engine", Controller: func(src engine.DeadlineSource, enf engine.Enforcer, procs []whatif.Process) (whatif.Controller, error) {
			c, err := ctl(src, enf, procs)
			if err == nil {
				eng = c.(interface{ Engine() *engine.Engine }).Engine()
			}
			return c, err
		}}}}
	r, err := whatif.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r, eng
}

func lcRow(t testing.TB, r *report.Report, baseline string) report.LC {
	t.Helper()
	for _, b := range r.Baselines {
		if b.Name == baseline && len(b.LC) > 0 {
			return b.LC[0]
		}
	}
	t.Fatalf("no LC row for %s", baseline)
	return report.LC{}
}

func beRow(t testing.TB, r *report.Report, baseline string) report.BE {
	t.Helper()
	for _, b := range r.Baselines {
		if b.Name == baseline && len(b.BE) > 0 {
			return b.BE[0]
		}
	}
	t.Fatalf("no BE row for %s", baseline)
	return report.BE{}
}

// beFraction is a baseline's first BE workload's share of its exclusive
// throughput; the report must have one.
func beFraction(t testing.TB, r *report.Report, baseline string) float64 {
	t.Helper()
	b := beRow(t, r, baseline)
	if b.Fraction == nil {
		t.Fatalf("%s: BE row without a share of exclusive: %+v", baseline, b)
	}
	return *b.Fraction
}

// TestObserveIsTimeslicing: an engine that only observes changes nothing:
// the run is the default time-slicing baseline, to the nanosecond.
func TestObserveIsTimeslicing(t *testing.T) {
	observe := sched.Plan{Class: "watched", MaxGPUShare: 1}
	r, eng := compare(t, "timeslice-inflation.yaml", 10*time.Second, byClass(observe, observe), engine.Options{}, whatif.Timeslice)
	a, ts := lcRow(t, r, whatif.Arbiter), lcRow(t, r, whatif.Timeslice)
	if a.P99NS != ts.P99NS || a.Requests != ts.Requests || a.MeanNS != ts.MeanNS {
		t.Errorf("observe: p99 %d mean %.0f n %d; time-slicing p99 %d mean %.0f n %d", a.P99NS, a.MeanNS, a.Requests, ts.P99NS, ts.MeanNS, ts.Requests)
	}
	if b, bt := beRow(t, r, whatif.Arbiter), beRow(t, r, whatif.Timeslice); b.Throughput != bt.Throughput {
		t.Errorf("BE throughput %v, time-slicing %v", b.Throughput, bt.Throughput)
	}
	if st := eng.Stats(); st.Suspends+st.Timeslices+st.Interleaves+st.Gates != 0 || st.Events == 0 {
		t.Errorf("observe mode acted: %+v", st)
	}
}

// TestSuspendNearExclusive: with BE suspended during LC requests, LC p99
// stays within the preemption's cost (the control latency, saving the
// kernel in flight and a context switch) plus one BE timeslice of its
// exclusive p99, while plain time-slicing inflates it by multiples.
func TestSuspendNearExclusive(t *testing.T) {
	f := loadExample(t, "timeslice-inflation.yaml")
	so, _ := f.Options()
	r, eng := compare(t, "timeslice-inflation.yaml", 30*time.Second, byClass(lcPlan, bePlan), engine.Options{IdleGap: 100 * time.Microsecond},
		whatif.Exclusive, whatif.Timeslice)
	a, ex, ts := lcRow(t, r, whatif.Arbiter), lcRow(t, r, whatif.Exclusive), lcRow(t, r, whatif.Timeslice)
	ctl := whatif.DefaultControlLatency
	if c := f.ControlLatency(); c != nil {
		ctl = *c
	}
	preempt := ctl + orDefault(so.Preemption, 30*time.Microsecond) + orDefault(so.ContextSwitch, 20*time.Microsecond)
	bound := time.Duration(ex.P99NS) + preempt + bePlan.Timeslice
	if time.Duration(a.P99NS) > bound {
		t.Errorf("LC p99 %v, exclusive %v: over the bound %v (preemption %v + BE timeslice %v)", time.Duration(a.P99NS), time.Duration(ex.P99NS), bound, preempt, bePlan.Timeslice)
	}
	if ts.P99Ratio < 3 {
		t.Errorf("time-slicing p99 ratio %.2f: the example no longer shows inflation", ts.P99Ratio)
	}
	if st := eng.Stats(); st.Suspends == 0 || st.Suspends != st.Resumes {
		t.Errorf("suspends %d resumes %d", st.Suspends, st.Resumes)
	}
	kept := beFraction(t, r, whatif.Arbiter)
	if kept < 0.5 {
		t.Errorf("BE kept %.2f of its exclusive throughput", kept)
	}
	t.Logf("LC p99 %v (exclusive %v, ratio %.3f; time-slicing %.2f×); BE %.2f of exclusive", time.Duration(a.P99NS), time.Duration(ex.P99NS), a.P99Ratio, ts.P99Ratio, kept)
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// actions lists a snapshot's decisions of the given kinds as
// "action@time".
func actions(s *engine.Snapshot, kinds ...engine.Action) []engine.Decision {
	var out []engine.Decision
	for _, d := range s.Decisions {
		if slices.Contains(kinds, d.Action) {
			out = append(out, d)
		}
	}
	return out
}

// TestFeedback: a class comfortably within its SLO relaxes to timeslices
// alone, and escalates back to suspending BE when attainment falls below
// target; a class whose SLO timeslices alone meet relaxes and stays
// relaxed, and BE gains throughput by it.
func TestFeedback(t *testing.T) {
	opts := engine.Options{Feedback: true, FeedbackHold: time.Second, IdleGap: 200 * time.Microsecond}
	tight := lcPlan
	tight.LatencyTarget, tight.Percentile, tight.Window = 6*time.Millisecond, 90, 2*time.Second
	_, eng := compare(t, "timeslice-inflation.yaml", 20*time.Second, byClass(tight, bePlan), opts)
	got := actions(eng.Snapshot(), engine.ActionEscalate, engine.ActionRelax)
	if len(got) < 2 || got[0].Action != engine.ActionRelax || got[1].Action != engine.ActionEscalate {
		t.Fatalf("tight SLO: want relax then escalate, got %+v", got)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Action == got[i-1].Action {
			t.Errorf("two %s in a row: %+v", got[i].Action, got)
		}
		if got[i].Action == engine.ActionRelax && got[i].Time-got[i-1].Time < uint64(time.Second) {
			t.Errorf("relaxed %v after escalating: hold is 1s", time.Duration(got[i].Time-got[i-1].Time))
		}
	}
	lax := lcPlan
	lax.LatencyTarget, lax.Window = 100*time.Millisecond, 2*time.Second
	r, eng := compare(t, "timeslice-inflation.yaml", 20*time.Second, byClass(lax, bePlan), opts, whatif.Exclusive)
	got = actions(eng.Snapshot(), engine.ActionEscalate, engine.ActionRelax)
	if len(got) != 1 || got[0].Action != engine.ActionRelax {
		t.Errorf("lax SLO: want one relax, got %+v", got)
	}
	fixed, _ := compare(t, "timeslice-inflation.yaml", 20*time.Second, byClass(lax, bePlan), engine.Options{IdleGap: opts.IdleGap}, whatif.Exclusive)
	if relaxed, always := beRow(t, r, whatif.Arbiter).Throughput, beRow(t, fixed, whatif.Arbiter).Throughput; relaxed <= always {
		t.Errorf("BE throughput relaxed %.3f, always suspending %.3f: relaxing gained nothing", relaxed, always)
	}
}

// TestQuota: a class capped at 30% of the GPU gets 30% ± 2% of it over
// the run, by duty cycling.
func TestQuota(t *testing.T) {
	for _, share := range []float64{0.3, 0.75} {
		be := bePlan
		be.MaxGPUShare = share
		f, err := workload.Load(filepath.Join("testdata", "quota.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		ws, _ := f.Workloads()
		so, _ := f.Options()
		cfg := &whatif.Config{Name: "quota", Workloads: ws, Options: so, Seed: 1, Duration: 10 * time.Second, Parallel: 1,
			Baselines: []string{whatif.Exclusive, whatif.Arbiter},
			Extra:     []whatif.Extra{{Name: whatif.Arbiter, Controller: whatif.EngineController(byClass(lcPlan, be), engine.Options{})}}}
		r, err := whatif.Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := beRow(t, r, whatif.Arbiter).Throughput
		if excl := beRow(t, r, whatif.Exclusive).Throughput; excl < 0.95 {
			t.Fatalf("alone the trainer uses only %.3f of the GPU: the test needs one that could use it all", excl)
		}
		if got > share+0.02 || got < share-0.02 {
			t.Errorf("quota %.2f: GPU share %.4f", share, got)
		}
		t.Logf("quota %.2f: GPU share %.4f", share, got)
	}
}

// TestPredictor: a latency-critical process whose gaps are shorter than
// the shortest worth harvesting keeps its victims suspended across them:
// far fewer resumes, and LC latency no worse.
func TestPredictor(t *testing.T) {
	base := engine.Options{IdleGap: 100 * time.Microsecond}
	pred := base
	pred.MinHarvestGap = 50 * time.Millisecond // longer than most gaps at 100 requests/s
	r0, e0 := compare(t, "timeslice-inflation.yaml", 20*time.Second, byClass(lcPlan, bePlan), base)
	r1, e1 := compare(t, "timeslice-inflation.yaml", 20*time.Second, byClass(lcPlan, bePlan), pred)
	s0, s1 := e0.Stats(), e1.Stats()
	if s1.HarvestsSkipped == 0 || s1.Resumes*2 > s0.Resumes {
		t.Errorf("with the predictor: %d gaps skipped, %d resumes; without: %d resumes", s1.HarvestsSkipped, s1.Resumes, s0.Resumes)
	}
	if a0, a1 := lcRow(t, r0, whatif.Arbiter).P99NS, lcRow(t, r1, whatif.Arbiter).P99NS; float64(a1) > 1.02*float64(a0) {
		t.Errorf("LC p99 %v with the predictor, %v without", time.Duration(a1), time.Duration(a0))
	}
	var held bool
	for _, d := range e1.Snapshot().Preemptions {
		held = held || d.Action == engine.ActionHold
	}
	if !held {
		t.Error("no hold decision among the recent preemptions")
	}
}

// TestReloadReclassifies: a policy reload (here at 5 s) reclassifies every
// live process; a BE process now merely observed is never suspended
// again, and the class change is recorded with its reason.
func TestReloadReclassifies(t *testing.T) {
	observe := sched.Plan{Class: "observed", MaxGPUShare: 1}
	reloadAt := uint64(5 * time.Second)
	var eng *engine.Engine
	ctl := whatif.EngineController(byClass(lcPlan, bePlan), engine.Options{IdleGap: 100 * time.Microsecond})
	f := loadExample(t, "timeslice-inflation.yaml")
	ws, _ := f.Workloads()
	so, _ := f.Options()
	cfg := &whatif.Config{Name: "reload", Workloads: ws, Options: so, Seed: 1, Duration: 10 * time.Second, Parallel: 1,
		Baselines: []string{whatif.Arbiter},
		Extra: []whatif.Extra{{Name: whatif.Arbiter, Controller: func(src engine.DeadlineSource, enf engine.Enforcer, procs []whatif.Process) (whatif.Controller, error) {
			c, err := ctl(src, enf, procs)
			if err != nil {
				return nil, err
			}
			eng = c.(interface{ Engine() *engine.Engine }).Engine()
			eng.PostAt(reloadAt, func(e *engine.Engine) {
				e.Reclassify(engine.ClassifierFunc(func(p engine.ProcessInfo) (sched.Plan, string, error) {
					if p.Key.PID == procs[0].PID {
						return lcPlan, "still latency-critical", nil
					}
					return observe, "reloaded policy observes it", nil
				}), "policy reload")
			})
			return c, nil
		}}}}
	if _, err := whatif.Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	s := eng.Snapshot()
	var changed bool
	for _, d := range actions(s, engine.ActionClassify) {
		if d.Time == reloadAt && d.Class == "observed" && strings.Contains(d.Reason, "was best-effort: policy reload") {
			changed = true
		}
	}
	if !changed {
		t.Errorf("no recorded class change at the reload: %+v", actions(s, engine.ActionClassify))
	}
	for _, d := range s.Preemptions {
		if d.Action == engine.ActionSuspend && d.Time > reloadAt {
			t.Errorf("suspended after the reload: %+v", d)
		}
	}
	if be := proc(t, s, sim.FirstPID+1); be.Class != "observed" || be.State != engine.StateRunning || be.Level != sched.LevelObserve {
		t.Errorf("BE after reload: %+v", be)
	}
	if st := eng.Stats(); st.Suspends == 0 || st.Suspends != st.Resumes {
		t.Errorf("suspends %d resumes %d", st.Suspends, st.Resumes)
	}
}

// TestFallbackReported: a decision the policy could not give (outside its
// schema) falls back to the default plan and is reported, per process and
// in the decisions; a victims decision that fails falls back to the
// default choice and BE is still suspended.
func TestFallbackReported(t *testing.T) {
	plan := func(p whatif.Process) (sched.Plan, string, error) {
		if p.Class == sim.ClassLC {
			return lcPlan, "lc", nil
		}
		fb := bePlan
		fb.Fallback = true
		return fb, "default", errors.New(`decision for pid 1001: preemption.mode: "pause" is not one of observe, timeslice, suspend, gate`)
	}
	bad := victimsFunc(func(engine.ControlState) (engine.Victims, error) {
		return engine.Victims{}, errors.New("victims: suspend[0].pid: want an integer")
	})
	_, eng := compare(t, "timeslice-inflation.yaml", 2*time.Second, plan, engine.Options{Victims: bad, IdleGap: 100 * time.Microsecond})
	s := eng.Snapshot()
	be := s.Processes[1]
	if !strings.Contains(be.Fallback, "pause") || be.Class != "best-effort" {
		t.Errorf("BE process view %+v", be)
	}
	var classify, victims bool
	for _, d := range actions(s, engine.ActionFallback) {
		classify = classify || d.PID == be.PID && strings.Contains(d.Reason, "policy decision not used")
		victims = victims || strings.Contains(d.Reason, "victims decision not used")
	}
	if !classify || !victims {
		t.Errorf("fallbacks reported: classify %v victims %v in %+v", classify, victims, s.Decisions)
	}
	if st := eng.Stats(); st.VictimErrors == 0 || st.Suspends == 0 || st.ClassifyErrors != 1 {
		t.Errorf("stats %+v", st)
	}
}

type victimsFunc func(engine.ControlState) (engine.Victims, error)

func (f victimsFunc) Victims(s engine.ControlState) (engine.Victims, error) { return f(s) }
