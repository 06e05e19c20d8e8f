package nvrm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/trace"
)

// standinRdev is the stand-in control file's device number.
var standinRdev = MkRdev(rmstandin.Major, rmstandin.Minor)

// standin is a running stand-in CUDA process.
type standin struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	pid   uint32
	ctlFD int32
}

// buildStandin compiles the stand-in and creates its control file.
func buildStandin(t testing.TB) (bin, ctl string) {
	t.Helper()
	dir := t.TempDir()
	bin, err := rmstandin.Build(dir)
	if err != nil {
		testenv.Skip(t, "cannot build the stand-in (gcc): %v", err)
	}
	ctl, err = rmstandin.MakeControlFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	return bin, ctl
}

// startStandin runs the stand-in (with args, e.g. rmstandin.ChannelsFlag)
// and waits until it issued its context's calls.
func startStandin(t testing.TB, bin, ctl string, args ...string) *standin {
	t.Helper()
	return startStandinCmd(t, exec.Command(bin, append([]string{ctl}, args...)...))
}

// startStandinCmd starts cmd, a stand-in command line (with any
// credentials set), and waits until it issued its context's calls.
func startStandinCmd(t testing.TB, cmd *exec.Cmd) *standin {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &standin{cmd: cmd, in: in, out: bufio.NewReader(out), pid: uint32(cmd.Process.Pid)}
	t.Cleanup(func() { s.in.Close(); _ = s.cmd.Process.Kill(); _ = s.cmd.Wait() })
	line, err := s.out.ReadString('\n')
	if err != nil {
		t.Fatalf("stand-in: %v", err)
	}
	if _, err := fmt.Sscanf(line, "ready %d", &s.ctlFD); err != nil {
		t.Fatalf("stand-in said %q: %v", line, err)
	}
	return s
}

// send gives the stand-in a command and waits for it to be done.
func (s *standin) send(t testing.TB, cmd string) {
	t.Helper()
	if _, err := io.WriteString(s.in, cmd+"\n"); err != nil {
		t.Fatal(err)
	}
	if cmd == "exit" {
		if err := s.cmd.Wait(); err != nil {
			t.Fatalf("stand-in exit: %v", err)
		}
		return
	}
	if line, err := s.out.ReadString('\n'); err != nil || line != "ok\n" {
		t.Fatalf("stand-in %q: %q, %v", cmd, line, err)
	}
}

// readEvents reads n events of the given processes from tr.
func readEvents(t testing.TB, tr *Tracer, n int, pids ...uint32) []trace.Event {
	t.Helper()
	var out []trace.Event
	tr.SetDeadline(time.Now().Add(5 * time.Second))
	defer tr.SetDeadline(time.Time{})
	for len(out) < n {
		var ev trace.Event
		if err := tr.Read(&ev); err != nil {
			t.Fatalf("after %d of %d events: %v (got %+v)", len(out), n, err, out)
		}
		for _, p := range pids {
			if ev.PID == p {
				out = append(out, ev)
			}
		}
	}
	return out
}

// rmOf returns the comparable part of events: kind, pid and RM fields.
func rmOf(evs []trace.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = fmt.Sprintf("%s pid=%d %+v", ev.Kind, ev.PID, ev.RM)
	}
	return out
}

func wantRM(kind trace.Kind, pid uint32, rm trace.RM) string {
	return fmt.Sprintf("%s pid=%d %+v", kind, pid, rm)
}

// standinContext is what the tracer must record of the stand-in's start.
func standinContext(pid uint32, fd int32) []string {
	return []string{
		wantRM(trace.KindRMAlloc, pid, trace.RM{FD: fd, Client: rmstandin.Client, Object: rmstandin.Client, Class: 0x41}),
		wantRM(trace.KindRMAlloc, pid, trace.RM{FD: fd, Client: rmstandin.Client, Parent: rmstandin.Client, Object: rmstandin.Device0, Class: 0x80}),
		wantRM(trace.KindRMAlloc, pid, trace.RM{FD: fd, Client: rmstandin.Client, Parent: rmstandin.Device0, Object: rmstandin.Subdevice0, Class: 0x2080}),
		wantRM(trace.KindRMAlloc, pid, trace.RM{FD: fd, Client: rmstandin.Client, Parent: rmstandin.Device0, Object: rmstandin.GroupGR, Class: 0xA06C, EngineType: 1}),
		wantRM(trace.KindRMAlloc, pid, trace.RM{FD: fd, Client: rmstandin.Client, Parent: rmstandin.GroupGR, Object: rmstandin.Channel, Class: 0xC86F}),
		wantRM(trace.KindRMAlloc, pid, trace.RM{FD: fd, Client: rmstandin.Client, Parent: rmstandin.Device0, Object: rmstandin.GroupCE, Class: 0xA06C, EngineType: 9}),
		wantRM(trace.KindRMAlloc, pid, trace.RM{FD: fd, Client: rmstandin.Client, Parent: rmstandin.Client, Object: rmstandin.Device1, Class: 0x80, Value: 1}),
		wantRM(trace.KindRMAlloc, pid, trace.RM{FD: fd, Client: rmstandin.Client, Parent: rmstandin.Device1, Object: rmstandin.GroupGR1, Class: 0xA06C, EngineType: 1}),
		wantRM(trace.KindRMControl, pid, trace.RM{FD: fd, Client: rmstandin.Client, Object: rmstandin.GroupGR, Cmd: uint32(CtrlSetTimeslice), Value: rmstandin.CUDATimeslice}),
		wantRM(trace.KindRMControl, pid, trace.RM{FD: fd, Client: rmstandin.Client, Object: rmstandin.GroupGR, Cmd: uint32(CtrlGPFIFOSchedule), Value: 1}),
		wantRM(trace.KindRMControl, pid, trace.RM{FD: fd, Client: rmstandin.Client, Object: rmstandin.GroupCE, Cmd: uint32(CtrlGPFIFOSchedule), Value: 1}),
	}
}

// standinChannelsContext is standinContext of a stand-in started with
// rmstandin.ChannelsFlag: a channel in each group, a subdevice on device 1.
func standinChannelsContext(pid uint32, fd int32) []string {
	all := standinContext(pid, fd)
	extra := []string{
		wantRM(trace.KindRMAlloc, pid, trace.RM{FD: fd, Client: rmstandin.Client, Parent: rmstandin.GroupCE, Object: rmstandin.ChannelCE, Class: 0xC86F}),
		wantRM(trace.KindRMAlloc, pid, trace.RM{FD: fd, Client: rmstandin.Client, Parent: rmstandin.Device1, Object: rmstandin.Subdevice1, Class: 0x2080}),
		wantRM(trace.KindRMAlloc, pid, trace.RM{FD: fd, Client: rmstandin.Client, Parent: rmstandin.GroupGR1, Object: rmstandin.ChannelGR1, Class: 0xC86F}),
	}
	return append(all[:8:8], append(extra, all[8:]...)...)
}

func assertEvents(t *testing.T, got []trace.Event, want []string) {
	t.Helper()
	g := rmOf(got)
	if len(g) != len(want) {
		t.Fatalf("got %d events, want %d:\n%s", len(g), len(want), strings.Join(g, "\n"))
	}
	for i := range want {
		if g[i] != want[i] {
			t.Errorf("event %d:\n got %s\nwant %s", i, g[i], want[i])
		}
	}
}

// TestStandinEndToEnd drives the whole path on the stand-in: tracer,
// decoder, registry, pidfd_getfd (checked with kcmp), the controls and
// their re-application after the process's own timeslice, suspension
// surviving a restart, frees and exit.
func TestStandinEndToEnd(t *testing.T) {
	testenv.Privileged(t)
	bin, ctl := buildStandin(t)
	tr, err := NewTracer(&TracerOptions{ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	s := startStandin(t, bin, ctl)
	self := uint32(os.Getpid())

	evs := readEvents(t, tr, 11, s.pid)
	assertEvents(t, evs, standinContext(s.pid, s.ctlFD))

	state := filepath.Join(t.TempDir(), "state.json")
	reg, err := NewRegistry(&RegistryOptions{StatePath: state})
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		reg.Apply(&evs[i])
	}
	if err := reg.Save(); err != nil { // as a keeper does after each change
		t.Fatal(err)
	}
	p, err := reg.Process(s.pid)
	if err != nil {
		t.Fatal(err)
	}
	if p.StartTime == 0 || len(p.Clients) != 1 || p.Clients[0].FD != s.ctlFD || len(p.Clients[0].Devices) != 2 {
		t.Fatalf("registry tree: %+v", p)
	}
	d0 := p.Clients[0].Devices[0]
	if d0.Handle != rmstandin.Device0 || len(d0.Groups) != 2 || d0.Subdevices[0] != rmstandin.Subdevice0 {
		t.Fatalf("device 0: %+v", d0)
	}
	gr := d0.Groups[0]
	if gr.Handle != rmstandin.GroupGR || gr.Engine != EngineGraphics || gr.Timeslice != rmstandin.CUDATimeslice || gr.TimesliceBy != "process" ||
		len(gr.Channels) != 1 || gr.Channels[0] != (Channel{rmstandin.Channel, ClassHopperGPFIFO}) {
		t.Fatalf("compute group: %+v", gr)
	}

	ctrl, err := NewController(reg, &ControllerOptions{
		Layout:      mustLayout(t, "575.51.03"),
		ControlRdev: standinRdev,
		AcceptErrno: unix.ENOTTY,
	})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("duplicate is the process's own file", func(t *testing.T) {
		f, err := ctrl.open(s.pid, p.StartTime, s.ctlFD)
		if err != nil {
			t.Fatal(err)
		}
		defer f.close()
		if r, err := kcmpFile(self, s.pid, f.fd, int(s.ctlFD)); err != nil || r != 0 {
			t.Fatalf("kcmp(KCMP_FILE) = %d, %v; want 0 (same file)", r, err)
		}
		// And not merely any file: the stand-in's /dev/null differs.
		if r, err := kcmpFile(self, s.pid, f.fd, int(s.ctlFD)-1); err != nil || r == 0 {
			t.Fatalf("kcmp against another descriptor = %d, %v; want non-zero", r, err)
		}
		// A descriptor of another device is refused.
		if _, err := ctrl.open(s.pid, p.StartTime, s.ctlFD-1); !errors.Is(err, ErrNotControlFile) {
			t.Fatalf("open /dev/null descriptor: %v, want ErrNotControlFile", err)
		}
	})

	t.Run("set timeslice and follow CUDA's own", func(t *testing.T) {
		if err := ctrl.SetTimeslice(s.pid, 0, 500); err != nil {
			t.Fatal(err)
		}
		got := readEvents(t, tr, 2, self)
		for i, h := range []uint32{rmstandin.GroupGR, rmstandin.GroupCE} {
			if got[i].Kind != trace.KindRMControl || got[i].RM.Object != h || got[i].RM.Client != rmstandin.Client ||
				got[i].RM.Cmd != uint32(CtrlSetTimeslice) || got[i].RM.Value != 500 {
				t.Errorf("control %d: %+v", i, got[i])
			}
		}
		s.send(t, "timeslice 3000")
		own := readEvents(t, tr, 1, s.pid)
		ch := reg.Apply(&own[0])
		if ch.Kind != ChangeTimeslice || ch.Group.Handle != rmstandin.GroupGR || ch.Group.Timeslice != 3000 {
			t.Fatalf("change: %+v", ch)
		}
		if err := ctrl.Follow(ch); err != nil {
			t.Fatal(err)
		}
		re := readEvents(t, tr, 1, self)
		if re[0].RM.Object != rmstandin.GroupGR || re[0].RM.Value != 500 || re[0].RM.Cmd != uint32(CtrlSetTimeslice) {
			t.Fatalf("re-applied: %+v", re[0])
		}
		g, _ := reg.Groups(s.pid, 0)
		if g[0].Timeslice != 500 || g[0].TimesliceBy != "arbiter" {
			t.Fatalf("after follow: %+v", g[0])
		}
		// GPU 1 has no timeslice kept: its group is left alone.
		if us, ok := reg.desiredTimeslice(s.pid, 1); ok {
			t.Fatalf("GPU 1 keeps %d µs", us)
		}
	})

	t.Run("reset gives the default back and keeps nothing", func(t *testing.T) {
		if err := ctrl.ResetTimeslice(s.pid, 0); err != nil {
			t.Fatal(err)
		}
		got := readEvents(t, tr, 2, self)
		for i, h := range []uint32{rmstandin.GroupGR, rmstandin.GroupCE} {
			if got[i].RM.Object != h || got[i].RM.Cmd != uint32(CtrlSetTimeslice) || got[i].RM.Value != DefaultTimesliceUs {
				t.Errorf("reset %d: %+v", i, got[i])
			}
		}
		if us, ok := reg.desiredTimeslice(s.pid, 0); ok {
			t.Fatalf("GPU 0 still keeps %d µs", us)
		}
		// The process's own timeslice now stands: nothing re-applied.
		s.send(t, "timeslice 3000")
		own := readEvents(t, tr, 1, s.pid)
		ch := reg.Apply(&own[0])
		if err := ctrl.Follow(ch); err != nil {
			t.Fatal(err)
		}
		if g, _ := reg.Groups(s.pid, 0); g[0].Timeslice != 3000 || g[0].TimesliceBy != "process" {
			t.Fatalf("after the process's own set: %+v", g[0])
		}
	})

	t.Run("suspend survives a restart and is resumed", func(t *testing.T) {
		if err := ctrl.Suspend(s.pid, 0); err != nil {
			t.Fatal(err)
		}
		got := readEvents(t, tr, 4, self)
		want := []struct {
			obj uint32
			cmd Control
			val uint64
		}{
			{rmstandin.GroupGR, CtrlGPFIFOSchedule, 0}, {rmstandin.GroupGR, CtrlPreempt, 1},
			{rmstandin.GroupCE, CtrlGPFIFOSchedule, 0}, {rmstandin.GroupCE, CtrlPreempt, 1},
		}
		for i, w := range want {
			if got[i].RM.Object != w.obj || got[i].RM.Cmd != uint32(w.cmd) || got[i].RM.Value != w.val {
				t.Errorf("suspend call %d: %+v, want %s on %#x value %d", i, got[i].RM, w.cmd, w.obj, w.val)
			}
		}
		// A crash now: a new registry from the state file knows the groups
		// are suspended, and the next controller resumes them.
		reg2, err := NewRegistry(&RegistryOptions{StatePath: state})
		if err != nil {
			t.Fatal(err)
		}
		if sus := reg2.Suspended(); len(sus) != 2 || sus[0].Group.Handle != rmstandin.GroupGR || sus[1].Group.Handle != rmstandin.GroupCE {
			t.Fatalf("suspended after restart: %+v", sus)
		}
		ctrl2, err := NewController(reg2, &ctrl.opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := ctrl2.ResumeAll(); err != nil {
			t.Fatal(err)
		}
		got = readEvents(t, tr, 2, self)
		for i, h := range []uint32{rmstandin.GroupGR, rmstandin.GroupCE} {
			if got[i].RM.Object != h || got[i].RM.Cmd != uint32(CtrlGPFIFOSchedule) || got[i].RM.Value != 1 {
				t.Errorf("resume call %d: %+v", i, got[i].RM)
			}
		}
		if sus := reg2.Suspended(); len(sus) != 0 {
			t.Fatalf("still suspended: %+v", sus)
		}
		reg3, err := NewRegistry(&RegistryOptions{StatePath: state})
		if err != nil {
			t.Fatal(err)
		}
		if sus := reg3.Suspended(); len(sus) != 0 {
			t.Fatalf("state file still lists suspended groups: %+v", sus)
		}
		if _, err := reg3.Process(s.pid); err != nil {
			t.Fatalf("handles lost across restart: %v", err)
		}
	})

	t.Run("free and exit", func(t *testing.T) {
		s.send(t, "free-copy")
		fr := readEvents(t, tr, 1, s.pid)
		if fr[0].Kind != trace.KindRMFree || fr[0].RM.Object != rmstandin.GroupCE || fr[0].RM.Parent != rmstandin.Device0 {
			t.Fatalf("free: %+v", fr[0])
		}
		reg.Apply(&fr[0])
		if g, _ := reg.Groups(s.pid, 0); len(g) != 1 || g[0].Handle != rmstandin.GroupGR {
			t.Fatalf("groups after free: %+v", g)
		}
		start := p.StartTime
		s.send(t, "exit")
		ex := readEvents(t, tr, 1, s.pid)
		if ex[0].Kind != trace.KindExit {
			t.Fatalf("exit: %+v", ex[0])
		}
		if ch := reg.Apply(&ex[0]); ch.Kind != ChangeExit {
			t.Fatalf("exit change: %+v", ch)
		}
		if err := ctrl.SetTimeslice(s.pid, 0, 100); !errors.Is(err, ErrUnknownProcess) {
			t.Fatalf("control after exit: %v, want ErrUnknownProcess", err)
		}
		if _, err := ctrl.open(s.pid, start, s.ctlFD); !errors.Is(err, ErrProcessExited) {
			t.Fatalf("open after exit: %v, want ErrProcessExited", err)
		}
	})

	st, err := tr.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.RingbufFull != 0 || st.BadRecords != 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestStandinPinnedRestart checks that calls made while no tracer reads are
// kept by the pinned programs and ring buffer and read by the next tracer.
func TestStandinPinnedRestart(t *testing.T) {
	testenv.Privileged(t)
	bin, ctl := buildStandin(t)
	fs := t.TempDir()
	if err := MountBPFFS(fs); err != nil {
		testenv.Skip(t, "%v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(fs, 0) })
	pin := filepath.Join(fs, "arbiter", "nvrm")
	opts := &TracerOptions{ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY, PinPath: pin}
	tr1, err := NewTracer(opts)
	if err != nil {
		testenv.Skip(t, "pinning under /sys/fs/bpf: %v", err)
	}
	if err := tr1.Close(); err != nil { // the "daemon" stops; its pins stay
		t.Fatal(err)
	}
	s := startStandin(t, bin, ctl)
	tr2, err := NewTracer(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := tr2.Unpin(); err != nil {
			t.Error(err)
		}
		tr2.Close()
	}()
	var got []trace.Event
	if _, err := tr2.Drain(func(ev *trace.Event) {
		if ev.PID == s.pid {
			got = append(got, *ev)
		}
	}); err != nil {
		t.Fatal(err)
	}
	assertEvents(t, got, standinContext(s.pid, s.ctlFD))
	// Exactly one set of links is attached after the restart: a new call
	// is recorded once.
	s.send(t, "timeslice 7")
	one := readEvents(t, tr2, 1, s.pid)
	tr2.SetDeadline(time.Now().Add(200 * time.Millisecond))
	var ev trace.Event
	for {
		err := tr2.Read(&ev)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err == nil && ev.PID == s.pid {
			t.Fatalf("call recorded twice: %+v and %+v", one[0], ev)
		}
	}
}

func mustLayout(t testing.TB, v string) Layout {
	t.Helper()
	dv, err := ParseDriverVersion(v)
	if err != nil {
		t.Fatal(err)
	}
	l, err := LayoutFor(dv, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// kcmpFile compares descriptor fd1 of pid1 with fd2 of pid2 (KCMP_FILE):
// 0 means the same open file.
func kcmpFile(pid1, pid2 uint32, fd1, fd2 int) (int, error) {
	const kcmpFile = 0
	r, _, e := unix.Syscall6(unix.SYS_KCMP, uintptr(pid1), uintptr(pid2), kcmpFile, uintptr(fd1), uintptr(fd2), 0)
	if e != 0 {
		return -1, syscall.Errno(e)
	}
	return int(r), nil
}
