package trace

import "errors"

// Errors every event source shares, whatever produces its events (the
// eBPF tracers, a trace file, the simulator). A source's own errors wrap
// them, so a reader tells "closed" and "deadline" apart with errors.Is
// without knowing which source it reads.
var (
	// ErrClosed: the source was closed; no more events will come.
	ErrClosed = errors.New("event source closed")
	// ErrDeadline: the read deadline passed with no event. The source's
	// clock then reads at least the deadline.
	ErrDeadline = errors.New("read deadline reached")
)
