package policy

import (
	"time"

	"github.com/gpu-arbiter/arbiter/sched"
)

var observeNames = map[string]sched.Observe{
	"launch": sched.ObserveLaunch, "copy": sched.ObserveCopy, "sync": sched.ObserveSync, "rm": sched.ObserveRM,
}

var modeLevels = map[Mode]sched.Level{
	ModeObserve: sched.LevelObserve, ModeTimeslice: sched.LevelTimeslice, ModeSuspend: sched.LevelSuspend, ModeGate: sched.LevelGate,
}

// Compile turns a validated decision into the engine's plan for one
// process. A process with an SLO is latency-critical: its requests are the
// ones others yield to.
func (d Decision) Compile() sched.Plan {
	p := sched.Plan{
		Class: d.Class, Priority: d.Priority, Level: modeLevels[d.Preemption.Mode],
		Timeslice:         time.Duration(d.Preemption.TimesliceUS) * time.Microsecond,
		Interleave:        sched.InterleaveMedium,
		PrePreemptionHint: d.Preemption.PrePreemptionHint,
		MaxGPUShare:       1,
	}
	if d.Preemption.Interleave != "" {
		// The schema admits only the three names.
		p.Interleave, _ = sched.ParseInterleave(d.Preemption.Interleave)
	}
	if d.SLO != nil {
		p.HasSLO, p.LatencyCritical = true, true
		p.LatencyTarget = time.Duration(d.SLO.LatencyTargetMS * float64(time.Millisecond))
		p.Percentile = d.SLO.Percentile
		p.Window = time.Duration(d.SLO.WindowS * float64(time.Second))
	}
	if d.Quota != nil {
		p.MaxGPUShare = d.Quota.MaxGPUShare
	}
	for _, o := range d.Observe {
		p.Observe |= observeNames[o]
	}
	return p
}
