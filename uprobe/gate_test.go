// Tests with real eBPF of the launch gate: stub-driver workloads stopped
// by their own launch probe and continued, and the cases where a process
// must not be touched.

package uprobe

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/bpf"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/trace"
)

// startTrain runs the stub training workload (back-to-back launches of
// 200 µs kernels) for up to a minute, exposed to the rig's discovery, and
// kills it at the end of the test.
func startTrain(t *testing.T, r *rig) uint32 {
	t.Helper()
	cmd := exec.Command(r.stub.Train, "--kernel-us", "200", "--sync-every", "5", "--duration", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies only when continued
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	pid := uint32(cmd.Process.Pid)
	r.expose(t, int(pid))
	return pid
}

// tracedTrain starts the stub training workload (startTrain) on a rig of
// its own, traces it alone, and waits for a launch of it (waiting, for the
// failure message) before returning.
func tracedTrain(t *testing.T, waiting string) (uint32, *Tracer, *launchLog) {
	t.Helper()
	r := newRig(t)
	pid := startTrain(t, r)
	o := r.options()
	o.PIDs = []uint32{pid}
	tr := openTracer(t, o)
	log := logLaunches(tr, pid)
	log.waitLaunchAfter(t, 0, waiting)
	return pid, tr, log
}

// launchLog records the times of one process's launch events.
type launchLog struct {
	mu    sync.Mutex
	times []uint64
}

// logLaunches reads tr's events until the tracer closes, keeping pid's
// launch times.
func logLaunches(tr *Tracer, pid uint32) *launchLog {
	l := &launchLog{}
	go func() {
		var ev trace.Event
		for tr.Read(&ev) == nil {
			if ev.PID == pid && ev.Kind == trace.KindLaunch {
				l.mu.Lock()
				l.times = append(l.times, ev.Time)
				l.mu.Unlock()
			}
		}
	}()
	return l
}

// between counts the launches made after from and before to (monotonic ns).
func (l *launchLog) between(from, to uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, tm := range l.times {
		if tm > from && tm < to {
			n++
		}
	}
	return n
}

// waitLaunchAfter waits up to 10 s for a launch made after from.
func (l *launchLog) waitLaunchAfter(t *testing.T, from uint64, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if l.between(from, ^uint64(0)) > 0 {
			return
		}
	}
	t.Fatalf("%s: no launch within 10 s", what)
}

// monotonic is the clock of the probes' timestamps (bpf_ktime_get_ns).
func monotonic(t *testing.T) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// procState returns the state letter of /proc/PID/stat (field 3).
func procState(t *testing.T, pid uint32) byte {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		t.Fatalf("stat of %d: %q", pid, b)
	}
	return b[i+2]
}

// waitState waits up to 5 s for pid to be stopped (want) or not.
func waitState(t *testing.T, pid uint32, stopped bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if (procState(t, pid) == 'T') == stopped {
			return
		}
	}
	t.Fatalf("%s: process %d in state %c after 5 s", what, pid, procState(t, pid))
}

// staysState checks that pid stays stopped (or running) for d.
func staysState(t *testing.T, pid uint32, stopped bool, d time.Duration, what string) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if s := procState(t, pid); (s == 'T') != stopped {
			t.Fatalf("%s: process %d in state %c", what, pid, s)
		}
	}
}

// TestGateStopsAtLaunch gates a running workload: it stops at its next
// launch and makes none while gated; Ungate continues it and its launches
// resume; the entry lists its start time and that the probe stopped it.
func TestGateStopsAtLaunch(t *testing.T) {
	pid, tr, log := tracedTrain(t, "before gating")
	g := tr.Gate()

	for round := range 2 {
		if err := g.Gate(pid); err != nil {
			t.Fatal(err)
		}
		if err := g.Gate(pid); err != nil { // idempotent
			t.Fatal(err)
		}
		waitState(t, pid, true, "gated")
		stoppedAt := monotonic(t)
		gated, err := g.Gated()
		if err != nil {
			t.Fatal(err)
		}
		start, err := procStart("/proc", pid)
		if err != nil {
			t.Fatal(err)
		}
		if len(gated) != 1 || gated[0] != (GatedProcess{PID: pid, Start: start, Stopped: true}) {
			t.Errorf("round %d: Gated() = %+v, want pid %d start %d stopped", round, gated, pid, start)
		}
		staysState(t, pid, true, 300*time.Millisecond, "gated")
		openedAt := monotonic(t)
		begin := time.Now()
		if err := g.Ungate(pid); err != nil {
			t.Fatal(err)
		}
		// Most of it is the wait for probes in flight (an RCU grace period).
		t.Logf("round %d: Ungate of the stopped process took %v", round, time.Since(begin))
		waitState(t, pid, false, "ungated")
		log.waitLaunchAfter(t, openedAt, "after Ungate")
		// The reader polls every 10 ms: by now it has everything made
		// while the gate was closed.
		time.Sleep(50 * time.Millisecond)
		if n := log.between(stoppedAt, openedAt); n != 0 {
			t.Errorf("round %d: %d launches while gated", round, n)
		}
		if err := g.Ungate(pid); err != nil { // idempotent
			t.Fatal(err)
		}
		if gated, _ := g.Gated(); len(gated) != 0 {
			t.Errorf("round %d: still gated after Ungate: %+v", round, gated)
		}
	}
	if s := tr.Stats(); s.GateSignals != 2 || s.GateSignalErrors != 0 {
		t.Errorf("gate signals: %d sent, %d failed; want 2 sent", s.GateSignals, s.GateSignalErrors)
	}
}

// TestUngateSparesOthersStops checks that Ungate never continues a
// process that someone else stopped (a job stopped with Ctrl-Z).
func TestUngateSparesOthersStops(t *testing.T) {
	pid, tr, _ := tracedTrain(t, "before stopping")
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, true, "kill -STOP")
	g := tr.Gate()
	if err := g.Gate(pid); err != nil {
		t.Fatal(err)
	}
	if err := g.Ungate(pid); err != nil {
		t.Fatal(err)
	}
	staysState(t, pid, true, 300*time.Millisecond, "after Ungate of a process stopped by another")
	if err := syscall.Kill(int(pid), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, false, "kill -CONT")
	if s := tr.Stats(); s.GateSignals != 0 {
		t.Errorf("the gate sent %d signals; it was never closed while the process ran", s.GateSignals)
	}
}

// TestGateSparesReusedPID checks that an entry whose start time is not the
// process's (left for an earlier process with the same pid) neither stops
// the process nor makes Ungate or ReleaseAll continue it.
func TestGateSparesReusedPID(t *testing.T) {
	pid, tr, log := tracedTrain(t, "before the stale entry")
	start, err := procStart("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	stale := bpf.CudaGateEntry{Start: (start - 1) * tickNs}
	if err := tr.objs.maps.LaunchGate.Put(pid, stale); err != nil {
		t.Fatal(err)
	}
	from := monotonic(t)
	staysState(t, pid, false, 300*time.Millisecond, "with a stale entry")
	log.waitLaunchAfter(t, from, "with a stale entry")

	// A stale entry marked stopped, on a process someone else stopped.
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, true, "kill -STOP")
	stale.Stopped = 1
	if err := tr.objs.maps.LaunchGate.Put(pid, stale); err != nil {
		t.Fatal(err)
	}
	rel, err := tr.Gate().ReleaseAll()
	if err != nil {
		t.Fatal(err)
	}
	want := Release{GatedProcess: GatedProcess{PID: pid, Start: start - 1, Stopped: true}, Gone: true}
	if len(rel) != 1 || rel[0] != want {
		t.Errorf("ReleaseAll = %+v, want %+v", rel, want)
	}
	staysState(t, pid, true, 200*time.Millisecond, "after releasing a stale entry")
	if s := tr.Stats(); s.GateSignals != 0 {
		t.Errorf("the gate sent %d signals", s.GateSignals)
	}
}

// TestGateRefusesUnprobed checks that Gate refuses a process its probes do
// not reach, and one that does not exist.
func TestGateRefusesUnprobed(t *testing.T) {
	r := newRig(t)
	listed := startTrain(t, r)
	other := startTrain(t, r)
	o := r.options()
	o.PIDs = []uint32{listed}
	tr := openTracer(t, o)
	g := tr.Gate()
	if err := g.Gate(other); err == nil || !strings.Contains(err.Error(), "not among the tracer's processes") {
		t.Errorf("unlisted process: %v", err)
	}
	r.expose(t, os.Getpid())
	if err := g.Gate(uint32(os.Getpid())); err == nil || !strings.Contains(err.Error(), "maps no libcuda") {
		t.Errorf("a process without libcuda: %v", err)
	}
	if err := g.Gate(0); err == nil {
		t.Error("pid 0 accepted")
	}
	if err := g.Gate(1 << 30); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent process: %v", err)
	}
	if gated, _ := g.Gated(); len(gated) != 0 {
		t.Errorf("refused gates left entries: %+v", gated)
	}
}

// TestLaunchProbedVerdict: the gate's check that a process's launch
// probes are attached reads its memory map once, and then trusts the
// verdict only for the same process (start time), while no library was
// attached or detached, and for at most probedTTL; a failed check is
// never kept.
func TestLaunchProbedVerdict(t *testing.T) {
	r := newRig(t)
	pid := startTrain(t, r)
	start, err := procStart("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	o := r.options()
	o.PIDs = []uint32{pid}
	tr := openTracer(t, o)
	link := filepath.Join(r.procRoot, strconv.FormatUint(uint64(pid), 10))
	hide := func() {
		if err := os.Remove(link); err != nil {
			t.Fatal(err)
		}
	}
	check := func(start uint64, ok bool, what string) {
		t.Helper()
		if err := tr.launchProbedAt(pid, start); (err == nil) != ok {
			t.Errorf("%s: %v, want ok=%v", what, err, ok)
		}
	}

	check(start, true, "first check")
	hide() // LaunchProbed would now find no memory map
	check(start, true, "the same process again, from the verdict")
	check(start+1, false, "another process with the pid")
	check(start, false, "after a failed check")

	r.expose(t, int(pid))
	check(start, true, "exposed again")
	hide()
	tr.mu.Lock()
	tr.libGen++
	tr.mu.Unlock()
	check(start, false, "after a library change")

	r.expose(t, int(pid))
	check(start, true, "exposed again")
	hide()
	tr.mu.Lock()
	v := tr.probed[pid]
	v.at = v.at.Add(-probedTTL)
	tr.probed[pid] = v
	tr.mu.Unlock()
	check(start, false, "a verdict older than probedTTL")
}

// mountBPFFS mounts a private BPF filesystem for the test (the tests run
// in a mount namespace of their own, see TestMain).
func mountBPFFS(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		testenv.Skip(t, "mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, 0) })
	return dir
}

// TestGatePinned checks that a pinned gate outlives its tracer's view: a
// second tracer on the same directory, and OpenGate, see the process the
// first one gated; either opens it; a Close with gates still closed
// continues them; the last Close of an empty gate removes the pin.
func TestGatePinned(t *testing.T) {
	r := newRig(t)
	pid := startTrain(t, r)
	fs := mountBPFFS(t)
	dir := filepath.Join(fs, "arbiter")
	if _, err := OpenGate(dir); !errors.Is(err, ErrNoGate) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("OpenGate before any tracer: %v", err)
	}
	o := r.options()
	o.PIDs = []uint32{pid}
	o.GatePinDir = dir
	tr1, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer tr1.Close()
	if err := tr1.Gate().Gate(pid); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, true, "gated")

	tr2, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	gated, err := tr2.Gate().Gated()
	if err != nil || len(gated) != 1 || gated[0].PID != pid || !gated[0].Stopped {
		t.Fatalf("second tracer: Gated() = %+v, %v", gated, err)
	}
	pinned, err := OpenGate(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if err := pinned.Gate(pid); err == nil {
		t.Error("a gate opened from its pin accepted Gate")
	}
	if err := pinned.Unpin(); err == nil {
		t.Error("Unpin with a process gated succeeded")
	}
	if err := tr2.Gate().Ungate(pid); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, false, "ungated by the second tracer")
	if gated, _ := pinned.Gated(); len(gated) != 0 {
		t.Errorf("pinned gate still lists %+v", gated)
	}

	// Closed with the gate closed: Close continues the process.
	if err := tr2.Gate().Gate(pid); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, true, "gated again")
	if err := tr2.Close(); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, false, "after Close")
	if _, err := os.Stat(filepath.Join(dir, GateMapName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin left after a Close that emptied the gate: %v", err)
	}
	if err := tr1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenGate(dir); !errors.Is(err, ErrNoGate) {
		t.Errorf("OpenGate after the last Close: %v", err)
	}
}

// TestProbeBarrier checks that the wait for probes in flight works on this
// kernel (a map-in-map update) and says how long it takes.
func TestProbeBarrier(t *testing.T) {
	testenv.Privileged(t)
	b, err := newProbeBarrier()
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	for range 3 {
		start := time.Now()
		if err := b.wait(); err != nil {
			t.Fatal(err)
		}
		t.Logf("waited %v", time.Since(start))
	}
}
