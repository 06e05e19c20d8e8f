package scripted

import (
	"reflect"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sim"
)

// readOnly hides the simulator's ReadBatch: the controller reads its
// events one by one.
type readOnly struct{ engine.DeadlineSource }

// TestBatchEqualsRead: the controller takes the same actions at the same
// times, and counts the same events, whether it reads the simulator's
// events in place, a burst's launches at once, or one by one.
func TestBatchEqualsRead(t *testing.T) {
	for _, policy := range []Policy{SuspendBE, SplitTimeslice} {
		for _, gap := range []time.Duration{0, 300 * time.Microsecond} {
			run := func(batch bool) (Stats, sim.Stats) {
				s, err := sim.New(&sim.Options{Observe: true, TimelineWindow: time.Second, ContextSwitch: 20 * time.Microsecond,
					Preemption: 30 * time.Microsecond})
				if err != nil {
					t.Fatal(err)
				}
				var be, lc ops
				for i := range uint64(40) {
					be.list = append(be.list, sim.Op{Kind: sim.OpKernel, Durs: []uint64{300 * us, 200 * us, 100 * us}},
						sim.Op{Kind: sim.OpKernel, Dur: 150 * us}, sim.Op{Kind: sim.OpSync})
					at := (1000 + 700*i) * us
					lc.list = append(lc.list, sim.Op{Kind: sim.OpWaitUntil, At: at}, sim.Op{Kind: sim.OpBegin, At: at},
						sim.Op{Kind: sim.OpCopy, Bytes: 4096}, sim.Op{Kind: sim.OpKernel, Durs: []uint64{50 * us, 60 * us, 40 * us}},
						sim.Op{Kind: sim.OpEnd})
				}
				bePID, err := s.Add(sim.Process{Name: "be", Program: &be})
				if err != nil {
					t.Fatal(err)
				}
				lcPID, err := s.Add(sim.Process{Name: "lc", Class: sim.ClassLC, Program: &lc})
				if err != nil {
					t.Fatal(err)
				}
				s.Start(uint64(40 * time.Millisecond))
				var src engine.DeadlineSource = s
				if !batch {
					src = readOnly{s}
				}
				ctl, err := New(src, s, []Process{{PID: bePID}, {PID: lcPID, LC: true}}, &Options{Policy: policy, IdleGap: gap})
				if err != nil {
					t.Fatal(err)
				}
				if err := ctl.Run(); err != nil {
					t.Fatal(err)
				}
				return ctl.Stats(), s.Stats()
			}
			ctlBatch, simBatch := run(true)
			ctlOne, simOne := run(false)
			if ctlBatch != ctlOne {
				t.Errorf("%v, gap %v: controller %+v in place, %+v one by one", policy, gap, ctlBatch, ctlOne)
			}
			if !reflect.DeepEqual(simBatch, simOne) {
				t.Errorf("%v, gap %v: simulations differ", policy, gap)
			}
			if policy == SuspendBE && ctlBatch.Suspends < 10 {
				t.Errorf("%v, gap %v: %d suspends: the test exercises nothing", policy, gap, ctlBatch.Suspends)
			}
		}
	}
}
