package engine

// timer kinds.
const (
	timerIdle     uint8 = iota + 1 // a latency-critical process's idle gap has passed
	timerHarvest                   // a held GPU's predicted gap has passed
	timerQuotaOn                   // a duty cycle's run phase begins
	timerQuotaOff                  // a duty cycle's hold phase begins
)

// timer is a pending wake-up. A harvest or duty-cycle timer's gen must
// match its owner's generation when it fires, so that changing state
// cancels timers without searching the heap; an idle timer is checked
// against its process's pending deadline (request.idleAt) instead.
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
// order for equal times. It is written out for its one element type, not
// through container/heap, whose interface boxes each timer pushed (an
// allocation per latency-critical call) and calls Less and Swap
// indirectly.
type timers struct {
	h   []timer
	seq uint64
}

func (t *timers) push(x timer) {
	t.seq++
	x.seq = t.seq
	t.h = append(t.h, x)
	t.up(len(t.h) - 1)
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
	top := t.h[0]
	last := len(t.h) - 1
	t.h[0] = t.h[last]
	t.h[last] = timer{} // no pointers kept alive by the spare capacity
	t.h = t.h[:last]
	if last > 0 {
		t.down(0)
	}
	return top, true
}

// before orders timers by time, then by when they were pushed.
func (a *timer) before(b *timer) bool {
	return a.at < b.at || a.at == b.at && a.seq < b.seq
}

// up moves the timer at i towards the root to its place.
func (t *timers) up(i int) {
	h := t.h
	x := h[i]
	for i > 0 {
		parent := (i - 1) / 2
		if !x.before(&h[parent]) {
			break
		}
		h[i] = h[parent]
		i = parent
	}
	h[i] = x
}

// down moves the timer at i towards the leaves to its place.
func (t *timers) down(i int) {
	h := t.h
	n := len(h)
	x := h[i]
	for {
		child := 2*i + 1
		if child >= n {
			break
		}
		if r := child + 1; r < n && h[r].before(&h[child]) {
			child = r
		}
		if !h[child].before(&x) {
			break
		}
		h[i] = h[child]
		i = child
	}
	h[i] = x
}

// fire runs a due timer.
func (e *Engine) fire(t timer) {
	switch t.kind {
	case timerIdle:
		e.idleDue(t.p, t.at)
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
