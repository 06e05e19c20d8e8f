package report

import (
	"math"
	"strconv"
)

// unit is the time unit of an axis: every label on one axis uses it.
type unit struct {
	name string
	ns   float64
}

// unitFor picks the largest unit in which the axis's top value is at
// least 1, so labels read 0.5, 1, 2, 5, 10, 20 … in it.
func unitFor(topNS float64) unit {
	switch {
	case topNS >= 1e9:
		return unit{"s", 1e9}
	case topNS >= 1e6:
		return unit{"ms", 1e6}
	case topNS >= 1e3:
		return unit{"µs", 1e3}
	}
	return unit{"ns", 1}
}

// label formats a value in ns in the unit, without the unit's name.
func (u unit) label(ns float64) string {
	v := ns / u.ns
	// Values on a 1-2-5 grid have at most a few significant digits.
	return strconv.FormatFloat(math.Round(v*1e6)/1e6, 'g', 6, 64)
}

// steps125 are the mantissas of a 1-2-5 grid.
var steps125 = []float64{1, 2, 5}

// floor125 is the largest value of the 1-2-5 grid at or below v > 0.
func floor125(v float64) float64 {
	e := math.Floor(math.Log10(v))
	best := math.Pow(10, e-1) * 5
	for _, m := range steps125 {
		if g := m * math.Pow(10, e); g <= v*(1+1e-9) {
			best = g
		}
	}
	return best
}

// ceil125 is the smallest value of the 1-2-5 grid at or above v > 0.
func ceil125(v float64) float64 {
	e := math.Floor(math.Log10(v))
	for _, m := range steps125 {
		if g := m * math.Pow(10, e); g >= v*(1-1e-9) {
			return g
		}
	}
	return math.Pow(10, e+1)
}

// logTicks ranges a logarithmic axis to the data, [lo, hi] with lo > 0,
// widened to the enclosing 1-2-5 values, and lists the 1-2-5 values in
// it (only the powers of ten when there would be more than 12).
func logTicks(lo, hi float64) (from, to float64, ticks []float64) {
	from, to = floor125(lo), ceil125(max(hi, lo))
	if to <= from {
		to = ceil125(from * 1.5)
	}
	for e := math.Floor(math.Log10(from)); ; e++ {
		for _, m := range steps125 {
			v := m * math.Pow(10, e)
			if v > to*(1+1e-9) {
				if len(ticks) > 12 {
					return from, to, decades(ticks)
				}
				return from, to, ticks
			}
			if v >= from*(1-1e-9) {
				ticks = append(ticks, v)
			}
		}
	}
}

// decades keeps the powers of ten (and the ends) of a 1-2-5 tick list.
func decades(ticks []float64) []float64 {
	var out []float64
	for i, v := range ticks {
		m := v / math.Pow(10, math.Floor(math.Log10(v)+1e-9))
		if math.Abs(m-1) < 1e-6 || i == 0 || i == len(ticks)-1 {
			out = append(out, v)
		}
	}
	return out
}

// linTicks divides [0, hi] by the smallest 1-2-5 step that needs at most
// n steps.
func linTicks(hi float64, n int) []float64 {
	step := ceil125(hi / float64(n))
	var ticks []float64
	for i := 0; float64(i)*step <= hi*(1+1e-9); i++ {
		ticks = append(ticks, float64(i)*step)
	}
	return ticks
}
