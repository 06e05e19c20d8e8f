package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
)

// lazyBurst hands over a burst's durations only when asked (Op.Burst),
// all of them or, if exact, as many as asked for, counting the times it
// was asked and checking that each asks for more than the last from the
// same kernel, and only from kernels it offered. With every set, it
// offers to start from every every-th kernel (Burst.Start); with ends
// set, MayEnd answers from it (else always true).
type lazyBurst struct {
	durs   []uint64
	exact  bool
	every  int
	ends   func(w uint64) bool
	mayEnd int // calls to MayEnd
	asked  int
	skips  int // answers to Start past the first kernel
	first  int
	last   int
	shrank bool
	bad    bool // asked from a kernel it did not offer
}

func (b *lazyBurst) Start(w uint64) (int, uint64) {
	if b.every == 0 {
		return 0, 0
	}
	first, before := 0, uint64(0)
	for i, d := range b.durs {
		if i%b.every == 0 && before <= w {
			first = i
		}
		before += d
	}
	before = 0
	for _, d := range b.durs[:first] {
		before += d
	}
	if first > 0 {
		b.skips++
	}
	return first, before
}

func (b *lazyBurst) MayEnd(w uint64) bool {
	b.mayEnd++
	return b.ends == nil || b.ends(w)
}

// endsOf returns a MayEnd answering exactly for durs: true at the work
// at which one of them ends.
func endsOf(durs []uint64) func(uint64) bool {
	ends := map[uint64]bool{}
	var at uint64
	for _, d := range durs {
		at += d
		ends[at] = true
	}
	return func(w uint64) bool { return ends[w] }
}

func (b *lazyBurst) Kernels(first, n int) []uint64 {
	b.asked++
	b.bad = b.bad || (first != 0 && (b.every == 0 || first%b.every != 0))
	if first != b.first {
		b.first, b.last = first, 0
	}
	b.shrank = b.shrank || n <= b.last
	b.last = n
	if b.exact {
		return b.durs[first : first+n]
	}
	return b.durs[first:]
}

// TestBurstEqualsLaunches: kernels handed over as one burst (Op.Durs), or
// as a burst whose durations are asked for only when needed (Op.Burst),
// run exactly as the same kernels launched one by one, in every mode,
// with the GPU deciding once per run of kernels rather than once per
// kernel.
func TestBurstEqualsLaunches(t *testing.T) {
	durs := []uint64{300 * us, 450 * us, 120 * us, 800 * us, 60 * us}
	var total uint64
	for _, d := range durs {
		total += d
	}
	const (
		single = iota
		eager
		lazy
		exact
		skipping
		filtered
	)
	one := func(how int, bursts *[]*lazyBurst) Program {
		sc := &script{}
		for range 3 {
			switch how {
			case eager:
				sc.ops = append(sc.ops, Op{Kind: OpKernel, Durs: durs})
			case lazy, exact, skipping, filtered:
				b := &lazyBurst{durs: durs, exact: how != lazy}
				if how == skipping {
					b.every = 2
				}
				if how == filtered {
					b.ends = endsOf(durs)
				}
				*bursts = append(*bursts, b)
				sc.ops = append(sc.ops, Op{Kind: OpKernel, Dur: total, Count: uint32(len(durs)), Burst: b})
			default:
				for _, d := range durs {
					sc.ops = append(sc.ops, Op{Kind: OpKernel, Dur: d})
				}
			}
			sc.ops = append(sc.ops, Op{Kind: OpCopy, Bytes: 1 << 20}, Op{Kind: OpSync}, Op{Kind: OpSleep, Dur: 200 * us})
		}
		return sc
	}
	totalSkips := 0
	for _, mode := range []Mode{ModeTimeslice, ModeSpatial, ModePriority} {
		for _, gran := range []Granularity{GranularityInstruction, GranularityBlock, GranularityKernel} {
			var got [6]string
			var bursts []*lazyBurst
			for how := range got {
				got[how] = outcome(t, &Options{Mode: mode, Granularity: gran, Timeslice: 500 * time.Microsecond}, uint64(time.Second),
					Process{Name: "A", Class: ClassLC, Program: one(how, &bursts)},
					Process{Name: "B", Program: kernels(2000*us, 1500*us, 700*us)},
					Process{Name: "C", Program: one(how, &bursts)})
			}
			if got[single] != got[eager] {
				t.Errorf("%v/%v: burst differs from single launches:\n%s\n%s", mode, gran, got[single], got[eager])
			}
			if got[single] != got[lazy] {
				t.Errorf("%v/%v: lazy burst differs from single launches:\n%s\n%s", mode, gran, got[single], got[lazy])
			}
			if got[single] != got[exact] {
				t.Errorf("%v/%v: lazy burst answering as asked differs from single launches:\n%s\n%s", mode, gran, got[single], got[exact])
			}
			if got[single] != got[skipping] {
				t.Errorf("%v/%v: lazy burst starting part way differs from single launches:\n%s\n%s", mode, gran, got[single], got[skipping])
			}
			if got[single] != got[filtered] {
				t.Errorf("%v/%v: lazy burst telling where its kernels end differs from single launches:\n%s\n%s", mode, gran, got[single], got[filtered])
			}
			asked, skips, filterAsked, filterCalls := 0, 0, 0, 0
			for _, b := range bursts {
				if b.ends != nil {
					filterAsked += b.asked
					filterCalls += b.mayEnd
					continue
				}
				if !b.exact && b.asked > 1 {
					t.Errorf("%v/%v: a lazy burst that gave all its durations was asked %d times, want at most once", mode, gran, b.asked)
				}
				if b.shrank {
					t.Errorf("%v/%v: a lazy burst was asked for no more than the time before", mode, gran)
				}
				if b.bad {
					t.Errorf("%v/%v: a lazy burst was asked for durations from a kernel it did not offer", mode, gran)
				}
				if b.asked > 0 {
					asked++
				}
				skips += b.skips
			}
			t.Logf("%v/%v: %d of %d lazy bursts asked for their durations, %d started part way; those telling their ends asked %d times, MayEnd %d times",
				mode, gran, asked, len(bursts), skips, filterAsked, filterCalls)
			totalSkips += skips
			// At instruction granularity only the preemption's test of a
			// boundary asks, and MayEnd answers it.
			if mode != ModeSpatial && gran == GranularityInstruction && asked > 0 && (filterAsked > 0 || filterCalls == 0) {
				t.Errorf("%v/%v: bursts telling their ends were asked for durations %d times (MayEnd %d times), want none (MayEnd used)",
					mode, gran, filterAsked, filterCalls)
			}
		}
	}
	if totalSkips == 0 {
		t.Error("no lazy burst was asked to start part way: the test does not reach Burst.Start")
	}
}

// TestBurstEvents: a controller reads a burst's launches as it reads the
// same kernels launched one by one: one launch event per kernel, at the
// instant of the launch, between the events around them.
func TestBurstEvents(t *testing.T) {
	durs := []uint64{300 * us, 450 * us, 120 * us}
	prog := func(how int) Program {
		sc := &script{}
		for range 2 {
			switch how {
			case 1:
				sc.ops = append(sc.ops, Op{Kind: OpKernel, Durs: durs})
			case 2:
				sc.ops = append(sc.ops, Op{Kind: OpKernel, Dur: 870 * us, Count: 3, Burst: &lazyBurst{durs: durs, exact: true}})
			default:
				for _, d := range durs {
					sc.ops = append(sc.ops, Op{Kind: OpKernel, Dur: d})
				}
			}
			sc.ops = append(sc.ops, Op{Kind: OpCopy, Bytes: 4096}, Op{Kind: OpSync}, Op{Kind: OpSleep, Dur: 100 * us})
		}
		return sc
	}
	var got [3][]string
	for how := range got {
		s, _ := mustSim(t, &Options{Observe: true}, Process{Name: "A", Class: ClassLC, Program: prog(how)},
			Process{Name: "B", Program: kernels(500*us, 500*us)})
		s.Start(uint64(time.Second))
		readAll(t, s, func(ev *trace.Event) { got[how] = append(got[how], fmt.Sprintf("%+v", *ev)) })
	}
	if launches := strings.Count(strings.Join(got[0], "\n"), "Kind:launch"); launches != 8 {
		t.Fatalf("%d launch events, want 8: %v", launches, got[0])
	}
	for how := 1; how < len(got); how++ {
		if !slices.Equal(got[0], got[how]) {
			t.Errorf("burst %d: events differ from single launches:\n%v\n%v", how, got[0], got[how])
		}
	}
}

// TestBurstMayEndAtBoundary: a timeslice that expires exactly where a
// kernel of a burst ends switches without a save, whether the burst's
// durations were handed over or are known only to MayEnd; a MayEnd that
// says no kernel ends there (wrongly) would cost a save.
func TestBurstMayEndAtBoundary(t *testing.T) {
	durs := []uint64{250 * us, 250 * us, 250 * us, 250 * us}
	run := func(op func() Op) Stats {
		s, _ := mustSim(t, &Options{Timeslice: 500 * time.Microsecond},
			Process{Name: "A", Program: &script{ops: []Op{op(), {Kind: OpSync}}}},
			Process{Name: "B", Program: kernels(300 * us)})
		if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
			t.Fatal(err)
		}
		return s.Stats()
	}
	burst := func(ends func(uint64) bool) func() Op {
		return func() Op {
			return Op{Kind: OpKernel, Dur: 1000 * us, Count: 4, Burst: &lazyBurst{durs: durs, exact: true, ends: ends}}
		}
	}
	eager := run(func() Op { return Op{Kind: OpKernel, Durs: durs} })
	if eager.GPUs[0].Preemptions != 0 || eager.GPUs[0].Switches < 3 {
		t.Fatalf("handed over: %d preemptions and %d switches, want none (the slice ends between kernels) and 3 or more",
			eager.GPUs[0].Preemptions, eager.GPUs[0].Switches)
	}
	if got := describe(run(burst(endsOf(durs)))); got != describe(eager) {
		t.Errorf("MayEnd exact: differs from durations handed over:\n%s\n%s", got, describe(eager))
	}
	if got := run(burst(func(uint64) bool { return false })); got.GPUs[0].Preemptions == 0 {
		t.Error("MayEnd always false: no preemption, so the test does not reach the boundary through MayEnd")
	}
}

// TestLazyBurstUnasked: a burst that nothing preempts never needs its
// kernels' durations.
func TestLazyBurstUnasked(t *testing.T) {
	b := &lazyBurst{durs: []uint64{300 * us, 450 * us, 120 * us}}
	sc := &script{ops: []Op{{Kind: OpKernel, Dur: 870 * us, Count: 3, Burst: b}, {Kind: OpSync}}}
	s, _ := mustSim(t, &Options{}, Process{Name: "A", Class: ClassLC, Program: sc})
	if err := s.Run(context.Background(), uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	if p := s.Stats().Procs[0]; b.asked != 0 || p.KernelsCompleted != 3 || p.CompletedWork != 870*us {
		t.Errorf("alone: asked %d times, %d kernels and %v of work done; want 0 times, 3 kernels, 870µs",
			b.asked, p.KernelsCompleted, time.Duration(p.CompletedWork))
	}
}

// TestLazyBurstMismatch: a burst whose durations do not add up to what
// was launched fails the run, naming the process, whether it hands them
// over from the first kernel or from part way (TestBurstBadStart: where
// a start itself does not fit).
func TestLazyBurstMismatch(t *testing.T) {
	for name, c := range map[string]struct {
		durs  []uint64
		every int
	}{
		"sum":           {durs: []uint64{300 * us, 450 * us, 100 * us}},
		"count":         {durs: []uint64{300 * us, 570 * us}},
		"zero":          {durs: []uint64{300 * us, 570 * us, 0}},
		"sum part way":  {durs: []uint64{300 * us, 450 * us, 100 * us}, every: 1},
		"zero part way": {durs: []uint64{300 * us, 570 * us, 0}, every: 1},
	} {
		b := &lazyBurst{durs: c.durs, every: c.every}
		sc := &script{ops: []Op{{Kind: OpKernel, Dur: 870 * us, Count: 3, Burst: b}, {Kind: OpSync}}}
		s, _ := mustSim(t, &Options{Mode: ModePriority},
			Process{Name: "BE", Program: sc},
			Process{Name: "LC", Class: ClassLC, Program: &script{ops: []Op{{Kind: OpSleep, Dur: 800 * us}, {Kind: OpKernel, Dur: 10 * us}, {Kind: OpSync}}}})
		err := s.Run(context.Background(), uint64(time.Second))
		if err == nil || !strings.Contains(err.Error(), "process BE") || !strings.Contains(err.Error(), "a burst of 3 kernels") {
			t.Errorf("%s: got %v, want the run to fail naming process BE and its burst", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// markedBurst is a lazy burst (Op.Burst) that offers to start from any of
// a set of kernels, its marks, and answers with more durations than asked
// (extra of those left, at most), each time in fresh memory. It counts
// the starts past the first kernel, and those made after it had already
// handed durations over (a second move of the cursor).
type markedBurst struct {
	durs   []uint64
	marks  map[int]bool
	extra  func(left int) int
	asked  bool
	starts int
	again  int
}

func (b *markedBurst) Start(w uint64) (int, uint64) {
	first, before, at := 0, uint64(0), uint64(0)
	for i, d := range b.durs {
		if b.marks[i] && at <= w {
			first, before = i, at
		}
		at += d
	}
	if first > 0 {
		b.starts++
		if b.asked {
			b.again++
		}
	}
	return first, before
}

func (b *markedBurst) MayEnd(uint64) bool { return true }

func (b *markedBurst) Kernels(first, n int) []uint64 {
	b.asked = true
	m := n + b.extra(len(b.durs)-first-n)
	return append([]uint64(nil), b.durs[first:first+m]...)
}

// TestBurstRandomStarts: bursts of random kernels (some of 1 to 3 ns),
// launched whole, by their total, or by their total with random marks
// to start from and answers longer than asked, run the same in every
// mode and granularity beside an LC process that preempts them at
// random.
func TestBurstRandomStarts(t *testing.T) {
	var all []*markedBurst
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 1))
		var bursts [][]uint64
		for range 4 {
			durs := make([]uint64, 2+r.IntN(60))
			for i := range durs {
				durs[i] = uint64(1+r.IntN(400)) * us / 4
				if r.IntN(10) == 0 {
					durs[i] = uint64(1 + r.IntN(3))
				}
			}
			bursts = append(bursts, durs)
		}
		var lc []Op
		for range 40 {
			lc = append(lc, Op{Kind: OpSleep, Dur: uint64(r.IntN(900)) * us}, Op{Kind: OpKernel, Dur: uint64(5+r.IntN(200)) * us}, Op{Kind: OpSync})
		}
		end := uint64(3+r.IntN(20)) * uint64(time.Millisecond)
		const (
			whole = iota
			total
			marked
		)
		program := func(how int, seed uint64) Program {
			r, mr := rand.New(rand.NewPCG(seed, 2)), rand.New(rand.NewPCG(seed, 3))
			sc := &script{}
			for _, durs := range bursts {
				var sum uint64
				for _, d := range durs {
					sum += d
				}
				switch how {
				case whole:
					sc.ops = append(sc.ops, Op{Kind: OpKernel, Durs: durs})
				default:
					b := &markedBurst{durs: durs, marks: map[int]bool{}, extra: func(int) int { return 0 }}
					if how == marked {
						for i := 1; i < len(durs); i++ {
							b.marks[i] = mr.IntN(3) == 0
						}
						b.extra = func(left int) int { return mr.IntN(left+1) / 3 }
					}
					all = append(all, b)
					sc.ops = append(sc.ops, Op{Kind: OpKernel, Dur: sum, Count: uint32(len(durs)), Burst: b})
				}
				sc.ops = append(sc.ops, Op{Kind: OpSync}, Op{Kind: OpSleep, Dur: uint64(r.IntN(300)) * us})
			}
			return sc
		}
		for _, mode := range []Mode{ModeTimeslice, ModePriority, ModeSpatial} {
			for _, gran := range []Granularity{GranularityInstruction, GranularityBlock, GranularityKernel} {
				var got [3]string
				for how := range got {
					got[how] = outcome(t, &Options{Mode: mode, Granularity: gran, Timeslice: 300 * time.Microsecond}, end,
						Process{Name: "LC", Class: ClassLC, Program: &script{ops: lc}},
						Process{Name: "BE", Program: program(how, seed)},
						Process{Name: "BE2", Program: program(how, seed+1000)})
				}
				if got[total] != got[whole] {
					t.Fatalf("seed %d, %v/%v: by total differs from whole:\n%s\n%s", seed, mode, gran, got[total], got[whole])
				}
				if got[marked] != got[whole] {
					t.Fatalf("seed %d, %v/%v: with marks differs from whole:\n%s\n%s", seed, mode, gran, got[marked], got[whole])
				}
			}
		}
	}
	starts, again := 0, 0
	for _, b := range all {
		starts, again = starts+b.starts, again+b.again
	}
	t.Logf("%d starts from a mark, %d of them after durations were handed over", starts, again)
	if starts == 0 || again == 0 {
		t.Errorf("%d starts from a mark, %d after durations were handed over: the test misses a path of item.skip", starts, again)
	}
}

// badStart is a lazy burst of kernels of 100 µs that offers, at its
// calls to Start after the first skip ones, a start that does not fit.
type badStart struct {
	durs          []uint64
	skip          int
	first         int
	before, calls uint64
}

func (b *badStart) Start(uint64) (int, uint64) {
	if b.calls++; b.calls <= uint64(b.skip) {
		return 0, 0
	}
	return b.first, b.before
}

func (b *badStart) Kernels(first, n int) []uint64 { return b.durs[first : first+n] }

func (b *badStart) MayEnd(uint64) bool { return true }

// TestBurstBadStart: a start that cannot be where a burst's kernels are
// fails the run, naming the process and the burst: past the last
// kernel, later than the work done, earlier than the kernels before it
// can have lasted (1 ns each, or those known), or leaving the kernels
// after it less than 1 ns each.
func TestBurstBadStart(t *testing.T) {
	durs := make([]uint64, 10)
	for i := range durs {
		durs[i] = 100 * us
	}
	for name, b := range map[string]*badStart{
		"past the last":        {first: 10, before: 100 * us},
		"after the work done":  {first: 2, before: 200*us + 1},
		"before 1 ns each":     {first: 5, before: 4},
		"less than 1 ns after": {first: 2, before: 1000*us - 7},
		"before those known":   {skip: 1, first: 7, before: 200 * us},
	} {
		b.durs = durs
		lc := &script{ops: []Op{{Kind: OpSleep, Dur: 150 * us}, {Kind: OpKernel, Dur: 10 * us}, {Kind: OpSync},
			{Kind: OpSleep, Dur: 600 * us}, {Kind: OpKernel, Dur: 10 * us}, {Kind: OpSync}}}
		s, _ := mustSim(t, &Options{Mode: ModePriority},
			Process{Name: "BE", Program: &script{ops: []Op{{Kind: OpKernel, Dur: 1000 * us, Count: 10, Burst: b}, {Kind: OpSync}}}},
			Process{Name: "LC", Class: ClassLC, Program: lc})
		err := s.Run(context.Background(), uint64(time.Second))
		if err == nil || !strings.Contains(err.Error(), "process BE") || !strings.Contains(err.Error(), "a burst of 10 kernels") ||
			!strings.Contains(err.Error(), "does not fit") {
			t.Errorf("%s: got %v, want the run to fail naming process BE and its burst", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
