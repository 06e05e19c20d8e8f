package workload

import (
	"math/rand/v2"

	"github.com/gpu-arbiter/arbiter/sim"
)

// request is an arrived LC request: its arrival time, the seed of its
// service times, and its number in the order of arrival.
type request struct {
	at, seed, idx uint64
}

// dispatcher is an LC workload's request queue, shared by its replicas:
// it generates arrivals in order and hands the oldest waiting request to
// whichever replica asks first. At most maxPending requests wait; later
// arrivals are turned away (rejected), as a server with a bounded queue
// does, and counted.
//
// Arrivals are generated only when a replica asks (or when the run's
// backlog is counted at the end), so a starved server's backlog costs no
// memory. Each request's service times (kernel durations, host work) come
// from a seed drawn when it arrives, rejected or not, so the same request
// gets the same kernels whichever replica serves it and whatever the
// scheduling.
type dispatcher struct {
	name       string
	arr        *arrivals
	seeds      *rand.Rand
	horizon    uint64
	maxPending int

	pend     []request
	ph       int
	next     request
	primed   bool
	hasNext  bool
	rejected uint64
	count    uint64 // arrivals generated

	// A closed workload has no queue: each server sends itself its next
	// request, think after its previous one ended (arrival "closed").
	closed bool
	think  *sampler
}

// arrive makes a closed workload's next request, arriving at t.
func (d *dispatcher) arrive(t uint64) request {
	d.count++
	return request{at: t, seed: d.seeds.Uint64(), idx: d.count - 1}
}

// thinkTime draws the time a closed workload's server waits before its
// next request.
func (d *dispatcher) thinkTime() uint64 {
	if d.think == nil {
		return 0
	}
	return d.think.draw(d.arr.r)
}

func (d *dispatcher) advance() {
	a, ok := d.arr.next()
	d.hasNext = ok && a < d.horizon
	if d.hasNext {
		d.next = request{at: a, seed: d.seeds.Uint64(), idx: d.count}
		d.count++
	}
}

// admit queues the arrivals up to (and, with inclusive, at) t, turning
// away those that find maxPending requests waiting.
func (d *dispatcher) admit(t uint64, inclusive bool) {
	if !d.primed {
		d.primed = true
		d.advance()
	}
	for d.hasNext && (d.next.at < t || (inclusive && d.next.at == t)) {
		if len(d.pend)-d.ph < d.maxPending {
			d.pend = append(d.pend, d.next)
		} else {
			d.rejected++
		}
		d.advance()
	}
}

// take returns the oldest request that has arrived by now, if any.
func (d *dispatcher) take(now uint64) (request, bool) {
	d.admit(now, true)
	if d.ph == len(d.pend) {
		return request{}, false
	}
	r := d.pend[d.ph]
	d.ph++
	if d.ph > 1024 && d.ph*2 > len(d.pend) {
		d.pend = d.pend[:copy(d.pend, d.pend[d.ph:])]
		d.ph = 0
	}
	return r, true
}

// lcProgram is one server (replica) of an LC workload: it serves one
// request at a time, taking them from the shared dispatcher.
type lcProgram struct {
	d      *dispatcher
	stream uint64
	steps  []step

	inReq    bool
	si, rep  int
	needSync bool

	// A request's service times, drawn when it begins (or read from
	// draws, where another run drew them); seg is the next segment of
	// them to hand over.
	draws *keyed
	seg   int

	// Closed arrivals: the next request of this server arrives at nextAt.
	thinking bool
	nextAt   uint64
}

// Next implements sim.Program.
func (p *lcProgram) Next(now uint64) (op sim.Op, err error) {
	err = p.NextInto(now, &op)
	return op, err
}

// NextInto implements sim.ProgramInto.
func (p *lcProgram) NextInto(now uint64, op *sim.Op) error {
	switch {
	case p.inReq:
		p.step(op)
	case p.d.closed:
		p.closedNext(now, op)
	default:
		if r, ok := p.d.take(now); ok {
			p.begin(r, op)
		} else if !p.d.hasNext {
			put(op, sim.OpStop, 0, 0)
		} else {
			put(op, sim.OpWaitUntil, 0, p.d.next.at)
		}
	}
	return nil
}

// closedNext is Next for a closed workload: think, then send the next
// request, until the horizon.
func (p *lcProgram) closedNext(now uint64, op *sim.Op) {
	if !p.thinking {
		p.thinking = true
		p.nextAt = now + p.d.thinkTime()
	}
	switch {
	case p.nextAt >= p.d.horizon:
		put(op, sim.OpStop, 0, 0)
	case p.nextAt > now:
		put(op, sim.OpWaitUntil, 0, p.nextAt)
	default:
		p.thinking = false
		p.begin(p.d.arrive(p.nextAt), op)
	}
}

// begin starts serving r: its service times are drawn (or read) now.
func (p *lcProgram) begin(r request, op *sim.Op) {
	p.draws.load(r.idx, r.seed)
	p.inReq, p.si, p.rep, p.seg = true, 0, 0, 0
	put(op, sim.OpBegin, 0, r.at)
}

// seed seeds g for the service times of the request with the given seed.
func (p *lcProgram) seed(g *gen, _, seed uint64) {
	g.seed(seed, p.stream)
}

// next returns the index of the request's next segment of draws.
func (p *lcProgram) next() int {
	p.seg++
	return p.seg - 1
}

// step writes the request's next operation.
func (p *lcProgram) step(op *sim.Op) {
	if p.needSync {
		p.needSync = false
		put(op, sim.OpSync, 0, 0)
		return
	}
	if p.si == len(p.steps) {
		p.inReq = false
		put(op, sim.OpEnd, 0, 0)
		return
	}
	st := &p.steps[p.si]
	switch st.kind {
	case stepCopy:
		p.si++
		put(op, sim.OpCopy, 0, 0)
		op.Bytes, op.Dir = st.bytes, st.dir
	case stepKernel:
		if !st.syncEach && p.rep == 0 && st.count > 1 {
			// The launches of a step go out back to back: one burst.
			p.si++
			p.draws.kernels(p.next(), op)
			return
		}
		p.rep++
		if p.rep >= st.count {
			p.si++
			p.rep = 0
		}
		p.needSync = st.syncEach
		put(op, sim.OpKernel, p.draws.single(p.next()), 0)
	case stepHost:
		p.si++
		put(op, sim.OpSleep, p.draws.single(p.next()), 0)
	default:
		p.si++
		put(op, sim.OpSync, 0, 0)
	}
}
