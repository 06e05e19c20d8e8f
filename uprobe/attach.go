package uprobe

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/gpu-arbiter/arbiter/bpf"
	"github.com/gpu-arbiter/arbiter/trace"
)

// attachedLibrary is one library file and its probe links.
type attachedLibrary struct {
	cand    candidate
	probes  []Probe
	missing []string
	links   []link.Link
	err     error
}

func (l *attachedLibrary) info() Library {
	lib := Library{Path: l.cand.path, Dev: l.cand.id.dev, Inode: l.cand.id.ino, Missing: slices.Clone(l.missing)}
	for _, p := range l.probes {
		lib.Attached = append(lib.Attached, p.Func.String())
		p.Prologue = slices.Clone(p.Prologue)
		lib.Probes = append(lib.Probes, p)
	}
	if l.err != nil {
		lib.Error = l.err.Error()
	}
	return lib
}

// close detaches in reverse order of attaching.
func (l *attachedLibrary) close() error {
	var errs []error
	for i := len(l.links) - 1; i >= 0; i-- {
		if err := l.links[i].Close(); err != nil {
			errs = append(errs, err)
		}
	}
	l.links = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach %s: %w", l.cand.path, err)
	}
	return nil
}

// programFor returns the entry program of a Func and, for synchronizers,
// the return program.
func programFor(objs *bpf.CudaObjects, f trace.Func) (entry, ret *ebpf.Program) {
	switch f {
	case trace.FuncLaunchKernel, trace.FuncLaunchKernelPtsz,
		trace.FuncLaunchCooperativeKernel, trace.FuncLaunchCooperativeKernelPtsz:
		return objs.UprobeLaunch, nil
	case trace.FuncLaunchKernelEx, trace.FuncLaunchKernelExPtsz:
		return objs.UprobeLaunchEx, nil
	}
	if f.Info().Kind == trace.KindSync {
		return objs.UprobeSync, objs.UretprobeSync
	}
	// Copies and cuGraphLaunch: four register arguments.
	return objs.UprobeArgs, nil
}

// attachLibrary resolves and attaches every probed function present in one
// library file. On error nothing stays attached.
func attachLibrary(objs *bpf.CudaObjects, c candidate, mode probeMode) (*attachedLibrary, error) {
	l := &attachedLibrary{cand: c}
	syms, err := resolveSymbols(c.path)
	if err != nil {
		return nil, err
	}
	ex, err := link.OpenExecutable(c.path)
	if err != nil {
		return nil, fmt.Errorf("open %s for uprobes: %w", c.path, err)
	}
	for _, f := range trace.Funcs() {
		sym, ok := syms[f]
		if !ok {
			l.missing = append(l.missing, f.String())
			continue
		}
		if sym.ifunc {
			l.missing = append(l.missing, f.String()+" (ifunc)")
			continue
		}
		entry, ret := programFor(objs, f)
		offset := sym.offset
		switch mode {
		case probeNoop:
			entry, ret = objs.UprobeNoop, nil
		case probeEntryOffset:
			offset = 0
		}
		opts := &link.UprobeOptions{
			Address: sym.address,
			Offset:  offset,
			Cookie:  uint64(f) | uint64(f.Info().Kind)<<bpf.CookieKindShift,
		}
		up, err := ex.Uprobe("", entry, opts)
		if err != nil {
			l.close()
			return nil, fmt.Errorf("attach uprobe %s in %s at %#x+%d: %w", sym.name, c.path, sym.address, offset, err)
		}
		l.links = append(l.links, up)
		if ret != nil {
			rp, err := ex.Uretprobe("", ret, opts)
			if err != nil {
				l.close()
				return nil, fmt.Errorf("attach uretprobe %s in %s: %w", sym.name, c.path, err)
			}
			l.links = append(l.links, rp)
		}
		l.probes = append(l.probes, Probe{Func: f, Symbol: sym.name, Address: sym.address,
			Offset: offset, Prologue: sym.prologue, Return: ret != nil})
	}
	return l, nil
}

// probeMode selects what is attached; the modes other than probeFull exist
// for the probe-cost benchmarks.
type probeMode uint8

const (
	probeFull        probeMode = iota
	probeNoop                  // the empty program at the same sites
	probeEntryOffset           // the real programs, always at the entry
)

func sortLibraries(libs []Library) {
	sort.Slice(libs, func(i, j int) bool {
		if libs[i].Path != libs[j].Path {
			return libs[i].Path < libs[j].Path
		}
		return libs[i].Inode < libs[j].Inode
	})
}
