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
// are real time. Wake makes a blocked Read return at once (the engine
// then runs work posted to it).
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
}

type liveItem struct {
	ev  trace.Event
	err error
}

// liveBuffer is how many events may wait between the sources' readers and
// the engine.
const liveBuffer = 1 << 14

// NewLive starts reading srcs.
func NewLive(srcs ...Source) *Live {
	l := &Live{srcs: srcs, ch: make(chan liveItem, liveBuffer), wake: make(chan struct{}, 1), done: make(chan struct{}),
		timer: time.NewTimer(time.Hour)}
	l.timer.Stop()
	for _, s := range srcs {
		l.wg.Add(1)
		go l.pump(s)
	}
	return l
}

func (l *Live) pump(s Source) {
	defer l.wg.Done()
	for {
		var it liveItem
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
			select {
			case it := <-l.ch:
				return l.item(it, ev)
			default:
				return trace.ErrDeadline
			}
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
			return trace.ErrDeadline
		case <-l.wake:
			return trace.ErrDeadline
		case <-l.done:
			return fmt.Errorf("live sources: %w", trace.ErrClosed)
		}
	}
}

var errSourceEnded = errors.New("source ended")

func (l *Live) item(it liveItem, ev *trace.Event) error {
	switch {
	case it.err == nil:
		*ev = it.ev
		return nil
	case errors.Is(it.err, io.EOF):
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
