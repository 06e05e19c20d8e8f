package sim

import (
	"fmt"
	"math"
	"time"
)

// Mode selects how a GPU's compute engine is shared.
type Mode uint8

// Sharing modes.
const (
	// ModeTimeslice is the hardware's round-robin time-slicing between
	// channel groups (the driver's default behaviour).
	ModeTimeslice Mode = iota
	// ModeSpatial runs every runnable channel group's kernel at once, each
	// slowed by the number of co-runners (MPS-like).
	ModeSpatial
	// ModePriority is ideal per-kernel priority: an LC channel group that
	// becomes runnable preempts a BE one at once (at the modelled
	// granularity), paying only the preemption cost; BE runs only when no
	// LC group is runnable.
	ModePriority
	// ModeRequestPriority is ideal request-aware priority: from the moment
	// an LC process begins a request until the request ends, the BE
	// groups on its GPU are off the compute engine, even while the LC
	// process has no kernel ready (host work, copies, synchronizations).
	// It spares the preemptions ModePriority pays in every gap inside a
	// request, at the cost of leaving the GPU idle in those gaps.
	ModeRequestPriority
)

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case ModeTimeslice:
		return "timeslice"
	case ModeSpatial:
		return "spatial"
	case ModePriority:
		return "priority"
	case ModeRequestPriority:
		return "request-priority"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// Granularity is the compute-preemption granularity: how soon a running
// kernel can be taken off the GPU.
type Granularity uint8

// Preemption granularities.
const (
	// GranularityInstruction preempts at once (compute-instruction-level
	// preemption, Pascal and later): the cost is Options.Preemption.
	GranularityInstruction Granularity = iota
	// GranularityBlock waits for the in-flight thread blocks: the kernel
	// keeps running for up to Options.BlockDrain, then pays Preemption.
	GranularityBlock
	// GranularityKernel never preempts a running kernel: a switch waits
	// for the kernel to complete.
	GranularityKernel
)

// String returns the granularity's name.
func (g Granularity) String() string {
	switch g {
	case GranularityInstruction:
		return "instruction"
	case GranularityBlock:
		return "block"
	case GranularityKernel:
		return "kernel"
	}
	return fmt.Sprintf("granularity(%d)", uint8(g))
}

// Options configures a Simulator. A nil *Options, and every zero field,
// means the default documented on the field (docs/simulator.md gives the
// sources of the defaults).
type Options struct {
	// GPUs is the number of GPUs (default 1, at most 1024).
	GPUs int
	// Mode is how each GPU's compute engine is shared (default timeslice).
	Mode Mode
	// Timeslice is a channel group's default timeslice (default 1024 µs,
	// the NVIDIA driver's default).
	Timeslice time.Duration
	// ContextSwitch is the cost of switching the compute engine from one
	// channel group to another when the outgoing one has no kernel in
	// flight (default 20 µs).
	ContextSwitch time.Duration
	// Preemption is the extra cost of saving a kernel in flight when its
	// channel group is preempted (default 30 µs); the switch to the next
	// group then costs ContextSwitch as usual.
	Preemption time.Duration
	// Granularity is the compute-preemption granularity (default
	// instruction, as on Pascal through Hopper).
	Granularity Granularity
	// BlockDrain is, under GranularityBlock, how long in-flight thread
	// blocks keep running before the save (default 100 µs).
	BlockDrain time.Duration
	// SpatialSlowdown is ModeSpatial's interference: with k kernels
	// co-running on a GPU each progresses at 1/(1+SpatialSlowdown·(k−1))
	// of its exclusive speed (1 is pure processor sharing). 0, like every
	// zero field, means the default, 0.7: for next to no interference give
	// a small positive value such as 0.001. Negative is rejected.
	SpatialSlowdown float64
	// CopyBandwidth is each copy engine's bandwidth in bytes/s (default
	// 25e9, PCIe 4.0 x16 in practice).
	CopyBandwidth float64
	// CopyLatency is a copy's fixed setup cost (default 10 µs).
	CopyLatency time.Duration
	// ControlLatency is how long after an Enforcer call (suspend, resume,
	// timeslice, interleave) it takes effect on the GPU: the driver
	// control's own latency (default 0: at once; negative is rejected).
	ControlLatency time.Duration
	// MaxEvents bounds the event queue; a run that would exceed it stops
	// with an error (default 1<<22).
	MaxEvents int
	// MaxStreamOps bounds the operations queued on one process's stream;
	// a run that would exceed it stops with an error (default 1<<20).
	MaxStreamOps int
	// TimelineWindow records which channel group ran on each GPU from time
	// 0 to this time (0: no timeline).
	TimelineWindow time.Duration
	// MaxTimelineSegments bounds the timeline (default 200000); later
	// segments are dropped and counted.
	MaxTimelineSegments int
	// Observe makes the simulator produce trace events for Read. Off, Read
	// still runs the simulation but delivers nothing until the end.
	Observe bool
}

const (
	defaultTimeslice     = 1024 * time.Microsecond
	defaultContextSwitch = 20 * time.Microsecond
	defaultPreemption    = 30 * time.Microsecond
	defaultBlockDrain    = 100 * time.Microsecond
	defaultSlowdown      = 0.7
	defaultCopyBandwidth = 25e9
	defaultCopyLatency   = 10 * time.Microsecond
	defaultMaxEvents     = 1 << 22
	defaultMaxStreamOps  = 1 << 20
	defaultMaxSegments   = 200000
	maxGPUs              = 1024
)

// config is Options resolved to defaults and nanoseconds.
type config struct {
	gpus                                      int
	mode                                      Mode
	timeslice, ctxSwitch, preempt, blockDrain uint64
	granularity                               Granularity
	slowdown                                  float64
	copyBW                                    float64
	copyLatency                               uint64
	controlLatency                            uint64
	maxEvents, maxStreamOps, maxSegments      int
	window                                    uint64
	observe                                   bool
}

// resolve checks o and fills in defaults.
func (o *Options) resolve() (config, error) {
	if o == nil {
		o = &Options{}
	}
	c := config{
		gpus: o.GPUs, mode: o.Mode, granularity: o.Granularity,
		slowdown: o.SpatialSlowdown, copyBW: o.CopyBandwidth,
		maxEvents: o.MaxEvents, maxStreamOps: o.MaxStreamOps, maxSegments: o.MaxTimelineSegments,
		observe: o.Observe,
	}
	if c.gpus == 0 {
		c.gpus = 1
	}
	if c.gpus < 0 || c.gpus > maxGPUs {
		return c, fmt.Errorf("gpus %d: must be between 1 and %d", o.GPUs, maxGPUs)
	}
	if c.mode > ModeRequestPriority {
		return c, fmt.Errorf("unknown mode %d", c.mode)
	}
	if c.granularity > GranularityKernel {
		return c, fmt.Errorf("unknown preemption granularity %d", c.granularity)
	}
	durs := []struct {
		name string
		v    time.Duration
		def  time.Duration
		dst  *uint64
	}{
		{"timeslice", o.Timeslice, defaultTimeslice, &c.timeslice},
		{"context switch", o.ContextSwitch, defaultContextSwitch, &c.ctxSwitch},
		{"preemption", o.Preemption, defaultPreemption, &c.preempt},
		{"block drain", o.BlockDrain, defaultBlockDrain, &c.blockDrain},
		{"copy latency", o.CopyLatency, defaultCopyLatency, &c.copyLatency},
	}
	for _, d := range durs {
		switch {
		case d.v < 0:
			return c, fmt.Errorf("%s %v: must not be negative", d.name, d.v)
		case d.v == 0:
			*d.dst = uint64(d.def)
		default:
			*d.dst = uint64(d.v)
		}
	}
	if c.slowdown == 0 {
		c.slowdown = defaultSlowdown
	}
	if c.slowdown < 0 || c.slowdown > 100 || math.IsNaN(c.slowdown) {
		return c, fmt.Errorf("spatial slowdown %v: must be between 0 and 100", o.SpatialSlowdown)
	}
	if c.copyBW == 0 {
		c.copyBW = defaultCopyBandwidth
	}
	if !(c.copyBW >= 1e6 && c.copyBW <= 1e13) {
		return c, fmt.Errorf("copy bandwidth %v B/s: must be between 1e6 and 1e13", o.CopyBandwidth)
	}
	for _, b := range []struct {
		name string
		v    *int
		def  int
	}{{"max events", &c.maxEvents, defaultMaxEvents}, {"max stream ops", &c.maxStreamOps, defaultMaxStreamOps},
		{"max timeline segments", &c.maxSegments, defaultMaxSegments}} {
		if *b.v < 0 {
			return c, fmt.Errorf("%s %d: must not be negative", b.name, *b.v)
		}
		if *b.v == 0 {
			*b.v = b.def
		}
	}
	if o.ControlLatency < 0 || o.ControlLatency > time.Hour {
		return c, fmt.Errorf("control latency %v: must be between 0 and 1h", o.ControlLatency)
	}
	c.controlLatency = uint64(o.ControlLatency)
	if o.TimelineWindow < 0 {
		return c, fmt.Errorf("timeline window %v: must not be negative", o.TimelineWindow)
	}
	c.window = uint64(o.TimelineWindow)
	return c, nil
}

// WithDefaults returns a copy of o (nil: the zero Options) with every
// defaulted field filled in, or the error New would return.
func (o *Options) WithDefaults() (Options, error) {
	c, err := o.resolve()
	if err != nil {
		return Options{}, err
	}
	out := Options{}
	if o != nil {
		out = *o
	}
	out.GPUs, out.SpatialSlowdown, out.CopyBandwidth = c.gpus, c.slowdown, c.copyBW
	out.Timeslice, out.ContextSwitch, out.Preemption = time.Duration(c.timeslice), time.Duration(c.ctxSwitch), time.Duration(c.preempt)
	out.BlockDrain, out.CopyLatency = time.Duration(c.blockDrain), time.Duration(c.copyLatency)
	out.MaxEvents, out.MaxStreamOps, out.MaxTimelineSegments = c.maxEvents, c.maxStreamOps, c.maxSegments
	return out, nil
}

// CopyDuration is how long a copy of n bytes takes on a copy engine under
// resolved options (see WithDefaults).
func (o *Options) CopyDuration(n uint64) uint64 {
	return uint64(o.CopyLatency) + uint64(float64(n)/o.CopyBandwidth*1e9)
}
