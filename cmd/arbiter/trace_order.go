package main

import (
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
)

// The live tracer delivers events in the order the probes reserved their
// ring-buffer records, which is not time order: probes on different CPUs
// take their timestamp and reserve a moment apart, and a synchronizing call
// is reported at its return with the time it entered. The trace command
// therefore holds each event for a short window and prints in time order.
const (
	// orderWindow is how long an event is held for earlier events to catch
	// up: longer than the reader's 10 ms poll, so that everything the ring
	// held at one poll is sorted together, and than most synchronizing
	// calls. Later stragglers are printed when they arrive.
	orderWindow = 20 * time.Millisecond
	// orderLimit bounds the events held: past it the oldest goes out
	// whatever its age, so a burst costs memory only up to this.
	orderLimit = 1 << 16
	// orderTick is how often held events are released when none arrive.
	orderTick = 5 * time.Millisecond
)

// orderBuffer holds events and releases them in time order once they are a
// window older than the newest event or the clock. It keeps its events in
// slots and orders small references to them in a binary heap, so that a
// steady stream allocates nothing. It is not safe for concurrent use.
type orderBuffer struct {
	window uint64
	limit  int
	slots  []heldEvent
	free   []int32
	heap   []heldRef
	seq    uint64
	newest uint64 // the latest event time pushed
}

// heldEvent is an event waiting in an orderBuffer, with its process name.
type heldEvent struct {
	ev   trace.Event
	comm string
}

// heldRef orders one held event: by time, then by arrival.
type heldRef struct {
	time, seq uint64
	slot      int32
}

func (a heldRef) before(b heldRef) bool {
	return a.time < b.time || a.time == b.time && a.seq < b.seq
}

func newOrderBuffer(window time.Duration, limit int) *orderBuffer {
	return &orderBuffer{window: uint64(window), limit: limit}
}

// push adds ev (copied) with its process name.
func (b *orderBuffer) push(ev *trace.Event, comm string) {
	var slot int32
	if n := len(b.free); n > 0 {
		slot = b.free[n-1]
		b.free = b.free[:n-1]
		b.slots[slot] = heldEvent{ev: *ev, comm: comm}
	} else {
		slot = int32(len(b.slots))
		b.slots = append(b.slots, heldEvent{ev: *ev, comm: comm})
	}
	b.newest = max(b.newest, ev.Time)
	b.seq++
	b.heap = append(b.heap, heldRef{time: ev.Time, seq: b.seq, slot: slot})
	b.up(len(b.heap) - 1)
}

// next returns the oldest held event if it is due: a window older than
// now or than the newest event pushed, or pushed out by the limit. The
// event stays valid until the next push. now is the current time on the
// events' clock, 0 where only the events tell time (a replay).
func (b *orderBuffer) next(now uint64) (*heldEvent, bool) {
	if len(b.heap) == 0 {
		return nil, false
	}
	top := b.heap[0]
	if len(b.heap) <= b.limit && top.time+b.window > max(now, b.newest) {
		return nil, false
	}
	return b.pop(), true
}

// flush returns the oldest held event whatever its age, false when empty.
func (b *orderBuffer) flush() (*heldEvent, bool) {
	if len(b.heap) == 0 {
		return nil, false
	}
	return b.pop(), true
}

// len returns the number of events held.
func (b *orderBuffer) len() int { return len(b.heap) }

func (b *orderBuffer) pop() *heldEvent {
	top := b.heap[0]
	last := len(b.heap) - 1
	b.heap[0] = b.heap[last]
	b.heap = b.heap[:last]
	if last > 0 {
		b.down(0)
	}
	b.free = append(b.free, top.slot)
	return &b.slots[top.slot]
}

func (b *orderBuffer) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !b.heap[i].before(b.heap[parent]) {
			return
		}
		b.heap[i], b.heap[parent] = b.heap[parent], b.heap[i]
		i = parent
	}
}

func (b *orderBuffer) down(i int) {
	n := len(b.heap)
	for {
		least := i
		for _, c := range []int{2*i + 1, 2*i + 2} {
			if c < n && b.heap[c].before(b.heap[least]) {
				least = c
			}
		}
		if least == i {
			return
		}
		b.heap[i], b.heap[least] = b.heap[least], b.heap[i]
		i = least
	}
}
