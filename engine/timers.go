package engine

import "container/heap"

// timer kinds.
const (
	timerIdle     uint8 = iota + 1 // a latency-critical process's idle gap has passed
	timerHarvest                   // a held GPU's predicted gap has passed
	timerQuotaOn                   // a duty cycle's run phase begins
	timerQuotaOff                  // a duty cycle's hold phase begins
)

// timer is a pending wake-up. gen must match its owner's generation when
// it fires, so that changing state cancels timers without searching the
// heap.
type timer struct {
	at   uint64
	seq  uint64
	kind uint8
	gen  uint64
	p    *proc
	gpu  int
	cy   *cycle
}

// timers is a min-heap by (at, seq): O(log n) per timer, deterministic
// order for equal times.
type timers struct {
	h   timerHeap
	seq uint64
}

func (t *timers) push(x timer) {
	t.seq++
	x.seq = t.seq
	heap.Push(&t.h, x)
}

// next returns the earliest pending time.
func (t *timers) next() (uint64, bool) {
	if len(t.h) == 0 {
		return 0, false
	}
	return t.h[0].at, true
}

// due pops the earliest timer if it is due at now.
func (t *timers) due(now uint64) (timer, bool) {
	if len(t.h) == 0 || t.h[0].at > now {
		return timer{}, false
	}
	return heap.Pop(&t.h).(timer), true
}

type timerHeap []timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// fire runs a due timer.
func (e *Engine) fire(t timer) {
	switch t.kind {
	case timerIdle:
		p := t.p
		if p.req.gen != t.gen || !p.req.busy.Active() || e.procs[p.key.PID] != p {
			return
		}
		e.finish(p)
	case timerHarvest:
		gs := e.gpu(t.gpu)
		if gs.harvestGen != t.gen || len(gs.active) > 0 || e.nextRequestHolds(t.gpu) {
			return
		}
		e.releaseGPU(t.gpu)
	case timerQuotaOn, timerQuotaOff:
		e.phase(t)
	}
}
