package sim

// event is one entry of the event queue. Events at the same time fire in
// the order they were scheduled (seq), which makes runs deterministic.
type event struct {
	t    uint64
	seq  uint64
	gen  uint64
	kind eventKind
	id   int32
}

type eventKind uint8

const (
	// evGPU is a compute-engine decision point of GPU id (valid while gen
	// matches the GPU's generation).
	evGPU eventKind = iota
	// evCopy is a copy completing on copy engine id (gpu*2 + direction).
	evCopy
	// evHost wakes process id's host program (valid while gen matches).
	evHost
	// evControl applies the oldest pending enforcement action.
	evControl
)

// queue is a 4-ary min-heap of events by (t, seq), kept by value so that
// scheduling allocates nothing once the slice has grown. Four children
// per node halve the heap's depth against a binary heap, and the
// children of a node share a cache line or two.
type queue struct {
	h   []event
	seq uint64
}

func (q *queue) len() int { return len(q.h) }

func less(a, b *event) bool {
	return a.t < b.t || (a.t == b.t && a.seq < b.seq)
}

func (q *queue) push(e event) {
	e.seq = q.seq
	q.seq++
	q.h = append(q.h, e)
	i := len(q.h) - 1
	for i > 0 {
		p := (i - 1) / 4
		if !less(&e, &q.h[p]) {
			break
		}
		q.h[i] = q.h[p]
		i = p
	}
	q.h[i] = e
}

// peek returns the earliest event; the queue must not be empty.
func (q *queue) peek() *event { return &q.h[0] }

func (q *queue) pop() event {
	top := q.h[0]
	n := len(q.h) - 1
	last := q.h[n]
	q.h = q.h[:n]
	if n == 0 {
		return top
	}
	i := 0
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		for k := c + 1; k < min(c+4, n); k++ {
			if less(&q.h[k], &q.h[m]) {
				m = k
			}
		}
		if !less(&q.h[m], &last) {
			break
		}
		q.h[i] = q.h[m]
		i = m
	}
	q.h[i] = last
	return top
}
