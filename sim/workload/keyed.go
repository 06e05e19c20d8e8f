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

// keyed gives one program the draws of its keys (the cycles of a BE
// workload, the requests of an LC one), shared with the comparison's
// other runs through a Draws when there is one (see Draws). A program
// loads a key, then asks for its segments in order.
type keyed struct {
	shape  []segment
	runs   []drawRun               // the samplers of a key's draws, in order
	n      int                     // draws per key
	seed   func(key, check uint64) // seeds svc for a key's draws
	svc    *rand.Rand
	st     *drawStream // nil: draws alone
	rd     *sumReader
	bursts []keyedBurst // per segment, for sim.Op.Burst

	key, check uint64
	// full holds the key's draws, nil while only its summary is at hand;
	// sum holds, per segment, a burst's total or the single draw (when
	// shared); part holds the key's first draws, drawn again as far as
	// the simulator asked for a burst's kernels.
	full, sum, part []uint64
	buf             []uint64 // drawn alone
}

// burstChunk is how many more of a burst's kernels are drawn again at a
// time when the simulator asks for them (it asks one kernel further at a
// time as its cursor moves).
const burstChunk = 32

// newKeyed returns the draws of a program whose keys have the given
// shape, drawn from runs by svc once seeded by seed, shared through st if
// not nil.
func newKeyed(shape []segment, runs []drawRun, svc *rand.Rand, seed func(key, check uint64), st *drawStream) *keyed {
	k := &keyed{shape: shape, runs: runs, svc: svc, seed: seed, st: st}
	for _, r := range runs {
		k.n += r.n
	}
	k.bursts = make([]keyedBurst, len(shape))
	for i := range k.bursts {
		k.bursts[i] = keyedBurst{k: k, seg: i}
	}
	if st != nil {
		k.rd = st.sums.reader()
		k.part = make([]uint64, 0, k.n)
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
		k.seed(key, check)
		k.full = k.drawTo(k.buf[:0], k.n)
		return
	}
	k.part = k.part[:0]
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
	e := &drawEntry{key: k.key, check: k.check, sum: buf[k.n:]}
	k.seed(k.key, k.check)
	e.vals = k.drawTo(buf[:0:k.n], k.n)
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

// drawTo extends vals, the current key's first draws with the generator
// where they left it, to its first m draws (cap(vals) ≥ m).
func (k *keyed) drawTo(vals []uint64, m int) []uint64 {
	off := 0
	for _, r := range k.runs {
		if i := len(vals); i < off+r.n && i < m {
			hi := min(off+r.n, m)
			vals = vals[:hi]
			r.s.drawInto(k.svc, vals[i:hi])
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
		*op = sim.Op{Kind: sim.OpKernel, Durs: k.full[s.off : s.off+s.n : s.off+s.n]}
		return
	}
	*op = sim.Op{Kind: sim.OpKernel, Dur: k.sum[i], Count: uint32(s.n), Burst: &k.bursts[i]}
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
// draws in full (this run's, or those of a run close by, which meets the
// same preemptions), else drawn again as far as asked, a chunk at a time.
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
	if want := s.off + n; len(k.part) < want {
		if len(k.part) == 0 {
			k.seed(k.key, k.check)
		}
		k.part = k.drawTo(k.part, min(max(want, len(k.part)+burstChunk), s.off+s.n))
	}
	end := min(len(k.part), s.off+s.n)
	return k.part[s.off:end:end]
}
