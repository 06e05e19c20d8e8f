package sim

import "math"

type gstate uint8

// Neither a save's end nor a switch's is an event, since nothing is
// decided there that could not be decided at its start. After a
// preemption the engine saves the kernel's context until saveEnd
// (saving), and the group that follows is chosen when the save begins,
// as at its end, and chosen again if anything that would change the
// choice happens before then. A context switch is part of gRun: the
// engine loads cur's context until since (switching), and runs it from
// then on; the run is planned from the switch's end when the switch
// begins, and planned again if anything that would change the plan
// happens during the switch.
const (
	gIdle gstate = iota
	gRun         // cur's context is loading (switching), then its head kernel is executing
)

// gpu is one GPU: a compute engine shared by its channel groups and two
// copy engines.
type gpu struct {
	s     *Simulator
	idx   int
	procs []*proc // in the order they were added

	// Time-sliced and priority modes.
	runlist    []*proc // channel groups, repeated by interleave level
	pos        int     // runlist entry of the last dispatch
	cur        *proc   // the group being switched in, running, or nil
	last       *proc   // whose context is loaded or loading (nil after a save)
	state      gstate
	since      uint64 // start of the state (of the accounting interval in gRun: the switch's end while switching)
	segStart   uint64 // start of the current timeline segment
	sliceStart uint64
	sliceEnd   uint64 // meaningful while contended
	contended  bool   // the scheduled decision includes a slice expiry
	drain      bool   // a preemption is pending: the kernel drains until drainEnd
	drainEnd   uint64
	src        int32 // event source of its decisions
	// The last save, [svStart, saveEnd), and the last switch, [swStart,
	// swEnd), until their time and timeline segments are recorded
	// (svPending, swPending): with the next segment, or when the end of
	// the run or an abort cuts them short. savePos is the runlist entry
	// of the last dispatch before the save, to choose again from.
	svStart, saveEnd uint64
	swStart, swEnd   uint64
	savePos          int
	svPending        bool
	swPending        bool

	// Spatial mode: every runnable group's kernel co-runs.
	running []*proc

	// prio is set under both priority modes; claims counts the LC
	// processes in a request (request-priority mode), during which BE
	// stays off the engine.
	prio   bool
	claims int

	// Which groups are runnable, as bit masks, kept as they change
	// (setReady), while the GPU has at most 64 groups and runlist entries
	// (masks): ready by group (proc.bit), readyEntries by runlist entry
	// (proc.entries); lc and lcEntries are the LC groups' bits. A
	// decision then finds a group without reading each one's state.
	masks               bool
	ready, readyEntries uint64
	lc, lcEntries       uint64

	copyQ   [2][]*proc
	copyCur [2]*proc
	copySrc [2]int32 // event sources of the copies in flight

	st GPUStats
}

func newGPU(s *Simulator, idx int) *gpu {
	g := &gpu{s: s, idx: idx, prio: s.cfg.mode == ModePriority || s.cfg.mode == ModeRequestPriority, masks: true}
	g.src = s.q.add(evGPU, int32(idx))
	for d := range g.copySrc {
		g.copySrc[d] = s.q.add(evCopy, int32(idx*2+d))
	}
	return g
}

// kick tells the GPU that p may have become runnable.
func (g *gpu) kick(p *proc, now uint64) {
	if !p.runnable() {
		return
	}
	if g.s.cfg.mode == ModeSpatial {
		g.spatialReplan(now)
		return
	}
	if g.saving(now) {
		g.chooseAfterSave()
		return
	}
	switch g.state {
	case gIdle:
		g.dispatch(now)
	case gRun:
		if p == g.cur || g.drain {
			return
		}
		if g.prio && p.class == ClassLC && g.cur.class == ClassBE {
			if g.switching(now) {
				g.abortSwitch(now)
				return
			}
			g.account(now)
			g.requestPreempt(now)
			return
		}
		if !g.contended {
			g.account(now)
			g.plan(now)
		}
	}
}

// switching reports whether cur's context is still loading at now.
func (g *gpu) switching(now uint64) bool {
	return g.state == gRun && now < g.since
}

// saving reports whether a preempted kernel's context is still being
// saved at now.
func (g *gpu) saving(now uint64) bool {
	return now < g.saveEnd
}

// chooseAfterSave chooses, as at the end of the save in progress, the
// group that follows it, undoing the choice made before, if any.
func (g *gpu) chooseAfterSave() {
	g.undoChoice()
	g.dispatch(g.saveEnd)
	if g.state == gIdle {
		// The engine decides again at the save's end, as it would
		// have: this replaces a decision planned for a group no longer
		// chosen.
		g.scheduleAt(g.saveEnd)
	}
}

// undoChoice forgets the group chosen to follow the save in progress.
func (g *gpu) undoChoice() {
	if g.cur != nil {
		g.st.Switches-- // the dispatch after a save always switches
		g.swPending = false
	}
	g.cur, g.last, g.pos, g.state = nil, nil, g.savePos, gIdle
}

// dispatch picks the next runnable group after the last dispatched runlist
// entry and switches it in.
func (g *gpu) dispatch(now uint64) {
	g.cur, g.state = nil, gIdle
	var i int
	if g.masks {
		i = g.nextMasked()
	} else {
		i = g.nextScan()
	}
	if i < 0 {
		return
	}
	p := g.runlist[i]
	g.pos, g.cur = i, p
	at := now
	if p != g.last {
		g.st.Switches++
		if sw := g.s.cfg.ctxSwitch; sw > 0 {
			g.swStart, g.swEnd, g.swPending = now, now+sw, true
			at = now + sw
		}
	}
	g.start(at)
}

// start begins running cur at at (the end of its switch, if any) with a
// fresh timeslice.
func (g *gpu) start(at uint64) {
	g.state, g.since, g.segStart, g.sliceStart = gRun, at, at, at
	g.last = g.cur
	g.plan(at)
}

// claim marks the start of an LC request under request-priority: a BE
// group on the engine is taken off it at once.
func (g *gpu) claim(now uint64) {
	g.claims++
	if g.saving(now) {
		g.chooseAfterSave()
		return
	}
	if g.cur == nil || g.cur.class != ClassBE {
		return
	}
	switch {
	case g.switching(now):
		g.abortSwitch(now)
	case g.state == gRun:
		g.account(now)
		if !g.drain {
			g.requestPreempt(now)
		}
	}
}

// release marks the end of an LC request under request-priority. A
// dispatch is scheduled rather than done here, so that the same server's
// next request, begun at the same instant, keeps BE off without a wasted
// switch.
func (g *gpu) release(now uint64) {
	g.claims--
	if g.saving(now) {
		g.chooseAfterSave()
		return
	}
	if g.claims == 0 && g.state == gIdle {
		g.scheduleAt(now)
	}
}

// abortSwitch abandons switching in cur (the time spent is lost).
func (g *gpu) abortSwitch(now uint64) {
	g.cutSwitch(now)
	g.last = nil
	g.dispatch(now)
}

// cutSwitch records the switch in progress as ending at now.
func (g *gpu) cutSwitch(now uint64) {
	g.swEnd = now
	g.flushSave()
	g.flushSwitch()
}

// plan schedules the next decision while running: the end of the head run
// (the kernels before the stream's next copy; nothing needs deciding
// between them, see account), the kernel's end while draining, or the
// timeslice's end if someone else is waiting.
func (g *gpu) plan(now uint64) {
	// While switching, the run is planned from the switch's end.
	now = max(now, g.since)
	p := g.cur
	t := now + p.runLeft
	g.contended = false
	if g.drain {
		t = min(now+g.toKernelEnd(p), g.drainEnd)
	} else if g.othersWaiting(p) {
		g.contended = true
		// The end of the slice now is in: nearly always the first, and
		// then without a division.
		ts := p.timeslice
		if d := now - g.sliceStart; d < ts {
			g.sliceEnd = g.sliceStart + ts
		} else {
			g.sliceEnd = g.sliceStart + ts*(d/ts+1)
		}
		t = min(t, g.sliceEnd)
	}
	g.scheduleAt(t)
}

func (g *gpu) scheduleAt(t uint64) {
	g.s.schedule(g.src, t)
}

// account charges the running kernels for the time since the last
// account. Kernels of the head run that ended before now are completed on
// the way (their completions change nothing another process could see:
// the next one is a kernel of the same stream); the last one to end is
// left at the head with no work left, for onEvent to complete.
func (g *gpu) account(now uint64) {
	if g.state != gRun || now <= g.since {
		return
	}
	el := now - g.since
	g.since = now
	p := g.cur
	for {
		h := p.head()
		w := min(el, h.left)
		h.left -= w
		p.runLeft -= w
		p.st.GPUTime += w
		g.st.Busy += w
		el -= w
		if el == 0 || h.left > 0 || g.drain || !p.nextIsKernel() {
			return
		}
		g.complete(p, now)
	}
}

// onEvent is a decision point of the compute engine.
func (g *gpu) onEvent(now uint64) {
	if g.s.cfg.mode == ModeSpatial {
		g.spatialReplan(now)
		return
	}
	switch g.state {
	case gIdle:
		if g.saving(now) {
			g.chooseAfterSave()
			return
		}
		g.dispatch(now)
	case gRun:
		g.account(now)
		p := g.cur
		if p.head().left == 0 {
			g.complete(p, now)
			if g.drain || !p.runnable() || (g.contended && now >= g.sliceEnd && g.othersWaiting(p)) {
				g.drain = false
				g.leave(now)
				g.dispatch(now)
				return
			}
			g.plan(now)
			return
		}
		if g.drain {
			// The drain ended: at the end of the kernel in flight (a
			// switch without a save) or at the block drain's limit.
			g.drain = false
			if g.atBoundary(p) {
				g.leave(now)
				g.dispatch(now)
				return
			}
			g.beginPreempt(now)
			return
		}
		if g.othersWaiting(p) {
			g.requestPreempt(now)
			return
		}
		g.plan(now)
	}
}

// toKernelEnd is the work left in p's kernel in flight.
func (g *gpu) toKernelEnd(p *proc) uint64 {
	it := p.head()
	w := it.toKernelEnd()
	g.s.checkBurst(p, it)
	return w
}

// atBoundary reports whether no kernel of p's head item is part way.
func (g *gpu) atBoundary(p *proc) bool {
	it := p.head()
	b := it.atBoundary()
	g.s.checkBurst(p, it)
	return b
}

// complete retires p's head kernel (or burst).
func (g *gpu) complete(p *proc, now uint64) {
	h := &p.q[p.qh]
	p.st.KernelsCompleted += uint64(h.n)
	p.st.CompletedWork += h.dur
	g.s.popHead(p, now)
}

// leave ends cur's run segment; the engine becomes idle.
func (g *gpu) leave(now uint64) {
	g.segment(SegmentRun, g.cur, now)
	g.cur, g.state = nil, gIdle
}

// requestPreempt takes cur off the engine at the modelled granularity;
// between two kernels it switches without a save.
func (g *gpu) requestPreempt(now uint64) {
	if g.atBoundary(g.cur) {
		g.leave(now)
		g.dispatch(now)
		return
	}
	switch g.s.cfg.granularity {
	case GranularityInstruction:
		g.beginPreempt(now)
		return
	case GranularityBlock:
		g.drainEnd = now + g.s.cfg.blockDrain
	default:
		g.drainEnd = math.MaxUint64
	}
	g.drain = true
	g.plan(now)
}

// beginPreempt saves cur's kernel in flight and frees the engine.
func (g *gpu) beginPreempt(now uint64) {
	p := g.cur
	g.segment(SegmentRun, p, now)
	g.st.Preemptions++
	p.st.Preempted++
	g.cur, g.last = nil, nil
	if g.s.cfg.preempt == 0 {
		g.dispatch(now)
		return
	}
	g.svStart, g.saveEnd, g.svPending, g.savePos = now, now+g.s.cfg.preempt, true, g.pos
	g.chooseAfterSave()
}

// suspend takes p off the runlist (Enforcer.Suspend).
func (g *gpu) suspend(p *proc, now uint64) {
	if p.suspended {
		return
	}
	p.suspended = true
	g.setReady(p)
	if g.s.cfg.mode == ModeSpatial {
		g.spatialReplan(now)
		return
	}
	if g.saving(now) {
		g.chooseAfterSave()
		return
	}
	if g.cur != p {
		if g.state == gRun && g.contended && !g.othersWaiting(g.cur) {
			g.account(now)
			g.plan(now)
		}
		return
	}
	switch {
	case g.switching(now):
		g.abortSwitch(now)
	case g.state == gRun:
		g.account(now)
		if !g.drain {
			g.requestPreempt(now)
		}
	}
}

// resume puts p back on the runlist (Enforcer.Resume).
func (g *gpu) resume(p *proc, now uint64) {
	if !p.suspended {
		return
	}
	p.suspended = false
	g.setReady(p)
	g.kick(p, now)
}

// settle closes the accounts at the end of the run.
func (g *gpu) settle(now uint64) {
	if g.s.cfg.mode == ModeSpatial {
		g.spatialAdvance(now)
		for _, p := range g.running {
			g.record(SegmentRun, p, p.coSince, now)
		}
		return
	}
	switch {
	case g.saving(now):
		g.undoChoice()
		g.saveEnd = now
		g.flushSave()
	case g.switching(now):
		g.cutSwitch(now)
	case g.state == gRun:
		g.account(now)
		g.segment(SegmentRun, g.cur, now)
	default:
		g.flushSave() // idle since a save, nothing recorded after it
	}
}

// segment records [segStart, now) in the timeline if it falls in the
// window, after the save and the switch before it.
func (g *gpu) segment(kind SegmentKind, p *proc, now uint64) {
	g.flushSave()
	g.flushSwitch()
	g.record(kind, p, g.segStart, now)
}

// flushSave records the last save's time and timeline segment, if not yet
// recorded.
func (g *gpu) flushSave() {
	if g.svPending {
		g.svPending = false
		g.st.PreemptTime += g.saveEnd - g.svStart
		g.record(SegmentPreempt, nil, g.svStart, g.saveEnd)
	}
}

// flushSwitch records the last switch's time and timeline segment (cur
// was switched in), if not yet recorded.
func (g *gpu) flushSwitch() {
	if g.swPending {
		g.swPending = false
		g.st.SwitchTime += g.swEnd - g.swStart
		g.record(SegmentSwitch, g.cur, g.swStart, g.swEnd)
	}
}

// record adds [start, end) to the timeline if it falls in the window.
func (g *gpu) record(kind SegmentKind, p *proc, start, end uint64) {
	s := g.s
	if start >= s.cfg.window || end <= start {
		return
	}
	if len(s.timeline) >= s.cfg.maxSegments {
		s.dropped++
		return
	}
	var pid uint32
	if p != nil {
		pid = p.pid
	}
	s.timeline = append(s.timeline, Segment{GPU: g.idx, PID: pid, Kind: kind, Start: start, End: min(end, s.cfg.window)})
}
