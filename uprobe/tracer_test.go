package uprobe

import (
	"debug/elf"
	"errors"
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

	"github.com/cilium/ebpf"

	"github.com/gpu-arbiter/arbiter/internal/testenv"
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

// TestCaptureEveryVariant runs 100,000 calls, round-robin through every
// probed variant, in a process started before the probes were attached and
// in one started after, and checks every field of every event.
func TestCaptureEveryVariant(t *testing.T) {
	r := newRig(t)
	const n = 100_000
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
	if allocs := m1.Mallocs - m0.Mallocs; allocs > n/100 {
		t.Errorf("%d allocations while reading %d events", allocs, 2*n)
	}
	before.wait(t)
	after.wait(t)
	for _, c := range checkers {
		if c.next != n || c.mismatches != 0 || c.zeroDur != 0 {
			t.Errorf("pid %d: %d calls seen of %d, %d mismatched, %d syncs without duration\n%s",
				c.pid, c.next, n, c.mismatches, c.zeroDur, strings.Join(c.first, "\n"))
		}
	}
	if exec != 1 {
		t.Errorf("%d exec events for the process started after attach, want 1", exec)
	}
	if s := tr.Stats(); s.Drops != 0 || s.DecodeErrors != 0 {
		t.Errorf("stats %+v: want no drops or decode errors", s)
	}
}

// TestSyncDurationAndResult checks that synchronizers report their real
// duration (at least the emulated kernel time they wait for) and their real
// return code.
func TestSyncDurationAndResult(t *testing.T) {
	r := newRig(t)
	tr := openTracer(t, r.options())
	const us = 3000
	p := r.start(t, nil, false, "sync", strconv.Itoa(us))
	var stream, event, fn, ns uint64
	if _, err := fmt.Sscanf(p.line(t), "stream=%d event=%d function=%d ns=%d", &stream, &event, &fn, &ns); err != nil {
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

// TestRescanCopy checks that a copy of the library at another path, mapped
// by a process that appears after Open, is attached by the periodic rescan
// and captured; and detached once no process maps it any more.
func TestRescanCopy(t *testing.T) {
	r := newRig(t)
	dir := t.TempDir()
	copyLib(t, r.stub.Lib, filepath.Join(dir, "libcuda.so.1"))
	// Started before Open (no exec event) but shown to discovery only after
	// it, so that only the periodic rescan can find the copy.
	p := r.start(t, []string{"LD_LIBRARY_PATH=" + dir}, true, "calls", "300")
	o := r.options()
	o.RescanInterval = 100 * time.Millisecond
	tr := openTracer(t, o)
	if n := len(tr.Stats().Libraries); n != 1 {
		t.Fatalf("%d libraries before the process is shown", n)
	}
	r.expose(t, int(p.pid))
	lib := waitLibrary(t, tr, func(l Library) bool { return strings.HasPrefix(l.Path, dir) }, true)
	if len(lib.Attached) != len(trace.Funcs()) {
		t.Fatalf("copy attached %v", lib.Attached)
	}
	p.send(t, "go")
	c := &callChecker{pid: p.pid}
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		if ev.PID == p.pid && (ev.Kind == trace.KindLaunch || ev.Kind == trace.KindCopy || ev.Kind == trace.KindSync) {
			c.check(ev)
		}
		return ev.PID == p.pid && ev.Kind == trace.KindExit
	})
	p.wait(t)
	if c.next != 300 || c.mismatches != 0 {
		t.Errorf("%d calls seen through the copy, %d mismatched\n%s", c.next, c.mismatches, strings.Join(c.first, "\n"))
	}
	waitLibrary(t, tr, func(l Library) bool { return strings.HasPrefix(l.Path, dir) }, false)
}

// TestMountNamespace checks a library that exists only inside another
// mount namespace: a tmpfs holding a copy of the stub, bind-mounted over
// another directory, neither visible from the tracer's namespace.
func TestMountNamespace(t *testing.T) {
	r := newRig(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatal("unshare (util-linux) is needed for this test")
	}
	o := r.options()
	o.RescanInterval = 100 * time.Millisecond
	tr := openTracer(t, o)
	store, target := t.TempDir(), t.TempDir()
	script := fmt.Sprintf(`set -e
mount -t tmpfs arbiter-test %[1]s
cp %[3]s %[1]s/libcuda.so.1
mount --bind %[1]s %[2]s
LD_LIBRARY_PATH=%[2]s exec %[4]s calls 300`, store, target, r.stub.Lib, r.exercise)
	p := startCmd(t, exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", script), nil, true)
	r.expose(t, int(p.pid))
	lib := waitLibrary(t, tr, func(l Library) bool { return strings.Contains(l.Path, "/root"+target) }, true)
	if !strings.HasPrefix(lib.Path, r.procRoot) {
		t.Errorf("library path %s: want a path through the process's root", lib.Path)
	}
	if _, err := os.Stat(filepath.Join(target, "libcuda.so.1")); err == nil {
		t.Fatal("the library is visible outside the namespace: the test proves nothing")
	}
	p.send(t, "go")
	c := &callChecker{pid: p.pid}
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		if ev.PID == p.pid && (ev.Kind == trace.KindLaunch || ev.Kind == trace.KindCopy || ev.Kind == trace.KindSync) {
			c.check(ev)
		}
		return ev.PID == p.pid && ev.Kind == trace.KindExit
	})
	p.wait(t)
	if c.next != 300 || c.mismatches != 0 {
		t.Errorf("%d calls seen in the namespace, %d mismatched\n%s", c.next, c.mismatches, strings.Join(c.first, "\n"))
	}
}

// copyLib copies a file (a new inode).
func copyLib(t testing.TB, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// waitLibrary waits until a library matching match is attached (present)
// or gone (!present).
func waitLibrary(t testing.TB, tr *Tracer, match func(Library) bool, present bool) Library {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := tr.Stats()
		for _, l := range s.Libraries {
			if match(l) {
				if l.Error != "" {
					t.Fatalf("library %s: %s", l.Path, l.Error)
				}
				if present {
					return l
				}
				goto notYet
			}
		}
		if !present {
			return Library{}
		}
	notYet:
		if time.Now().After(deadline) {
			var libs []string
			for _, l := range s.Libraries {
				libs = append(libs, fmt.Sprintf("%s (inode %d, %d attached, error %q)", l.Path, l.Inode, len(l.Attached), l.Error))
			}
			t.Fatalf("library present=%v not reached; libraries:\n%s", present, strings.Join(libs, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDropsAndOverhead checks, in one serving process: the unprobed
// per-call time; the probed time with the reader draining; that with the
// reader stopped the full ring drops and counts records without slowing
// the workload beyond the probe cost; that every record is either read or
// counted as dropped; and that after Close the time is back to baseline.
func TestDropsAndOverhead(t *testing.T) {
	r := newRig(t)
	p := r.start(t, nil, false, "serve")
	if l := p.line(t); l != "ready" {
		t.Fatalf("exerciser said %q", l)
	}
	const n, reps = 2000, 9
	base := p.bestPerCall(t, n, reps)

	o := r.options()
	o.PIDs = []uint32{p.pid}
	o.RingBufferSize = 64 << 10
	tr := openTracer(t, o)

	// Reader draining: a consumer counts events until paused.
	read := make(chan int)
	pause, resume := make(chan struct{}), make(chan struct{})
	go func() {
		var ev trace.Event
		count := 0
		for {
			select {
			case <-pause:
				read <- count
				<-resume
			default:
			}
			if err := tr.Read(&ev); err != nil {
				read <- count
				return
			}
			count++
		}
	}()
	probed := p.bestPerCall(t, n, reps)
	time.Sleep(50 * time.Millisecond)
	// The consumer may be blocked in Read; the next call wakes it.
	go func() { pause <- struct{}{} }()
	p.perCall(t, 1)
	readBefore := <-read
	issued := n*reps + 1
	// Reader stopped: fill the queue and the ring, then time calls that
	// can only be dropped.
	for tr.Stats().Drops == 0 {
		p.perCall(t, n)
		issued += n
	}
	dropping := p.bestPerCall(t, n, reps)
	issued += n * reps
	drops := tr.Stats().Drops
	close(resume)

	// Everything issued is read or counted as dropped.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s := tr.Stats()
		if int(s.Events+s.Drops) >= issued {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	s := tr.Stats()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	readAfter := <-read
	after := p.bestPerCall(t, n, reps)
	t.Logf("ns/call: unprobed %.0f, probed %.0f, dropping %.0f, after Close %.0f; issued %d, read %d, drops %d",
		base, probed, dropping, after, issued, readAfter, s.Drops)

	if drops == 0 || s.Drops < drops {
		t.Errorf("drops %d then %d: want a growing count with the reader stopped", drops, s.Drops)
	}
	if int(s.Events+s.Drops) != issued || s.DecodeErrors != 0 {
		t.Errorf("%d events + %d drops != %d calls issued (decode errors %d)", s.Events, s.Drops, issued, s.DecodeErrors)
	}
	if readAfter < readBefore || readAfter > int(s.Events) {
		t.Errorf("read %d then %d of %d decoded", readBefore, readAfter, s.Events)
	}
	if probed < base {
		t.Errorf("probed %.0f ns/call faster than unprobed %.0f: the probe did not fire", probed, base)
	}
	// A dropped record costs no more than a queued one: loose bound for a
	// shared machine.
	if dropping > 1.5*probed+200 {
		t.Errorf("dropping %.0f ns/call vs probed %.0f: a full ring slows the workload", dropping, probed)
	}
	if after > 1.5*base+200 {
		t.Errorf("after Close %.0f ns/call vs unprobed %.0f: probes left behind", after, base)
	}
}

// TestCloseUnblocksRead checks that Close ends a blocked Read with
// ErrClosed, that Close is idempotent and that Read keeps failing after.
func TestCloseUnblocksRead(t *testing.T) {
	r := newRig(t)
	// Warm cilium/ebpf's cached feature probes and kernel BTF so that their
	// descriptors do not count as leaked.
	warm, err := Open(r.options())
	if err != nil {
		t.Fatal(err)
	}
	warm.Close()
	fds := openFDs(t)
	start := time.Now()
	tr, err := Open(r.options())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Open took %v", time.Since(start))
	res := make(chan error)
	go func() {
		var ev trace.Event
		for {
			// Exec/exit events of other processes may arrive first.
			if err := tr.Read(&ev); err != nil {
				res <- err
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	start = time.Now()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close took %v", time.Since(start))
	select {
	case err := <-res:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Read after Close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read still blocked after Close")
	}
	if err := tr.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	var ev trace.Event
	if err := tr.Read(&ev); !errors.Is(err, ErrClosed) {
		t.Errorf("Read: %v", err)
	}
	if len(tr.Stats().Libraries) != 0 {
		t.Error("libraries still listed after Close")
	}
	if after := openFDs(t); after != fds {
		t.Errorf("%d file descriptors open before Open, %d after Close", fds, after)
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestOpenErrors checks option validation and a bad explicit library.
func TestOpenErrors(t *testing.T) {
	r := newRig(t)
	o := r.options()
	o.RingBufferSize = 3000
	if _, err := Open(o); err == nil || !strings.Contains(err.Error(), "power of two") {
		t.Errorf("ring size 3000: %v", err)
	}
	o = r.options()
	bad := filepath.Join(t.TempDir(), "libcuda.so.1")
	if err := os.WriteFile(bad, []byte("not ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	o.Libraries = []string{bad}
	if _, err := Open(o); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad library: %v", err)
	}
	o.Libraries = []string{filepath.Join(t.TempDir(), "absent.so")}
	if _, err := Open(o); err == nil || !strings.Contains(err.Error(), "absent.so") {
		t.Errorf("absent library: %v", err)
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
	c := &callChecker{pid: p.pid}
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		if ev.PID == p.pid && (ev.Kind == trace.KindLaunch || ev.Kind == trace.KindCopy || ev.Kind == trace.KindSync) {
			c.check(ev)
		}
		return ev.PID == p.pid && ev.Kind == trace.KindExit
	})
	p.wait(t)
	if c.next != n || c.mismatches != 0 || c.zeroDur != 0 {
		t.Errorf("%d calls seen of %d, %d mismatched, %d syncs without duration\n%s", c.next, n, c.mismatches, c.zeroDur, strings.Join(c.first, "\n"))
	}
}

// TestExecAttachesSoon checks that a process's exec event makes the tracer
// look at that process at once: a library file only it maps is attached
// long before the next periodic rescan.
func TestExecAttachesSoon(t *testing.T) {
	r := newRig(t)
	o := r.options()
	o.RescanInterval = time.Hour
	tr := openTracer(t, o)
	dir := t.TempDir()
	copyLib(t, r.stub.Lib, filepath.Join(dir, "libcuda.so.1"))
	start := time.Now()
	p := r.start(t, []string{"LD_LIBRARY_PATH=" + dir}, true, "calls", "60")
	r.expose(t, int(p.pid))
	waitLibrary(t, tr, func(l Library) bool { return strings.HasPrefix(l.Path, dir) }, true)
	t.Logf("attached %v after start", time.Since(start))
	p.send(t, "go")
	c := &callChecker{pid: p.pid}
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		if ev.PID == p.pid && (ev.Kind == trace.KindLaunch || ev.Kind == trace.KindCopy || ev.Kind == trace.KindSync) {
			c.check(ev)
		}
		return ev.PID == p.pid && ev.Kind == trace.KindExit
	})
	p.wait(t)
	if c.next != 60 || c.mismatches != 0 {
		t.Errorf("%d calls seen, %d mismatched\n%s", c.next, c.mismatches, strings.Join(c.first, "\n"))
	}
}

// TestPIDFilterSparesOthers checks that with a PID list the breakpoints
// exist only in the listed process: an unlisted process running the same
// library keeps its unprobed per-call time and produces no events.
func TestPIDFilterSparesOthers(t *testing.T) {
	r := newRig(t)
	listed := r.start(t, nil, false, "serve")
	other := r.start(t, nil, false, "serve")
	for _, p := range []*proc{listed, other} {
		if l := p.line(t); l != "ready" {
			t.Fatalf("exerciser said %q", l)
		}
	}
	const n, reps = 2000, 5
	base := other.bestPerCall(t, n, reps)
	o := r.options()
	o.PIDs = []uint32{listed.pid}
	tr := openTracer(t, o)
	probed := listed.bestPerCall(t, n, reps)
	spared := other.bestPerCall(t, n, reps)
	t.Logf("ns/call: unprobed %.0f, listed %.0f, unlisted %.0f", base, probed, spared)
	if probed < base+500 {
		t.Errorf("listed process %.0f ns/call vs %.0f unprobed: not probed", probed, base)
	}
	if spared > 2*base+300 {
		t.Errorf("unlisted process %.0f ns/call vs %.0f unprobed: it pays for the probes", spared, base)
	}
	var launches, others int
	listed.in.Close()
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		switch {
		case ev.PID == other.pid:
			others++
		case ev.PID == listed.pid && ev.Kind == trace.KindLaunch:
			launches++
		}
		return ev.PID == listed.pid && ev.Kind == trace.KindExit
	})
	var v uint8
	if err := tr.objs.maps.FilterTgids.Lookup(listed.pid, &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("pid %d still in the filter after its exit: %v", listed.pid, err)
	}
	if launches != n*reps || others != 0 {
		t.Errorf("%d launches from the listed process (want %d), %d events from the other", launches, n*reps, others)
	}
}

// cgroup2 returns the cgroup v2 mount point.
func cgroup2(t *testing.T) string {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	testenv.Skip(t, "no cgroup v2 hierarchy mounted")
	return ""
}

// TestCgroupFilter checks the in-kernel cgroup filter: a process moved
// into a fresh cgroup is traced, one outside it is not.
func TestCgroupFilter(t *testing.T) {
	r := newRig(t)
	dir := filepath.Join(cgroup2(t), fmt.Sprintf("arbiter-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	inside := r.start(t, nil, true, "calls", "90")
	outside := r.start(t, nil, true, "calls", "90")
	t.Cleanup(func() {
		// The cgroup can go once its process has exited.
		_ = inside.cmd.Process.Kill()
		_, _ = inside.cmd.Process.Wait()
		_ = os.Remove(dir)
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(int(inside.pid))), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	id := st.Sys().(*syscall.Stat_t).Ino
	o := r.options()
	o.Cgroups = []uint64{id}
	tr := openTracer(t, o)
	outside.send(t, "go")
	outside.wait(t)
	inside.send(t, "go")
	c := &callChecker{pid: inside.pid}
	var others int
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		if ev.PID == outside.pid {
			others++
		}
		if ev.PID == inside.pid && ev.Kind != trace.KindExit {
			if ev.Cgroup != id {
				t.Errorf("event cgroup %d, want %d", ev.Cgroup, id)
			}
			c.check(ev)
		}
		return ev.PID == inside.pid && ev.Kind == trace.KindExit
	})
	inside.wait(t)
	if c.next != 90 || c.mismatches != 0 || others != 0 {
		t.Errorf("%d calls from inside (%d mismatched), %d events from outside\n%s", c.next, c.mismatches, others, strings.Join(c.first, "\n"))
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
		{"-O2", "-o", prog, "testdata/ifunc.c", lib, "-Wl,-rpath," + dir},
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
	const n = 50
	p := startCmd(t, exec.Command(prog, strconv.Itoa(n)), nil, false)
	r.expose(t, int(p.pid))
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
			want := expectCall(uint64(seen)*30, p.pid)
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
		p := r.start(t, nil, true, "calls", "30")
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
		// 10 ms poll; generous for a loaded shared machine.
		if worst > 250*time.Millisecond || seen != 31 {
			t.Errorf("wakeup %d: worst lag %v over %d events", wake, worst, seen)
		}
		tr.Close()
	}
}

// TestReplacedLibrary plays a driver upgrade: the library file is replaced
// (a new inode at the same path) while a process still runs the old one.
// Both files are probed, each process is captured, and the old file is
// detached once its last process has exited.
func TestReplacedLibrary(t *testing.T) {
	r := newRig(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "libcuda.so.1")
	copyLib(t, r.stub.Lib, path)
	oldID := statID(t, path)
	env := []string{"LD_LIBRARY_PATH=" + dir}
	oldProc := r.start(t, env, true, "calls", "60")
	r.expose(t, int(oldProc.pid))
	o := r.options()
	o.Libraries = []string{path}
	o.RescanInterval = 100 * time.Millisecond
	tr := openTracer(t, o)

	// The upgrade: a new file renamed over the old path.
	copyLib(t, r.stub.Lib, path+".new")
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	newID := statID(t, path)
	old := waitLibrary(t, tr, func(l Library) bool { return l.Inode == oldID.ino && strings.Contains(l.Path, "map_files") }, true)
	waitLibrary(t, tr, func(l Library) bool { return l.Inode == newID.ino && l.Path == path }, true)
	t.Logf("old file now attached through %s", old.Path)

	newProc := r.start(t, env, true, "calls", "60")
	r.expose(t, int(newProc.pid))
	checkers := map[uint32]*callChecker{oldProc.pid: {pid: oldProc.pid}, newProc.pid: {pid: newProc.pid}}
	oldProc.send(t, "go")
	newProc.send(t, "go")
	exits := 0
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		c, ok := checkers[ev.PID]
		switch {
		case !ok || ev.Kind == trace.KindExec:
		case ev.Kind == trace.KindExit:
			exits++
		default:
			c.check(ev)
		}
		return exits == 2
	})
	oldProc.wait(t)
	newProc.wait(t)
	for _, c := range checkers {
		if c.next != 60 || c.mismatches != 0 {
			t.Errorf("pid %d: %d calls seen, %d mismatched\n%s", c.pid, c.next, c.mismatches, strings.Join(c.first, "\n"))
		}
	}
	// No process maps the old file any more.
	waitLibrary(t, tr, func(l Library) bool { return l.Inode == oldID.ino }, false)
}

func statID(t *testing.T, path string) fileID {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fileID{uint64(st.Dev), st.Ino}
}
