// Package sched holds the words every part of Arbiter uses for scheduling a
// GPU: interleave levels, enforcement levels, the identity of a GPU and of a
// process, and the per-process plan a policy decision compiles into.
//
// It is a leaf: it imports only the standard library, so the engine, the
// mechanisms that enforce its decisions (nvrm, uprobe), the simulator and the
// policy all speak it without depending on one another. A value means the
// same thing in each of them: an Interleave is the driver's own number, a
// Level names the same enforcement in the policy, the planner and the
// console.
package sched

import (
	"fmt"
	"time"
)

// Interleave is a channel group's runlist interleave level: how many of the
// GPU's round-robin runlist slots the group gets relative to others. Values
// are the NVIDIA Resource Manager's (NVA06C_CTRL_INTERLEAVE_LEVEL_*); the
// zero value is "low", and the driver gives every new group "medium".
type Interleave uint32

// Interleave levels.
const (
	InterleaveLow    Interleave = 0
	InterleaveMedium Interleave = 1 // the driver's default
	InterleaveHigh   Interleave = 2
)

// Valid reports whether l is one of the three levels.
func (l Interleave) Valid() bool { return l <= InterleaveHigh }

// String returns "low", "medium" or "high".
func (l Interleave) String() string {
	switch l {
	case InterleaveLow:
		return "low"
	case InterleaveMedium:
		return "medium"
	case InterleaveHigh:
		return "high"
	}
	return fmt.Sprintf("interleave(%d)", uint32(l))
}

// ParseInterleave accepts "low", "medium", "high" or 0, 1, 2.
func ParseInterleave(s string) (Interleave, error) {
	switch s {
	case "low", "0":
		return InterleaveLow, nil
	case "medium", "1":
		return InterleaveMedium, nil
	case "high", "2":
		return InterleaveHigh, nil
	}
	return 0, fmt.Errorf("interleave level %q: want low, medium or high", s)
}

// Level is an enforcement level (ARCHITECTURE.md, "Enforcement"). The
// order is the planner's: a process is enforced at the strongest level its
// policy allows and the node supports for it, and Gate stands in for
// Suspend where a process's channel groups cannot be controlled.
type Level uint8

// Enforcement levels, weakest first.
const (
	// LevelObserve takes no action.
	LevelObserve Level = iota
	// LevelTimeslice sets channel-group timeslices and interleave levels
	// when a process is classified (a short best-effort timeslice only
	// while latency-critical work shares the GPU).
	LevelTimeslice
	// LevelSuspend takes best-effort channel groups off a GPU while a
	// latency-critical request is active on it.
	LevelSuspend
	// LevelGate stops a best-effort process at its next kernel launch
	// instead: in-flight work still finishes.
	LevelGate
)

var levelNames = [...]string{"observe", "timeslice", "suspend", "gate"}

// String returns the level's name as policies write it.
func (l Level) String() string {
	if int(l) < len(levelNames) {
		return levelNames[l]
	}
	return fmt.Sprintf("level(%d)", uint8(l))
}

// ParseLevel accepts a level's name; the empty string is LevelObserve.
func ParseLevel(s string) (Level, error) {
	if s == "" {
		return LevelObserve, nil
	}
	for i, n := range levelNames {
		if n == s {
			return Level(i), nil
		}
	}
	return 0, fmt.Errorf("enforcement level %q: want observe, timeslice, suspend or gate", s)
}

// MarshalText writes the level's name.
func (l Level) MarshalText() ([]byte, error) {
	if int(l) >= len(levelNames) {
		return nil, fmt.Errorf("enforcement level %d out of range", uint8(l))
	}
	return []byte(levelNames[l]), nil
}

// UnmarshalText reads a level's name.
func (l *Level) UnmarshalText(b []byte) error {
	v, err := ParseLevel(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// GPU identifies one device: its index in the order the driver enumerates
// devices (the NVML index, the one channel control takes) and its UUID,
// which stays the same across reboots and is what metrics label.
type GPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid,omitempty"`
}

// String returns "gpu0" or "gpu0 (GPU-…)".
func (g GPU) String() string {
	if g.UUID == "" {
		return fmt.Sprintf("gpu%d", g.Index)
	}
	return fmt.Sprintf("gpu%d (%s)", g.Index, g.UUID)
}

// ProcessKey identifies one process over its whole life: a pid alone is
// reused, a pid with its start time (field 22 of /proc/PID/stat, clock
// ticks since boot) is not. A Start of 0 means "not known": such a key
// matches by pid alone.
type ProcessKey struct {
	PID   uint32 `json:"pid"`
	Start uint64 `json:"start,omitempty"`
}

// Same reports whether k and o name the same process.
func (k ProcessKey) Same(o ProcessKey) bool {
	return k.PID == o.PID && (k.Start == 0 || o.Start == 0 || k.Start == o.Start)
}

// Observe is a set of driver-call kinds to trace, as a bit mask the probe
// planner reads directly.
type Observe uint8

// Observe bits.
const (
	ObserveLaunch Observe = 1 << iota
	ObserveCopy
	ObserveSync
	ObserveRM
)

// Plan is one process's policy decision compiled for the engine's fast
// path: plain values, units resolved, nothing to parse.
type Plan struct {
	Class    string
	Priority int
	// Level is the strongest enforcement the policy allows for the
	// process; the planner may use a weaker one the node supports.
	Level Level
	// Timeslice of its channel groups (0: leave the driver's).
	Timeslice  time.Duration
	Interleave Interleave
	// PrePreemptionHint: preempt best-effort work at this process's first
	// driver call of a request, not at its first kernel.
	PrePreemptionHint bool
	// LatencyCritical marks a process whose requests others yield to.
	LatencyCritical bool
	// SLO: requests within LatencyTarget at Percentile (0..100) over
	// Window. HasSLO is false when the policy set none.
	HasSLO        bool
	LatencyTarget time.Duration
	Percentile    float64
	Window        time.Duration
	// MaxGPUShare caps the GPU-time share of the process's class over its
	// window (1: no quota).
	MaxGPUShare float64
	Observe     Observe
	// Fallback is set when the policy's own decision could not be used and
	// this is its default.
	Fallback bool
}
