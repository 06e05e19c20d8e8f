package workload

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/trace"
)

const usec = uint64(time.Microsecond)

// recordedTrace builds a trace of an LC process ("infer", pid 10) serving
// three requests 10 ms apart, each: H2D copy of 25 kB at +0, kernels
// launched at +5, +6, +7 µs, D2H copy of 25 kB at +8, sync at +9 returning
// at +322 µs. On the default copy model (10 µs + 25 kB/25 GB/s = 11 µs per
// copy) that is exactly three 100 µs kernels. A BE process (pid 20) launches
// two kernels and syncs once.
func recordedTrace(t testing.TB) []byte { return recording(t, false) }

// recording is recordedTrace; with nameOnly, infer was already running
// when the recording started: no exec event, only the name record that
// `arbiter trace --record` writes for such a process.
func recording(t testing.TB, nameOnly bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := trace.NewWriter(&buf, trace.Header{Host: "test"})
	if err != nil {
		t.Fatal(err)
	}
	base := uint64(1_000_000_000)
	write := func(ev trace.Event) {
		if err := w.Write(&ev); err != nil {
			t.Fatal(err)
		}
	}
	if nameOnly {
		if err := w.WriteName(10, "infer"); err != nil {
			t.Fatal(err)
		}
	} else {
		exec := trace.Event{Kind: trace.KindExec, PID: 10, TID: 10, Time: base}
		copy(exec.Proc.Comm[:], "infer")
		write(exec)
	}
	for r := uint64(0); r < 3; r++ {
		t0 := base + 1000*usec + r*10_000*usec
		h2d := trace.Event{Kind: trace.KindCopy, Func: trace.FuncMemcpyHtoDAsyncV2, PID: 10, TID: 10, Time: t0}
		h2d.Copy.Dir, h2d.Copy.Bytes = trace.CopyHtoD, 25000
		write(h2d)
		for k := uint64(5); k <= 7; k++ {
			write(trace.Event{Kind: trace.KindLaunch, Func: trace.FuncLaunchKernel, PID: 10, TID: 10, Time: t0 + k*usec})
		}
		d2h := trace.Event{Kind: trace.KindCopy, Func: trace.FuncMemcpyDtoHAsyncV2, PID: 10, TID: 10, Time: t0 + 8*usec}
		d2h.Copy.Dir, d2h.Copy.Bytes = trace.CopyDtoH, 25000
		write(d2h)
		sync := trace.Event{Kind: trace.KindSync, Func: trace.FuncStreamSynchronize, PID: 10, TID: 10, Time: t0 + 9*usec}
		sync.Sync.Duration = 313 * usec
		write(sync)
		// Not blocking: ignored.
		write(trace.Event{Kind: trace.KindSync, Func: trace.FuncEventRecord, PID: 10, TID: 10, Time: t0 + 400*usec})
	}
	write(trace.Event{Kind: trace.KindLaunch, Func: trace.FuncLaunchKernel, PID: 20, TID: 20, Time: base + 2000*usec})
	write(trace.Event{Kind: trace.KindLaunch, Func: trace.FuncLaunchKernel, PID: 20, TID: 20, Time: base + 2001*usec})
	sync := trace.Event{Kind: trace.KindSync, Func: trace.FuncCtxSynchronize, PID: 20, TID: 20, Time: base + 2002*usec}
	sync.Sync.Duration = 9998 * usec // two 5 ms kernels from 2000 µs
	write(sync)
	write(trace.Event{Kind: trace.KindLaunch, Func: trace.FuncLaunchKernel, PID: 20, TID: 20, Time: base + 12100*usec})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func writeReplaySpec(t *testing.T, data []byte) *File {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rec.trace"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	spec := `
gpus: 1
replay:
  - file: rec.trace
    processes:
      - {comm: infer, name: infer, class: lc, gpu: 0, slo: {target: 1ms}}
      - {pid: 20, name: train, class: be, gpu: 0}
`
	path := filepath.Join(dir, "replay.yaml")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestReplayInference(t *testing.T) {
	f := writeReplaySpec(t, recordedTrace(t))
	ws, err := f.Workloads()
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].Class != sim.ClassLC || ws[1].Class != sim.ClassBE {
		t.Fatalf("workloads %+v", ws)
	}
	// The LC program: arrival at its recorded offset, the recorded calls,
	// three inferred 100 µs kernels, the request ending at the sync.
	prog := ws[0].Program(1, uint64(time.Second))
	var kinds []string
	for {
		op, err := prog.Next(0)
		if err != nil {
			t.Fatal(err)
		}
		if op.Kind == sim.OpStop {
			break
		}
		if op.Kind == sim.OpKernel && op.Dur != 100*usec {
			t.Errorf("kernel duration %d ns, want 100 µs", op.Dur)
		}
		kinds = append(kinds, opName(op))
		if len(kinds) > 100 {
			t.Fatal("program does not stop")
		}
	}
	want := strings.Repeat("wait begin copy sleep kernel sleep kernel sleep kernel sleep copy sleep end ", 3)
	if got := strings.Join(kinds, " ") + " "; got != want {
		t.Errorf("ops\n got %s\nwant %s", got, want)
	}
	// Replayed alone, each request takes what the recording says, 322 µs,
	// plus, for the first, the 20 µs context load of the first switch-in.
	s, err := sim.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(sim.Process{Name: "infer", Class: sim.ClassLC, Program: ws[0].Program(1, uint64(time.Second))}); err != nil {
		t.Fatal(err)
	}
	if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	st := s.Stats().Procs[0]
	if st.Requests != 3 || st.Latency.Min() != 322*usec || st.Latency.Max() != 342*usec || st.Latency.AtOrBelow(330*usec) != 2 {
		t.Errorf("requests %d latency %d–%d ns, want 342, 322, 322 µs", st.Requests, st.Latency.Min(), st.Latency.Max())
	}
	// BE: two 5 ms kernels inferred from the sync; the trailing one gets
	// their mean.
	prog = ws[1].Program(1, uint64(time.Second))
	var durs []uint64
	for {
		op, _ := prog.Next(0)
		if op.Kind == sim.OpStop {
			break
		}
		if op.Kind == sim.OpKernel {
			durs = append(durs, op.Dur/usec)
		}
	}
	if len(durs) != 3 || durs[0] != 5000 || durs[1] != 5000 || durs[2] != 5000 {
		t.Errorf("BE kernels %v µs, want [5000 5000 5000]", durs)
	}
}

// TestReplayByNameRecord: a process already running when the recording
// started has no exec event, only a name record; {comm: infer} finds it
// by that name, with the same calls as when it was exec'd in the trace.
func TestReplayByNameRecord(t *testing.T) {
	calls := func(data []byte) [][]call {
		rec, err := ReadRecording(bytes.NewReader(data), []ReplayProcess{{Comm: "infer", Name: "infer", Class: "lc"}})
		if err != nil {
			t.Fatal(err)
		}
		return rec.Calls
	}
	named, execd := calls(recording(t, true)), calls(recordedTrace(t))
	if len(named[0]) != 18 || len(named[0]) != len(execd[0]) {
		t.Fatalf("by name record: %d calls; by exec: %d; want 18", len(named[0]), len(execd[0]))
	}
	f := writeReplaySpec(t, recording(t, true))
	if ws, err := f.Workloads(); err != nil || ws[0].Name != "infer" {
		t.Fatalf("replay by name record: %v", err)
	}
	tp, err := TraceProcesses(bytes.NewReader(recording(t, true)))
	if err != nil || len(tp) != 2 || tp[0].Comm != "infer" || tp[0].Calls != 21 || tp[1].PID != 20 || tp[1].Comm != "" {
		t.Errorf("trace processes %+v, %v", tp, err)
	}
}

func opName(op sim.Op) string {
	return map[sim.OpKind]string{sim.OpKernel: "kernel", sim.OpCopy: "copy", sim.OpSync: "sync", sim.OpSleep: "sleep",
		sim.OpWaitUntil: "wait", sim.OpBegin: "begin", sim.OpEnd: "end"}[op.Kind]
}

// TestBlockingSynchronizers checks which synchronizers a replay waits on:
// those that block the host until the GPU is done, whichever symbol form
// (_ptsz, cuda.h 13's cuCtxSynchronize_v2) the application called.
func TestBlockingSynchronizers(t *testing.T) {
	want := map[trace.Func]bool{
		trace.FuncStreamSynchronize: true, trace.FuncStreamSynchronizePtsz: true,
		trace.FuncCtxSynchronize: true, trace.FuncCtxSynchronizeV2: true, trace.FuncEventSynchronize: true,
	}
	for _, f := range trace.Funcs() {
		if got := blocking(f); got != want[f] {
			t.Errorf("blocking(%s) = %v, want %v", f, got, want[f])
		}
	}
}

func TestReplayCorrupt(t *testing.T) {
	data := recordedTrace(t)
	cases := map[string][]byte{
		"truncated": data[:len(data)-7],
		"bad magic": append([]byte("NOTATRACE"), data[9:]...),
	}
	flipped := bytes.Clone(data)
	flipped[len(flipped)/2] ^= 0xff
	cases["flipped byte"] = flipped
	for name, d := range cases {
		t.Run(name, func(t *testing.T) {
			f := writeReplaySpecNoLoad(t, d)
			_, err := f.Workloads()
			var fe *trace.FormatError
			if err == nil {
				t.Fatal("corrupt trace accepted")
			}
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), "byte offset") || !strings.Contains(err.Error(), "replay[0].file") {
				t.Errorf("error %v: want a trace.FormatError with its offset, naming replay[0].file", err)
			}
		})
	}
}

// writeReplaySpecNoLoad is writeReplaySpec for data that may not load.
func writeReplaySpecNoLoad(t *testing.T, data []byte) *File {
	return writeReplaySpec(t, data)
}

func TestReplayUnknownProcess(t *testing.T) {
	dir := t.TempDir()
	_ = os.WriteFile(filepath.Join(dir, "rec.trace"), recordedTrace(t), 0o644)
	spec := "gpus: 1\nreplay:\n  - file: rec.trace\n    processes: [{pid: 99, name: ghost, class: be, gpu: 0}]\n"
	f, err := Parse([]byte(spec), filepath.Join(dir, "r.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Workloads(); err == nil || !strings.Contains(err.Error(), "replay[0].processes[0]: no driver calls") {
		t.Errorf("got %v", err)
	}
}

func FuzzReadRecording(f *testing.F) {
	f.Add(recordedTrace(f))
	f.Add([]byte{})
	sel := []ReplayProcess{{Comm: "infer", Name: "infer", Class: "lc"}, {PID: 20, Name: "train", Class: "be"}}
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := ReadRecording(bytes.NewReader(data), sel)
		if err != nil {
			return
		}
		for _, calls := range rec.Calls {
			if len(calls) == 0 {
				continue
			}
			if err := inferDurations(calls, copyModelOf(&sim.Options{})); err != nil {
				continue
			}
			ops := replayOps(calls, rec.Start, true, uint64(trace.DefaultIdleGap), len(data)%2 == 0)
			if ops[len(ops)-1].Kind != sim.OpStop {
				t.Fatal("replay program does not end with stop")
			}
		}
	})
}
