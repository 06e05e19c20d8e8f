package workload

import (
	"math/rand/v2"

	"github.com/gpu-arbiter/arbiter/sim"
)

// segment is a stretch of a key's draws as its program hands them to the
// simulator: a burst of kernels, which every run needs only in total
// unless a preemption falls inside it, or one draw (a single kernel, a
// host gap).
type segment struct {
	off, n int
	burst  bool
}

// seedFunc seeds a generator for a key's draws.
type seedFunc func(g *rand.PCG, key, check uint64)

// keyed gives one program the draws of its keys (the cycles of a BE
// workload, the requests of an LC one), shared with the comparison's
// other runs through a Draws when there is one (see Draws). A program
// loads a key, then asks for its segments in order.
type keyed struct {
	shape  []segment
	runs   []drawRun // the samplers of a key's draws, in order
	n      int       // draws per key
	seed   seedFunc
	pcg    rand.PCG
	rng    *rand.Rand  // draws from pcg
	st     *drawStream // nil: draws alone
	rd     *sumReader
	bursts []keyedBurst // per segment, for sim.Op.Burst

	key, check uint64
	// full holds the key's draws, nil while only its summary is at hand;
	// sum holds, per segment, a burst's total or the single draw (when
	// shared); part holds the key's first draws, drawn again (with the
	// runs close by) as far as the simulator asked for a burst's kernels.
	full, sum []uint64
	part      *partEntry
	buf       []uint64 // drawn alone
}

// burstChunk is how many more of a burst's kernels are drawn again at a
// time when the simulator asks for them (it asks one kernel further at a
// time as its cursor moves).
const burstChunk = 32

// newKeyed returns the draws of a program whose keys have the given
// shape, drawn from runs once seeded by seed, shared through st if not
// nil.
func newKeyed(shape []segment, runs []drawRun, seed seedFunc, st *drawStream) *keyed {
	k := &keyed{shape: shape, runs: runs, seed: seed, st: st}
	k.rng = rand.New(&k.pcg)
	for _, r := range runs {
		k.n += r.n
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
			k.buf = make([]uint64, 0, k.n)
		}
		k.seed(&k.pcg, key, check)
		k.full = drawTo(k.runs, k.rng, k.buf[:0], k.n)
		return
	}
	k.part = nil
	if e := k.st.full.get(key, check, k.n); e != nil {
		k.full, k.sum = e.vals, e.sum
		k.rd.pass(key)
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
	e := &drawEntry{key: k.key, check: k.check, sum: buf[k.n:]}
	k.seed(&k.pcg, k.key, k.check)
	e.vals = drawTo(k.runs, k.rng, buf[:0:k.n], k.n)
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

// drawTo extends vals, a key's first draws from runs with rng where they
// left it, to its first m draws (cap(vals) ≥ m).
func drawTo(runs []drawRun, rng *rand.Rand, vals []uint64, m int) []uint64 {
	off := 0
	for _, r := range runs {
		if i := len(vals); i < off+r.n && i < m {
			hi := min(off+r.n, m)
			vals = vals[:hi]
			r.s.drawInto(rng, vals[i:hi])
		}
		if off += r.n; off >= m {
			break
		}
	}
	return vals
}

// kernels writes the launch of burst segment i of the current key into
// op. A run that shares its draws launches every burst by its total (the
// simulator adds up nothing per kernel, and asks for the durations only
// as far as it needs them); one that draws alone hands the durations
// over.
func (k *keyed) kernels(i int, op *sim.Op) {
	s := k.shape[i]
	if k.st == nil {
		put(op, sim.OpKernel, 0, 0)
		op.Durs = k.full[s.off : s.off+s.n : s.off+s.n]
		return
	}
	put(op, sim.OpKernel, k.sum[i], 0)
	op.Count, op.Burst = uint32(s.n), &k.bursts[i]
}

// single returns single-draw segment i of the current key.
func (k *keyed) single(i int) uint64 {
	if k.st == nil {
		return k.full[k.shape[i].off]
	}
	return k.sum[i]
}

// keyedBurst is a burst segment of the current key, for the simulator to
// ask for its kernels' durations (sim.Burst). The simulator asks while
// the burst's kernels are queued, and programs synchronize before they
// load their next key, so the current key is still the burst's.
type keyedBurst struct {
	k   *keyed
	seg int
}

// Kernels implements sim.Burst: the burst's durations from the key's
// draws in full (this run's, or those of a run close by), else drawn
// again as far as asked, a chunk at a time, with the runs close by,
// which meet the same preemptions.
func (b *keyedBurst) Kernels(n int) []uint64 {
	k, s := b.k, b.k.shape[b.seg]
	if k.full == nil {
		if e := k.st.full.get(k.key, k.check, k.n); e != nil {
			k.full = e.vals
		}
	}
	if k.full != nil {
		return k.full[s.off : s.off+s.n : s.off+s.n]
	}
	if k.part == nil {
		k.part = k.st.parts.get(k.key, k.check, k.n, k.seed)
	}
	vals := k.part.upTo(s.off+n, s.off+s.n, k.runs)
	if len(vals) == k.n {
		// Drawn in full: the runs that load the key next need nothing more.
		k.full = vals
		k.st.full.put(&drawEntry{key: k.key, check: k.check, vals: vals, sum: k.sum})
	}
	end := min(len(vals), s.off+s.n)
	return vals[s.off:end:end]
}
