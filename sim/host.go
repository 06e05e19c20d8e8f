package sim

import (
	"fmt"
	"time"

	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/sim/hist"
	"github.com/gpu-arbiter/arbiter/trace"
)

// OpKind says what a host program does next.
type OpKind uint8

// Host operations.
const (
	// OpKernel launches a kernel that runs Dur ns on an otherwise idle GPU
	// (asynchronous: the host continues at once); with Durs set, one
	// kernel per element of Durs instead, in order, at the same instant.
	OpKernel OpKind = iota + 1
	// OpCopy queues a copy of Bytes in direction Dir on the stream
	// (asynchronous). Its duration is CopyLatency + Bytes/CopyBandwidth, or
	// Dur when Dur > 0.
	OpCopy
	// OpSync blocks the host until the stream is idle.
	OpSync
	// OpSleep keeps the host busy (CPU work) for Dur ns.
	OpSleep
	// OpWaitUntil idles the host until virtual time At.
	OpWaitUntil
	// OpBegin starts a request that arrived at At (At ≤ now): its latency
	// is measured from At.
	OpBegin
	// OpEnd synchronizes like OpSync; when the stream is idle the request
	// begun by OpBegin completes.
	OpEnd
	// OpStop ends the program.
	OpStop
)

// Op is one host operation.
type Op struct {
	Kind  OpKind
	Dur   uint64
	At    uint64
	Bytes uint64
	Dir   trace.CopyDir
	// Durs, with OpKernel, launches several kernels at once: a program
	// that issues a burst of launches hands it over in one call rather
	// than one call per kernel. The simulator reads the slice until those
	// kernels have run: the program must not change it before then (a
	// synchronization after the launches makes sure they have).
	Durs []uint64
	// Burst, with OpKernel and no Durs, launches Count kernels whose
	// durations sum to Dur without handing the durations over: the
	// simulator asks Burst for them only as far as it must know where one
	// of them ends (a preemption inside the burst, a count of the kernels
	// done part way), which most bursts never need. A program that knows
	// a burst's total before its parts (another run of the same
	// comparison drew them) saves drawing them, or all but the first.
	Burst Burst
	Count uint32
}

// Burst supplies the kernel durations of a burst launched without them
// (Op.Burst).
type Burst interface {
	// Start returns where the simulator may begin asking for durations
	// (Kernels) to find the kernel in progress w ns of work into the
	// burst: a kernel first at or before that one, and before, the sum of
	// the durations of the kernels before first. 0, 0 is always right; a
	// program that can draw a burst's kernels from part way (it kept
	// where its generator was at some of them) answers with a later one,
	// and saves drawing those before it.
	Start(w uint64) (first int, before uint64)
	// Kernels returns the durations of the burst's kernels from kernel
	// first on, in launch order: at least n of them (1 ≤ n ≤
	// Count−first), at most Count−first, none zero; all Count sum to the
	// Op's Dur. first is 0 or a kernel Start returned. The simulator asks
	// for more as it needs them, n growing from one call to the next with
	// the same first; a program may answer with more than asked. It asks
	// only while the burst's kernels are queued: the program must be able
	// to answer until a synchronization after the launch has returned,
	// and must not change what it returned for a first before then,
	// except once the simulator has asked for another first (it holds
	// the durations from one first at a time).
	Kernels(first, n int) []uint64
	// MayEnd reports whether a kernel of the burst may end w ns of work
	// into it (0 < w < Dur): false only if none does. It lets the
	// simulator answer whether a preemption falls between two kernels
	// without asking for their durations; true is always right, and
	// costs a call to Kernels.
	MayEnd(w uint64) bool
}

// Program is a simulated process's host program. Next is called whenever
// the host is ready for its next operation, with the virtual time; it
// returns an error to stop the whole run (for example when its request
// backlog passes a bound). Programs are deterministic state machines: all
// their randomness comes from their own seeded generator.
type Program interface {
	Next(now uint64) (Op, error)
}

// ProgramInto is a Program that can also write its next operation into
// one the simulator holds, which the simulator then uses instead of Next:
// an Op is eleven words, and handing it back by value through a call or
// two costs more than most operations do once there.
type ProgramInto interface {
	Program
	// NextInto is Next writing the operation into op (every field: op
	// holds the previous one).
	NextInto(now uint64, op *Op) error
}

type hostState uint8

const (
	hostReady hostState = iota
	hostSync
	hostSleep
	hostGated
	hostStopped
)

// item is one operation queued on a stream: a copy, a kernel, or a burst
// of kernels launched together. A burst runs as one piece of work: its
// kernels' boundaries matter only to a preemption that must wait for the
// kernel in flight, and to counting the kernels done, and both are found
// from a cursor into durs that only moves forward, so a kernel costs
// about one addition, however the burst is scheduled.
type item struct {
	kind OpKind // OpKernel or OpCopy
	dir  trace.CopyDir
	n    uint32 // kernels in the item (1 for a single kernel or a copy)
	ki   uint32 // a burst's kernel in progress
	dur  uint64 // kernels: exclusive duration, summed; copy: modelled duration
	left uint64 // kernel work left (ns of exclusive time)
	// durs holds a burst's kernel durations, or, for one launched by its
	// total (Op.Burst), those asked for so far from lazy: of the kernels
	// from base on, the work of all kernels before base+len(durs) being
	// sum.
	durs []uint64
	base uint32
	kend uint64 // a burst's work at the end of kernel ki (0: not yet known)
	lazy Burst
	sum  uint64
	err  error // lazy answered with durations that do not fit the launch
}

// seek moves a burst's cursor to the kernel in progress: the first that
// has not ended.
func (it *item) seek() {
	done := it.dur - it.left
	if it.lazy != nil && it.kend <= done {
		it.skip(done)
	}
	if it.kend == 0 {
		it.kend = it.kernel(0)
	}
	for int(it.ki)+1 < int(it.n) && it.kend <= done {
		it.ki++
		it.kend += it.kernel(int(it.ki))
	}
}

// skip moves the cursor of a burst launched by its total, which is
// behind the kernel in progress at done, to where lazy can start drawing
// durations, if that is past those it has handed over.
func (it *item) skip(done uint64) {
	first, before := it.lazy.Start(done)
	if first == 0 || first < int(it.base)+len(it.durs) || (it.kend > 0 && first <= int(it.ki)+1) {
		return
	}
	// Each kernel lasts at least 1 ns: those before first took at least
	// first ns (and as long as the kernels known to end before them),
	// those from it on at least Count−first.
	least := uint64(first)
	if it.kend > 0 {
		least = it.kend + uint64(first-int(it.ki)-1)
	}
	if first >= int(it.n) || before > done || before < least || it.dur-before < uint64(int(it.n)-first) {
		it.err = fmt.Errorf("a burst of %d kernels summing to %v said kernel %d starts %v into it, which does not fit it (%v of its work done)",
			it.n, time.Duration(it.dur), first, time.Duration(before), time.Duration(done))
		it.lazy = nil
		it.fallback()
		return
	}
	it.base, it.durs, it.sum = uint32(first), nil, before
	it.ki = uint32(first)
	it.kend = before + it.kernel(first)
}

// kernel returns the duration of the burst's kernel i (i ≥ base), asking
// for more of them if it was launched by its total.
func (it *item) kernel(i int) uint64 {
	if i-int(it.base) >= len(it.durs) {
		it.more(i + 1)
	}
	return it.durs[i-int(it.base)]
}

// more asks a burst launched by its total for the durations of at least
// its kernels before n, from base, and checks them against the launch.
// Durations that do not fit are replaced by ones that do (the whole total
// in the first kernel), and err is set for the simulator to fail the run.
func (it *item) more(n int) {
	if it.lazy != nil {
		base := int(it.base)
		durs := it.lazy.Kernels(base, n-base)
		ok := len(durs) >= n-base && base+len(durs) <= int(it.n)
		sum := it.sum
		for i := len(it.durs); ok && i < len(durs); i++ {
			ok = durs[i] > 0
			sum += durs[i]
		}
		if left := uint64(int(it.n) - base - len(durs)); ok && (sum > it.dur || it.dur-sum < left || (left == 0 && sum != it.dur)) {
			ok = false
		}
		if ok {
			it.durs, it.sum = durs, sum
			return
		}
		from := ""
		if base > 0 {
			from = fmt.Sprintf(" from kernel %d on, with those before it,", base)
		}
		it.err = fmt.Errorf("a burst of %d kernels summing to %v gave durations that do not fit it (%d of them%s summing to %v, none may be zero)",
			it.n, time.Duration(it.dur), len(durs), from, time.Duration(sum))
		it.lazy = nil
	}
	it.fallback()
}

// fallback replaces a burst's durations that do not fit it by ones that
// do, for the rest of a run that has failed: the whole total in the first
// kernel.
func (it *item) fallback() {
	durs := make([]uint64, it.n)
	durs[0] = it.dur
	it.durs, it.base = durs, 0
}

// toKernelEnd is the work left in the kernel in flight.
func (it *item) toKernelEnd() uint64 {
	if it.n == 1 {
		return it.left
	}
	it.seek()
	return it.kend - (it.dur - it.left)
}

// atBoundary reports whether no kernel of the item is part way: none has
// started, or the last one to run has just ended.
func (it *item) atBoundary() bool {
	done := it.dur - it.left
	if done == 0 || it.left == 0 {
		return true
	}
	if it.n == 1 || (it.lazy != nil && it.kend <= done && !it.lazy.MayEnd(done)) {
		return false
	}
	it.seek()
	return it.kend-it.durs[it.ki-it.base] == done
}

// kernelsDone counts the item's kernels that have ended and their work.
func (it *item) kernelsDone() (n, work uint64) {
	switch {
	case it.left == 0:
		return uint64(it.n), it.dur
	case it.n == 1:
		return 0, 0
	}
	it.seek()
	return uint64(it.ki), it.kend - it.durs[it.ki-it.base]
}

// proc is a simulated process: host state, stream, channel group.
type proc struct {
	idx        int
	pid        uint32
	name       string
	class      Class
	gpu        int
	prog       Program
	into       ProgramInto // prog, if it is one
	op         Op          // the operation into writes
	timeslice  uint64
	interleave sched.Interleave

	q  []item
	qh int
	// kernelAt is set while the stream's head is a kernel: what runnable
	// asks of every group on a GPU at each decision, kept here so that it
	// does not read the head of streams it leaves alone.
	kernelAt bool
	// bit is the group's bit among its GPU's, entries those of its
	// runlist entries, rivals those of the groups that may take the
	// engine from it (gpu.masks).
	bit, entries, rivals uint64
	kernels              int // kernels queued on the stream (running one included)
	ops                  int // operations queued: kernels and copies
	// The head run is the kernels from the head of the stream up to its
	// first copy: the compute engine runs them back to back without a
	// decision in between unless something else happens, so it schedules
	// one event for the whole run. runLeft is the work left in it (ns of
	// exclusive time); copyAt is the index in q of the first copy at or
	// after the head, -1 if none is queued.
	runLeft uint64
	copyAt  int

	suspended bool
	gated     bool

	host      hostState
	src       int32 // event source of its host's wake-ups
	pending   Op
	hasPend   bool
	syncStart uint64
	syncEnd   bool
	inReq     bool
	arrival   uint64

	// The last copy's size and modelled duration, per copy engine
	// (copyDuration).
	copyBytes, copyDur [2]uint64

	// Spatial mode: co-running since coSince.
	coRunning bool
	coSince   uint64

	st  ProcStats
	lat hist.Histogram
}

func (p *proc) empty() bool { return p.qh == len(p.q) }

func (p *proc) head() *item { return &p.q[p.qh] }

// nextRun measures the head run after a copy left the head: each kernel
// is summed once, when the copy before it leaves, so keeping runLeft costs
// O(1) per operation.
func (p *proc) nextRun() {
	p.runLeft, p.copyAt = 0, -1
	for i := p.qh; i < len(p.q); i++ {
		if p.q[i].kind == OpCopy {
			p.copyAt = i
			return
		}
		p.runLeft += p.q[i].left
	}
}

// nextIsKernel reports whether the operation after the head is a kernel.
func (p *proc) nextIsKernel() bool {
	return p.qh+1 < len(p.q) && p.q[p.qh+1].kind == OpKernel
}

// runnable reports whether the channel group has a kernel ready for the
// compute engine.
func (p *proc) runnable() bool {
	return !p.suspended && p.kernelAt
}

// wakeAt schedules the host to run at t.
func (s *Simulator) wakeAt(p *proc, t uint64) {
	if s.soon == p {
		s.soon = nil // replaced, as its event would be
	}
	s.schedule(p.src, t)
}

// wakeSoon wakes p's host at now, after the current event: through the
// queue, or, where nothing could come between, directly at the end of
// the step (runSoon). The synchronization a stream's last operation
// ends is the commonest event after a kernel's end; this spares most of
// them the queue. Where a controller reads the run's events, it reads
// them between two steps that have some: runSoon goes through the queue
// if the step has output, as a step of its own would have had to.
func (s *Simulator) wakeSoon(p *proc, now uint64) {
	if s.soon != nil || s.q.pending(p.src) {
		s.wakeAt(p, now)
		return
	}
	// The bound on pending events, as schedule checks it.
	if len(s.q.events)+len(s.controls) >= s.cfg.maxEvents && !s.room() {
		return
	}
	s.soon, s.soonSeq = p, s.q.next()
}

// runSoon wakes the host wakeSoon left for the end of the step, directly
// if its event would be the next one taken (none pending is earlier, or
// at now and scheduled before it) and no observed event of the step waits
// to be read, else through the queue with the sequence number it took. A
// step with no output is not seen by the reader (Read steps on), nor is
// the read deadline passed at the same instant: the host's wake-up joins
// the step, and the reader sees the same events, in the same reads.
func (s *Simulator) runSoon() {
	p := s.soon
	s.soon = nil
	if s.err != nil {
		return // the run stops: the event would not be taken
	}
	if s.outHead < len(s.out) {
		s.q.set(p.src, s.now, s.soonSeq)
		return
	}
	if s.q.len() > 0 {
		if e := s.q.peek(); e.t < s.now || (e.t == s.now && e.seq < s.soonSeq) {
			s.q.set(p.src, s.now, s.soonSeq) // room was checked in wakeSoon
			return
		}
	}
	s.wakeHost(p, s.now)
}

// wakeHost resumes a blocked host if what it waits for has happened.
func (s *Simulator) wakeHost(p *proc, now uint64) {
	switch p.host {
	case hostSync:
		if !p.empty() {
			return
		}
		s.completeSync(p, now)
	case hostGated:
		if p.gated {
			return
		}
	case hostStopped:
		return
	}
	p.host = hostReady
	s.runHost(p, now)
}

// runHost executes host operations until the host blocks.
func (s *Simulator) runHost(p *proc, now uint64) {
	for n := 0; ; n++ {
		if n > maxInstantOps {
			s.fail(fmt.Errorf("process %s: program issued %d operations at %v without blocking", p.name, n, time.Duration(now)))
			return
		}
		var err error
		op := &p.op
		switch {
		case p.hasPend:
			p.op, p.hasPend = p.pending, false
		case p.into != nil:
			err = p.into.NextInto(now, op)
		default:
			p.op, err = p.prog.Next(now)
		}
		if err != nil {
			s.fail(fmt.Errorf("process %s at %v: %w", p.name, time.Duration(now), err))
			return
		}
		switch op.Kind {
		case OpKernel:
			// The item's fields are written into the stream in place: an
			// item built aside and copied in costs more than the rest.
			k, dur, lazy := uint32(1), op.Dur, Burst(nil)
			switch {
			case op.Durs != nil:
				k, dur = uint32(len(op.Durs)), 0
				for _, d := range op.Durs {
					if d == 0 {
						dur = 0
						break
					}
					dur += d
				}
				n += len(op.Durs)
			case op.Burst != nil:
				if op.Count == 0 {
					s.fail(fmt.Errorf("process %s at %v: a burst of no kernels", p.name, time.Duration(now)))
					return
				}
				if op.Count > 1 {
					k, lazy = op.Count, op.Burst
				}
				n += int(op.Count)
			}
			if dur == 0 {
				s.fail(fmt.Errorf("process %s at %v: zero-length kernel", p.name, time.Duration(now)))
				return
			}
			if p.gated {
				p.pending, p.hasPend, p.host = *op, true, hostGated
				return
			}
			s.emitLaunch(p, now, k)
			if it := s.push(p, k, now); it != nil {
				it.kind, it.n, it.dur, it.left, it.lazy = OpKernel, k, dur, dur, lazy
				if op.Durs != nil {
					it.durs, it.kend = op.Durs, op.Durs[0]
				}
				s.enqueued(p, now)
			}
		case OpCopy:
			d := op.Dur
			if d == 0 {
				d = p.copyDuration(copyEngine(op.Dir), op.Bytes, &s.cfg)
			}
			s.emitCopy(p, now, op)
			if q := s.push(p, 1, now); q != nil {
				q.kind, q.n, q.dur, q.dir = OpCopy, 1, d, op.Dir
				s.enqueued(p, now)
			}
		case OpSync, OpEnd:
			p.syncStart, p.syncEnd = now, op.Kind == OpEnd
			if op.Kind == OpEnd && !p.inReq {
				s.fail(fmt.Errorf("process %s at %v: request end without a begin", p.name, time.Duration(now)))
				return
			}
			if !p.empty() {
				p.host = hostSync
				return
			}
			s.completeSync(p, now)
		case OpSleep:
			p.host = hostSleep
			s.wakeAt(p, now+op.Dur)
			return
		case OpWaitUntil:
			if op.At > now {
				p.host = hostSleep
				s.wakeAt(p, op.At)
				return
			}
		case OpBegin:
			if op.At > now || p.inReq {
				s.fail(fmt.Errorf("process %s at %v: bad request begin (arrival %v, in request %v)",
					p.name, time.Duration(now), time.Duration(op.At), p.inReq))
				return
			}
			p.inReq, p.arrival = true, op.At
			p.st.RequestsBegun++
			if s.cfg.mode == ModeRequestPriority && p.class == ClassLC {
				s.gpus[p.gpu].claim(now)
			}
		case OpStop:
			p.host = hostStopped
			return
		default:
			s.fail(fmt.Errorf("process %s at %v: unknown operation %d", p.name, time.Duration(now), op.Kind))
			return
		}
		if s.err != nil {
			return
		}
	}
}

// copyDuration is the modelled duration of a copy of n bytes on copy
// engine e, as Options.CopyDuration computes it. A process's copies in
// each direction are mostly of one size (a request's input, its
// output): the last one's is kept per engine, which spares most copies
// the division.
func (p *proc) copyDuration(e int, n uint64, cfg *config) uint64 {
	if n != p.copyBytes[e] || p.copyDur[e] == 0 {
		p.copyBytes[e], p.copyDur[e] = n, cfg.copyLatency+uint64(float64(n)/cfg.copyBW*1e9)
	}
	return p.copyDur[e]
}

// checkBurst fails the run if p's burst it answered with durations that
// do not fit its launch (small enough to inline: it is asked at every
// preemption).
func (s *Simulator) checkBurst(p *proc, it *item) {
	if it.err != nil {
		s.burstFailed(p, it)
	}
}

// burstFailed fails the run with the error of p's burst it.
func (s *Simulator) burstFailed(p *proc, it *item) {
	s.fail(fmt.Errorf("process %s at %v: %w", p.name, time.Duration(s.now), it.err))
	it.err = nil
}

// completeSync finishes a synchronization (and the request it ends).
func (s *Simulator) completeSync(p *proc, now uint64) {
	p.st.Syncs++
	s.emitSync(p, p.syncStart, now)
	if p.syncEnd {
		p.lat.Record(now - p.arrival)
		p.st.Requests++
		p.inReq = false
		if s.cfg.mode == ModeRequestPriority && p.class == ClassLC {
			s.gpus[p.gpu].release(now)
		}
	}
}

// push appends a zero item to p's stream for the caller to write, then
// to hand to enqueued; nil (the run failed) past the bound on a stream's
// operations.
func (s *Simulator) push(p *proc, n uint32, now uint64) *item {
	if p.ops+int(n) > s.cfg.maxStreamOps {
		s.fail(fmt.Errorf("process %s at %v: %d operations queued on its stream (bound %d): the GPU cannot keep up with it",
			p.name, time.Duration(now), p.ops, s.cfg.maxStreamOps))
		return nil
	}
	p.q = append(p.q, item{})
	return &p.q[len(p.q)-1]
}

// enqueued accounts for the item push added to p's stream, written since,
// and hands it to its engine if it is the stream's head.
func (s *Simulator) enqueued(p *proc, now uint64) {
	it := &p.q[len(p.q)-1]
	wasEmpty := len(p.q)-1 == p.qh
	p.ops += int(it.n)
	if it.kind == OpKernel {
		p.kernels += int(it.n)
		p.st.KernelsSubmitted += uint64(it.n)
		if p.copyAt < 0 {
			p.runLeft += it.left
		}
	} else if p.copyAt < 0 {
		p.copyAt = len(p.q) - 1
	}
	if wasEmpty {
		p.kernelAt = it.kind == OpKernel
		s.gpus[p.gpu].setReady(p)
		s.startHead(p, now)
	}
}

// startHead hands the stream's first operation to its engine.
func (s *Simulator) startHead(p *proc, now uint64) {
	g := s.gpus[p.gpu]
	if p.head().kind == OpCopy {
		g.submitCopy(p, now)
		return
	}
	g.kick(p, now)
}

// popHead retires the stream's first operation and starts the next; a host
// waiting for the stream to drain is woken after the current event's
// bookkeeping (wakeSoon).
func (s *Simulator) popHead(p *proc, now uint64) {
	wasCopy := p.head().kind == OpCopy
	p.ops -= int(p.head().n)
	if !wasCopy {
		p.kernels -= int(p.head().n)
		p.runLeft -= p.head().left
	}
	p.q[p.qh] = item{}
	p.qh++
	if p.qh == len(p.q) {
		// Drained: the stream starts again at the front of its array,
		// which so stays in cache (streams drain at every
		// synchronization).
		p.q, p.qh = p.q[:0], 0
		p.kernelAt = false
		s.gpus[p.gpu].setReady(p)
		if wasCopy {
			p.nextRun()
		}
		if p.host == hostSync {
			s.wakeSoon(p, now)
		}
		return
	}
	// One that does not drain is moved to the front once its head is
	// past half of it.
	if p.qh > 256 && p.qh*2 > len(p.q) {
		n := copy(p.q, p.q[p.qh:])
		p.q = p.q[:n]
		if p.copyAt >= 0 {
			p.copyAt -= p.qh
		}
		p.qh = 0
	}
	p.kernelAt = p.head().kind == OpKernel
	s.gpus[p.gpu].setReady(p)
	if wasCopy {
		p.nextRun()
	}
	if p.head().kind == OpCopy {
		s.startHead(p, now)
	}
	// A kernel at the head is picked up by the GPU's own decision logic,
	// which called popHead.
}
