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

// queue is a binary min-heap of events by (t, seq), kept by value so that
// scheduling allocates nothing once the slice has grown.
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
		p := (i - 1) / 2
		if !less(&q.h[i], &q.h[p]) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

// peek returns the earliest event; the queue must not be empty.
func (q *queue) peek() *event { return &q.h[0] }

func (q *queue) pop() event {
	top := q.h[0]
	n := len(q.h) - 1
	q.h[0] = q.h[n]
	q.h = q.h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && less(&q.h[r], &q.h[l]) {
			m = r
		}
		if !less(&q.h[m], &q.h[i]) {
			break
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
	return top
}
