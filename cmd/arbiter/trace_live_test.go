package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/trace"
)

// TestTraceLive traces the stub inference workload with the real probes and
// checks every event and the summary.
func TestTraceLive(t *testing.T) {
	testenv.Privileged(t)
	b := cudastub.ForTest(t)
	infer := exec.Command(b.Infer, "--rate", "100", "--duration", "4", "--launches", "4", "--kernel-us", "100", "--bytes", "65536")
	var inferErr bytes.Buffer
	infer.Stderr = &inferErr
	if err := infer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { infer.Process.Kill(); infer.Wait() })
	time.Sleep(200 * time.Millisecond)

	pid := infer.Process.Pid
	rec := filepath.Join(t.TempDir(), "live.arbt")
	o := &traceOptions{format: "json", pids: []uint32{uint32(pid)}, libs: []string{b.Lib},
		duration: 1500 * time.Millisecond, idleGap: trace.DefaultIdleGap, record: rec}
	var stdout, stderr bytes.Buffer
	if err := runTrace(context.Background(), o, nil, &stdout, &stderr, nil); err != nil {
		t.Fatalf("trace: %v\n%s", err, stderr.String())
	}
	counts := map[string]int{}
	var reqStart float64 // time of the request's first copy
	var lastTime float64
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if ev["pid"] != float64(pid) || ev["comm"] != "infer" {
			t.Fatalf("event of another process: %s", line)
		}
		// Printed in time order: the reorder window is longer than any
		// of these syncs, so none comes late.
		if tm := ev["time_ns"].(float64); tm < lastTime {
			t.Errorf("event %s printed after one at %.0f", line, lastTime)
		} else {
			lastTime = tm
		}
		fn, _ := ev["func"].(string)
		counts[fn]++
		switch fn {
		case "cuLaunchKernel":
			if g, _ := json.Marshal(ev["grid"]); string(g) != "[64,1,1]" {
				t.Errorf("grid %s in %s", g, line)
			}
		case "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2":
			if ev["bytes"] != float64(65536) {
				t.Errorf("bytes in %s", line)
			}
			if fn == "cuMemcpyHtoDAsync_v2" {
				reqStart = ev["time_ns"].(float64)
			}
		case "cuStreamSynchronize":
			// The request (copy to sync return) holds 4×100 µs of kernels.
			end := ev["time_ns"].(float64) + ev["duration_ns"].(float64)
			if ev["result_name"] != "CUDA_SUCCESS" || (reqStart > 0 && end-reqStart < 400_000) {
				t.Errorf("sync %s: want success, the request ending >= 400 µs after its copy at %.0f", line, reqStart)
			}
		default:
			t.Errorf("unexpected event %s", line)
		}
	}
	reqs := counts["cuStreamSynchronize"]
	if reqs < 50 || counts["cuLaunchKernel"] < 4*reqs-4 || counts["cuLaunchKernel"] > 4*reqs+4 {
		t.Errorf("counts %v: want ~150 requests of 4 launches in 1.5 s at 100/s", counts)
	}
	sum := stderr.String()
	if !strings.Contains(sum, "attached 31 probes to "+b.Lib) {
		t.Errorf("no attach report:\n%s", sum)
	}
	// With --format json the summary is JSON too: one object, the last
	// line of stderr.
	lines := strings.Split(strings.TrimSpace(sum), "\n")
	var js jsonSummary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &js); err != nil || js.Kind != "summary" {
		t.Fatalf("last line of stderr is not a JSON summary (%v):\n%s", err, sum)
	}
	if len(js.Processes) != 1 {
		t.Fatalf("summary of %d processes, want infer alone:\n%s", len(js.Processes), sum)
	}
	p := js.Processes[0]
	if p.PID != uint32(pid) || p.Comm != "infer" || p.Launches != uint64(counts["cuLaunchKernel"]) ||
		p.Syncs != uint64(counts["cuStreamSynchronize"]) || p.LaunchesPerS == nil {
		t.Errorf("summary %+v does not match %v (launches/s over ~1.5 s)\n%s", p, counts, sum)
	}
	if js.Tracer == nil || js.Tracer.Dropped != 0 || js.Tracer.Events == 0 {
		t.Errorf("tracer counters %+v: want events and no drops", js.Tracer)
	}

	// The recording replays the same events, by name too: infer was
	// running before the trace, so its name comes from a name record.
	replayed, _, err := runCmd(t, "trace", "--replay", rec, "--format", "json", "--comm", "infer")
	if err != nil {
		t.Fatal(err)
	}
	if replayed != stdout.String() {
		t.Errorf("replay differs from the live output:\n%.2000s\nlive:\n%.2000s", replayed, stdout.String())
	}
}
