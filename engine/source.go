package engine

import (
	"github.com/gpu-arbiter/arbiter/trace"
)

// Source delivers observed events to the engine.
//
// Contract:
//   - Read fills ev with the next event and returns nil, blocking until one
//     is available. Events arrive in non-decreasing Time order per process;
//     a source that merges several producers (per-CPU ring buffers) may
//     deliver events of different processes slightly out of order, and the
//     engine tolerates that.
//   - Read returns io.EOF when the source has ended cleanly (a replayed file
//     or a simulation reached its end) and an error wrapping trace.ErrClosed
//     once Close has been called. Any other error is a failure of the
//     source; it wraps the cause.
//   - ev is overwritten completely by every successful Read; the source keeps
//     no reference to it, so the caller may reuse one Event for every call.
//   - Close is idempotent and unblocks a pending Read. Read and Close may be
//     called from different goroutines; Read itself is called from one
//     goroutine at a time.
//
// uprobe.Tracer satisfies this interface as it is (pinned by a test); a
// trace.Reader needs only a Close that does nothing; the simulator
// implements it on virtual time.
type Source interface {
	Read(ev *trace.Event) error
	Close() error
}

// Clock tells the engine the current time in the timebase of its Source's
// events: nanoseconds of CLOCK_MONOTONIC for the live tracer, virtual
// nanoseconds for the simulator. The engine takes every "now" it needs from
// here or from event timestamps, never from time.Now.
type Clock interface {
	// Now returns the current time in nanoseconds; it never goes backwards.
	Now() uint64
}

// DeadlineSource is a Source that can also wake its reader at a given time
// with no event, which the engine needs for timers (an LC request ends after
// an idle gap; a suspended BE process is resumed when that gap has passed).
//
// SetReadDeadline makes every later Read that would otherwise block past t
// (in Clock time) return trace.ErrDeadline at t instead. A t of 0 clears the
// deadline. A deadline at or before the current time makes the next Read
// return trace.ErrDeadline at once unless an event is already pending (pending
// events are delivered first). The simulator implements this on virtual
// time, so a deadline costs no wall-clock time there.
type DeadlineSource interface {
	Source
	Clock
	SetReadDeadline(t uint64) error
}
