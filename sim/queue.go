package sim

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
	t, seq uint64 // its pending event, if pos >= 0
	kind   eventKind
	id     int32
	pos    int32 // index in the heap, -1 if nothing is pending
}

// queue holds the pending events, one per source, in a binary min-heap
// ordered by time and then by the order they were scheduled (seq), which
// makes runs deterministic. A node has a handful of sources (per GPU its
// engines, per process its host), so the heap is small however often
// their events are moved, and scheduling allocates nothing once the
// sources are added.
type queue struct {
	srcs []source
	heap []int32 // indices into srcs
	seq  uint64
}

// add registers a source and returns its index.
func (q *queue) add(kind eventKind, id int32) int32 {
	q.srcs = append(q.srcs, source{kind: kind, id: id, pos: -1})
	return int32(len(q.srcs) - 1)
}

// len is the number of pending events.
func (q *queue) len() int { return len(q.heap) }

// pending reports whether source i has an event pending.
func (q *queue) pending(i int32) bool { return q.srcs[i].pos >= 0 }

// next takes the next sequence number, the order of a scheduling.
func (q *queue) next() uint64 {
	q.seq++
	return q.seq - 1
}

// set makes source i's pending event the one at t with sequence number
// seq, replacing any it had.
func (q *queue) set(i int32, t, seq uint64) {
	s := &q.srcs[i]
	s.t, s.seq = t, seq
	if s.pos < 0 {
		s.pos = int32(len(q.heap))
		q.heap = append(q.heap, i)
		q.up(int(s.pos))
		return
	}
	if !q.up(int(s.pos)) {
		q.down(int(s.pos))
	}
}

// peek returns the source of the earliest event; the queue must not be
// empty.
func (q *queue) peek() *source { return &q.srcs[q.heap[0]] }

// pop removes the earliest event and returns its source; the queue must
// not be empty.
func (q *queue) pop() *source {
	top := q.heap[0]
	n := len(q.heap) - 1
	q.swap(0, n)
	q.heap = q.heap[:n]
	if n > 0 {
		q.down(0)
	}
	s := &q.srcs[top]
	s.pos = -1
	return s
}

func (q *queue) less(a, b int) bool {
	x, y := &q.srcs[q.heap[a]], &q.srcs[q.heap[b]]
	return x.t < y.t || (x.t == y.t && x.seq < y.seq)
}

func (q *queue) swap(a, b int) {
	q.heap[a], q.heap[b] = q.heap[b], q.heap[a]
	q.srcs[q.heap[a]].pos = int32(a)
	q.srcs[q.heap[b]].pos = int32(b)
}

// up moves entry i towards the root while it is earlier than its parent;
// it reports whether it moved.
func (q *queue) up(i int) bool {
	moved := false
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.swap(i, p)
		i, moved = p, true
	}
	return moved
}

// down moves entry i towards the leaves while a child is earlier.
func (q *queue) down(i int) {
	n := len(q.heap)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if r := c + 1; r < n && q.less(r, c) {
			c = r
		}
		if !q.less(c, i) {
			return
		}
		q.swap(i, c)
		i = c
	}
}
