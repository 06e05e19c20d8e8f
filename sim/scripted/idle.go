package scripted

// idleQueue holds the pending idle times of LC processes' open requests
// as a binary min-heap ordered by time, then pid. An entry is stale once
// its process's idle time changed (a launch or copy cancels it, a later
// synchronization sets another): stale entries are dropped when they reach
// the top, so every operation is O(log n) amortized, however many events
// arrive between two deadlines.
type idleQueue struct {
	h []idleEntry
}

type idleEntry struct {
	t uint64
	p *state
}

func (a idleEntry) before(b idleEntry) bool {
	return a.t < b.t || (a.t == b.t && a.p.PID < b.p.PID)
}

// push records that p becomes idle at t.
func (q *idleQueue) push(t uint64, p *state) {
	q.h = append(q.h, idleEntry{t: t, p: p})
	i := len(q.h) - 1
	for i > 0 {
		up := (i - 1) / 2
		if !q.h[i].before(q.h[up]) {
			break
		}
		q.h[i], q.h[up] = q.h[up], q.h[i]
		i = up
	}
}

// next returns the earliest pending idle time, 0 if none.
func (q *idleQueue) next() uint64 {
	q.dropStale()
	if len(q.h) == 0 {
		return 0
	}
	return q.h[0].t
}

// due removes and returns the process of the earliest pending idle time
// if it is at or before now, nil otherwise.
func (q *idleQueue) due(now uint64) *state {
	q.dropStale()
	if len(q.h) == 0 || q.h[0].t > now {
		return nil
	}
	p := q.h[0].p
	q.pop()
	return p
}

// dropStale pops entries that no longer match their process's idle time.
func (q *idleQueue) dropStale() {
	for len(q.h) > 0 {
		e := q.h[0]
		if at, ok := e.p.req.Deadline(); ok && at == e.t {
			return
		}
		q.pop()
	}
}

func (q *idleQueue) pop() {
	n := len(q.h) - 1
	q.h[0] = q.h[n]
	q.h = q.h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && q.h[r].before(q.h[l]) {
			m = r
		}
		if !q.h[m].before(q.h[i]) {
			return
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
}
