package scripted

import (
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sim"
)

// TestSynchronizationAloneSuspendsNothing: an LC process that only
// synchronizes while idle (a poll) opens a request in its tracker but
// holds no BE work off the GPU; its next launch, within the idle gap,
// suspends BE as if the poll had not been, and BE is resumed the gap
// after the request's last synchronization returned.
func TestSynchronizationAloneSuspendsNothing(t *testing.T) {
	s, err := sim.New(&sim.Options{Observe: true, TimelineWindow: time.Second, ContextSwitch: 20 * time.Microsecond,
		Preemption: 30 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	be := &ops{list: []sim.Op{{Kind: sim.OpKernel, Dur: 10000 * us}, {Kind: sim.OpSync}}}
	lc := &ops{list: []sim.Op{{Kind: sim.OpWaitUntil, At: 500 * us}, {Kind: sim.OpSync},
		{Kind: sim.OpWaitUntil, At: 1000 * us}, {Kind: sim.OpBegin, At: 1000 * us},
		{Kind: sim.OpKernel, Dur: 200 * us}, {Kind: sim.OpEnd},
		{Kind: sim.OpWaitUntil, At: 15000 * us}, {Kind: sim.OpSync}}}
	bePID, err := s.Add(sim.Process{Name: "be", Program: be})
	if err != nil {
		t.Fatal(err)
	}
	lcPID, err := s.Add(sim.Process{Name: "lc", Class: sim.ClassLC, Program: lc})
	if err != nil {
		t.Fatal(err)
	}
	s.Start(uint64(20 * time.Millisecond))
	ctl, err := New(s, s, []Process{{PID: bePID}, {PID: lcPID, LC: true}}, &Options{Policy: SuspendBE, IdleGap: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Run(); err != nil {
		t.Fatal(err)
	}
	if st := ctl.Stats(); st.Suspends != 1 || st.Resumes != 1 {
		t.Errorf("stats %+v: want one suspend at the launch and its resume, none for the polls", st)
	}
	// As in TestIdleGap: BE ran 20–1000, resumed at 1250 + 2000 = 3250,
	// switched in by 3270 and finished its remaining 9020 µs at 12290.
	var runs [][2]uint64
	for _, seg := range s.Stats().Timeline {
		if seg.PID == bePID && seg.Kind == sim.SegmentRun {
			runs = append(runs, [2]uint64{seg.Start / us, seg.End / us})
		}
	}
	if len(runs) != 2 || runs[0] != [2]uint64{20, 1000} || runs[1] != [2]uint64{3270, 12290} {
		t.Errorf("BE runs %v µs, want [[20 1000] [3270 12290]]", runs)
	}
}
