package uprobe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/bpf"
)

// DefaultGatePinDir is the bpffs directory where the daemon pins the launch
// gate (Options.GatePinDir) and where `arbiter recover` looks for it.
const DefaultGatePinDir = "/sys/fs/bpf/arbiter"

// GateMapName is the file name of the pinned gate map in its directory.
const GateMapName = bpf.CudaMapLaunchGate

// StopsMapName is the file name, beside the gate's, of the pinned map of
// the stops the gate made and has not undone yet (see Gate).
const StopsMapName = bpf.CudaMapGateStops

// ErrNoGate is returned by OpenGate where no gate is pinned: nothing was
// ever gated there, or the last user cleaned up. It wraps os.ErrNotExist.
var ErrNoGate = fmt.Errorf("no launch gate pinned: %w", os.ErrNotExist)

// tickNs is the length of one clock tick of /proc/PID/stat's start time
// (USER_HZ, 100 on every architecture Arbiter runs on); bpf/cuda.c uses
// the same.
const tickNs = 10_000_000

// Gate is the launch gate, the enforcement for processes whose GPU
// channels cannot be controlled: a closed gate stops the process, with
// SIGSTOP from its own launch probe, at its next kernel launch (in any
// thread, through any launch function the tracer probes); opening it
// continues the process if, and only if, the gate stopped it. Work already
// submitted runs to completion, so this is the weakest preemption.
//
// A Gate satisfies the engine's Gater interface. Its methods are safe for
// concurrent use. Processes are identified as the rest of Arbiter
// identifies them, by pid and start time: a gate entry left for a process
// that exited never stops a later process that reuses its pid, and opening
// it never signals one.
//
// The entries live in a BPF map that can be pinned (Options.GatePinDir)
// so that they outlive the daemon: a restarted daemon finds them (Gated),
// and `arbiter recover`, run by the service manager after the daemon
// stopped, releases them (OpenGate, ReleaseAll). Beside it, pinned with
// it, a second map records each stop the gate made until the process has
// been continued (bpf/cuda.c, gate_stops): a daemon killed between opening
// a gate and continuing its process leaves that record, and ReleaseAll
// continues the process by it.
type Gate struct {
	entries *ebpf.Map
	stops   *ebpf.Map // gate_stops; nil for a gate pinned without it
	// stopsErr is why a pinned gate was opened without its stop records
	// (OpenGatePin): ReleaseAll reports it, and Unpin refuses.
	stopsErr error
	// afterRecord, where set (by tests), is called by open between
	// writing a stop record and deleting the entry.
	afterRecord func(pid uint32)
	signals     *ebpf.Map // nil for a gate opened from its pin
	armed       *ebpf.Map // gate_armed; nil for a gate opened from its pin
	procRoot    string
	// probed says whether the launch probes of pid, the process that
	// started at start (clock ticks after boot), are attached; nil where
	// no tracer is behind the gate (OpenGate), which then only releases.
	probed func(pid uint32, start uint64) error

	mu      sync.Mutex // serializes Gate, Ungate, Arm, Settle and ReleaseAll
	barrier *probeBarrier
	owned   bool // Close closes entries (OpenGate)
	// held are the processes closed through Gate and not opened since:
	// the gates Settle leaves closed.
	held map[uint32]struct{}
}

// GatedProcess is one entry of the gate.
type GatedProcess struct {
	// PID is the process's thread-group id.
	PID uint32
	// Start is its start time in clock ticks after boot, field 22 of
	// /proc/PID/stat, as the rest of Arbiter keys processes.
	Start uint64
	// Stopped is true once a launch probe stopped it.
	Stopped bool
}

// Release says what opening one gate did.
type Release struct {
	GatedProcess
	// Continued is true where SIGCONT was sent: the gate had stopped the
	// process and it still runs as the process that was gated.
	Continued bool
	// Gone is true where the process exited or its pid now names another
	// process: there was nothing to continue.
	Gone bool
	// Err is why the process could not be continued.
	Err error
}

// newGate returns the gate on a tracer's loaded maps.
func newGate(entries, stops, signals, armed *ebpf.Map, procRoot string, probed func(pid uint32, start uint64) error) *Gate {
	return &Gate{entries: entries, stops: stops, signals: signals, armed: armed, procRoot: procRoot, probed: probed, held: map[uint32]struct{}{}}
}

// OpenGate opens the gate pinned in dir (empty: DefaultGatePinDir) in
// this build's format without a tracer, for releasing what a daemon left:
// Gated, Ungate, ReleaseAll and Unpin work, Gate refuses. It returns an
// error wrapping ErrNoGate where nothing is pinned there. It needs CAP_BPF
// (or root). OpenGatePin opens a gate of another format.
func OpenGate(dir string) (*Gate, error) {
	if dir == "" {
		dir = DefaultGatePinDir
	}
	return OpenGatePin(GatePin{Path: filepath.Join(dir, GateMapName), Format: GateFormat})
}

// Gate closes pid's gate: afterwards pid submits no new kernel: the next
// launch call in any of its threads stops the whole process until Ungate.
// The launch probes must be attached in the process (Tracer.LaunchProbed
// says so); where they are not, Gate returns an error and changes
// nothing. Gating a gated process is a no-op.
func (g *Gate) Gate(pid uint32) error {
	if g.probed == nil {
		return fmt.Errorf("gate process %d: this gate was opened from its pin without a tracer, so no launch probe would stop the process", pid)
	}
	if pid == 0 {
		return errors.New("gate process 0: want a process id")
	}
	start, err := procStart(g.procRoot, pid)
	if err != nil {
		return fmt.Errorf("gate process %d: %w", pid, err)
	}
	if err := g.probed(pid, start); err != nil {
		return fmt.Errorf("gate process %d: %w", pid, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var cur bpf.CudaGateEntry
	err = g.entries.Lookup(pid, &cur)
	switch {
	case err == nil && cur.Start == start*tickNs:
		// Gated already (through Gate, or by an armed request); keep
		// what the probe recorded.
		g.held[pid] = struct{}{}
		return nil
	case err == nil:
		// An entry of an earlier process with this pid: it stops nothing
		// (its start time does not match), so replacing it loses nothing.
	case !errors.Is(err, ebpf.ErrKeyNotExist):
		return fmt.Errorf("gate process %d: read the gate map: %w", pid, err)
	}
	if err := g.entries.Put(pid, bpf.CudaGateEntry{Start: start * tickNs}); err != nil {
		return fmt.Errorf("gate process %d: %w (the gate holds at most %d processes)", pid, err, g.entries.MaxEntries())
	}
	g.held[pid] = struct{}{}
	return nil
}

// Ungate opens pid's gate. The entry is deleted first, so that no probe
// stops the process again; then, if a probe had stopped it, SIGCONT is
// sent, once no probe that could still stop it is in flight, through a
// pidfd and only to the process that was gated (same start time). A
// process stopped by anyone else (a job stopped with Ctrl-Z, a debugger)
// stays stopped. Ungating an open gate, or a process that has exited, is a
// no-op.
func (g *Gate) Ungate(pid uint32) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, err := g.open(pid)
	if err != nil {
		return err
	}
	return r.Err
}

// Gated lists the processes whose gate is closed, in no particular order.
func (g *Gate) Gated() ([]GatedProcess, error) {
	var out []GatedProcess
	var pid uint32
	var v []byte
	it := g.entries.Iterate()
	for it.Next(&pid, &v) {
		e := decodeGateValue(v)
		out = append(out, GatedProcess{PID: pid, Start: e.Start / tickNs, Stopped: e.Stopped != 0})
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("list gated processes: %w", err)
	}
	return out, nil
}

// ReleaseAll opens every gate, as Ungate does each, and continues every
// process a stop record names whose gate is open already (its opener was
// killed, or failed, before it continued it). It says what it did for
// each process, and goes on past failures; the error joins them all.
func (g *Gate) ReleaseAll() ([]Release, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rels, err := g.openWhere(func(uint32, []byte) bool { return true })
	return rels, errors.Join(err, g.stopsErr)
}

// openWhere opens the gate of every process in the map for which which
// (given the pid and the entry's value) is true, and of every process a
// stop record names that has no entry, as Ungate does each, going on past
// failures. g.mu is held, so a record without an entry is an orphan: the
// opener that deleted the entry failed to continue the process (or was
// killed), and no probe is between marking an entry and recording it.
func (g *Gate) openWhere(which func(pid uint32, v []byte) bool) ([]Release, error) {
	var pids []uint32
	recs, rerr := g.stopRecords()
	var pid uint32
	var v []byte
	it := g.entries.Iterate()
	for it.Next(&pid, &v) {
		delete(recs, pid)
		if which(pid, v) {
			pids = append(pids, pid)
		}
	}
	errs := []error{rerr}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("list gated processes: %w", err))
	}
	for pid := range recs {
		// An armed request may have closed its gate since the walk.
		if err := g.entries.Lookup(pid, &v); err == nil && !which(pid, v) {
			continue
		}
		pids = append(pids, pid)
	}
	var out []Release
	for _, pid := range pids {
		r, err := g.open(pid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r.PID == 0 {
			continue // opened meanwhile (the process exited)
		}
		out = append(out, r)
		if r.Err != nil {
			errs = append(errs, r.Err)
		}
	}
	return out, errors.Join(errs...)
}

// Signals returns how many SIGSTOPs the launch probes sent and how many
// they failed to send, over every CPU; zeros for a gate opened from its
// pin (the counters live with the tracer's programs).
func (g *Gate) Signals() (sent, failed uint64) {
	return g.counter(0), g.counter(1)
}

// counter sums one slot of the per-CPU gate counters (bpf/cuda.c,
// gate_signals).
func (g *Gate) counter(slot uint32) uint64 {
	if g.signals == nil {
		return 0
	}
	var perCPU []uint64
	if err := g.signals.Lookup(slot, &perCPU); err != nil {
		return 0
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n
}

// Unpin removes the pins of the gate and of its stop records: the maps go
// once no tracer uses them. Where entries or records remain, it refuses,
// so that no stopped process is forgotten: ReleaseAll first.
func (g *Gate) Unpin() error {
	left, err := g.Gated()
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("unpin the launch gate: %d processes still gated (release them first)", len(left))
	}
	recs, err := g.stopRecords()
	if err != nil {
		return fmt.Errorf("unpin the launch gate: %w", err)
	}
	if len(recs) > 0 {
		return fmt.Errorf("unpin the launch gate: %d processes it stopped not yet continued (release them first)", len(recs))
	}
	if g.stopsErr != nil {
		return fmt.Errorf("unpin the launch gate: %w", g.stopsErr)
	}
	// The records first: a gate left pinned alone is found again, and
	// records are read only beside a gate (OpenGatePin).
	if g.stops != nil {
		if err := g.stops.Unpin(); err != nil {
			return fmt.Errorf("unpin the launch gate's stop records: %w", err)
		}
	}
	if err := g.entries.Unpin(); err != nil {
		return fmt.Errorf("unpin the launch gate: %w", err)
	}
	return nil
}

// Pinned says which of the gate's maps are pinned: its entries, and its
// stop records. A gate opened for records pinned alone has its entries
// in a map of its own, pinned nowhere (OpenGatePin).
func (g *Gate) Pinned() (entries, records bool) {
	return g.entries.IsPinned(), g.stops != nil && g.stops.IsPinned()
}

// stopRecords returns the stop records, pid to start time in ns (none
// for a gate pinned without them).
func (g *Gate) stopRecords() (map[uint32]uint64, error) {
	out := map[uint32]uint64{}
	if g.stops == nil {
		return out, nil
	}
	var pid uint32
	var start uint64
	it := g.stops.Iterate()
	for it.Next(&pid, &start) {
		out[pid] = start
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("list the gate's stop records: %w", err)
	}
	return out, nil
}

// Close releases a gate opened with OpenGate, and the barrier's maps. It
// opens no gate: a pinned gate keeps its entries. A tracer's gate is
// closed with the tracer.
func (g *Gate) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	if g.barrier != nil {
		errs = append(errs, g.barrier.close())
		g.barrier = nil
	}
	if g.owned && g.entries != nil {
		errs = append(errs, g.entries.Close())
		g.entries = nil
	}
	if g.owned && g.stops != nil {
		errs = append(errs, g.stops.Close())
		g.stops = nil
	}
	return errors.Join(errs...)
}

// open deletes pid's entry and continues the process if the gate stopped
// it: the entry says so, or a stop record does (an opener killed, or one
// that failed to continue the process, left one). It returns a zero
// Release where pid had neither, and an error only where the entry could
// not be removed; a failure to continue is the Release's Err.
//
// The stop record outlives the entry (bpf/cuda.c, gate_stops): an entry
// marked stopped gets its record again before it is deleted, and the
// record is deleted only once the SIGCONT has gone out, so that a daemon
// killed at any point of this leaves the stop findable.
func (g *Gate) open(pid uint32) (Release, error) {
	// No longer held, whatever the map says: an entry the exit
	// tracepoint dropped leaves nothing to open, and a later process
	// with the pid is not held by this one's Gate.
	delete(g.held, pid)
	var v []byte
	err := g.entries.Lookup(pid, &v)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return Release{}, fmt.Errorf("ungate process %d: read its gate entry: %w", pid, err)
	}
	var r Release
	if err == nil {
		// Marked stopped stays marked until deleted, so the record
		// written now cannot come too late. It guards against being
		// killed in the next milliseconds; where there is no room for it
		// (as many stops pending as the map holds), opening the gate
		// without it is still safer than leaving the process stopped.
		recorded := false
		if e := decodeGateValue(v); e.Stopped != 0 && g.stops != nil {
			recorded = g.stops.Put(pid, e.Start) == nil
		}
		if g.afterRecord != nil {
			g.afterRecord(pid)
		}
		err = g.entries.LookupAndDelete(pid, &v)
		switch {
		case err == nil:
			e := decodeGateValue(v)
			r = Release{GatedProcess: GatedProcess{PID: pid, Start: e.Start / tickNs, Stopped: e.Stopped != 0}}
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			return Release{}, fmt.Errorf("ungate process %d: remove its gate entry: %w", pid, err)
		case recorded:
			// The process exited since the entry was read, and the exit
			// tracepoint dropped its record before it was written again.
			_ = g.stops.Delete(pid)
			return Release{}, nil
		}
	}
	if !r.Stopped && g.stops != nil {
		var start uint64
		err := g.stops.Lookup(pid, &start)
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
		case err != nil && r.PID != 0:
			r.Err = fmt.Errorf("ungate process %d: read its stop record: %w", pid, err)
			return r, nil
		case err != nil:
			return Release{}, fmt.Errorf("ungate process %d: read its stop record: %w", pid, err)
		case r.PID != 0 && start/tickNs != r.Start && gone(g.procRoot, pid, start/tickNs):
			// The record of an earlier process with this pid, left by a
			// killed daemon: nothing to continue.
			_ = g.stops.Delete(pid)
		default:
			r.GatedProcess = GatedProcess{PID: pid, Start: start / tickNs, Stopped: true}
		}
	}
	if !r.Stopped {
		return r, nil
	}
	// A probe that marked the entry before the delete may not have sent
	// its SIGSTOP yet: a SIGCONT sent first would be undone by it. The
	// probe runs in a thread of the process, so where every thread is
	// stopped none is in a probe (and none can reach one again before it
	// is continued, by when the entry is gone); otherwise, unless the
	// process is gone, wait for the probes in flight, which takes
	// milliseconds.
	if !threadsStopped(g.procRoot, pid) && !gone(g.procRoot, pid, r.Start) {
		if err := g.waitProbes(); err != nil {
			r.Err = fmt.Errorf("ungate process %d: %w", pid, err)
			return r, nil
		}
	}
	r.Continued, r.Gone, r.Err = continueProcess(g.procRoot, pid, r.Start)
	if r.Err == nil && g.stops != nil {
		// Continued, or gone: the record has done its work. (A record of
		// a later stop, written since the SIGCONT, may go with it: that
		// stop's entry is marked, and its opener records it again.)
		if err := g.stops.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			r.Err = fmt.Errorf("ungate process %d: continued, but its stop record stays (a later release sends it SIGCONT again): %w", pid, err)
		}
	}
	return r, nil
}

// waitProbes returns once every BPF program running when it was called has
// finished.
func (g *Gate) waitProbes() error {
	if g.barrier == nil {
		b, err := newProbeBarrier()
		if err != nil {
			return err
		}
		g.barrier = b
	}
	return g.barrier.wait()
}

// continueProcess sends SIGCONT to pid if it still is the process that
// started at start (clock ticks). A pidfd holds the process while its
// start time is checked, so a pid reused meanwhile is never signalled.
func continueProcess(procRoot string, pid uint32, start uint64) (continued, gone bool, err error) {
	fd, err := unix.PidfdOpen(int(pid), 0)
	if errors.Is(err, unix.ESRCH) {
		return false, true, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("continue process %d: pidfd_open (kernel 5.3+): %w", pid, err)
	}
	defer unix.Close(fd)
	now, err := procStart(procRoot, pid)
	if errors.Is(err, os.ErrNotExist) || (err == nil && now != start) {
		return false, true, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("continue process %d: %w", pid, err)
	}
	err = unix.PidfdSendSignal(fd, unix.SIGCONT, nil, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return false, true, nil
	case errors.Is(err, unix.EPERM):
		return false, false, fmt.Errorf("continue process %d: SIGCONT: %w (needs CAP_KILL, or root)", pid, err)
	case err != nil:
		return false, false, fmt.Errorf("continue process %d: SIGCONT: %w", pid, err)
	}
	return true, false, nil
}

// gone reports whether pid has exited or names another process than the
// one that started at start (clock ticks).
func gone(procRoot string, pid uint32, start uint64) bool {
	now, err := procStart(procRoot, pid)
	return errors.Is(err, os.ErrNotExist) || (err == nil && now != start)
}

// threadsStopped reports whether every thread of pid is stopped (state T
// in procRoot/PID/task/TID/stat); false where that cannot be read.
func threadsStopped(procRoot string, pid uint32) bool {
	dir := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "task")
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) == 0 {
		return false
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		i := bytes.LastIndexByte(b, ')')
		if err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// procStart returns field 22 of procRoot/PID/stat, the process's start
// time in clock ticks after boot; an error wrapping os.ErrNotExist where
// the process does not exist.
func procStart(procRoot string, pid uint32) (uint64, error) {
	path := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "stat")
	b, err := os.ReadFile(path)
	if errors.Is(err, unix.ESRCH) {
		err = os.ErrNotExist // the process exited while being read
	}
	if err != nil {
		return 0, fmt.Errorf("read its start time: %w", err)
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	var f [][]byte
	if i >= 0 {
		f = bytes.Fields(b[i+1:])
	}
	if len(f) < 20 {
		return 0, fmt.Errorf("read its start time: %s: too few fields", path)
	}
	v, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read its start time: %s: field 22: %w", path, err)
	}
	return v, nil
}

// bpfGateEntrySize is the size of one gate map value in this build's
// format.
func bpfGateEntrySize() uint32 {
	return uint32(binary.Size(bpf.CudaGateEntry{}))
}

// gatePrefixSize is the start of a gate value that every format keeps: the
// start time in ns (u64) and the stopped flag (u32), in the host's byte
// order. It is what lets any build release a gate of any format.
const gatePrefixSize = 12

// decodeGateValue reads the shared prefix of a gate value of any format.
func decodeGateValue(v []byte) bpf.CudaGateEntry {
	if len(v) < gatePrefixSize {
		return bpf.CudaGateEntry{}
	}
	return bpf.CudaGateEntry{Start: binary.NativeEndian.Uint64(v), Stopped: binary.NativeEndian.Uint32(v[8:])}
}

// probeBarrier waits for the BPF programs in flight. Updating a slot of a
// map-in-map from user space makes the kernel wait for an RCU grace period
// (maybe_wait_bpf_programs, kernel 4.15+) so that no program still sees
// the old inner map; the non-sleepable uprobe programs run inside RCU
// read-side sections, so when the update returns, every probe that was
// running when it began has finished, its signal sent.
type probeBarrier struct {
	outer, inner *ebpf.Map
}

func newProbeBarrier() (*probeBarrier, error) {
	inner := &ebpf.MapSpec{Name: "gate_barrier_in", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1}
	outer, err := ebpf.NewMap(&ebpf.MapSpec{Name: "gate_barrier", Type: ebpf.ArrayOfMaps, KeySize: 4, ValueSize: 4, MaxEntries: 1, InnerMap: inner})
	if err != nil {
		return nil, fmt.Errorf("create the probe barrier map (needs CAP_BPF): %w", err)
	}
	in, err := ebpf.NewMap(inner)
	if err != nil {
		outer.Close()
		return nil, fmt.Errorf("create the probe barrier map (needs CAP_BPF): %w", err)
	}
	return &probeBarrier{outer: outer, inner: in}, nil
}

func (b *probeBarrier) wait() error {
	if err := b.outer.Put(uint32(0), b.inner); err != nil {
		return fmt.Errorf("wait for the launch probes in flight: %w", err)
	}
	return nil
}

func (b *probeBarrier) close() error {
	return errors.Join(b.outer.Close(), b.inner.Close())
}
