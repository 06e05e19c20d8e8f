package uprobe

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/gpu-arbiter/arbiter/bpf"
	"github.com/gpu-arbiter/arbiter/trace"
)

// attachedLibrary is one library file and its probe links.
type attachedLibrary struct {
	seq     uint64 // attach order, for detaching in reverse
	cand    candidate
	ex      *link.Executable
	plan    *attachPlan
	probes  []Probe
	missing []string
	// ifuncs are the probed indirect functions whose implementation no
	// process has resolved yet.
	ifuncs map[trace.Func]symbol
	links  []link.Link
	err    error
}

func (l *attachedLibrary) info() Library {
	lib := Library{Path: l.cand.path, Dev: l.cand.id.dev, Inode: l.cand.id.ino, Missing: slices.Clone(l.missing)}
	for _, f := range trace.Funcs() {
		if _, ok := l.ifuncs[f]; ok {
			lib.Missing = append(lib.Missing, f.String()+" (ifunc, not resolved yet)")
		}
	}
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

// repath follows a library file to the path discovery now reaches it by
// (the file replaced at its old path and still mapped by a process: its
// map_files entry), so that later attaches in it (IFUNC implementations)
// and Stats name this file, not its successor. The probes stay: the kernel
// holds them by inode.
func (l *attachedLibrary) repath(c candidate) {
	if c.path == l.cand.path {
		return
	}
	if cur, err := os.Stat(l.cand.path); err == nil {
		if st, ok := cur.Sys().(*syscall.Stat_t); ok && (fileID{uint64(st.Dev), st.Ino}) == l.cand.id {
			return // the old path still names this file
		}
	}
	l.cand = c
	if ex, err := link.OpenExecutable(c.path); err == nil {
		l.ex = ex
	}
}

// close detaches every probe. The links are independent, and each detach
// waits for a kernel grace period (tens of ms on a paravirtualized guest),
// so they are closed concurrently; errors are joined in reverse order of
// attaching.
func (l *attachedLibrary) close() error {
	errs := make([]error, len(l.links))
	var wg sync.WaitGroup
	for i, lk := range l.links {
		wg.Go(func() { errs[len(errs)-1-i] = lk.Close() })
	}
	wg.Wait()
	l.links = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach %s: %w", l.cand.path, err)
	}
	return nil
}

// programFor returns the programs and attach offset for f's site at
// offset under mode: its entry program and, for synchronizers, its return
// program; the empty program in their place for the noop modes; the
// function's entry instead of offset for probeEntryOffset.
func programFor(p *programs, mode probeMode, f trace.Func, offset uint64) (entry, ret *ebpf.Program, off uint64) {
	switch f {
	case trace.FuncLaunchKernel, trace.FuncLaunchKernelPtsz,
		trace.FuncLaunchCooperativeKernel, trace.FuncLaunchCooperativeKernelPtsz:
		entry = p.launch
	case trace.FuncLaunchKernelEx, trace.FuncLaunchKernelExPtsz:
		entry = p.launchEx
	default:
		if f.Info().Kind == trace.KindSync {
			entry, ret = p.sync, p.retSync
		} else {
			// Copies and cuGraphLaunch: four register arguments.
			entry = p.args
		}
	}
	switch mode {
	case probeNoop:
		entry, ret = p.noop, nil
	case probeNoopReturn:
		entry = p.noop
		if ret != nil {
			ret = p.noop
		}
	case probeEntryOffset:
		offset = 0
	}
	return entry, ret, offset
}

// sites are the attach points of one program in one library.
type sites struct {
	ret                     bool
	addrs, offsets, cookies []uint64
	names                   []string
}

// attachLibrary resolves and attaches every probed function present in one
// library file. On error nothing stays attached.
func attachLibrary(plan *attachPlan, c candidate) (*attachedLibrary, error) {
	p, mode := plan.progs, plan.mode
	l := &attachedLibrary{cand: c, plan: plan, ifuncs: map[trace.Func]symbol{}}
	syms, err := resolveSymbols(c.path)
	if err != nil {
		return nil, err
	}
	ex, err := link.OpenExecutable(c.path)
	if err != nil {
		return nil, fmt.Errorf("open %s for uprobes: %w", c.path, err)
	}
	l.ex = ex
	// Sites grouped per program and direction, in first-use order.
	type key struct {
		prog *ebpf.Program
		ret  bool
	}
	var order []key
	byProg := map[key]*sites{}
	add := func(prog *ebpf.Program, ret bool, sym symbol, offset, cookie uint64) {
		k := key{prog, ret}
		s, ok := byProg[k]
		if !ok {
			s = &sites{ret: ret}
			byProg[k] = s
			order = append(order, k)
		}
		s.addrs = append(s.addrs, sym.address)
		s.offsets = append(s.offsets, offset)
		s.cookies = append(s.cookies, cookie)
		s.names = append(s.names, sym.name)
	}
	for _, f := range trace.Funcs() {
		sym, ok := syms[f]
		if !ok {
			l.missing = append(l.missing, f.String())
			continue
		}
		cookie := uint64(f) | uint64(f.Info().Kind)<<bpf.CookieKindShift
		if sym.ifunc {
			// Learn the implementation from the resolver's return.
			add(p.ifunc, true, sym, 0, cookie)
			l.ifuncs[f] = sym
			continue
		}
		entry, ret, offset := programFor(p, mode, f, sym.offset)
		add(entry, false, sym, offset, cookie)
		if ret != nil {
			add(ret, true, sym, offset, cookie)
		}
		l.probes = append(l.probes, Probe{Func: f, Symbol: sym.name, Address: sym.address,
			Offset: offset, Prologue: sym.prologue, Return: ret != nil})
	}
	for _, k := range order {
		if err := l.attach(ex, k.prog, byProg[k], p.multi, plan.pids); err != nil {
			l.close()
			return nil, err
		}
	}
	return l, nil
}

// resolveIFunc probes the implementation that fn's resolver chose, at
// file offset impl, once.
func (l *attachedLibrary) resolveIFunc(fn trace.Func, impl uint64) error {
	sym, ok := l.ifuncs[fn]
	if !ok {
		return nil
	}
	f, err := os.Open(l.cand.path)
	if err != nil {
		return fmt.Errorf("resolve ifunc %s: %w", sym.name, err)
	}
	code := make([]byte, prologueLen)
	n, _ := f.ReadAt(code, int64(impl))
	f.Close()
	code = code[:n]
	p := l.plan.progs
	entry, ret, offset := programFor(p, l.plan.mode, fn, attachOffset(sym.machine, code))
	cookie := uint64(fn) | uint64(fn.Info().Kind)<<bpf.CookieKindShift
	site := func(ret bool) *sites {
		return &sites{ret: ret, addrs: []uint64{impl}, offsets: []uint64{offset}, cookies: []uint64{cookie}, names: []string{sym.name}}
	}
	if err := l.attach(l.ex, entry, site(false), p.multi, l.plan.pids); err != nil {
		return fmt.Errorf("resolve ifunc %s: %w", sym.name, err)
	}
	if ret != nil {
		if err := l.attach(l.ex, ret, site(true), p.multi, l.plan.pids); err != nil {
			return fmt.Errorf("resolve ifunc %s: %w", sym.name, err)
		}
	}
	delete(l.ifuncs, fn)
	l.probes = append(l.probes, Probe{Func: fn, Symbol: sym.name, Address: impl, Offset: offset,
		Prologue: code, Return: ret != nil, Resolver: sym.address})
	return nil
}

// attach attaches prog at every site: with one uprobe_multi link, or one
// perf-event uprobe per site; per process where pids are given, so that the
// kernel installs the breakpoints only in those processes.
func (l *attachedLibrary) attach(ex *link.Executable, prog *ebpf.Program, s *sites, multi bool, pids []uint32) error {
	if len(pids) == 0 {
		return l.attachPID(ex, prog, s, multi, 0)
	}
	for _, pid := range pids {
		err := l.attachPID(ex, prog, s, multi, pid)
		// A listed process that has exited has nothing left to trace.
		if err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
	}
	return nil
}

func (l *attachedLibrary) attachPID(ex *link.Executable, prog *ebpf.Program, s *sites, multi bool, pid uint32) error {
	if multi {
		opts := &link.UprobeMultiOptions{Addresses: s.addrs, Offsets: s.offsets, Cookies: s.cookies, PID: pid}
		attach := ex.UprobeMulti
		if s.ret {
			attach = ex.UretprobeMulti
		}
		lk, err := attach(nil, prog, opts)
		if err != nil {
			return fmt.Errorf("attach %s at %d sites in %s (uprobe_multi, pid %d): %w", prog, len(s.addrs), l.cand.path, pid, err)
		}
		l.links = append(l.links, lk)
		return nil
	}
	for i := range s.addrs {
		opts := &link.UprobeOptions{Address: s.addrs[i], Offset: s.offsets[i], Cookie: s.cookies[i], PID: int(pid)}
		attach := ex.Uprobe
		if s.ret {
			attach = ex.Uretprobe
		}
		lk, err := attach("", prog, opts)
		if errors.Is(err, ebpf.ErrNotSupported) {
			err = fmt.Errorf("%w (uprobes with BPF cookies need kernel 5.15 or later)", err)
		}
		if err != nil {
			return fmt.Errorf("attach %s to %s in %s at %#x+%d (pid %d): %w", prog, s.names[i], l.cand.path, s.addrs[i], s.offsets[i], pid, err)
		}
		l.links = append(l.links, lk)
	}
	return nil
}

// attachPlan is what attachLibrary attaches.
type attachPlan struct {
	progs *programs
	mode  probeMode
	// pids, when not empty, limits the breakpoints to these processes.
	pids []uint32
}

// probeMode selects what is attached; the modes other than probeFull exist
// for the probe-cost benchmarks.
type probeMode uint8

const (
	probeFull        probeMode = iota
	probeNoop                  // the empty program at the same sites
	probeNoopReturn            // the empty program, also as return probe on syncs
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
