package uprobe

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/bpf"
	"github.com/gpu-arbiter/arbiter/trace"
)

// Gate returns the tracer's launch gate. It is valid until Close, which
// opens every gate.
func (t *Tracer) Gate() *Gate { return t.gate }

// LaunchProbed returns nil where pid's launch probes are attached, so that
// a closed gate stops it, and otherwise an error saying why not: the
// process maps no libcuda (not a CUDA process yet, or gone), a library it
// maps is not attached or exports no launch function, or the tracer
// installs its breakpoints only in listed processes (Options.PIDs) and pid
// is not one of them. A policy that observes less of a gated process must
// still have its launches probed: the gate lives in the launch probe.
func (t *Tracer) LaunchProbed(pid uint32) error {
	maps := processMappings(t.opts.ProcRoot, strconv.FormatUint(uint64(pid), 10))
	if len(maps) == 0 {
		return fmt.Errorf("process %d maps no libcuda (not a CUDA process, exited, or not under %s): no launch probe can stop it", pid, t.opts.ProcRoot)
	}
	if p := t.plan(); len(p.pids) > 0 && !slices.Contains(p.pids, pid) {
		return fmt.Errorf("process %d is not among the tracer's processes (Options.PIDs): its launch probes are not installed", pid)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	for _, m := range maps {
		l, ok := t.libraries[fileID{m.dev, m.ino}]
		switch {
		case !ok:
			return fmt.Errorf("process %d maps %s, which is not attached yet (the next rescan attaches it)", pid, m.path)
		case l.err != nil:
			return fmt.Errorf("process %d maps %s, which could not be attached: %w", pid, m.path, l.err)
		case !l.probesLaunch():
			return fmt.Errorf("process %d maps %s, which exports no launch function the tracer probes", pid, m.path)
		}
	}
	return nil
}

// probedVerdict remembers that a process's launch probes were found
// attached (LaunchProbed): it holds while the process is the one that
// started at start, no library was attached or detached since (gen), and
// for at most probedTTL after at.
type probedVerdict struct {
	start uint64
	gen   uint64
	at    time.Time
}

const (
	// probedTTL bounds how long a verdict holds without a library change:
	// a process that maps one more libcuda (dlopen of another copy) is
	// checked again within it even before a rescan attaches the library.
	probedTTL = time.Second
	// maxProbedVerdicts bounds the verdicts kept (exited processes' are
	// never asked for again): past it they are all dropped.
	maxProbedVerdicts = 4096
)

// launchProbedAt is LaunchProbed for the gate, which asks it at every
// Gate, once per victim and request, on the engine's loop: LaunchProbed
// reads the process's memory map, thousands of lines in a process that
// loads a framework (milliseconds), so a verdict that the probes are
// attached is kept (see probedVerdict) for the process that started at
// start (clock ticks after boot, as Gate read it).
func (t *Tracer) launchProbedAt(pid uint32, start uint64) error {
	t.mu.Lock()
	v, ok := t.probed[pid]
	gen, closed := t.libGen, t.closed
	t.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if ok && v.start == start && v.gen == gen && time.Since(v.at) < probedTTL {
		if p := t.plan(); len(p.pids) == 0 || slices.Contains(p.pids, pid) {
			return nil
		}
	}
	err := t.LaunchProbed(pid)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		delete(t.probed, pid)
		return err
	}
	if len(t.probed) >= maxProbedVerdicts {
		clear(t.probed)
	}
	// gen was read before the check: a library attached or detached
	// meanwhile makes the next Gate check again.
	t.probed[pid] = probedVerdict{start: start, gen: gen, at: time.Now()}
	return nil
}

// probesLaunch reports whether a launch function is probed in l.
func (l *attachedLibrary) probesLaunch() bool {
	return slices.ContainsFunc(l.probes, func(p Probe) bool { return p.Func.Info().Kind == trace.KindLaunch })
}

// gatePinning prepares the pinning of the gate's maps (the gate and its
// stop records): by name in dir, which must be on a BPF filesystem
// (created if missing), or none where dir is empty. It returns the load
// options.
func gatePinning(spec *ebpf.CollectionSpec, dir string) (*ebpf.CollectionOptions, error) {
	pin := ebpf.PinByName
	if dir == "" {
		pin = ebpf.PinNone
	}
	for _, name := range []string{bpf.CudaMapLaunchGate, bpf.CudaMapGateStops} {
		spec.Maps[name].Pinning = pin
	}
	if dir == "" {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("launch gate pin directory: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil, fmt.Errorf("launch gate pin directory: %w", err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return nil, fmt.Errorf("launch gate pin directory %s is not on a BPF filesystem: mount one (mount -t bpf bpf /sys/fs/bpf)", dir)
	}
	return &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}, nil
}

// closeGate opens every gate at Close and, where the gate is pinned and
// now empty, removes the pin: nothing is left for `arbiter recover`.
func (t *Tracer) closeGate() error {
	if t.gate == nil {
		return nil
	}
	// Disarmed first: the probes stay attached until Close detaches the
	// libraries, and an armed request must not close a gate that
	// ReleaseAll has opened.
	derr := t.gate.disarmAll()
	if derr != nil {
		derr = fmt.Errorf("disarm the launch gates at close: %w", derr)
	}
	_, err := t.gate.ReleaseAll()
	if err != nil {
		err = fmt.Errorf("open the launch gates at close: %w", err)
	}
	err = errors.Join(derr, err)
	if t.opts.GatePinDir != "" && err == nil {
		err = t.gate.Unpin()
	}
	return errors.Join(err, t.gate.Close())
}
