package sim

import "math"

// Spatial sharing (ModeSpatial, the mps baseline): the head kernels of
// every runnable group on a GPU co-run, each slowed by the others.

// spatialAdvance progresses every co-running kernel to now.
func (g *gpu) spatialAdvance(now uint64) {
	k := len(g.running)
	if now <= g.since {
		return
	}
	el := now - g.since
	g.since = now
	if k == 0 {
		return
	}
	g.st.Busy += el
	work := uint64(math.Round(float64(el) / (1 + g.s.cfg.slowdown*float64(k-1))))
	for _, p := range g.running {
		// As in account: kernels of the head run that ended on the way are
		// completed, the last one is left for spatialReplan.
		w := work
		for {
			h := p.head()
			x := min(w, h.left)
			h.left -= x
			p.runLeft -= x
			p.st.GPUTime += x
			w -= x
			if w == 0 || h.left > 0 || !p.nextIsKernel() {
				break
			}
			g.complete(p, now)
		}
	}
}

// spatialReplan completes finished kernels, recomputes the co-running set
// and schedules the next change to it: the end of the first head run to
// finish.
func (g *gpu) spatialReplan(now uint64) {
	g.spatialAdvance(now)
	for _, p := range g.running {
		if !p.empty() && p.head().kind == OpKernel && p.head().left == 0 {
			g.complete(p, now)
		}
	}
	for _, p := range g.running {
		if !p.runnable() {
			g.record(SegmentRun, p, p.coSince, now)
			p.coRunning = false
		}
	}
	g.running = g.running[:0]
	for _, p := range g.procs {
		if p.runnable() {
			if !p.coRunning {
				p.coRunning, p.coSince = true, now
			}
			g.running = append(g.running, p)
		}
	}
	if len(g.running) == 0 {
		return
	}
	rate := 1 / (1 + g.s.cfg.slowdown*float64(len(g.running)-1))
	next := uint64(math.MaxUint64)
	for _, p := range g.running {
		next = min(next, uint64(math.Ceil(float64(p.runLeft)/rate)))
	}
	g.scheduleAt(now + max(next, 1))
}
