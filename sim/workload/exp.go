package workload

import "math"

// Log-normal service times exponentiate one normal deviate per kernel, and
// an hour of a busy spec draws a few hundred million of them: math.Exp,
// which on amd64 is an assembly routine the compiler cannot inline and
// whose terms depend on one another, took up to a fifth of a run's time. exp is
// the usual table method instead: x = (k/expN)·ln 2 + r with |r| ≤
// ln 2/(2·expN), so e^x = 2^(k/expN) · e^r, the power of two from a table
// of expN entries and e^r from a polynomial of degree 4, about 2.5 times
// faster in a batch of draws (BenchmarkExp). Its result is within 2 units
// in the last place of math.Exp's (TestExp), and a draw keeps only whole
// nanoseconds of it, so the two give different draws only where e^x lies
// within a few parts in 1e16 of a half nanosecond: rare enough that ten
// million draws of the examples' shapes found none (TestExpDraws allows
// two in 2.5 million), and the shipped examples' reports are the same
// byte for byte.

// expBits is log2 of the table's size.
const expBits = 8

// expN is the number of table entries: 2^(i/expN) for i in [0, expN).
const expN = 1 << expBits

// expTable holds the bits of 2^(i/expN) as math.Exp2 gives it, within a
// unit in the last place.
var expTable = func() (t [expN]uint64) {
	for i := range t {
		t[i] = math.Float64bits(math.Exp2(float64(i) / expN))
	}
	return t
}()

// expLimit bounds the arguments exp computes itself: beyond it (and for
// NaN) math.Exp, which returns +Inf, 0 or NaN as needed, takes over. Far
// beyond any service time: e^700 ns is 10^296 years.
const expLimit = 700

// exp returns e^x (see above).
func exp(x float64) float64 {
	if !(x > -expLimit && x < expLimit) {
		return math.Exp(x)
	}
	return expNear(x)
}

// expNear returns e^x for |x| < expLimit: exp without the guard, small
// enough for the compiler to inline into a loop that guards once.
func expNear(x float64) float64 {
	const (
		// Adding shift rounds to an integer k, left in the low bits of
		// the sum's mantissa with 2^51 added: its low expBits bits index
		// the table, the next 12 (modulo 2^12) are the power of two to add
		// to the entry's exponent.
		shift   = 0x1.8p52
		invLn2N = expN / math.Ln2
		// ln 2/expN in two parts: hi has 32 significant bits, so k·hi is
		// exact for every k here (|k| < 2^18).
		ln2HiN = 0x1.62e42feep-1 / expN
		ln2LoN = 0x1.a39ef35793c76p-33 / expN
	)
	kf := x*invLn2N + shift
	b := math.Float64bits(kf)
	kf -= shift
	r := x - kf*ln2HiN - kf*ln2LoN
	s := math.Float64frombits(expTable[b%expN] + b>>expBits<<52)
	// e^r − 1: the remainder of the series, r^5/120, is below 4e-17.
	return s + s*(r+r*r*(1.0/2+r*(1.0/6+r*(1.0/24))))
}
