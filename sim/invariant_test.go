package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// randomProgram issues a random mix of operations, with requests; with
// coarse set, every duration a multiple of 100 µs, so that events meet at
// the same instant.
type randomProgram struct {
	r      *rand.Rand
	inReq  bool
	n      int
	coarse bool
}

// dur draws a duration in [1, most] ns (in [100 µs, most] if coarse).
func (p *randomProgram) dur(most uint64) uint64 {
	d := 1 + p.r.Uint64N(most)
	if p.coarse {
		d = max(d/(100*us), 1) * 100 * us
	}
	return d
}

func (p *randomProgram) Next(now uint64) (Op, error) {
	p.n++
	if p.n > 400 {
		if p.inReq {
			p.inReq = false
			return Op{Kind: OpEnd}, nil
		}
		return Op{Kind: OpStop}, nil
	}
	switch k := p.r.IntN(10); {
	case k < 3:
		return Op{Kind: OpKernel, Dur: p.dur(3000 * us)}, nil
	case k < 4:
		durs := make([]uint64, 1+p.r.IntN(5))
		for i := range durs {
			durs[i] = p.dur(500 * us)
		}
		return Op{Kind: OpKernel, Durs: durs}, nil
	case k < 5:
		return Op{Kind: OpCopy, Bytes: p.r.Uint64N(1 << 24), Dir: trace.CopyDir(1 + p.r.IntN(2))}, nil
	case k < 6:
		return Op{Kind: OpSync}, nil
	case k < 7:
		return Op{Kind: OpSleep, Dur: p.dur(2000 * us)}, nil
	case k < 8:
		if p.inReq {
			p.inReq = false
			return Op{Kind: OpEnd}, nil
		}
		p.inReq = true
		return Op{Kind: OpBegin, At: now}, nil
	default:
		return Op{Kind: OpWaitUntil, At: now + p.dur(1000*us)}, nil
	}
}

// checkInvariants runs a random node and checks what must hold in any
// schedule: no kernel lost, no engine busier than the time that passed,
// every executed ns accounted to a process.
func checkInvariants(t *testing.T, seed uint64, ctlSeed uint64) {
	r := rand.New(rand.NewPCG(seed, ctlSeed))
	opts := &Options{
		GPUs: 1 + r.IntN(3), Mode: Mode(r.IntN(4)), Granularity: Granularity(r.IntN(3)),
		Timeslice: time.Duration(1+r.IntN(2000)) * time.Microsecond, ContextSwitch: time.Duration(1+r.IntN(50)) * time.Microsecond,
		Preemption: time.Duration(1+r.IntN(50)) * time.Microsecond, ControlLatency: time.Duration(r.IntN(2)*r.IntN(500)) * time.Microsecond,
		Observe: true, TimelineWindow: time.Second,
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	n := 1 + r.IntN(6)
	for i := range n {
		if _, err := s.Add(Process{Name: fmt.Sprint("p", i), Class: Class(r.IntN(2)), GPU: r.IntN(opts.GPUs),
			Program: &randomProgram{r: rand.New(rand.NewPCG(seed, uint64(i)))}, Interleave: new(sched.InterleaveLow)}); err != nil {
			t.Fatal(err)
		}
	}
	end := uint64(50+r.IntN(200)) * uint64(time.Millisecond)
	s.Start(end)
	var ev trace.Event
	for {
		err := s.Read(&ev)
		if err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatal(err)
		}
		// Each stream's cached head: whether a kernel is first.
		for _, p := range s.procs {
			if want := p.qh < len(p.q) && p.q[p.qh].kind == OpKernel; p.kernelAt != want {
				t.Fatalf("%s at %d: kernel at the head %v, the stream says %v", p.name, s.now, p.kernelAt, want)
			}
		}
		// Each GPU's masks of runnable groups, and the decisions taken
		// from them, against the groups' own states.
		for _, g := range s.gpus {
			checkMasks(t, g)
		}
		// A random controller.
		pid := uint32(FirstPID + r.IntN(n))
		gpu := s.procs[pid-FirstPID].gpu
		switch r.IntN(12) {
		case 0:
			_ = s.Suspend(pid, gpu)
		case 1:
			_ = s.Resume(pid, gpu)
		case 2:
			_ = s.SetTimeslice(pid, gpu, 1+r.Uint64N(3000))
		case 3:
			_ = s.SetInterleave(pid, engineLevel(r.IntN(3)))
		case 4:
			_ = s.Gate(pid)
		case 5:
			_ = s.Ungate(pid)
		}
	}
	st := s.Stats()
	if st.End != end {
		t.Errorf("end %d, want %d", st.End, end)
	}
	var work uint64
	for _, p := range st.Procs {
		if p.KernelsSubmitted != p.KernelsCompleted+p.KernelsInFlight {
			t.Errorf("%s: submitted %d ≠ completed %d + in flight %d", p.Name, p.KernelsSubmitted, p.KernelsCompleted, p.KernelsInFlight)
		}
		if p.CompletedWork > p.GPUTime {
			t.Errorf("%s: completed work %d > GPU time %d", p.Name, p.CompletedWork, p.GPUTime)
		}
		if p.Requests > p.RequestsBegun || p.RequestsBegun > p.Requests+1 {
			t.Errorf("%s: requests %d begun %d", p.Name, p.Requests, p.RequestsBegun)
		}
		work += p.GPUTime
	}
	var busy uint64
	for i, g := range st.GPUs {
		if g.Busy+g.SwitchTime+g.PreemptTime > end {
			t.Errorf("gpu %d: busy %d + switching %d + saving %d > %d", i, g.Busy, g.SwitchTime, g.PreemptTime, end)
		}
		busy += g.Busy
	}
	if opts.Mode != ModeSpatial && work != busy {
		t.Errorf("work %d ≠ busy %d", work, busy)
	}
	// Timeline segments of one GPU never overlap (except co-running ones),
	// and, the window covering the whole run, add up to the GPU's time
	// running, switching and saving.
	last := map[int]uint64{}
	sums := make([][3]uint64, len(st.GPUs))
	for _, seg := range st.Timeline {
		if opts.Mode == ModeSpatial {
			continue
		}
		if seg.Start < last[seg.GPU] || seg.End < seg.Start {
			t.Fatalf("timeline overlap at %+v (previous end %d)", seg, last[seg.GPU])
		}
		last[seg.GPU] = seg.End
		sums[seg.GPU][seg.Kind] += seg.End - seg.Start
	}
	for i, g := range st.GPUs {
		if opts.Mode == ModeSpatial || st.TimelineDropped > 0 {
			break
		}
		if want := [3]uint64{g.Busy, g.SwitchTime, g.PreemptTime}; sums[i] != want {
			t.Errorf("gpu %d: timeline runs, switches and saves %v, want %v (busy, switching, saving)", i, sums[i], want)
		}
	}
}

// checkMasks checks that g's masks of runnable groups hold the groups'
// states, and that the decisions taken from them are those taken from
// the states.
func checkMasks(t *testing.T, g *gpu) {
	t.Helper()
	if !g.masks {
		t.Fatalf("gpu %d: %d groups, %d runlist entries, and no masks", g.idx, len(g.procs), len(g.runlist))
	}
	var ready, entries uint64
	for i, p := range g.runlist {
		if p.runnable() {
			ready |= p.bit
			entries |= 1 << i
		}
	}
	if g.ready != ready || g.readyEntries != entries {
		t.Fatalf("gpu %d at %d: runnable groups %b, entries %b; the groups say %b, %b", g.idx, g.s.now, g.ready, g.readyEntries, ready, entries)
	}
	if m, sc := g.nextMasked(), g.nextScan(); m != sc {
		t.Fatalf("gpu %d at %d: next entry %d from the masks, %d from the groups", g.idx, g.s.now, m, sc)
	}
	for _, p := range g.procs {
		if m, sc := g.othersMasked(p), g.othersScan(p); m != sc {
			t.Fatalf("gpu %d at %d: others waiting for %s: %v from the masks, %v from the groups", g.idx, g.s.now, p.name, m, sc)
		}
	}
}

// TestReadRunsAsRun: a run read event by event (Observe, as a controller
// reads it, with no controller acting) does what the same run does
// through Run, where a synchronization's end wakes its host without the
// queue when nothing could come between; also where events meet at the
// same instant.
func TestReadRunsAsRun(t *testing.T) {
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 3))
		opts := Options{
			GPUs: 1 + r.IntN(2), Mode: Mode(r.IntN(4)), Granularity: Granularity(r.IntN(3)),
			Timeslice: time.Duration(1+r.IntN(20)) * 100 * time.Microsecond, TimelineWindow: time.Second,
		}
		n := 1 + r.IntN(5)
		procs := func() []Process {
			var ps []Process
			for i := range n {
				ps = append(ps, Process{Name: fmt.Sprint("p", i), Class: Class(i % 2), GPU: i % opts.GPUs,
					Program: &randomProgram{r: rand.New(rand.NewPCG(seed, uint64(i))), coarse: seed%2 == 0}})
			}
			return ps
		}
		end := uint64(200 * time.Millisecond)
		run := opts
		s, _ := mustSim(t, &run, procs()...)
		if err := s.Run(context.Background(), end); err != nil {
			t.Fatal(err)
		}
		read := opts
		read.Observe = true
		o, _ := mustSim(t, &read, procs()...)
		o.Start(end)
		readAll(t, o, func(*trace.Event) {})
		if got, want := describe(o.Stats()), describe(s.Stats()); got != want {
			t.Fatalf("seed %d: read event by event:\n%s\nthrough Run:\n%s", seed, got, want)
		}
	}
}

// TestManyGroupsDecideAsFew: a GPU with more groups than its masks cover
// decides from each group's state, as one with few decides from its
// masks: the same random node, alone and beside 66 groups that stop at
// once (never runnable), runs the same.
func TestManyGroupsDecideAsFew(t *testing.T) {
	for seed := range uint64(30) {
		r := rand.New(rand.NewPCG(seed, 4))
		opts := Options{
			Mode: Mode(r.IntN(4)), Granularity: Granularity(r.IntN(3)),
			Timeslice: time.Duration(1+r.IntN(20)) * 100 * time.Microsecond, TimelineWindow: time.Second,
		}
		n := 2 + r.IntN(4)
		procs := func(fillers int) []Process {
			var ps []Process
			for i := range n {
				ps = append(ps, Process{Name: fmt.Sprint("p", i), Class: Class(i % 2),
					Program: &randomProgram{r: rand.New(rand.NewPCG(seed, uint64(i))), coarse: seed%2 == 0}})
			}
			for i := range fillers {
				ps = append(ps, Process{Name: fmt.Sprint("idle", i), Class: Class(i % 2), Program: stopProgram{}})
			}
			return ps
		}
		end := uint64(200 * time.Millisecond)
		few, many := opts, opts
		s, _ := mustSim(t, &few, procs(0)...)
		m, _ := mustSim(t, &many, procs(maxMasked+2)...)
		if !s.gpus[0].masks || m.gpus[0].masks {
			t.Fatalf("masks with %d groups %v, with %d %v", n, s.gpus[0].masks, len(m.procs), m.gpus[0].masks)
		}
		for _, x := range []*Simulator{s, m} {
			if err := x.Run(context.Background(), end); err != nil {
				t.Fatal(err)
			}
		}
		st := m.Stats()
		st.Procs = st.Procs[:n]
		if got, want := describe(st), describe(s.Stats()); got != want {
			t.Fatalf("seed %d: beside idle groups:\n%s\nalone:\n%s", seed, got, want)
		}
	}
}

// stopProgram stops at once.
type stopProgram struct{}

func (stopProgram) Next(uint64) (Op, error) { return Op{Kind: OpStop}, nil }

// TestSyncWakeAfterOlderEvent: A's synchronization ends at 100 µs, the
// instant B's sleep, scheduled before it, ends too: B's host goes first,
// as through the queue, and its kernel takes the GPU before A's next one.
func TestSyncWakeAfterOlderEvent(t *testing.T) {
	procs := func() []Process {
		return []Process{
			{Name: "A", Program: &script{ops: []Op{{Kind: OpKernel, Dur: 80 * us}, {Kind: OpSync}, {Kind: OpKernel, Dur: 80 * us}, {Kind: OpSync}}}},
			{Name: "B", Program: &script{ops: []Op{{Kind: OpSleep, Dur: 100 * us}, {Kind: OpKernel, Dur: 50 * us}, {Kind: OpSync}}}},
		}
	}
	opts := Options{ContextSwitch: 20 * time.Microsecond}
	s, pids := mustSim(t, &opts, procs()...)
	if err := s.Run(context.Background(), uint64(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	equalRuns(t, "A", runs(st, pids[0]), [][2]uint64{{20, 100}, {190, 270}})
	equalRuns(t, "B", runs(st, pids[1]), [][2]uint64{{120, 170}})
	read := opts
	read.Observe = true
	o, _ := mustSim(t, &read, procs()...)
	o.Start(uint64(time.Millisecond))
	readAll(t, o, func(*trace.Event) {})
	if got, want := describe(o.Stats()), describe(st); got != want {
		t.Errorf("read event by event:\n%s\nthrough Run:\n%s", got, want)
	}
}

// TestSyncWakesInTurn: a host woken at the end of a step can release
// another at the same instant (under spatial sharing its launch advances
// the co-running kernels, and B's, rounded, has just ended): that host is
// woken in the same step too, not at the next event (C's, at 17 µs) or
// never (the run ends at 2 µs).
func TestSyncWakesInTurn(t *testing.T) {
	procs := func() []Process {
		return []Process{
			{Name: "A", Program: &script{ops: []Op{{Kind: OpCopy, Dur: 1701}, {Kind: OpSync}, {Kind: OpKernel, Dur: 100 * us}, {Kind: OpSync}}}},
			{Name: "B", Program: &script{ops: []Op{{Kind: OpKernel, Dur: 1001}, {Kind: OpSync}, {Kind: OpKernel, Dur: 50 * us}, {Kind: OpSync}}}},
			{Name: "C", Program: &script{ops: []Op{{Kind: OpKernel, Dur: 10 * us}, {Kind: OpSync}}}},
		}
	}
	opts := Options{Mode: ModeSpatial}
	s, _ := mustSim(t, &opts, procs()...)
	if err := s.Run(context.Background(), 2000); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if b := st.Procs[1]; b.Syncs != 1 || b.KernelsSubmitted != 2 {
		t.Errorf("B: %d syncs, %d kernels launched by 2 µs; want 1 and 2 (its second launched at 1701 ns)", b.Syncs, b.KernelsSubmitted)
	}
	read := opts
	read.Observe = true
	o, _ := mustSim(t, &read, procs()...)
	o.Start(2000)
	readAll(t, o, func(*trace.Event) {})
	if got, want := describe(o.Stats()), describe(st); got != want {
		t.Errorf("read event by event:\n%s\nthrough Run:\n%s", got, want)
	}
}

// TestReaderActsBetweenOutputs: a host woken at the end of a step that
// has events for the reader waits for the next step, so that the reader
// acts on those events first: reading A's launch at 1701 ns (the step
// that, as in TestSyncWakesInTurn, ends B's kernel), the reader gates B,
// whose host, woken next, stops at its next launch.
func TestReaderActsBetweenOutputs(t *testing.T) {
	opts := Options{Mode: ModeSpatial, Observe: true}
	s, pids := mustSim(t, &opts,
		Process{Name: "A", Program: &script{ops: []Op{{Kind: OpCopy, Dur: 1701}, {Kind: OpSync}, {Kind: OpKernel, Dur: 100 * us}, {Kind: OpSync}}}},
		Process{Name: "B", Program: &script{ops: []Op{{Kind: OpKernel, Dur: 1001}, {Kind: OpSync}, {Kind: OpKernel, Dur: 50 * us}, {Kind: OpSync}}}},
		Process{Name: "C", Program: &script{ops: []Op{{Kind: OpKernel, Dur: 10 * us}, {Kind: OpSync}}}},
	)
	s.Start(2000)
	gated := false
	readAll(t, s, func(ev *trace.Event) {
		if ev.Kind == trace.KindLaunch && ev.PID == pids[0] && !gated {
			if err := s.Gate(pids[1]); err != nil {
				t.Fatal(err)
			}
			gated = true
		}
	})
	if b := s.Stats().Procs[1]; !gated || b.Syncs != 1 || b.KernelsSubmitted != 1 {
		t.Errorf("B: %d syncs, %d kernels launched (gated %v); want 1 and 1: gated before its host went on", b.Syncs, b.KernelsSubmitted, gated)
	}
}

func FuzzInvariants(f *testing.F) {
	for i := range uint64(40) {
		f.Add(i, i*7+1)
	}
	f.Fuzz(func(t *testing.T, seed, ctl uint64) { checkInvariants(t, seed, ctl) })
}

func engineLevel(i int) sched.Interleave { return sched.Interleave(i) }
