package uprobe

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpu-arbiter/arbiter/bpf"
	"github.com/gpu-arbiter/arbiter/trace"
)

// ErrClosed is returned by Read once the Tracer is closed.
var ErrClosed = fmt.Errorf("uprobe tracer: %w", trace.ErrClosed)

// Defaults of Options.
const (
	DefaultProcRoot       = "/proc"
	DefaultRescanInterval = 2 * time.Second
	DefaultRingBufferSize = 16 << 20
)

// pollInterval bounds how long a record may wait in the ring: the probes
// wake the reader only past WakeupBytes, so the reader polls this often.
const pollInterval = 10 * time.Millisecond

// Options configure Open. A nil *Options means all defaults.
type Options struct {
	// Libraries are extra libcuda paths to attach besides those discovered.
	Libraries []string
	// ProcRoot is where procfs is mounted; default "/proc".
	ProcRoot string
	// RescanInterval is how often the library discovery runs again; default
	// 2s, negative disables rescanning.
	RescanInterval time.Duration
	// PIDs, when not empty, restricts tracing in the kernel to these
	// processes (thread-group ids). Without Cgroups, the breakpoints are
	// moreover installed only in these processes, so that the others pay
	// nothing, not even the trap.
	PIDs []uint32
	// Cgroups, when not empty, restricts tracing in the kernel to tasks in
	// these cgroup v2 ids (with PIDs: either matches).
	Cgroups []uint64
	// RingBufferSize is the ring buffer's size in bytes, a power of two and
	// a multiple of the page size; 0 means DefaultRingBufferSize.
	RingBufferSize int

	// WakeupBytes is the fill level past which a probe wakes the reader;
	// below it the reader finds records when its ~10 ms poll expires. 0
	// means a quarter of the ring; negative wakes on every record (each
	// wakeup roughly doubles the probe's cost).
	WakeupBytes int
	// SearchDirs replace the standard library directories searched for
	// libcuda.so* besides the dynamic linker's cache; nil means the defaults.
	SearchDirs []string
	// LdCache is the dynamic linker's cache; default "/etc/ld.so.cache",
	// "-" skips it.
	LdCache string
	// ExpediteGap is how long a process that Expedite lists must have been
	// idle (no launch or copy began, no synchronizer returned) for its
	// next launch or copy to open a request and wake the reader: the
	// engine's idle gap. 0 wakes it at every launch and copy of such a
	// process.
	ExpediteGap time.Duration
	// GatePinDir, where set, is a directory on a BPF filesystem where the
	// launch gate's map is pinned (DefaultGatePinDir is the daemon's), so
	// that gated processes outlive the Tracer: a Tracer opened later with
	// the same directory reuses the map and its entries, and `arbiter
	// recover` releases what a killed daemon left. Empty: the map lives
	// and dies with the Tracer. Either way Close opens every gate.
	GatePinDir string

	// mode replaces the programs for the probe-cost benchmarks.
	mode probeMode
	// singleProbes forces one perf-event uprobe per site even where
	// uprobe_multi links exist (tests of the older kernels' path).
	singleProbes bool
	// noGate leaves the gate out of the launch probes (the benchmark of
	// its cost).
	noGate bool
	// syncSlots, a power of two, replaces the number of per-thread sync
	// slots (bpf/cuda.c) so that a test can make threads share one.
	syncSlots int
	// poll replaces pollInterval (tests of what wakes the reader).
	poll time.Duration
}

// withDefaults returns a copy of o (nil allowed) with defaults filled in.
func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.ProcRoot == "" {
		r.ProcRoot = DefaultProcRoot
	}
	if r.RescanInterval == 0 {
		r.RescanInterval = DefaultRescanInterval
	}
	if r.RingBufferSize == 0 {
		r.RingBufferSize = DefaultRingBufferSize
	}
	if r.WakeupBytes == 0 {
		r.WakeupBytes = r.RingBufferSize / 4
	}
	if r.poll == 0 {
		r.poll = pollInterval
	}
	if r.SearchDirs == nil {
		r.SearchDirs = defaultSearchDirs
	}
	if r.LdCache == "" {
		r.LdCache = "/etc/ld.so.cache"
	}
	return r
}

// Stats are a Tracer's counters and its attached libraries.
type Stats struct {
	// Events is the number of records decoded and queued for Read.
	Events uint64
	// Drops is the number of records the probes could not queue because the
	// ring buffer was full (kernel reserve failures).
	Drops uint64
	// DecodeErrors counts records that did not decode.
	DecodeErrors uint64
	// Libraries are the libcuda files currently attached.
	Libraries []Library
	// GateSignals counts the SIGSTOPs the launch gate sent,
	// GateSignalErrors those it failed to send or, with no room left to
	// record the stop (Gate), did not send.
	GateSignals, GateSignalErrors uint64
	// GateArmedCloses counts the gates closed in the kernel by the call
	// opening a request they were armed for (Gate.Arm).
	GateArmedCloses uint64
	// ScanError is the last rescan's trouble that did not stop it (an
	// unreadable ld.so.cache, a failed detach, an extra library path gone),
	// empty if there was none.
	ScanError string
}

// Library is one distinct libcuda file and what was attached in it.
type Library struct {
	// Path is the path it was attached through (for a library seen only
	// inside a container, a /proc/PID/root/... path).
	Path string
	// Dev and Inode identify the file.
	Dev, Inode uint64
	// Attached are the probed symbols found and attached, Missing the
	// probed symbols the library does not export (and, suffixed
	// " (ifunc, not resolved yet)", indirect functions no traced process
	// has resolved since they were found).
	Attached, Missing []string
	// Probes say where each attached symbol was probed.
	Probes []Probe
	// Error says why a discovered file could not be attached (not an ELF
	// shared object, a symbol in no executable segment); empty when it was.
	Error string
}

// Probe is one attached symbol.
type Probe struct {
	// Func is the probed function.
	Func trace.Func
	// Symbol is the resolved dynamic symbol with its version, e.g.
	// "cuStreamSynchronize@@LIBCUDA_2.0" (no suffix when unversioned).
	Symbol string
	// Address is the symbol's file offset, Offset where the probe sits
	// relative to it (4 after an endbr64 whose successor the kernel
	// emulates, else 0).
	Address, Offset uint64
	// Prologue are the symbol's first bytes as found in the file.
	Prologue []byte
	// Return is true where a return probe is attached too.
	Return bool
	// Resolver is, for a GNU indirect function, the file offset of its
	// resolver; Address is then the implementation the resolver returned
	// in a traced process. Zero for ordinary functions.
	Resolver uint64
}

// Tracer captures CUDA driver calls. Its methods are safe for concurrent
// use; concurrent Reads each get different events.
type Tracer struct {
	opts   Options
	objs   *objects
	gate   *Gate
	procs  []link.Link // exec/exit tracepoints
	ring   *ringbuf.Reader
	q      *queue
	done   chan struct{}
	execs  chan uint32   // exec'd pids for the rescan loop; nil without rescans
	ifuncs chan ifuncHit // resolved indirect functions for the rescan loop
	wg     sync.WaitGroup

	events       atomic.Uint64
	decodeErrors atomic.Uint64

	mu        sync.Mutex // guards libraries, scanErr, closed, libGen and probed
	libraries map[fileID]*attachedLibrary
	scanErr   error
	closed    bool   // no attaching once set
	seq       uint64 // attach order of libraries
	libGen    uint64 // counts changes to libraries (attach and detach)
	probed    map[uint32]probedVerdict

	expMu     sync.Mutex // guards expedited
	expedited map[uint32]struct{}
	flush     flushes

	closeOnce sync.Once
	closeErr  error
}

// Open loads the eBPF programs, attaches the exec/exit tracepoints,
// discovers and attaches every libcuda file in use and starts the reader
// and the periodic rescan. It needs CAP_BPF and CAP_PERFMON (or root) and
// kernel 5.15+ (BPF cookies on uprobes). Finding no libcuda is not an
// error: the rescan attaches libraries as they appear. A path in
// Options.Libraries that cannot be attached is.
func Open(opts *Options) (*Tracer, error) {
	o := opts.withDefaults()
	if n := o.RingBufferSize; n < os.Getpagesize() || n&(n-1) != 0 {
		return nil, fmt.Errorf("ring buffer size %d: must be a power of two of at least one page (%d)", n, os.Getpagesize())
	}
	if o.ExpediteGap < 0 {
		return nil, fmt.Errorf("expedite gap (Options.ExpediteGap) %v: must be 0 (every call) or positive (the engine's idle gap)", o.ExpediteGap)
	}
	spec, err := bpf.LoadCuda()
	if err != nil {
		return nil, fmt.Errorf("load CUDA probe spec: %w", err)
	}
	spec.Maps[bpf.CudaMapEvents].MaxEntries = uint32(o.RingBufferSize)
	mode := bpf.FilterAll
	if len(o.PIDs) > 0 || len(o.Cgroups) > 0 {
		mode = bpf.FilterListed
	}
	// With a PID list alone the probes are attached per process (see
	// plan): the kernel runs them only there, and they need not check.
	uprobeMode := mode
	if len(o.Cgroups) == 0 {
		uprobeMode = bpf.FilterAll
	}
	wake := uint64(0)
	if o.WakeupBytes > 0 {
		wake = uint64(o.WakeupBytes)
	}
	if err := spec.Variables[bpf.CudaVarFilterMode].Set(mode); err != nil {
		return nil, fmt.Errorf("set filter mode: %w", err)
	}
	if err := spec.Variables[bpf.CudaVarUprobeFilterMode].Set(uprobeMode); err != nil {
		return nil, fmt.Errorf("set uprobe filter mode: %w", err)
	}
	if err := spec.Variables[bpf.CudaVarWakeupBytes].Set(wake); err != nil {
		return nil, fmt.Errorf("set wakeup threshold: %w", err)
	}
	if err := spec.Variables[bpf.CudaVarExpediteGapNs].Set(uint64(o.ExpediteGap)); err != nil {
		return nil, fmt.Errorf("set expedite gap: %w", err)
	}
	if n := o.syncSlots; n > 0 {
		spec.Maps[bpf.CudaMapSyncSlots].MaxEntries = uint32(n)
		if err := spec.Variables[bpf.CudaVarSyncSlotMask].Set(uint32(n - 1)); err != nil {
			return nil, fmt.Errorf("set sync slot count: %w", err)
		}
	}
	if err := spec.Variables[bpf.CudaVarGateEnabled].Set(!o.noGate); err != nil {
		return nil, fmt.Errorf("set gate mode: %w", err)
	}
	loadOpts, err := gatePinning(spec, o.GatePinDir)
	if err != nil {
		return nil, err
	}
	t := &Tracer{opts: o, done: make(chan struct{}), libraries: map[fileID]*attachedLibrary{}, expedited: map[uint32]struct{}{},
		probed: map[uint32]probedVerdict{}, flush: flushes{served: make(chan struct{})}}
	if t.objs, err = load(spec, o.singleProbes, loadOpts); err != nil {
		return nil, err
	}
	t.gate = newGate(t.objs.maps.LaunchGate, t.objs.maps.GateStops, t.objs.maps.GateSignals, t.objs.maps.GateArmed, o.ProcRoot, t.launchProbedAt)
	fail := func(err error) (*Tracer, error) {
		return nil, errors.Join(err, t.Close())
	}
	one := uint8(1)
	for _, pid := range o.PIDs {
		if err := t.objs.maps.FilterTgids.Put(pid, one); err != nil {
			return fail(fmt.Errorf("add pid %d to the filter: %w", pid, err))
		}
	}
	for _, cg := range o.Cgroups {
		if err := t.objs.maps.FilterCgroups.Put(cg, one); err != nil {
			return fail(fmt.Errorf("add cgroup %d to the filter: %w", cg, err))
		}
	}
	for _, tp := range []struct {
		name string
		prog *ebpf.Program
	}{{"sched_process_exec", t.objs.tps.Exec}, {"sched_process_exit", t.objs.tps.Exit}} {
		// Raw tracepoints attach by name, with no tracefs or debugfs
		// mounted (see bpf/cuda.c).
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp.name, Program: tp.prog})
		if err != nil {
			return fail(fmt.Errorf("attach raw tracepoint %s: %w", tp.name, err))
		}
		t.procs = append(t.procs, l)
	}
	t.ring, err = ringbuf.NewReader(t.objs.maps.Events)
	if err != nil {
		return fail(fmt.Errorf("open ring buffer: %w", err))
	}
	t.q = newQueue()
	if err := t.rescan(); err != nil {
		return fail(err)
	}
	if o.RescanInterval > 0 {
		t.execs = make(chan uint32, 256)
	}
	t.ifuncs = make(chan ifuncHit, 64)
	t.wg.Add(2)
	go t.readLoop()
	go t.rescanLoop()
	return t, nil
}

// Read blocks until the next event and stores it in ev. After Close it
// returns an error for which errors.Is(err, ErrClosed) holds.
func (t *Tracer) Read(ev *trace.Event) error {
	return t.q.read(ev, t.done)
}

// Stats returns the counters and the attached libraries.
func (t *Tracer) Stats() Stats {
	s := Stats{
		Events:       t.events.Load(),
		DecodeErrors: t.decodeErrors.Load(),
		Drops:        t.drops(),
	}
	s.GateSignals, s.GateSignalErrors = t.gate.Signals()
	s.GateArmedCloses = t.gate.ArmedCloses()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.scanErr != nil {
		s.ScanError = t.scanErr.Error()
	}
	for _, l := range t.libraries {
		s.Libraries = append(s.Libraries, l.info())
	}
	sortLibraries(s.Libraries)
	return s
}

// Rescan runs library discovery now, attaching new files and detaching
// vanished ones, as the periodic rescan does. It returns the error of an
// Options.Libraries path that could not be attached.
func (t *Tracer) Rescan() error {
	select {
	case <-t.done:
		return ErrClosed
	default:
	}
	return t.rescan()
}

// Close opens every launch gate (a clean exit leaves no process stopped;
// an emptied pinned gate is unpinned), detaches every probe, stops the
// reader and the rescan and frees the eBPF objects, in reverse order of
// Open. It unblocks Read and is idempotent; later calls return the first
// call's result.
func (t *Tracer) Close() error {
	t.closeOnce.Do(func() {
		close(t.done)
		var errs []error
		errs = append(errs, t.closeGate())
		// The rescan goroutine must be gone before libraries are detached,
		// so that it cannot attach new ones behind Close.
		if t.ring != nil {
			errs = append(errs, t.ring.Close())
		}
		t.wg.Wait()
		t.mu.Lock()
		t.closed = true
		libs := make([]*attachedLibrary, 0, len(t.libraries))
		for _, l := range t.libraries {
			libs = append(libs, l)
		}
		slices.SortFunc(libs, func(a, b *attachedLibrary) int { return cmp.Compare(a.seq, b.seq) })
		t.libraries = map[fileID]*attachedLibrary{}
		t.mu.Unlock()
		for _, l := range slices.Backward(libs) {
			errs = append(errs, l.close())
		}
		for i := len(t.procs) - 1; i >= 0; i-- {
			errs = append(errs, t.procs[i].Close())
		}
		errs = append(errs, t.objs.close())
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}

// drops sums the per-CPU reserve-failure counters.
func (t *Tracer) drops() uint64 {
	var perCPU []uint64
	if err := t.objs.maps.Drops.Lookup(uint32(0), &perCPU); err != nil {
		return 0
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n
}

// rescan attaches newly discovered library files and detaches vanished
// ones. It returns the errors about Options.Libraries paths; the others
// (an unreadable ld.so.cache, a failed detach) go to Stats.ScanError, and a
// discovered file that cannot be attached is listed with its error.
func (t *Tracer) rescan() error {
	cands, explicit, other := discover(&t.opts)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	present := map[fileID]bool{}
	errs := []error{explicit}
	warns := []error{other}
	for _, c := range cands {
		present[c.id] = true
		if l, ok := t.libraries[c.id]; ok {
			l.repath(c)
			continue
		}
		l, err := attachLibrary(t.plan(), c)
		if err != nil {
			// Remembered (Stats shows why) so it is not retried each scan;
			// a replaced file has a new inode and is tried afresh.
			l = &attachedLibrary{cand: c, err: err}
			if c.source == sourceExtra {
				errs = append(errs, err)
			}
		}
		t.seq++
		l.seq = t.seq
		t.libraries[c.id] = l
		t.libGen++
	}
	for id, l := range t.libraries {
		if !present[id] {
			warns = append(warns, l.close())
			delete(t.libraries, id)
			t.libGen++
		}
	}
	t.scanErr = errors.Join(warns...)
	return errors.Join(errs...)
}

func (t *Tracer) rescanLoop() {
	defer t.wg.Done()
	var tickC <-chan time.Time
	if t.opts.RescanInterval > 0 {
		tick := time.NewTicker(t.opts.RescanInterval)
		defer tick.Stop()
		tickC = tick.C
	}
	// A process that just exec'd maps its libraries within milliseconds;
	// looking at it shortly after its exec event attaches a library file
	// no earlier scan saw without waiting for the next full rescan.
	var pending []uint32
	soon := time.NewTimer(time.Hour)
	soon.Stop()
	for {
		select {
		case <-t.done:
			return
		case <-tickC:
			if err := t.rescan(); err != nil && !errors.Is(err, ErrClosed) {
				t.mu.Lock()
				t.scanErr = errors.Join(t.scanErr, err)
				t.mu.Unlock()
			}
		case pid := <-t.execs:
			if len(pending) == 0 {
				soon.Reset(execScanDelay)
			}
			if len(pending) < cap(t.execs) {
				pending = append(pending, pid)
			}
		case <-soon.C:
			for _, pid := range pending {
				t.scanProcess(pid)
			}
			pending = pending[:0]
		case hit := <-t.ifuncs:
			t.resolveIFunc(hit)
		}
	}
}

// execScanDelay is how long after an exec event its process is scanned.
const execScanDelay = 30 * time.Millisecond

// scanProcess attaches the libcuda files one process maps, if new. Unlike
// rescan it never detaches: only a full rescan knows what vanished.
func (t *Tracer) scanProcess(pid uint32) {
	var cands []candidate
	for _, m := range processMappings(t.opts.ProcRoot, strconv.FormatUint(uint64(pid), 10)) {
		if c, ok := mappingCandidate(t.opts.ProcRoot, m); ok {
			cands = append(cands, c)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	for _, c := range cands {
		if _, ok := t.libraries[c.id]; ok {
			continue
		}
		l, err := attachLibrary(t.plan(), c)
		if err != nil {
			l = &attachedLibrary{cand: c, err: err}
		}
		t.seq++
		l.seq = t.seq
		t.libraries[c.id] = l
		t.libGen++
	}
}

// plan says what attachLibrary attaches: with a PID list and no cgroup
// list, the probes are installed only in the listed processes.
func (t *Tracer) plan() *attachPlan {
	p := &attachPlan{progs: &t.objs.progs, mode: t.opts.mode}
	if len(t.opts.Cgroups) == 0 {
		p.pids = t.opts.PIDs
	}
	return p
}

// ifuncHit is an IFUNC resolver's return seen in a process.
type ifuncHit struct {
	pid  uint32
	fn   trace.Func
	addr uint64
}

// noteIFunc passes a resolver's return to the rescan loop without blocking
// the reader; another process's resolution will do when the loop is busy.
func (t *Tracer) noteIFunc(raw []byte) {
	hit := ifuncHit{
		pid:  binary.LittleEndian.Uint32(raw[offPID:]),
		fn:   trace.Func(raw[offFunc]),
		addr: binary.LittleEndian.Uint64(raw[offArgs:]),
	}
	select {
	case t.ifuncs <- hit:
	default:
	}
}

// resolveIFunc finds the library file and offset of the implementation a
// resolver returned, through the process's mappings, and probes it.
func (t *Tracer) resolveIFunc(hit ifuncHit) {
	m, ok := mappingAt(t.opts.ProcRoot, strconv.FormatUint(uint64(hit.pid), 10), hit.addr)
	if !ok {
		return // the process is gone; the next one to resolve will do
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.libraries[fileID{m.dev, m.ino}]
	if !ok || t.closed {
		return
	}
	if err := l.resolveIFunc(hit.fn, hit.addr-m.start+m.pgoff); err != nil {
		t.scanErr = errors.Join(t.scanErr, err)
	}
}

// noteExec passes an exec'd process to the rescan loop without blocking
// the reader; when the loop is busy the periodic rescan finds it.
func (t *Tracer) noteExec(pid uint32) {
	if t.execs == nil {
		return
	}
	select {
	case t.execs <- pid:
	default:
	}
}
