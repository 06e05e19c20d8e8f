package nvrm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// wantCmds checks the controls of calls, in order, each as "NAME 0xOBJECT".
func wantCmds(t *testing.T, what string, calls []sentCall, want ...string) {
	t.Helper()
	got := make([]string, len(calls))
	for i, c := range calls {
		got[i] = fmt.Sprintf("%s %#x", Control(c.Cmd), c.HObject)
	}
	if g, w := strings.Join(got, ", "), strings.Join(want, ", "); g != w {
		t.Errorf("%s:\n got %s\nwant %s", what, g, w)
	}
}

// answer returns a status function for recordCalls: status for cmd on
// object (any object where 0), NV_OK otherwise.
func answer(object uint32, cmd Control, status Status) func(*NVOS54) Status {
	return func(p *NVOS54) Status {
		if Control(p.Cmd) == cmd && (object == 0 || p.HObject == object) {
			return status
		}
		return StatusOK
	}
}

// TestSuspendDisableChannels checks the FIFO_DISABLE_CHANNELS path: one
// call on the process's own subdevice listing every channel with its
// client, recorded before it is issued, and undone the same way.
func TestSuspendDisableChannels(t *testing.T) {
	c, self := selfWithGroups(t, ControllerOptions{})
	calls := recordCalls(c, nil)
	steps, err := c.SuspendWith(self, -1, nil)
	if err != nil || len(steps) != 1 || steps[0] != (SuspendStep{GPU: 0, Method: SuspendDisableChannels, Groups: 2}) {
		t.Fatalf("auto on a GPU that answers: %+v, %v", steps, err)
	}
	wantCmds(t, "suspend", *calls, "FIFO_DISABLE_CHANNELS 0x5")
	call := (*calls)[0]
	le := binary.LittleEndian
	p := call.params
	if call.HClient != 1 || call.ParamsSize != 536 || p[0] != 1 || le.Uint32(p[4:]) != 2 || p[8] != 0 || p[9] != 0 || le.Uint64(p[16:]) != 0 ||
		le.Uint32(p[24:]) != 1 || le.Uint32(p[28:]) != 1 || le.Uint32(p[32:]) != 0 || le.Uint32(p[280:]) != 0x30 || le.Uint32(p[284:]) != 0x40 {
		t.Fatalf("FIFO_DISABLE_CHANNELS %+v params % x", call.NVOS54, p[:32])
	}
	sus := c.reg.Suspended()
	if len(sus) != 2 || sus[0].Method != SuspendDisableChannels || sus[0].Subdevice != 5 || sus[1].Method != SuspendDisableChannels {
		t.Fatalf("records: %+v", sus)
	}
	*calls = nil
	if err := c.Resume(self, -1); err != nil {
		t.Fatal(err)
	}
	wantCmds(t, "resume", *calls, "FIFO_DISABLE_CHANNELS 0x5")
	if p := (*calls)[0].params; p[0] != 0 || le.Uint32(p[4:]) != 2 {
		t.Errorf("re-enable params % x", p[:8])
	}
	if len(c.reg.Suspended()) != 0 {
		t.Errorf("records left: %+v", c.reg.Suspended())
	}

	// A group whose channels were not traced: named explicitly, the
	// method is refused before anything is recorded or issued; auto
	// refuses too, since this GPU answered FIFO_DISABLE_CHANNELS (GSP
	// firmware, where the per-group controls do nothing).
	ev := evAlloc(self, 0, 1, 2, 6, ClassChannelGroup, EngineCopy0, 0)
	c.reg.Apply(&ev)
	*calls = nil
	_, err = c.SuspendWith(self, -1, &SuspendOptions{Method: SuspendDisableChannels})
	if err == nil || !strings.Contains(err.Error(), "FIFO_DISABLE_CHANNELS cannot be used: no channel of channel group 0x6 was traced (use the schedule method)") ||
		len(*calls) != 0 || len(c.reg.Suspended()) != 0 {
		t.Fatalf("explicit, untraced channels: %v, %d calls, records %+v", err, len(*calls), c.reg.Suspended())
	}
	steps, err = c.SuspendWith(self, -1, nil)
	if !errors.Is(err, ErrNoSuspendPath) || !strings.Contains(err.Error(), "no channel of channel group 0x6 was traced") ||
		len(*calls) != 0 || len(c.reg.Suspended()) != 0 {
		t.Fatalf("auto, untraced channels, a GPU that answered: %+v, %v, %d calls, records %+v", steps, err, len(*calls), c.reg.Suspended())
	}
	// Named explicitly, the per-group controls still run.
	if steps, err = c.SuspendWith(self, -1, &SuspendOptions{Method: SuspendSchedule}); err != nil || steps[0].Method != SuspendSchedule {
		t.Fatalf("schedule, untraced channels: %+v, %v", steps, err)
	}
	if err := c.Resume(self, -1); err != nil {
		t.Fatal(err)
	}

	// A GPU never asked: auto takes the per-group path, as it must on a
	// GPU without GSP firmware.
	c2, self2 := selfWithGroups(t, ControllerOptions{})
	ev = evAlloc(self2, 0, 1, 2, 6, ClassChannelGroup, EngineCopy0, 0)
	c2.reg.Apply(&ev)
	recordCalls(c2, nil)
	steps, err = c2.SuspendWith(self2, -1, nil)
	if err != nil || steps[0].Method != SuspendSchedule || steps[0].FellBack {
		t.Fatalf("auto, untraced channels, a GPU never asked: %+v, %v", steps, err)
	}
	if err := c2.Resume(self2, -1); err != nil {
		t.Fatal(err)
	}
}

// TestSuspendFallsBack checks SuspendAuto on a GPU that answers
// FIFO_DISABLE_CHANNELS with NOT_SUPPORTED (no GSP): the per-group
// controls run instead, the records say so before they run, and the GPU
// is remembered. Named explicitly, the method's refusal is the error.
func TestSuspendFallsBack(t *testing.T) {
	c, self := selfWithGroups(t, ControllerOptions{})
	calls := recordCalls(c, answer(0, CtrlFIFODisableChannels, StatusNotSupported))
	steps, err := c.SuspendWith(self, -1, &SuspendOptions{Method: SuspendDisableChannels})
	if !errors.Is(err, ErrNotSupported) || len(steps) != 1 || steps[0].Method != SuspendDisableChannels {
		t.Fatalf("explicit: %+v, %v; want NOT_SUPPORTED", steps, err)
	}
	wantCmds(t, "explicit", *calls, "FIFO_DISABLE_CHANNELS 0x5")
	if err := c.Resume(self, -1); !errors.Is(err, ErrNotSupported) || len(c.reg.Suspended()) != 2 {
		t.Fatalf("resume of a refused disable: %v, records %+v", err, c.reg.Suspended())
	}
	for _, s := range c.reg.Suspended() {
		if err := c.reg.clearSuspended(self, []Group{s.Group}); err != nil {
			t.Fatal(err)
		}
	}

	*calls = nil
	steps, err = c.SuspendWith(self, -1, nil)
	if err != nil || len(steps) != 1 || steps[0] != (SuspendStep{GPU: 0, Method: SuspendSchedule, Groups: 2, FellBack: true}) {
		t.Fatalf("auto: %+v, %v", steps, err)
	}
	wantCmds(t, "auto", *calls, "FIFO_DISABLE_CHANNELS 0x5", "GPFIFO_SCHEDULE 0x3", "PREEMPT 0x3", "GPFIFO_SCHEDULE 0x4", "PREEMPT 0x4")
	if sus := c.reg.Suspended(); len(sus) != 2 || sus[0].Method != SuspendSchedule || sus[0].Subdevice != 0 {
		t.Fatalf("records after the fallback: %+v", sus)
	}
	*calls = nil
	if err := c.Resume(self, -1); err != nil {
		t.Fatal(err)
	}
	wantCmds(t, "resume", *calls, "GPFIFO_SCHEDULE 0x3", "GPFIFO_SCHEDULE 0x4")
	// Remembered: no second FIFO_DISABLE_CHANNELS on that GPU.
	*calls = nil
	if steps, err := c.SuspendWith(self, -1, nil); err != nil || steps[0].Method != SuspendSchedule || steps[0].FellBack {
		t.Fatalf("auto again: %+v, %v", steps, err)
	}
	wantCmds(t, "auto again", *calls, "GPFIFO_SCHEDULE 0x3", "PREEMPT 0x3", "GPFIFO_SCHEDULE 0x4", "PREEMPT 0x4")
}

// TestSuspendJoinsErrors checks that a group the driver refuses does not
// stop the others: each is tried, the errors are joined, the records stay
// for all, and Resume undoes what it can, keeping the record of what it
// cannot.
func TestSuspendJoinsErrors(t *testing.T) {
	c, self := selfWithGroups(t, ControllerOptions{})
	calls := recordCalls(c, answer(3, CtrlGPFIFOSchedule, StatusInvalidState))
	steps, err := c.SuspendWith(self, -1, &SuspendOptions{Method: SuspendSchedule})
	if !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), "nvrm: process") || !strings.Contains(err.Error(), "channel group 0x3: GPFIFO_SCHEDULE: driver returned NV_ERR_INVALID_STATE") {
		t.Fatalf("suspend: %v", err)
	}
	if len(steps) != 1 || steps[0].Method != SuspendSchedule {
		t.Errorf("steps %+v", steps)
	}
	wantCmds(t, "suspend", *calls, "GPFIFO_SCHEDULE 0x3", "GPFIFO_SCHEDULE 0x4", "PREEMPT 0x4")
	if len(c.reg.Suspended()) != 2 {
		t.Fatalf("records: %+v", c.reg.Suspended())
	}
	g, _ := c.reg.Groups(self, 0)
	if g[0].Disabled || !g[1].Disabled {
		t.Errorf("disabled: %v %v, want false true", g[0].Disabled, g[1].Disabled)
	}
	// Both fail now: both errors, in order, and neither record goes.
	*calls = nil
	recordCalls(c, func(p *NVOS54) Status { return StatusInvalidState })
	err = c.ResumeAll()
	if !errors.Is(err, ErrInvalidState) || strings.Count(err.Error(), "NV_ERR_INVALID_STATE") != 2 || len(c.reg.Suspended()) != 2 {
		t.Fatalf("resume all refused: %v, records %+v", err, c.reg.Suspended())
	}
	// Group 3 still refused: group 4 resumes and its record goes.
	calls = recordCalls(c, answer(3, CtrlGPFIFOSchedule, StatusInvalidState))
	err = c.Resume(self, -1)
	if !errors.Is(err, ErrInvalidState) || strings.Count(err.Error(), "NV_ERR_INVALID_STATE") != 1 {
		t.Fatalf("resume: %v", err)
	}
	wantCmds(t, "resume", *calls, "GPFIFO_SCHEDULE 0x3", "GPFIFO_SCHEDULE 0x4")
	if sus := c.reg.Suspended(); len(sus) != 1 || sus[0].Group.Handle != 3 {
		t.Fatalf("records after a partial resume: %+v", sus)
	}
	recordCalls(c, nil)
	if err := c.ResumeAll(); err != nil || len(c.reg.Suspended()) != 0 {
		t.Fatalf("resume all: %v, records %+v", err, c.reg.Suspended())
	}
}

func TestSuspendMethodNames(t *testing.T) {
	for _, m := range []SuspendMethod{SuspendAuto, SuspendSchedule, SuspendDisableChannels} {
		b, _ := m.MarshalText()
		var back SuspendMethod
		if err := back.UnmarshalText(b); err != nil || back != m {
			t.Errorf("%s: %v, %v", m, back, err)
		}
		if p, err := ParseSuspendMethod(m.String()); err != nil || p != m {
			t.Errorf("parse %s: %v, %v", m, p, err)
		}
	}
	if _, err := ParseSuspendMethod("preempt"); err == nil {
		t.Error("parsed preempt")
	}
	if _, err := (&Controller{}).SuspendWith(1, 0, &SuspendOptions{Method: 9}); err == nil {
		t.Error("method 9 accepted")
	}
}

// TestStandinSuspendMethods suspends the stand-in process through its own
// control file with each method, the driver's answers coming from
// rmstandin.Driver: FIFO_DISABLE_CHANNELS on a GSP GPU, the fallback
// where the GPU has no GSP, and refusals that must not stop the other
// groups.
func TestStandinSuspendMethods(t *testing.T) {
	testenv.Privileged(t)
	bin, ctl := buildStandin(t)
	tr, err := NewTracer(&TracerOptions{ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	s := startStandin(t, bin, ctl, rmstandin.ChannelsFlag)
	self := uint32(os.Getpid())
	evs := readEvents(t, tr, 14, s.pid)
	assertEvents(t, evs, standinChannelsContext(s.pid, s.ctlFD))
	reg, err := NewRegistry(nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		reg.Apply(&evs[i])
	}
	controller := func(t *testing.T, drv *rmstandin.Driver) *Controller {
		c, err := NewController(reg, &ControllerOptions{Layout: mustLayout(t, "575.51.03"), ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY, Respond: drv.Answer})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// calls renders what the driver was asked, as "CONTROL 0xOBJECT STATUS".
	calls := func(drv *rmstandin.Driver) string {
		var out []string
		for _, c := range drv.Calls() {
			out = append(out, fmt.Sprintf("%s %#x %#x", Control(c.Cmd), c.Object, c.Status))
		}
		return strings.Join(out, ", ")
	}
	channels := []uint32{rmstandin.Channel, rmstandin.ChannelCE, rmstandin.ChannelGR1}

	t.Run("GSP", func(t *testing.T) {
		drv := rmstandin.NewDriver(true)
		c := controller(t, drv)
		steps, err := c.SuspendWith(s.pid, -1, nil)
		if err != nil || len(steps) != 2 || steps[0] != (SuspendStep{GPU: 0, Method: SuspendDisableChannels, Groups: 2}) ||
			steps[1] != (SuspendStep{GPU: 1, Method: SuspendDisableChannels, Groups: 1}) {
			t.Fatalf("suspend: %+v, %v", steps, err)
		}
		if got, want := calls(drv), "FIFO_DISABLE_CHANNELS 0x5c000002 0x0, FIFO_DISABLE_CHANNELS 0x5c000013 0x0"; got != want {
			t.Fatalf("driver asked:\n got %s\nwant %s", got, want)
		}
		for _, ch := range channels {
			if !drv.Disabled(rmstandin.Client, ch) {
				t.Errorf("channel %#x not disabled", ch)
			}
		}
		if err := c.Resume(s.pid, -1); err != nil {
			t.Fatal(err)
		}
		for _, ch := range channels {
			if drv.Disabled(rmstandin.Client, ch) {
				t.Errorf("channel %#x still disabled", ch)
			}
		}
		if len(reg.Suspended()) != 0 {
			t.Errorf("records left: %+v", reg.Suspended())
		}
	})

	t.Run("no GSP", func(t *testing.T) {
		drv := rmstandin.NewDriver(false)
		c := controller(t, drv)
		steps, err := c.SuspendWith(s.pid, -1, nil)
		if err != nil || len(steps) != 2 || !steps[0].FellBack || steps[0].Method != SuspendSchedule || !steps[1].FellBack {
			t.Fatalf("suspend: %+v, %v", steps, err)
		}
		want := "FIFO_DISABLE_CHANNELS 0x5c000002 0x56, GPFIFO_SCHEDULE 0x5c000003 0x0, PREEMPT 0x5c000003 0x0, GPFIFO_SCHEDULE 0x5c000005 0x0, PREEMPT 0x5c000005 0x0, " +
			"FIFO_DISABLE_CHANNELS 0x5c000013 0x56, GPFIFO_SCHEDULE 0x5c000011 0x0, PREEMPT 0x5c000011 0x0"
		if got := calls(drv); got != want {
			t.Fatalf("driver asked:\n got %s\nwant %s", got, want)
		}
		// The calls reached the stand-in's file: the tracer saw them.
		got := readEvents(t, tr, 6, self)
		for i, h := range []uint32{rmstandin.GroupGR, rmstandin.GroupGR, rmstandin.GroupCE, rmstandin.GroupCE, rmstandin.GroupGR1, rmstandin.GroupGR1} {
			if got[i].RM.Object != h || got[i].RM.Client != rmstandin.Client {
				t.Errorf("traced call %d: %+v", i, got[i].RM)
			}
		}
		if err := c.Resume(s.pid, -1); err != nil {
			t.Fatal(err)
		}
		readEvents(t, tr, 3, self)
		// Remembered per GPU: no FIFO_DISABLE_CHANNELS the second time.
		before := len(drv.Calls())
		if _, err := c.SuspendWith(s.pid, 1, nil); err != nil {
			t.Fatal(err)
		}
		if got := drv.Calls()[before:]; len(got) != 2 || Control(got[0].Cmd) != CtrlGPFIFOSchedule {
			t.Fatalf("second suspend: %+v", got)
		}
		if err := c.Resume(s.pid, 1); err != nil {
			t.Fatal(err)
		}
		readEvents(t, tr, 3, self)
	})

	t.Run("refused group", func(t *testing.T) {
		drv := rmstandin.NewDriver(true)
		drv.Refuse(rmstandin.GroupGR, uint32(CtrlGPFIFOSchedule), rmstandin.StatusInvalidState)
		c := controller(t, drv)
		_, err := c.SuspendWith(s.pid, -1, &SuspendOptions{Method: SuspendSchedule})
		if !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), "channel group 0x5c000003: GPFIFO_SCHEDULE: driver returned NV_ERR_INVALID_STATE (0x40)") {
			t.Fatalf("suspend: %v", err)
		}
		want := "GPFIFO_SCHEDULE 0x5c000003 0x40, GPFIFO_SCHEDULE 0x5c000005 0x0, PREEMPT 0x5c000005 0x0, GPFIFO_SCHEDULE 0x5c000011 0x0, PREEMPT 0x5c000011 0x0"
		if got := calls(drv); got != want {
			t.Fatalf("driver asked:\n got %s\nwant %s", got, want)
		}
		readEvents(t, tr, 4, self) // the refused call is not traced
		if len(reg.Suspended()) != 3 {
			t.Fatalf("records: %+v", reg.Suspended())
		}
		// The record is what undoes it: the next keeper's ResumeAll.
		if err := c.ResumeAll(); !errors.Is(err, ErrInvalidState) {
			t.Fatalf("resume all, still refused: %v", err)
		}
		if sus := reg.Suspended(); len(sus) != 1 || sus[0].Group.Handle != rmstandin.GroupGR {
			t.Fatalf("records after a partial resume: %+v", sus)
		}
		readEvents(t, tr, 2, self)
		drv.Refuse(rmstandin.GroupGR, uint32(CtrlGPFIFOSchedule), rmstandin.StatusOK)
		if err := c.ResumeAll(); err != nil || len(reg.Suspended()) != 0 {
			t.Fatalf("resume all: %v, records %+v", err, reg.Suspended())
		}
		readEvents(t, tr, 1, self)
	})
}
