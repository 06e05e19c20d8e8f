package rmstandin

import (
	"encoding/binary"
	"slices"
	"sync"
)

// Driver answers RM controls in place of the NVIDIA driver. On the
// stand-in control file no driver runs and every ioctl fails with ENOTTY,
// so the controller asks a Driver, before each control, for the status
// and results to write into the parameter block (nvrm's
// ControllerOptions.Respond): the block then holds what the driver would
// have written back, for the controller as for a tracer. It emulates what
// Arbiter's control paths depend on: FIFO_DISABLE_CHANNELS on GSP GPUs
// only, GET_INTERLEAVE_LEVEL exported by none, timeslices read back, and
// refusals a test chooses. A Driver is safe for concurrent use.
type Driver struct {
	mu  sync.Mutex
	gsp bool
	// refuse maps (object, control) to the status to answer; a zero
	// object or control matches any.
	refuse    map[[2]uint32]uint32
	timeslice map[[2]uint32]uint64 // (client, group) → µs last set
	disabled  map[[2]uint32]bool   // (client, channel) disabled
	calls     []Call
}

// Call is one control the Driver answered.
type Call struct {
	Client, Object, Cmd uint32
	// Status is what the Driver answered; Params the parameters as the
	// caller passed them (before the Driver wrote any result).
	Status uint32
	Params []byte
}

// RM status codes and controls the Driver uses (nvstatuscodes.h, ctrl
// headers); nvrm names them, but the stand-in does not import it.
const (
	StatusOK              = 0x00
	StatusInvalidArgument = 0x1F
	StatusInvalidClient   = 0x23
	StatusInvalidState    = 0x40
	StatusNotSupported    = 0x56

	ctrlSetTimeslice        = 0xA06C0103
	ctrlGetTimeslice        = 0xA06C0104
	ctrlGetInterleaveLevel  = 0xA06C0108
	ctrlFIFODisableChannels = 0x2080110B

	fifoDisableChannelsSize = 536
	maxDisableChannels      = 64
	defaultTimesliceUs      = 1024
)

// NewDriver returns a Driver for a GPU run by GSP firmware (gsp), where
// FIFO_DISABLE_CHANNELS exists, or by the kernel driver alone, where it
// answers NOT_SUPPORTED.
func NewDriver(gsp bool) *Driver {
	return &Driver{
		gsp:       gsp,
		refuse:    map[[2]uint32]uint32{},
		timeslice: map[[2]uint32]uint64{},
		disabled:  map[[2]uint32]bool{},
	}
}

// Refuse makes the Driver answer status to control cmd on object; a zero
// object or cmd matches any.
func (d *Driver) Refuse(object, cmd, status uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refuse[[2]uint32{object, cmd}] = status
}

// Answer answers control cmd on object of client with params (the
// parameter block, which it may fill in) and returns the status. Its
// signature is that of nvrm's ControllerOptions.Respond.
func (d *Driver) Answer(client, object, cmd uint32, params []byte) uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	call := Call{Client: client, Object: object, Cmd: cmd, Params: slices.Clone(params)}
	call.Status = d.answer(client, object, cmd, params)
	d.calls = append(d.calls, call)
	return call.Status
}

func (d *Driver) answer(client, object, cmd uint32, params []byte) uint32 {
	for _, k := range [][2]uint32{{object, cmd}, {object, 0}, {0, cmd}, {0, 0}} {
		if s, ok := d.refuse[k]; ok {
			return s
		}
	}
	le := binary.LittleEndian
	switch cmd {
	case ctrlGetInterleaveLevel:
		// KernelChannelGroupApi does not export it, in any tag.
		return StatusNotSupported
	case ctrlSetTimeslice, ctrlGetTimeslice:
		if len(params) != 8 {
			return StatusInvalidArgument
		}
		k := [2]uint32{client, object}
		if cmd == ctrlSetTimeslice {
			d.timeslice[k] = le.Uint64(params)
			return StatusOK
		}
		us, ok := d.timeslice[k]
		if !ok {
			us = defaultTimesliceUs
		}
		le.PutUint64(params, us)
	case ctrlFIFODisableChannels:
		return d.disableChannels(client, params)
	}
	return StatusOK
}

// disableChannels is FIFO_DISABLE_CHANNELS: GSP only; up to 64 channels,
// each of a client the caller may use (here: the caller's own), and no
// runlist preemption event.
func (d *Driver) disableChannels(client uint32, p []byte) uint32 {
	if !d.gsp {
		return StatusNotSupported
	}
	le := binary.LittleEndian
	if len(p) != fifoDisableChannelsSize {
		return StatusInvalidArgument
	}
	disable := p[0] != 0
	n := le.Uint32(p[4:])
	if n == 0 || n > maxDisableChannels || le.Uint64(p[16:]) != 0 {
		return StatusInvalidArgument
	}
	for i := range n {
		if le.Uint32(p[24+4*i:]) != client {
			return StatusInvalidClient
		}
	}
	for i := range n {
		d.disabled[[2]uint32{client, le.Uint32(p[280+4*i:])}] = disable
	}
	return StatusOK
}

// Calls returns the controls answered so far, in order.
func (d *Driver) Calls() []Call {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

// Disabled reports whether FIFO_DISABLE_CHANNELS left client's channel
// disabled.
func (d *Driver) Disabled(client, channel uint32) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.disabled[[2]uint32{client, channel}]
}
