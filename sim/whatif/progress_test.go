package whatif

import (
	"testing"
	"time"
)

// TestLockstepKeepsThreadsBusy: a run more than a second of simulated
// time ahead of the slowest is held back, but only while as many runs as
// there are threads are further behind it, to go on; it is let go when
// the runs behind it are fewer, or once the slowest catches up.
func TestLockstepKeepsThreadsBusy(t *testing.T) {
	bases := []baseline{{name: "slow"}, {name: "fast"}, {name: "faster"}}
	var jobs []*job
	for i := range bases {
		jobs = append(jobs, &job{base: i, b: &bases[i]})
	}
	tr := newTracker(&Config{Duration: 10 * time.Second}, bases, jobs, len(jobs))
	tr.procs = 2 // whatever the machine has
	slow, fast, faster := tr.forJob(0), tr.forJob(1), tr.forJob(2)
	report := func(f func(uint64), at time.Duration) chan struct{} {
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
	waitHeld := func(n int, what string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); held() != n; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d runs held, want %d", what, held(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	returns := func(done chan struct{}, what string) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: still held", what)
		}
	}
	fastDone := report(fast, 5*time.Second)
	waitHeld(1, "a run 5 s ahead with two runs behind it on two threads")
	// A run further ahead is held instead: the runs closest behind go on.
	fasterDone := report(faster, 6*time.Second)
	returns(fastDone, "the run 5 s ahead, once another is further ahead")
	waitHeld(1, "the run 6 s ahead")
	select {
	case <-fasterDone:
		t.Fatal("the run furthest ahead went on while two runs behind it keep the threads busy")
	default:
	}
	slow(uint64(5500 * time.Millisecond))
	returns(fasterDone, "the run 6 s ahead, once the slowest is within a second of it")
	waitHeld(0, "at the end")
}
