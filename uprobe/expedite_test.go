// Tests with real eBPF of expedited processes: the launch or copy that
// opens a request of a listed process wakes the reader at once, while
// other records wait for its poll.

package uprobe

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/gpu-arbiter/arbiter/trace"
)

// arrival is an event and when Read returned it.
type arrival struct {
	ev trace.Event
	at time.Time
}

// arrivals reads tr's launch and sync events into a channel until it closes.
func arrivals(tr *Tracer) <-chan arrival {
	ch := make(chan arrival, 1024)
	go func() {
		defer close(ch)
		var ev trace.Event
		for tr.Read(&ev) == nil {
			if ev.Kind == trace.KindLaunch || ev.Kind == trace.KindSync {
				ch <- arrival{ev, time.Now()}
			}
		}
	}()
	return ch
}

// wokenWithin bounds the delivery of a record the reader was woken for:
// far inside the tests' one-minute poll interval, and far above what a
// loaded machine adds by scheduling the reader late.
const wokenWithin = 5 * time.Second

// next returns the next arrival, or fails the test after d.
func next(t *testing.T, ch <-chan arrival, d time.Duration, what string) arrival {
	t.Helper()
	select {
	case a, ok := <-ch:
		if !ok {
			t.Fatalf("%s: reader stopped", what)
		}
		return a
	case <-time.After(d):
		t.Fatalf("%s: nothing arrived within %v", what, d)
	}
	return arrival{}
}

// none fails the test if an event arrives within d.
func none(t *testing.T, ch <-chan arrival, d time.Duration, what string) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s: %v of pid %d arrived %v after its call, want it held until the reader polls or is woken",
			what, a.ev.Kind, a.ev.PID, time.Duration(monotonic(t)-a.ev.Time))
	case <-time.After(d):
	}
}

// TestExpediteWakesReader: with the reader polling once a minute, the
// launch that opens a request of an expedited process arrives at once;
// its next launch within the gap, and any launch of a process not
// expedited, wait until the reader is woken. Expedite(off) ends it, a
// synchronizer's return counts as busy, and an exited process leaves the
// map.
func TestExpediteWakesReader(t *testing.T) {
	r := newRig(t)
	a := r.start(t, nil, false, "serve")
	b := r.start(t, nil, false, "serve")
	for _, p := range []*proc{a, b} {
		if l := p.line(t); l != "ready" {
			t.Fatalf("exerciser said %q", l)
		}
	}
	o := r.options()
	o.PIDs = []uint32{a.pid, b.pid}
	o.poll = time.Minute
	const gap = 2 * time.Second
	o.ExpediteGap = gap
	tr := openTracer(t, o)
	ch := arrivals(tr)
	launch := func(p *proc) time.Time {
		p.send(t, "launch 1")
		p.line(t)
		return time.Now()
	}
	if err := tr.Expedite(a.pid, true); err != nil {
		t.Fatal(err)
	}
	if err := tr.Expedite(a.pid, true); err != nil {
		t.Fatalf("expedite twice: %v", err)
	}

	// The first launch opens a request: woken at once.
	launch(a)
	first := next(t, ch, 2*wokenWithin, "the expedited process's first launch")
	lag := time.Duration(monotonic(t) - first.ev.Time)
	t.Logf("first launch of the expedited process delivered %v after its call (poll interval %v)", lag, o.poll)
	if first.ev.PID != a.pid || lag > wokenWithin {
		t.Errorf("first arrival pid %d after %v, want pid %d well within the poll interval", first.ev.PID, lag, a.pid)
	}
	busy := func() uint64 {
		var v uint64
		if err := tr.objs.maps.Expedite.Lookup(a.pid, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := busy(); v != first.ev.Time {
		t.Errorf("busy time %d, want the launch's %d", v, first.ev.Time)
	}
	// A synchronizer's return moves the busy time past its entry.
	a.send(t, "sync 1")
	a.line(t)
	if v := busy(); v <= first.ev.Time {
		t.Errorf("busy time %d after a sync, want past the launch's %d", v, first.ev.Time)
	}

	// Within the gap: the same request, no wake-up; nor for b.
	last := launch(a)
	launch(b)
	none(t, ch, 500*time.Millisecond, "a launch within the gap and one of a process not expedited")

	// After the gap: a new request wakes the reader, which brings the
	// held records along.
	time.Sleep(time.Until(last.Add(gap + 100*time.Millisecond)))
	launch(a)
	got := map[uint32]int{}
	for range 4 { // a's sync and two launches, b's launch
		ar := next(t, ch, 2*wokenWithin, "the records held until a new request woke the reader")
		got[ar.ev.PID]++
	}
	if got[a.pid] != 3 || got[b.pid] != 1 {
		t.Errorf("arrivals per pid %v, want 3 of %d and 1 of %d", got, a.pid, b.pid)
	}

	// Off: a's requests wait for the poll again.
	if err := tr.Expedite(a.pid, false); err != nil {
		t.Fatal(err)
	}
	if err := tr.Expedite(a.pid, false); err != nil {
		t.Fatalf("stop expediting twice: %v", err)
	}
	time.Sleep(gap + 100*time.Millisecond)
	launch(a)
	none(t, ch, 500*time.Millisecond, "a launch after Expedite(off)")

	// An exited process leaves the map.
	if err := tr.Expedite(b.pid, true); err != nil {
		t.Fatal(err)
	}
	b.wait(t)
	var v uint64
	if err := tr.objs.maps.Expedite.Lookup(b.pid, &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("pid %d exited: map lookup %v, want no entry", b.pid, err)
	}
	tr.Close()
	if err := tr.Expedite(a.pid, true); !errors.Is(err, ErrClosed) {
		t.Errorf("Expedite after Close: %v, want ErrClosed", err)
	}
}

// TestExpediteEveryCall: with no gap, every launch of an expedited process
// wakes the reader.
func TestExpediteEveryCall(t *testing.T) {
	r := newRig(t)
	a := r.start(t, nil, false, "serve")
	if l := a.line(t); l != "ready" {
		t.Fatalf("exerciser said %q", l)
	}
	o := r.options()
	o.PIDs = []uint32{a.pid}
	o.poll = time.Minute
	tr := openTracer(t, o)
	ch := arrivals(tr)
	if err := tr.Expedite(a.pid, true); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		a.send(t, "launch 1")
		a.line(t)
		ar := next(t, ch, 2*wokenWithin, "a launch of an expedited process with no gap")
		if lag := time.Duration(monotonic(t) - ar.ev.Time); lag > wokenWithin {
			t.Errorf("launch %d delivered %v after its call", i, lag)
		}
	}
}

// TestFlush: with the reader polling once a minute, records of a process
// not expedited wait in the ring until Flush, which returns once they are
// queued for Read, with the count of events queued since Open; flushes
// at once from many goroutines all return.
func TestFlush(t *testing.T) {
	r := newRig(t)
	a := r.start(t, nil, false, "serve")
	if l := a.line(t); l != "ready" {
		t.Fatalf("exerciser said %q", l)
	}
	o := r.options()
	o.PIDs = []uint32{a.pid}
	o.poll = time.Minute
	tr := openTracer(t, o)
	ch := arrivals(tr)
	a.send(t, "launch 3")
	a.line(t)
	none(t, ch, 300*time.Millisecond, "launches before a flush")
	n, err := tr.Flush()
	if err != nil || n != 3 {
		t.Fatalf("Flush: %d, %v; want the 3 launches queued", n, err)
	}
	for i := range 3 {
		next(t, ch, wokenWithin, fmt.Sprintf("launch %d after Flush returned", i+1))
	}
	if n, err := tr.Flush(); err != nil || n != 3 {
		t.Errorf("Flush with nothing new: %d, %v; want 3", n, err)
	}

	done := make(chan error, 8)
	for range 8 {
		go func() {
			_, err := tr.Flush()
			done <- err
		}()
	}
	a.send(t, "launch 100")
	a.line(t)
	for range 8 {
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("concurrent flushes did not all return")
		}
	}
	if n, err := tr.Flush(); err != nil || n != 103 {
		t.Errorf("Flush after 100 more launches: %d, %v; want 103", n, err)
	}
	tr.Close()
	if _, err := tr.Flush(); !errors.Is(err, ErrClosed) {
		t.Errorf("Flush after Close: %v, want ErrClosed", err)
	}
}
