package engine

// Expediter is implemented by enforcers whose event source can deliver a
// process's events sooner than at its own pace. The live tracer hands
// events over when its reader polls (about every 10 ms) unless a probe
// wakes it, and a latency-critical request is preempted for only once its
// first call reaches the engine: a late first call lets best-effort work
// run beside most of the request. The engine therefore expedites every
// process it plans as latency-critical, from its classification until a
// new plan says otherwise or the process leaves the table.
type Expediter interface {
	// Expedite asks for the calls that open pid's requests to reach the
	// engine at once (on), or at the source's own pace again (off).
	// Either is idempotent; turning off a pid that is not expedited is a
	// no-op. An error means nothing changed and says why.
	Expedite(pid uint32, on bool) error
}

// expedite turns the expediting of p's calls on or off. A failure costs
// only how soon its events arrive: it is recorded, and the next
// classification tries again.
func (e *Engine) expedite(p *proc, on bool) {
	x, ok := e.enf.(Expediter)
	if !ok {
		return
	}
	if err := x.Expedite(p.key.PID, on); err != nil {
		what := "deliver the first call of each of its requests at once"
		if !on {
			what = "stop expediting its calls"
		}
		e.recordEnforce(p, -1, ActionClassify, what, err)
	}
}
