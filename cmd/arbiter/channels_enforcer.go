package main

import (
	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/nvrm"
)

// channelController adapts nvrm's Controller to the engine's
// ChannelController, for the daemon's Enforcer: nvrm does not import the
// engine (mechanisms depend on nothing above them), so the one type that
// differs, the interleave level, is converted here.
type channelController struct {
	c *nvrm.Controller
}

var _ engine.ChannelController = channelController{}

// newChannelController wraps c for the engine.
func newChannelController(c *nvrm.Controller) engine.ChannelController {
	return channelController{c: c}
}

// SetTimeslice sets pid's channel-group timeslice on gpu.
func (a channelController) SetTimeslice(pid uint32, gpu int, us uint64) error {
	return a.c.SetTimeslice(pid, gpu, us)
}

// SetInterleave sets pid's interleave level on every GPU.
func (a channelController) SetInterleave(pid uint32, level engine.Interleave) error {
	return a.c.SetInterleave(pid, nvrm.InterleaveLevel(level))
}

// Suspend takes pid's channel groups on gpu off the GPU.
func (a channelController) Suspend(pid uint32, gpu int) error { return a.c.Suspend(pid, gpu) }

// Resume schedules pid's channel groups on gpu again.
func (a channelController) Resume(pid uint32, gpu int) error { return a.c.Resume(pid, gpu) }
