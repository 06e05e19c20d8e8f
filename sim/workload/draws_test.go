package workload

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/sim"
)

// TestSharedDraws: programs that share their draws through a Draws issue
// exactly the operations of programs that draw alone, to the
// nanosecond, whichever draws first, for LC requests (several long
// bursts, kernels synchronized one by one between them) and BE cycles (a
// burst longer than the first room of its draws again): the program that
// reads them, close behind the first or far, reads their summaries and
// launches bursts by their totals, whose kernels it draws again from
// their marks, or from their first, as far as asked.
func TestSharedDraws(t *testing.T) {
	spec := `
gpus: 1
lc:
  - name: a
    gpu: 0
    arrival: {process: poisson, rate: 5000}
    request:
      - kernel: {count: 7, duration: {dist: lognormal, mean: 40us, cv: 0.5}}
      - host: {duration: {dist: exp, mean: 20us}}
      - kernel: {count: 40, duration: {dist: lognormal, mean: 20us, cv: 0.8}}
      - kernel: {count: 3, duration: {dist: uniform, min: 10us, max: 30us}, sync_each: true}
      - kernel: {count: 30, duration: {dist: exp, mean: 25us}}
be:
  - {name: b, gpu: 0, kernel: {dist: lognormal, mean: 1ms, cv: 0.2}, sync_every: 100, host_gap: {dist: exp, mean: 1ms}}
`
	ws := specWorkloads(t, spec, "s.yaml")
	// ops runs a program for n operations (or to its end), listing them;
	// bursts counts the bursts launched by their totals, summarized those
	// of them launched from a summary alone, marked the kernels asked for
	// from a mark.
	bursts, summarized, marked := 0, 0, 0
	between, falseEnds := 0, 0
	ops := func(p sim.Program, n int) string {
		var b strings.Builder
		now := uint64(0)
		for range n {
			op, err := p.Next(now)
			if err != nil {
				t.Fatal(err)
			}
			kb, ok := op.Burst.(*keyedBurst)
			if ok {
				bursts++
			}
			if ok && kb.k.full == nil {
				// Asked for a few kernels first, as a preemption asks, a
				// burst launched from its summary draws only those again,
				// and they begin what it gives when asked for all.
				summarized++
				// Asked where to start for a preemption w ns into it, it
				// offers a mark at or before w (or its first kernel), and
				// the kernels from there.
				type window struct {
					w, before uint64
					first     int
					durs      []uint64
				}
				var windows []window
				prev := -1
				// Ending where it began, it is next asked from the mark
				// it was last asked from, in another key.
				for _, w := range []uint64{op.Dur - 1, op.Dur / 2, op.Dur / 3, 0, op.Dur - 1} {
					first, before := op.Burst.Start(w)
					if first == 0 {
						if before != 0 {
							t.Fatalf("at %d ns: from the first kernel, %d ns before it", w, before)
						}
						continue
					}
					marked++
					// From a mark not asked from before, it draws a chunk.
					if one := op.Burst.Kernels(first, 1); len(one) < 1 || len(one) > int(op.Count)-first || first != prev && len(one) > windowChunk {
						t.Fatalf("asked for 1 of %d kernels from kernel %d, got %d", op.Count, first, len(one))
					}
					prev = first
					windows = append(windows, window{w, before, first, slices.Clone(op.Burst.Kernels(first, int(op.Count)-first))})
				}
				first := slices.Clone(op.Burst.Kernels(0, 1))
				if len(first) < 1 || len(first) > int(op.Count) || len(first) == int(op.Count) && op.Count > burstChunk {
					t.Fatalf("asked for 1 of %d kernels, got %d", op.Count, len(first))
				}
				all := op.Burst.Kernels(0, int(op.Count))
				if !slices.Equal(first, all[:len(first)]) {
					t.Fatalf("asked for 1 kernel, got %v; asked for all, got %v", first, all)
				}
				for _, win := range windows {
					var before uint64
					for _, d := range all[:win.first] {
						before += d
					}
					if before != win.before || before > win.w || !slices.Equal(win.durs, all[win.first:]) {
						t.Fatalf("at %d ns: from kernel %d, %d ns before it, got %v; want %d ns before it (at most %d) and %v",
							win.w, win.first, win.before, win.durs, before, win.w, all[win.first:])
					}
				}
			}
			if op.Kind == sim.OpWaitUntil {
				now = op.At
			}
			// A burst handed over whole or by its total: its durations.
			dur, durs := op.Dur, op.Durs
			if op.Burst != nil {
				durs = op.Burst.Kernels(0, int(op.Count))
			}
			if ok {
				// It says a kernel may end wherever one does, and no
				// kernel ends at most of the works between.
				var ends []uint64
				var at uint64
				for _, d := range durs[:len(durs)-1] {
					at += d
					ends = append(ends, at)
				}
				for j, at := range ends {
					if !op.Burst.MayEnd(at) {
						t.Fatalf("burst of %d kernels: MayEnd(%d) false where kernel %d ends", len(durs), at, j)
					}
					for _, w := range []uint64{at - 1, at + 1, at - durs[j]/2} {
						if w > 0 && w < op.Dur && !slices.Contains(ends, w) {
							between++
							if op.Burst.MayEnd(w) {
								falseEnds++
							}
						}
					}
				}
			}
			if durs != nil {
				dur = 0
			}
			fmt.Fprintf(&b, "%s:%d:%d:%v ", opName(op), dur, op.At, durs)
			if op.Kind == sim.OpStop {
				break
			}
		}
		return b.String()
	}
	horizon := uint64(time.Second)
	for _, n := range []int{4000, 80000} {
		alone := []string{ops(Programs(ws, 3, horizon, nil)[0], n), ops(Programs(ws, 3, horizon, nil)[1], n)}
		d := NewDraws()
		first, second := Programs(ws, 3, horizon, d), Programs(ws, 3, horizon, d)
		total, reading := 0, 0
		for i := range ws {
			bursts, summarized, marked = 0, 0, 0
			a := ops(first[i], n)
			if a != alone[i] {
				t.Errorf("%s, %d ops: shared draws change the program that draws first", ws[i].Name, n)
			}
			if summarized != 0 {
				t.Errorf("%s, %d ops: the program that draws first launched %d bursts from summaries, want none", ws[i].Name, n, summarized)
			}
			bursts, summarized = 0, 0
			if b := ops(second[i], n); b != alone[i] {
				t.Errorf("%s, %d ops: shared draws change the program that reads them", ws[i].Name, n)
			}
			if bursts == 0 || summarized != bursts {
				t.Errorf("%s, %d ops: the program that reads the draws launched %d of its %d bursts from summaries, want all", ws[i].Name, n, summarized, bursts)
			}
			total += summarized
			reading += marked
		}
		t.Logf("%d ops: %d bursts launched from summaries, %d drawn again from a mark; MayEnd true at %d of %d works where no kernel ends",
			n, total, reading, falseEnds, between)
		if between == 0 || falseEnds > between/5 {
			t.Errorf("%d ops: MayEnd true at %d of %d works where no kernel ends, want at most a fifth", n, falseEnds, between)
		}
		between, falseEnds = 0, 0
		if reading < total/4 {
			t.Errorf("%d ops: %d of %d bursts launched from summaries drawn again from a mark, want most of the BE ones", n, reading, total)
		}
	}
}

// TestSummariesFreedBehindCloseReads: a run that reads the summaries
// close behind the run that draws them lets go of those both have
// passed.
func TestSummariesFreedBehindCloseReads(t *testing.T) {
	ws := specWorkloads(t, `
gpus: 1
be:
  - {name: b, gpu: 0, kernel: {dist: lognormal, mean: 1ms, cv: 0.2}, sync_every: 3}
`, "s.yaml")
	d := NewDraws()
	first, second := Programs(ws, 1, uint64(time.Hour), d)[0], Programs(ws, 1, uint64(time.Hour), d)[0]
	var op sim.Op
	var err error
	for range 5 * sumChunkKeys {
		for _, p := range []sim.Program{first, second} {
			// A cycle: its kernels, a sync.
			for range 2 {
				if op, err = p.Next(0); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if op.Kind != sim.OpSync {
		t.Fatalf("out of step: %v", op.Kind)
	}
	var tb *sumTable
	for _, st := range d.streams {
		tb = &st.sums
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if len(tb.chunks) > 1 {
		t.Errorf("%d chunks of summaries kept after both runs passed %d keys, want 1", len(tb.chunks), 5*sumChunkKeys)
	}
}

// TestSumTableFrees: a summary table keeps what the slowest reader still
// needs, frees what every reader has passed, and never holds more than
// sumMaxChunks chunks.
func TestSumTableFrees(t *testing.T) {
	tb := &sumTable{}
	tb.init(1, 1, 1)
	fast, slow := tb.reader(), tb.reader()
	put := func(r *sumReader, key uint64) {
		r.put(key, key, []uint64{key * 10}, []uint64{key * 3}, []mark{{before: key}})
	}
	for key := range uint64(10 * sumChunkKeys) {
		put(fast, key)
	}
	if len(tb.chunks) != 10 {
		t.Fatalf("%d chunks kept with a reader at the start, want 10", len(tb.chunks))
	}
	if v, f, m := slow.get(5, 5); len(v) != 1 || v[0] != 50 || len(f) != 1 || f[0] != 15 || len(m) != 1 || m[0].before != 5 {
		t.Fatalf("slow reader got %v, filters %v and marks %v for key 5, want [50], [15] and a mark 5 ns in", v, f, m)
	}
	if v, _, _ := slow.get(5, 6); v != nil {
		t.Fatalf("slow reader got %v for key 5 with another check, want nothing", v)
	}
	slow.get(3*sumChunkKeys, 3*sumChunkKeys)
	if _, ok := tb.chunks[2]; ok || len(tb.chunks) != 7 {
		t.Errorf("after the slow reader moved to chunk 3: %d chunks kept, chunk 2 kept %v; want 7, false", len(tb.chunks), ok)
	}
	for key := uint64(10 * sumChunkKeys); key < (sumMaxChunks+20)*sumChunkKeys; key++ {
		put(fast, key)
	}
	if len(tb.chunks) > sumMaxChunks {
		t.Errorf("%d chunks kept, want at most %d", len(tb.chunks), sumMaxChunks)
	}
	if _, ok := tb.chunks[3]; ok {
		t.Errorf("the slow reader's chunk, past the bound, is still kept")
	}
	if v, _, _ := slow.get(3*sumChunkKeys+1, 3*sumChunkKeys+1); len(v) != 1 || v[0] != (3*sumChunkKeys+1)*10 {
		t.Errorf("the slow reader lost the chunk it reads from: %v", v)
	}
	if v, _, _ := fast.get((sumMaxChunks+20)*sumChunkKeys-1, (sumMaxChunks+20)*sumChunkKeys-1); v == nil {
		t.Errorf("the newest key is not kept")
	}
}

// TestSumTableLayout: a slot keeps its filters inline where they fit in a
// cache line with it, or where it is longer than one anyway, and apart
// where they are what makes it longer; either way every key reads back
// its own values, filters and marks.
func TestSumTableLayout(t *testing.T) {
	for _, c := range []struct {
		width, words int
		inline       bool
	}{{1, 1, true}, {2, 4, true}, {1, 8, false}, {6, 1, false}, {7, 8, true}} {
		tb := &sumTable{}
		tb.init(c.width, c.words, 2)
		if tb.inline != c.inline {
			t.Errorf("width %d, %d words of filters: inline %v, want %v", c.width, c.words, tb.inline, c.inline)
		}
		w, r := tb.reader(), tb.reader()
		val := func(key uint64, n, salt int) []uint64 {
			v := make([]uint64, n)
			for i := range v {
				v[i] = key*1000 + uint64(salt*100+i)
			}
			return v
		}
		const keys = 3 * sumChunkKeys / 2
		for key := range uint64(keys) {
			w.put(key, key+7, val(key, c.width, 1), val(key, c.words, 2), []mark{{before: key}, {before: key + 1}})
		}
		for key := range uint64(keys) {
			sum, filt, marks := r.get(key, key+7)
			if !slices.Equal(sum, val(key, c.width, 1)) || !slices.Equal(filt, val(key, c.words, 2)) ||
				len(marks) != 2 || marks[0].before != key || marks[1].before != key+1 {
				t.Fatalf("width %d, %d words of filters, key %d: got %v, filters %v, marks %v", c.width, c.words, key, sum, filt, marks)
			}
		}
	}
}

// TestPlaceFilters: each burst of more than one kernel gets a filter of a
// power of two bits, at least filterBits per end but the last and at
// least one word, at most 1<<filterMaxLog, laid one after the other.
func TestPlaceFilters(t *testing.T) {
	shape := []segment{
		{n: 1, burst: false}, {n: 1, burst: true}, {n: 2, burst: true}, {n: 9, burst: true},
		{n: 10, burst: true}, {n: 300, burst: true}, {n: 100000, burst: true}, {n: 1},
	}
	wantLog := []int{0, 0, 6, 6, 7, 12, 12, 0}
	words := placeFilters(shape)
	off := 0
	for i, s := range shape {
		if s.fLog != wantLog[i] {
			t.Errorf("segment %d (%d kernels): filter of 2^%d bits, want 2^%d", i, s.n, s.fLog, wantLog[i])
		}
		if s.fLog == 0 {
			continue
		}
		if s.fOff != off {
			t.Errorf("segment %d: filter at word %d, want %d", i, s.fOff, off)
		}
		off += 1 << (s.fLog - 6)
	}
	if words != off {
		t.Errorf("%d words of filters, want %d", words, off)
	}
}

// TestPlaceMarks: a key's bursts get marks in order while it has any
// left, markEvery kernels apart at least, each inside its burst, and
// short bursts and single draws none; a burst's run is the one that
// draws it, also after a run of kernels synchronized one by one.
func TestPlaceMarks(t *testing.T) {
	for _, c := range []struct {
		bursts []int // kernels per burst; 1: a single draw; -n: n single draws of one run
		want   []int // marks per segment
	}{
		{[]int{16}, []int{0}},
		{[]int{17}, []int{1}},
		{[]int{40, 1}, []int{2, 0}},
		{[]int{160, 1}, []int{8, 0}},
		{[]int{300}, []int{8}},
		{[]int{30, 1, 10}, []int{1, 0, 0}},
		{[]int{120, 1, 120, 120}, []int{7, 0, 1, 0}},
		{[]int{-3, 40, -2, 17}, []int{0, 0, 0, 2, 0, 0, 1}},
	} {
		var shape []segment
		var runs []drawRun
		var runOf []int // per segment
		off := 0
		for _, n := range c.bursts {
			if n < 0 {
				for i := range -n {
					shape = append(shape, segment{off: off + i, n: 1})
					runOf = append(runOf, len(runs))
				}
				runs = append(runs, drawRun{n: -n})
				off += -n
				continue
			}
			shape = append(shape, segment{off: off, n: n, burst: n > 1})
			runOf = append(runOf, len(runs))
			runs = append(runs, drawRun{n: n})
			off += n
		}
		total := placeMarks(shape, runs)
		var got []int
		next := 0
		for i, s := range shape {
			got = append(got, s.marks)
			if s.marks == 0 {
				continue
			}
			if s.every < markEvery || s.marks*s.every >= s.n || s.mark0 != next || s.run != runOf[i] {
				t.Errorf("%v: segment %d: %+v", c.bursts, i, s)
			}
			next += s.marks
		}
		if !slices.Equal(got, c.want) || total != next || total > markMost {
			t.Errorf("%v: marks %v (%d in all), want %v", c.bursts, got, total, c.want)
		}
	}
}
