package engine_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// armer is an enforcer that gates some processes and can arm their gates;
// it logs Arm and Settle among the other calls.
type armer struct{ supported }

func (a armer) Arm(lc uint32, victims []uint32, launchOnly bool) error {
	return a.do(fmt.Sprintf("arm %d %v launch-only=%v", lc, victims, launchOnly))
}

func (a armer) Settle(all bool) (bool, error) {
	if all {
		return false, a.do("settle all")
	}
	return false, a.do("settle")
}

// only keeps the calls that start with one of prefixes.
func only(log []string, prefixes ...string) []string {
	return slices.DeleteFunc(slices.Clone(log), func(s string) bool {
		return !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(s, p) })
	})
}

// TestArmGateVictims: a latency-critical process is armed with the
// gate-level victims of its GPU (not those the driver suspends), rearmed
// as they come and go, and disarmed when it leaves; every request of an
// armed process ends with a settle after its victims are let go, and
// stopping the engine disarms before it releases and settles last.
func TestArmGateVictims(t *testing.T) {
	evs := []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"), exec(0, 30, "train"), exec(0, 40, "train"),
		launch(us, 20), launch(us, 30), launch(us, 40), launch(2*us, 10),
		syncAt(10*us, 10, 10*us), // the first request ends at 20 µs
		{Kind: trace.KindExit, PID: 40, TID: 40, Time: 500 * us},
		launch(1000*us, 10), syncAt(1010*us, 10, 100*us),
		launch(1500*us, 20),
	}
	enf := armer{supported{calls: &calls{}, gateOnly: map[uint32]string{20: "no channels", 40: "no channels"}}}
	opts := engine.Options{Classifier: byComm, IdleGap: 100 * time.Microsecond}
	e, err := engine.New(&events{evs: evs}, enf, &opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{
		// The engine sees the first request itself, at the call that
		// classified the process; arming follows.
		"gate 20", "suspend 30 gpu0", "gate 40", "arm 10 [20 40] launch-only=false",
		"ungate 20", "resume 30 gpu0", "ungate 40", "settle",
		// pid 40 exits: it leaves the arming.
		"settle", "arm 10 [20] launch-only=false",
		"gate 20", "suspend 30 gpu0", "ungate 20", "resume 30 gpu0", "settle",
		// Stopping: disarm, release (nothing held), settle every gate,
		// however young.
		"arm 10 [] launch-only=false", "settle all",
	}
	if got := only(enf.log, "arm", "gate", "ungate", "suspend", "resume", "settle"); !slices.Equal(got, want) {
		t.Errorf("enforcer calls\n%q\nwant\n%q", got, want)
	}
	if n := e.Stats().Arms; n != 3 {
		t.Errorf("Stats().Arms = %d, want 3", n)
	}
}

// TestArmFollowsPlans: a latency-critical plan without the pre-preemption
// hint arms launch-only; reclassifying everything best-effort disarms;
// a process that leaves while armed is disarmed; a class relaxed by SLO
// feedback, whose requests no longer preempt, is disarmed too.
func TestArmFollowsPlans(t *testing.T) {
	noHint := lcPlan
	noHint.PrePreemptionHint = false
	classify := engine.ClassifierFunc(func(p engine.ProcessInfo) (sched.Plan, string, error) {
		if p.Comm == "infer" {
			return noHint, "comm infer", nil
		}
		return bePlan, "default", nil
	})
	evs := []trace.Event{exec(0, 10, "infer"), exec(0, 20, "train"), launch(us, 20), launch(2*us, 10)}
	enf := armer{supported{calls: &calls{}, gateOnly: map[uint32]string{20: "no channels"}}}
	opts := engine.Options{Classifier: classify, IdleGap: 100 * time.Microsecond}
	e, err := engine.New(&events{evs: evs}, enf, &opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		e.Apply(&evs[i])
	}
	e.Reclassify(engine.ClassifierFunc(func(engine.ProcessInfo) (sched.Plan, string, error) {
		return bePlan, "all best-effort", nil
	}), "policy changed")
	e.Reclassify(classify, "policy changed back")
	exit := trace.Event{Kind: trace.KindExit, PID: 10, TID: 10, Time: 3 * us}
	e.Apply(&exit)
	want := []string{"arm 10 [20] launch-only=true", "arm 10 [] launch-only=false", "arm 10 [20] launch-only=true", "arm 10 [] launch-only=false"}
	if got := only(enf.log, "arm"); !slices.Equal(got, want) {
		t.Errorf("arm calls %q, want %q", got, want)
	}

	// Feedback: requests well within the objective relax the class after
	// the hold; the process is disarmed then.
	evs = []trace.Event{exec(0, 10, "infer"), exec(0, 20, "train"), launch(us, 20)}
	for i := range uint64(40) {
		at := (i + 1) * 1000 * us
		evs = append(evs, launch(at, 10), syncAt(at+10*us, 10, 100*us))
	}
	enf = armer{supported{calls: &calls{}, gateOnly: map[uint32]string{20: "no channels"}}}
	opts = engine.Options{Classifier: byComm, IdleGap: 100 * time.Microsecond, Feedback: true, FeedbackMin: 5,
		FeedbackHold: 5 * time.Millisecond, ControlInterval: time.Millisecond}
	e, err = engine.New(&events{evs: evs}, enf, &opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if e.Stats().Relaxes == 0 {
		t.Fatal("the class never relaxed")
	}
	got := only(enf.log, "arm")
	if len(got) < 2 || got[0] != "arm 10 [20] launch-only=false" || got[1] != "arm 10 [] launch-only=false" {
		t.Errorf("with feedback: arm calls %q, want armed, then disarmed at the relax", got)
	}
	// Relaxed, its requests hold nothing: the gate is never closed after.
	log := only(enf.log, "arm", "gate")
	if i := slices.Index(log, "arm 10 [] launch-only=false"); i >= 0 && slices.Contains(log[i:], "gate 20") {
		t.Errorf("gated after the relax: %q", log)
	}
}

// pendingArmer is an armer whose Settle leaves young gates closed: it
// reports them pending for its first pending calls without all.
type pendingArmer struct {
	armer
	pending *int
}

func (a pendingArmer) Settle(all bool) (bool, error) {
	_, err := a.armer.Settle(all)
	if all || *a.pending == 0 {
		return false, err
	}
	*a.pending--
	return true, err
}

// TestSettleAgainWhilePending: a settle that left gates closed because
// they were too young is tried again at each control tick until none is
// left, even with nothing armed any more; then the ticks leave the gates
// alone. Gates still young when the engine stops are settled, all of
// them, as it stops.
func TestSettleAgainWhilePending(t *testing.T) {
	evs := []trace.Event{exec(0, 10, "infer"), exec(0, 20, "train"), launch(us, 20), launch(2*us, 10),
		{Kind: trace.KindExit, PID: 10, TID: 10, Time: 500 * us}}
	for i := range uint64(8) {
		evs = append(evs, launch((i+1)*1000*us, 20))
	}
	for _, c := range []struct {
		pending int
		want    []string // the settles after the disarm
	}{
		// The request's end and the exit, then the first tick, find
		// young gates; the second tick none.
		{3, []string{"settle", "settle", "settle"}},
		// Young gates at every tick: settled, however young, at the stop
		// (checked below).
		{1000, nil},
	} {
		pending := c.pending
		enf := pendingArmer{armer{supported{calls: &calls{}, gateOnly: map[uint32]string{20: "no channels"}}}, &pending}
		opts := engine.Options{Classifier: byComm, IdleGap: 100 * time.Microsecond, ControlInterval: time.Millisecond}
		e, err := engine.New(&events{evs: evs}, enf, &opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Run(t.Context()); err != nil {
			t.Fatal(err)
		}
		log := only(enf.log, "arm", "settle")
		i := slices.Index(log, "arm 10 [] launch-only=false")
		if i < 0 {
			t.Fatalf("never disarmed: %q", log)
		}
		if c.want == nil {
			after := log[i+1:]
			if len(after) < 9 || after[len(after)-1] != "settle all" || slices.Index(after, "settle all") != len(after)-1 ||
				slices.ContainsFunc(after, func(s string) bool { return s != "settle" && s != "settle all" }) {
				t.Errorf("young gates at every settle: after the disarm %q, want a settle at each of the 8 ticks at least, then one settle all", after)
			}
			continue
		}
		if !slices.Equal(log[i+1:], c.want) {
			t.Errorf("young gates for %d settles: after the disarm %q, want %q", c.pending, log[i+1:], c.want)
		}
	}
}

// lateSource is a source without read deadlines: timers fire only as
// events pass their time, as a live source delivers a request's end after
// the calls that follow it.
type lateSource struct{ s *events }

func (l lateSource) Read(ev *trace.Event) error { return l.s.Read(ev) }
func (l lateSource) Close() error               { return nil }

// TestNextRequestKeepsVictims: where a request's end is seen only with
// the first call of the next one, the victims stay held into it, rather
// than let go and held again (which would open a gate an armed request
// had just closed); a call of a process that does not preempt for it
// lets them go as before.
func TestNextRequestKeepsVictims(t *testing.T) {
	evs := []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"), exec(0, 30, "train"), launch(us, 20),
		launch(1000*us, 10), syncAt(1010*us, 10, 100*us), // ends at 1110 µs
		launch(1500*us, 10), syncAt(1510*us, 10, 100*us), // its end is seen with the next call
		launch(5000*us, 30), // a best-effort call: the victims go
		launch(9000*us, 20),
	}
	enf := armer{supported{calls: &calls{}, gateOnly: map[uint32]string{20: "no channels"}}}
	opts := engine.Options{Classifier: byComm, IdleGap: 100 * time.Microsecond}
	e, err := engine.New(lateSource{&events{evs: evs}}, enf, &opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{"gate 20", "ungate 20"}
	if got := only(enf.log, "gate", "ungate"); !slices.Equal(got, want) {
		t.Errorf("gate calls %q, want %q: held across both requests", got, want)
	}
	var kept bool
	for _, d := range e.Snapshot().Preemptions {
		kept = kept || d.Action == engine.ActionHold && strings.Contains(d.Reason, "next latency-critical request had begun")
	}
	if !kept {
		t.Errorf("no hold decision recorded: %+v", e.Snapshot().Preemptions)
	}
	if n := proc(t, e.Snapshot(), 10).Latency.Requests; n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}
