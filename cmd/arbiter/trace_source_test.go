package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/trace"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// liveOptions are options for a live trace whose checks pass (all
// capabilities, procfs in procRoot) and whose tracer must not be opened:
// opened counts the attempts, and the opener fails with openErr.
func liveOptions(t *testing.T, procRoot string, opened *int, openErr error) *traceOptions {
	t.Helper()
	return &traceOptions{format: "text", idleGap: trace.DefaultIdleGap, procRoot: procRoot,
		haveCaps: func() (caps.Set, error) { return ^caps.Set(0), nil },
		openTracer: func(*uprobe.Options) (*uprobe.Tracer, error) {
			*opened++
			return nil, openErr
		},
		probeFeature: func(caps.Feature) error { return nil },
	}
}

// fakeProc writes procRoot/PID/status with the given thread-group id.
func fakeProc(t *testing.T, procRoot string, pid, tgid int) {
	t.Helper()
	dir := filepath.Join(procRoot, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	status := fmt.Sprintf("Name:\tinfer\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t%d\nPid:\t%d\n", tgid, pid)
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestTracePIDCheckedUpFront(t *testing.T) {
	procRoot := t.TempDir()
	fakeProc(t, procRoot, 100, 100)
	fakeProc(t, procRoot, 101, 100)
	for _, tt := range []struct {
		pids []uint32
		want string
	}{
		{[]uint32{100, 4242}, "--pid 4242: no such process: give the id of a running process"},
		{[]uint32{101}, "--pid 101 is a thread of process 100: give the process id (--pid 100)"},
	} {
		opened := 0
		o := liveOptions(t, procRoot, &opened, errors.New("attached"))
		o.pids = tt.pids
		err := runTrace(context.Background(), o, nil, &bytes.Buffer{}, &bytes.Buffer{}, nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) || opened != 0 {
			t.Errorf("--pid %v: err %v, tracer opened %d times; want %q before opening", tt.pids, err, opened, tt.want)
		}
	}
	// A running process passes on to the tracer.
	opened := 0
	o := liveOptions(t, procRoot, &opened, errors.New("no tracer in this test"))
	o.pids = []uint32{100}
	if err := runTrace(context.Background(), o, nil, &bytes.Buffer{}, &bytes.Buffer{}, nil); opened != 1 ||
		err == nil || err.Error() != "start tracing: no tracer in this test" {
		t.Errorf("running pid: err %v, opened %d", err, opened)
	}
}

func TestTraceRecordCheckedBeforeAttaching(t *testing.T) {
	dir := t.TempDir()
	opened := 0
	o := liveOptions(t, dir, &opened, errors.New("no tracer in this test"))
	o.record = filepath.Join(dir, "missing", "run.arbt")
	err := runTrace(context.Background(), o, nil, &bytes.Buffer{}, &bytes.Buffer{}, nil)
	if err == nil || !strings.Contains(err.Error(), "create the directory "+filepath.Join(dir, "missing")+" first") || opened != 0 {
		t.Errorf("err %v, tracer opened %d times; want the missing directory named before attaching", err, opened)
	}
	// A recording whose tracer then fails to start leaves no file behind.
	o.record = filepath.Join(dir, "run.arbt")
	if err := runTrace(context.Background(), o, nil, &bytes.Buffer{}, &bytes.Buffer{}, nil); err == nil || opened != 1 {
		t.Fatalf("err %v, opened %d", err, opened)
	}
	if _, err := os.Stat(o.record); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("recording left behind after a failed start: %v", err)
	}
}

func TestTraceMissingKernelFeatureExits77(t *testing.T) {
	loadErr := fmt.Errorf("load CUDA probes: %w", unix.EINVAL)
	for _, tt := range []struct {
		name    string
		openErr error
		missing caps.Feature
		want    string // "" = not a missing feature: exit status 1
	}{
		{"ring buffer on 5.4", loadErr, caps.FeatureRingBuf,
			"tracing CUDA calls needs the BPF ring buffer (kernel 5.8 or later), which this system lacks: upgrade the kernel to 5.15 or later"},
		{"no BTF", fmt.Errorf("load: %w", ebpf.ErrNotSupported), caps.FeatureBTF,
			"tracing CUDA calls needs kernel BTF (kernel 5.4 or later), which this system lacks: boot a kernel built with CONFIG_DEBUG_INFO_BTF=y, which provides /sys/kernel/btf/vmlinux"},
		{"no bpf()", loadErr, caps.FeatureBPF, "needs the bpf() system call, which this system lacks: boot a kernel built with CONFIG_BPF_SYSCALL=y"},
		{"no uprobes", loadErr, caps.FeatureUprobes, "needs uprobes, which this system lacks: boot a kernel built with CONFIG_UPROBE_EVENTS=y"},
		{"5.10", loadErr, caps.FeatureCookies, "needs BPF cookies on uprobes (kernel 5.15 or later)"},
		{"tracefs", errors.New("attach tracepoint sched/sched_process_exec: neither debugfs nor tracefs are mounted"), 0,
			"needs tracefs mounted, which this system lacks: mount it (mount -t tracefs nodev /sys/kernel/tracing)"},
		{"memlock", fmt.Errorf("map create: %w (MEMLOCK may be too low, consider rlimit.RemoveMemlock)", unix.EPERM), 0,
			"needs enough locked memory for BPF maps (RLIMIT_MEMLOCK), which this system lacks: raise the limit (ulimit -l unlimited"},
		{"a bad --lib is no kernel feature", errors.New("attach /x/libcuda.so: not an ELF file"), 0, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			opened := 0
			o := liveOptions(t, t.TempDir(), &opened, tt.openErr)
			o.probeFeature = func(f caps.Feature) error {
				if f == tt.missing {
					return fmt.Errorf("probe: %w", ebpf.ErrNotSupported)
				}
				return nil
			}
			err := runTrace(context.Background(), o, nil, &bytes.Buffer{}, &bytes.Buffer{}, nil)
			var ec exitCoder
			isExit77 := errors.As(err, &ec) && ec.ExitCode() == 77
			if tt.want == "" {
				if isExit77 || err == nil || !strings.HasPrefix(err.Error(), "start tracing: ") {
					t.Fatalf("err %v: want a plain start failure, exit status 1", err)
				}
				return
			}
			if !isExit77 || !strings.HasPrefix(err.Error(), "tracing CUDA calls ") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v\nwant exit status 77 and %q", err, tt.want)
			}
			if !errors.Is(err, tt.openErr) {
				t.Errorf("the cause is lost: %v", err)
			}
		})
	}
}

func TestTraceRecordAndReplayThroughStdio(t *testing.T) {
	src := writeReplay(t, replayEvents())
	fromFile, _, err := runCmd(t, "trace", "--replay", src)
	if err != nil {
		t.Fatal(err)
	}

	// --record - writes the recording, and only it, to stdout.
	cmd := newRootCmd("test")
	var recorded, stderr bytes.Buffer
	cmd.SetOut(&recorded)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"trace", "--replay", src, "--record", "-"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(recorded.Bytes(), []byte(trace.Magic)) || bytes.Contains(recorded.Bytes(), []byte("cuLaunchKernel")) {
		t.Fatalf("stdout is not a bare trace file:\n%q", recorded.Bytes())
	}
	if !strings.Contains(stderr.String(), "2 CUDA processes") {
		t.Errorf("no summary on stderr:\n%s", stderr.String())
	}
	if _, err := os.Stat("-"); err == nil {
		t.Error("a file named - was written")
	}

	// --replay - reads it back from stdin.
	cmd = newRootCmd("test")
	var stdout bytes.Buffer
	cmd.SetIn(&recorded)
	cmd.SetOut(&stdout)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"trace", "--replay", "-"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != fromFile {
		t.Errorf("replayed from stdin:\n%s\nfrom the file:\n%s", stdout.String(), fromFile)
	}

	// Garbage on stdin is named as such.
	cmd = newRootCmd("test")
	cmd.SetIn(strings.NewReader("not a trace"))
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"trace", "--replay", "-"})
	if err := cmd.ExecuteContext(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "replay from stdin: ") {
		t.Errorf("garbage on stdin: %v", err)
	}
}

func TestTraceRecordRefusesTerminalAndItsOwnInput(t *testing.T) {
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal to test with: %v", err)
	}
	defer ptmx.Close()
	src := writeReplay(t, replayEvents())
	o := &traceOptions{format: "text", idleGap: trace.DefaultIdleGap, replay: src, record: "-"}
	err = runTrace(context.Background(), o, nil, ptmx, &bytes.Buffer{}, nil)
	if err == nil || !strings.Contains(err.Error(), "standard output is a terminal") {
		t.Errorf("--record - to a terminal: %v", err)
	}
	// As main hands it stdout: through the writer that counts what a
	// command wrote.
	o = &traceOptions{format: "text", idleGap: trace.DefaultIdleGap, replay: src, record: "-"}
	err = runTrace(context.Background(), o, nil, &countingWriter{f: ptmx}, &bytes.Buffer{}, nil)
	if err == nil || !strings.Contains(err.Error(), "standard output is a terminal") {
		t.Errorf("--record - to a terminal, counted: %v", err)
	}

	o = &traceOptions{format: "text", idleGap: trace.DefaultIdleGap, replay: src, record: src}
	err = runTrace(context.Background(), o, nil, &bytes.Buffer{}, &bytes.Buffer{}, nil)
	if err == nil || !strings.Contains(err.Error(), "is the --replay file") {
		t.Errorf("--record onto --replay: %v", err)
	}
	if _, _, err := runCmd(t, "trace", "--replay", src); err != nil {
		t.Errorf("the replayed file was damaged: %v", err)
	}
}

// eventList is an eventSource of the events it holds, then io.EOF.
type eventList []trace.Event

func (l *eventList) Read(ev *trace.Event) error {
	if len(*l) == 0 {
		return io.EOF
	}
	*ev, *l = (*l)[0], (*l)[1:]
	return nil
}

func (l *eventList) Close() error { return nil }

// TestTraceStartsOnceAttached: a live trace leaves out the driver calls
// that entered before every probe was attached, and keeps every process
// event and every call from that instant on.
func TestTraceStartsOnceAttached(t *testing.T) {
	launch := func(at uint64) trace.Event {
		return trace.Event{Kind: trace.KindLaunch, Func: trace.FuncLaunchKernel, Time: at, PID: 7}
	}
	proc := func(k trace.Kind, at uint64) trace.Event { return trace.Event{Kind: k, Time: at, PID: 7} }
	sync := trace.Event{Kind: trace.KindSync, Func: trace.FuncStreamSynchronize, Time: 99, PID: 7}
	copyAt := func(at uint64) trace.Event {
		return trace.Event{Kind: trace.KindCopy, Func: trace.FuncMemcpyHtoDAsync, Time: at, PID: 7}
	}
	src := eventList{proc(trace.KindExec, 10), launch(20), copyAt(30), sync, launch(100), proc(trace.KindExit, 50), copyAt(101)}
	a := &attachedSource{eventSource: &src, from: 100}
	var got []string
	var ev trace.Event
	var err error
	for err = a.Read(&ev); err == nil; err = a.Read(&ev) {
		got = append(got, fmt.Sprintf("%s@%d", ev.Kind, ev.Time))
	}
	if !errors.Is(err, io.EOF) {
		t.Fatalf("read: %v", err)
	}
	if want := "exec@10 launch@100 exit@50 copy@101"; strings.Join(got, " ") != want {
		t.Errorf("read %q, want %q", strings.Join(got, " "), want)
	}
}
