// Package engine holds Arbiter's scheduling engine: the process table,
// request and SLO tracking and the preemption planner.
//
// The engine sees the world only through two interfaces defined here, so that
// the same engine code runs in the live daemon and in the simulator:
//
//   - a Source delivers observed trace.Event values in time order (the live
//     eBPF tracer, a replayed trace file, or the simulated GPU), together with
//     a Clock that tells the engine what time it is in the events' timebase;
//   - an Enforcer carries out the engine's decisions at the enforcement levels
//     of the architecture (channel-group timeslice and interleave level,
//     channel-group suspend/resume, the launch gate).
//
// The engine never reads the wall clock: every time it uses comes from event
// timestamps or from the Clock. This is what lets the simulator drive it
// deterministically on virtual time.
package engine
