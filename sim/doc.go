// Package sim is a discrete-event model of GPUs shared by CUDA processes, for
// what-if comparisons of scheduling policies and as a deterministic closed
// loop for the engine.
//
// Each simulated process has a host program (a Program: launches, copies,
// synchronizations, sleeps, request boundaries), one stream, and one channel
// group (TSG) on its GPU with a timeslice and an interleave level. A GPU has
// one compute engine, scheduled by round-robin over a runlist of the
// runnable channel groups (or shared spatially, MPS-like, or by ideal
// per-kernel or request-aware priority, per Options.Mode), and two copy
// engines (host-to-device and device-to-host) that serve copies in FIFO
// order independently of compute. Context switches and preemptions cost
// modelled time. A burst of kernels launched together runs as one piece
// of work, so a run's cost grows with the engine's decisions rather than
// with its kernels.
//
// Time is virtual (nanoseconds from 0), kept by one event queue ordered by
// time and then by insertion order, so a run is a pure function of its
// inputs: no goroutines, no wall clock, no map iteration on any path that
// changes state.
//
// A Simulator is also an engine.Source (Read delivers the trace.Event values
// a live tracer would see: exec, launch, copy, sync) with engine.Clock and
// engine.DeadlineSource on virtual time, and an engine.Enforcer over its
// channel groups, so a controller can close the loop: reading advances the
// simulation to the next event, and enforcement takes effect at that
// virtual instant.
package sim
