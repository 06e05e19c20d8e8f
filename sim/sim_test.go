package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

const us = uint64(time.Microsecond)

// script is a Program that plays a fixed list of operations, then stops.
type script struct {
	ops []Op
	i   int
}

func (s *script) Next(uint64) (Op, error) {
	if s.i == len(s.ops) {
		return Op{Kind: OpStop}, nil
	}
	s.i++
	return s.ops[s.i-1], nil
}

func kernels(durs ...uint64) *script {
	sc := &script{}
	for _, d := range durs {
		sc.ops = append(sc.ops, Op{Kind: OpKernel, Dur: d})
	}
	sc.ops = append(sc.ops, Op{Kind: OpSync})
	return sc
}

// runs returns the run segments of pid as [start,end] pairs in µs.
func runs(st Stats, pid uint32) [][2]uint64 {
	var out [][2]uint64
	for _, seg := range st.Timeline {
		if seg.PID == pid && seg.Kind == SegmentRun {
			out = append(out, [2]uint64{seg.Start / us, seg.End / us})
		}
	}
	return out
}

// outcome runs a simulation of procs to end and describes what it did
// (describe).
func outcome(t *testing.T, opts *Options, end uint64, procs ...Process) string {
	t.Helper()
	s, _ := mustSim(t, opts, procs...)
	if err := s.Run(context.Background(), end); err != nil {
		t.Fatal(err)
	}
	return describe(s.Stats())
}

// describe lists a run's timeline, its GPUs' figures and its processes'
// but for their latency histograms: equal for runs that did the same.
func describe(st Stats) string {
	out := fmt.Sprintf("%v %+v", st.Timeline, st.GPUs)
	for _, p := range st.Procs {
		p.Latency = nil
		out += fmt.Sprintf(" %+v", p)
	}
	return out
}

// readAll reads a started simulation's events to its end, handing each
// to f.
func readAll(t *testing.T, s *Simulator, f func(*trace.Event)) {
	t.Helper()
	for {
		var ev trace.Event
		err := s.Read(&ev)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		f(&ev)
	}
}

func mustSim(t *testing.T, opts *Options, procs ...Process) (*Simulator, []uint32) {
	t.Helper()
	if opts.TimelineWindow == 0 {
		opts.TimelineWindow = time.Hour
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	var pids []uint32
	for _, p := range procs {
		pid, err := s.Add(p)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return s, pids
}

func equalRuns(t *testing.T, name string, got, want [][2]uint64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: runs %v, want %v", name, got, want)
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s: runs %v, want %v", name, got, want)
			return
		}
	}
}

// TestHandComputedTimeslice pins round-robin time-slicing: A has a 5 ms
// kernel, B a 1 ms one, both launched at 0; timeslice 1 ms, switch 20 µs,
// preemption 30 µs.
//
//	0–20 switch to A; A runs 20–1020 (slice ends, 4 ms left)
//	1020–1050 save A; 1050–1070 switch to B; B runs 1070–2070 and completes
//	2070–2090 switch to A; A runs alone 2090–6090 (no one waits: no slices)
func TestHandComputedTimeslice(t *testing.T) {
	s, pids := mustSim(t, &Options{Timeslice: time.Millisecond, ContextSwitch: 20 * time.Microsecond, Preemption: 30 * time.Microsecond},
		Process{Name: "A", Program: kernels(5000 * us)},
		Process{Name: "B", Program: kernels(1000 * us)})
	if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	equalRuns(t, "A", runs(st, pids[0]), [][2]uint64{{20, 1020}, {2090, 6090}})
	equalRuns(t, "B", runs(st, pids[1]), [][2]uint64{{1070, 2070}})
	g := st.GPUs[0]
	if g.Preemptions != 1 || g.Switches != 3 || g.Busy != 6000*us || g.SwitchTime != 60*us || g.PreemptTime != 30*us {
		t.Errorf("gpu stats %+v", g)
	}
	for _, p := range st.Procs {
		if p.KernelsCompleted != 1 || p.KernelsInFlight != 0 || p.Syncs != 1 {
			t.Errorf("%s: %+v", p.Name, p)
		}
	}
}

// TestHandComputedKernelBoundary: with several short kernels queued, a
// slice that expires between kernels switches without a preemption.
//
//	A: 3 × 600 µs; B: 1 × 300 µs; timeslice 1 ms, switch 10 µs, preempt 50 µs
//	0–10 switch A; A 10–610, 610–1010 (second kernel preempted at slice end 1010 with 200 left)
//	1010–1060 save; 1060–1070 switch B; B 1070–1370; 1370–1380 switch A;
//	A 1380–1580 (rest of kernel 2), 1580–2180 (kernel 3)
func TestHandComputedKernelBoundary(t *testing.T) {
	s, pids := mustSim(t, &Options{Timeslice: time.Millisecond, ContextSwitch: 10 * time.Microsecond, Preemption: 50 * time.Microsecond},
		Process{Name: "A", Program: kernels(600*us, 600*us, 600*us)},
		Process{Name: "B", Program: kernels(300 * us)})
	if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	equalRuns(t, "A", runs(st, pids[0]), [][2]uint64{{10, 1010}, {1380, 2180}})
	equalRuns(t, "B", runs(st, pids[1]), [][2]uint64{{1070, 1370}})
	if st.GPUs[0].Preemptions != 1 {
		t.Errorf("preemptions %d", st.GPUs[0].Preemptions)
	}
}

// TestGranularityKernel: with kernel-granularity preemption the 5 ms kernel
// runs to completion before B gets the GPU.
func TestGranularityKernel(t *testing.T) {
	s, pids := mustSim(t, &Options{Timeslice: time.Millisecond, ContextSwitch: 20 * time.Microsecond, Granularity: GranularityKernel},
		Process{Name: "A", Program: kernels(5000 * us)},
		Process{Name: "B", Program: kernels(1000 * us)})
	if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	equalRuns(t, "A", runs(st, pids[0]), [][2]uint64{{20, 5020}})
	equalRuns(t, "B", runs(st, pids[1]), [][2]uint64{{5040, 6040}})
	if st.GPUs[0].Preemptions != 0 {
		t.Errorf("preemptions %d", st.GPUs[0].Preemptions)
	}
}

// TestGranularityBlock: the kernel drains 100 µs past the slice end before
// the save.
func TestGranularityBlock(t *testing.T) {
	s, pids := mustSim(t, &Options{Timeslice: time.Millisecond, ContextSwitch: 20 * time.Microsecond,
		Preemption: 30 * time.Microsecond, Granularity: GranularityBlock, BlockDrain: 100 * time.Microsecond},
		Process{Name: "A", Program: kernels(5000 * us)},
		Process{Name: "B", Program: kernels(1000 * us)})
	if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	equalRuns(t, "A", runs(st, pids[0]), [][2]uint64{{20, 1120}, {2190, 6090}})
	equalRuns(t, "B", runs(st, pids[1]), [][2]uint64{{1170, 2170}})
}

// TestPriorityPreemptsAtOnce: an LC kernel launched at 500 µs preempts
// the BE kernel at once.
func TestPriorityPreemptsAtOnce(t *testing.T) {
	lc := &script{ops: []Op{{Kind: OpWaitUntil, At: 500 * us}, {Kind: OpBegin, At: 500 * us},
		{Kind: OpKernel, Dur: 200 * us}, {Kind: OpEnd}}}
	s, pids := mustSim(t, &Options{Mode: ModePriority, ContextSwitch: 20 * time.Microsecond, Preemption: 30 * time.Microsecond},
		Process{Name: "be", Program: kernels(5000 * us)},
		Process{Name: "lc", Class: ClassLC, Program: lc})
	if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	equalRuns(t, "be", runs(st, pids[0]), [][2]uint64{{20, 500}, {770, 5290}})
	equalRuns(t, "lc", runs(st, pids[1]), [][2]uint64{{550, 750}})
	if got := st.Procs[1].Latency.Max(); got != 250*us {
		t.Errorf("lc latency %d, want 250 µs", got)
	}
}

// TestSpatial: two equal 1 ms kernels co-run at 1/1.5 speed each with
// slowdown 0.5 and finish together at 1.5 ms.
func TestSpatial(t *testing.T) {
	a, b := kernels(1000*us), kernels(1000*us)
	s, _ := mustSim(t, &Options{Mode: ModeSpatial, SpatialSlowdown: 0.5},
		Process{Name: "A", Program: a}, Process{Name: "B", Program: b, Class: ClassLC})
	if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.GPUs[0].Busy != 1500*us {
		t.Errorf("busy %d", st.GPUs[0].Busy)
	}
	for _, p := range st.Procs {
		if p.KernelsCompleted != 1 || p.GPUTime != 1000*us {
			t.Errorf("%s: %+v", p.Name, p)
		}
	}
}

// TestCopiesAndInterleave: copies use their own engines; an interleave
// level of high gives four runlist slots.
func TestCopiesAndInterleave(t *testing.T) {
	cp := &script{ops: []Op{{Kind: OpCopy, Bytes: 25_000_000, Dir: trace.CopyHtoD}, {Kind: OpKernel, Dur: 100 * us}, {Kind: OpSync}}}
	s, pids := mustSim(t, &Options{ContextSwitch: 10 * time.Microsecond},
		Process{Name: "A", Program: cp, Interleave: new(sched.InterleaveHigh)},
		Process{Name: "B", Program: kernels(100 * us), Interleave: new(sched.InterleaveLow)})
	if got := len(s.gpus[0].runlist); got != 5 {
		t.Errorf("runlist length %d, want 5", got)
	}
	// A process nobody set gets the driver's default for a new group.
	d, _ := mustSim(t, &Options{}, Process{Name: "C", Program: kernels(us)})
	if got := d.procs[0].interleave; got != sched.InterleaveMedium {
		t.Errorf("default interleave %v, want medium", got)
	}
	if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	// 25 MB at 25 GB/s = 1 ms + 10 µs latency; B runs meanwhile.
	equalRuns(t, "B", runs(st, pids[1]), [][2]uint64{{10, 110}})
	equalRuns(t, "A", runs(st, pids[0]), [][2]uint64{{1020, 1120}})
	if st.GPUs[0].CopyTime[0] != 1010*us || st.Procs[0].Copies != 1 {
		t.Errorf("copy time %d copies %d", st.GPUs[0].CopyTime[0], st.Procs[0].Copies)
	}
}

// TestSaveThenIdle: a group suspended mid-kernel, with no other group to
// run, is saved, and the engine stays idle to the end of the run: the
// save's time and segment count, whole when the run ends after it, in
// part when it ends during it.
func TestSaveThenIdle(t *testing.T) {
	for _, end := range []uint64{5000 * us, 1012 * us} {
		saveThenIdle(t, end)
	}
}

func saveThenIdle(t *testing.T, end uint64) {
	t.Helper()
	s, pids := mustSim(t, &Options{Observe: true, ContextSwitch: 10 * time.Microsecond, Preemption: 20 * time.Microsecond},
		Process{Name: "be", Program: kernels(3000 * us)})
	s.Start(end)
	var ev trace.Event
	if err := s.SetReadDeadline(1000 * us); err != nil {
		t.Fatal(err)
	}
	for {
		if err := s.Read(&ev); errors.Is(err, trace.ErrDeadline) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Suspend(pids[0], 0); err != nil {
		t.Fatal(err)
	}
	_ = s.SetReadDeadline(0)
	readAll(t, s, func(*trace.Event) {})
	st := s.Stats()
	g := st.GPUs[0]
	saved := min(end, 1020*us) - 1000*us
	if g.Preemptions != 1 || g.PreemptTime != saved || g.SwitchTime != 10*us || g.Busy != 990*us {
		t.Errorf("end %v: gpu stats %+v, want 1 preemption, %v saving, 10µs switching, 990µs busy", time.Duration(end), g, time.Duration(saved))
	}
	want := []Segment{
		{PID: pids[0], Kind: SegmentSwitch, Start: 0, End: 10 * us},
		{PID: pids[0], Kind: SegmentRun, Start: 10 * us, End: 1000 * us},
		{Kind: SegmentPreempt, Start: 1000 * us, End: 1000*us + saved},
	}
	if !slices.Equal(st.Timeline, want) {
		t.Errorf("end %v: timeline %+v, want %+v", time.Duration(end), st.Timeline, want)
	}
}

// TestSuspendResumeAndGate drives the Enforcer through Read and deadlines.
// TestInterleaveDuringSave: a runlist laid out again while a preempted
// kernel is being saved is scanned from its start when the save ends,
// as with no group chosen: C, raised to high, goes first, not B (the
// entry after A in the old layout) nor A (the one after it in the new),
// and A follows it.
func TestInterleaveDuringSave(t *testing.T) {
	s, pids := mustSim(t, &Options{Observe: true, Timeslice: time.Millisecond, ContextSwitch: 10 * time.Microsecond, Preemption: 50 * time.Microsecond},
		Process{Name: "A", Program: kernels(5000 * us)},
		Process{Name: "B", Program: kernels(5000 * us)},
		Process{Name: "C", Program: kernels(5000 * us)})
	s.Start(3000 * us)
	var ev trace.Event
	_ = s.SetReadDeadline(1030 * us) // A's slice ended at 1010, its save ends at 1060
	for {
		if err := s.Read(&ev); errors.Is(err, trace.ErrDeadline) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetInterleave(pids[2], sched.InterleaveHigh); err != nil {
		t.Fatal(err)
	}
	_ = s.SetReadDeadline(0)
	readAll(t, s, func(*trace.Event) {})
	st := s.Stats()
	equalRuns(t, "A", runs(st, pids[0]), [][2]uint64{{10, 1010}, {2130, 3000}})
	equalRuns(t, "B", runs(st, pids[1]), nil)
	equalRuns(t, "C", runs(st, pids[2]), [][2]uint64{{1070, 2070}})
}

func TestSuspendResumeAndGate(t *testing.T) {
	s, pids := mustSim(t, &Options{Observe: true, ContextSwitch: 10 * time.Microsecond, Preemption: 20 * time.Microsecond},
		Process{Name: "be", Program: kernels(3000 * us)})
	s.Start(uint64(time.Second))
	var ev trace.Event
	if err := s.Read(&ev); err != nil || ev.Kind != trace.KindExec || ev.Proc.CommString() != "be" {
		t.Fatalf("first event %+v %v", ev, err)
	}
	if err := s.Read(&ev); err != nil || ev.Kind != trace.KindLaunch || ev.PID != pids[0] {
		t.Fatalf("second event %+v %v", ev, err)
	}
	if err := s.SetReadDeadline(1000 * us); err != nil {
		t.Fatal(err)
	}
	if err := s.Read(&ev); !errors.Is(err, trace.ErrDeadline) || s.Now() != 1000*us {
		t.Fatalf("read: %v at %d", err, s.Now())
	}
	if err := s.Suspend(pids[0], 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Suspend(pids[0], 0); err != nil { // idempotent
		t.Fatal(err)
	}
	_ = s.SetReadDeadline(2000 * us)
	if err := s.Read(&ev); !errors.Is(err, trace.ErrDeadline) {
		t.Fatal(err)
	}
	if err := s.Resume(pids[0], 0); err != nil {
		t.Fatal(err)
	}
	_ = s.SetReadDeadline(0)
	if err := s.Read(&ev); err != nil || ev.Kind != trace.KindSync {
		t.Fatalf("sync: %+v %v", ev, err)
	}
	// Ran 10–1000, saved 1000–1020, resumed at 2000: switch 2000–2010, 2010–4020.
	if end := ev.Time + ev.Sync.Duration; end != 4020*us {
		t.Errorf("sync returned at %d µs", end/us)
	}
	if err := s.Read(&ev); err != io.EOF {
		t.Errorf("end: %v", err)
	}
	if err := s.Suspend(pids[0], 1); err == nil || !strings.Contains(err.Error(), "gpu 1") {
		t.Errorf("wrong gpu: %v", err)
	}
	if err := s.Suspend(7, 0); err == nil {
		t.Error("unknown pid accepted")
	}
}

func TestBadOptions(t *testing.T) {
	cases := []struct {
		opts Options
		want string
	}{
		{Options{GPUs: -1}, "gpus -1"},
		{Options{GPUs: 5000}, "gpus 5000"},
		{Options{Timeslice: -time.Millisecond}, "timeslice -1ms"},
		{Options{SpatialSlowdown: -1}, "spatial slowdown"},
		{Options{CopyBandwidth: 1e20}, "copy bandwidth"},
		{Options{MaxEvents: -3}, "max events"},
	}
	for _, c := range cases {
		if _, err := New(&c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.opts, err, c.want)
		}
	}
	s, _ := New(nil)
	if _, err := s.Add(Process{Name: "x", GPU: 1, Program: kernels(1)}); err == nil {
		t.Error("process on a missing GPU accepted")
	}
}

// forever launches kernels and never synchronizes.
type forever struct{}

func (forever) Next(uint64) (Op, error) { return Op{Kind: OpKernel, Dur: 1000}, nil }

func TestStreamBound(t *testing.T) {
	s, _ := mustSim(t, &Options{MaxStreamOps: 1000}, Process{Name: "runaway", Program: forever{}})
	err := s.Run(context.Background(), uint64(time.Second))
	if err == nil || !strings.Contains(err.Error(), "1000 operations queued") {
		t.Fatalf("got %v", err)
	}
}

func TestCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, _ := mustSim(t, &Options{}, Process{Name: "A", Program: kernels(1000)})
	if err := s.Run(ctx, uint64(time.Second)); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
}

// TestSpatialUnequal: 1 ms and 2 ms kernels with slowdown 0.5 co-run at
// 1/1.5 speed until the short one ends at 1.5 ms (the long one has 1 ms
// left), which then runs alone to 2.5 ms.
func TestSpatialUnequal(t *testing.T) {
	s, _ := mustSim(t, &Options{Mode: ModeSpatial, SpatialSlowdown: 0.5, Observe: true},
		Process{Name: "A", Program: kernels(1000 * us)}, Process{Name: "B", Program: kernels(2000 * us)})
	s.Start(uint64(time.Second))
	ends := map[uint32]uint64{}
	var ev trace.Event
	for {
		err := s.Read(&ev)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind == trace.KindSync {
			ends[ev.PID] = ev.Time + ev.Sync.Duration
		}
	}
	if ends[FirstPID] != 1500*us || ends[FirstPID+1] != 2500*us {
		t.Errorf("sync returns %v, want A 1500 µs, B 2500 µs", ends)
	}
	if b := s.Stats().GPUs[0].Busy; b != 2500*us {
		t.Errorf("busy %d", b)
	}
	equalRuns(t, "A", runs(s.Stats(), FirstPID), [][2]uint64{{0, 1500}})
	equalRuns(t, "B", runs(s.Stats(), FirstPID+1), [][2]uint64{{0, 2500}})
}

func TestEventBound(t *testing.T) {
	procs := []Process{}
	for i := range 10 {
		procs = append(procs, Process{Name: fmt.Sprint("p", i), Program: kernels(1000 * us)})
	}
	s, _ := mustSim(t, &Options{MaxEvents: 4}, procs...)
	err := s.Run(context.Background(), uint64(time.Second))
	if err == nil || !strings.Contains(err.Error(), "event queue bound 4") {
		t.Fatalf("got %v", err)
	}
}

// TestGate: a gated host stops at its next launch; queued work finishes.
func TestGate(t *testing.T) {
	prog := &script{ops: []Op{{Kind: OpKernel, Dur: 100 * us}, {Kind: OpSleep, Dur: 50 * us}, {Kind: OpKernel, Dur: 100 * us}, {Kind: OpSync}}}
	s, pids := mustSim(t, &Options{Observe: true, ContextSwitch: 10 * time.Microsecond}, Process{Name: "g", Program: prog})
	s.Start(uint64(time.Second))
	var ev trace.Event
	for ev.Kind != trace.KindLaunch {
		if err := s.Read(&ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Gate(pids[0]); err != nil {
		t.Fatal(err)
	}
	_ = s.SetReadDeadline(1000 * us)
	if err := s.Read(&ev); !errors.Is(err, trace.ErrDeadline) {
		t.Fatalf("gated host launched: %+v %v", ev, err)
	}
	st := s.Stats().Procs[0]
	if st.KernelsCompleted != 1 || st.KernelsSubmitted != 1 {
		t.Fatalf("while gated: %+v", st)
	}
	if err := s.Ungate(pids[0]); err != nil {
		t.Fatal(err)
	}
	_ = s.SetReadDeadline(0)
	for ev.Kind != trace.KindSync {
		if err := s.Read(&ev); err != nil {
			t.Fatal(err)
		}
	}
	// Second launch at 1000 (ungated), context still loaded: 1000–1100.
	if end := ev.Time + ev.Sync.Duration; end != 1100*us {
		t.Errorf("sync returned at %d µs, want 1100", end/us)
	}
}

// scriptInto is a script that writes its operations in place
// (ProgramInto).
type scriptInto struct{ script }

func (s *scriptInto) NextInto(now uint64, op *Op) error {
	var err error
	*op, err = s.Next(now)
	return err
}

// TestProgramInto: a program that writes its operations in place runs
// exactly as one that returns them, gated and ungated.
func TestProgramInto(t *testing.T) {
	ops := []Op{{Kind: OpKernel, Dur: 100 * us}, {Kind: OpCopy, Bytes: 1 << 20}, {Kind: OpSleep, Dur: 50 * us},
		{Kind: OpKernel, Durs: []uint64{30 * us, 70 * us}}, {Kind: OpSync}, {Kind: OpKernel, Dur: 10 * us}, {Kind: OpSync}}
	var got [2]string
	for i := range got {
		var prog Program = &script{ops: ops}
		if i == 1 {
			prog = &scriptInto{script{ops: ops}}
		}
		s, pids := mustSim(t, &Options{Mode: ModePriority, Observe: true}, Process{Name: "A", Program: prog},
			Process{Name: "B", Class: ClassLC, Program: kernels(40*us, 40*us)})
		if err := s.Gate(pids[0]); err != nil {
			t.Fatal(err)
		}
		s.Start(uint64(time.Second))
		_ = s.SetReadDeadline(100 * us)
		var ev trace.Event
		for {
			if err := s.Read(&ev); errors.Is(err, trace.ErrDeadline) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Ungate(pids[0]); err != nil {
			t.Fatal(err)
		}
		_ = s.SetReadDeadline(0)
		for {
			if err := s.Read(&ev); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
		}
		got[i] = describe(s.Stats())
	}
	if got[0] != got[1] {
		t.Errorf("in place:\n%s\nreturned:\n%s", got[1], got[0])
	}
	if !strings.Contains(got[0], "KernelsCompleted:4") || !strings.Contains(got[0], "Syncs:2") {
		t.Errorf("the gated program did not run to its end: %s", got[0])
	}
}

// TestRequestPriority pins request-aware priority against per-kernel
// priority. LC's request arrives at 1 ms: a 200 µs kernel, a sync, 300 µs
// of host work, another 200 µs kernel; BE has a 10 ms kernel from 0.
// Switch 20 µs, save 30 µs.
//
//	both: BE 20–1000, save 1000–1030, switch 1030–1050, LC 1050–1250
//	request-priority: GPU idle in the host gap; LC 1550–1750 (its context
//	  still loaded): latency 750 µs; BE switched back 1750–1770
//	priority: BE switched in for the gap 1250–1270, runs 1270–1550, saved
//	  1550–1580, LC switched 1580–1600, runs 1600–1800: latency 800 µs
func TestRequestPriority(t *testing.T) {
	for _, c := range []struct {
		mode Mode
		lat  uint64
		be   [][2]uint64
	}{
		{ModeRequestPriority, 750, [][2]uint64{{20, 1000}, {1770, 10790}}},
		{ModePriority, 800, [][2]uint64{{20, 1000}, {1270, 1550}, {1820, 10560}}},
	} {
		lc := &script{ops: []Op{{Kind: OpWaitUntil, At: 1000 * us}, {Kind: OpBegin, At: 1000 * us},
			{Kind: OpKernel, Dur: 200 * us}, {Kind: OpSync}, {Kind: OpSleep, Dur: 300 * us}, {Kind: OpKernel, Dur: 200 * us}, {Kind: OpEnd}}}
		s, pids := mustSim(t, &Options{Mode: c.mode, ContextSwitch: 20 * time.Microsecond, Preemption: 30 * time.Microsecond},
			Process{Name: "be", Program: kernels(10000 * us)},
			Process{Name: "lc", Class: ClassLC, Program: lc})
		if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
			t.Fatal(err)
		}
		st := s.Stats()
		if got := st.Procs[1].Latency.Max() / us; got != c.lat {
			t.Errorf("%v: LC latency %d µs, want %d", c.mode, got, c.lat)
		}
		equalRuns(t, c.mode.String()+" BE", runs(st, pids[0]), c.be)
	}
}

// TestSetTimesliceMidSlice: a shorter timeslice set while a group runs
// keeps its slice's start; the slice ends at the next multiple of the new
// timeslice, not at once. A (5 ms kernel) and B (1 ms) launch at 0, switch
// 10 µs, save 20 µs, timeslice 1024 µs: A runs from 10. At 300 µs A's
// timeslice becomes 200 µs: its slice ends at 10 + 2·200 = 410; save
// 410–430, B 440–1440, A back at 1450.
func TestSetTimesliceMidSlice(t *testing.T) {
	s, pids := mustSim(t, &Options{Observe: true, ContextSwitch: 10 * time.Microsecond, Preemption: 20 * time.Microsecond},
		Process{Name: "A", Program: kernels(5000 * us)},
		Process{Name: "B", Program: kernels(1000 * us)})
	s.Start(uint64(time.Second))
	var ev trace.Event
	_ = s.SetReadDeadline(300 * us)
	for {
		if err := s.Read(&ev); errors.Is(err, trace.ErrDeadline) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetTimeslice(pids[0], 0, 200); err != nil {
		t.Fatal(err)
	}
	_ = s.SetReadDeadline(0)
	for {
		if err := s.Read(&ev); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	equalRuns(t, "A", runs(s.Stats(), pids[0]), [][2]uint64{{10, 410}, {1450, 6050}})
}

// TestProgressByEvents: progress comes every 16,384 events, however long
// the run is in simulated time: a run of 2,000 simulated hours whose
// first second holds a million events reports during that second, where
// a report every 1% of the simulated time would say nothing for 20
// simulated hours.
func TestProgressByEvents(t *testing.T) {
	s, _ := mustSim(t, &Options{TimelineWindow: 1}, Process{Name: "busy", Program: &tiny{until: uint64(time.Second)}})
	calls := 0
	if err := s.RunProgress(context.Background(), uint64(2000*time.Hour), func(uint64) { calls++ }); err != nil {
		t.Fatal(err)
	}
	if calls < 20 {
		t.Errorf("%d progress calls in a run of about a million events", calls)
	}

	// The same, read event by event as a closed-loop controller reads.
	s, _ = mustSim(t, &Options{TimelineWindow: 1, Observe: true}, Process{Name: "busy", Program: &tiny{until: uint64(time.Second)}})
	var read, last uint64
	calls = 0
	s.ReadProgress(func(now uint64) {
		if calls++; now < last || now > uint64(time.Second) {
			t.Errorf("progress at %v after %v", time.Duration(now), time.Duration(last))
		}
		last = now
	})
	s.Start(uint64(2000 * time.Hour))
	readAll(t, s, func(*trace.Event) { read++ })
	if calls < 20 || read < 500_000 {
		t.Errorf("%d progress calls reading %d events", calls, read)
	}
}

// tiny launches 1 µs kernels and syncs after each until a time.
type tiny struct {
	until  uint64
	synced bool
}

func (p *tiny) Next(now uint64) (Op, error) {
	if now >= p.until {
		return Op{Kind: OpStop}, nil
	}
	p.synced = !p.synced
	if p.synced {
		return Op{Kind: OpKernel, Dur: us}, nil
	}
	return Op{Kind: OpSync}, nil
}
