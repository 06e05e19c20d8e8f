package sim

import (
	"fmt"
	"time"

	"github.com/gpu-arbiter/arbiter/sched"
)

// lookup finds a process by pid and checks the GPU it is addressed on.
func (s *Simulator) lookup(pid uint32, gpu int, what string) (*proc, error) {
	i := int(pid) - FirstPID
	if pid < FirstPID || i >= len(s.procs) {
		return nil, fmt.Errorf("%s: unknown pid %d", what, pid)
	}
	p := s.procs[i]
	if gpu >= 0 && gpu != p.gpu {
		return nil, fmt.Errorf("%s: pid %d has no channel group on gpu %d (it runs on gpu %d)", what, pid, gpu, p.gpu)
	}
	return p, nil
}

// control applies an enforcement action now, or after ControlLatency.
// Actions of equal latency keep their call order. With a latency the
// engine.Enforcer postcondition holds that long after the call, as if the
// call had blocked that long in the driver (the real controls do block);
// the controller itself is not held up.
func (s *Simulator) control(f func()) error {
	if s.cfg.controlLatency == 0 {
		f()
		return s.err
	}
	if !s.room() {
		return s.err
	}
	at := ctlEvent{t: s.now + s.cfg.controlLatency, seq: s.q.next()}
	s.controls, s.ctlAt = append(s.controls, f), append(s.ctlAt, at)
	if len(s.controls)-s.ctlHead == 1 {
		s.q.set(s.ctlSrc, at.t, at.seq)
	}
	return s.err
}

// ctlEvent is when a waiting enforcement action is due: its time and
// the order it was scheduled in, among all events.
type ctlEvent struct{ t, seq uint64 }

// SetTimeslice sets pid's channel-group timeslice; it applies from the
// current slice on: a group on the engine keeps its slice's start, and its
// slice now ends at the first multiple of the new timeslice after that
// start that is still ahead (so a running slice already longer than the
// new timeslice ends at the next such multiple, not at once).
func (s *Simulator) SetTimeslice(pid uint32, gpu int, us uint64) error {
	if us == 0 || us > uint64(time.Hour/time.Microsecond) {
		return fmt.Errorf("set timeslice of pid %d: %d µs out of range (1 µs to 1 h)", pid, us)
	}
	p, err := s.lookup(pid, gpu, "set timeslice")
	if err != nil {
		return err
	}
	return s.control(func() {
		p.timeslice = us * 1000
		g := s.gpus[p.gpu]
		if g.cur == p && g.state == gRun && !g.drain && s.cfg.mode != ModeSpatial {
			g.account(s.now)
			g.plan(s.now)
		}
	})
}

// SetInterleave sets pid's interleave level and rebuilds its GPU's runlist.
func (s *Simulator) SetInterleave(pid uint32, level sched.Interleave) error {
	if !level.Valid() {
		return fmt.Errorf("set interleave of pid %d: invalid level %d", pid, level)
	}
	p, err := s.lookup(pid, -1, "set interleave")
	if err != nil {
		return err
	}
	return s.control(func() {
		if p.interleave != level {
			p.interleave = level
			s.gpus[p.gpu].relayout(s.now)
		}
	})
}

// Suspend takes pid's channel group off gpu's runlist, preempting its
// kernel in flight at the modelled granularity and cost. Copies already
// queued on the copy engines are not affected.
func (s *Simulator) Suspend(pid uint32, gpu int) error {
	p, err := s.lookup(pid, gpu, "suspend")
	if err != nil {
		return err
	}
	return s.control(func() { s.gpus[p.gpu].suspend(p, s.now) })
}

// Resume puts pid's channel group back on gpu's runlist.
func (s *Simulator) Resume(pid uint32, gpu int) error {
	p, err := s.lookup(pid, gpu, "resume")
	if err != nil {
		return err
	}
	return s.control(func() { s.gpus[p.gpu].resume(p, s.now) })
}

// Gate stops pid's host at its next kernel launch; work already queued
// runs to completion.
func (s *Simulator) Gate(pid uint32) error {
	p, err := s.lookup(pid, -1, "gate")
	if err != nil {
		return err
	}
	p.gated = true
	return nil
}

// Ungate lets a gated host continue.
func (s *Simulator) Ungate(pid uint32) error {
	p, err := s.lookup(pid, -1, "ungate")
	if err != nil {
		return err
	}
	if p.gated {
		p.gated = false
		if p.host == hostGated {
			s.wakeAt(p, s.now)
		}
	}
	return nil
}

// GPUs returns the GPU pid runs on (the engine's Placement): a simulated
// process uses one GPU, fixed when it was added.
func (s *Simulator) GPUs(pid uint32) []int {
	i := int(pid) - FirstPID
	if i < 0 || i >= len(s.procs) {
		return nil
	}
	return []int{s.procs[i].gpu}
}
