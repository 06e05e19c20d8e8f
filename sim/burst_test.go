package sim

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

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
