package engine_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/trace"
)

// TestRequestTimeoutFromLatestEnd: a launch reported after a longer
// synchronization of the same request (another thread's, reported at its
// return) does not let the request time out before that synchronization
// ended: the request tracker counts the timeout from the request's latest
// end, so the victim stays suspended until then.
func TestRequestTimeoutFromLatestEnd(t *testing.T) {
	const ms = 1000 * us
	evs := []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"), launch(us, 20),
		launch(1*ms, 10),          // opens the request, suspends train
		syncAt(1*ms+us, 10, 5*ms), // returns at 6 ms
		launch(2*ms, 10),          // another thread, reported after the sync
		launch(20*ms, 20),         // train again, long after
	}
	e, enf := run(t, evs, engine.Options{IdleGap: 100 * time.Microsecond, RequestTimeout: time.Millisecond})
	log := slices.DeleteFunc(slices.Clone(enf.log), func(l string) bool { return strings.HasPrefix(l, "timeslice ") })
	if len(log) < 2 || log[len(log)-2] != "suspend 20 gpu0" || log[len(log)-1] != "resume 20 gpu0" {
		t.Fatalf("enforcer calls %q: want train suspended, then resumed", enf.log)
	}
	s := e.Snapshot()
	var resumed uint64
	for _, d := range s.Preemptions {
		if d.Action == engine.ActionResume && d.PID == 20 {
			resumed = d.Time
		}
	}
	// The launch alone would time out at 3 ms; the request's end (6.001
	// ms) plus the timeout is 7.001 ms.
	if resumed != 7*ms+us {
		t.Errorf("train resumed at %v, want 7.001ms (the sync's end plus the timeout); preemptions %+v",
			time.Duration(resumed), s.Preemptions)
	}
	lc := proc(t, s, 10)
	if lc.Latency.Requests != 1 || lc.Latency.Max < 5*time.Millisecond-10*time.Microsecond || lc.Latency.Max > 5*time.Millisecond+50*time.Microsecond {
		t.Errorf("requests %d, max %v: want one request of 5 ms", lc.Latency.Requests, lc.Latency.Max)
	}
}

// TestClassLatencyOutlivesItsMembers: a class's request count and
// latency distribution go on over the daemon's life: when its only
// member exits and another joins later, the class counts the requests of
// both, so that a counter built on it never goes back.
func TestClassLatencyOutlivesItsMembers(t *testing.T) {
	const ms = 1000 * us
	exit := func(t uint64, pid uint32) trace.Event {
		return trace.Event{Kind: trace.KindExit, PID: pid, TID: pid, Time: t}
	}
	evs := []trace.Event{
		exec(0, 10, "infer"),
		launch(1*ms, 10), syncAt(1*ms+us, 10, 2*ms), // one request of 2 ms
		launch(10*ms, 10), syncAt(10*ms+us, 10, 3*ms), // another of 3 ms
		exit(20*ms, 10),
		exec(30*ms, 11, "infer"),
		launch(31*ms, 11), syncAt(31*ms+us, 11, 9*ms), // the next member's: 9 ms
	}
	e, _ := run(t, evs, engine.Options{IdleGap: 100 * time.Microsecond})
	s := e.Snapshot()
	var lc *engine.ClassView
	for i := range s.Classes {
		if s.Classes[i].LatencyCritical {
			lc = &s.Classes[i]
		}
	}
	if lc == nil || lc.Members != 1 {
		t.Fatalf("classes %+v: want the latency-critical class with its one member", s.Classes)
	}
	if lc.Latency.Requests != 3 || lc.Latency.Max < 9*time.Millisecond-10*time.Microsecond {
		t.Errorf("class requests %d, max %v: want the 3 requests of both members, the longest 9 ms", lc.Latency.Requests, lc.Latency.Max)
	}
}

// TestOnlyLatencyCriticalClassesEscalate: a best-effort class suspends
// nothing, so the snapshot (and the API and the arbiter_class_escalated
// gauge built on it) never shows it escalated, with or without SLO
// feedback, while the latency-critical class is.
func TestOnlyLatencyCriticalClassesEscalate(t *testing.T) {
	const ms = 1000 * us
	evs := []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"),
		launch(1*ms, 20), launch(2*ms, 10), syncAt(2*ms+us, 10, 2*ms),
	}
	for _, feedback := range []bool{false, true} {
		e, _ := run(t, evs, engine.Options{IdleGap: 100 * time.Microsecond, Feedback: feedback})
		s := e.Snapshot()
		if len(s.Classes) != 2 {
			t.Fatalf("feedback %v: classes %+v: want latency-critical and best-effort", feedback, s.Classes)
		}
		for _, c := range s.Classes {
			if c.Escalated != c.LatencyCritical {
				t.Errorf("feedback %v: class %s (latency-critical %v) escalated %v: want escalated only for the latency-critical class",
					feedback, c.Name, c.LatencyCritical, c.Escalated)
			}
		}
	}
}

// TestIdleDeadlineMoves: a request ends at its latest deadline however
// the calls moved it: later (a launch after the first one's timeout was
// set: the request does not end at the first deadline), and earlier (a
// synchronization after a launch: the short idle gap ends it, not the
// launch's timeout). The victim's resume time shows when it ended. A
// process that calls thousands of times keeps at most a few idle timers
// pending; this checks that doing so loses no deadline.
func TestIdleDeadlineMoves(t *testing.T) {
	const ms = 1000 * us
	resumedAt := func(t *testing.T, evs []trace.Event) uint64 {
		t.Helper()
		e, _ := run(t, evs, engine.Options{IdleGap: 100 * time.Microsecond, RequestTimeout: 3 * time.Millisecond})
		var at uint64
		for _, d := range e.Snapshot().Preemptions {
			if d.Action == engine.ActionResume && d.PID == 20 {
				at = d.Time
			}
		}
		return at
	}
	base := []trace.Event{exec(0, 10, "infer"), exec(0, 20, "train"), launch(us, 20)}
	later := append(slices.Clone(base), launch(1*ms, 10), launch(2500*us, 10), launch(30*ms, 20))
	if at := resumedAt(t, later); at != 5500*us {
		t.Errorf("launches at 1 ms and 2.5 ms, a 3 ms timeout: train resumed at %v, want 5.5ms (the second launch's deadline)", time.Duration(at))
	}
	earlier := append(slices.Clone(base), launch(1*ms, 10), syncAt(1500*us, 10, 100*us), launch(30*ms, 20))
	if at := resumedAt(t, earlier); at != 1700*us {
		t.Errorf("a launch at 1 ms, then a sync returning at 1.6 ms: train resumed at %v, want 1.7ms (the idle gap after the sync)", time.Duration(at))
	}
	many := slices.Clone(base)
	for i := range uint64(5000) { // a launch every 10 µs from 1 ms to 51 ms
		many = append(many, launch(1*ms+i*10*us, 10))
	}
	many = append(many, launch(100*ms, 20))
	if at := resumedAt(t, many); at != 1*ms+4999*10*us+3*ms {
		t.Errorf("5,000 launches 10 µs apart: train resumed at %v, want 3 ms after the last", time.Duration(at))
	}
}

// TestLatencyViewFollowsRequests: a process's latency figures in the
// snapshot follow every request, across the snapshots published between
// them (every control tick: the figures are kept between requests, not
// walked again each time).
func TestLatencyViewFollowsRequests(t *testing.T) {
	const ms = 1000 * us
	evs := []trace.Event{
		exec(0, 10, "infer"),
		launch(1*ms, 10), syncAt(1*ms+us, 10, 2*ms), // a request of 2 ms
		launch(500*ms, 10), syncAt(500*ms+us, 10, 9*ms), // 0.5 s later, many ticks on: 9 ms
	}
	e, _ := run(t, evs, engine.Options{IdleGap: 100 * time.Microsecond, ControlInterval: 10 * time.Millisecond})
	l := proc(t, e.Snapshot(), 10).Latency
	if l.Requests != 2 || l.Max < 9*time.Millisecond-10*time.Microsecond || l.P99 < 9*time.Millisecond-100*time.Microsecond ||
		l.P50 < 2*time.Millisecond-100*time.Microsecond || l.P50 > 2*time.Millisecond+100*time.Microsecond {
		t.Errorf("after requests of 2 and 9 ms: %+v", l)
	}
}
