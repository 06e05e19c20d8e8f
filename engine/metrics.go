package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// LatencyHistogram is a class's request-latency distribution in the
// Prometheus histogram form: cumulative counts at fixed upper bounds.
type LatencyHistogram struct {
	// Bounds are the buckets' upper bounds in seconds, ascending; Counts
	// the requests at or below each bound (cumulative), Count every
	// request and Sum their latencies in seconds.
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    float64
	// Within counts the requests that met the class's latency target
	// (over all time; zero without an SLO): with Count it gives an SLO's
	// error ratio over any range a metrics system chooses.
	Within uint64
}

// LatencyHistograms returns every class's request-latency histogram at
// the given upper bounds (seconds, ascending). The distributions belong to
// the engine's goroutine, so the copy is made there (Post) and this call
// waits for it until ctx is done: call it while Run is running, with a
// deadline.
func (e *Engine) LatencyHistograms(ctx context.Context, bounds []float64) (map[string]LatencyHistogram, error) {
	if !slices.IsSorted(bounds) {
		return nil, errors.New("engine: latency histogram bounds must ascend")
	}
	bounds = slices.Clone(bounds)
	out := make(chan map[string]LatencyHistogram, 1)
	e.Post(func(e *Engine) {
		m := make(map[string]LatencyHistogram, len(e.cls))
		for name, c := range e.cls {
			m[name] = c.stats.histogram(bounds)
		}
		out <- m
	})
	select {
	case m := <-out:
		return m, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("engine: latency histograms: the engine loop did not answer: %w", ctx.Err())
	}
}

// histogram folds l's distribution into cumulative counts at bounds.
func (l *latency) histogram(bounds []float64) LatencyHistogram {
	h := LatencyHistogram{Bounds: bounds, Counts: make([]uint64, len(bounds)), Count: l.total, Within: l.within}
	if l.hist == nil || l.total == 0 {
		return h
	}
	h.Sum = l.hist.Mean() * float64(l.hist.TotalCount()) / 1e6
	for _, bar := range l.hist.Distribution() {
		if bar.Count == 0 {
			continue
		}
		// A bar holds values equal to its lowest within the histogram's
		// precision (2 significant digits): it counts at every bound at
		// or above that value.
		if i, _ := slices.BinarySearch(bounds, float64(bar.From)/1e6); i < len(bounds) {
			h.Counts[i] += uint64(bar.Count)
		}
	}
	for i := 1; i < len(h.Counts); i++ {
		h.Counts[i] += h.Counts[i-1]
	}
	return h
}
