package hist

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestExactSmallValues(t *testing.T) {
	var h Histogram
	for v := uint64(1); v <= 100; v++ {
		h.Record(v)
	}
	cases := []struct {
		q    float64
		want uint64
	}{{0.01, 1}, {0.5, 50}, {0.99, 99}, {0.999, 100}, {1, 100}}
	for _, c := range cases {
		if got := h.Quantile(c.q); got != c.want {
			t.Errorf("Quantile(%v) = %d, want %d", c.q, got, c.want)
		}
	}
	if h.Count() != 100 || h.Min() != 1 || h.Max() != 100 || h.Mean() != 50.5 {
		t.Errorf("count %d min %d max %d mean %v", h.Count(), h.Min(), h.Max(), h.Mean())
	}
	if got := h.AtOrBelow(30); got != 30 {
		t.Errorf("AtOrBelow(30) = %d", got)
	}
}

func TestBucketsRoundTrip(t *testing.T) {
	for _, v := range []uint64{0, 1, 255, 256, 257, 511, 512, 1000, 1 << 20, 1<<20 + 12345, 1<<63 + 99, ^uint64(0)} {
		lo, hi := bounds(index(v))
		if v < lo || v > hi {
			t.Errorf("v=%d in bucket [%d,%d]", v, lo, hi)
		}
		if v >= 256 && float64(hi-lo+1)/float64(lo) > 1.0/256+1e-12 {
			t.Errorf("v=%d: bucket width %d too wide for %d", v, hi-lo+1, lo)
		}
	}
}

func TestQuantileRelativeError(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h Histogram
	vals := make([]uint64, 100000)
	for i := range vals {
		vals[i] = uint64(r.ExpFloat64() * 2e6)
		h.Record(vals[i])
	}
	slices.Sort(vals)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := vals[int(q*float64(len(vals))+0.999999)-1]
		got := h.Quantile(q)
		if d := float64(got)/float64(exact) - 1; d > 0.004 || d < -0.004 {
			t.Errorf("q=%v: got %d, exact %d (%.4f)", q, got, exact, d)
		}
	}
	var m Histogram
	m.Merge(&h)
	m.Merge(&h)
	if m.Count() != 200000 || m.Quantile(0.5) != h.Quantile(0.5) {
		t.Errorf("merge: count %d p50 %d vs %d", m.Count(), m.Quantile(0.5), h.Quantile(0.5))
	}
	cdf := h.CDF(50)
	if len(cdf) != 50 || cdf[49].Fraction != 1 || cdf[49].Value != h.Max() {
		t.Errorf("cdf: %d points, last %+v", len(cdf), cdf[len(cdf)-1])
	}
	for i := 1; i < len(cdf); i++ {
		if cdf[i].Value < cdf[i-1].Value || cdf[i].Fraction < cdf[i-1].Fraction {
			t.Fatalf("cdf not monotonic at %d", i)
		}
	}
}

func TestEmpty(t *testing.T) {
	var h Histogram
	if h.Quantile(0.99) != 0 || h.Mean() != 0 || h.CDF(10) != nil || h.AtOrBelow(5) != 0 {
		t.Error("empty histogram not zero")
	}
}

// TestGrowthAllocates: values that grow one bucket at a time (latencies
// of a queue that keeps growing) reuse the spare capacity instead of
// reallocating per new bucket.
func TestGrowthAllocates(t *testing.T) {
	var n int
	allocs := testing.AllocsPerRun(1, func() {
		var h Histogram
		for v := uint64(1); v < 1<<32; v += 1 + v/200 {
			h.Record(v)
		}
		n = len(h.counts)
	})
	if allocs > 60 {
		t.Errorf("%v allocations for %d buckets", allocs, n)
	}
}
