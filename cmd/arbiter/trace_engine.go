package main

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
)

// The trace command runs on the engine's loop, as the daemon does: its
// source feeds an engine that only observes (no enforcer: every process
// at the observe level), and what the command shows hangs on that loop as
// an observer, traceObserver. A live trace reads the tracer through
// engine.Live, whose read deadlines on CLOCK_MONOTONIC bring the control
// ticks that release held events when none arrive; a replay reads the file
// through a readAhead, with no clock but its events.

// traceObserver is the trace command on the engine's loop: it filters the
// events the engine applies, counts them in the summary, holds them for
// time order and hands them to the sink (lifecycle filter, printer,
// recorder); at the engine's control ticks it releases held events by the
// engine's clock when none arrived since the last tick and flushes a
// recording to standard output. A failure to write stops the engine, and
// it then takes no more events.
type traceObserver struct {
	filter *eventFilter
	sum    *trace.Summary
	order  *orderBuffer
	sink   *traceSink
	// firstFromEvents: text shows times since the first event seen (a
	// replay), not since the trace started (live, set in sink).
	firstFromEvents bool
	// stop ends the engine's Run.
	stop func()
	// libs tells of libraries attached later (live only).
	libs    *libraryWatch
	seen    uint64
	arrived bool
	err     error
}

// Event implements engine.Observer.
func (o *traceObserver) Event(ev *trace.Event) {
	if o.err != nil {
		return
	}
	if o.seen == 0 && o.firstFromEvents {
		o.sink.first = ev.Time
	}
	o.seen++
	o.arrived = true
	if comm, ok := o.filter.match(ev); ok {
		if comm != "" {
			if p, seen := o.sum.Process(ev.PID); !seen || p.Comm == "" {
				o.sum.SetComm(ev.PID, comm)
			}
		}
		o.sum.Add(ev)
		o.order.push(ev, comm)
	}
	o.fail(o.sink.release(o.order, 0))
}

// Tick implements engine.Ticker. While events arrive, their own times
// release them: a backlog read in a burst (the first poll, a stalled
// reader) is older than the clock's window yet still to be sorted. Once
// none arrive, the clock releases what is held.
func (o *traceObserver) Tick(now uint64) {
	if o.err != nil {
		return
	}
	if !o.arrived {
		o.fail(o.sink.release(o.order, now))
	}
	o.arrived = false
	if o.libs != nil {
		o.libs.check(time.Now())
	}
	if o.err == nil && o.sink.rec != nil {
		o.fail(o.sink.recordErr(o.sink.rec.tick(time.Now())))
	}
}

// finish writes every event still held, unless writing failed; it returns
// the first failure to write.
func (o *traceObserver) finish() error {
	if o.err == nil {
		o.err = o.sink.drain(o.order)
	}
	return o.err
}

func (o *traceObserver) fail(err error) {
	if err != nil && o.err == nil {
		o.err = err
		o.stop()
	}
}

// failures remembers the first failure of the source it wraps (not its
// end, not its closing), so that the command reports it in its own words
// where the engine's Run says only that reading failed. Read runs on one
// goroutine; err is read once Run returned with that failure.
type failures struct {
	eventSource
	err error
}

func (f *failures) Read(ev *trace.Event) error {
	err := f.eventSource.Read(ev)
	if err != nil && f.err == nil && !errors.Is(err, io.EOF) && !errors.Is(err, trace.ErrClosed) {
		f.err = err
	}
	return err
}

// readAheadLen is how many events a readAhead holds.
const readAheadLen = 1024

// readAhead reads a source in a goroutine of its own, so that Close ends
// a pending Read at once even where the source cannot be interrupted
// (standard input): a replay from a pipe stops on Ctrl-C or a closed
// output without waiting for the writer's next event. After Close, Read
// returns what was read ahead, then an error wrapping trace.ErrClosed.
// It has no clock and no deadlines: the engine's time is the events'.
type readAhead struct {
	src   eventSource
	queue chan readItem
	done  chan struct{}
	once  sync.Once
	// end is the error that ended the source, returned again by every
	// later Read.
	end error
}

type readItem struct {
	ev  trace.Event
	err error
}

func newReadAhead(src eventSource) *readAhead {
	r := &readAhead{src: src, queue: make(chan readItem, readAheadLen), done: make(chan struct{})}
	go r.pump()
	return r
}

func (r *readAhead) pump() {
	for {
		var it readItem
		it.err = r.src.Read(&it.ev)
		select {
		case r.queue <- it:
		case <-r.done:
			return
		}
		if it.err != nil {
			return
		}
	}
}

// Read implements engine.Source.
func (r *readAhead) Read(ev *trace.Event) error {
	if r.end != nil {
		return r.end
	}
	var it readItem
	select {
	case it = <-r.queue:
	default:
		select {
		case it = <-r.queue:
		case <-r.done:
			return fmt.Errorf("read ahead: %w", trace.ErrClosed)
		}
	}
	if it.err != nil {
		r.end = it.err
		return it.err
	}
	*ev = it.ev
	return nil
}

// Close stops reading ahead and closes the source; it is idempotent and
// does not wait for a Read of the source that cannot be interrupted.
func (r *readAhead) Close() error {
	var err error
	r.once.Do(func() {
		close(r.done)
		err = r.src.Close()
	})
	return err
}
