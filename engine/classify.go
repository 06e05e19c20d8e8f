package engine

import (
	"errors"

	"github.com/gpu-arbiter/arbiter/sched"
)

// ProcessInfo is what the engine knows of a CUDA process when it asks for
// its class: the classifier looks up the rest (its command line, user,
// cgroup path, pod) itself.
type ProcessInfo struct {
	Key sched.ProcessKey
	// Comm is the name from the process's exec event, "" when the process
	// was already running when the engine started.
	Comm string
	// Cgroup is the cgroup id of its first observed event.
	Cgroup uint64
	// GPUs are the devices it uses, as far as known.
	GPUs []int
}

// Classifier decides a process's plan: its class, SLO and the strongest
// enforcement its policy allows. The engine calls it once per new process
// and, for every live process, after Reclassify; never per event.
//
// On error the returned plan is still used: it must be the policy's
// default decision, marked Fallback, and the error says why the policy's
// own decision was not (the engine records both).
type Classifier interface {
	Classify(p ProcessInfo) (sched.Plan, string, error)
}

// ClassifierFunc adapts a function to Classifier.
type ClassifierFunc func(p ProcessInfo) (sched.Plan, string, error)

// Classify calls f.
func (f ClassifierFunc) Classify(p ProcessInfo) (sched.Plan, string, error) { return f(p) }

// VictimChooser is the policy's control-loop entry point: which
// best-effort processes yield to latency-critical requests and which are
// throttled. The engine calls it at control-loop rate with the state it
// would act in (every GPU that has latency-critical work is listed as
// busy), caches the answer and applies it on the fast path.
//
// An error means the decision could not be used (it failed its schema or
// its evaluation): the engine then falls back to its default choice,
// every best-effort process at suspend or gate level on a busy GPU, and
// records the error. ErrDefaultChoice instead asks for the default
// choice without a failure: a chooser whose policy in force has no
// control-loop rule (policies change while the engine runs).
type VictimChooser interface {
	Victims(s ControlState) (Victims, error)
}

// ErrDefaultChoice is what a VictimChooser returns to leave this round to
// the engine's default choice, as if it had no chooser: nothing is
// recorded as failed and no process stays throttled.
var ErrDefaultChoice = errors.New("no victims rule: the engine's default choice applies")

// ControlState is what the victim chooser sees.
type ControlState struct {
	// Time is the engine's clock, nanoseconds in its source's timebase.
	Time      uint64
	Processes []ControlProcess
	// Busy lists, per latency-critical process and GPU, where its requests
	// run; Active is set for a request in flight now.
	Busy []BusyGPU
	// SLO is each class's attainment over its window.
	SLO map[string]ClassSLO
}

// ControlProcess is one managed process in ControlState.
type ControlProcess struct {
	PID       uint32
	Comm      string
	Class     string
	Priority  int
	Level     sched.Level
	GPUs      []int
	Suspended bool
	// GPUShare is its measured share of the GPU's time over the last
	// control interval, where known (0 otherwise).
	GPUShare float64
}

// BusyGPU is a latency-critical process's GPU.
type BusyGPU struct {
	PID    uint32
	Class  string
	GPU    int
	Active bool
	// AgeNS is how long its current request has run (0 when idle).
	AgeNS uint64
}

// ClassSLO is a class's SLO attainment.
type ClassSLO struct {
	Attainment float64 // fraction of requests within target, 0..1
	Target     float64 // the objective's fraction, 0..1
	Latency    uint64  // the objective's latency, ns
	Requests   uint64  // requests in the window
}

// Victims is a victim chooser's answer.
type Victims struct {
	Suspend  []Suspension
	Throttle []Throttle
}

// Suspension names a process to take off the given GPUs (all of its own
// when GPUs is empty) while a latency-critical request is active there.
type Suspension struct {
	PID    uint32
	GPUs   []int
	Reason string
}

// Throttle caps a process's GPU-time share until the next decision.
type Throttle struct {
	PID         uint32
	MaxGPUShare float64
	Reason      string
}

// Support is implemented by enforcers that know, per process, which
// enforcement the node can apply to it: channel control needs the
// process's driver handles; the launch gate needs its launch probe. The
// engine then plans each process at the strongest level that both its
// policy allows and the node supports, and shows why not stronger.
// Without it, every level is assumed supported.
type Support interface {
	// Strongest returns the strongest level enforceable on pid (LevelGate
	// where only the gate works) and, when it is not LevelSuspend, why.
	Strongest(pid uint32) (sched.Level, string)
}

// Placement tells the engine which GPUs a process uses (the driver trace
// or NVML knows; the simulator places every process itself). Without it,
// every process is taken to use GPU 0.
type Placement interface {
	GPUs(pid uint32) []int
}
