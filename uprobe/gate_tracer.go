package uprobe

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

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

// probesLaunch reports whether a launch function is probed in l.
func (l *attachedLibrary) probesLaunch() bool {
	return slices.ContainsFunc(l.probes, func(p Probe) bool { return p.Func.Info().Kind == trace.KindLaunch })
}

// gatePinning prepares the gate map's pinning: by name in dir, which must
// be on a BPF filesystem (created if missing), or none where dir is empty.
// It returns the load options.
func gatePinning(spec *ebpf.CollectionSpec, dir string) (*ebpf.CollectionOptions, error) {
	m := spec.Maps[bpf.CudaMapLaunchGate]
	if dir == "" {
		m.Pinning = ebpf.PinNone
		return nil, nil
	}
	m.Pinning = ebpf.PinByName
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
