package scripted

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sim"
)

const us = uint64(time.Microsecond)

type ops struct {
	list []sim.Op
	i    int
}

func (o *ops) Next(uint64) (sim.Op, error) {
	if o.i == len(o.list) {
		return sim.Op{Kind: sim.OpStop}, nil
	}
	o.i++
	return o.list[o.i-1], nil
}

// setup: BE launches one 10 ms kernel at 0; LC's request arrives at 1 ms
// with one 200 µs kernel. Switch 20 µs, preemption 30 µs, timeslice 1024 µs.
func setup(t *testing.T, observe bool) (*sim.Simulator, []Process) {
	return setupLatency(t, observe, 0)
}

func setupLatency(t *testing.T, observe bool, ctl time.Duration) (*sim.Simulator, []Process) {
	t.Helper()
	s, err := sim.New(&sim.Options{Observe: observe, TimelineWindow: time.Second, ContextSwitch: 20 * time.Microsecond,
		Preemption: 30 * time.Microsecond, ControlLatency: ctl})
	if err != nil {
		t.Fatal(err)
	}
	be := &ops{list: []sim.Op{{Kind: sim.OpKernel, Dur: 10000 * us}, {Kind: sim.OpSync}}}
	lc := &ops{list: []sim.Op{{Kind: sim.OpWaitUntil, At: 1000 * us}, {Kind: sim.OpBegin, At: 1000 * us},
		{Kind: sim.OpKernel, Dur: 200 * us}, {Kind: sim.OpEnd}}}
	bePID, err := s.Add(sim.Process{Name: "be", Program: be})
	if err != nil {
		t.Fatal(err)
	}
	lcPID, err := s.Add(sim.Process{Name: "lc", Class: sim.ClassLC, Program: lc})
	if err != nil {
		t.Fatal(err)
	}
	return s, []Process{{PID: bePID}, {PID: lcPID, LC: true}}
}

func lcLatency(t *testing.T, s *sim.Simulator) uint64 {
	t.Helper()
	st := s.Stats()
	l := st.Procs[1].Latency
	if l.Count() != 1 {
		t.Fatalf("lc requests %d", l.Count())
	}
	return l.Max()
}

// TestClosedLoop pins the latency the LC request sees with no controller
// and under each scripted policy, all hand-computed.
func TestClosedLoop(t *testing.T) {
	// No controller: BE's slice started at 20 µs ends at 1044; save 30,
	// switch 20, LC runs 1094–1294: 294 µs.
	s, _ := setup(t, false)
	if err := s.Run(context.Background(), uint64(20*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if got := lcLatency(t, s); got != 294*us {
		t.Errorf("no controller: latency %d µs, want 294", got/us)
	}

	cases := []struct {
		policy  Policy
		latency uint64
		stats   Stats
	}{
		// Suspend at the launch (1000): save 1000–1030, switch 1030–1050,
		// LC 1050–1250: 250 µs; BE resumed at the sync's return.
		{SuspendBE, 250 * us, Stats{Suspends: 1, Resumes: 1}},
		// BE's timeslice is 100 µs from the start (set on its exec event):
		// its slice ends at 1020; save to 1050, switch to 1070, LC
		// 1070–1270: 270 µs.
		{SplitTimeslice, 270 * us, Stats{Timeslices: 2, Interleaves: 1}},
	}
	for _, c := range cases {
		t.Run(c.policy.String(), func(t *testing.T) {
			s, procs := setup(t, true)
			s.Start(uint64(20 * time.Millisecond))
			ctl, err := New(s, s, procs, &Options{Policy: c.policy})
			if err != nil {
				t.Fatal(err)
			}
			if err := ctl.Run(); err != nil {
				t.Fatal(err)
			}
			if got := lcLatency(t, s); got != c.latency {
				t.Errorf("latency %d µs, want %d", got/us, c.latency/us)
			}
			st := ctl.Stats()
			st.Events = 0
			if st != c.stats {
				t.Errorf("stats %+v, want %+v", st, c.stats)
			}
			be := s.Stats().Procs[0]
			if be.KernelsCompleted != 1 {
				t.Errorf("BE kernel not completed after resume: %+v", be)
			}
		})
	}
}

// TestIdleGap: with an idle gap the BE stays suspended until the gap has
// passed after the LC's sync, woken by a read deadline on virtual time.
func TestIdleGap(t *testing.T) {
	s, procs := setup(t, true)
	s.Start(uint64(20 * time.Millisecond))
	ctl, err := New(s, s, procs, &Options{Policy: SuspendBE, IdleGap: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Run(); err != nil {
		t.Fatal(err)
	}
	// BE ran 20–1000 (980 µs), was saved, and resumed at 1250 + 2000 =
	// 3250: switch to 3270, the remaining 9020 µs end at 12290.
	st := s.Stats()
	var runs [][2]uint64
	for _, seg := range st.Timeline {
		if seg.PID == procs[0].PID && seg.Kind == sim.SegmentRun {
			runs = append(runs, [2]uint64{seg.Start / us, seg.End / us})
		}
	}
	if len(runs) != 2 || runs[0] != [2]uint64{20, 1000} || runs[1] != [2]uint64{3270, 12290} {
		t.Errorf("BE runs %v µs, want [[20 1000] [3270 12290]]", runs)
	}
	if st.Procs[0].KernelsCompleted != 1 || ctl.Stats().Resumes != 1 {
		t.Fatalf("stats %+v %+v", st.Procs[0], ctl.Stats())
	}
	if st.GPUs[0].Busy != 10200*us {
		t.Errorf("busy %d µs", st.GPUs[0].Busy/us)
	}
	if st.GPUs[0].SwitchTime != 60*us {
		t.Errorf("switch time %d µs, want 60", st.GPUs[0].SwitchTime/us)
	}
}

func TestBadOptions(t *testing.T) {
	s, procs := setup(t, true)
	if _, err := New(s, s, procs, &Options{Policy: 9}); err == nil {
		t.Error("unknown policy accepted")
	}
	if _, err := New(s, s, append(procs, procs[0]), nil); err == nil {
		t.Error("duplicate pid accepted")
	}
	if _, err := New(s, s, procs, &Options{IdleGap: -1}); err == nil {
		t.Error("negative gap accepted")
	}
	bad := append([]Process(nil), procs...)
	bad[0].GPU = -1
	if _, err := New(s, s, bad, nil); err == nil || !strings.Contains(err.Error(), "gpu -1") {
		t.Errorf("negative gpu: %v", err)
	}
}

// TestControlLatency: with a 300 µs control latency the suspend issued at
// the LC launch (1000) lands at 1300, after time-slicing has already run
// the LC (BE slice ends 1044, save to 1074, switch to 1094, LC 1094–1294)
// and while BE is being switched back in (1294–1314), which it aborts; the
// resume issued at 1294 lands at 1594: switch to 1614, BE's remaining
// 8976 µs end at 10590.
func TestControlLatency(t *testing.T) {
	s, procs := setupLatency(t, true, 300*time.Microsecond)
	s.Start(uint64(20 * time.Millisecond))
	ctl, err := New(s, s, procs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Run(); err != nil {
		t.Fatal(err)
	}
	if got := lcLatency(t, s); got != 294*us {
		t.Errorf("latency %d µs, want 294", got/us)
	}
	var runs [][2]uint64
	for _, seg := range s.Stats().Timeline {
		if seg.PID == procs[0].PID && seg.Kind == sim.SegmentRun {
			runs = append(runs, [2]uint64{seg.Start / us, seg.End / us})
		}
	}
	if len(runs) != 2 || runs[0] != [2]uint64{20, 1044} || runs[1] != [2]uint64{1614, 10590} {
		t.Errorf("BE runs %v µs, want [[20 1044] [1614 10590]]", runs)
	}
}
