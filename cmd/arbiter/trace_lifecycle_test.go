package main

import (
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/trace"
)

// lifecycleEvents: a compiler and a grep start and exit without a driver
// call; python starts, loads libraries for 300 ms, then launches and
// exits; a process traced from before the trace launches without an exec.
func lifecycleEvents() []trace.Event {
	const ms = 1_000_000
	proc := func(kind trace.Kind, pid uint32, t uint64, comm string) trace.Event {
		return trace.Event{Kind: kind, PID: pid, TID: pid, Time: t * ms, Cgroup: 7, Proc: trace.Proc{PPID: 1, Comm: comm16(comm)}}
	}
	launch := func(pid uint32, t uint64) trace.Event {
		return trace.Event{Kind: trace.KindLaunch, Func: trace.FuncLaunchKernel, PID: pid, TID: pid, Time: t * ms, Cgroup: 7}
	}
	return []trace.Event{
		proc(trace.KindExec, 10, 100, "gcc"),
		proc(trace.KindExec, 20, 110, "python3"),
		proc(trace.KindExec, 11, 120, "grep"),
		proc(trace.KindExit, 11, 130, "grep"),
		launch(30, 140),
		proc(trace.KindExit, 10, 200, "gcc"),
		launch(20, 410),
		launch(20, 420),
		proc(trace.KindExit, 20, 500, "python3"),
	}
}

func TestTraceShowsCUDAProcessesOnly(t *testing.T) {
	path := writeReplay(t, lifecycleEvents())
	stdout, stderr, err := runCmd(t, "trace", "--replay", path)
	if err != nil {
		t.Fatal(err)
	}
	// python3's exec shows at its own time, just before its first launch
	// (held, not reordered: the launches of pid 30 came between).
	want := `    0.040000 30/30         -               launch cuLaunchKernel fn=0x0 stream=0x0 grid=0x0x0 block=0x0x0 smem=0
    0.010000 20/20         python3         exec   ppid=1
    0.310000 20/20         python3         launch cuLaunchKernel fn=0x0 stream=0x0 grid=0x0x0 block=0x0x0 smem=0
    0.320000 20/20         python3         launch cuLaunchKernel fn=0x0 stream=0x0 grid=0x0x0 block=0x0x0 smem=0
    0.400000 20/20         python3         exit   code=0
`
	if stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", stdout, want)
	}
	if !strings.Contains(stderr, "2 CUDA processes (") || !strings.Contains(stderr, "; 2 other processes started or exited") {
		t.Errorf("summary does not count the others:\n%s", stderr)
	}

	// Named by --pid or --comm, a process is shown whole.
	for _, args := range [][]string{{"--pid", "10"}, {"--comm", "gcc"}} {
		stdout, _, err := runCmd(t, append([]string{"trace", "--replay", path}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(pidsOf(stdout), " "); got != "10 10" {
			t.Errorf("%v: pids %q, want gcc's exec and exit\n%s", args, got, stdout)
		}
	}
	// Selected by cgroup only, processes are not named: the same output.
	byCgroup, _, err := runCmd(t, "trace", "--replay", path, "--cgroup", "7")
	if err != nil || byCgroup != stdout {
		t.Errorf("--cgroup 7: %v\n%s\nwant:\n%s", err, byCgroup, stdout)
	}
}

func TestLifecycleFilter(t *testing.T) {
	var shown []string
	emit := func(ev *trace.Event, comm string) error {
		shown = append(shown, ev.Kind.String()+":"+comm)
		return nil
	}
	l := newLifecycleFilter(nil)
	exec := &trace.Event{Kind: trace.KindExec, PID: 1}
	launch := &trace.Event{Kind: trace.KindLaunch, PID: 1}
	exit := &trace.Event{Kind: trace.KindExit, PID: 1}
	rm := &trace.Event{Kind: trace.KindRMAlloc, PID: 2}
	for _, step := range []struct {
		ev   *trace.Event
		comm string
	}{
		{exec, "sh"}, {exec, "python3"}, // the shell execs python: the latest exec is held
		{launch, "python3"}, {exec, "python3"}, // an exec of a CUDA process shows at once
		{rm, "x"}, // an RM call makes a CUDA process too
		{exit, "python3"}, {launch, "reused"},
	} {
		if err := l.pass(step.ev, step.comm, emit); err != nil {
			t.Fatal(err)
		}
	}
	want := "exec:python3 launch:python3 exec:python3 rm_alloc:x exit:python3 launch:reused"
	if got := strings.Join(shown, " "); got != want {
		t.Errorf("shown %q\nwant  %q", got, want)
	}
	if len(l.held) != 0 || len(l.cuda) != 2 {
		t.Errorf("held %v, cuda %v: want nothing held, pids 1 and 2 known", l.held, l.cuda)
	}
}
