package workload

import "github.com/gpu-arbiter/arbiter/sim"

// segment is a stretch of a key's draws as its program hands them to the
// simulator: a burst of kernels, which every run needs only in total
// unless a preemption falls inside it, or one draw (a single kernel, a
// host gap).
type segment struct {
	off, n int
	burst  bool
}

// keyed gives one program the draws of its keys (the cycles of a BE
// workload, the requests of an LC one), shared with the comparison's
// other runs through a Draws when there is one (see Draws). A program
// loads a key, then asks for its segments in order.
type keyed struct {
	shape  []segment
	n      int                                   // draws per key
	fill   func(key, check uint64, buf []uint64) // draws a key's values, in order
	st     *drawStream                           // nil: draws alone
	rd     *sumReader
	bursts []keyedBurst // per segment, for sim.Op.Burst

	key, check uint64
	// full holds the key's draws, nil while only its summary is at hand;
	// sum holds, per segment, a burst's total or the single draw (when
	// shared).
	full, sum []uint64
	buf       []uint64 // drawn alone
}

// newKeyed returns the draws of a program whose keys have the given
// shape, drawn by fill, shared through st if not nil.
func newKeyed(shape []segment, fill func(key, check uint64, buf []uint64), st *drawStream) *keyed {
	k := &keyed{shape: shape, fill: fill, st: st}
	for _, s := range shape {
		k.n = max(k.n, s.off+s.n)
	}
	k.bursts = make([]keyedBurst, len(shape))
	for i := range k.bursts {
		k.bursts[i] = keyedBurst{k: k, seg: i}
	}
	if st != nil {
		k.rd = st.sums.reader()
	}
	return k
}

// load makes key (with check, a second identity: a request's seed) the
// current key: its draws in full where some run drew them lately, else
// its summary where one is kept, else drawn here and offered to the
// others.
func (k *keyed) load(key, check uint64) {
	k.key, k.check = key, check
	if k.st == nil {
		if cap(k.buf) < k.n {
			k.buf = make([]uint64, k.n)
		}
		k.full = k.buf[:k.n]
		k.fill(key, check, k.full)
		return
	}
	if e := k.st.full.get(key, check, k.n); e != nil {
		k.full, k.sum = e.vals, e.sum
		return
	}
	if k.sum = k.rd.get(key, check); k.sum != nil {
		k.full = nil
		return
	}
	e := k.draw()
	k.full, k.sum = e.vals, e.sum
	k.rd.put(key, check, e.sum)
}

// draw draws the current key's values and summary, and keeps them for
// the runs close by.
func (k *keyed) draw() *drawEntry {
	w := len(k.shape)
	buf := make([]uint64, k.n+w)
	e := &drawEntry{key: k.key, check: k.check, vals: buf[:k.n:k.n], sum: buf[k.n:]}
	k.fill(k.key, k.check, e.vals)
	for i, s := range k.shape {
		v := e.vals[s.off]
		if s.burst {
			v = 0
			for _, d := range e.vals[s.off : s.off+s.n] {
				v += d
			}
		}
		e.sum[i] = v
	}
	k.st.full.put(e)
	return e
}

// kernels returns the launch of burst segment i of the current key. A
// run that shares its draws launches every burst by its total (the
// simulator adds up nothing per kernel, and asks for the durations only
// if it needs them); one that draws alone hands the durations over.
func (k *keyed) kernels(i int) sim.Op {
	s := k.shape[i]
	if k.st == nil {
		return sim.Op{Kind: sim.OpKernel, Durs: k.full[s.off : s.off+s.n : s.off+s.n]}
	}
	return sim.Op{Kind: sim.OpKernel, Dur: k.sum[i], Count: uint32(s.n), Burst: &k.bursts[i]}
}

// single returns single-draw segment i of the current key.
func (k *keyed) single(i int) uint64 {
	if k.st == nil {
		return k.full[k.shape[i].off]
	}
	return k.sum[i]
}

// details returns the current key's draws in full: from the runs close
// by, which meet the same preemptions, or drawn again (and kept for
// them).
func (k *keyed) details() []uint64 {
	if k.full != nil {
		return k.full
	}
	e := k.st.full.get(k.key, k.check, k.n)
	if e == nil {
		e = k.draw()
	}
	k.full = e.vals
	return k.full
}

// keyedBurst is a burst segment of the current key, for the simulator to
// ask for its durations (sim.Burst). The simulator asks while the burst's
// kernels are queued, and programs synchronize before they load their
// next key, so the current key is still the burst's.
type keyedBurst struct {
	k   *keyed
	seg int
}

// Kernels implements sim.Burst.
func (b *keyedBurst) Kernels() []uint64 {
	s := b.k.shape[b.seg]
	return b.k.details()[s.off : s.off+s.n : s.off+s.n]
}
