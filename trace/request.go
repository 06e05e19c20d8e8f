package trace

import "time"

// Request is one request of a process: a busy period of its driver calls,
// from the entry of the first to the latest end (entry, plus the duration
// of a synchronizing call). Times are Event.Time nanoseconds.
type Request struct {
	Start, End uint64
}

// Latency returns the request's duration in nanoseconds.
func (r Request) Latency() uint64 { return r.End - r.Start }

// RequestTracker follows one process's requests (ARCHITECTURE.md,
// "Requests and SLOs"): a request opens at the first driver call after an
// idle gap and grows with every call until the process goes idle. It is the
// one place that rule lives: the engine, the trace command's summary and the
// simulator's scripted controller each keep one per process.
//
// The tracker decides what a call does to the request and when the process
// will be idle if no call comes (Deadline); whoever owns the clock decides
// when that time has come and calls End: the engine on its timers, the
// summary when a later call of the process starts past the deadline, the
// scripted controller on its read deadlines. Calls may arrive slightly out
// of time order (a synchronizing call is reported at its return with the
// time it entered): a call never moves the request's end back.
//
// The zero value never goes idle on its own; NewRequestTracker sets the
// gaps. A RequestTracker is not safe for concurrent use.
type RequestTracker struct {
	idleGap, timeout uint64
	active           bool
	// afterSync: the latest call was a synchronization (its return can
	// start the idle gap).
	afterSync  bool
	start, end uint64
}

// NewRequestTracker returns a tracker whose process is idle once idleGap
// has passed after its latest call's end with no new call, where that call
// was a synchronization; after a launch or copy (no synchronization since)
// once timeout has passed, or, with timeout zero, never: only a
// synchronization's return can start the gap then. Negative durations
// count as zero.
func NewRequestTracker(idleGap, timeout time.Duration) RequestTracker {
	return RequestTracker{idleGap: uint64(max(idleGap, 0)), timeout: uint64(max(timeout, 0))}
}

// Call applies a driver call (launch, copy or synchronization; other kinds
// are ignored): it opens a request if none is open and reports whether it
// did, or else extends the open one.
func (t *RequestTracker) Call(ev *Event) (opened bool) {
	end := ev.Time
	switch ev.Kind {
	case KindSync:
		end += ev.Sync.Duration
	case KindLaunch, KindCopy:
	default:
		return false
	}
	t.afterSync = ev.Kind == KindSync
	if !t.active {
		t.active, t.start, t.end = true, ev.Time, end
		return true
	}
	t.start = min(t.start, ev.Time)
	t.end = max(t.end, end)
	return false
}

// Active reports whether a request is open.
func (t *RequestTracker) Active() bool { return t.active }

// Current returns the open request so far (zero when none is open).
func (t *RequestTracker) Current() Request {
	if !t.active {
		return Request{}
	}
	return Request{Start: t.start, End: t.end}
}

// Deadline returns when the open request's process goes idle if no call
// comes before, and false when no request is open or none will end without
// a call (a launch or copy last, and no timeout).
func (t *RequestTracker) Deadline() (uint64, bool) {
	switch {
	case !t.active:
		return 0, false
	case t.afterSync:
		return t.end + t.idleGap, true
	case t.timeout > 0:
		return t.end + t.timeout, true
	}
	return 0, false
}

// End closes the open request and returns it (zero when none was open).
func (t *RequestTracker) End() Request {
	r := t.Current()
	t.active = false
	return r
}
