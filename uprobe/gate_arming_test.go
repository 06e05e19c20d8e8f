// Tests with real eBPF of armed gates: the call that opens a request of an
// expedited process closes its victims' gates in its own probe, with no
// call from user space between the request and the stop.

package uprobe

import (
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/bpf"
)

// armedPair starts a training workload (the victim) and a serving
// exerciser (the latency-critical process), and returns tracer options
// for both with the request gap.
func armedPair(t *testing.T, gap time.Duration) (be uint32, lc *proc, o *Options) {
	t.Helper()
	r := newRig(t)
	be = startTrain(t, r)
	lc = r.start(t, nil, false, "serve")
	if l := lc.line(t); l != "ready" {
		t.Fatalf("exerciser said %q", l)
	}
	o = r.options()
	o.PIDs = []uint32{be, lc.pid}
	o.ExpediteGap = gap
	return be, lc, o
}

// expediteAndArm expedites lc and arms its requests to close victim's
// gate.
func expediteAndArm(t *testing.T, tr *Tracer, lc, victim uint32) {
	t.Helper()
	if err := tr.Expedite(lc, true); err != nil {
		t.Fatal(err)
	}
	if err := tr.Gate().Arm(lc, []uint32{victim}, false); err != nil {
		t.Fatal(err)
	}
}

// TestArmedRequestClosesGate: arming alone stops nothing; the launch that
// opens a request of the armed process stops its victim, a launch within
// the request does not close a gate Settle opened; Settle opens a gate
// Gate did not take over once it is older than the grace, and keeps one
// Gate took over; a launch-only arming ignores copies; disarming, and the
// process's exit, end it.
func TestArmedRequestClosesGate(t *testing.T) {
	// The gap must outlast the checks between a request's first launch
	// and "a launch within the request" (about 60 ms, a few hundred on a
	// loaded machine): a longer wait there would open a request.
	const gap = time.Second
	be, lc, o := armedPair(t, gap)
	tr := openTracer(t, o)
	log := logLaunches(tr, be)
	log.waitLaunchAfter(t, 0, "before arming")
	g := tr.Gate()
	call := func(what string) {
		lc.send(t, what+" 1")
		lc.line(t)
	}
	gated := func() []GatedProcess {
		t.Helper()
		l, err := g.Gated()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	settle := func(want int) {
		t.Helper()
		rel, _, err := g.Settle(0)
		if err != nil || len(rel) != want {
			t.Fatalf("Settle: %+v, %v; want %d released", rel, err, want)
		}
	}

	if err := tr.Expedite(lc.pid, true); err != nil {
		t.Fatal(err)
	}
	if err := g.Arm(lc.pid, []uint32{be, 999_999_999}, false); err != nil {
		t.Fatalf("arm with a victim that does not exist: %v", err)
	}
	var a bpf.CudaArmed
	if err := tr.objs.maps.GateArmed.Lookup(lc.pid, &a); err != nil || a.N != 1 || a.Victims[0].Tgid != be {
		t.Fatalf("armed entry %+v (%v): want the one victim that exists", a, err)
	}
	staysState(t, be, false, 200*time.Millisecond, "armed, no request")
	if l := gated(); len(l) != 0 {
		t.Fatalf("arming closed gates: %+v", l)
	}

	// The request's first launch stops the victim by itself.
	call("launch")
	waitState(t, be, true, "stopped by the armed request")
	if l := gated(); len(l) != 1 || l[0].PID != be || !l[0].Stopped {
		t.Fatalf("after the armed request: Gated() = %+v, want %d stopped", l, be)
	}
	if s := tr.Stats(); s.GateArmedCloses != 1 || s.GateSignals != 1 {
		t.Errorf("after one armed request: %d armed closes, %d signals; want 1 and 1", s.GateArmedCloses, s.GateSignals)
	}
	// The kernel noted when it closed the gate, and the probe that
	// stopped the victim kept it: a Settle with a grace longer than the
	// gate's age leaves it closed, for a request whose first call may
	// still be on its way.
	var entry bpf.CudaGateEntry
	if err := tr.objs.maps.LaunchGate.Lookup(be, &entry); err != nil || entry.ArmedAt == 0 || entry.Stopped != 1 {
		t.Fatalf("gate entry %+v (%v): want it marked closed by an armed request, and stopped", entry, err)
	}
	if rel, young, err := g.Settle(time.Hour); err != nil || len(rel) != 0 || young != 1 {
		t.Fatalf("Settle(1h) right after the request: %+v, %d young, %v; want nothing opened, 1 young", rel, young, err)
	}
	staysState(t, be, true, 50*time.Millisecond, "young, after Settle")
	// Nobody took it over: once older than the grace, Settle opens it.
	if rel, young, err := g.Settle(40 * time.Millisecond); err != nil || len(rel) != 1 || young != 0 {
		t.Fatalf("Settle(40ms) 50 ms after the request: %+v, %d young, %v; want it opened", rel, young, err)
	}
	waitState(t, be, false, "settled")
	// A launch within the request's gap opens no request.
	call("launch")
	staysState(t, be, false, 100*time.Millisecond, "a launch within the request")

	// The next request's gate, taken over by Gate, outlives Settle.
	time.Sleep(gap + 50*time.Millisecond)
	call("launch")
	waitState(t, be, true, "second request")
	if err := g.Gate(be); err != nil {
		t.Fatal(err)
	}
	settle(0)
	staysState(t, be, true, 100*time.Millisecond, "held through Gate, after Settle")
	if err := g.Ungate(be); err != nil {
		t.Fatal(err)
	}
	waitState(t, be, false, "ungated")

	// Launch-only: a copy opens the request but closes nothing; the
	// launch of the next request does.
	if err := g.Arm(lc.pid, []uint32{be}, true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(gap + 50*time.Millisecond)
	call("copy")
	staysState(t, be, false, 200*time.Millisecond, "launch-only arming, a copy")
	time.Sleep(gap + 50*time.Millisecond)
	call("launch")
	waitState(t, be, true, "launch-only arming, a launch")
	settle(1)
	waitState(t, be, false, "settled")

	// Disarmed: requests close nothing.
	if err := g.Arm(lc.pid, nil, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(gap + 50*time.Millisecond)
	call("launch")
	staysState(t, be, false, 200*time.Millisecond, "disarmed")
	if err := g.Arm(lc.pid, nil, false); err != nil {
		t.Fatalf("disarm twice: %v", err)
	}

	// The armed process's exit drops its arming.
	if err := g.Arm(lc.pid, []uint32{be}, false); err != nil {
		t.Fatal(err)
	}
	lc.send(t, "quit")
	lc.wait(t)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := tr.objs.maps.GateArmed.Lookup(lc.pid, &a); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the armed process exited; its arming is still there: %+v", a)
		}
	}
	if s := tr.Stats(); s.GateArmedCloses != 3 {
		t.Errorf("%d armed closes, want 3", s.GateArmedCloses)
	}
}

// TestCloseDisarmsBeforeReleasing: a tracer closed while a process is
// armed and its requests keep coming leaves no gate closed: Close disarms
// and waits for the probes before it opens every gate.
func TestCloseDisarmsBeforeReleasing(t *testing.T) {
	be, lc, o := armedPair(t, time.Microsecond) // every launch opens a request
	tr, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	logLaunches(tr, be).waitLaunchAfter(t, 0, "before arming")
	expediteAndArm(t, tr, lc.pid, be)
	// Requests keep closing the gate while Close runs.
	done := make(chan error, 1)
	go func() {
		for range 300 {
			if _, err := io.WriteString(lc.in, "launch 1\n"); err != nil {
				done <- err
				return
			}
			if _, err := lc.out.ReadString('\n'); err != nil {
				done <- err
				return
			}
			time.Sleep(500 * time.Microsecond)
		}
		done <- nil
	}()
	waitState(t, be, true, "stopped by an armed request")
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("exerciser: %v", err)
	}
	staysState(t, be, false, 300*time.Millisecond, "after Close")
}

// TestUngateForgetsExited: a process gated through Gate that exits (its
// entry dropped by the exit tracepoint) is no longer held once Ungate has
// run, so that Settle does not spare a later process with its pid.
func TestUngateForgetsExited(t *testing.T) {
	be, tr, _ := tracedTrain(t, "before gating")
	g := tr.Gate()
	if err := g.Gate(be); err != nil {
		t.Fatal(err)
	}
	waitState(t, be, true, "gated")
	p, err := os.FindProcess(int(be))
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Signal(syscall.SIGKILL)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if l, _ := g.Gated(); len(l) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the exit tracepoint did not drop the killed process's gate entry")
		}
	}
	if err := g.Ungate(be); err != nil {
		t.Fatal(err)
	}
	if _, held := g.held[be]; held {
		t.Errorf("pid %d still held after Ungate of the exited process", be)
	}
}

// TestArmedAge: the age of an armed closure from the kernel's truncated
// 1,024 ns units, across the 32-bit wrap and with the stamp's lowest bit
// a unit ahead of the clock.
func TestArmedAge(t *testing.T) {
	const unit = 1024
	for _, c := range []struct {
		now  int64
		at   uint32
		want time.Duration
	}{
		{now: 1000 * unit, at: 1000 | 1, want: 0}, // 1001: a unit ahead of the clock
		{now: 5000 * unit, at: 1001, want: 3999 * unit},
		{now: (1<<32 + 10) * unit, at: 1<<32 - 9, want: 19 * unit}, // across the wrap
		{now: (1<<33 + 2) * unit, at: 1, want: unit},               // 146 minutes on, it reads young once more
	} {
		if got := armedAge(c.now, c.at); got != c.want {
			t.Errorf("armedAge(%d, %d) = %v, want %v", c.now, c.at, got, c.want)
		}
	}
}
