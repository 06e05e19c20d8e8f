package sim

import (
	"math/bits"

	"github.com/gpu-arbiter/arbiter/sched"
)

// A GPU's runlist: its channel groups laid out by interleave level, which
// of them are runnable, and which one the engine takes next.

// entries is how many runlist slots an interleave level gets.
func entries(l sched.Interleave) int {
	switch l {
	case sched.InterleaveHigh:
		return 4
	case sched.InterleaveMedium:
		return 2
	}
	return 1
}

// addProc puts p's channel group on the GPU and lays out the runlist
// again.
func (g *gpu) addProc(p *proc) {
	g.procs = append(g.procs, p)
	g.buildRunlist()
}

// maxMasked is the most groups, and runlist entries, the masks cover.
const maxMasked = 64

// buildMasks sets each group's bits and the masks from the groups'
// states, after the runlist was laid out.
func (g *gpu) buildMasks() {
	g.masks = len(g.procs) <= maxMasked && len(g.runlist) <= maxMasked
	g.ready, g.readyEntries, g.lc, g.lcEntries = 0, 0, 0, 0
	if !g.masks {
		return
	}
	for i, p := range g.procs {
		p.bit, p.entries = 1<<i, 0
	}
	for i, p := range g.runlist {
		p.entries |= 1 << i
	}
	for _, p := range g.procs {
		if p.class == ClassLC {
			g.lc |= p.bit
			g.lcEntries |= p.entries
		}
		g.setReady(p)
	}
	for _, p := range g.procs {
		p.rivals = 0
		for _, q := range g.procs {
			if q != p && g.eligibleOver(q, p) {
				p.rivals |= q.bit
			}
		}
	}
}

// setReady records in the masks whether p is runnable, after its state
// changed.
func (g *gpu) setReady(p *proc) {
	if p.runnable() {
		g.ready |= p.bit
		g.readyEntries |= p.entries
	} else {
		g.ready &^= p.bit
		g.readyEntries &^= p.entries
	}
}

// buildRunlist lays out the runlist with smooth weighted round-robin, so a
// group with more slots is spread evenly between the others; the layout
// depends only on the order processes were added and their levels.
func (g *gpu) buildRunlist() {
	total := 0
	for _, p := range g.procs {
		total += entries(p.interleave)
	}
	credit := make([]int, len(g.procs))
	g.runlist = g.runlist[:0]
	for range total {
		best := -1
		for i, p := range g.procs {
			credit[i] += entries(p.interleave)
			if best < 0 || credit[i] > credit[best] {
				best = i
			}
		}
		credit[best] -= total
		g.runlist = append(g.runlist, g.procs[best])
	}
	g.pos = len(g.runlist) - 1 // the first dispatch starts at entry 0
	if g.cur != nil {
		for i, p := range g.runlist {
			if p == g.cur {
				g.pos = i
				break
			}
		}
	}
	g.buildMasks()
}

// relayout lays out the runlist again after a group's level changed at
// now. A save in progress chooses the group after it again, from the
// runlist's start, as the engine does with no group chosen.
func (g *gpu) relayout(now uint64) {
	g.buildRunlist()
	if g.saving(now) {
		g.savePos = len(g.runlist) - 1
		g.chooseAfterSave()
	}
}

// eligibleOver reports whether q may take the engine from p under the mode.
func (g *gpu) eligibleOver(q, p *proc) bool {
	if g.prio && p.class == ClassLC {
		return q.class == ClassLC
	}
	return true
}

// othersWaiting reports whether another group is runnable and may take the
// engine from p.
func (g *gpu) othersWaiting(p *proc) bool {
	if g.masks {
		return g.othersMasked(p)
	}
	return g.othersScan(p)
}

// othersMasked is othersWaiting from the masks: small enough, with the
// groups that may take the engine from p kept in p.rivals, for
// othersWaiting to take it in.
func (g *gpu) othersMasked(p *proc) bool { return g.ready&p.rivals != 0 }

// othersScan is othersWaiting from each group's state.
func (g *gpu) othersScan(p *proc) bool {
	for _, q := range g.procs {
		if q != p && q.runnable() && g.eligibleOver(q, p) {
			return true
		}
	}
	return false
}

// nextMasked returns the runlist entry dispatch takes: the first after
// the last dispatched whose group is runnable (only LC groups while one
// is runnable under priority, or a request claims the engine), wrapping;
// -1 if none is. From the masks; nextScan is the same from each entry's
// group's state.
func (g *gpu) nextMasked() int {
	cand := g.readyEntries
	if g.claims > 0 || (g.prio && g.ready&g.lc != 0) {
		cand &= g.lcEntries
	}
	// The first candidate after pos (a shift by 64 leaves none), else
	// the first one from the start.
	if after := cand & (^uint64(0) << (g.pos + 1)); after != 0 {
		return bits.TrailingZeros64(after)
	}
	if cand != 0 {
		return bits.TrailingZeros64(cand)
	}
	return -1
}

// nextScan is nextMasked from each runlist entry's group's state.
func (g *gpu) nextScan() int {
	lcOnly := g.claims > 0
	if g.prio && !lcOnly {
		for _, q := range g.procs {
			if q.class == ClassLC && q.runnable() {
				lcOnly = true
				break
			}
		}
	}
	n := len(g.runlist)
	i := g.pos
	for range n {
		// The next entry, wrapping (not i % n: a division per entry).
		if i++; i == n {
			i = 0
		}
		if p := g.runlist[i]; p.runnable() && (!lcOnly || p.class == ClassLC) {
			return i
		}
	}
	return -1
}
