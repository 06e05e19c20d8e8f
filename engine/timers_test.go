package engine

import (
	"math/rand/v2"
	"testing"
)

// TestTimersOrder: timers come out of the heap by time, and in the order
// they were pushed among equal times, however pushes and pops
// interleave.
func TestTimersOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tm timers
	var now uint64
	var popped, pushed int
	check := func(prev, x timer) {
		t.Helper()
		if x.at < prev.at || x.at == prev.at && x.seq < prev.seq {
			t.Fatalf("popped %d after %d (at, seq %d after %d)", x.at, prev.at, x.seq, prev.seq)
		}
	}
	var last timer
	for range 20_000 {
		if rng.IntN(3) > 0 || len(tm.h) == 0 {
			// Some equal times, and none before now: a heap of deadlines.
			tm.push(timer{at: now + uint64(rng.IntN(50)), kind: timerIdle})
			pushed++
			continue
		}
		now = tm.h[0].at
		x, ok := tm.due(now)
		if !ok {
			t.Fatalf("no timer due at the earliest time %d", now)
		}
		if popped > 0 {
			check(last, x)
		}
		last = x
		popped++
	}
	for {
		x, ok := tm.due(^uint64(0))
		if !ok {
			break
		}
		check(last, x)
		last = x
		popped++
	}
	if popped != pushed || len(tm.h) != 0 {
		t.Errorf("pushed %d, popped %d, %d left", pushed, popped, len(tm.h))
	}
	if _, ok := tm.next(); ok {
		t.Error("next on an empty heap")
	}
}
