package workload

import "math"

// Log-normal service times are drawn by inversion, from one uniform
// 64-bit draw each, not by exponentiating a normal deviate: an hour of
// the shipped examples draws some 400 million of them, and a deviate and
// its exponential cost 16–20 ns a draw on the development guest, the
// largest single cost of a run. The quantile function,
// Q(p) = e^(μ + σ·Φ⁻¹(p)), is tabled at the quantileN − 1 probabilities
// i/quantileN (the knots) and interpolated linearly between them, except
// in the quantileEdge bins at each end, where it bends most, which are
// computed: about 7 ns a draw with the generator (BenchmarkLogNormalDraw).
// The drawn distribution's CDF agrees with the log-normal's at every knot
// and, between them, within 2·10^-6 of probability; in the computed bins
// within a few parts in 10^11 of the tail's probability
// (TestQuantileTable measures both against the exact CDF, for CVs from
// 0.03 to 3).

// quantileBits is log2 of the number of bins.
const quantileBits = 12

// quantileN is the number of bins: the top quantileBits bits of a draw
// choose one, the others where in it.
const quantileN = 1 << quantileBits

// quantileEdge is how many bins at each end are computed, not
// interpolated: where the quantile function bends most.
const quantileEdge = 32

// quantileFrac is the scale of a draw's position in its bin.
const quantileFrac = 1.0 / (1 << (64 - quantileBits))

// logNormalTable is a log-normal's quantile function: v holds
// Q(i/quantileN) for i in [0, quantileN] (the first and last, Q(0) = 0 and
// Q(1) = +Inf, are never interpolated), and mu and sigma give the tails.
type logNormalTable struct {
	mu, sigma float64
	v         [quantileN + 1]float64
}

// newLogNormalTable tables the quantile function of e^(mu + sigma·Z).
func newLogNormalTable(mu, sigma float64) *logNormalTable {
	t := &logNormalTable{mu: mu, sigma: sigma}
	t.v[quantileN] = math.Inf(1)
	for i := 1; i < quantileN; i++ {
		t.v[i] = math.Exp(mu + sigma*normalQuantile(float64(i)/quantileN))
	}
	// The knots where the outer bins end, as the outer bins compute them:
	// the draws rise across the boundary.
	edge := outerNormalQuantile(float64(quantileEdge) / quantileN)
	t.v[quantileEdge] = math.Exp(mu + sigma*edge)
	t.v[quantileN-quantileEdge] = math.Exp(mu - sigma*edge)
	return t
}

// normalQuantile is Φ⁻¹(p), the standard normal's quantile function, for
// 0 < p < 1. It is computed on the lower half and mirrored, so p near 1
// loses what 1 − p loses in floating point: the upper outer bin passes
// 1 − p itself to lowerNormalQuantile.
func normalQuantile(p float64) float64 {
	if p > 0.5 {
		return -lowerNormalQuantile(1 - p)
	}
	return lowerNormalQuantile(p)
}

// lowerNormalQuantile is Φ⁻¹(p) for 0 < p ≤ 1/2, to a few units in the
// last place however small p is. math.Erfcinv(x) computes math.Erfinv(1
// − x), which loses the digits of a small x (some 6,000 units in the last
// place of z at p = 1e-6, and +Inf below about 5e-17): it gives only the
// first guess, or, in the far tail, the asymptotic expansion does, and
// Halley's method on Φ, which math.Erfc gives to full relative precision
// in the tail, finishes. It converges cubically: one step from
// Erfcinv's guess, three from the expansion's, leave nothing to correct.
func lowerNormalQuantile(p float64) float64 {
	var z float64
	steps := 1
	if p > 1e-10 {
		z = -math.Sqrt2 * math.Erfcinv(2*p)
	} else {
		l := -2 * math.Log(p)
		z = -math.Sqrt(l - math.Log(l) - math.Log(2*math.Pi))
		steps = 3
	}
	for range steps {
		e := 0.5*math.Erfc(-z/math.Sqrt2) - p
		u := e * math.Sqrt(2*math.Pi) * math.Exp(z*z/2)
		z -= u / (1 + z*u/2)
	}
	return z
}

// at returns the quantile for a 64-bit uniform draw u, the probability
// (u + 1/2)/2^64: interpolated in an inner bin, computed in an outer one.
// drawInto has its inner branch written out, for the loop to inline.
func (t *logNormalTable) at(u uint64) float64 {
	i := u >> (64 - quantileBits)
	if i-quantileEdge >= quantileN-2*quantileEdge {
		return t.tail(u)
	}
	f := float64(u<<quantileBits>>quantileBits) * quantileFrac
	return t.v[i] + f*(t.v[i+1]-t.v[i])
}

// tail computes the quantile of a draw in one of the outer bins.
func (t *logNormalTable) tail(u uint64) float64 {
	var z float64
	if u>>63 == 0 {
		z = outerNormalQuantile((float64(u) + 0.5) * 0x1p-64)
	} else {
		z = -outerNormalQuantile((float64(^u) + 0.5) * 0x1p-64) // 1 − p, without cancellation
	}
	return math.Exp(t.mu + t.sigma*z)
}

// outerNormalQuantile is lowerNormalQuantile for the p of a draw in an
// outer bin, or of the knot where they end. From the second bin on
// (p ≥ 1/quantileN), Erfcinv's guess needs no refining: 1 − 2p, which
// it takes, rounds to within half a unit in [1/2, 1), 2^-54; a unit
// less puts it below the exact value, so that the quantile is never
// below Φ⁻¹(p), and at most 1.5·2^-53/(2p), 3.4·10^-13 of p, above it:
// inside the 10^-12 the computed bins keep to (TestQuantileTable), and
// on the right side of the first bin's refined values, which keeps the
// draws rising with u. Only the first bin, down to p = 2^-65, needs the
// guess refined; skipping that in the others halves their cost.
func outerNormalQuantile(p float64) float64 {
	if p < 1.0/quantileN {
		return lowerNormalQuantile(p)
	}
	return -math.Sqrt2 * math.Erfinv(1-2*p-0x1p-53)
}
