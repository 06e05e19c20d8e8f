package workload

import (
	"math"
	"math/rand/v2"
	"testing"
)

// ulps returns how many float64 values lie between a and b (both finite
// and positive).
func ulps(a, b float64) uint64 {
	x, y := math.Float64bits(a), math.Float64bits(b)
	if x > y {
		return x - y
	}
	return y - x
}

// TestExp: exp agrees with math.Exp within 2 units in the last place
// over the range of service-time exponents and past it, and hands what
// it does not compute to math.Exp.
func TestExp(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	worst := uint64(0)
	for i := range 2_000_000 {
		x := (r.Float64()*2 - 1) * 60
		if i%4 == 0 {
			x = (r.Float64()*2 - 1) * (expLimit - 1e-9)
		}
		got, want := exp(x), math.Exp(x)
		if d := ulps(got, want); d > 2 {
			t.Fatalf("exp(%v) = %v, math.Exp = %v: %d ulps apart", x, got, want, d)
		} else {
			worst = max(worst, d)
		}
	}
	t.Logf("worst: %d ulps", worst)
	for _, x := range []float64{0, 1, -1, math.Ln2, 1e-300, -1e-300, 699.999, -699.999} {
		if d := ulps(exp(x), math.Exp(x)); d > 2 {
			t.Errorf("exp(%v) = %v, math.Exp = %v", x, exp(x), math.Exp(x))
		}
	}
	for _, x := range []float64{700, -700, 710, -746, math.Inf(1), math.Inf(-1)} {
		if got, want := exp(x), math.Exp(x); got != want {
			t.Errorf("exp(%v) = %v, want %v as math.Exp", x, got, want)
		}
	}
	if !math.IsNaN(exp(math.NaN())) {
		t.Error("exp(NaN) is not NaN")
	}
}

// TestExpDraws: over ten million log-normal draws of the shapes the
// examples use, exp and math.Exp give the same whole nanoseconds, but for
// at most a handful.
func TestExpDraws(t *testing.T) {
	for _, d := range []Dist{
		{Dist: "lognormal", Mean: Duration(40500), CV: 0.03},
		{Dist: "lognormal", Mean: Duration(53300), CV: 0.5},
		{Dist: "lognormal", Mean: Duration(8_000_000), CV: 0.3},
		{Dist: "lognormal", Mean: Duration(100_000), CV: 3},
	} {
		s := newSampler(&d)
		r := rand.New(rand.NewPCG(3, 4))
		differ := 0
		for range 2_500_000 {
			x := s.exponent(r)
			if s.bound(exp(x)) != s.bound(math.Exp(x)) {
				differ++
			}
		}
		if differ > 2 {
			t.Errorf("%+v: %d of 2,500,000 draws differ from math.Exp's", d, differ)
		}
	}
}

func BenchmarkExp(b *testing.B) {
	xs := make([]float64, 64)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range xs {
		xs[i] = 10 + r.NormFloat64()
	}
	var out [64]float64
	b.Run("table", func(b *testing.B) {
		for b.Loop() {
			for i, x := range xs {
				out[i] = exp(x)
			}
		}
	})
	b.Run("table-inlined", func(b *testing.B) {
		for b.Loop() {
			for i, x := range xs {
				if x > -expLimit && x < expLimit {
					out[i] = expNear(x)
				} else {
					out[i] = math.Exp(x)
				}
			}
		}
	})
	b.Run("math", func(b *testing.B) {
		for b.Loop() {
			for i, x := range xs {
				out[i] = math.Exp(x)
			}
		}
	})
}
