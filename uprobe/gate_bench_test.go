package uprobe

import (
	"slices"
	"testing"
)

// BenchmarkGateCost measures what the launch gate adds to the launch probe
// of a process that is not gated (one hash lookup that misses), in one
// serving process and one run: the per-call time of cuLaunchKernel
// unprobed, with the launch probe built without the gate, and with it.
// It reports gate/no-gate, both net of the unprobed time, and the
// difference in ns.
func BenchmarkGateCost(b *testing.B) {
	r := newRig(b)
	p := r.start(b, nil, false, "serve")
	if l := p.line(b); l != "ready" {
		b.Fatalf("exerciser said %q", l)
	}
	const n, reps, rounds = 1000, 9, 5
	with := func(noGate bool) float64 {
		tr, stop := tracing(b, r, p.pid, func(o *Options) { o.noGate = noGate })
		v := p.bestPerCall(b, n, reps)
		if s := tr.Stats(); s.Drops != 0 || s.GateSignals != 0 {
			b.Errorf("%d drops, %d gate signals", s.Drops, s.GateSignals)
		}
		stop()
		return v
	}
	// Interleaved rounds, each configuration's best: load from other work
	// on the machine falls on all alike and only ever adds time.
	var base, noGate, gate []float64
	b.ResetTimer()
	for range rounds {
		base = append(base, p.bestPerCall(b, n, reps))
		noGate = append(noGate, with(true))
		gate = append(gate, with(false))
	}
	b.StopTimer()
	bl, nl, gl := slices.Min(base), slices.Min(noGate), slices.Min(gate)
	b.ReportMetric(bl, "unprobed-ns/call")
	b.ReportMetric(nl, "probe-ns/call")
	b.ReportMetric(gl, "probe+gate-ns/call")
	b.ReportMetric((gl-bl)/(nl-bl), "gate/no-gate")
	b.ReportMetric(gl-nl, "gate-ns")
	b.Logf("launch ns/call: unprobed %.0f, probe without gate %.0f, probe with gate %.0f", bl, nl, gl)
}

// BenchmarkGateRoundTrip measures what the engine's loop pays to hold one
// gate-level victim for a request: Gate then Ungate of a running process
// that launches nothing meanwhile (so that nothing is stopped), as the
// daemon calls them, through a tracer with the process's launch probes
// attached.
func BenchmarkGateRoundTrip(b *testing.B) {
	r := newRig(b)
	p := r.start(b, nil, false, "serve")
	if l := p.line(b); l != "ready" {
		b.Fatalf("exerciser said %q", l)
	}
	r.expose(b, int(p.pid))
	o := r.options()
	o.PIDs = []uint32{p.pid}
	tr, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	wait := drain(tr)
	defer func() {
		if err := tr.Close(); err != nil {
			b.Error(err)
		}
		wait()
	}()
	g := tr.Gate()
	b.ResetTimer()
	for range b.N {
		if err := g.Gate(p.pid); err != nil {
			b.Fatal(err)
		}
		if err := g.Ungate(p.pid); err != nil {
			b.Fatal(err)
		}
	}
}
