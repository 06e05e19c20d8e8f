package sim

import "github.com/gpu-arbiter/arbiter/sim/hist"

// ProcStats is what one process did in a run.
type ProcStats struct {
	PID   uint32
	Name  string
	Class Class
	GPU   int
	// KernelsSubmitted = KernelsCompleted + KernelsInFlight always holds:
	// no kernel is lost.
	KernelsSubmitted uint64
	KernelsCompleted uint64
	KernelsInFlight  uint64
	// CompletedWork is the exclusive duration (ns) of the completed kernels.
	CompletedWork uint64
	// GPUTime is the kernel work done (exclusive-equivalent ns), completed
	// kernels and partial progress of those in flight.
	GPUTime uint64
	// Copies and Syncs completed.
	Copies uint64
	Syncs  uint64
	// Requests completed; RequestsBegun counts those started, so at most
	// one more than Requests; when it is one more, InServiceSince is the
	// arrival time of the request still in service.
	Requests       uint64
	RequestsBegun  uint64
	InServiceSince uint64
	// Preempted counts how often a kernel of this process was saved off the
	// GPU mid-flight.
	Preempted uint64
	// Latency is the request latency distribution (ns), arrival to the
	// return of the request's last synchronization.
	Latency *hist.Histogram
}

// GPUStats is what one GPU's engines did in a run.
type GPUStats struct {
	// Busy is the time (ns) the compute engine executed kernels.
	Busy uint64
	// SwitchTime and PreemptTime are spent loading and saving contexts.
	SwitchTime  uint64
	PreemptTime uint64
	// Switches counts context loads, Preemptions kernels saved mid-flight.
	Switches    uint64
	Preemptions uint64
	// CopyTime is the time each copy engine (host-to-device, device-to-host)
	// was given work.
	CopyTime [2]uint64
}

// SegmentKind says what a GPU's compute engine did during a Segment.
type SegmentKind uint8

// Segment kinds.
const (
	SegmentRun     SegmentKind = iota // PID's kernels executed
	SegmentSwitch                     // PID's context was loaded
	SegmentPreempt                    // a preempted context was saved
)

// Segment is one stretch of the timeline of a GPU's compute engine.
type Segment struct {
	GPU        int
	PID        uint32
	Kind       SegmentKind
	Start, End uint64
}

// Stats is the outcome of a run.
type Stats struct {
	// End is the virtual time the run reached.
	End   uint64
	Procs []ProcStats
	GPUs  []GPUStats
	// Timeline holds the segments within Options.TimelineWindow: in time
	// order per GPU, not overlapping, except in spatial mode, where each
	// process's co-running intervals are recorded and overlap;
	// TimelineDropped counts segments past MaxTimelineSegments.
	Timeline        []Segment
	TimelineDropped uint64
}

// Stats returns the run's statistics so far (after Run: the final ones).
// Mid-run, a save or a context switch that has ended counts (in time and
// in the timeline) once the segment after it is recorded, and a switch
// chosen to follow a save in progress counts already.
func (s *Simulator) Stats() Stats {
	st := Stats{End: s.now, Timeline: s.timeline, TimelineDropped: s.dropped}
	for _, p := range s.procs {
		ps := p.st
		ps.PID, ps.Name, ps.Class, ps.GPU = p.pid, p.name, p.class, p.gpu
		ps.KernelsInFlight = uint64(p.kernels)
		if !p.empty() && p.head().kind == OpKernel {
			// A burst part way: its kernels that ended are done.
			n, work := p.head().kernelsDone()
			s.checkBurst(p, p.head())
			ps.KernelsCompleted += n
			ps.CompletedWork += work
			ps.KernelsInFlight -= n
		}
		if p.inReq {
			ps.InServiceSince = p.arrival
		}
		ps.Latency = &p.lat
		st.Procs = append(st.Procs, ps)
	}
	for _, g := range s.gpus {
		st.GPUs = append(st.GPUs, g.st)
	}
	return st
}
