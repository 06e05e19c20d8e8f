package uprobe

import (
	"errors"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpu-arbiter/arbiter/trace"
)

// Batches of decoded events travel from the reader goroutine to Read, so
// that the channel hand-off is paid per batch, not per event, and the
// batches are recycled: nothing is allocated per event.
const (
	batchLen   = 512
	batchCount = 16
)

type batch struct {
	events [batchLen]trace.Event
	n      int
	next   int
}

// queue carries full batches to the consumer and empty ones back.
type queue struct {
	full chan *batch
	free chan *batch
	mu   sync.Mutex // serializes consumers (uncontended with one)
	cur  *batch     // the consumer's batch
}

func newQueue() *queue {
	q := &queue{full: make(chan *batch, batchCount), free: make(chan *batch, batchCount)}
	for range batchCount {
		q.free <- new(batch)
	}
	return q
}

// read returns the next event, blocking until one is queued or done is
// closed.
func (q *queue) read(ev *trace.Event, done <-chan struct{}) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		select {
		case <-done:
			return ErrClosed
		default:
		}
		if b := q.cur; b != nil {
			if b.next < b.n {
				*ev = b.events[b.next]
				b.next++
				return nil
			}
			q.cur = nil
			b.n, b.next = 0, 0
			q.free <- b
		}
		select {
		case b := <-q.full:
			q.cur = b
		case <-done:
			return ErrClosed
		}
	}
}

// readLoop drains the ring buffer into batches until the ring is closed.
// The probes wake it only past a fill threshold or for an expedited
// process's request, so it polls with a deadline (or when Flush asks) and
// hands over a partial batch whenever the ring runs empty.
// When the consumer stops reading, the batches run out, this loop blocks,
// the ring fills and the probes count drops: the application never waits.
func (t *Tracer) readLoop() {
	defer t.wg.Done()
	var rec ringbuf.Record
	var b *batch
	send := func() bool {
		if b == nil || b.n == 0 {
			return true
		}
		select {
		case t.q.full <- b:
			b = nil
			return true
		case <-t.done:
			return false
		}
	}
	// The deadline is renewed per poll cycle, not per record: ReadInto
	// only waits on it once the ring is empty, and an expired one then just
	// ends the cycle.
	t.ring.SetDeadline(time.Now().Add(t.opts.poll))
	for {
		if b == nil {
			select {
			case b = <-t.q.free:
			case <-t.done:
				return
			}
		}
		// Flushes asked for before this read are served when it finds
		// the ring empty (see Flush).
		asked := t.flush.asked.Load()
		err := t.ring.ReadInto(&rec)
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, ringbuf.ErrFlushed):
			if !send() {
				return
			}
			t.flush.serve(asked, t.events.Load())
			next := time.Now().Add(t.opts.poll)
			if t.flush.asked.Load() != asked {
				// A flush came in while this read drained the ring (its
				// wake-up may be spent): drain again at once.
				next = time.Now()
			}
			t.ring.SetDeadline(next)
			continue
		default: // closed
			return
		}
		if raw := rec.RawSample; len(raw) >= RecordSize && raw[offKind] == kindIFunc {
			t.noteIFunc(raw)
			continue
		}
		if err := Decode(rec.RawSample, &b.events[b.n]); err != nil {
			t.decodeErrors.Add(1)
			continue
		}
		if ev := &b.events[b.n]; ev.Kind == trace.KindExec {
			t.noteExec(ev.PID)
		}
		b.n++
		t.events.Add(1)
		if b.n == batchLen || rec.Remaining == 0 {
			if !send() {
				return
			}
		}
	}
}
