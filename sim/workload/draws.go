package workload

import (
	"sync"
	"sync/atomic"
)

// Draws lets the simulations of one comparison share the service times
// they draw. Every baseline serves the same requests with the same
// kernels: the k-th request of an LC workload has the same seed in every
// run, and so the same service times, and so has the k-th cycle of a BE
// workload. Drawing them (a table lookup per log-normal kernel, see
// logNormalTable) is still a large part of a run, so the first simulation
// to need a key (a request, a cycle) draws it and the others read what
// they need of it.
//
// What every run needs of a key is its summary: the total of each burst
// of kernels, and each single draw, with, per burst, a filter of the work
// at which its kernels end (see placeFilters) and its marks. The first
// run to draw a key keeps it in a table, until every run reading the
// stream has passed it, and the others hand its bursts to the simulator
// by their totals (sim.Op.Burst), whether they are close behind or far
// (a BE workload's cycles drift apart from one baseline to the next by a
// quarter and more where LC takes the GPU). A preemption in the middle
// of a burst asks whether it falls between two kernels, which the filter
// nearly always answers (sim.Burst.MayEnd); only if the simulator needs
// the kernels one by one (the filter cannot say, or the preemption waits
// for the kernel in flight) are they drawn again, as far as it needs
// them: from the nearest mark before the kernel in flight, where the
// summary keeps the generator and the work before it, or, before the
// first mark, from the key's first draw, by each run for itself. Neither the draws in full nor those drawn again are kept:
// a run drawing a few kernels again costs less than the memory, the
// reads and the locks of sharing them (see docs/benchmarks.md). A
// simulation that finds no summary (it lags too far, or ran alone) draws
// the key itself: the values are the same either way, so sharing changes
// no result, only the work. Safe for concurrent use; use NewDraws. One
// Draws serves one seed.
type Draws struct {
	mu      sync.Mutex
	streams map[streamKey]*drawStream
}

// streamKey names a stream of draws: its workload and the width of its
// summaries, filters and marks (fixed by the workload's spec).
type streamKey struct {
	id                  uint64
	width, words, marks int
}

// drawStream is one workload's draws: the summaries of the keys some run
// still has to read.
type drawStream struct {
	sums sumTable
}

// NewDraws returns an empty cache.
func NewDraws() *Draws { return &Draws{streams: map[streamKey]*drawStream{}} }

// stream returns the stream id with summaries of width values, words
// words of filters and marks marks per key (nil for a nil *Draws).
func (d *Draws) stream(id uint64, width, words, marks int) *drawStream {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	k := streamKey{id, width, words, marks}
	st := d.streams[k]
	if st == nil {
		st = &drawStream{}
		st.sums.init(width, words, marks)
		d.streams[k] = st
	}
	return st
}

// sumChunkKeys is how many consecutive keys a chunk of a summary table
// holds.
const sumChunkKeys = 4096

// sumMaxChunks bounds a summary table, so that memory does not grow with
// simulated time: runs that fall further behind the first than this many
// keys draw for themselves. An hour of the published reproductions' BE
// cycles puts about 120,000 between the fastest and the slowest run.
const sumMaxChunks = 64

// sumTable keeps the summaries of one stream, in chunks of consecutive
// keys, until every run reading the stream has passed them.
type sumTable struct {
	width, words, marks int
	// A slot holds its key's filters too (inline) unless they are what
	// makes it longer than a cache line: then the filters are kept apart,
	// and a run reading keys in order finds a slot's state, check and
	// values in one line, often with the next key's. Inline, the line a
	// run reads the summary from also answers a preemption part way
	// through a burst. row is a slot's words, apart its filters' (0 if
	// inline).
	inline     bool
	row, apart int

	mu      sync.Mutex
	chunks  map[uint64]*sumChunk // by key / sumChunkKeys
	readers []*sumReader
	// spare holds chunks every reader had passed, to be used again: a
	// table keeps only a window of a stream's keys, and an hour of one
	// draws thousands of chunks.
	spare []*sumChunk
}

// sumLine is the words of a cache line.
const sumLine = 8

// init makes t an empty table of summaries of width values, words words
// of filters and marks marks per key.
func (t *sumTable) init(width, words, marks int) {
	t.width, t.words, t.marks, t.chunks = width, words, marks, map[uint64]*sumChunk{}
	t.inline = sumHead+width+words <= sumLine || sumHead+width > sumLine
	t.row, t.apart = sumHead+width, words
	if t.inline {
		t.row, t.apart = sumHead+width+words, 0
	}
}

// sumChunk holds the summaries of sumChunkKeys consecutive keys. A slot
// is written once, by the first run to draw its key; others read it once
// its state says written. The state leads the slot, so that a reader
// finds it in the cache line it reads the summary from (most often
// written on the other core). The marks, and the filters where they
// would make a slot longer than a line (sumTable.inline), which only a
// preemption part way through a burst reads, are kept apart.
type sumChunk struct {
	vals  []uint64 // per key: its state (atomic), its check, width values, and its filters if inline
	filt  []uint64 // per key: its filters, if not inline
	marks []mark   // per key: its marks
}

// sumHead is how many words lead a slot's values: its state and check.
const sumHead = 2

// mark is where a key's generator was at a kernel part way through a
// burst (keyed.draw places them), and the work of the burst's kernels
// before it: the burst's kernels from there on can be drawn again
// without those before.
type mark struct {
	g      gen
	before uint64
}

const (
	slotEmpty uint64 = iota
	slotWriting
	slotWritten
)

// sumReader is one program's access to a summary table. Each program
// reads its keys in increasing order; the table frees the chunks that
// every reader has left.
type sumReader struct {
	t  *sumTable
	at uint64    // the chunk number it reads
	c  *sumChunk // that chunk, nil if the table has none
}

// reader registers a new reader at the start of the table.
func (t *sumTable) reader() *sumReader {
	r := &sumReader{t: t}
	t.mu.Lock()
	t.readers = append(t.readers, r)
	r.c = t.chunks[0]
	t.mu.Unlock()
	return r
}

// chunk returns the chunk of key, making it if create is set (nil if it
// is not kept and create is not set). Moving to another chunk frees those
// no reader needs any more.
func (r *sumReader) chunk(key uint64, create bool) *sumChunk {
	n := key / sumChunkKeys
	if n == r.at && r.c != nil {
		return r.c
	}
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.chunks[n]
	if c == nil && create {
		c = t.newChunk()
		t.chunks[n] = c
	}
	r.c = c
	if n != r.at {
		r.at = n
		t.free()
	}
	return c
}

// free drops the chunks every reader has passed, and the oldest ones past
// sumMaxChunks; the caller holds mu.
func (t *sumTable) free() {
	low := t.readers[0].at
	for _, r := range t.readers[1:] {
		low = min(low, r.at)
	}
	for n, c := range t.chunks {
		if n < low {
			// No reader holds it (each holds the chunk it reads, at
			// or past low), nor will again: keys are read in order.
			delete(t.chunks, n)
			t.spare = append(t.spare, c)
		}
	}
	for len(t.chunks) > sumMaxChunks {
		oldest := ^uint64(0)
		for n := range t.chunks {
			oldest = min(oldest, n)
		}
		delete(t.chunks, oldest)
	}
}

// newChunk returns an empty chunk, a spare one if there is one; the
// caller holds mu. Only the slots' states are cleared: a slot's values
// are read once its state says they were written.
func (t *sumTable) newChunk() *sumChunk {
	if n := len(t.spare); n > 0 {
		c := t.spare[n-1]
		t.spare = t.spare[:n-1]
		w := t.row
		for i := range sumChunkKeys {
			atomic.StoreUint64(&c.vals[i*w], slotEmpty)
		}
		return c
	}
	return &sumChunk{vals: make([]uint64, sumChunkKeys*t.row), filt: make([]uint64, sumChunkKeys*t.apart),
		marks: make([]mark, sumChunkKeys*t.marks)}
}

// get returns the summary (width values), the filters and the marks of
// key if kept (nil if not). The slices returned must not be modified.
func (r *sumReader) get(key, check uint64) ([]uint64, []uint64, []mark) {
	c := r.chunk(key, false)
	if c == nil {
		return nil, nil, nil
	}
	t := r.t
	i := int(key % sumChunkKeys)
	v := c.vals[i*t.row : (i+1)*t.row : (i+1)*t.row]
	if atomic.LoadUint64(&v[0]) != slotWritten || v[1] != check {
		return nil, nil, nil
	}
	sum, filt := v[sumHead:sumHead+t.width:sumHead+t.width], v[sumHead+t.width:]
	if !t.inline {
		filt = c.filt[i*t.apart : (i+1)*t.apart : (i+1)*t.apart]
	}
	return sum, filt, c.marks[i*t.marks : (i+1)*t.marks : (i+1)*t.marks]
}

// put keeps sum, filt and marks as the summary of key, unless another run
// got there first (with the same values: they are drawn from the same
// seed).
func (r *sumReader) put(key, check uint64, sum, filt []uint64, marks []mark) {
	c := r.chunk(key, true)
	t := r.t
	i := int(key % sumChunkKeys)
	v := c.vals[i*t.row : (i+1)*t.row]
	if !atomic.CompareAndSwapUint64(&v[0], slotEmpty, slotWriting) {
		return
	}
	v[1] = check
	copy(v[sumHead:], sum)
	if t.inline {
		copy(v[sumHead+t.width:], filt)
	} else {
		copy(c.filt[i*t.apart:(i+1)*t.apart], filt)
	}
	copy(c.marks[i*t.marks:(i+1)*t.marks], marks)
	atomic.StoreUint64(&v[0], slotWritten)
}

// streamID names a workload's stream of draws: its name and its kind.
func streamID(name string, be bool) uint64 {
	id := nameHash(name)
	if be {
		id = ^id
	}
	return id
}
