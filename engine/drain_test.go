package engine_test

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/trace"
)

// stopping is a source whose reader is stopped after its first k events
// with the rest already read ahead: it cancels the run, and once closed
// hands back those events, then trace.ErrClosed.
type stopping struct {
	evs    []trace.Event
	k, i   int
	cancel context.CancelFunc
	closed bool
}

func (s *stopping) Read(ev *trace.Event) error {
	switch {
	case s.i == s.k && !s.closed:
		s.cancel()
		return trace.ErrDeadline
	case s.i < len(s.evs):
		*ev = s.evs[s.i]
		s.i++
		return nil
	case s.closed:
		return trace.ErrClosed
	}
	return io.EOF
}

func (s *stopping) Close() error { s.closed = true; return nil }

// TestDrainCountsAndReleases: the events a stopped run's reader had
// taken are applied by Drain and counted in the snapshot it publishes,
// and what they led to (a best-effort process held for a
// latency-critical request) is undone, as at the end of Run.
func TestDrainCountsAndReleases(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	src := &stopping{k: 3, cancel: cancel, evs: []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"), launch(us, 20),
		launch(1000*us, 10), launch(1001*us, 10), syncAt(1010*us, 10, 500*us),
	}}
	enf := supported{calls: &calls{}}
	e, err := engine.New(src, enf, &engine.Options{Classifier: byComm, IdleGap: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.Snapshot().Stats.Events; n != 3 {
		t.Fatalf("run applied %d events before it was stopped, want 3", n)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Drain(); err != nil {
		t.Fatal(err)
	}
	s := e.Snapshot()
	if s.Stats.Events != 6 {
		t.Errorf("snapshot counts %d events, want all 6", s.Stats.Events)
	}
	if p := proc(t, s, 10); p.Launches != 2 || p.Syncs != 1 {
		t.Errorf("pid 10 counted %d launches, %d syncs; want the 2 and 1 drained", p.Launches, p.Syncs)
	}
	if !slices.Contains(enf.log, "suspend 20 gpu0") {
		t.Fatalf("enforcer calls %q: the drained request held nothing, so the test shows nothing", enf.log)
	}
	if last := only(enf.log, "suspend", "resume"); last[len(last)-1] != "resume 20 gpu0" {
		t.Errorf("enforcer calls %q: pid 20 left suspended after Drain", enf.log)
	}
}
