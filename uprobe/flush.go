package uprobe

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Flush makes the records already in the ring readable now instead of at
// the reader's next poll, and returns once every one of them is queued for
// Read, with the number of events queued since Open: once Read has returned
// that many, nothing that happened before the Flush is still waiting. A
// consumer that acts on the absence of events (the engine ends a request
// when its process has made no call for an idle gap) flushes before it
// concludes that nothing came: a call made within the gap may sit in the
// ring, since only records past the fill threshold and those of an
// expedited process's first call wake the reader. It costs the reader one
// wake-up. After Close it returns ErrClosed.
func (t *Tracer) Flush() (uint64, error) {
	// Asked first, then woken: a read that starts after the ask serves it
	// when it finds the ring empty, which it does after every record
	// committed before this call.
	ask := t.flush.asked.Add(1)
	if err := t.ring.Flush(); err != nil {
		select {
		case <-t.done:
			return 0, ErrClosed
		default:
		}
		return 0, fmt.Errorf("flush the ring buffer: %w", err)
	}
	for {
		t.flush.mu.Lock()
		if t.flush.done >= ask {
			n := t.flush.events
			t.flush.mu.Unlock()
			return n, nil
		}
		served := t.flush.served
		t.flush.mu.Unlock()
		select {
		case <-served:
		case <-t.done:
			return 0, ErrClosed
		}
	}
}

// flushes are the Flush calls asked for and served.
type flushes struct {
	asked atomic.Uint64 // Flush calls so far

	mu     sync.Mutex
	done   uint64        // every ask up to this is served
	events uint64        // events queued when done was last raised
	served chan struct{} // closed (and replaced) whenever done is raised
}

// serve marks the asks up to asked served, with events queued so far.
func (f *flushes) serve(asked, events uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if asked <= f.done {
		return
	}
	f.done, f.events = asked, events
	close(f.served)
	f.served = make(chan struct{})
}
