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

// action is an enforcement action: what, to which process, and the new
// timeslice (ns) or interleave level. Actions waiting for ControlLatency
// are values, not closures: a closed loop issues millions an hour.
type action struct {
	kind   actionKind
	p      *proc
	arg    uint64
	t, seq uint64 // when it is due, and its order among all events
}

// actionKind says what an action does.
type actionKind uint8

const (
	actSuspend actionKind = iota
	actResume
	actTimeslice
	actInterleave
)

// control applies an enforcement action now, or after ControlLatency.
// Actions of equal latency keep their call order. With a latency the
// engine.Enforcer postcondition holds that long after the call, as if the
// call had blocked that long in the driver (the real controls do block);
// the controller itself is not held up.
func (s *Simulator) control(a action) error {
	if s.cfg.controlLatency == 0 {
		s.apply(&a)
		return s.err
	}
	if !s.room() {
		return s.err
	}
	a.t, a.seq = s.now+s.cfg.controlLatency, s.q.next()
	s.controls = append(s.controls, a)
	if len(s.controls)-s.ctlHead == 1 {
		s.q.set(s.ctlSrc, a.t, a.seq)
	}
	return s.err
}

// apply carries out an action at the current time.
func (s *Simulator) apply(a *action) {
	p := a.p
	g := s.gpus[p.gpu]
	switch a.kind {
	case actSuspend:
		g.suspend(p, s.now)
	case actResume:
		g.resume(p, s.now)
	case actTimeslice:
		p.timeslice = a.arg
		if g.cur == p && g.state == gRun && !g.drain && s.cfg.mode != ModeSpatial {
			g.account(s.now)
			g.plan(s.now)
		}
	case actInterleave:
		if l := sched.Interleave(a.arg); p.interleave != l {
			p.interleave = l
			g.relayout(s.now)
		}
	}
}

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
	return s.control(action{kind: actTimeslice, p: p, arg: us * 1000})
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
	return s.control(action{kind: actInterleave, p: p, arg: uint64(level)})
}

// Suspend takes pid's channel group off gpu's runlist, preempting its
// kernel in flight at the modelled granularity and cost. Copies already
// queued on the copy engines are not affected.
func (s *Simulator) Suspend(pid uint32, gpu int) error {
	p, err := s.lookup(pid, gpu, "suspend")
	if err != nil {
		return err
	}
	return s.control(action{kind: actSuspend, p: p})
}

// Resume puts pid's channel group back on gpu's runlist.
func (s *Simulator) Resume(pid uint32, gpu int) error {
	p, err := s.lookup(pid, gpu, "resume")
	if err != nil {
		return err
	}
	return s.control(action{kind: actResume, p: p})
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
