package nvrm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// TestGPUValidate is the real-hardware validation of channel control,
// run by scripts/gpu-validate-nvrm.sh on a GPU server (root, NVIDIA
// driver, a CUDA victim built by the script). It traces the victim's
// context creation, controls its channel groups from this process through
// pidfd_getfd, measures suspend/resume latency by watching the victim's
// spinning kernel stop and restart, and writes a Markdown report for
// docs/gpu-validation.md. Without ARBITER_GPU_VICTIM it skips: no CI
// machine has a GPU, and the stand-in tests cover the same path there.
func TestGPUValidate(t *testing.T) {
	victim := os.Getenv("ARBITER_GPU_VICTIM")
	if victim == "" {
		t.Skip("hardware validation: run scripts/gpu-validate-nvrm.sh on a GPU server")
	}
	cfg := gpuConfig{victim: []string{victim}, trials: 100, stopLimit: time.Second, variantTrials: 10}
	if s := os.Getenv("ARBITER_GPU_TRIALS"); s != "" {
		cfg.trials, _ = strconv.Atoi(s)
	}
	layout, err := DetectLayout("/", &LayoutOptions{AllowUnverified: os.Getenv("ARBITER_ALLOW_UNVERIFIED_DRIVER") != ""})
	if err != nil {
		t.Fatal(err)
	}
	cfg.controller = ControllerOptions{Layout: layout}
	cfg.report = os.Getenv("ARBITER_GPU_REPORT")
	report, failures := validateGPU(t, cfg)
	t.Log("\n" + report)
	if len(failures) > 0 {
		t.Errorf("validation failed: %v", failures)
	}
}

// TestGPUValidateStandin runs the hardware procedure against the
// stand-in, whose "kernel" is a CPU thread nothing can suspend: the
// procedure must run through and report exactly that, so that a harness
// bug does not first show on a GPU server.
func TestGPUValidateStandin(t *testing.T) {
	testenv.Privileged(t)
	bin, ctl := buildStandin(t)
	drv := rmstandin.NewDriver(true) // a GSP GPU: both suspend methods work
	cfg := gpuConfig{
		victim:        []string{bin, ctl, "--spin", rmstandin.ChannelsFlag},
		tracer:        TracerOptions{ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY},
		controller:    ControllerOptions{Layout: mustLayout(t, "575.51.03"), ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY, Respond: drv.Answer},
		trials:        2,
		stopLimit:     50 * time.Millisecond,
		variantTrials: 1,
	}
	report, failures := validateGPU(t, cfg)
	for _, want := range []string{
		"Driver 575.51.03 (GPFIFO_SCHEDULE 3 bytes)",
		"| 1 | rm_alloc |",
		"channel-group | graphics |",
		"channel group 0x5c000003 engine graphics, 1 channels, timeslice 2000 by \"process\"",
		"### Suspend (disable-channels: FIFO_DISABLE_CHANNELS on the process's subdevice) and resume, all groups",
		"- steps: [{GPU:0 Method:disable-channels Groups:2 FellBack:false} {GPU:1 Method:disable-channels Groups:1 FellBack:false}]",
		"### Suspend (schedule: GPFIFO_SCHEDULE{0} + PREEMPT{bWait, manual timeout} per group) and resume, all groups",
		"| FIFO_DISABLE_CHANNELS | 8 |",
		"| 0x5c000003 | graphics | SET_TIMESLICE | 1000 µs | NV_OK | 1000 µs |",
		"| 0x5c000011 | graphics | SET_INTERLEAVE_LEVEL | high | NV_OK | high (registry) |",
		"| 0x5c000005 | copy0 | SET_INTERLEAVE_LEVEL | medium | NV_OK | medium (registry) |",
		"### Controls Arbiter issued",
		"| SET_INTERLEAVE_LEVEL | 9 |",
		"| PREEMPT | ",
		"kernel still running 50ms after Suspend",
		"| GPFIFO_SCHEDULE{0} only | ",
		"Victim's verification after the trials: `correct: stand-in",
		"| exit | 0 | 0x0 |  | 0x0 |  |  |",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// The level is never read from the driver, which cannot answer.
	if strings.Contains(report, "GET_INTERLEAVE_LEVEL") {
		t.Errorf("the procedure issued GET_INTERLEAVE_LEVEL")
	}
	for _, c := range drv.Calls() {
		if Control(c.Cmd) == CtrlGetInterleaveLevel {
			t.Errorf("the procedure issued GET_INTERLEAVE_LEVEL")
		}
	}
	// The CPU "kernel" never stops; on a loaded machine its thread may
	// still stall 20 ms and pass for stopped in a trial, so require the
	// failure in at least one of the two trials of each method, and no
	// other failure.
	if len(failures) < 2 || len(failures) > 4 {
		t.Errorf("failures: %q", failures)
	}
	for _, f := range failures {
		if !strings.Contains(f, "still running") {
			t.Errorf("unexpected failure %q", f)
		}
	}
	if t.Failed() || testing.Verbose() {
		t.Log("\n" + report)
	}
}

// gpuConfig parameterizes the validation procedure.
type gpuConfig struct {
	victim     []string // command line of the victim
	tracer     TracerOptions
	controller ControllerOptions
	trials     int
	// stopLimit is how long the victim may run on after Suspend before
	// the trial fails; variantTrials the trials of the disable-only and
	// preempt-only variants.
	stopLimit     time.Duration
	variantTrials int
	// report, where set, receives the Markdown report, also when the
	// procedure stops half-way.
	report string
}

// validateGPU runs the procedure and returns its Markdown report and the
// failures it found.
func validateGPU(t *testing.T, cfg gpuConfig) (string, []string) {
	t.Helper()
	var md strings.Builder
	var failures []string
	if cfg.report != "" {
		defer func() {
			if err := os.WriteFile(cfg.report, []byte(md.String()), 0o644); err != nil {
				t.Error(err)
			}
		}()
	}
	layout := cfg.controller.Layout
	fmt.Fprintf(&md, "Driver %s (GPFIFO_SCHEDULE %d bytes). Victim: %s.\n\n", layout.Version, layout.ScheduleSize, strings.Join(cfg.victim, " "))
	tr, err := NewTracer(&cfg.tracer)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	reg, err := NewRegistry(nil)
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := NewController(reg, &cfg.controller)
	if err != nil {
		t.Fatal(err)
	}
	defer ctrl.Close()
	// Count every control this process issues, for the report.
	var issuedMu sync.Mutex
	issued := map[Control]int{}
	sys := ctrl.sys
	ctrl.sys = func(fd int, req uint32, arg unsafe.Pointer) syscall.Errno {
		if req == ReqRMControl {
			issuedMu.Lock()
			issued[Control((*NVOS54)(arg).Cmd)]++
			issuedMu.Unlock()
		}
		return sys(fd, req, arg)
	}

	// The victim: a CUDA process spinning one kernel that writes the GPU
	// global timer and a counter into host-mapped memory.
	cmd := exec.Command(cfg.victim[0], cfg.victim[1:]...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	if err != nil {
		t.Fatalf("victim: %v", err)
	}
	var addr uintptr
	if _, err := fmt.Sscanf(line, "ready %v", &addr); err != nil {
		t.Fatalf("victim said %q", line)
	}
	pid := uint32(cmd.Process.Pid)
	progress := func() (gpuNs, count uint64) {
		var buf [16]byte
		local := []unix.Iovec{{Base: &buf[0], Len: 16}}
		remote := []unix.RemoteIovec{{Base: addr, Len: 16}}
		if n, err := unix.ProcessVMReadv(int(pid), local, remote, 0); err != nil || n != 16 {
			t.Fatalf("process_vm_readv: %d, %v", n, err)
		}
		return binary.LittleEndian.Uint64(buf[:]), binary.LittleEndian.Uint64(buf[8:])
	}

	// 1. What the tracer saw while CUDA created its context.
	md.WriteString("### Allocation sequence traced\n\n| # | call | fd | client | parent | object | class | engine / value |\n|---|---|---|---|---|---|---|---|\n")
	n := 0
	var followErrs []error
	// collect applies the victim's traced calls until none came for quiet,
	// writing a table row for each into w.
	collect := func(w *strings.Builder, quiet time.Duration) {
		for {
			tr.SetDeadline(time.Now().Add(quiet))
			var ev trace.Event
			err := tr.Read(&ev)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				tr.SetDeadline(time.Time{})
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ev.PID != pid {
				continue
			}
			n++
			rm := ev.RM
			extra := ""
			switch {
			case ev.Kind == trace.KindRMAlloc && Class(rm.Class) == ClassChannelGroup:
				extra = EngineType(rm.EngineType).String()
			case ev.Kind == trace.KindRMAlloc:
				extra = fmt.Sprint(rm.Value)
			case ev.Kind == trace.KindRMControl:
				extra = fmt.Sprintf("%s %d", Control(rm.Cmd), rm.Value)
			}
			parent, class := fmt.Sprintf("%#x", rm.Parent), Class(rm.Class).String()
			if ev.Kind == trace.KindRMControl || ev.Kind == trace.KindExit {
				parent, class = "", ""
			}
			fmt.Fprintf(w, "| %d | %s | %d | %#x | %s | %#x | %s | %s |\n", n, ev.Kind, rm.FD, rm.Client, parent, rm.Object, class, extra)
			if err := ctrl.Follow(reg.Apply(&ev)); err != nil {
				followErrs = append(followErrs, err)
			}
		}
	}
	collect(&md, time.Second)
	p, err := reg.Process(pid)
	if err != nil {
		t.Fatalf("victim's allocations not traced: %v", err)
	}
	var groups []Group
	md.WriteString("\n### Registry\n\n")
	for _, c := range p.Clients {
		fmt.Fprintf(&md, "- client %#x on fd %d\n", c.Handle, c.FD)
		for _, d := range c.Devices {
			fmt.Fprintf(&md, "  - device %#x instance %d, subdevices %x\n", d.Handle, d.Instance, d.Subdevices)
			for _, g := range d.Groups {
				fmt.Fprintf(&md, "    - channel group %#x engine %s, %d channels, timeslice %d by %q\n", g.Handle, g.Engine, len(g.Channels), g.Timeslice, g.TimesliceBy)
				groups = append(groups, g)
			}
		}
	}
	if len(groups) == 0 {
		t.Fatal("no channel groups traced")
	}

	// 2. Each control on each group, with the status the driver returned.
	md.WriteString("\n### Controls from another process (pidfd_getfd)\n\n| group | engine | control | argument | result | read back |\n|---|---|---|---|---|---|\n")
	status := func(err error) string {
		if err == nil {
			return "NV_OK"
		}
		return strings.ReplaceAll(err.Error(), "|", "/")
	}
	for _, g := range groups {
		one := []Group{g}
		var info GetInfoParams
		err := ctrl.onGroups(pid, one, func(f *rmFile, g Group) error {
			return f.control(g, CtrlGetInfo, unsafe.Pointer(&info), uint32(unsafe.Sizeof(info)))
		})
		fmt.Fprintf(&md, "| %#x | %s | GET_INFO | | %s | tsgID %d |\n", g.Handle, g.Engine, status(err), info.TSGID)
		for _, us := range []uint64{0, 1, 50, 100, 1000, 1024, 5000, 1_000_000, 2_000_000} {
			var got TimesliceParams
			err := ctrl.onGroups(pid, one, func(f *rmFile, g Group) error {
				if us != 0 {
					if err := f.setTimeslice(g, us); err != nil {
						return err
					}
				}
				return f.control(g, CtrlGetTimeslice, unsafe.Pointer(&got), uint32(unsafe.Sizeof(got)))
			})
			arg := fmt.Sprintf("%d µs", us)
			if us == 0 {
				arg = "(read only)"
			}
			fmt.Fprintf(&md, "| %#x | %s | SET_TIMESLICE | %s | %s | %d µs |\n", g.Handle, g.Engine, arg, status(err), got.TimesliceUs)
		}
	}
	// Interleave levels: the driver cannot read them back (it does not
	// export GET_INTERLEAVE_LEVEL), so the registry's record is shown.
	for _, l := range []sched.Interleave{sched.InterleaveLow, sched.InterleaveHigh, sched.InterleaveMedium} {
		err := ctrl.SetInterleave(pid, l)
		for _, g := range groups {
			recorded := "(none)"
			if now, _ := reg.Groups(pid, int(g.Instance)); len(now) > 0 {
				for _, n := range now {
					if n.Handle == g.Handle && n.Interleave >= 0 {
						recorded = sched.Interleave(n.Interleave).String()
					}
				}
			}
			fmt.Fprintf(&md, "| %#x | %s | SET_INTERLEAVE_LEVEL | %s | %s | %s (registry) |\n", g.Handle, g.Engine, l, status(err), recorded)
		}
	}
	if err := ctrl.SetTimeslice(pid, -1, DefaultTimesliceUs); err != nil {
		fmt.Fprintf(&md, "\nRestoring the default timeslice: %s\n", status(err))
	}

	// 3. Suspend/resume latency, observed on the victim's kernel.
	waitProgress := func(from uint64, limit time.Duration) (time.Time, bool) {
		end := time.Now().Add(limit)
		for time.Now().Before(end) {
			if _, c := progress(); c != from {
				return time.Now(), true
			}
		}
		return time.Time{}, false
	}
	// lastProgress polls until the counter is still for quiet and
	// returns when it last moved (start if it never did).
	lastProgress := func(start time.Time, quiet, limit time.Duration) (time.Time, bool) {
		_, c := progress()
		last := start
		end := start.Add(limit)
		for time.Now().Before(end) {
			_, c2 := progress()
			now := time.Now()
			if c2 != c {
				c, last = c2, now
			} else if now.Sub(last) >= quiet {
				return last, true
			}
		}
		return last, false
	}
	// Each suspend method on its own, timed: FIFO_DISABLE_CHANNELS (one
	// RPC per GPU, GSP only) and the per-group controls.
	type sample struct{ call, stop, resumeCall, restart time.Duration }
	for _, method := range []struct {
		m    SuspendMethod
		name string
	}{
		{SuspendDisableChannels, "FIFO_DISABLE_CHANNELS on the process's subdevice"},
		{SuspendSchedule, "GPFIFO_SCHEDULE{0} + PREEMPT{bWait, manual timeout} per group"},
	} {
		var samples []sample
		var notes, failed []string
		opts := &SuspendOptions{Method: method.m}
		for i := range cfg.trials {
			_, c := progress()
			if _, ok := waitProgress(c, time.Second); !ok {
				failed = append(failed, fmt.Sprintf("%s trial %d: victim not running before suspend", method.m, i))
				break
			}
			t0 := time.Now()
			steps, err := ctrl.SuspendWith(pid, -1, opts)
			t1 := time.Now()
			if errors.Is(err, ErrNotSupported) && method.m == SuspendDisableChannels {
				// Expected of a GPU without GSP firmware.
				notes = append(notes, fmt.Sprintf("not supported here: %s", status(err)))
				_ = ctrl.Resume(pid, -1)
				break
			}
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s trial %d: Suspend: %s", method.m, i, status(err)))
				_ = ctrl.Resume(pid, -1)
				break
			}
			if i == 0 {
				notes = append(notes, fmt.Sprintf("steps: %+v", steps))
			}
			last, stopped := lastProgress(t0, 20*time.Millisecond, cfg.stopLimit)
			if !stopped {
				failed = append(failed, fmt.Sprintf("%s trial %d: kernel still running %v after Suspend", method.m, i, cfg.stopLimit))
			}
			_, c = progress()
			t2 := time.Now()
			err = ctrl.Resume(pid, -1)
			t3 := time.Now()
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s trial %d: Resume: %s", method.m, i, status(err)))
				break
			}
			again, ok := waitProgress(c, 2*time.Second)
			if !ok {
				failed = append(failed, fmt.Sprintf("%s trial %d: kernel did not restart within 2 s of Resume", method.m, i))
				break
			}
			samples = append(samples, sample{t1.Sub(t0), last.Sub(t0), t3.Sub(t2), again.Sub(t2)})
		}
		fmt.Fprintf(&md, "\n### Suspend (%s: %s) and resume, all groups\n\n", method.m, method.name)
		fmt.Fprintf(&md, "%d of %d trials completed. Stop latency: from the Suspend call to the victim's last observed progress (polled with process_vm_readv); restart: from the Resume call to its first progress.\n\n", len(samples), cfg.trials)
		for _, n := range notes {
			fmt.Fprintf(&md, "- %s\n", strings.ReplaceAll(n, "|", "/"))
		}
		md.WriteString("\n| measure | p50 | p99 | max |\n|---|---|---|---|\n")
		for _, m := range []struct {
			name string
			get  func(sample) time.Duration
		}{
			{"Suspend call", func(s sample) time.Duration { return s.call }},
			{"kernel stopped after", func(s sample) time.Duration { return s.stop }},
			{"Resume call", func(s sample) time.Duration { return s.resumeCall }},
			{"kernel restarted after", func(s sample) time.Duration { return s.restart }},
		} {
			var v []time.Duration
			for _, s := range samples {
				v = append(v, m.get(s))
			}
			p50, p99, max := percentiles(v)
			fmt.Fprintf(&md, "| %s | %v | %v | %v |\n", m.name, p50, p99, max)
		}
		for _, f := range failed {
			fmt.Fprintf(&md, "\n- FAILED %s", f)
		}
		if len(failed) > 0 {
			md.WriteString("\n")
		}
		failures = append(failures, failed...)
	}

	// 4. The unknowns: does disabling alone evict a resident group? Does
	// PREEMPT alone stop it (it stays in the runlist)?
	fmt.Fprintf(&md, "\n\n### Disable alone, preempt alone (%d trials each)\n\n| variant | stopped within %v | median stop |\n|---|---|---|\n", cfg.variantTrials, cfg.stopLimit)
	for _, v := range []struct {
		name string
		fn   func(f *rmFile, g Group) error
		undo func(f *rmFile, g Group) error
	}{
		{"GPFIFO_SCHEDULE{0} only", func(f *rmFile, g Group) error { return f.schedule(g, false, layout.ScheduleSize) },
			func(f *rmFile, g Group) error { return f.schedule(g, true, layout.ScheduleSize) }},
		{"PREEMPT{bWait=1} only", func(f *rmFile, g Group) error { return f.preempt(g) }, nil},
	} {
		stoppedN := 0
		var stops []time.Duration
		var lastErr error
		for range cfg.variantTrials {
			_, c := progress()
			waitProgress(c, time.Second)
			t0 := time.Now()
			if err := ctrl.onGroups(pid, groups, v.fn); err != nil {
				lastErr = err
				break
			}
			last, stopped := lastProgress(t0, 20*time.Millisecond, cfg.stopLimit)
			if stopped {
				stoppedN++
				stops = append(stops, last.Sub(t0))
			}
			if v.undo != nil {
				if err := ctrl.onGroups(pid, groups, v.undo); err != nil {
					lastErr = err
					break
				}
			}
		}
		p50, _, _ := percentiles(stops)
		fmt.Fprintf(&md, "| %s | %d/%d | %v |", v.name, stoppedN, cfg.variantTrials, p50)
		if lastErr != nil {
			fmt.Fprintf(&md, " error: %s", status(lastErr))
		}
		md.WriteString("\n")
	}

	// 5. Correctness after all that, and what CUDA did meanwhile.
	if _, err := fmt.Fprintln(stdin, "stop"); err != nil {
		t.Fatal(err)
	}
	verdict, _ := out.ReadString('\n')
	var later strings.Builder
	collect(&later, 200*time.Millisecond)
	fmt.Fprintf(&md, "\n### After resume\n\nVictim's verification after the trials: `%s`.\n", strings.TrimSpace(verdict))
	fmt.Fprintf(&md, "Re-applying Arbiter's timeslice after the victim's own: %d errors (%v).\n", len(followErrs), followErrs)
	if later.Len() > 0 {
		md.WriteString("\nCalls the victim made after its context was set up (does CUDA re-apply its timeslice?):\n\n| # | call | fd | client | parent | object | class | engine / value |\n|---|---|---|---|---|---|---|---|\n")
		md.WriteString(later.String())
	} else {
		md.WriteString("\nThe victim made no traced call after its context was set up.\n")
	}
	if !strings.HasPrefix(verdict, "correct") {
		failures = append(failures, fmt.Sprintf("victim after resume: %q", strings.TrimSpace(verdict)))
	}
	md.WriteString("\n### Controls Arbiter issued\n\n| control | calls |\n|---|---|\n")
	issuedMu.Lock()
	cmds := slices.Sorted(maps.Keys(issued))
	for _, c := range cmds {
		fmt.Fprintf(&md, "| %s | %d |\n", c, issued[c])
	}
	issuedMu.Unlock()
	return md.String(), failures
}

// percentiles returns the p50, p99 and maximum of v.
func percentiles(v []time.Duration) (p50, p99, max time.Duration) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.5), at(0.99), s[len(s)-1]
}
