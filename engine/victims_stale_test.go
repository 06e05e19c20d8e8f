package engine_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/trace"
)

// TestVictimsAskedAfterClassification: the chooser's answer is asked
// again before the first preemption after a process was classified, not
// at the next control loop: a latency-critical process that appears
// between two rounds gets its victims at its first request, and a
// best-effort process that appears beside it is held at the next one.
func TestVictimsAskedAfterClassification(t *testing.T) {
	// Like the default policy: every best-effort process on a busy GPU.
	choose := victimsFunc(func(s engine.ControlState) (engine.Victims, error) {
		var v engine.Victims
		if len(s.Busy) == 0 {
			return v, nil
		}
		for _, p := range s.Processes {
			if p.Class != "latency-critical" {
				v.Suspend = append(v.Suspend, engine.Suspension{PID: p.PID, Reason: "beside a busy GPU"})
			}
		}
		return v, nil
	})
	ms := uint64(time.Millisecond)
	evs := []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"), launch(us, 20),
		// The control loop ran at the first event, with no latency-critical
		// process; the next round is at 100 ms.
		launch(50*ms, 10), syncAt(50*ms+10*us, 10, 500*us),
		// Round at 100 ms. A best-effort process appears, then a request.
		exec(150*ms, 30, "train"), launch(150*ms, 30),
		launch(160*ms, 10), syncAt(160*ms+10*us, 10, 500*us),
	}
	_, enf := run(t, evs, engine.Options{Victims: choose, IdleGap: 100 * time.Microsecond})
	var got []string
	for _, c := range enf.log {
		if strings.HasPrefix(c, "suspend") || strings.HasPrefix(c, "resume") {
			got = append(got, c)
		}
	}
	want := []string{"suspend 20 gpu0", "resume 20 gpu0", "suspend 20 gpu0", "suspend 30 gpu0", "resume 20 gpu0", "resume 30 gpu0"}
	if !slices.Equal(got, want) {
		t.Errorf("preemptions %q\nwant %q", got, want)
	}
}
