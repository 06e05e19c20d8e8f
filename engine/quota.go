package engine

import (
	"fmt"
	"math"

	"github.com/gpu-arbiter/arbiter/sched"
)

// cycle duty-cycles a set of processes to cap their GPU-time share: in
// each QuotaPeriod they may run for share of it and are held off the GPU
// for the rest. Their share over any window of whole periods is then at
// most share (plus one preemption's latency per period).
type cycle struct {
	share float64
	off   bool
	gen   uint64
	label string
	// members returns the processes it applies to now.
	members func() []*proc
}

// quotaFor starts, changes or stops c's duty cycle after its plan changed.
func (e *Engine) quotaFor(c *class) {
	if c == nil {
		return
	}
	share := c.plan.MaxGPUShare
	switch {
	case share >= 1 && c.quota == nil:
		return
	case share >= 1:
		e.stopCycle(c.quota)
		c.quota = nil
		return
	case c.quota != nil && c.quota.share == share:
		return
	case c.quota != nil:
		e.stopCycle(c.quota)
	}
	c.quota = &cycle{share: share, label: "class " + c.name, members: func() []*proc { return e.membersOf(c) }}
	e.startCycle(c.quota)
}

// throttle applies the victim chooser's per-process caps until its next
// answer.
func (e *Engine) throttle(ts []Throttle) {
	want := map[uint32]float64{}
	for _, t := range ts {
		if t.MaxGPUShare < 1 && e.procs[t.PID] != nil {
			want[t.PID] = math.Max(t.MaxGPUShare, 0)
		}
	}
	for pid, cy := range e.throttles {
		if s, ok := want[pid]; !ok || s != cy.share {
			e.stopCycle(cy)
			delete(e.throttles, pid)
		}
	}
	for pid, share := range want {
		if e.throttles[pid] != nil {
			continue
		}
		if e.throttles == nil {
			e.throttles = map[uint32]*cycle{}
		}
		p := e.procs[pid]
		cy := &cycle{share: share, label: fmt.Sprintf("throttle of pid %d", pid), members: func() []*proc {
			if e.procs[p.key.PID] == p {
				return []*proc{p}
			}
			return nil
		}}
		e.throttles[pid] = cy
		e.startCycle(cy)
	}
}

func (e *Engine) membersOf(c *class) []*proc {
	var out []*proc
	for _, pid := range e.pids() {
		if p := e.procs[pid]; p.cls == c {
			out = append(out, p)
		}
	}
	return out
}

func (e *Engine) startCycle(cy *cycle) {
	cy.gen++
	e.tm.push(timer{at: e.now, kind: timerQuotaOn, cy: cy, gen: cy.gen})
}

// stopCycle ends a duty cycle and lets its members run.
func (e *Engine) stopCycle(cy *cycle) {
	cy.gen++
	if cy.off {
		cy.off = false
		e.holdCycle(cy, false)
	}
}

// phase runs at a duty cycle's phase boundary.
func (e *Engine) phase(t timer) {
	cy := t.cy
	if cy.gen != t.gen {
		return
	}
	period := uint64(e.opts.QuotaPeriod)
	on := uint64(cy.share * float64(period))
	if t.kind == timerQuotaOn && on == 0 {
		// A share of nothing: held for good, never let run for an instant.
		if !cy.off {
			cy.off = true
			e.holdCycle(cy, true)
		}
		e.tm.push(timer{at: t.at + period, kind: timerQuotaOn, cy: cy, gen: cy.gen})
		return
	}
	if t.kind == timerQuotaOn {
		if cy.off {
			cy.off = false
			e.holdCycle(cy, false)
		}
		if on >= period {
			return
		}
		e.tm.push(timer{at: t.at + on, kind: timerQuotaOff, cy: cy, gen: cy.gen})
		return
	}
	if !cy.off {
		cy.off = true
		e.holdCycle(cy, true)
	}
	e.tm.push(timer{at: t.at - on + period, kind: timerQuotaOn, cy: cy, gen: cy.gen})
}

// holdCycle holds (or releases) a cycle's members on all their GPUs.
func (e *Engine) holdCycle(cy *cycle, hold bool) {
	for _, p := range cy.members() {
		if p.level == sched.LevelObserve {
			continue // nothing the node can enforce on it; its limit says why
		}
		for _, g := range p.gpus {
			if hold {
				e.hold(p, g, holdQuota, nil)
			} else {
				e.unhold(p, g, holdQuota, cy.label+": within its share for this period")
			}
		}
	}
}
