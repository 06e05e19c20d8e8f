package engine_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/trace"
)

// heldSource holds what it produces, as a ring buffer whose reader was
// not woken, until Flush releases it; Flush returns how many events it has
// released in all.
type heldSource struct {
	mu       sync.Mutex
	held     []trace.Event
	released uint64
	flushes  int
	ch       chan trace.Event
	closed   chan struct{}
	once     sync.Once
}

func newHeldSource() *heldSource {
	return &heldSource{ch: make(chan trace.Event, 64), closed: make(chan struct{})}
}

func (s *heldSource) produce(ev trace.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = append(s.held, ev)
}

func (s *heldSource) Flush() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushes++
	for _, ev := range s.held {
		s.ch <- ev
		s.released++
	}
	s.held = nil
	return s.released, nil
}

func (s *heldSource) Read(ev *trace.Event) error {
	select {
	case e := <-s.ch:
		*ev = e
		return nil
	case <-s.closed:
		return trace.ErrClosed
	}
}

func (s *heldSource) Close() error { s.once.Do(func() { close(s.closed) }); return nil }

// TestLiveFlushesAtDeadline: a passed deadline is reported only after
// the events a Flusher source held by then have been read, each deadline
// flushes once, and a source without Flush is not waited for.
func TestLiveFlushesAtDeadline(t *testing.T) {
	held, plain := newHeldSource(), newChanSource()
	l := engine.NewLive(held, plain)
	defer l.Close()
	held.produce(trace.Event{PID: 1})
	held.produce(trace.Event{PID: 2})
	const d = 20 * time.Millisecond
	start := time.Now()
	if err := l.SetReadDeadline(l.Now() + uint64(d)); err != nil {
		t.Fatal(err)
	}
	var ev trace.Event
	for _, want := range []uint32{1, 2} {
		if err := l.Read(&ev); err != nil || ev.PID != want {
			t.Fatalf("read %v %+v, want the held event of pid %d first", err, ev, want)
		}
	}
	if el := time.Since(start); el < d {
		t.Errorf("held events came after %v, before the deadline (%v): nothing flushed them then", el, d)
	}
	if err := l.Read(&ev); !errors.Is(err, trace.ErrDeadline) {
		t.Fatalf("after the held events: %v, want ErrDeadline", err)
	}
	// The same deadline again, nothing held: one more round, reported.
	if err := l.Read(&ev); !errors.Is(err, trace.ErrDeadline) {
		t.Fatalf("nothing held: %v, want ErrDeadline", err)
	}
	if held.flushes != 2 {
		t.Errorf("%d flushes, want one per reported deadline (2)", held.flushes)
	}
	// A later deadline flushes again: what was produced since comes first.
	held.produce(trace.Event{PID: 3})
	l.SetReadDeadline(l.Now() + uint64(d))
	if err := l.Read(&ev); err != nil || ev.PID != 3 {
		t.Fatalf("read %v %+v, want pid 3", err, ev)
	}
	if err := l.Read(&ev); !errors.Is(err, trace.ErrDeadline) {
		t.Fatalf("%v, want ErrDeadline", err)
	}
}
