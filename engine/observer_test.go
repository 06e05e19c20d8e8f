package engine_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// recorder is an observer that keeps the events it sees and, as a Ticker,
// the clock of every control tick.
type recorder struct {
	events []trace.Event
	ticks  []uint64
}

func (r *recorder) Event(ev *trace.Event) { r.events = append(r.events, *ev) }
func (r *recorder) Tick(now uint64)       { r.ticks = append(r.ticks, now) }

// TestObserversHearEventsAndTicks: observers see every event in the order
// the engine applies it; a Ticker hears each control tick on the engine's
// clock, those that events bring and those that read deadlines bring when
// no event comes.
func TestObserversHearEventsAndTicks(t *testing.T) {
	const ms = 1000 * us
	evs := []trace.Event{exec(0, 10, "infer"), launch(500*us, 10), syncAt(5*ms, 10, 100*us)}
	rec := &recorder{}
	plain := 0
	opts := engine.Options{ControlInterval: time.Millisecond,
		Observers: []engine.Observer{rec, engine.ObserverFunc(func(*trace.Event) { plain++ })}}
	e, _ := run(t, evs, opts)
	if !slices.Equal(rec.events, evs) || plain != len(evs) {
		t.Errorf("observed %d events (and %d by the plain observer), want the %d applied, in order", len(rec.events), plain, len(evs))
	}
	// The first event ticks at 0; read deadlines tick every 1 ms until the
	// event at 5 ms ticks on its own, and on to the source's end at 15 ms.
	var want []uint64
	for i := uint64(0); i <= 15; i++ {
		want = append(want, i*ms)
	}
	if !slices.Equal(rec.ticks, want) {
		t.Errorf("ticks %v, want every ms from 0 to 15 ms", rec.ticks)
	}
	if st := e.Stats(); st.Events != uint64(len(evs)) {
		t.Errorf("engine applied %d events, want %d", st.Events, len(evs))
	}
}

// TestNoEnforcerOnlyObserves: an engine without an enforcer plans every
// process at the observe level, whatever the classifier allows, and says
// why; the requests of a latency-critical process are still tracked.
func TestNoEnforcerOnlyObserves(t *testing.T) {
	evs := []trace.Event{exec(0, 10, "infer"), exec(0, 20, "train"), launch(us, 20),
		launch(1000*us, 10), syncAt(1010*us, 10, 500*us), launch(9000*us, 20)}
	opts := engine.Options{Classifier: byComm, IdleGap: 200 * time.Microsecond}
	e, err := engine.New(&events{evs: evs}, nil, &opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	s := e.Snapshot()
	for _, pid := range []uint32{10, 20} {
		p := proc(t, s, pid)
		if p.Level != sched.LevelObserve || p.Planned == sched.LevelObserve || !strings.Contains(p.Limit, "only observes") || p.State != engine.StateRunning {
			t.Errorf("pid %d: level %s (planned %s), limit %q, state %s: want observe, and why", pid, p.Level, p.Planned, p.Limit, p.State)
		}
	}
	if lc := proc(t, s, 10); lc.Latency.Requests != 1 {
		t.Errorf("latency-critical requests %d, want 1", lc.Latency.Requests)
	}
	if st := e.Stats(); st.Suspends+st.Gates+st.Timeslices+st.Interleaves != 0 {
		t.Errorf("an engine with no enforcer counted enforcement: %+v", st)
	}
}
