package nvrm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

func TestNewControllerNeedsLayout(t *testing.T) {
	r := newTestRegistry(t, "", nil)
	if _, err := NewController(r, nil); err == nil {
		t.Fatal("controller without a driver layout")
	}
	c, err := NewController(r, &ControllerOptions{Layout: mustLayout(t, "570.86.15")})
	if err != nil {
		t.Fatal(err)
	}
	if c.opts.ControlRdev != ControlRdev || c.opts.Timeout != DefaultCallTimeout {
		t.Fatalf("defaults: %+v", c.opts)
	}
}

func TestControllerUnknownProcess(t *testing.T) {
	r := newTestRegistry(t, "", map[uint32]uint64{100: 1})
	c, _ := NewController(r, &ControllerOptions{Layout: mustLayout(t, "570.86.15")})
	for name, err := range map[string]error{
		"timeslice":  c.SetTimeslice(42, 0, 100),
		"suspend":    c.Suspend(42, -1),
		"resume":     c.Resume(42, -1),
		"interleave": c.SetInterleave(42, sched.InterleaveLow),
	} {
		if !errors.Is(err, ErrUnknownProcess) {
			t.Errorf("%s: %v, want ErrUnknownProcess", name, err)
		}
	}
	applyAll(r, cudaContext(100, 7, 0xC1D00001, 0))
	if err := c.SetTimeslice(100, 3, 100); !errors.Is(err, ErrNoGroups) {
		t.Errorf("GPU without groups: %v, want ErrNoGroups", err)
	}
	if err := c.SetInterleave(100, 7); err == nil {
		t.Error("interleave level 7 accepted")
	}
	if len(r.Suspended()) != 0 {
		t.Error("a failed suspend left a record")
	}
}

// TestCallTimeout holds a driver call past the timeout: the operation
// returns ErrCallTimeout in time, issues no further call, and the
// duplicated descriptor closes only once the driver call returns.
func TestCallTimeout(t *testing.T) {
	self := uint32(os.Getpid())
	nullFD, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(nullFD)
	reg := newTestRegistry(t, "", nil)
	reg.opts.StartTime = procStartTime
	applyAll(reg, []trace.Event{
		evAlloc(self, int32(nullFD), 1, 0, 1, ClassRootClient, 0, 0),
		evAlloc(self, int32(nullFD), 1, 1, 2, ClassDevice, 0, 0),
		evAlloc(self, int32(nullFD), 1, 2, 3, ClassChannelGroup, EngineGraphics, 0),
		evAlloc(self, int32(nullFD), 1, 2, 4, ClassChannelGroup, EngineCopy0, 0),
	})
	c, err := NewController(reg, &ControllerOptions{Layout: mustLayout(t, "570.86.15"), ControlRdev: MkRdev(1, 3), Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	release := make(chan struct{})
	var calls atomic.Int32
	c.sys = func(int, uint32, unsafe.Pointer) syscall.Errno {
		calls.Add(1)
		<-release
		return 0
	}
	before := openFDs(t)
	start := time.Now()
	err = c.Suspend(self, -1)
	if !errors.Is(err, ErrCallTimeout) {
		t.Fatalf("held call: %v, want ErrCallTimeout", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 10*time.Second {
		t.Fatalf("returned after %v", d)
	}
	// The process's pidfd (kept) and the duplicate (until the call ends).
	if n := openFDs(t); n != before+2 {
		t.Fatalf("%d descriptors open while the call is in the driver, want %d (pidfd and duplicate)", n, before+2)
	}
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for openFDs(t) != before+1 {
		if time.Now().After(deadline) {
			t.Fatal("duplicate not closed after the call returned")
		}
		time.Sleep(time.Millisecond)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d calls issued, want 1 (none after the timeout)", n)
	}
	// The suspension stays recorded: resuming it is still owed.
	if len(reg.Suspended()) != 2 {
		t.Fatalf("suspended records: %+v", reg.Suspended())
	}
	// Calls that return in time, however many, are not cut short: the
	// deadline is per call. The margin is wide for a loaded machine,
	// and the four calls together still take longer than one may.
	c.opts.Timeout = time.Second
	c.sys = func(int, uint32, unsafe.Pointer) syscall.Errno {
		time.Sleep(300 * time.Millisecond)
		return 0
	}
	if err := c.Suspend(self, -1); err != nil {
		t.Fatalf("4 calls of 300 ms each under a 1 s per-call limit: %v", err)
	}
}

// openFDs counts the test process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestControlStatus checks that the status the driver writes back becomes
// the named error, and that the request carries the group's handles.
func TestControlStatus(t *testing.T) {
	var seen NVOS54
	var seenParams TimesliceParams
	f := &rmFile{fd: -1, sys: func(_ int, req uint32, arg unsafe.Pointer) syscall.Errno {
		if req != ReqRMControl {
			return syscall.EINVAL
		}
		p := (*NVOS54)(arg)
		seen = *p
		seenParams = *(*TimesliceParams)(*(*unsafe.Pointer)(unsafe.Pointer(&p.Params)))
		p.Status = uint32(StatusInvalidClient)
		return 0
	}}
	err := f.setTimeslice(Group{Client: 0xC1D00001, Handle: 0x5C000003}, 250)
	if !errors.Is(err, ErrInvalidClient) {
		t.Fatalf("%v, want ErrInvalidClient", err)
	}
	if seen.HClient != 0xC1D00001 || seen.HObject != 0x5C000003 || seen.Cmd != uint32(CtrlSetTimeslice) || seen.ParamsSize != 8 || seen.Flags != 0 || seenParams.TimesliceUs != 250 {
		t.Fatalf("request %+v params %+v", seen, seenParams)
	}
	f.sys = func(int, uint32, unsafe.Pointer) syscall.Errno { return syscall.ENOTTY }
	if err := f.setTimeslice(Group{}, 1); !errors.Is(err, syscall.ENOTTY) {
		t.Fatalf("ioctl error: %v", err)
	}
	f.accept = syscall.ENOTTY
	if err := f.setTimeslice(Group{}, 1); err != nil {
		t.Fatalf("accepted errno: %v", err)
	}
	for _, size := range []uint32{2, 3} {
		f.sys = func(_ int, _ uint32, arg unsafe.Pointer) syscall.Errno {
			seen = *(*NVOS54)(arg)
			return 0
		}
		if err := f.schedule(Group{}, false, size); err != nil || seen.ParamsSize != size || seen.Cmd != uint32(CtrlGPFIFOSchedule) {
			t.Fatalf("schedule size %d: %+v, %v", size, seen, err)
		}
	}
}

// selfWithGroups registers the test process as a traced process with two
// channel groups on GPU 0, on a /dev/null descriptor standing in for its
// control file, and returns a controller that accepts /dev/null (1:3).
func selfWithGroups(t *testing.T, opts ControllerOptions) (*Controller, uint32) {
	t.Helper()
	self := uint32(os.Getpid())
	nullFD, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(nullFD) })
	reg := newTestRegistry(t, "", nil)
	reg.opts.StartTime = procStartTime
	applyAll(reg, []trace.Event{
		evAlloc(self, int32(nullFD), 1, 0, 1, ClassRootClient, 0, 0),
		evAlloc(self, int32(nullFD), 1, 1, 2, ClassDevice, 0, 0),
		evAlloc(self, int32(nullFD), 1, 2, 5, ClassSubdevice, 0, 0),
		evAlloc(self, int32(nullFD), 1, 2, 3, ClassChannelGroup, EngineGraphics, 0),
		evAlloc(self, int32(nullFD), 1, 3, 0x30, ClassHopperGPFIFO, 0, 0),
		evAlloc(self, int32(nullFD), 1, 2, 4, ClassChannelGroup, EngineCopy0, 0),
		evAlloc(self, int32(nullFD), 1, 4, 0x40, ClassHopperGPFIFO, 0, 0),
	})
	if opts.Layout.ScheduleSize == 0 {
		opts.Layout = mustLayout(t, "570.86.15")
	}
	opts.ControlRdev = MkRdev(1, 3)
	c, err := NewController(reg, &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, self
}

// sentCall is one control as the driver would have received it.
type sentCall struct {
	NVOS54
	params []byte
}

// recordCalls makes c's ioctls record each control and answer it with
// status(call) written back, as the driver would.
func recordCalls(c *Controller, status func(*NVOS54) Status) *[]sentCall {
	var calls []sentCall
	c.sys = func(_ int, req uint32, arg unsafe.Pointer) syscall.Errno {
		if req != ReqRMControl {
			return syscall.EINVAL
		}
		p := (*NVOS54)(arg)
		params := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p.Params))), p.ParamsSize)
		calls = append(calls, sentCall{*p, bytes.Clone(params)})
		if status != nil {
			p.Status = uint32(status(p))
		}
		return 0
	}
	return &calls
}

// TestSetInterleaveNeedsNice checks that SetInterleave refuses up front,
// issuing nothing, without CAP_SYS_NICE or CAP_SYS_ADMIN, and goes ahead
// with either; and that the driver's own refusal says what it needs.
func TestSetInterleaveNeedsNice(t *testing.T) {
	c, self := selfWithGroups(t, ControllerOptions{})
	calls := recordCalls(c, nil)
	for _, tc := range []struct {
		name string
		have caps.Set
		ok   bool
	}{
		{"none", 1 << caps.SysPtrace, false},
		{"bpf and perfmon", 1<<caps.BPF | 1<<caps.Perfmon | 1<<caps.SysPtrace, false},
		{"sys_nice", 1 << caps.SysNice, true},
		{"sys_admin", 1 << caps.SysAdmin, true},
	} {
		*calls = nil
		c.caps = func() (caps.Set, error) { return tc.have, nil }
		err := c.SetInterleave(self, sched.InterleaveHigh)
		if tc.ok {
			if err != nil || len(*calls) != 2 || (*calls)[0].Cmd != uint32(CtrlSetInterleaveLevel) {
				t.Errorf("%s: %v, %d calls", tc.name, err, len(*calls))
			}
			continue
		}
		var me *caps.MissingError
		if !errors.As(err, &me) || len(me.Caps) != 1 || me.Caps[0] != caps.SysNice || me.ExitCode() != 77 {
			t.Fatalf("%s: %v, want a *caps.MissingError naming CAP_SYS_NICE", tc.name, err)
		}
		if !strings.HasPrefix(err.Error(), "setting a channel group's interleave level (SET_INTERLEAVE_LEVEL) needs CAP_SYS_NICE, which this process lacks") ||
			!strings.HasSuffix(err.Error(), "or grant CAP_SYS_ADMIN, which the driver accepts as well") {
			t.Errorf("%s: message %q", tc.name, err)
		}
		if len(*calls) != 0 {
			t.Errorf("%s: %d calls issued without the capability", tc.name, len(*calls))
		}
	}
	// The registry keeps the level set: it is the only record of it.
	g, _ := c.reg.Groups(self, 0)
	if g[0].Interleave != int32(sched.InterleaveHigh) || g[1].Interleave != int32(sched.InterleaveHigh) {
		t.Errorf("recorded levels: %d, %d", g[0].Interleave, g[1].Interleave)
	}
	// The driver refusing anyway (another check, or the firmware).
	c.caps = func() (caps.Set, error) { return 1 << caps.SysNice, nil }
	recordCalls(c, func(*NVOS54) Status { return StatusInsufficientPermissions })
	if err := c.SetInterleave(self, sched.InterleaveLow); !errors.Is(err, ErrInsufficientPermissions) || !strings.Contains(err.Error(), "grants it to a caller with CAP_SYS_NICE or CAP_SYS_ADMIN") {
		t.Errorf("refused: %v", err)
	}
	recordCalls(c, func(*NVOS54) Status { return StatusNotSupported })
	if err := c.SetInterleave(self, sched.InterleaveLow); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "GSP") {
		t.Errorf("GSP refusal: %v", err)
	}
	if g, _ := c.reg.Groups(self, 0); g[0].Interleave != int32(sched.InterleaveHigh) {
		t.Errorf("a refused level was recorded: %d", g[0].Interleave)
	}
}

// TestPreemptManualTimeout checks that every PREEMPT carries an explicit
// timeout the driver accepts, below the call timeout, rather than leaving
// the firmware's default (up to 45 s in compute mode) to apply.
func TestPreemptManualTimeout(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      ControllerOptions
		timeoutUs uint32
	}{
		{"defaults", ControllerOptions{}, 1_000_000},
		{"set", ControllerOptions{PreemptTimeout: 250 * time.Millisecond}, 250_000},
		{"short call timeout", ControllerOptions{Timeout: 50 * time.Millisecond}, 25_000},
	} {
		c, self := selfWithGroups(t, tc.opts)
		calls := recordCalls(c, nil)
		if _, err := c.SuspendWith(self, -1, &SuspendOptions{Method: SuspendSchedule}); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		n := 0
		for _, call := range *calls {
			if Control(call.Cmd) != CtrlPreempt {
				continue
			}
			n++
			var p PreemptParams
			if err := binary.Read(bytes.NewReader(call.params), binary.LittleEndian, &p); err != nil || call.ParamsSize != 8 {
				t.Fatalf("%s: PREEMPT params % x: %v", tc.name, call.params, err)
			}
			if p.BWait != 1 || p.BManualTimeout != 1 || p.TimeoutUs != tc.timeoutUs {
				t.Errorf("%s: PREEMPT %+v, want bWait 1, bManualTimeout 1, timeoutUs %d", tc.name, p, tc.timeoutUs)
			}
			if time.Duration(p.TimeoutUs)*time.Microsecond >= c.opts.Timeout {
				t.Errorf("%s: PREEMPT timeout %d µs not below the call timeout %v", tc.name, p.TimeoutUs, c.opts.Timeout)
			}
		}
		if n != 2 {
			t.Errorf("%s: %d PREEMPTs, want 2", tc.name, n)
		}
	}
	r := newTestRegistry(t, "", nil)
	l := mustLayout(t, "570.86.15")
	for _, bad := range []ControllerOptions{
		{Layout: l, PreemptTimeout: 1001 * time.Millisecond, Timeout: 5 * time.Second},
		{Layout: l, PreemptTimeout: time.Second, Timeout: time.Second},
		{Layout: l, PreemptTimeout: time.Nanosecond},
	} {
		if _, err := NewController(r, &bad); err == nil {
			t.Errorf("accepted PREEMPT timeout %v with call timeout %v", bad.PreemptTimeout, bad.Timeout)
		}
	}
}

// TestNoGetInterleave checks that GET_INTERLEAVE_LEVEL, which no driver
// exports, is never issued: the registry's record is the level.
func TestNoGetInterleave(t *testing.T) {
	c, self := selfWithGroups(t, ControllerOptions{})
	calls := recordCalls(c, nil)
	g, _ := c.reg.Groups(self, 0)
	err := c.onGroups(self, g[:1], func(f *rmFile, g Group) error {
		var p InterleaveParams
		return f.control(g, CtrlGetInterleaveLevel, unsafe.Pointer(&p), 4)
	})
	if !errors.Is(err, ErrNotSupported) || len(*calls) != 0 {
		t.Fatalf("GET_INTERLEAVE_LEVEL: %v, %d calls issued", err, len(*calls))
	}
}
