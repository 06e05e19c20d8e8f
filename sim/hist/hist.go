// Package hist is a log-linear latency histogram in the style of
// HdrHistogram: values (nanoseconds) below 256 are counted exactly, larger
// ones in buckets whose width is 1/256 of their magnitude, so every quantile
// is within 0.4% of the true value. Memory grows only to the largest value
// recorded (at most about 120 KiB), never with the number of values.
package hist

import "math/bits"

// subBits sets the precision: 2^subBits buckets per power of two.
const subBits = 8

const subCount = 1 << subBits

// Histogram counts uint64 values. The zero value is ready to use.
type Histogram struct {
	counts   []uint64
	n        uint64
	sum      float64
	min, max uint64
}

// index returns v's bucket.
func index(v uint64) int {
	if v < subCount {
		return int(v)
	}
	exp := bits.Len64(v) - subBits - 1
	return (exp+1)*subCount + int(v>>uint(exp)) - subCount
}

// bounds returns the lowest and highest value of bucket i.
func bounds(i int) (lo, hi uint64) {
	if i < subCount {
		return uint64(i), uint64(i)
	}
	exp := i/subCount - 1
	lo = uint64(i%subCount+subCount) << uint(exp)
	return lo, lo + (1 << uint(exp)) - 1
}

// Record adds one value.
func (h *Histogram) Record(v uint64) {
	i := index(v)
	if i >= len(h.counts) {
		if i < cap(h.counts) {
			h.counts = h.counts[:i+1] // the spare capacity is zeroed
		} else {
			grown := make([]uint64, i+1, (i+1)*5/4+1)
			copy(grown, h.counts)
			h.counts = grown
		}
	}
	h.counts[i]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

// Merge adds every value counted in o.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	if len(o.counts) > len(h.counts) {
		grown := make([]uint64, len(o.counts))
		copy(grown, h.counts)
		h.counts = grown
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// Count returns how many values were recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Min and Max return the exact extremes (0 when empty).
func (h *Histogram) Min() uint64 { return h.min }

// Max returns the largest value recorded.
func (h *Histogram) Max() uint64 { return h.max }

// Mean returns the exact mean (0 when empty).
func (h *Histogram) Mean() float64 {
	if h.n == 0 {
		return 0
	}
	return h.sum / float64(h.n)
}

// Quantile returns the nearest-rank q-quantile (0 < q ≤ 1): the value at rank
// ceil(q·n). Exact below 256; above, the midpoint of its bucket clamped to
// the recorded extremes. 0 when empty.
func (h *Histogram) Quantile(q float64) uint64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q * float64(h.n))
	if float64(rank) < q*float64(h.n) {
		rank++
	}
	rank = max(1, min(rank, h.n))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bounds(i)
			v := lo + (hi-lo)/2
			return max(h.min, min(v, h.max))
		}
	}
	return h.max
}

// AtOrBelow returns how many recorded values are ≤ v (exact when v is a
// bucket's upper bound or below 256; otherwise the bucket holding v counts
// as below).
func (h *Histogram) AtOrBelow(v uint64) uint64 {
	last := index(v)
	var n uint64
	for i := 0; i < len(h.counts) && i <= last; i++ {
		n += h.counts[i]
	}
	return n
}

// Buckets calls f for every non-empty bucket in increasing order with its
// highest value (clamped to the largest value recorded) and its count.
func (h *Histogram) Buckets(f func(hi, count uint64)) {
	for i, c := range h.counts {
		if c > 0 {
			_, hi := bounds(i)
			f(min(hi, h.max), c)
		}
	}
}

// Point is one step of a cumulative distribution.
type Point struct {
	// Value is a bucket's upper bound (ns), Fraction the share of values
	// at or below it.
	Value    uint64
	Fraction float64
}

// CDF returns the cumulative distribution at every non-empty bucket, thinned
// to at most maxPoints points (the last point, fraction 1, always kept).
func (h *Histogram) CDF(maxPoints int) []Point {
	if h.n == 0 || maxPoints < 1 {
		return nil
	}
	var pts []Point
	var seen uint64
	for i, c := range h.counts {
		if c == 0 {
			continue
		}
		seen += c
		_, hi := bounds(i)
		pts = append(pts, Point{Value: min(hi, h.max), Fraction: float64(seen) / float64(h.n)})
	}
	if len(pts) <= maxPoints {
		return pts
	}
	out := make([]Point, 0, maxPoints)
	step := float64(len(pts)-1) / float64(maxPoints-1)
	for k := 0; k < maxPoints; k++ {
		out = append(out, pts[int(float64(k)*step+0.5)])
	}
	out[len(out)-1] = pts[len(pts)-1]
	return out
}
