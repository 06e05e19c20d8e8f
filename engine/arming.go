package engine

import (
	"fmt"
	"slices"

	"github.com/gpu-arbiter/arbiter/sched"
)

// Armer is implemented by gaters that can close gates ahead of the engine.
// A gate closed by the engine takes effect once the call that opens a
// latency-critical request has reached it: hundreds of microseconds on a
// live node, in which a best-effort process may submit one more kernel
// that the request then waits for. An armed gate closes in the kernel, at
// that very call, in the latency-critical process's own probe.
//
// The engine arms, for each latency-critical process whose requests
// preempt, the gate-level victims it would hold on the process's GPUs,
// and keeps the arming current as plans, victims and escalation change.
// It owns what the kernel closes: it holds the victims for the request as
// it would have (Gate finds them closed) and opens them at its end, and
// Settle opens whatever it did not take over, at each request's end and
// at each control tick.
type Armer interface {
	// Arm sets the processes whose gates close at the call that opens
	// each request of lc: its first launch or copy, or with launchOnly
	// its first launch. No victims disarms lc. An error means the arming
	// may be incomplete and says why; it costs only how soon victims
	// stop, never their release.
	Arm(lc uint32, victims []uint32, launchOnly bool) error
	// Settle opens every gate an armed request closed that Gate did not
	// take over since, but for those closed too recently to tell (unless
	// all is set, as when the engine stops): their request's first call
	// may still be on its way to the engine, which takes them over when
	// it sees it. pending says some were left closed so; the engine
	// settles again at its next control tick.
	Settle(all bool) (pending bool, err error)
}

// arm brings the arming of every latency-critical process up to date: its
// GPUs' gate-level victims while its requests preempt, none otherwise.
func (e *Engine) arm() {
	a, ok := e.enf.(Armer)
	if !ok {
		e.armStale = false
		return
	}
	for _, pid := range e.pids() {
		p := e.procs[pid]
		var want []uint32
		if p.plan.LatencyCritical && e.escalated(p) {
			for _, g := range p.gpus {
				for _, v := range e.victims(e.gpu(g)) {
					if v.level == sched.LevelGate && !slices.Contains(want, v.key.PID) {
						want = append(want, v.key.PID)
					}
				}
			}
			slices.Sort(want)
		}
		launchOnly := len(want) > 0 && !p.plan.PrePreemptionHint
		if slices.Equal(want, p.armed) && launchOnly == p.armedLaunchOnly {
			continue
		}
		e.setArmed(a, p, want, launchOnly)
	}
	e.armStale = false
}

// setArmed arms p's requests to close victims' gates (none: disarm).
func (e *Engine) setArmed(a Armer, p *proc, victims []uint32, launchOnly bool) {
	if len(p.armed) > 0 {
		e.armed--
	}
	if len(victims) > 0 {
		e.armed++
	} else {
		// What the old arming closed and no request holds is opened at
		// the next settle.
		e.settlePending = true
	}
	p.armed, p.armedLaunchOnly = victims, launchOnly
	e.st.Arms++
	reason := "no gate armed for its requests"
	if len(victims) > 0 {
		first := "call"
		if launchOnly {
			first = "launch"
		}
		reason = fmt.Sprintf("its requests' first %s closes the gates of pids %v in the kernel", first, victims)
	}
	e.recordEnforce(p, -1, ActionArm, reason, a.Arm(p.key.PID, victims, launchOnly))
}

// disarmAll disarms every latency-critical process.
func (e *Engine) disarmAll() {
	a, ok := e.enf.(Armer)
	if !ok {
		return
	}
	for _, p := range e.procs {
		if len(p.armed) > 0 {
			e.setArmed(a, p, nil, false)
		}
	}
}

// settle opens the gates armed requests closed that the engine does not
// hold, where anything is or was armed (with all, even those closed too
// recently to tell whether the engine is about to take them over).
func (e *Engine) settle(all bool) {
	a, ok := e.enf.(Armer)
	if !ok || (e.armed == 0 && !e.settlePending) {
		return
	}
	pending, err := a.Settle(all)
	e.settlePending = pending
	if err != nil {
		e.st.EnforceErrors++
		e.record(Decision{GPU: -1, Action: ActionUngate, Reason: "open gates closed by armed requests and not held", Err: err.Error()})
	}
}
