package engine

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/trace"
)

// Live merges live event sources (the eBPF tracers) into one
// DeadlineSource on CLOCK_MONOTONIC, the clock their event timestamps use.
// One goroutine per source reads into a shared buffered channel; events
// of different sources arrive in the order they were read, which the
// engine tolerates (it orders nothing across processes). Read deadlines
// are real time. A deadline that has passed is reported only after every
// event a Flusher source had produced by then has been read, so that no
// timer fires on the absence of a call that merely waits in a buffer.
// Wake makes a blocked Read return at once (the engine then runs work
// posted to it).
type Live struct {
	srcs     []Source
	ch       chan liveItem
	wake     chan struct{}
	done     chan struct{}
	once     sync.Once
	wg       sync.WaitGroup
	deadline uint64
	timer    *time.Timer
	// ended counts sources that returned io.EOF.
	ended int
	// A flush round: read counts, per source, the events Read returned;
	// flushed how many each must reach before a passed deadline is
	// reported; pending the Flush calls of the round still running (each
	// in a goroutine, so that Read keeps taking events meanwhile: a
	// Flush may wait for room in its source's queue); flushStart when the
	// round began.
	read, flushed []uint64
	over          []bool // the source returned io.EOF
	flushRes      chan flushResult
	flushing      bool
	pending       int
	flushStart    uint64
}

type flushResult struct {
	src int
	n   uint64
	err error
}

// Flusher is a Source whose events can wait in a buffer for a while after
// they happened: the tracer's ring buffer, whose reader is woken only past
// a fill threshold or for an expedited call, and polls otherwise. Flush
// makes everything produced so far readable without waiting and returns
// how many events the source has made readable since it was opened: once
// Read has returned that many, none of them is still waiting.
type Flusher interface {
	Flush() (uint64, error)
}

type liveItem struct {
	ev  trace.Event
	err error
	src int
}

// liveBuffer is how many events may wait between the sources' readers and
// the engine.
const liveBuffer = 1 << 14

// NewLive starts reading srcs.
func NewLive(srcs ...Source) *Live {
	l := &Live{srcs: srcs, ch: make(chan liveItem, liveBuffer), wake: make(chan struct{}, 1), done: make(chan struct{}),
		timer: time.NewTimer(time.Hour), read: make([]uint64, len(srcs)), flushed: make([]uint64, len(srcs)),
		over: make([]bool, len(srcs)), flushRes: make(chan flushResult, len(srcs))}
	l.timer.Stop()
	for i, s := range srcs {
		l.wg.Add(1)
		go l.pump(i, s)
	}
	return l
}

func (l *Live) pump(i int, s Source) {
	defer l.wg.Done()
	for {
		it := liveItem{src: i}
		it.err = s.Read(&it.ev)
		select {
		case l.ch <- it:
		case <-l.done:
			return
		}
		if it.err != nil {
			return
		}
	}
}

// Now reads CLOCK_MONOTONIC in nanoseconds.
func (l *Live) Now() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err)) // cannot fail on Linux
	}
	return uint64(ts.Nano())
}

// SetReadDeadline implements DeadlineSource (t in CLOCK_MONOTONIC ns; 0
// clears it).
func (l *Live) SetReadDeadline(t uint64) error {
	l.deadline = t
	return nil
}

// Wake makes a pending or the next Read return trace.ErrDeadline at once.
func (l *Live) Wake() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Read returns the next event of any source, trace.ErrDeadline at the
// deadline or on Wake, io.EOF once every source ended, an error wrapping
// trace.ErrClosed after Close, or the first source failure.
func (l *Live) Read(ev *trace.Event) error {
	// Fast path: an event already waiting needs no clock or timer.
	select {
	case it := <-l.ch:
		if err := l.item(it, ev); !errors.Is(err, errSourceEnded) {
			return err
		}
	default:
	}
	var tc <-chan time.Time
	if l.deadline != 0 {
		now := l.Now()
		if l.deadline <= now {
			return l.expire(ev)
		}
		l.timer.Reset(time.Duration(l.deadline - now))
		defer l.timer.Stop()
		tc = l.timer.C
	}
	for {
		select {
		case it := <-l.ch:
			err := l.item(it, ev)
			if errors.Is(err, errSourceEnded) {
				continue
			}
			return err
		case <-tc:
			return l.expire(ev)
		case <-l.wake:
			if l.deadline != 0 && l.deadline <= l.Now() {
				return l.expire(ev)
			}
			return trace.ErrDeadline
		case <-l.done:
			return fmt.Errorf("live sources: %w", trace.ErrClosed)
		}
	}
}

// expire reports the passed deadline once the events the Flusher sources
// had produced by then are read: it runs a flush round that began after
// the deadline and returns the events that come meanwhile first, one per
// call.
func (l *Live) expire(ev *trace.Event) error {
	for {
		if !l.flushing {
			l.flushing, l.flushStart = true, l.Now()
			for i, s := range l.srcs {
				l.flushed[i] = 0
				if f, ok := s.(Flusher); ok {
					l.pending++
					go func() {
						n, err := f.Flush()
						l.flushRes <- flushResult{i, n, err}
					}()
				}
			}
		}
		if l.pending == 0 && l.caughtUp() {
			l.flushing = false
			if l.flushStart >= l.deadline {
				return trace.ErrDeadline
			}
			continue // a round begun before this deadline: another one
		}
		select {
		case r := <-l.flushRes:
			l.pending--
			// A source that cannot flush (closing) is not waited for.
			if r.err == nil {
				l.flushed[r.src] = r.n
			}
		case it := <-l.ch:
			if err := l.item(it, ev); !errors.Is(err, errSourceEnded) {
				return err
			}
		case <-l.done:
			return fmt.Errorf("live sources: %w", trace.ErrClosed)
		}
	}
}

// caughtUp reports whether Read has returned every flushed event.
func (l *Live) caughtUp() bool {
	for i := range l.srcs {
		if !l.over[i] && l.read[i] < l.flushed[i] {
			return false
		}
	}
	return true
}

var errSourceEnded = errors.New("source ended")

func (l *Live) item(it liveItem, ev *trace.Event) error {
	switch {
	case it.err == nil:
		*ev = it.ev
		l.read[it.src]++
		return nil
	case errors.Is(it.err, io.EOF):
		l.over[it.src] = true // nothing more will come
		l.ended++
		if l.ended == len(l.srcs) {
			return io.EOF
		}
		return errSourceEnded
	default:
		return it.err
	}
}

// Close closes every source and stops reading; it is idempotent.
func (l *Live) Close() error {
	var errs []error
	l.once.Do(func() {
		close(l.done)
		for _, s := range l.srcs {
			errs = append(errs, s.Close())
		}
		l.wg.Wait()
	})
	return errors.Join(errs...)
}
