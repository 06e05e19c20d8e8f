// Tests with real eBPF of the gate's stop records: the record of a stop
// outlives an opener killed before it continued the process, a probe
// stops nothing it cannot record, and the exit tracepoint drops a leaving
// process's record.

package uprobe

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// stopRecord returns pid's stop record (its start time in ns) and whether
// it has one.
func stopRecord(t *testing.T, tr *Tracer, pid uint32) (uint64, bool) {
	t.Helper()
	var start uint64
	err := tr.objs.maps.GateStops.Lookup(pid, &start)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return start, true
}

// TestKilledOpenerLeavesStopRecord replays a daemon killed while it opened
// the gate of a process an armed request had stopped: it had deleted the
// gate entry and not yet sent SIGCONT. The next request, its probes still
// attached, closes the gate again with a fresh entry, not marked stopped,
// since the process is stopped and cannot reach its probe. Releasing the
// pinned gate, as `arbiter recover` does, must continue the process all
// the same: the probe recorded the stop, and the record outlived the
// entry.
func TestKilledOpenerLeavesStopRecord(t *testing.T) {
	const gap = 300 * time.Millisecond
	be, lc, o := armedPair(t, gap)
	dir := filepath.Join(mountBPFFS(t), "arbiter")
	o.GatePinDir = dir
	tr := openTracer(t, o)
	logLaunches(tr, be).waitLaunchAfter(t, 0, "before arming")
	expediteAndArm(t, tr, lc.pid, be)
	start, err := procStart(DefaultProcRoot, be)
	if err != nil {
		t.Fatal(err)
	}

	lc.send(t, "launch 1")
	lc.line(t)
	waitState(t, be, true, "stopped by the armed request")
	if rec, ok := stopRecord(t, tr, be); !ok || rec != start*tickNs {
		t.Fatalf("stop record of the stopped process: %d, %v; want its start time %d", rec, ok, start*tickNs)
	}

	// The opener's first step, and its last before it was killed.
	orphan(t, tr, be)
	time.Sleep(gap + 50*time.Millisecond)
	lc.send(t, "launch 1")
	lc.line(t)
	gated, err := tr.Gate().Gated()
	if err != nil || len(gated) != 1 || gated[0].PID != be || gated[0].Stopped {
		t.Fatalf("after the next request: Gated() = %+v, %v; want %d closed again, not marked stopped", gated, err, be)
	}
	if procState(t, be) != 'T' {
		t.Fatal("the process is no longer stopped: the replay does not hold")
	}

	pinned, err := OpenGate(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if err := tr.Gate().Arm(lc.pid, nil, false); err != nil { // the daemon's probes went with it
		t.Fatal(err)
	}
	rels, err := pinned.ReleaseAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rels) != 1 || rels[0].PID != be || rels[0].Start != start || !rels[0].Stopped || !rels[0].Continued {
		t.Fatalf("ReleaseAll: %+v; want process %d (start %d) continued", rels, be, start)
	}
	waitState(t, be, false, "released")
	if _, ok := stopRecord(t, tr, be); ok {
		t.Error("the stop record outlived the SIGCONT")
	}
	if err := pinned.Unpin(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{GateMapName, StopsMapName} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still pinned after Unpin: %v", name, err)
		}
	}
}

// TestReleaseByRecordAlone: a stop record whose entry is gone (the opener
// was killed after deleting it, and no request closed the gate again)
// still gets its process continued, and Unpin refuses while a record is
// left.
func TestReleaseByRecordAlone(t *testing.T) {
	be, tr, dir := stopped(t, true)
	orphan(t, tr, be)
	pinned, err := OpenGate(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if err := pinned.Unpin(); err == nil {
		t.Error("Unpin with a stop record left succeeded")
	}
	rels, err := pinned.ReleaseAll()
	if err != nil || len(rels) != 1 || rels[0].PID != be || !rels[0].Stopped || !rels[0].Continued {
		t.Fatalf("ReleaseAll: %+v, %v; want process %d continued", rels, err, be)
	}
	waitState(t, be, false, "released by its record")
}

// TestUnrecordedStopNotMade: a probe that finds no room to record a stop
// sends no SIGSTOP, and counts it as a signal not sent; once there is
// room again, the gate stops the process.
func TestUnrecordedStopNotMade(t *testing.T) {
	be, tr, log := tracedTrain(t, "before gating")
	stops := tr.objs.maps.GateStops
	// Keys no process has: above the kernel's largest pid_max.
	const fake = 1 << 23
	n := int(stops.MaxEntries())
	for i := range n {
		if err := stops.Put(uint32(fake+i), uint64(i)); err != nil {
			t.Fatalf("fill the stop records (%d of %d): %v", i, n, err)
		}
	}
	g := tr.Gate()
	before := tr.Stats().GateSignalErrors
	if err := g.Gate(be); err != nil {
		t.Fatal(err)
	}
	from := monotonic(t)
	staysState(t, be, false, 300*time.Millisecond, "gated with no room to record a stop")
	log.waitLaunchAfter(t, from, "gated with no room to record a stop")
	if s := tr.Stats(); s.GateSignalErrors == before {
		t.Errorf("no stop counted as not sent (%d before, %d after)", before, s.GateSignalErrors)
	}
	// The entry is marked all the same (the mark comes first): opening it
	// sends a running process a SIGCONT, which does nothing.
	if l, err := g.Gated(); err != nil || len(l) != 1 || !l[0].Stopped {
		t.Errorf("Gated() = %+v, %v; want the entry marked", l, err)
	}
	if err := g.Ungate(be); err != nil {
		t.Fatal(err)
	}
	staysState(t, be, false, 50*time.Millisecond, "ungated, never stopped")
	for i := range n {
		if err := stops.Delete(uint32(fake + i)); err != nil {
			t.Fatal(err)
		}
	}
	from = monotonic(t)
	log.waitLaunchAfter(t, from, "after Ungate")
	if err := g.Gate(be); err != nil {
		t.Fatal(err)
	}
	waitState(t, be, true, "gated with room again")
	if err := g.Ungate(be); err != nil {
		t.Fatal(err)
	}
	waitState(t, be, false, "ungated")
}

// TestExitDropsStopRecord: a gated process killed while stopped leaves no
// stop record behind.
func TestExitDropsStopRecord(t *testing.T) {
	be, tr, _ := tracedTrain(t, "before gating")
	if err := tr.Gate().Gate(be); err != nil {
		t.Fatal(err)
	}
	waitState(t, be, true, "gated")
	if _, ok := stopRecord(t, tr, be); !ok {
		t.Fatal("no stop record for the stopped process")
	}
	p, err := os.FindProcess(int(be))
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Signal(syscall.SIGKILL)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok := stopRecord(t, tr, be); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the exit tracepoint did not drop the killed process's stop record")
		}
	}
}

// stopped gates a training workload, traced alone (with the gate pinned
// in a fresh BPF filesystem where pin is set), until it is stopped; it
// returns the process, its tracer and the pin directory (empty where not
// pinned).
func stopped(t *testing.T, pin bool) (uint32, *Tracer, string) {
	t.Helper()
	r := newRig(t)
	be := startTrain(t, r)
	o := r.options()
	o.PIDs = []uint32{be}
	if pin {
		o.GatePinDir = filepath.Join(mountBPFFS(t), "arbiter")
	}
	tr := openTracer(t, o)
	logLaunches(tr, be).waitLaunchAfter(t, 0, "before gating")
	if err := tr.Gate().Gate(be); err != nil {
		t.Fatal(err)
	}
	waitState(t, be, true, "gated")
	return be, tr, o.GatePinDir
}

// orphan deletes pid's gate entry as an opener does before it continues
// the process: the state an opener killed there, or one whose continue
// failed, leaves.
func orphan(t *testing.T, tr *Tracer, pid uint32) {
	t.Helper()
	if err := tr.objs.maps.LaunchGate.Delete(pid); err != nil {
		t.Fatal(err)
	}
}

// TestUngateFindsRecord: a running daemon whose continue failed, once it
// closes the gate again (the entry not marked: the process cannot reach
// its probe), continues the process at the next Ungate, by its record.
func TestUngateFindsRecord(t *testing.T) {
	be, tr, _ := stopped(t, false)
	orphan(t, tr, be)
	g := tr.Gate()
	if err := g.Gate(be); err != nil {
		t.Fatal(err)
	}
	if err := g.Ungate(be); err != nil {
		t.Fatal(err)
	}
	waitState(t, be, false, "ungated")
	if _, ok := stopRecord(t, tr, be); ok {
		t.Error("the stop record outlived the SIGCONT")
	}
}

// TestSettleContinuesOrphan: Settle, which a daemon with armed gates runs
// at every request's end and control tick, continues a process whose
// record has no entry.
func TestSettleContinuesOrphan(t *testing.T) {
	be, tr, _ := stopped(t, false)
	orphan(t, tr, be)
	rel, young, err := tr.Gate().Settle(time.Hour)
	if err != nil || young != 0 || len(rel) != 1 || rel[0].PID != be || !rel[0].Continued {
		t.Fatalf("Settle: %+v, %d young, %v; want process %d continued", rel, young, err, be)
	}
	waitState(t, be, false, "settled")
}

// TestOpenerRecordsFirst: the opener writes the record of a stop again
// before it deletes the entry (an earlier opener may have deleted the
// record of this later stop), and deletes it after the SIGCONT.
func TestOpenerRecordsFirst(t *testing.T) {
	be, tr, _ := tracedTrain(t, "before gating")
	g := tr.Gate()
	if err := g.Gate(be); err != nil {
		t.Fatal(err)
	}
	waitState(t, be, true, "gated")
	if err := tr.objs.maps.GateStops.Delete(be); err != nil {
		t.Fatal(err)
	}
	var atDelete []bool
	g.afterRecord = func(pid uint32) {
		_, ok := stopRecord(t, tr, pid)
		atDelete = append(atDelete, ok)
	}
	if err := g.Ungate(be); err != nil {
		t.Fatal(err)
	}
	if len(atDelete) != 1 || !atDelete[0] {
		t.Errorf("record present when the entry was deleted: %v, want [true]", atDelete)
	}
	waitState(t, be, false, "ungated")
	if _, ok := stopRecord(t, tr, be); ok {
		t.Error("the stop record outlived the SIGCONT")
	}
}

// releasePinned opens the gate pinned in dir, as `arbiter recover` does,
// releases it, and unpins it; it returns ReleaseAll's releases and error,
// and Unpin's error.
func releasePinned(t *testing.T, dir string) ([]Release, error, error) {
	t.Helper()
	g, err := OpenGate(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	rels, err := g.ReleaseAll()
	return rels, err, g.Unpin()
}

// TestPinnedGateWithoutRecords: a gate pinned by a build without stop
// records opens, releases and unpins as before.
func TestPinnedGateWithoutRecords(t *testing.T) {
	be, _, dir := stopped(t, true)
	if err := os.Remove(filepath.Join(dir, StopsMapName)); err != nil {
		t.Fatal(err)
	}
	rels, err, uerr := releasePinned(t, dir)
	if err != nil || uerr != nil || len(rels) != 1 || rels[0].PID != be || !rels[0].Continued {
		t.Fatalf("ReleaseAll: %+v, %v; Unpin: %v; want process %d continued and the pin gone", rels, err, uerr, be)
	}
	waitState(t, be, false, "released")
}

// TestRecordsPinnedAlone: stop records whose gate's pin is gone (an
// older build unpinned the gate alone) are still found and released.
func TestRecordsPinnedAlone(t *testing.T) {
	be, tr, dir := stopped(t, true)
	orphan(t, tr, be)
	if err := os.Remove(filepath.Join(dir, GateMapName)); err != nil {
		t.Fatal(err)
	}
	rels, err, uerr := releasePinned(t, dir)
	if err != nil || uerr != nil || len(rels) != 1 || rels[0].PID != be || !rels[0].Continued {
		t.Fatalf("ReleaseAll: %+v, %v; Unpin: %v; want process %d continued", rels, err, uerr, be)
	}
	waitState(t, be, false, "released by its record")
	if _, err := os.Stat(filepath.Join(dir, StopsMapName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stop records still pinned after Unpin: %v", err)
	}
}

// TestRecordsOfAnotherShape: stop records pinned in a shape this build
// does not read keep the gate's entries releasable; the release says why
// the records were left, and the pins stay.
func TestRecordsOfAnotherShape(t *testing.T) {
	be, _, dir := stopped(t, true)
	path := filepath.Join(dir, StopsMapName)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	odd, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer odd.Close()
	if err := odd.Pin(path); err != nil {
		t.Fatal(err)
	}
	rels, err, uerr := releasePinned(t, dir)
	if len(rels) != 1 || rels[0].PID != be || !rels[0].Continued {
		t.Fatalf("ReleaseAll: %+v; want process %d continued from its entry", rels, be)
	}
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("ReleaseAll error %v: want one naming %s", err, path)
	}
	if uerr == nil {
		t.Error("Unpin with unreadable stop records succeeded")
	}
	waitState(t, be, false, "released")
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the records' pin: %v, want it left", err)
	}
}

// TestFailedContinueKeepsRecord: an opener whose SIGCONT cannot be sent
// (here, the process's stat cannot be read) keeps the stop's record, so
// that the next opening continues the process.
func TestFailedContinueKeepsRecord(t *testing.T) {
	be, tr, _ := stopped(t, false)
	g := tr.Gate()
	// A proc root where the process's stat is a directory: reading it
	// fails, and not as a process that is gone.
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, strconv.Itoa(int(be)), "stat"), 0o755); err != nil {
		t.Fatal(err)
	}
	g.procRoot = root
	if err := g.Ungate(be); err == nil {
		t.Fatal("Ungate with the process's stat unreadable succeeded")
	}
	g.procRoot = DefaultProcRoot
	staysState(t, be, true, 100*time.Millisecond, "after the failed Ungate")
	if _, ok := stopRecord(t, tr, be); !ok {
		t.Fatal("the failed continue dropped the stop record")
	}
	rel, _, err := g.Settle(time.Hour)
	if err != nil || len(rel) != 1 || rel[0].PID != be || !rel[0].Continued {
		t.Fatalf("Settle: %+v, %v; want process %d continued by its record", rel, err, be)
	}
	waitState(t, be, false, "settled")
}
