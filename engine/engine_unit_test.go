package engine_test

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// events is a synthetic event stream with read deadlines on its own
// virtual clock, which ends 10 ms after its last event: the smallest
// DeadlineSource.
type events struct {
	evs      []trace.Event
	i        int
	now      uint64
	deadline uint64
}

func (s *events) end() uint64 {
	if len(s.evs) == 0 {
		return 0
	}
	return s.evs[len(s.evs)-1].Time + 10_000_000
}

func (s *events) Read(ev *trace.Event) error {
	if s.i < len(s.evs) {
		next := s.evs[s.i].Time
		if s.deadline != 0 && s.deadline < next {
			s.now = max(s.now, s.deadline)
			return trace.ErrDeadline
		}
		*ev = s.evs[s.i]
		s.i++
		s.now = max(s.now, next)
		return nil
	}
	if s.deadline != 0 && s.deadline > s.now && s.deadline <= s.end() {
		s.now = s.deadline
		return trace.ErrDeadline
	}
	return io.EOF
}
func (s *events) Close() error                   { return nil }
func (s *events) Now() uint64                    { return s.now }
func (s *events) SetReadDeadline(t uint64) error { s.deadline = t; return nil }

// calls records enforcer calls in order.
type calls struct {
	log  []string
	fail map[string]error
}

func (c *calls) do(s string) error {
	c.log = append(c.log, s)
	return c.fail[s]
}
func (c *calls) SetTimeslice(pid uint32, gpu int, us uint64) error {
	return c.do(fmt.Sprintf("timeslice %d gpu%d %dus", pid, gpu, us))
}
func (c *calls) SetInterleave(pid uint32, l sched.Interleave) error {
	return c.do(fmt.Sprintf("interleave %d %s", pid, l))
}
func (c *calls) Suspend(pid uint32, gpu int) error {
	return c.do(fmt.Sprintf("suspend %d gpu%d", pid, gpu))
}
func (c *calls) Resume(pid uint32, gpu int) error {
	return c.do(fmt.Sprintf("resume %d gpu%d", pid, gpu))
}
func (c *calls) Gate(pid uint32) error   { return c.do(fmt.Sprintf("gate %d", pid)) }
func (c *calls) Ungate(pid uint32) error { return c.do(fmt.Sprintf("ungate %d", pid)) }

const us = uint64(time.Microsecond)

func exec(t uint64, pid uint32, comm string) trace.Event {
	ev := trace.Event{Kind: trace.KindExec, PID: pid, TID: pid, Time: t}
	copy(ev.Proc.Comm[:], comm)
	return ev
}
func launch(t uint64, pid uint32) trace.Event {
	return trace.Event{Kind: trace.KindLaunch, PID: pid, TID: pid, Time: t}
}
func syncAt(t uint64, pid uint32, dur uint64) trace.Event {
	ev := trace.Event{Kind: trace.KindSync, PID: pid, TID: pid, Time: t}
	ev.Sync.Duration = dur
	return ev
}

// byComm plans "infer" as latency-critical and everything else best-effort.
var byComm = engine.ClassifierFunc(func(p engine.ProcessInfo) (sched.Plan, string, error) {
	if p.Comm == "infer" {
		return lcPlan, "comm infer", nil
	}
	return bePlan, "default", nil
})

func run(t *testing.T, evs []trace.Event, opts engine.Options) (*engine.Engine, *calls) {
	t.Helper()
	enf := &calls{}
	return runWith(t, evs, enf, opts), enf
}

// runWith runs an engine over evs to their end, enforcing through enf
// (classified byComm unless opts says otherwise).
func runWith(t *testing.T, evs []trace.Event, enf engine.Enforcer, opts engine.Options) *engine.Engine {
	t.Helper()
	if opts.Classifier == nil {
		opts.Classifier = byComm
	}
	e, err := engine.New(&events{evs: evs}, enf, &opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	return e
}

func proc(t *testing.T, s *engine.Snapshot, pid uint32) engine.ProcessView {
	t.Helper()
	for _, p := range s.Processes {
		if p.PID == pid {
			return p
		}
	}
	t.Fatalf("pid %d not in snapshot", pid)
	return engine.ProcessView{}
}

// TestRequestSpansStages: calls closer than the idle gap are one request;
// its latency runs from the first call to the last synchronization's
// return, and victims are held for all of it.
func TestRequestSpansStages(t *testing.T) {
	evs := []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"), launch(us, 20),
		launch(1000*us, 10), syncAt(1010*us, 10, 500*us), // ends 1510
		launch(1540*us, 10), syncAt(1550*us, 10, 500*us), // ends 2050
		launch(5000*us, 10), syncAt(5010*us, 10, 100*us), // a second request
		launch(9000*us, 20),
	}
	e, enf := run(t, evs, engine.Options{IdleGap: 200 * time.Microsecond})
	lc := proc(t, e.Snapshot(), 10)
	if lc.Latency.Requests != 2 || lc.Latency.Max < 1050*time.Microsecond || lc.Latency.Max > 1061*time.Microsecond {
		t.Errorf("requests %d max %v, want 2 and 1.05ms", lc.Latency.Requests, lc.Latency.Max)
	}
	want := []string{"interleave 20 low", "timeslice 20 gpu0 50us", "timeslice 10 gpu0 16000us", "interleave 10 high",
		"suspend 20 gpu0", "resume 20 gpu0", "suspend 20 gpu0", "resume 20 gpu0",
		"timeslice 10 gpu0 1024us", "timeslice 20 gpu0 1024us"} // the driver's default back at the end
	if !slices.Equal(enf.log, want) {
		t.Errorf("enforcer calls\n%q\nwant\n%q", enf.log, want)
	}
}

// TestBestEffortSliceBesideLatencyCritical: a best-effort process keeps
// the driver's timeslice until a latency-critical process shares its
// GPU, gets its plan's short one while one does, and the driver's back
// when the last one leaves; a failed set is tried again at the next
// change, and as the engine stops, which gives every process the engine
// set another timeslice for the driver's back.
func TestBestEffortSliceBesideLatencyCritical(t *testing.T) {
	exit := func(at, pid uint32) trace.Event {
		return trace.Event{Kind: trace.KindExit, PID: pid, TID: pid, Time: uint64(at) * us}
	}
	evs := []trace.Event{
		exec(0, 20, "train"), exec(0, 30, "train"), launch(us, 20), launch(2*us, 30),
		launch(1000*us, 10), syncAt(1010*us, 10, 100*us),
		exit(3000, 10),
		launch(4000*us, 11), syncAt(4010*us, 11, 100*us),
		exit(6000, 11),
		launch(7000*us, 20),
	}
	for _, c := range []struct {
		name string
		def  time.Duration
		fail string
		want []string
	}{
		{"default", 0, "", []string{
			"timeslice 20 gpu0 50us", "timeslice 30 gpu0 50us", "timeslice 10 gpu0 16000us",
			"timeslice 20 gpu0 1024us", "timeslice 30 gpu0 1024us",
			"timeslice 20 gpu0 50us", "timeslice 30 gpu0 50us", "timeslice 11 gpu0 16000us",
			"timeslice 20 gpu0 1024us", "timeslice 30 gpu0 1024us"}},
		{"a failed set tried again", 2 * time.Millisecond, "timeslice 30 gpu0 2000us", []string{
			"timeslice 20 gpu0 50us", "timeslice 30 gpu0 50us", "timeslice 10 gpu0 16000us",
			"timeslice 20 gpu0 2000us", "timeslice 30 gpu0 2000us",
			"timeslice 20 gpu0 50us", "timeslice 11 gpu0 16000us",
			"timeslice 20 gpu0 2000us", "timeslice 30 gpu0 2000us",
			"timeslice 30 gpu0 2000us"}}, // and once more as the engine stops
	} {
		t.Run(c.name, func(t *testing.T) {
			classify := engine.ClassifierFunc(func(p engine.ProcessInfo) (sched.Plan, string, error) {
				if p.Key.PID < 20 {
					return lcPlan, "pid under 20", nil
				}
				return bePlan, "default", nil
			})
			enf := &calls{fail: map[string]error{}}
			if c.fail != "" {
				enf.fail[c.fail] = errors.New("refused")
			}
			e := runWith(t, evs, enf, engine.Options{Classifier: classify, IdleGap: 100 * time.Microsecond, DefaultTimeslice: c.def})
			var got []string
			for _, l := range enf.log {
				if strings.HasPrefix(l, "timeslice ") {
					got = append(got, l)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("timeslices set\n%q\nwant\n%q", got, c.want)
			}
			var said bool
			for _, d := range e.Snapshot().Decisions {
				said = said || d.Action == engine.ActionTimeslice && d.PID == 20 && strings.Contains(d.Reason, "the driver's default")
			}
			if !said {
				t.Errorf("no decision says why pid 20 got the driver's default back: %+v", e.Snapshot().Decisions)
			}
		})
	}
}

// TestSlicesFollowReloadsAndExec: a reload that moves the
// latency-critical role from one process to another settles each GPU's
// timeslices once, with every plan known (each process's slice sent once,
// none flipped back and forth); a reload that puts best-effort work at a
// level without channel control, or its class without a timeslice, gives
// the short slice back; an image replaced by exec gets the default back
// before the new one is classified.
func TestSlicesFollowReloadsAndExec(t *testing.T) {
	lcIs := func(pid uint32, be sched.Plan) engine.ClassifierFunc {
		return func(p engine.ProcessInfo) (sched.Plan, string, error) {
			if p.Key.PID == pid {
				return lcPlan, "the latency-critical one", nil
			}
			return be, "default", nil
		}
	}
	evs := []trace.Event{launch(us, 10), launch(2*us, 20), launch(3*us, 30)}
	enf := &calls{}
	opts := engine.Options{Classifier: lcIs(10, bePlan), IdleGap: 100 * time.Microsecond}
	e, err := engine.New(&events{evs: evs}, enf, &opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		e.Apply(&evs[i])
	}
	step := func(what string, do func(), want ...string) {
		t.Helper()
		enf.log = nil
		do()
		if got := only(enf.log, "timeslice"); !slices.Equal(got, want) {
			t.Errorf("%s: timeslices set\n%q\nwant\n%q", what, got, want)
		}
	}
	step("the role moves from 10 to 30", func() { e.Reclassify(lcIs(30, bePlan), "policy changed") },
		"timeslice 10 gpu0 50us", "timeslice 20 gpu0 50us", "timeslice 30 gpu0 16000us")
	noSlice := bePlan
	noSlice.Timeslice = 0
	step("best-effort without a timeslice", func() { e.Reclassify(lcIs(30, noSlice), "policy changed") },
		"timeslice 10 gpu0 1024us", "timeslice 20 gpu0 1024us", "timeslice 30 gpu0 16000us")
	step("back", func() { e.Reclassify(lcIs(30, bePlan), "policy changed back") },
		"timeslice 10 gpu0 50us", "timeslice 20 gpu0 50us", "timeslice 30 gpu0 16000us")
	observe := bePlan
	observe.Level = sched.LevelObserve
	step("best-effort at observe", func() { e.Reclassify(lcIs(30, observe), "policy changed") },
		"timeslice 10 gpu0 1024us", "timeslice 20 gpu0 1024us", "timeslice 30 gpu0 16000us")
	step("back again", func() { e.Reclassify(lcIs(30, bePlan), "policy changed back") },
		"timeslice 10 gpu0 50us", "timeslice 20 gpu0 50us", "timeslice 30 gpu0 16000us")
	step("10 execs", func() { ev := exec(5*us, 10, "other"); e.Apply(&ev) }, "timeslice 10 gpu0 1024us")
}

// TestClassPlanFollowsReload: a reload that tightens or loosens a class's
// objective changes the class's at once, not only when a member joins,
// and a member leaving takes its stricter objective with it.
func TestClassPlanFollowsReload(t *testing.T) {
	target := func(ms map[uint32]time.Duration) engine.ClassifierFunc {
		return func(p engine.ProcessInfo) (sched.Plan, string, error) {
			pl := lcPlan
			if d, ok := ms[p.Key.PID]; ok {
				pl.LatencyTarget = d
			}
			return pl, "latency-critical", nil
		}
	}
	evs := []trace.Event{launch(us, 10), launch(2*us, 11)}
	opts := engine.Options{Classifier: target(nil), IdleGap: 100 * time.Microsecond}
	e, err := engine.New(&events{evs: evs}, &calls{}, &opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		e.Apply(&evs[i])
	}
	classTarget := func() time.Duration {
		t.Helper()
		e.Reclassify(nil, "publish")
		for _, c := range e.Snapshot().Classes {
			if c.Name == lcPlan.Class {
				return c.Latency.Target
			}
		}
		t.Fatal("no latency-critical class")
		return 0
	}
	if got := classTarget(); got != lcPlan.LatencyTarget {
		t.Fatalf("class target %v, want the plans' %v", got, lcPlan.LatencyTarget)
	}
	e.Reclassify(target(map[uint32]time.Duration{10: 3 * time.Millisecond, 11: 3 * time.Millisecond}), "tightened")
	if got := classTarget(); got != 3*time.Millisecond {
		t.Errorf("after a reload to 3ms: class target %v", got)
	}
	e.Reclassify(target(map[uint32]time.Duration{11: 5 * time.Millisecond}), "loosened")
	if got := classTarget(); got != 5*time.Millisecond {
		t.Errorf("after a reload to 100ms and 5ms: class target %v, want the stricter 5ms", got)
	}
	exit := trace.Event{Kind: trace.KindExit, PID: 11, TID: 11, Time: 3 * us}
	e.Apply(&exit)
	if got := classTarget(); got != lcPlan.LatencyTarget {
		t.Errorf("after the 5ms member left: class target %v, want %v", got, lcPlan.LatencyTarget)
	}
}

// resetter is an enforcer that can give a timeslice back (engine.TimesliceResetter).
type resetter struct{ *calls }

func (r resetter) ResetTimeslice(pid uint32, gpu int) error {
	return r.do(fmt.Sprintf("reset %d gpu%d", pid, gpu))
}

// TestSliceGivenBackByReset: where the enforcer can reset a timeslice,
// the driver's default goes back by a reset, not by setting it (which the
// driver's channel control would then keep on the process), and the
// engine, keeping nothing, sets the short slice again when it is due.
func TestSliceGivenBackByReset(t *testing.T) {
	evs := []trace.Event{
		exec(0, 20, "train"), launch(us, 20),
		exec(0, 10, "infer"), launch(1000*us, 10), syncAt(1010*us, 10, 100*us),
		{Kind: trace.KindExit, PID: 10, TID: 10, Time: 3000 * us},
		exec(0, 11, "infer"), launch(4000*us, 11), syncAt(4010*us, 11, 100*us),
	}
	enf := resetter{&calls{}}
	runWith(t, evs, enf, engine.Options{IdleGap: 100 * time.Microsecond})
	want := []string{"timeslice 20 gpu0 50us", "timeslice 10 gpu0 16000us", "reset 20 gpu0",
		"timeslice 20 gpu0 50us", "timeslice 11 gpu0 16000us", "reset 11 gpu0", "reset 20 gpu0"}
	if got := only(enf.log, "timeslice", "reset"); !slices.Equal(got, want) {
		t.Errorf("timeslices\n%q\nwant\n%q", got, want)
	}
}

// supported is an enforcer that can only gate some processes.
type supported struct {
	*calls
	gateOnly map[uint32]string
}

func (s supported) Strongest(pid uint32) (sched.Level, string) {
	if why, ok := s.gateOnly[pid]; ok {
		return sched.LevelGate, why
	}
	return sched.LevelSuspend, ""
}

// TestGateWhereChannelsUnknown: a BE process whose channel handles are
// unknown is gated instead of suspended, says why, and is ungated when
// the request ends; a suspend that fails falls back to the gate too.
func TestGateWhereChannelsUnknown(t *testing.T) {
	evs := []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"), exec(0, 30, "train"), launch(us, 20), launch(us, 30),
		launch(1000*us, 10), syncAt(1010*us, 10, 500*us),
		launch(3000*us, 20),
	}
	enf := supported{calls: &calls{fail: map[string]error{"suspend 30 gpu0": errors.New("pid 30: channel group handles unknown")}},
		gateOnly: map[uint32]string{20: "no RM client traced for pid 20"}}
	opts := engine.Options{Classifier: byComm, IdleGap: 100 * time.Microsecond}
	e, err := engine.New(&events{evs: evs}, enf, &opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{"interleave 30 low", "timeslice 30 gpu0 50us", "timeslice 10 gpu0 16000us", "interleave 10 high",
		"gate 20", "suspend 30 gpu0", "timeslice 30 gpu0 1024us", "gate 30", "ungate 20", "ungate 30", "timeslice 10 gpu0 1024us"}
	if !slices.Equal(enf.log, want) {
		t.Errorf("enforcer calls\n%q\nwant\n%q", enf.log, want)
	}
	s := e.Snapshot()
	if p := proc(t, s, 20); p.Level != sched.LevelGate || !strings.Contains(p.Limit, "no RM client traced") {
		t.Errorf("pid 20: %+v", p)
	}
	var failed bool
	for _, d := range s.Decisions {
		failed = failed || d.Action == engine.ActionSuspend && d.PID == 30 && strings.Contains(d.Err, "handles unknown")
	}
	if !failed {
		t.Errorf("the failed suspend is not among the decisions: %+v", s.Decisions)
	}
}

// TestExitReleases: a process that exits while suspended is resumed (its
// state released) and leaves the table; stopping the engine releases the
// rest, so every suspend has its resume.
func TestExitReleases(t *testing.T) {
	exit := trace.Event{Kind: trace.KindExit, PID: 20, TID: 20, Time: 1200 * us}
	evs := []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"), exec(0, 30, "train"), launch(us, 20), launch(us, 30),
		launch(1000*us, 10), exit, launch(1300*us, 10),
	}
	e, enf := run(t, evs, engine.Options{IdleGap: 100 * time.Microsecond, RequestTimeout: time.Hour})
	var suspended, resumed []string
	for _, c := range enf.log {
		if strings.HasPrefix(c, "suspend") {
			suspended = append(suspended, strings.TrimPrefix(c, "suspend "))
		}
		if strings.HasPrefix(c, "resume") {
			resumed = append(resumed, strings.TrimPrefix(c, "resume "))
		}
	}
	slices.Sort(suspended)
	slices.Sort(resumed)
	if !slices.Equal(suspended, []string{"20 gpu0", "30 gpu0"}) || !slices.Equal(suspended, resumed) {
		t.Errorf("suspended %q resumed %q", suspended, resumed)
	}
	s := e.Snapshot()
	for _, p := range s.Processes {
		if p.PID == 20 {
			t.Error("exited process still in the table")
		}
		if p.State != engine.StateRunning {
			t.Errorf("pid %d left %s", p.PID, p.State)
		}
	}
}

// TestVictimsChosenByPolicy: only the processes the victim chooser names
// are suspended, and it sees the busy GPUs and the classes' SLO.
func TestVictimsChosenByPolicy(t *testing.T) {
	var seen engine.ControlState
	choose := victimsFunc(func(s engine.ControlState) (engine.Victims, error) {
		seen = s
		return engine.Victims{Suspend: []engine.Suspension{{PID: 30, Reason: "lowest priority"}}}, nil
	})
	evs := []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"), exec(0, 30, "train"), launch(us, 20), launch(us, 30),
		launch(200*uint64(time.Millisecond), 10), syncAt(200*uint64(time.Millisecond)+10*us, 10, 500*us),
	}
	_, enf := run(t, evs, engine.Options{Victims: choose, IdleGap: 100 * time.Microsecond})
	var got []string
	for _, c := range enf.log {
		if strings.HasPrefix(c, "suspend") || strings.HasPrefix(c, "resume") {
			got = append(got, c)
		}
	}
	if !slices.Equal(got, []string{"suspend 30 gpu0", "resume 30 gpu0"}) {
		t.Errorf("preemptions %q", got)
	}
	if len(seen.Processes) != 3 || len(seen.Busy) != 1 || seen.Busy[0].PID != 10 || seen.SLO["latency-critical"].Target != 0.99 {
		t.Errorf("chooser saw %+v", seen)
	}
}

// TestVictimsDefaultChoice: a chooser that answers ErrDefaultChoice (its
// policy has no victims rule now) gets the engine's default choice, every
// best-effort process on the busy GPU suspended, as with no chooser; that
// is neither a failure nor a call of the policy.
func TestVictimsDefaultChoice(t *testing.T) {
	rounds := 0
	choose := victimsFunc(func(engine.ControlState) (engine.Victims, error) {
		rounds++
		return engine.Victims{}, fmt.Errorf("policy revision r2: %w", engine.ErrDefaultChoice)
	})
	ms := uint64(time.Millisecond)
	evs := []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"), exec(0, 30, "train"), launch(us, 20), launch(us, 30),
		launch(250*ms, 10), syncAt(250*ms+10*us, 10, 500*us),
	}
	e, enf := run(t, evs, engine.Options{Victims: choose, IdleGap: 100 * time.Microsecond})
	var got []string
	for _, c := range enf.log {
		if strings.HasPrefix(c, "suspend") || strings.HasPrefix(c, "resume") {
			got = append(got, c)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"resume 20 gpu0", "resume 30 gpu0", "suspend 20 gpu0", "suspend 30 gpu0"}) {
		t.Errorf("preemptions %q", got)
	}
	if st := e.Stats(); rounds < 2 || st.VictimErrors != 0 || st.VictimCalls != 0 {
		t.Errorf("rounds %d, stats %+v", rounds, st)
	}
}

// TestNamesProcessesRunningBeforeTracing: a process with no exec in the
// trace is named by Options.Name, and classified by that name; one that
// exec'd keeps its exec's name.
func TestNamesProcessesRunningBeforeTracing(t *testing.T) {
	var asked []uint32
	name := func(pid uint32) string {
		asked = append(asked, pid)
		if pid == 7 {
			return "infer"
		}
		return ""
	}
	e, _ := run(t, []trace.Event{
		exec(0, 8, "train"),
		launch(1*us, 7),
		launch(2*us, 8),
		launch(3*us, 9),
	}, engine.Options{Name: name})
	s := e.Snapshot()
	if p := proc(t, s, 7); p.Comm != "infer" || p.Class != lcPlan.Class {
		t.Errorf("pid 7 (running before tracing): comm %q class %q, want infer, %s", p.Comm, p.Class, lcPlan.Class)
	}
	if p := proc(t, s, 8); p.Comm != "train" {
		t.Errorf("pid 8 (exec'd): comm %q, want train", p.Comm)
	}
	if p := proc(t, s, 9); p.Comm != "" {
		t.Errorf("pid 9 (no name to be had): comm %q", p.Comm)
	}
	if fmt.Sprint(asked) != "[7 9]" {
		t.Errorf("Name asked for %v, want [7 9] (never for a process that exec'd)", asked)
	}
}
