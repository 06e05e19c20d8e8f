package engine_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// expediter is an enforcer whose source can expedite events; it logs
// Expedite among the other calls.
type expediter struct{ *calls }

func (x expediter) Expedite(pid uint32, on bool) error {
	return x.do(fmt.Sprintf("expedite %d %v", pid, on))
}

func expedites(log []string) []string {
	return slices.DeleteFunc(slices.Clone(log), func(s string) bool { return !strings.HasPrefix(s, "expedite ") })
}

// TestExpediteLatencyCritical: a latency-critical process is expedited
// when it is classified and until it leaves; a best-effort one never is;
// a reclassification that ends or starts its latency-critical plan turns
// expediting off or on; a failure is recorded and retried at the next
// classification.
func TestExpediteLatencyCritical(t *testing.T) {
	evs := []trace.Event{
		exec(0, 10, "infer"), exec(0, 20, "train"), exec(0, 30, "infer"),
		launch(us, 10), launch(us, 20), launch(us, 30),
		{Kind: trace.KindExit, PID: 10, TID: 10, Time: 2 * us},
	}
	enf := expediter{&calls{fail: map[string]error{"expedite 30 true": errors.New("expedite map full")}}}
	opts := engine.Options{Classifier: byComm}
	e, err := engine.New(&events{evs: evs}, enf, &opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{"expedite 10 true", "expedite 30 true", "expedite 10 false"}
	if got := expedites(enf.log); !slices.Equal(got, want) {
		t.Errorf("expedite calls %q, want %q", got, want)
	}
	var recorded bool
	for _, d := range e.Snapshot().Decisions {
		recorded = recorded || d.PID == 30 && strings.Contains(d.Err, "expedite map full")
	}
	if !recorded {
		t.Errorf("the failed expedite of pid 30 is not among the decisions: %+v", e.Snapshot().Decisions)
	}

	// Everything best-effort now: pid 30, latency-critical so far, is
	// turned off; pid 20 was never on and is left alone. Then back.
	enf.log, enf.fail = nil, nil
	e.Reclassify(engine.ClassifierFunc(func(engine.ProcessInfo) (sched.Plan, string, error) {
		return bePlan, "all best-effort", nil
	}), "policy changed")
	e.Reclassify(byComm, "policy changed back")
	want = []string{"expedite 30 false", "expedite 30 true"}
	if got := expedites(enf.log); !slices.Equal(got, want) {
		t.Errorf("after reclassification: expedite calls %q, want %q", got, want)
	}
}
