package engine_test

import (
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/trace"
)

// chanSource delivers what is sent on ch, io.EOF once ch is closed, and
// trace.ErrClosed after Close.
type chanSource struct {
	ch     chan trace.Event
	closed chan struct{}
	once   sync.Once
}

func newChanSource() *chanSource {
	return &chanSource{ch: make(chan trace.Event), closed: make(chan struct{})}
}

func (s *chanSource) Read(ev *trace.Event) error {
	select {
	case e, ok := <-s.ch:
		if !ok {
			return io.EOF
		}
		*ev = e
		return nil
	case <-s.closed:
		return trace.ErrClosed
	}
}

func (s *chanSource) Close() error { s.once.Do(func() { close(s.closed) }); return nil }

// TestLive: events of every source arrive; a deadline with nothing to
// read returns ErrDeadline on time; Wake returns at once; EOF comes when
// every source ended; after Close, reads say closed and the sources are
// closed.
func TestLive(t *testing.T) {
	a, b := newChanSource(), newChanSource()
	l := engine.NewLive(a, b)
	go func() {
		a.ch <- trace.Event{PID: 1}
		b.ch <- trace.Event{PID: 2}
	}()
	var ev trace.Event
	seen := map[uint32]bool{}
	for range 2 {
		if err := l.Read(&ev); err != nil {
			t.Fatal(err)
		}
		seen[ev.PID] = true
	}
	if !seen[1] || !seen[2] {
		t.Fatalf("events %v", seen)
	}
	start := time.Now()
	if err := l.SetReadDeadline(l.Now() + uint64(20*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := l.Read(&ev); !errors.Is(err, trace.ErrDeadline) || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("deadline: %v after %v", err, time.Since(start))
	}
	l.SetReadDeadline(0)
	l.Wake()
	if err := l.Read(&ev); !errors.Is(err, trace.ErrDeadline) {
		t.Fatalf("wake: %v", err)
	}
	close(a.ch)
	go func() { b.ch <- trace.Event{PID: 3} }()
	if err := l.Read(&ev); err != nil || ev.PID != 3 {
		t.Fatalf("one source ended, the other goes on: %v %+v", err, ev)
	}
	close(b.ch)
	if err := l.Read(&ev); !errors.Is(err, io.EOF) {
		t.Fatalf("every source ended: %v", err)
	}

	c := newChanSource()
	l = engine.NewLive(c)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Read(&ev); !errors.Is(err, trace.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	select {
	case <-c.closed:
	default:
		t.Fatal("Close left the source open")
	}
}
