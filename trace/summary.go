package trace

import (
	"cmp"
	"slices"
	"time"
)

// DefaultIdleGap is the idle time that separates two requests of a process
// when SummaryOptions leaves IdleGap zero.
const DefaultIdleGap = 2 * time.Millisecond

// SummaryOptions configures a Summary. A nil *SummaryOptions means defaults.
type SummaryOptions struct {
	// IdleGap is how long a process must make no driver call (launch, copy
	// or synchronizing call, counted to the call's return) for its next call
	// to start a new request. Zero means DefaultIdleGap.
	IdleGap time.Duration
}

// Summary accumulates per-process figures from a stream of events: launch
// counts and rates, copies and their bytes, synchronizing calls and the time
// spent in them, and requests, the busy periods separated by idle gaps that
// ARCHITECTURE.md defines. It is not safe for concurrent use.
type Summary struct {
	gap   uint64
	procs map[uint32]*summarized
}

// summarized is one process's figures and its requests so far.
type summarized struct {
	ProcessSummary
	req RequestTracker
}

// ProcessSummary is what a Summary knows about one process. Times are
// CLOCK_MONOTONIC nanoseconds as in Event.Time; durations are nanoseconds.
type ProcessSummary struct {
	PID uint32
	// Comm is the process name from its exec event or SetComm ("" if unknown).
	Comm string
	// Launches counts launch events; Copies counts copies, CopyBytes their
	// bytes, HtoDBytes and DtoHBytes the bytes per direction.
	Launches  uint64
	Copies    uint64
	CopyBytes uint64
	HtoDBytes uint64
	DtoHBytes uint64
	// Syncs counts synchronizing calls; SyncTime is their total duration,
	// MaxSync the longest; SyncErrors counts those that returned non-zero.
	Syncs      uint64
	SyncTime   uint64
	MaxSync    uint64
	SyncErrors uint64
	// Requests counts busy periods: runs of driver calls none of which
	// starts more than the idle gap after the previous ones ended.
	Requests uint64
	// First and Last are the entry time of the first driver call and the end
	// (entry plus duration) of the latest; both 0 before any driver call.
	First uint64
	Last  uint64
	// Exited is set by an exit event, with the process's ExitCode.
	Exited   bool
	ExitCode int32
}

// NewSummary returns an empty Summary.
func NewSummary(opts *SummaryOptions) *Summary {
	gap := DefaultIdleGap
	if opts != nil && opts.IdleGap > 0 {
		gap = opts.IdleGap
	}
	return &Summary{gap: uint64(gap), procs: map[uint32]*summarized{}}
}

// IdleGap returns the gap that separates requests.
func (s *Summary) IdleGap() time.Duration { return time.Duration(s.gap) }

// Add accounts for one event.
func (s *Summary) Add(ev *Event) {
	p := s.proc(ev.PID)
	switch ev.Kind {
	case KindLaunch:
		p.Launches++
	case KindCopy:
		p.Copies++
		p.CopyBytes += ev.Copy.Bytes
		switch ev.Copy.Dir {
		case CopyHtoD:
			p.HtoDBytes += ev.Copy.Bytes
		case CopyDtoH:
			p.DtoHBytes += ev.Copy.Bytes
		}
	case KindSync:
		p.Syncs++
		p.SyncTime += ev.Sync.Duration
		p.MaxSync = max(p.MaxSync, ev.Sync.Duration)
		if ev.Sync.Result != 0 {
			p.SyncErrors++
		}
	case KindExec:
		p.Comm = ev.Proc.CommString()
		return
	case KindExit:
		p.Exited, p.ExitCode = true, ev.Proc.ExitCode
		if p.Comm == "" {
			p.Comm = ev.Proc.CommString()
		}
		return
	default:
		return
	}
	// A driver call: extend the current busy period or start a new one.
	// With no clock but the events', a request ends when a call of the
	// process starts more than the gap after everything seen so far (the
	// tracker's deadline); a call at the gap exactly is not yet idle.
	if d, ok := p.req.Deadline(); ok && ev.Time > d {
		p.req.End()
	}
	if p.req.Call(ev) {
		if p.Requests == 0 {
			p.First = ev.Time
		}
		p.Requests++
	}
	r := p.req.Current()
	p.First = min(p.First, r.Start)
	p.Last = max(p.Last, r.End)
}

// SetComm names a process whose exec was not observed (for example from
// /proc/PID/comm). An exec event later overrides it.
func (s *Summary) SetComm(pid uint32, comm string) { s.proc(pid).Comm = comm }

// Process returns the summary of pid, or false if no event of it was added.
func (s *Summary) Process(pid uint32) (ProcessSummary, bool) {
	p, ok := s.procs[pid]
	if !ok {
		return ProcessSummary{}, false
	}
	return p.ProcessSummary, true
}

// Processes returns every process seen, by ascending PID.
func (s *Summary) Processes() []ProcessSummary {
	out := make([]ProcessSummary, 0, len(s.procs))
	for _, p := range s.procs {
		out = append(out, p.ProcessSummary)
	}
	slices.SortFunc(out, func(a, b ProcessSummary) int { return cmp.Compare(a.PID, b.PID) })
	return out
}

func (s *Summary) proc(pid uint32) *summarized {
	p := s.procs[pid]
	if p == nil {
		// Without timers, a launch or copy ends a request after the
		// same gap as a synchronization.
		p = &summarized{ProcessSummary: ProcessSummary{PID: pid}, req: NewRequestTracker(time.Duration(s.gap), time.Duration(s.gap))}
		s.procs[pid] = p
	}
	return p
}

// Active returns the time from the first driver call to the end of the last.
func (p *ProcessSummary) Active() time.Duration { return time.Duration(p.Last - p.First) }

// MinRateWindow is the least activity a rate is computed over: launches per
// second of a process active for a millisecond extrapolate one burst to a
// second and mean nothing.
const MinRateWindow = time.Second

// LaunchRate returns launches per second over the active time, and false
// (with 0) when the process was active for less than MinRateWindow.
func (p *ProcessSummary) LaunchRate() (float64, bool) {
	if p.Last < p.First || p.Active() < MinRateWindow {
		return 0, false
	}
	return float64(p.Launches) / p.Active().Seconds(), true
}
