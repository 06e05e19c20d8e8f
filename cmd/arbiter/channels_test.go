package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/config"
	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// runChannels runs `arbiter channels ARGS` on o and returns its output.
func runChannels(ctx context.Context, o *channelsOptions, args ...string) (string, string, error) {
	cmd := newChannelsCmdWith(o)
	var out, errw bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errw)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(ctx)
	return out.String(), errw.String(), err
}

// lockedBuffer is a bytes.Buffer that one goroutine writes while another
// reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitText waits until b holds every one of want, failing the test if the
// command writing it ends first (done) or a minute passes.
func waitText(t *testing.T, b *lockedBuffer, done <-chan error, want ...string) {
	t.Helper()
	has := func() bool {
		s := b.String()
		for _, w := range want {
			if !strings.Contains(s, w) {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(time.Minute); !has(); time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("the command ended (%v) before it wrote %q:\n%s", err, want, b.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q within a minute:\n%s", want, b.String())
		}
	}
}

func TestChannelsErrors(t *testing.T) {
	dir := t.TempDir()
	noCaps := func() (caps.Set, error) { return 0, nil }
	all := func() (caps.Set, error) { return ^caps.Set(0), nil }
	present := filepath.Join(dir, "nvidiactl")
	if err := os.WriteFile(present, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A present control file, a state of its own and no tracer.
	keep := []string{"--control", present, "--state-dir", filepath.Join(dir, "state"), "--pin-path", ""}
	tests := []struct {
		name string
		o    channelsOptions
		args []string
		want string
		code int
	}{
		{"no driver", channelsOptions{}, []string{"list", "--control", filepath.Join(dir, "absent")}, "no NVIDIA driver: " + filepath.Join(dir, "absent") + " does not exist", 1},
		{"no driver suspend", channelsOptions{}, []string{"suspend", "42", "--control", filepath.Join(dir, "absent")}, "no NVIDIA driver", 1},
		{"no privileges list", channelsOptions{haveCaps: noCaps}, []string{"list", "--control", present}, "listing channel groups needs CAP_BPF and CAP_PERFMON and CAP_SYS_PTRACE, which this process lacks", 77},
		{"no privileges suspend", channelsOptions{haveCaps: noCaps}, []string{"suspend", "42", "--control", present}, "needs CAP_SYS_PTRACE", 77},
		{"no ptrace", channelsOptions{haveCaps: func() (caps.Set, error) { return 1<<caps.BPF | 1<<caps.Perfmon, nil }}, []string{"timeslice", "42", "100", "--control", present}, "needs CAP_SYS_PTRACE, which this process lacks", 77},
		{"bad pid", channelsOptions{}, []string{"suspend", "x"}, `PID "x": want a positive process id`, 2},
		{"zero pid", channelsOptions{}, []string{"resume", "0"}, `PID "0"`, 2},
		{"bad timeslice", channelsOptions{}, []string{"timeslice", "42", "5ms"}, `MICROSECONDS "5ms"`, 2},
		{"bad level", channelsOptions{}, []string{"interleave", "42", "max"}, `interleave level "max"`, 2},
		{"bad method", channelsOptions{}, []string{"suspend", "42", "--method", "preempt"}, `--method "preempt": want auto, schedule or disable-channels`, 2},
		{"bad format", channelsOptions{}, []string{"list", "--format", "xml"}, `--format "xml"`, 2},
		{"bad rdev", channelsOptions{haveCaps: all}, []string{"list", "--control", present, "--control-rdev", "x"}, `--control-rdev "x"`, 2},
		{"driver 530", channelsOptions{haveCaps: all}, append([]string{"timeslice", "42", "100", "--driver-version", "530.41.03"}, keep...),
			"driver 530.41.03: driver not supported: Arbiter needs 535.43.02 or later. Before 535.43.02 RM_ALLOC's blocks had no paramsSize: NVOS21's status is at byte 24", 1},
		{"driver 525 watch", channelsOptions{haveCaps: all}, append([]string{"watch", "--driver-version", "525.147.05"}, keep...),
			"driver 525.147.05: driver not supported", 1},
		{"driver 600", channelsOptions{haveCaps: all}, append([]string{"suspend", "42", "--driver-version", "600.12"}, keep...),
			"driver 600.12: driver version not verified: the newest driver checked is 595.45.04 (the 595 branch); refusing channel control", 1},
		{"driver 600 hint", channelsOptions{haveCaps: all}, append([]string{"list", "--driver-version", "600.12"}, keep...),
			"to accept the risk, pass --allow-unverified-driver", 1},
		{"driver 600 allowed", channelsOptions{haveCaps: all}, append([]string{"suspend", "42", "--driver-version", "600.12", "--allow-unverified-driver"}, keep...),
			"process 42 created its CUDA context while no Arbiter tracer ran", 1},
	}
	for _, tc := range tests {
		o := tc.o
		_, errw, err := runChannels(context.Background(), &o, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
			continue
		}
		if strings.HasSuffix(tc.name, "allowed") && !strings.Contains(errw, "warning: driver 600.12 is newer than 595.45.04, the newest whose layouts were checked: using that branch's layouts (--allow-unverified-driver)") {
			t.Errorf("%s: no warning: %q", tc.name, errw)
		}
		code := 1
		var ec exitCoder
		if errors.As(err, &ec) {
			code = ec.ExitCode()
		}
		if code != tc.code {
			t.Errorf("%s: exit code %d, want %d", tc.name, code, tc.code)
		}
	}
}

func TestExplain(t *testing.T) {
	err := explain(42, fmt.Errorf("x: %w", nvrm.ErrUnknownProcess))
	if !errors.Is(err, nvrm.ErrUnknownProcess) || !strings.Contains(err.Error(), "process 42 created its CUDA context while no Arbiter tracer ran") {
		t.Errorf("unknown: %v", err)
	}
	err = explain(42, nvrm.ErrProcessExited)
	if !errors.Is(err, nvrm.ErrProcessExited) || !strings.HasPrefix(err.Error(), "process 42 exited") {
		t.Errorf("exited: %v", err)
	}
	if explain(1, nil) != nil {
		t.Error("nil error explained")
	}
}

func TestWatchText(t *testing.T) {
	tests := []struct {
		ev   trace.Event
		want string
	}{
		{trace.Event{Kind: trace.KindRMAlloc, PID: 7, Time: 1_500_000_000, RM: trace.RM{FD: 4, Client: 0xc1d00001, Parent: 0x5c000001, Object: 0x5c000003, Class: 0xA06C, EngineType: 1}},
			"1.500000 pid 7 rm_alloc fd 4 client 0xc1d00001 parent 0x5c000001 object 0x5c000003 channel-group engine graphics"},
		{trace.Event{Kind: trace.KindRMAlloc, PID: 7, RM: trace.RM{FD: 4, Client: 1, Parent: 1, Object: 2, Class: 0x80, Value: 3}},
			"0.000000 pid 7 rm_alloc fd 4 client 0x1 parent 0x1 object 0x2 device instance 3"},
		{trace.Event{Kind: trace.KindRMControl, PID: 7, RM: trace.RM{FD: 4, Client: 1, Object: 3, Cmd: 0xA06C0103, Value: 2000}},
			"0.000000 pid 7 rm_control fd 4 client 0x1 object 0x3 SET_TIMESLICE 2000"},
		{trace.Event{Kind: trace.KindRMFree, PID: 7, RM: trace.RM{FD: 4, Client: 1, Parent: 2, Object: 3}},
			"0.000000 pid 7 rm_free fd 4 client 0x1 parent 0x2 object 0x3"},
		{trace.Event{Kind: trace.KindExit, PID: 7}, "0.000000 pid 7 exit"},
	}
	for _, tc := range tests {
		if got := watchText(&tc.ev); got != tc.want {
			t.Errorf("\n got %q\nwant %q", got, tc.want)
		}
	}
	if got := bpffsRoot("/sys/fs/bpf/arbiter/nvrm"); got != "/sys/fs/bpf" {
		t.Errorf("bpffsRoot: %q", got)
	}
	if got := bpffsRoot("/tmp/x/bpf/nvrm"); got != "/tmp/x/bpf" {
		t.Errorf("bpffsRoot: %q", got)
	}
}

// TestChannelsStandin runs the commands against the stand-in control
// file: watch traces a process starting, list shows it, timeslice,
// suspend and resume control it, and a process never traced is unknown.
func TestChannelsStandin(t *testing.T) {
	testenv.Privileged(t)
	dir := t.TempDir()
	bin, err := rmstandin.Build(dir)
	if err != nil {
		testenv.Skip(t, "cannot build the stand-in: %v", err)
	}
	ctl, err := rmstandin.MakeControlFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	fs := filepath.Join(dir, "bpf")
	if err := nvrm.MountBPFFS(fs); err != nil {
		testenv.Skip(t, "%v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(fs, 0) })
	flags := []string{"--control", ctl, "--control-rdev", "1:7", "--accept-errno", "25", "--driver-version", "575.51.03",
		"--state-dir", filepath.Join(dir, "state"), "--pin-path", filepath.Join(fs, "nvrm")}
	run := func(ctx context.Context, args ...string) (string, string, error) {
		return runChannels(ctx, &channelsOptions{}, append(args, flags...)...)
	}

	// watch, with a process starting once it says it is attached; it is
	// stopped once it has shown the process's calls (or after a minute).
	var wout, werr lockedBuffer
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watched := make(chan error, 1)
	go func() {
		cmd := newChannelsCmdWith(&channelsOptions{})
		cmd.SetOut(&wout)
		cmd.SetErr(&werr)
		cmd.SetArgs(append([]string{"watch"}, flags...))
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		watched <- cmd.ExecuteContext(wctx)
	}()
	waitText(t, &werr, watched, "watching: the RM tracer is attached, left attached on exit (--pin)")
	sp, pid := startStandinProcess(t, bin, ctl)
	waitText(t, &wout, watched,
		fmt.Sprintf("pid %d rm_alloc fd %d client 0xc1d00042 parent 0x0 object 0xc1d00042 client", pid, sp.fd),
		fmt.Sprintf("pid %d rm_alloc fd %d client 0xc1d00042 parent 0x5c000001 object 0x5c000003 channel-group engine graphics", pid, sp.fd),
		fmt.Sprintf("pid %d rm_alloc fd %d client 0xc1d00042 parent 0x5c000001 object 0x5c000005 channel-group engine copy0", pid, sp.fd),
		fmt.Sprintf("pid %d rm_control fd %d client 0xc1d00042 object 0x5c000003 SET_TIMESLICE 2000", pid, sp.fd))
	stopWatch()
	if err := <-watched; err != nil {
		t.Fatalf("watch: %v\n%s", err, werr.String())
	}
	if errw := werr.String(); !strings.Contains(errw, "undecodable; dropped in the kernel: 0 (ring buffer full)") || !strings.Contains(errw, "tracer: ") {
		t.Errorf("watch did not report its counters: %q", errw)
	}

	// list, from the pinned tracer and state watch left.
	out, errw, err := run(context.Background(), "list", "--format", "json")
	if err != nil {
		t.Fatalf("list: %v\n%s", err, errw)
	}
	var procs []listedProcess
	if err := json.Unmarshal([]byte(out), &procs); err != nil {
		t.Fatalf("list json: %v\n%s", err, out)
	}
	var me *listedProcess
	for i := range procs {
		if procs[i].PID == pid {
			me = &procs[i]
		}
	}
	if me == nil || !me.Known || len(me.Groups) != 3 {
		t.Fatalf("list: %s", out)
	}
	g := me.Groups[0]
	if g.Client != "0xc1d00042" || g.FD != sp.fd || g.GPU != 0 || g.Group != "0x5c000003" || g.Engine != "graphics" || g.Channels != 1 ||
		g.Timeslice != 2000 || g.TimesliceBy != "process" || g.State != "scheduled" || g.Queried == nil || *g.Queried != 0 {
		t.Fatalf("listed group: %+v", g)
	}
	if me.Comm != "rmstandin" {
		t.Errorf("comm %q", me.Comm)
	}

	// timeslice, suspend, resume.
	out, errw, err = run(context.Background(), "timeslice", fmt.Sprint(pid), "300", "--gpu", "1")
	if err != nil || !strings.Contains(out, fmt.Sprintf("process %d group 0x5c000011 (graphics, GPU 1): timeslice set to 300 µs", pid)) || !strings.Contains(out, "1 group(s)") {
		t.Fatalf("timeslice: %v\n%s%s", err, out, errw)
	}
	out, errw, err = run(context.Background(), "suspend", fmt.Sprint(pid), "--for", "10ms")
	if err != nil || !strings.Contains(out, fmt.Sprintf("process %d suspended in", pid)) || !strings.Contains(out, fmt.Sprintf("process %d resumed in", pid)) ||
		!strings.Contains(out, "(GPU 0: schedule, 2 groups; GPU 1: schedule, 1 group)") {
		t.Fatalf("suspend: %v\n%s%s", err, out, errw)
	}
	// Its copy group's channels were not traced: FIFO_DISABLE_CHANNELS
	// cannot be named for it; a stand-in with every channel can.
	_, _, err = run(context.Background(), "suspend", fmt.Sprint(pid), "--method", "disable-channels", "--for", "10ms")
	if err == nil || !strings.Contains(err.Error(), "FIFO_DISABLE_CHANNELS cannot be used: no channel of channel group 0x5c000005 was traced (use the schedule method)") {
		t.Fatalf("suspend --method disable-channels: %v", err)
	}
	sp2, pid2 := startStandinProcess(t, bin, ctl, rmstandin.ChannelsFlag)
	out, errw, err = run(context.Background(), "suspend", fmt.Sprint(pid2), "--method", "disable-channels", "--for", "10ms")
	if err != nil || !strings.Contains(out, fmt.Sprintf("process %d suspended in", pid2)) ||
		!strings.Contains(out, "(GPU 0: disable-channels, 2 groups; GPU 1: disable-channels, 1 group)") || !strings.Contains(out, fmt.Sprintf("process %d resumed in", pid2)) {
		t.Fatalf("suspend --method disable-channels: %v\n%s%s", err, out, errw)
	}
	sp2.exit(t)
	out, _, err = run(context.Background(), "list")
	if err != nil || !strings.Contains(out, "300µs by arbiter") || strings.Contains(out, "suspended") {
		t.Fatalf("list after control: %v\n%s", err, out)
	}
	if out, _, err = run(context.Background(), "resume", fmt.Sprint(pid)); err != nil || !strings.Contains(out, "resumed") {
		t.Fatalf("resume: %v\n%s", err, out)
	}

	// A fresh state and no tracer: the same process is unknown.
	fresh := []string{"--control", ctl, "--control-rdev", "1:7", "--accept-errno", "25", "--driver-version", "575.51.03",
		"--state-dir", filepath.Join(dir, "state2"), "--pin-path", filepath.Join(fs, "none")}
	out, errw, err = runChannels(context.Background(), &channelsOptions{}, append([]string{"list"}, fresh...)...)
	if err != nil || !strings.Contains(out, fmt.Sprintf("%d  rmstandin", pid)) || !strings.Contains(out, "handles unknown") || !strings.Contains(errw, "no tracer is pinned") {
		t.Fatalf("list unknown: %v\n%s%s", err, out, errw)
	}
	_, _, err = runChannels(context.Background(), &channelsOptions{}, append([]string{"suspend", fmt.Sprint(pid)}, fresh...)...)
	if !errors.Is(err, nvrm.ErrUnknownProcess) || !strings.Contains(err.Error(), "keep `arbiter run` or `arbiter channels watch` running") {
		t.Fatalf("suspend unknown: %v", err)
	}

	// The process exits: control says so.
	sp.exit(t)
	_, _, err = run(context.Background(), "timeslice", fmt.Sprint(pid), "300")
	if !errors.Is(err, nvrm.ErrUnknownProcess) && !errors.Is(err, nvrm.ErrProcessExited) {
		t.Fatalf("after exit: %v", err)
	}
	// Leave no pinned tracer behind.
	if _, _, err := run(context.Background(), "watch", "--duration", "10ms", "--pin=false"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(fs, "nvrm", "link_nvrm_enter")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pins left: %v", err)
	}
}

// standinProcess is a running stand-in.
type standinProcess struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	fd  int32
}

func startStandinProcess(t *testing.T, bin, ctl string, args ...string) (*standinProcess, uint32) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{ctl}, args...)...)
	in, _ := cmd.StdinPipe()
	outp, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(outp).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	sp := &standinProcess{cmd: cmd, in: in}
	if _, err := fmt.Sscanf(line, "ready %d", &sp.fd); err != nil {
		t.Fatalf("stand-in: %q", line)
	}
	return sp, uint32(cmd.Process.Pid)
}

func (s *standinProcess) exit(t *testing.T) {
	t.Helper()
	_, _ = io.WriteString(s.in, "exit\n")
	if err := s.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

// The driver's channel control is the engine's ChannelController as it
// is: both speak the shared vocabulary's interleave levels.
var _ engine.ChannelController = (*nvrm.Controller)(nil)

// TestChannelControllerUnknownProcess: a process whose handles were never
// observed is an error at every control, never a guess.
func TestChannelControllerUnknownProcess(t *testing.T) {
	reg, err := nvrm.NewRegistry(nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := nvrm.LayoutFor(nvrm.DriverVersion{Major: 570, Minor: 86, Patch: 15}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nvrm.NewController(reg, &nvrm.ControllerOptions{Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	a := engine.ChannelController(c)
	for name, err := range map[string]error{
		"timeslice":  a.SetTimeslice(4242, 0, 100),
		"interleave": a.SetInterleave(4242, sched.InterleaveLow),
		"suspend":    a.Suspend(4242, 0),
		"resume":     a.Resume(4242, 0),
	} {
		if !errors.Is(err, nvrm.ErrUnknownProcess) {
			t.Errorf("%s: %v, want ErrUnknownProcess", name, err)
		}
	}
}

// TestChannelsInterleaveCapabilities runs `arbiter channels interleave` as
// root with capabilities dropped by setpriv: without CAP_SYS_NICE and
// CAP_SYS_ADMIN it refuses up front (exit status 77) naming what it needs;
// with either one it sets the level on the stand-in process.
func TestChannelsInterleaveCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to drop capabilities with setpriv")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testenv.Skip(t, "setpriv (util-linux) not installed")
	}
	dir := t.TempDir()
	bin, err := rmstandin.Build(dir)
	if err != nil {
		testenv.Skip(t, "cannot build the stand-in: %v", err)
	}
	ctl, err := rmstandin.MakeControlFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	sp, pid := startStandinProcess(t, bin, ctl)
	// The handles a tracer would have saved: no tracer runs here.
	state := filepath.Join(dir, "state")
	reg, err := nvrm.NewRegistry(&nvrm.RegistryOptions{StatePath: filepath.Join(state, "state.json")})
	if err != nil {
		t.Fatal(err)
	}
	for _, rm := range []trace.RM{
		{FD: sp.fd, Client: rmstandin.Client, Object: rmstandin.Client, Class: uint32(nvrm.ClassRootClient)},
		{FD: sp.fd, Client: rmstandin.Client, Parent: rmstandin.Client, Object: rmstandin.Device0, Class: uint32(nvrm.ClassDevice)},
		{FD: sp.fd, Client: rmstandin.Client, Parent: rmstandin.Device0, Object: rmstandin.GroupGR, Class: uint32(nvrm.ClassChannelGroup), EngineType: 1},
	} {
		reg.Apply(&trace.Event{Kind: trace.KindRMAlloc, PID: pid, RM: rm})
	}
	if err := reg.Save(); err != nil {
		t.Fatal(err)
	}
	run := func(drop string) (string, int) {
		t.Helper()
		cmd := exec.Command(setpriv, "--bounding-set="+drop, "--inh-caps="+drop, os.Args[0],
			"channels", "interleave", fmt.Sprint(pid), "high", "--control", ctl, "--control-rdev", "1:7", "--accept-errno", "25",
			"--driver-version", "575.51.03", "--state-dir", state, "--pin-path", "")
		cmd.Env = append(os.Environ(), "ARBITER_TEST_MAIN=1")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	out, code := run("-sys_nice,-sys_admin")
	if code != 77 || !strings.Contains(out, "arbiter: setting another process's interleave level needs CAP_SYS_NICE, which this process lacks: run it as root (sudo), or grant the capabilities (setcap cap_sys_nice+ep ") ||
		!strings.Contains(out, "or grant CAP_SYS_ADMIN in place of CAP_SYS_NICE: the driver accepts either") {
		t.Fatalf("without CAP_SYS_NICE and CAP_SYS_ADMIN: exit %d\n%s", code, out)
	}
	for _, drop := range []string{"-sys_admin", "-sys_nice"} {
		if out, code := run(drop); code != 0 || !strings.Contains(out, fmt.Sprintf("process %d: interleave level high", pid)) {
			t.Errorf("dropping %s: exit %d\n%s", drop, code, out)
		}
	}
}

// TestChannelsUsage checks that a wrong argument count or flag names the
// subcommand's usage line.
func TestChannelsUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"timeslice", "42"}, "channels timeslice: accepts 2 arg(s), received 1\nusage: channels timeslice PID MICROSECONDS [flags]"},
		{[]string{"interleave", "42", "low", "x"}, "usage: channels interleave PID low|medium|high [flags]"},
		{[]string{"suspend"}, "channels suspend: accepts 1 arg(s), received 0\nusage: channels suspend PID [flags]"},
		{[]string{"resume", "1", "2"}, "usage: channels resume PID [flags]"},
		{[]string{"list", "extra"}, "usage: channels list [flags]"},
		{[]string{"watch", "extra"}, "usage: channels watch [flags]"},
		{[]string{"suspend", "42", "--bogus"}, "unknown flag: --bogus\nusage: channels suspend PID [flags]"},
	} {
		_, _, err := runChannels(context.Background(), &channelsOptions{}, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestChannelsJSONErrors checks that with --format json an error is also
// a JSON object on stdout, with the exit status it ends the command with,
// through main as well.
func TestChannelsJSONErrors(t *testing.T) {
	dir := t.TempDir()
	absent := filepath.Join(dir, "absent")
	present := filepath.Join(dir, "nvidiactl")
	if err := os.WriteFile(present, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	noCaps := func() (caps.Set, error) { return 0, nil }
	for _, tc := range []struct {
		o    channelsOptions
		args []string
		want string
		code int
	}{
		{channelsOptions{}, []string{"list", "--format", "json", "--control", absent}, "no NVIDIA driver: " + absent + " does not exist", 1},
		{channelsOptions{haveCaps: noCaps}, []string{"list", "--format", "json", "--control", present}, "listing channel groups needs CAP_BPF", 77},
		{channelsOptions{}, []string{"watch", "extra", "--format", "json"}, "usage: channels watch [flags]", 2},
		{channelsOptions{}, []string{"watch", "--format", "json", "--control", absent}, "no NVIDIA driver", 1},
		// channels alone lists, and --format belongs to every command.
		{channelsOptions{}, []string{"--format", "json", "--control", absent}, "no NVIDIA driver: " + absent + " does not exist", 1},
		{channelsOptions{}, []string{"suspend", "--format", "json"}, "usage: channels suspend PID [flags]", 2},
	} {
		o := tc.o
		out, _, err := runChannels(context.Background(), &o, tc.args...)
		if err == nil {
			t.Fatalf("%v: no error", tc.args)
		}
		var got jsonError
		dec := json.NewDecoder(strings.NewReader(out))
		if err := dec.Decode(&got); err != nil || dec.More() {
			t.Fatalf("%v: stdout is not one JSON object: %v\n%s", tc.args, err, out)
		}
		if got.Error != err.Error() || !strings.Contains(got.Error, tc.want) || got.ExitCode != tc.code {
			t.Errorf("%v: %+v, want %q and exit code %d", tc.args, got, tc.want, tc.code)
		}
	}
	if _, _, err := runChannels(context.Background(), &channelsOptions{}, "resume", "1", "--format", "yaml"); err == nil ||
		!strings.Contains(err.Error(), "--format \"yaml\": want text or json") {
		t.Errorf("--format yaml: %v", err)
	}
	// Text output has no JSON.
	if out, _, err := runChannels(context.Background(), &channelsOptions{}, "list", "--control", absent); err == nil || out != "" {
		t.Errorf("text: %q, %v", out, err)
	}
	// Through main: the exit status is unchanged, stderr keeps the text.
	cmd := exec.Command(os.Args[0], "channels", "list", "--format", "json", "--control", absent)
	cmd.Env = append(os.Environ(), "ARBITER_TEST_MAIN=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	var got jsonError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || json.Unmarshal(stdout.Bytes(), &got) != nil || got.ExitCode != 1 ||
		!strings.HasPrefix(stderr.String(), "arbiter: no NVIDIA driver") {
		t.Fatalf("main: %v\nstdout %s\nstderr %s", err, stdout.String(), stderr.String())
	}
}

// TestChannelsUseTheDaemonsRegistry: by default the channels commands use
// the daemon's state directory and pinned tracer, so that with a daemon
// running they find it keeping the registry: list shows its saved state,
// control refuses, and neither drains the tracer the daemon reads.
func TestChannelsUseTheDaemonsRegistry(t *testing.T) {
	cmd := newChannelsCmd()
	cfg, _, err := config.Resolve("") // the daemon's configuration, as it reads it
	if err != nil {
		cfg = config.Default()
	}
	if got, want := cmd.PersistentFlags().Lookup("state-dir").DefValue, nvrmStateDir(cfg); got != want {
		t.Errorf("--state-dir defaults to %s, the daemon keeps its registry in %s", got, want)
	}
	if got, want := cmd.PersistentFlags().Lookup("pin-path").DefValue, nvrmPinPath(cfg); got != want {
		t.Errorf("--pin-path defaults to %s, the daemon pins its tracer in %s", got, want)
	}

	// A keeper holding the state directory, as a daemon does.
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	k, err := nvrm.OpenKeeper(&nvrm.KeeperOptions{StateDir: state, Trace: nvrm.TraceNever})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	present := filepath.Join(dir, "nvidiactl")
	if err := os.WriteFile(present, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	all := func() (caps.Set, error) { return ^caps.Set(0), nil }
	args := []string{"--control", present, "--state-dir", state, "--pin-path", "", "--driver-version", "575.51.03"}
	o := channelsOptions{haveCaps: all}
	_, errw, err := runChannels(context.Background(), &o, append([]string{"list", "--no-query"}, args...)...)
	if err != nil || !strings.Contains(errw, "showing its saved state") {
		t.Errorf("list beside a keeper: %v, stderr %q", err, errw)
	}
	o = channelsOptions{haveCaps: all}
	if _, _, err := runChannels(context.Background(), &o, append([]string{"suspend", "42"}, args...)...); !errors.Is(err, nvrm.ErrKeeperRunning) ||
		!strings.Contains(err.Error(), "control channels through it") {
		t.Errorf("suspend beside a keeper: %v", err)
	}
}

// TestWarnDefaults: where the daemon's config file did not load, a
// command that takes its defaults from it says so, naming the flags left
// to the built-in defaults, and says nothing where they were all given.
func TestWarnDefaults(t *testing.T) {
	bad := errors.New("config: /etc/arbiter/config.yaml:3: listen: not HOST:PORT")
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "warning: " + bad.Error() + ": --state-dir and --pin-path take the built-in default, which may not be the daemon's\n"},
		{[]string{"--state-dir", "/s"}, "warning: " + bad.Error() + ": --pin-path takes the built-in default, which may not be the daemon's\n"},
		{[]string{"--state-dir", "/s", "--pin-path", "/p"}, ""},
	} {
		cmd := newChannelsCmd()
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		warnDefaults(&b, cmd, bad, "state-dir", "pin-path")
		if b.String() != c.want {
			t.Errorf("%v: %q, want %q", c.args, b.String(), c.want)
		}
	}
	var b strings.Builder
	warnDefaults(&b, newChannelsCmd(), nil, "state-dir")
	if b.Len() != 0 {
		t.Errorf("a config file that loaded: %q", b.String())
	}
}
