package sim

import (
	"math/rand/v2"
	"testing"
)

// TestQueueOrder: events come out in order of time, then of scheduling,
// one per source (a source's new event replaces its old one), whether
// the queue keeps its few sources' events sorted or, past smallQueue
// sources, in a heap, and across the switch from one to the other as
// sources are added while events are pending.
func TestQueueOrder(t *testing.T) {
	for _, sources := range []int{1, 5, smallQueue, smallQueue + 1, 200} {
		r := rand.New(rand.NewPCG(uint64(sources), 1))
		var q queue
		// want is the reference: each source's pending (t, seq), or none.
		type pend struct {
			t, seq uint64
			ok     bool
		}
		var want []pend
		addSource := func() {
			q.add(evHost, int32(len(want)))
			want = append(want, pend{})
		}
		for range min(sources, 3) {
			addSource()
		}
		now := uint64(0)
		var early []uint64 // sequence numbers taken and not yet used
		for step := range 20000 {
			if len(want) < sources && step%50 == 0 {
				addSource()
			}
			if r.IntN(8) == 0 {
				early = append(early, q.next())
			}
			if r.IntN(3) > 0 {
				i := r.IntN(len(want))
				tm := now + uint64(r.IntN(20)) // ties are common
				// Mostly the newest sequence number, as schedule gives;
				// at times one taken earlier, as an enforcement action's.
				seq := q.next()
				if len(early) > 0 && r.IntN(4) == 0 {
					seq, early = early[0], early[1:]
				}
				q.set(int32(i), tm, seq)
				want[i] = pend{tm, seq, true}
				continue
			}
			n := 0
			best := -1
			for i, p := range want {
				if !p.ok {
					continue
				}
				n++
				if best < 0 || p.t < want[best].t || p.t == want[best].t && p.seq < want[best].seq {
					best = i
				}
			}
			if q.len() != n {
				t.Fatalf("%d sources, step %d: %d events pending, want %d", sources, step, q.len(), n)
			}
			if n == 0 {
				continue
			}
			if pk := q.peek(); pk.src != int32(best) {
				t.Fatalf("%d sources, step %d: peek gives source %d, want %d", sources, step, pk.src, best)
			}
			e := q.pop()
			if e.src != int32(best) || e.t != want[best].t || e.seq != want[best].seq || q.pending(e.src) {
				t.Fatalf("%d sources, step %d: popped %+v, want source %d at %d seq %d", sources, step, e, best, want[best].t, want[best].seq)
			}
			want[best].ok = false
			now = e.t
			for i, p := range want {
				if q.pending(int32(i)) != p.ok {
					t.Fatalf("%d sources, step %d: source %d pending %v, want %v", sources, step, i, q.pending(int32(i)), p.ok)
				}
			}
		}
		if got := len(q.srcs) <= smallQueue; q.small != got {
			t.Errorf("%d sources: sorted array %v, want %v", sources, q.small, got)
		}
		for i, e := range q.events {
			switch {
			case q.small && i > 0 && q.events[i-1].before(&e):
				t.Errorf("%d sources: sorted array out of order at %d", sources, i)
			case !q.small && i > 0 && e.before(&q.events[(i-1)/2]):
				t.Errorf("%d sources: heap out of order at %d", sources, i)
			case !q.small && q.srcs[e.src].pos != int32(i):
				t.Errorf("%d sources: source %d thinks its event is at %d, not %d", sources, e.src, q.srcs[e.src].pos, i)
			}
		}
	}
}
