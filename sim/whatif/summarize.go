package whatif

import (
	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/sim/hist"
	"github.com/gpu-arbiter/arbiter/sim/report"
	"github.com/gpu-arbiter/arbiter/sim/workload"
)

// summarize turns a run's statistics into a report baseline, with each LC
// workload's backlog at the end.
func summarize(st sim.Stats, cfg *Config, ws []workload.Workload, backlogs map[string]*backlog) *report.Baseline {
	secs := cfg.Duration.Seconds()
	end := uint64(cfg.Duration)
	b := &report.Baseline{Timeline: st.Timeline, PIDs: map[uint32]string{}}
	var busy uint64
	d := float64(cfg.Duration)
	for i, g := range st.GPUs {
		busy += g.Busy
		b.PreemptionsPerS += float64(g.Preemptions) / secs
		b.SwitchesPerS += float64(g.Switches) / secs
		b.PerGPU = append(b.PerGPU, report.GPU{Index: i, Utilization: float64(g.Busy) / d,
			SwitchShare: float64(g.SwitchTime) / d, PreemptShare: float64(g.PreemptTime) / d,
			PreemptionsPerS: float64(g.Preemptions) / secs, SwitchesPerS: float64(g.Switches) / secs})
	}
	b.GPUUtilization = float64(busy) / (float64(cfg.Duration) * float64(len(st.GPUs)))
	lcs := map[string]*lcGroup{}
	var lcOrder []string
	for i, p := range st.Procs {
		w := &ws[i]
		b.PIDs[p.PID] = p.Name
		b.Kernels.Submitted += p.KernelsSubmitted
		b.Kernels.Completed += p.KernelsCompleted
		b.Kernels.InFlight += p.KernelsInFlight
		if p.Class == sim.ClassLC {
			g := lcs[w.Group]
			if g == nil {
				g = &lcGroup{w: w, gpu: p.GPU}
				lcs[w.Group] = g
				lcOrder = append(lcOrder, w.Group)
			}
			g.lat.Merge(p.Latency)
			g.requests += p.Requests
			if p.RequestsBegun > p.Requests {
				g.inFlight++
				g.unserved = append(g.unserved, end-min(p.InServiceSince, end))
			}
			continue
		}
		// Throughput counts the work done, the partial progress of a
		// kernel still running at the end included: a short run of long
		// kernels would otherwise count none of it.
		b.BE = append(b.BE, report.BE{Name: p.Name, GPU: p.GPU, Class: p.Class.String(), Kernels: p.KernelsCompleted,
			Throughput: float64(p.GPUTime) / float64(cfg.Duration), Preempted: p.Preempted})
	}
	for _, name := range lcOrder {
		g := lcs[name]
		if bl := backlogs[name]; bl != nil {
			for _, at := range bl.waiting {
				g.waiting++
				g.unserved = append(g.unserved, end-min(at, end))
			}
			g.rejected = bl.rejected
		}
		b.LC = append(b.LC, g.result())
	}
	return b
}

// lcGroup gathers the replicas of one LC workload.
type lcGroup struct {
	w                  *workload.Workload
	gpu                int
	lat                hist.Histogram
	requests, inFlight uint64
	waiting, rejected  uint64
	// unserved holds the age at the end of every request in service or
	// waiting: a lower bound of its latency.
	unserved []uint64
}

// result counts every request that arrived. Unserved requests older than
// the SLO target and rejected ones count as SLO misses. Percentiles cover
// completed requests, unless requests were turned away, or requests left
// unserved longer than the SLO target (without one: than the completed
// requests' p99) are more than 1% of the arrivals or move the figures:
// then the row is flagged, and unserved requests count at their age at
// the end, so the percentiles are lower bounds.
func (g *lcGroup) result() report.LC {
	w := g.w
	l := report.LC{Name: w.Group, GPU: g.gpu, Class: sim.ClassLC.String(), Requests: g.requests, InFlight: g.inFlight,
		Waiting: g.waiting, Rejected: g.rejected, Arrived: g.requests + g.inFlight + g.waiting + g.rejected}
	var target uint64
	if w.SLO != nil {
		target = uint64(w.SLO.Target)
		l.SLOTargetNS = target
		l.SLOPercentile = w.SLO.Percentile
		if l.SLOPercentile == 0 {
			l.SLOPercentile = 99
		}
	}
	threshold := target
	if threshold == 0 {
		threshold = g.lat.Quantile(0.99)
	}
	var late uint64
	for _, age := range g.unserved {
		l.OldestUnservedNS = max(l.OldestUnservedNS, age)
		if age > threshold {
			late++
		}
	}
	// The unserved requests' ages are lower bounds of their latencies:
	// counted in, they move the figures where the backlog matters, and
	// only then are the figures shown as lower bounds. One request caught
	// in service at the end does not.
	h := &g.lat
	if late > 0 || g.rejected > 0 {
		all := &hist.Histogram{}
		all.Merge(&g.lat)
		for _, age := range g.unserved {
			all.Record(age)
		}
		arrived := float64(l.Arrived)
		if g.rejected > 0 || moved(&g.lat, all) || float64(len(g.unserved)) > 0.01*arrived {
			l.Backlog, l.LowerBound = true, true
			h = all
		}
	}
	l.MeanNS, l.P50NS, l.P99NS, l.P999NS, l.MaxNS = h.Mean(), h.Quantile(0.5), h.Quantile(0.99), h.Quantile(0.999), h.Max()
	l.CDF, l.Latency = h.CDF(200), h
	if l.CDF == nil {
		l.CDF = []hist.Point{}
	}
	if target > 0 {
		met := g.lat.AtOrBelow(target)
		l.UnservedLate = late
		if judged := g.lat.Count() + late + g.rejected; judged > 0 {
			l.Attainment = float64(met) / float64(judged)
			l.SLOMet = 100*l.Attainment >= l.SLOPercentile
			l.SLOJudged = judged
		}
	}
	return l
}

// moved reports whether counting the unserved requests (all) moves p50,
// p99 or p99.9 of the completed ones (done) by more than 1%, or the share
// within the completed p99 by more than 0.1 points.
func moved(done, all *hist.Histogram) bool {
	for _, q := range []float64{0.5, 0.99, 0.999} {
		a, b := float64(done.Quantile(q)), float64(all.Quantile(q))
		if b > a*1.01 {
			return true
		}
	}
	p99 := done.Quantile(0.99)
	within := func(h *hist.Histogram) float64 { return float64(h.AtOrBelow(p99)) / float64(max(h.Count(), 1)) }
	return within(done)-within(all) > 0.001
}

// compare fills in the ratios to the exclusive baseline.
func compare(b, excl *report.Baseline) {
	if excl == nil {
		return
	}
	div := func(a, b uint64) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	for i := range b.LC {
		for _, e := range excl.LC {
			if e.Name == b.LC[i].Name {
				b.LC[i].P50Ratio = div(b.LC[i].P50NS, e.P50NS)
				b.LC[i].P99Ratio = div(b.LC[i].P99NS, e.P99NS)
				b.LC[i].P999Ratio = div(b.LC[i].P999NS, e.P999NS)
			}
		}
	}
	for i := range b.BE {
		for _, e := range excl.BE {
			if e.Name == b.BE[i].Name && e.Throughput > 0 {
				f := b.BE[i].Throughput / e.Throughput
				b.BE[i].Fraction = &f
			}
		}
	}
}

// classify shows, for a baseline whose controller classified the
// processes, the class it gave each workload (the first replica's).
func classify(b *report.Baseline, procs []Process, cl Classifier) {
	class := map[string]string{}
	for _, p := range procs {
		if _, seen := class[p.Group]; seen {
			continue
		}
		if c, ok := cl.Class(p.PID); ok {
			class[p.Group] = c
		}
	}
	for i := range b.LC {
		if c, ok := class[b.LC[i].Name]; ok {
			b.LC[i].Class = c
		}
	}
	for i := range b.BE {
		if c, ok := class[b.BE[i].Name]; ok {
			b.BE[i].Class = c
		}
	}
}
