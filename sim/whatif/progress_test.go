package whatif

import (
	"testing"
	"time"
)

// TestLockstepKeepsThreadsBusy: a run more than a second of simulated
// time ahead of the slowest is held back, but only while enough others
// run to keep every thread busy, and is let go once the slowest catches
// up or finishes.
func TestLockstepKeepsThreadsBusy(t *testing.T) {
	bases := []baseline{{name: "slow"}, {name: "fast"}, {name: "faster"}}
	var jobs []*job
	for i := range bases {
		jobs = append(jobs, &job{base: i, b: &bases[i]})
	}
	tr := newTracker(&Config{Duration: 10 * time.Second}, bases, jobs, len(jobs))
	tr.procs = 2 // whatever the machine has
	slow, fast, faster := tr.forJob(0), tr.forJob(1), tr.forJob(2)
	returned := func(f func(uint64), at time.Duration) chan struct{} {
		done := make(chan struct{})
		go func() {
			f(uint64(at))
			close(done)
		}()
		return done
	}
	held := func() int {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.held
	}
	fastDone := returned(fast, 5*time.Second)
	for deadline := time.Now().Add(5 * time.Second); held() != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("a run 5 s ahead of the slowest, with two others running on two threads, is not held back")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-returned(faster, 6*time.Second):
	case <-time.After(5 * time.Second):
		t.Fatal("a second run ahead is held back too, leaving a thread to the slowest run alone")
	}
	select {
	case <-fastDone:
		t.Fatal("the run held back went on before the slowest caught up")
	default:
	}
	slow(uint64(4500 * time.Millisecond))
	select {
	case <-fastDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the run held back stays held once the slowest is within a second of it")
	}
	if h := held(); h != 0 {
		t.Errorf("%d runs held at the end, want none", h)
	}
}
