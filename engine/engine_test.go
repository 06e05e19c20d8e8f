package engine_test

import (
	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// The live tracer is an event source as it is, one that flushes.
var (
	_ engine.Source  = (*uprobe.Tracer)(nil)
	_ engine.Flusher = (*uprobe.Tracer)(nil)
)

// The simulator is an event source with a clock and read deadlines, and an
// enforcer, as it is.
var (
	_ engine.DeadlineSource = (*sim.Simulator)(nil)
	_ engine.Enforcer       = (*sim.Simulator)(nil)
)
