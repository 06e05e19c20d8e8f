package engine

import "github.com/gpu-arbiter/arbiter/sched"

// ChannelController controls a process's channel groups (TSGs) through the
// GPU driver: enforcement levels "timeslice" and "suspend". gpu is the
// device index in the order the driver enumerates devices (the NVML index).
//
// Common contract for every method:
//   - On nil return, the stated postcondition holds when the call returns.
//     On error nothing is guaranteed changed, and the error says which
//     process, GPU and control failed; the caller may retry.
//   - Every method is idempotent: repeating a call with the same arguments is
//     harmless and returns nil.
//   - A pid unknown to the controller (not a CUDA process, or its channel
//     handles were never observed) is an error, never a guess.
//   - Methods are safe for concurrent use and never block on the target
//     process (no waiting for its kernels to finish).
type ChannelController interface {
	// SetTimeslice sets the timeslice of every channel group of pid on gpu
	// to us microseconds (the driver may round it down to what the hardware
	// supports). Afterwards, whenever another channel group is runnable on
	// that GPU, pid's group is preempted at most us (plus the preemption
	// cost) after it was scheduled in. us must be > 0.
	SetTimeslice(pid uint32, gpu int, us uint64) error
	// SetInterleave sets the runlist interleave level of every channel group
	// of pid on every GPU it uses. Afterwards its groups get the runlist
	// share of that level.
	SetInterleave(pid uint32, level sched.Interleave) error
	// Suspend takes every channel group of pid on gpu off that GPU's
	// runlist and preempts any of its work running there. Afterwards none of
	// pid's work executes on gpu until Resume; its queued work is kept, not
	// lost. The process itself keeps running on the CPU and may queue more.
	// Suspending a suspended process is a no-op.
	Suspend(pid uint32, gpu int) error
	// Resume undoes Suspend: afterwards pid's channel groups on gpu are back
	// on the runlist and their queued work runs again. Resuming a process
	// that is not suspended is a no-op.
	Resume(pid uint32, gpu int) error
}

// TimesliceResetter is a ChannelController that can give a process the
// driver's default timeslice back and stop keeping one on it: afterwards
// pid's channel groups on gpu have the driver's default, and those it
// makes later, and the timeslices it sets itself, are left alone. The
// engine uses it, where the enforcer has it, instead of setting the
// default with SetTimeslice, which would keep that.
type TimesliceResetter interface {
	ResetTimeslice(pid uint32, gpu int) error
}

// Gater is the launch gate, the enforcement level for processes whose
// channels cannot be controlled: it stops the process at its next kernel
// launch. Work already submitted keeps running to completion, so this is the
// weakest preemption.
type Gater interface {
	// Gate closes pid's gate: afterwards pid submits no new work; a thread
	// calling a launch function is stopped there until Ungate.
	Gate(pid uint32) error
	// Ungate opens pid's gate: afterwards pid runs and submits freely.
	// Ungating an open gate is a no-op. An implementation must make sure no
	// process stays gated after the daemon exits (see ARCHITECTURE.md).
	Ungate(pid uint32) error
}

// Enforcer carries out the engine's decisions at every enforcement level.
// The live daemon composes it from the driver channel controller (package
// nvrm) and the launch gate (package uprobe); the simulator implements all
// of it on its simulated GPUs.
type Enforcer interface {
	ChannelController
	Gater
}
