package main

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// liveEnforcer is the daemon's enforcer: the driver's channel control
// (timeslice, interleave, suspend) where the process's channel groups were
// traced, the launch gate where they were not. It also tells the engine,
// per process, which of them works (engine.Support) and which GPUs the
// process uses (engine.Placement), both from the driver trace, and has the
// tracer deliver the first calls of latency-critical requests at once
// (engine.Expediter), with the gates of their victims armed to close in
// the kernel at those calls (engine.Armer).
type liveEnforcer struct {
	ctl    *nvrm.Controller // nil: no driver, or one channel control does not support
	ctlWhy string           // why ctl is nil
	reg    *nvrm.Registry   // nil with ctl
	tracer *uprobe.Tracer
	gate   *uprobe.Gate
	// node learns the GPUs processes use, where NVML does not list them.
	node *nodeInfo
}

var (
	_ engine.Enforcer  = (*liveEnforcer)(nil)
	_ engine.Support   = (*liveEnforcer)(nil)
	_ engine.Placement = (*liveEnforcer)(nil)
	_ engine.Expediter = (*liveEnforcer)(nil)
	_ engine.Armer     = (*liveEnforcer)(nil)
)

// errNoChannelControl is returned by channel controls on a node without
// them; the engine then plans the gate.
var errNoChannelControl = errors.New("no driver channel control on this node")

func (l *liveEnforcer) channels() (*nvrm.Controller, error) {
	if l.ctl == nil {
		return nil, fmt.Errorf("%w: %s", errNoChannelControl, l.ctlWhy)
	}
	return l.ctl, nil
}

// SetTimeslice implements engine.ChannelController.
func (l *liveEnforcer) SetTimeslice(pid uint32, gpu int, us uint64) error {
	c, err := l.channels()
	if err != nil {
		return err
	}
	return c.SetTimeslice(pid, gpu, us)
}

// ResetTimeslice implements engine.TimesliceResetter.
func (l *liveEnforcer) ResetTimeslice(pid uint32, gpu int) error {
	c, err := l.channels()
	if err != nil {
		return err
	}
	return c.ResetTimeslice(pid, gpu)
}

// SetInterleave implements engine.ChannelController.
func (l *liveEnforcer) SetInterleave(pid uint32, level sched.Interleave) error {
	c, err := l.channels()
	if err != nil {
		return err
	}
	return c.SetInterleave(pid, level)
}

// Suspend implements engine.ChannelController.
func (l *liveEnforcer) Suspend(pid uint32, gpu int) error {
	c, err := l.channels()
	if err != nil {
		return err
	}
	return c.Suspend(pid, gpu)
}

// Resume implements engine.ChannelController.
func (l *liveEnforcer) Resume(pid uint32, gpu int) error {
	c, err := l.channels()
	if err != nil {
		return err
	}
	return c.Resume(pid, gpu)
}

// Gate implements engine.Gater.
func (l *liveEnforcer) Gate(pid uint32) error { return l.gate.Gate(pid) }

// Ungate implements engine.Gater.
func (l *liveEnforcer) Ungate(pid uint32) error { return l.gate.Ungate(pid) }

// Arm implements engine.Armer: the call that opens each of lc's requests
// closes the victims' gates in its own probe.
func (l *liveEnforcer) Arm(lc uint32, victims []uint32, launchOnly bool) error {
	return l.gate.Arm(lc, victims, launchOnly)
}

// Settle implements engine.Armer: but with all, a gate closed within
// uprobe.DefaultSettleGrace stays closed for the engine to take over.
func (l *liveEnforcer) Settle(all bool) (pending bool, err error) {
	grace := uprobe.DefaultSettleGrace
	if all {
		grace = 0
	}
	_, young, err := l.gate.Settle(grace)
	return young > 0, err
}

// Expedite implements engine.Expediter: the tracer's probes wake its
// reader at the first call of each of pid's requests.
func (l *liveEnforcer) Expedite(pid uint32, on bool) error { return l.tracer.Expedite(pid, on) }

// Strongest implements engine.Support: channel control needs the
// process's channel groups traced (a process that started before the
// daemon has none: the driver calls that created them were not seen);
// the gate needs its launch probe attached.
func (l *liveEnforcer) Strongest(pid uint32) (sched.Level, string) {
	why := l.ctlWhy
	if l.ctl != nil {
		if len(l.GPUs(pid)) > 0 {
			return sched.LevelSuspend, ""
		}
		why = "its channel groups were not traced (it created them before the daemon started)"
	}
	if err := l.tracer.LaunchProbed(pid); err != nil {
		return sched.LevelObserve, why + "; no launch gate either: " + err.Error()
	}
	return sched.LevelGate, why
}

// GPUs implements engine.Placement: the device instances of the process's
// traced channel groups.
func (l *liveEnforcer) GPUs(pid uint32) []int {
	if l.reg == nil {
		return nil
	}
	p, err := l.reg.Process(pid)
	if err != nil {
		return nil
	}
	var out []int
	for _, c := range p.Clients {
		for _, d := range c.Devices {
			if len(d.Groups) > 0 && !slices.Contains(out, int(d.Instance)) {
				out = append(out, int(d.Instance))
			}
		}
	}
	slices.Sort(out)
	if l.node != nil {
		l.node.sawGPUs(out)
	}
	return out
}

// describe says what channel control the node has, for the log.
func (l *liveEnforcer) describe() string {
	if l.ctl == nil {
		return "none (" + l.ctlWhy + "); launch gate only"
	}
	return "driver channel groups"
}
