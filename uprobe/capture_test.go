// Tests with real eBPF of what is captured: every argument of every
// variant, sync durations and results, symbol versions, IFUNCs, latency.

package uprobe

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gpu-arbiter/arbiter/trace"
)

func openTracer(t testing.TB, o *Options) *Tracer {
	t.Helper()
	tr, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// TestCaptureEveryVariant runs calls round-robin through every probed
// variant, enough for 100,000 launches (and about as many copies and syncs)
// in a process started before the probes were attached and in one started
// after, and checks every field of every event.
func TestCaptureEveryVariant(t *testing.T) {
	r := newRig(t)
	const launches = 100_000
	var launchFuncs int
	for _, f := range trace.Funcs() {
		if f.Info().Kind == trace.KindLaunch {
			launchFuncs++
		}
	}
	n := (launches*len(trace.Funcs()) + launchFuncs - 1) / launchFuncs
	before := r.start(t, nil, true, "calls", strconv.Itoa(n))
	tr := openTracer(t, r.options())
	lib := tr.Stats().Libraries
	if len(lib) != 1 || len(lib[0].Attached) != len(trace.Funcs()) || len(lib[0].Missing) != 0 {
		t.Fatalf("libraries %+v: want the stub with all %d functions attached", lib, len(trace.Funcs()))
	}
	after := r.start(t, nil, false, "calls", strconv.Itoa(n))
	before.send(t, "go")

	checkers := map[uint32]*callChecker{before.pid: {pid: before.pid}, after.pid: {pid: after.pid}}
	var exec, exits int
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	collect(t, tr, 2*time.Minute, func(ev *trace.Event) bool {
		c, ok := checkers[ev.PID]
		if !ok {
			return false
		}
		switch ev.Kind {
		case trace.KindExec:
			exec++
			if ev.PID != after.pid || ev.Proc.CommString() != "exercise" || ev.Proc.PPID != uint32(os.Getpid()) {
				t.Errorf("exec event %+v", ev)
			}
		case trace.KindExit:
			exits++
			if ev.Proc.ExitCode != 0 || ev.Proc.CommString() != "exercise" {
				t.Errorf("exit event %+v", ev)
			}
		default:
			c.check(ev)
		}
		return exits == 2
	})
	runtime.ReadMemStats(&m1)
	// Reading and decoding allocate nothing per event; a few allocations
	// come from the runtime and the collecting goroutine.
	if allocs := m1.Mallocs - m0.Mallocs; allocs > uint64(n/100) {
		t.Errorf("%d allocations while reading %d events", allocs, 2*n)
	}
	before.wait(t)
	after.wait(t)
	for _, c := range checkers {
		if c.next != uint64(n) || c.launches < launches || c.mismatches != 0 || c.zeroDur != 0 {
			t.Errorf("pid %d: %d calls seen of %d (%d launches, want %d), %d mismatched, %d syncs without duration\n%s",
				c.pid, c.next, n, c.launches, launches, c.mismatches, c.zeroDur, strings.Join(c.first, "\n"))
		}
	}
	if exec != 1 {
		t.Errorf("%d exec events for the process started after attach, want 1", exec)
	}
	if s := tr.Stats(); s.Drops != 0 || s.DecodeErrors != 0 {
		t.Errorf("stats %+v: want no drops or decode errors", s)
	}
}

// TestPerfEventProbes runs the capture check through the older kernels'
// path: one perf-event uprobe per site instead of uprobe_multi links.
func TestPerfEventProbes(t *testing.T) {
	r := newRig(t)
	o := r.options()
	o.singleProbes = true
	tr := openTracer(t, o)
	if tr.objs.progs.multi {
		t.Fatal("uprobe_multi programs loaded despite singleProbes")
	}
	const n = 3000
	p := r.start(t, nil, false, "calls", strconv.Itoa(n))
	checkCalls(t, tr, p, n, "perf-event probes")
}

// TestSyncDurationAndResult checks that synchronizers report their real
// duration (at least the emulated kernel time they wait for) and their real
// return code.
func TestSyncDurationAndResult(t *testing.T) {
	r := newRig(t)
	tr := openTracer(t, r.options())
	const us = 3000
	p := r.start(t, nil, false, "sync", strconv.Itoa(us))
	var stream, event, fn, ctx, ns uint64
	if _, err := fmt.Sscanf(p.line(t), "stream=%d event=%d function=%d context=%d ns=%d", &stream, &event, &fn, &ctx, &ns); err != nil {
		t.Fatal(err)
	}
	var got []trace.Event
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		if ev.PID == p.pid && ev.Kind != trace.KindExec {
			got = append(got, *ev)
		}
		return ev.PID == p.pid && ev.Kind == trace.KindExit
	})
	p.wait(t)
	type want struct {
		fn            trace.Func
		handle, other uint64
		result        int32
		minDur        uint64
	}
	wants := []want{
		{trace.FuncLaunchKernel, fn, stream, 0, 0},
		{trace.FuncStreamSynchronize, stream, 0, 0, ns},
		{trace.FuncStreamSynchronize, 0xbad0, 0, 400, 0},
		{trace.FuncLaunchKernel, fn, stream, 0, 0},
		{trace.FuncEventRecord, event, stream, 0, 0},
		{trace.FuncEventSynchronize, event, 0, 0, ns - 500_000}, // recorded after the launch returned
		{trace.FuncLaunchKernel, fn, stream, 0, 0},
		{trace.FuncCtxSynchronize, 0, 0, 0, ns - 500_000},
		{trace.FuncLaunchKernel, fn, stream, 0, 0},
		{trace.FuncCtxSynchronizeV2, ctx, 0, 0, ns - 500_000},
		{trace.FuncLaunchKernel, fn, stream, 0, 0},
		{trace.FuncCtxSynchronizeV2, 0, 0, 0, ns - 500_000},
		{trace.FuncCtxSynchronizeV2, 0xbad0, 0, 201, 0},
	}
	if len(got) != len(wants)+1 {
		t.Fatalf("%d events, want %d launches/syncs and an exit: %+v", len(got), len(wants), got)
	}
	for i, w := range wants {
		ev := got[i]
		if ev.Func != w.fn {
			t.Errorf("event %d: %v, want %v", i, ev.Func, w.fn)
			continue
		}
		if ev.Kind == trace.KindLaunch {
			if ev.Launch.Function != w.handle || ev.Launch.Stream != w.other || ev.Launch.Grid != [3]uint32{1, 1, 1} {
				t.Errorf("event %d: launch %+v", i, ev.Launch)
			}
			continue
		}
		if ev.Sync.Handle != w.handle || ev.Sync.Other != w.other || ev.Sync.Result != w.result {
			t.Errorf("event %d %v: sync %+v, want handle %#x other %#x result %d", i, ev.Func, ev.Sync, w.handle, w.other, w.result)
		}
		// The upper bound only catches garbage (a shared machine may
		// deschedule the workload for tens of ms).
		if maxDur := uint64(2e9); ev.Sync.Duration < w.minDur || ev.Sync.Duration > maxDur {
			t.Errorf("event %d %v: duration %d ns, want in [%d, %d]", i, ev.Func, ev.Sync.Duration, w.minDur, maxDur)
		}
		if i > 0 && ev.Time < got[i-1].Time {
			t.Errorf("event %d: entry time %d before the previous call's %d", i, ev.Time, got[i-1].Time)
		}
	}
	if last := got[len(got)-1]; last.Kind != trace.KindExit || last.Proc.ExitCode != 0 {
		t.Errorf("last event %+v, want a clean exit", last)
	}
}

// TestVersionedDuplicate checks that the probe sits on the default version
// of cuStreamSynchronize: calls through the hidden older version (which a
// lookup by bare name would pick) produce no event, the default one does.
func TestVersionedDuplicate(t *testing.T) {
	r := newRig(t)
	tr := openTracer(t, r.options())
	for _, p := range tr.Stats().Libraries[0].Probes {
		if p.Func == trace.FuncStreamSynchronize && p.Symbol != "cuStreamSynchronize@@LIBCUDA_2.0" {
			t.Errorf("attached %s", p.Symbol)
		}
	}
	p := r.start(t, nil, false, "oldsync")
	var got []trace.Event
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		if ev.PID == p.pid && ev.Kind == trace.KindSync {
			got = append(got, *ev)
		}
		return ev.PID == p.pid && ev.Kind == trace.KindExit
	})
	p.wait(t)
	if len(got) != 1 || got[0].Func != trace.FuncStreamSynchronize || got[0].Sync.Handle != 0x2e40 || got[0].Sync.Result != 400 {
		t.Errorf("sync events %+v, want exactly the one default-version call on 0x2e40", got)
	}
}

// TestIFunc checks a probed function exported as a GNU indirect function:
// the tracer learns the implementation from its resolver's return in a
// traced process and probes it there.
func TestIFunc(t *testing.T) {
	r := newRig(t)
	dir := t.TempDir()
	lib, prog := filepath.Join(dir, "libcuda.so.1"), filepath.Join(dir, "ifunc")
	for _, args := range [][]string{
		{"-shared", "-fPIC", "-O2", "-fcf-protection=full", "-fno-omit-frame-pointer", "-DLIB", "-Wl,-soname,libcuda.so.1", "-o", lib, "testdata/ifunc.c"},
		{"-O2", "-Wl,-z,lazy", "-o", prog, "testdata/ifunc.c", lib, "-Wl,-rpath," + dir},
	} {
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", args, err, out)
		}
	}
	o := r.options()
	o.Libraries = []string{lib}
	tr := openTracer(t, o)
	libs := tr.Stats().Libraries
	if len(libs) != 1 || !slices.Contains(libs[0].Missing, "cuLaunchKernel (ifunc, not resolved yet)") {
		t.Fatalf("libraries %+v: want cuLaunchKernel waiting for its resolver", libs)
	}
	// A symbol the library does not export (here every other one, as
	// cuCtxSynchronize_v2 on drivers before CUDA 13) is only listed.
	if libs[0].Error != "" || !slices.Contains(libs[0].Missing, "cuCtxSynchronize_v2") {
		t.Fatalf("library %+v: want the absent symbols listed as missing, without an error", libs[0])
	}
	const n = 50
	p := startCmd(t, exec.Command(prog, strconv.Itoa(n)), nil, false)
	// Visible before it resolves: a resolver's return from a process the
	// tracer cannot see is dropped as from one that has gone.
	r.expose(t, int(p.pid))
	p.send(t, "resolve")
	if l := p.line(t); l != "resolved" {
		t.Fatalf("program said %q", l)
	}
	got := waitLibrary(t, tr, func(l Library) bool { return slices.Contains(l.Attached, "cuLaunchKernel") }, true)
	var probe Probe
	for _, pr := range got.Probes {
		if pr.Func == trace.FuncLaunchKernel {
			probe = pr
		}
	}
	impl := localSymbol(t, lib, "launch_impl")
	if probe.Resolver == 0 || probe.Address != impl || probe.Offset != attachOffset(elf.EM_X86_64, probe.Prologue) {
		t.Errorf("probe %+v: want the implementation at %#x, not the resolver", probe, impl)
	}
	p.send(t, "go")
	var seen int
	var bad []string
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		// The resolving call itself (NULL function) may or may not be seen,
		// depending on how soon the implementation's probe was attached.
		if ev.PID == p.pid && ev.Kind == trace.KindLaunch && ev.Launch.Function != 0 {
			want := expectCall(uint64(seen)*uint64(len(trace.Funcs())), p.pid)
			g := *ev
			g.Time, g.TID, g.Cgroup = 0, 0, 0
			if g != want && len(bad) < 3 {
				bad = append(bad, fmt.Sprintf("got %+v\nwant %+v", g, want))
			}
			seen++
		}
		return ev.PID == p.pid && ev.Kind == trace.KindExit
	})
	p.wait(t)
	if seen != n || len(bad) != 0 {
		t.Errorf("%d launches seen of %d\n%s", seen, n, strings.Join(bad, "\n"))
	}
}

// localSymbol returns the file offset of a .symtab function.
func localSymbol(t *testing.T, path, name string) uint64 {
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, err := ef.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == name {
			off, _ := fileOffset(ef, s.Value)
			return off
		}
	}
	t.Fatalf("%s has no symbol %s", path, name)
	return 0
}

// TestDeliveryLatency checks that records below the wakeup threshold (the
// probes then do not wake the reader) still arrive within the reader's
// poll interval, and that waking on every record works as well.
func TestDeliveryLatency(t *testing.T) {
	r := newRig(t)
	for _, wake := range []int{0, -1} {
		o := r.options()
		o.WakeupBytes = wake
		tr := openTracer(t, o)
		// One call of every variant.
		p := r.start(t, nil, true, "calls", strconv.Itoa(len(trace.Funcs())))
		p.send(t, "go")
		var worst time.Duration
		var seen int
		collect(t, tr, time.Minute, func(ev *trace.Event) bool {
			if ev.PID != p.pid || ev.Kind == trace.KindExec {
				return false
			}
			var ts syscall.Timespec
			if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
				t.Fatal(errno)
			}
			// A sync's time is its entry; its record leaves at the return.
			if lag := time.Duration(ts.Nano() - int64(ev.Time+ev.Sync.Duration)); lag > worst {
				worst = lag
			}
			seen++
			return ev.Kind == trace.KindExit
		})
		p.wait(t)
		t.Logf("wakeup %d: worst lag %v over %d events", wake, worst, seen)
		// 10 ms poll: a second is a hundred polls, room for a loaded
		// shared machine to schedule the reader late.
		if worst > time.Second || seen != len(trace.Funcs())+1 {
			t.Errorf("wakeup %d: worst lag %v over %d events", wake, worst, seen)
		}
		tr.Close()
	}
}
