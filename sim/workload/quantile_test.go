package workload

import (
	"math"
	"testing"
	"time"
)

// TestQuantileTable: a log-normal draw, at the probability its 64 bits
// stand for, lies where the exact log-normal CDF puts that probability,
// within 2·10^-6 of probability in the interpolated bins and within
// 10^-12 of it in the computed bins at each end (probed down to 1e-18 on
// either side, and across p = 1e-10, where the first guess of the normal
// quantile changes), for shapes from nearly constant to heavy-tailed; and
// the table's values rise with the draw, so that the drawn distribution
// is a distribution.
func TestQuantileTable(t *testing.T) {
	// The probability a draw stands for, and the log-normal's
	// probability of a value at most v, each on the side of 1/2 where it
	// is smaller: the complement above it, as the draw computes it.
	tail := func(u uint64, mu, sigma, v float64) (p, f float64) {
		x := (math.Log(v) - mu) / (sigma * math.Sqrt2)
		if u>>63 == 0 {
			return (float64(u) + 0.5) * 0x1p-64, 0.5 * math.Erfc(-x)
		}
		return (float64(^u) + 0.5) * 0x1p-64, 0.5 * math.Erfc(x)
	}
	for _, cv := range []float64{0.03, 0.3, 0.5, 1, 3} {
		sigma := math.Sqrt(math.Log1p(cv * cv))
		mu := math.Log(40e3) - sigma*sigma/2
		q := newLogNormalTable(mu, sigma)
		var g gen
		g.seed(uint64(cv*100), 1)
		var worstInner, worstTail float64
		prev := 0.0
		check := func(u uint64) {
			v := q.at(u)
			if !(v > 0) || math.IsInf(v, 0) {
				t.Fatalf("cv %v: draw %#x gave %v", cv, u, v)
			}
			p, f := tail(u, mu, sigma, v)
			d := math.Abs(f - p)
			if i := u >> (64 - quantileBits); i < quantileEdge || i >= quantileN-quantileEdge {
				worstTail = max(worstTail, d/p)
			} else {
				worstInner = max(worstInner, d)
			}
		}
		for range 200_000 {
			check(g.Uint64())
		}
		for i := uint64(0); i < quantileN; i++ {
			base := i << (64 - quantileBits)
			const w = 64 - quantileBits
			for _, off := range []uint64{0, 1 << (w - 12), 1 << (w - 1), 1<<w - 1} {
				u := base | off
				check(u)
				if v := q.at(u); v < prev {
					t.Fatalf("cv %v: draw %#x gave %v, below the draw before it (%v)", cv, u, v, prev)
				} else {
					prev = v
				}
			}
		}
		for _, p := range []float64{1e-18, 1e-15, 1e-12, 0.99e-10, 1.01e-10, 1e-8, 1e-6, 1.01e-6, 1e-4} {
			u := uint64(p * 0x1p64)
			check(u)
			check(^u)
		}
		check(0)
		check(math.MaxUint64)
		t.Logf("cv %v: largest CDF error %.2g inside, %.2g relative in the outer bins", cv, worstInner, worstTail)
		if worstInner > 2e-6 {
			t.Errorf("cv %v: an interpolated draw is %.2g of probability from the log-normal's CDF, want ≤ 2e-6", cv, worstInner)
		}
		if worstTail > 1e-12 {
			t.Errorf("cv %v: a draw in an outer bin is %.2g (relative) from the log-normal's CDF, want ≤ 1e-12", cv, worstTail)
		}
	}
}

// BenchmarkLogNormalDraw: one log-normal service time, drawn as a key's
// burst of kernels draws it (drawInto, 160 at a time).
func BenchmarkLogNormalDraw(b *testing.B) {
	d := Dist{Dist: "lognormal", Mean: Duration(40 * time.Microsecond), CV: 0.5}
	s := newSampler(&d)
	var g gen
	buf := make([]uint64, 160)
	for b.Loop() {
		s.drawInto(&g, buf)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(buf)), "ns/draw")
}
