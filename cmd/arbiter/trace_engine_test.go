package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// callCounts counts launches, copies and syncs per pid.
type callCounts map[uint32][3]uint64

func (c callCounts) add(pid uint32, kind string) {
	n := c[pid]
	switch kind {
	case "launch":
		n[0]++
	case "copy":
		n[1]++
	case "sync":
		n[2]++
	default:
		return
	}
	c[pid] = n
}

// engineCounts returns what the engine's snapshot counted per process,
// and checks that it only observed.
func engineCounts(t *testing.T, e *engine.Engine) callCounts {
	t.Helper()
	got := callCounts{}
	for _, p := range e.Snapshot().Processes {
		got[p.PID] = [3]uint64{p.Launches, p.Copies, p.Syncs}
		if p.Level != sched.LevelObserve || p.State != engine.StateRunning {
			t.Errorf("pid %d at level %s, %s: the trace's engine only observes", p.PID, p.Level, p.State)
		}
	}
	return got
}

// TestTraceRunsOnTheEngine: a replay's events go through the engine's
// loop. The engine applies every event of the file, whatever the filters
// show, and its snapshot counts each CUDA process's launches, copies and
// syncs as printed (before the exits, after which it forgets them); the
// output is the command's as ever.
func TestTraceRunsOnTheEngine(t *testing.T) {
	noExits := replayEvents()[:8]
	for _, tt := range []struct {
		name    string
		evs     []trace.Event
		pids    []uint32
		printed string
		procs   int // in the engine's table at the end
	}{
		{"everything up to the exits", noExits, nil, wantText[:strings.Index(wantText, "    0.020000")], 2},
		{"one pid", replayEvents(), []uint32{200}, "", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var eng *engine.Engine
			o := &traceOptions{format: "text", idleGap: trace.DefaultIdleGap, replay: writeReplay(t, tt.evs), pids: tt.pids,
				ranOn: func(e *engine.Engine) { eng = e }}
			var stdout, stderr bytes.Buffer
			if err := runTrace(context.Background(), o, nil, &stdout, &stderr, nil); err != nil {
				t.Fatal(err)
			}
			if eng == nil {
				t.Fatal("the trace did not run on an engine")
			}
			if tt.printed != "" && stdout.String() != tt.printed {
				t.Errorf("stdout:\n%s\nwant:\n%s", stdout.String(), tt.printed)
			}
			if st := eng.Stats(); st.Events != uint64(len(tt.evs)) || st.Processes != 2 {
				t.Errorf("engine applied %d events of %d processes, want all %d of the file's 2 CUDA processes",
					st.Events, st.Processes, len(tt.evs))
			}
			printed := callCounts{}
			for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
				f := strings.Fields(line)
				if len(f) < 4 {
					continue
				}
				var pid uint32
				for _, c := range strings.Split(f[1], "/")[0] {
					pid = pid*10 + uint32(c-'0')
				}
				printed.add(pid, f[3])
			}
			got := engineCounts(t, eng)
			for pid, n := range printed {
				if got[pid] != n {
					t.Errorf("pid %d: engine counted %v (launches, copies, syncs), printed %v", pid, got[pid], n)
				}
			}
			if len(got) != tt.procs || len(printed) == 0 {
				t.Errorf("engine's processes %v, printed %v; want %d in the table", got, printed, tt.procs)
			}
		})
	}
}

// TestTraceLiveRunsOnTheEngine traces the stub inference workload with
// the real probes: every event printed went through the engine, whose
// snapshot counts what was printed, call for call.
func TestTraceLiveRunsOnTheEngine(t *testing.T) {
	testenv.Privileged(t)
	b := cudastub.ForTest(t)
	infer := exec.Command(b.Infer, "--rate", "100", "--duration", "3", "--launches", "4", "--kernel-us", "100", "--bytes", "4096")
	if err := infer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { infer.Process.Kill(); infer.Wait() })
	time.Sleep(200 * time.Millisecond)
	pid := uint32(infer.Process.Pid)
	var eng *engine.Engine
	o := &traceOptions{format: "json", pids: []uint32{pid}, libs: []string{b.Lib}, duration: time.Second,
		idleGap: trace.DefaultIdleGap, ranOn: func(e *engine.Engine) { eng = e }}
	var stdout, stderr bytes.Buffer
	if err := runTrace(context.Background(), o, nil, &stdout, &stderr, nil); err != nil {
		t.Fatalf("trace: %v\n%s", err, stderr.String())
	}
	printed := callCounts{}
	lines := 0
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var ev struct {
			PID  uint32 `json:"pid"`
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		printed.add(ev.PID, ev.Kind)
		lines++
	}
	if printed[pid][0] < 100 {
		t.Fatalf("printed %v: want ~100 requests of 4 launches in 1 s", printed)
	}
	if eng == nil {
		t.Fatal("the trace did not run on an engine")
	}
	if got := engineCounts(t, eng); got[pid] != printed[pid] {
		t.Errorf("engine counted %v (launches, copies, syncs) for pid %d, printed %v", got[pid], pid, printed[pid])
	}
	if st := eng.Stats(); st.Events < uint64(lines) {
		t.Errorf("engine applied %d events, fewer than the %d printed", st.Events, lines)
	}
}

// TestTraceReplayFromStdinStopsAtOnce: a replay from a pipe whose writer
// goes quiet (a live trace at the other end) stops when asked, without
// waiting for the writer's next event, and shows what it read (held for
// ordering until then: a replay's clock is its events) and the summary.
func TestTraceReplayFromStdinStopsAtOnce(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	w, err := trace.NewWriter(pw, trace.Header{Host: "test"})
	if err != nil {
		t.Fatal(err)
	}
	flushed := make(chan struct{})
	go func() {
		evs := replayEvents()[:5]
		for i := range evs {
			_ = w.Write(&evs[i])
		}
		_ = w.Flush() // and then nothing: the pipe stays open
		close(flushed)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	o := &traceOptions{format: "text", idleGap: trace.DefaultIdleGap, replay: stdio}
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- runTrace(ctx, o, pr, &stdout, &stderr, nil) }()
	// A pipe's write returns once the replay has read the bytes; a little
	// longer, and it has decoded them too.
	select {
	case <-flushed:
	case <-time.After(10 * time.Second):
		t.Fatal("the replay read nothing from its pipe within 10 s")
	}
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the replay did not stop within 5 s of being asked while its input was quiet")
	}
	if got := strings.Join(pidsOf(stdout.String()), " "); got != "100 100 100 200 100" {
		t.Errorf("printed pids %q, want the five events read", got)
	}
	if !strings.Contains(stderr.String(), "2 CUDA processes (") {
		t.Errorf("no summary:\n%s", stderr.String())
	}
}
