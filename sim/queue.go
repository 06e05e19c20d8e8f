package sim

import "slices"

// eventKind says what a pending event does.
type eventKind uint8

const (
	// evGPU is a compute-engine decision point of GPU id.
	evGPU eventKind = iota
	// evCopy is a copy completing on copy engine id (gpu*2 + direction).
	evCopy
	// evHost wakes process id's host program.
	evHost
	// evControl applies the oldest pending enforcement action.
	evControl
)

// source is something with at most one event pending: a GPU's compute
// engine (its next decision), a copy engine (its copy in flight), a host
// (its wake-up), or the queue of enforcement actions (its oldest).
// Scheduling a source's event replaces the one it had pending, which
// would have done nothing.
type source struct {
	kind eventKind
	id   int32
	pos  int32 // index of its pending event in the heap, -1 if none (heap only)
}

// event is a pending event of source src.
type event struct {
	t, seq uint64
	src    int32
}

func (a *event) before(b *event) bool {
	return a.t < b.t || (a.t == b.t && a.seq < b.seq)
}

// queue holds the pending events, one per source, ordered by time and
// then by the order they were scheduled (seq), which makes runs
// deterministic. A node has a handful of sources (per GPU its engines,
// per process its host), and so a handful of events pending however
// often they are moved: up to smallQueue sources they are kept in an
// array sorted latest first, the next one last, moved by a short copy;
// beyond, in a binary min-heap. Scheduling allocates nothing once the
// sources are added.
type queue struct {
	srcs []source
	// events: sorted latest first (small), or a heap (!small), where
	// each source's pos is its event's index. In the sorted array, mask
	// has bit i set while source i has an event pending, and pos is not
	// kept: a bit costs less to test and set than a source's entry.
	events []event
	small  bool
	mask   uint32
	seq    uint64
}

// smallQueue is the most sources the queue keeps in a sorted array (the
// bits of mask).
const smallQueue = 32

// add registers a source and returns its index.
func (q *queue) add(kind eventKind, id int32) int32 {
	q.srcs = append(q.srcs, source{kind: kind, id: id, pos: -1})
	if len(q.srcs) == 1 {
		q.small = true
		q.events = make([]event, 0, smallQueue)
	}
	if q.small && len(q.srcs) > smallQueue {
		q.small = false
		slices.Reverse(q.events) // sorted earliest first: a heap
		for i, e := range q.events {
			q.srcs[e.src].pos = int32(i)
		}
	}
	return int32(len(q.srcs) - 1)
}

// len is the number of pending events.
func (q *queue) len() int { return len(q.events) }

// pending reports whether source i has an event pending.
func (q *queue) pending(i int32) bool {
	if q.small {
		return q.mask&(1<<(uint32(i)&(smallQueue-1))) != 0
	}
	return q.srcs[i].pos >= 0
}

// next takes the next sequence number, the order of a scheduling.
func (q *queue) next() uint64 {
	q.seq++
	return q.seq - 1
}

// set makes source i's pending event the one at t with sequence number
// seq, replacing any it had.
func (q *queue) set(i int32, t, seq uint64) {
	e := event{t: t, seq: seq, src: i}
	if q.small {
		q.setSorted(e)
		return
	}
	q.setHeap(e)
}

// setHeap is set on the heap.
func (q *queue) setHeap(e event) {
	at := int(q.srcs[e.src].pos)
	if at < 0 {
		q.events = append(q.events, e)
		q.up(len(q.events)-1, e)
		return
	}
	if old := q.events[at]; e.before(&old) {
		q.up(at, e)
	} else {
		q.down(at, e)
	}
}

// setSorted is set on the sorted array: the source's old event, if any,
// is taken out, and e goes in after the events later than it. Both move
// the entries between by hand: there are a few, and most events go in
// near the end (they are soon). The array is resliced in place, never
// reassigned (add gives it room for every source), so that no pointer is
// written. An event with the newest sequence number, as schedule gives
// nearly every one, follows every event at its time: it is placed by its
// time alone.
func (q *queue) setSorted(e event) {
	bit := uint32(1) << (uint32(e.src) & (smallQueue - 1))
	if q.mask&bit != 0 {
		ev := q.events
		j := len(ev) - 1
		for ev[j].src != e.src {
			j--
		}
		for ; j+1 < len(ev); j++ {
			ev[j] = ev[j+1]
		}
		q.events = q.events[:len(ev)-1]
	}
	q.events = q.events[:len(q.events)+1]
	ev := q.events
	j := len(ev) - 1
	if e.seq+1 == q.seq {
		for j > 0 && ev[j-1].t <= e.t {
			ev[j] = ev[j-1]
			j--
		}
	} else {
		for j > 0 && ev[j-1].before(&e) {
			ev[j] = ev[j-1]
			j--
		}
	}
	ev[j] = e
	q.mask |= bit
}

// peek returns the earliest event; the queue must not be empty.
func (q *queue) peek() *event {
	if q.small {
		return &q.events[len(q.events)-1]
	}
	return &q.events[0]
}

// pop removes the earliest event and returns it; the queue must not be
// empty.
func (q *queue) pop() event {
	if q.small {
		return q.popSorted()
	}
	n := len(q.events) - 1
	top := q.events[0]
	q.srcs[top.src].pos = -1
	last := q.events[n]
	q.events = q.events[:n]
	if n > 0 {
		q.down(0, last)
	}
	return top
}

// popSorted is pop on the sorted array, small enough for step to inline
// (it is most of the events a run pops).
func (q *queue) popSorted() event {
	n := len(q.events) - 1
	top := q.events[n]
	q.events = q.events[:n]
	q.mask &^= 1 << (uint32(top.src) & (smallQueue - 1))
	return top
}

// up places e, replacing the heap entry at i, moving its ancestors later
// than it down a level.
func (q *queue) up(i int, e event) {
	for i > 0 {
		p := (i - 1) / 2
		if !e.before(&q.events[p]) {
			break
		}
		q.events[i] = q.events[p]
		q.srcs[q.events[i].src].pos = int32(i)
		i = p
	}
	q.events[i] = e
	q.srcs[e.src].pos = int32(i)
}

// down places e, replacing the heap entry at i, moving its earlier
// descendants up a level.
func (q *queue) down(i int, e event) {
	n := len(q.events)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && q.events[r].before(&q.events[c]) {
			c = r
		}
		if !q.events[c].before(&e) {
			break
		}
		q.events[i] = q.events[c]
		q.srcs[q.events[i].src].pos = int32(i)
		i = c
	}
	q.events[i] = e
	q.srcs[e.src].pos = int32(i)
}
