package workload

import (
	"github.com/gpu-arbiter/arbiter/sim"
)

// segment is a stretch of a key's draws as its program hands them to the
// simulator: a burst of kernels, which every run needs only in total
// unless a preemption falls inside it, or one draw (a single kernel, a
// host gap).
type segment struct {
	off, n int
	burst  bool

	// A long burst's marks (placeMarks sets them): one at every
	// every-th kernel after the first, marks of them, the first at mark0
	// among the key's marks. run is the drawRun that draws the burst.
	every, marks, mark0, run int

	// A burst's filter of its kernels' ends (placeFilters sets it):
	// 1<<fLog bits, from word fOff of the key's filters; fLog 0: none.
	fOff, fLog int
}

// markEvery is the fewest kernels between two marks of a burst, and
// markMost the most marks a key has: a preemption far into a burst
// launched by its total draws its kernels again from the mark before it,
// about max(markEvery, burst/(marks+1)) of them (and a few more, a chunk
// at a time), where it would draw all those before (and, before the
// first mark, still does, with the key's draws before the burst). Each
// mark costs 16 bytes of a key's summary, and a stream keeps up to
// sumMaxChunks·sumChunkKeys summaries (32 MiB of marks at most).
const (
	markEvery = 16
	markMost  = 8
)

// placeMarks sets the marks of shape's bursts, each drawn by the run of
// runs at its offset, the first bursts first while the key has marks
// left, and returns how many a key has.
func placeMarks(shape []segment, runs []drawRun) int {
	marks, off := 0, 0
	for r, run := range runs {
		for i := range shape {
			s := &shape[i]
			if left := markMost - marks; s.burst && s.off == off && s.n == run.n && s.n > markEvery && left > 0 {
				s.every = max(markEvery, (s.n+left)/(left+1))
				s.marks, s.mark0, s.run = (s.n-1)/s.every, marks, r
				marks += s.marks
			}
		}
		off += run.n
	}
	return marks
}

// filterBits is how many bits of a burst's filter each of its kernels
// ends gets, at least: one bit set per end, a bit clear for 7 in 8 of the
// works at which no kernel ends. filterMaxLog caps a filter at 4,096 bits
// (512 bytes a burst in every key's summary): a burst of more than 512
// kernels gets fewer bits per end, and more answers that a kernel may
// end where none does. filterMul hashes a work into the filter.
const (
	filterBits   = 8
	filterMaxLog = 12
	filterMul    = 0x9e3779b97f4a7c15
)

// placeFilters gives each burst of shape a filter of the work at which
// its kernels end (all but the last), so that a run that knows the burst
// only by its total can tell that a preemption falls part way through a
// kernel without drawing the kernels again, and returns the words of a
// key's filters. A filter has 1<<fLog bits, a power of two at least
// filterBits per end, 64 at least, 1<<filterMaxLog at most.
func placeFilters(shape []segment) int {
	words := 0
	for i := range shape {
		s := &shape[i]
		if !s.burst || s.n < 2 {
			continue
		}
		s.fLog = 6
		for 1<<s.fLog < filterBits*(s.n-1) && s.fLog < filterMaxLog {
			s.fLog++
		}
		s.fOff = words
		words += 1 << (s.fLog - 6)
	}
	return words
}

// filterBit is where the end of a kernel w ns of work into a burst goes
// in a filter of mask+1 words (a power of two): its word and its bit,
// from the high bits of a multiplicative hash (fixed shifts: cheaper than
// the top log2 bits of the filter).
func filterBit(w, mask uint64) (word int, bit uint64) {
	h := w * filterMul
	return int(h >> 32 & mask), 1 << (h >> 58)
}

// seedFunc seeds a generator for a key's draws.
type seedFunc func(g *gen, key, check uint64)

// keyed gives one program the draws of its keys (the cycles of a BE
// workload, the requests of an LC one), shared with the comparison's
// other runs through a Draws when there is one (see Draws). A program
// loads a key, then asks for its segments in order.
type keyed struct {
	shape  []segment
	runs   []drawRun // the samplers of a key's draws, in order
	n      int       // draws per key
	seed   seedFunc
	g      gen
	st     *drawStream // nil: draws alone
	rd     *sumReader
	bursts []keyedBurst // per segment, for sim.Op.Burst
	// markedBy holds, per run, the burst with marks it draws (nil if
	// none); marks is where draw places a key's marks.
	markedBy []*segment
	marks    []mark

	key, check uint64
	// full holds the key's draws, nil while only its summary is at hand;
	// sum holds, per segment, a burst's total or the single draw (when
	// shared), filt its bursts' filters (when shared: words of them,
	// after sum in the summary), and mark the marks of its bursts with
	// the summary; part holds the key's first draws, drawn again as far
	// as the simulator asked for a burst's kernels before its first mark
	// (valid while parted is set), and pg where they left the generator.
	full, sum, filt []uint64
	words           int
	mark            []mark
	part            []uint64
	parted          bool
	pg              gen
	// buf holds the key's draws where this run drew them, and then their
	// summary: a program synchronizes before it loads its next key, so
	// the simulator holds none of them by then.
	buf []uint64
}

// burstChunk is how many more of a burst's kernels are drawn again at a
// time when the simulator asks for them (it asks one kernel further at a
// time as its cursor moves).
const burstChunk = 32

// newKeyed returns the draws of a program whose keys have the given
// shape, its marks placed (placeMarks), drawn from runs once seeded by
// seed, shared through st, if not nil, whose summaries have room for as
// many marks.
func newKeyed(shape []segment, runs []drawRun, seed seedFunc, st *drawStream) *keyed {
	k := &keyed{shape: shape, runs: runs, seed: seed, st: st}
	for _, r := range runs {
		k.n += r.n
	}
	k.markedBy = make([]*segment, len(runs))
	for i := range shape {
		s := &shape[i]
		if s.marks > 0 {
			k.markedBy[s.run] = s
		}
		if s.fLog > 0 {
			k.words = max(k.words, s.fOff+1<<(s.fLog-6))
		}
	}
	k.bursts = make([]keyedBurst, len(shape))
	for i := range k.bursts {
		k.bursts[i] = keyedBurst{k: k, seg: i}
	}
	if st != nil {
		k.rd = st.sums.reader()
		k.marks = make([]mark, st.sums.marks)
	}
	return k
}

// load makes key (with check, a second identity: a request's seed) the
// current key: its summary where one is kept, else drawn here and its
// summary offered to the others.
func (k *keyed) load(key, check uint64) {
	k.key, k.check = key, check
	w := len(k.shape)
	if cap(k.buf) < k.n+w+k.words {
		k.buf = make([]uint64, k.n+w+k.words)
	}
	if k.st == nil {
		k.seed(&k.g, key, check)
		k.full = drawTo(k.runs, &k.g, k.buf[:0], k.n)
		return
	}
	k.parted = false
	sum, filt, mark := k.rd.get(key, check)
	if sum != nil {
		k.full, k.sum, k.filt, k.mark = nil, sum, filt, mark
		return
	}
	k.draw()
	k.rd.put(key, check, k.sum, k.filt, k.marks)
}

// draw draws the current key's values into buf, and their summary after
// them, and places its marks in k.marks.
func (k *keyed) draw() {
	w := len(k.shape)
	k.full, k.sum, k.filt = k.buf[:k.n:k.n], k.buf[k.n:k.n+w:k.n+w], k.buf[k.n+w:k.n+w+k.words]
	k.mark = nil
	clear(k.filt)
	k.seed(&k.g, k.key, k.check)
	k.drawMarked(k.full)
	for i := range k.shape {
		s := &k.shape[i]
		v := k.full[s.off]
		if s.burst {
			var filt []uint64
			if s.fLog > 0 {
				filt = k.filt[s.fOff : s.fOff+1<<(s.fLog-6)]
			}
			v = sumEnds(k.full[s.off:s.off+s.n], filt, s.fLog)
		}
		k.sum[i] = v
	}
}

// sumEnds returns the sum of a burst's durations, setting in filt, its
// filter of 1<<fLog bits (none if fLog is 0), the bit of the end of every
// kernel but the last (filterBit, written out for the loop).
func sumEnds(durs, filt []uint64, fLog int) uint64 {
	var v uint64
	if fLog == 0 {
		for _, d := range durs {
			v += d
		}
		return v
	}
	mask := uint64(len(filt) - 1) // a power of two, less one
	_ = filt[mask]                // and so every word is in bounds: no check in the loop
	for _, d := range durs[:len(durs)-1] {
		v += d
		h := v * filterMul
		filt[h>>32&mask] |= 1 << (h >> 58)
	}
	return v + durs[len(durs)-1]
}

// drawMarked draws the current key's values into vals (k.n of them),
// from k.g seeded for the key, and places its marks in k.marks.
func (k *keyed) drawMarked(vals []uint64) {
	off := 0
	for r, run := range k.runs {
		v := vals[off : off+run.n]
		off += run.n
		s := k.markedBy[r]
		if s == nil {
			run.s.drawInto(&k.g, v)
			continue
		}
		var before uint64
		for m, at := 0, 0; at < run.n; m++ {
			if m > 0 {
				k.marks[s.mark0+m-1] = mark{g: k.g, before: before}
			}
			next := min(at+s.every, run.n)
			run.s.drawInto(&k.g, v[at:next])
			for _, d := range v[at:next] {
				before += d
			}
			at = next
		}
	}
}

// drawTo extends vals, a key's first draws from runs with g where they
// left it, to its first m draws (cap(vals) ≥ m).
func drawTo(runs []drawRun, g *gen, vals []uint64, m int) []uint64 {
	off := 0
	for _, r := range runs {
		if i := len(vals); i < off+r.n && i < m {
			hi := min(off+r.n, m)
			vals = vals[:hi]
			r.s.drawInto(g, vals[i:hi])
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
	s := &k.shape[i]
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

	// The burst's kernels from mark kernel winFirst of key (winKey,
	// winCheck) on, drawn again from the mark's generator as far as
	// asked.
	win              []uint64
	winFirst         int
	winKey, winCheck uint64
	g                gen // where the window's draws left the generator
}

// windowChunk is how many more of a burst's kernels are drawn from a mark
// at a time when the simulator asks for them.
const windowChunk = 4

// Start implements sim.Burst: the latest mark at or before w ns of work
// into the burst, when only the key's summary is at hand.
func (b *keyedBurst) Start(w uint64) (first int, before uint64) {
	k, s := b.k, &b.k.shape[b.seg]
	if k.full != nil || k.mark == nil {
		return 0, 0
	}
	for j, m := range k.mark[s.mark0 : s.mark0+s.marks] {
		if m.before > w {
			break
		}
		first, before = (j+1)*s.every, m.before
	}
	return first, before
}

// Kernels implements sim.Burst: the burst's durations from the key's
// draws in full where this run drew them, else drawn again as far as
// asked: from a mark (Start), or from the key's first draw, a chunk at a
// time.
func (b *keyedBurst) Kernels(first, n int) []uint64 {
	k, s := b.k, &b.k.shape[b.seg]
	if k.full != nil {
		return k.full[s.off+first : s.off+s.n : s.off+s.n]
	}
	if first > 0 && k.mark != nil && s.every > 0 && first%s.every == 0 && first/s.every <= s.marks {
		return b.window(first, n)
	}
	vals := k.drawPart(s.off+first+n, s.off+s.n)
	if len(vals) == k.n {
		k.full = vals // drawn in full: nothing more to ask of the part
	}
	end := min(len(vals), s.off+s.n)
	return vals[s.off+first : end : end]
}

// drawPart returns the current key's first draws, drawn again, at least
// want of them (or as many as there are): a chunk past want at a time, up
// to limit (the end of the burst asked about). The slice returned is not
// changed later: more draws go past its end, in the same memory.
func (k *keyed) drawPart(want, limit int) []uint64 {
	if !k.parted {
		if cap(k.part) < k.n {
			k.part = make([]uint64, 0, k.n)
		}
		k.part = k.part[:0]
		k.seed(&k.pg, k.key, k.check)
		k.parted = true
	}
	if len(k.part) < want {
		m := min(max(want, len(k.part)+burstChunk), max(limit, want), k.n)
		k.part = drawTo(k.runs, &k.pg, k.part, m)
	}
	return k.part
}

// MayEnd implements sim.Burst from the key's filter of the burst's
// kernels' ends.
func (b *keyedBurst) MayEnd(w uint64) bool {
	k, s := b.k, &b.k.shape[b.seg]
	if s.fLog == 0 || k.filt == nil {
		return true
	}
	j, bit := filterBit(w, 1<<(s.fLog-6)-1)
	return k.filt[s.fOff+j]&bit != 0
}

// window returns the burst's kernels from mark kernel first on, at least
// n of them, drawn again from the mark. Asked from another mark or key,
// it draws into the same memory: the simulator has let go of what it
// returned before.
func (b *keyedBurst) window(first, n int) []uint64 {
	k, s := b.k, &b.k.shape[b.seg]
	if b.win == nil {
		b.win = make([]uint64, 0, s.n)
	}
	if first != b.winFirst || k.key != b.winKey || k.check != b.winCheck || len(b.win) == 0 {
		b.g = k.mark[s.mark0+first/s.every-1].g
		b.win = b.win[:0]
		b.winFirst, b.winKey, b.winCheck = first, k.key, k.check
	}
	if have := len(b.win); have < n {
		m := min(max(n, have+windowChunk), s.n-first)
		b.win = b.win[:m]
		k.runs[s.run].s.drawInto(&b.g, b.win[have:m])
	}
	return b.win
}
