package workload

import "github.com/gpu-arbiter/arbiter/sim"

// Waiting calls f with the arrival time of every request of p's workload
// that arrived before end and that no server had begun by then: requests
// in the workload's queue, and those its servers never took because they
// were busy (or starved of the GPU). It returns how many requests were
// turned away because max_pending were already waiting, and false for
// programs with no requests (BE workloads). The replicas of an LC
// workload share one queue: ask one of them, once. Call it after the run:
// it generates the arrivals the run did not reach.
func Waiting(p sim.Program, end uint64, f func(arrival uint64)) (rejected uint64, ok bool) {
	switch p := p.(type) {
	case *lcProgram:
		d := p.d
		if d.closed {
			return 0, true // its servers send requests only when idle
		}
		d.admit(end, false)
		for _, r := range d.pend[d.ph:] {
			if r.at < end {
				f(r.at)
			}
		}
		return d.rejected, true
	case *replayProgram:
		if !p.lc {
			return 0, false
		}
		for _, op := range p.ops[p.i:] {
			if op.Kind == sim.OpBegin && op.At < end {
				f(op.At)
			}
		}
		return 0, true
	}
	return 0, false
}
