package workload

import (
	"sync"
	"sync/atomic"
)

// Draws lets the simulations of one comparison share the service times
// they draw. Every baseline serves the same requests with the same
// kernels: the k-th request of an LC workload has the same seed in every
// run, and so the same service times, and so has the k-th cycle of a BE
// workload. Drawing them (a normal deviate and an exponential per
// log-normal kernel) is the largest single cost of a run, so the first
// simulation to need them draws them and the others, running alongside at
// about the same simulated time, read them. A simulation that finds them
// gone (it lags, or ran alone) draws them itself: the values are the same
// either way, so sharing changes no result, only the work. Safe for
// concurrent use; use NewDraws. One Draws serves one seed.
type Draws struct {
	mu      sync.Mutex
	streams map[uint64]*drawRing
}

// drawKeep is how many entries each stream keeps: the requests of a few
// seconds of simulated time at the rates specs use.
const drawKeep = 4096

// drawRing keeps the last drawKeep entries of one stream, each in the
// slot of its key modulo drawKeep: reading one takes an atomic load, no
// lock, as the runs of a comparison read the same stream at once.
type drawRing struct {
	slots [drawKeep]atomic.Pointer[drawEntry]
}

type drawEntry struct {
	key, check uint64
	vals       []uint64
}

// NewDraws returns an empty cache.
func NewDraws() *Draws { return &Draws{streams: map[uint64]*drawRing{}} }

// stream returns the ring of stream id (nil for a nil *Draws).
func (d *Draws) stream(id uint64) *drawRing {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.streams[id]
	if r == nil {
		r = &drawRing{}
		d.streams[id] = r
	}
	return r
}

// get returns the n draws keyed by key (and check, a second identity:
// the request's seed), filling them in with fill on a miss. The slice
// returned must not be modified. A nil ring fills buf (grown if needed)
// and returns it.
func (r *drawRing) get(key, check uint64, n int, buf []uint64, fill func([]uint64)) []uint64 {
	if r == nil {
		if cap(buf) < n {
			buf = make([]uint64, n)
		}
		buf = buf[:n]
		fill(buf)
		return buf
	}
	slot := &r.slots[key%drawKeep]
	if e := slot.Load(); e != nil && e.key == key && e.check == check && len(e.vals) == n {
		return e.vals
	}
	v := make([]uint64, n)
	fill(v)
	slot.Store(&drawEntry{key: key, check: check, vals: v})
	return v
}

// streamID names a workload's stream of draws: its name and its kind.
func streamID(name string, be bool) uint64 {
	id := nameHash(name)
	if be {
		id = ^id
	}
	return id
}
