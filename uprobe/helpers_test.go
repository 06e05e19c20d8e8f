package uprobe

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/trace"
)

// rig is a stub driver, the exerciser built against it and a private proc
// root that lists only the test's own processes, so that discovery in a
// test never attaches to libraries that other programs on the machine map.
type rig struct {
	stub     *cudastub.Build
	exercise string
	procRoot string
}

func newRig(t testing.TB) *rig {
	t.Helper()
	testenv.Privileged(t)
	b := cudastub.ForTest(t)
	dir := t.TempDir()
	r := &rig{stub: b, exercise: filepath.Join(dir, "exercise"), procRoot: filepath.Join(dir, "proc")}
	if err := cudastub.CompileProgram(b, "testdata/exercise.c", r.exercise, "-ldl"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(r.procRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	return r
}

// options returns tracer options that attach the rig's library and scan
// only the rig's processes.
func (r *rig) options() *Options {
	return &Options{
		Libraries:      []string{r.stub.Lib},
		ProcRoot:       r.procRoot,
		RescanInterval: -1,
		SearchDirs:     []string{},
		LdCache:        "-",
	}
}

// expose makes a process visible to discovery through the rig's proc root.
func (r *rig) expose(t testing.TB, pid int) {
	t.Helper()
	if err := os.Symlink(fmt.Sprintf("/proc/%d", pid), filepath.Join(r.procRoot, strconv.Itoa(pid))); err != nil {
		t.Fatal(err)
	}
}

// proc is a running exerciser.
type proc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	pid   uint32
	debug strings.Builder
}

// start runs the exerciser with args. With wait set, the exerciser blocks
// until the test sends it a line.
func (r *rig) start(t testing.TB, env []string, wait bool, args ...string) *proc {
	t.Helper()
	return startCmd(t, exec.Command(r.exercise, args...), env, wait)
}

// startCmd starts cmd with env added, EXERCISE_WAIT set if wait, and kills
// it at the end of the test if it is still running.
func startCmd(t testing.TB, cmd *exec.Cmd, env []string, wait bool) *proc {
	t.Helper()
	cmd.Env = append(os.Environ(), env...)
	if wait {
		cmd.Env = append(cmd.Env, "EXERCISE_WAIT=1")
	}
	p := &proc{cmd: cmd}
	cmd.Stderr = &p.debug
	var err error
	if p.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.out = bufio.NewReader(out)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.pid = uint32(cmd.Process.Pid)
	t.Cleanup(func() {
		p.in.Close()
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	})
	return p
}

// send writes a line to the exerciser's stdin.
func (p *proc) send(t testing.TB, line string) {
	t.Helper()
	if _, err := io.WriteString(p.in, line+"\n"); err != nil {
		t.Fatalf("write to exerciser: %v (stderr: %s)", err, p.debug.String())
	}
}

// line reads one line of the exerciser's stdout.
func (p *proc) line(t testing.TB) string {
	t.Helper()
	s, err := p.out.ReadString('\n')
	if err != nil {
		t.Fatalf("read from exerciser: %v (stderr: %s)", err, p.debug.String())
	}
	return strings.TrimSpace(s)
}

// wait waits for the exerciser to exit successfully.
func (p *proc) wait(t testing.TB) {
	t.Helper()
	p.in.Close()
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("exerciser: %v (stderr: %s)", err, p.debug.String())
	}
}

// perCall asks a serving exerciser to time n launches, returning ns/call.
func (p *proc) perCall(t testing.TB, n int) float64 {
	t.Helper()
	p.send(t, fmt.Sprintf("launch %d", n))
	v, err := strconv.ParseFloat(p.line(t), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// bestPerCall is the fastest of reps timings of n launches: other work on
// a shared machine only ever adds time, so the minimum is the steadiest
// estimate of the cost itself.
func (p *proc) bestPerCall(t testing.TB, n, reps int) float64 {
	t.Helper()
	v := make([]float64, reps)
	for i := range v {
		v[i] = p.perCall(t, n)
	}
	return slices.Min(v)
}

// h mirrors exercise.c's handle-like argument values.
func h(i, k uint64) uint64 { return 0x1_0000_0000*(i%13+1) + i*64 + k*8 }

// expectCall returns the event exercise.c's call(i) must produce, except
// for Time, TID, Cgroup and a sync's Duration.
func expectCall(i uint64, pid uint32) trace.Event {
	funcs := trace.Funcs()
	fn := funcs[i%uint64(len(funcs))]
	info := fn.Info()
	ev := trace.Event{Kind: info.Kind, Func: fn, PID: pid}
	grid := [3]uint32{uint32(i%65535 + 1), uint32(i%7 + 1), uint32(i%5 + 1)}
	block := [3]uint32{uint32(i%1024 + 1), uint32(i%3 + 1), uint32(i%2 + 1)}
	shm := uint32((i * 16) % 65536)
	switch fn {
	case trace.FuncGraphLaunch, trace.FuncGraphLaunchPtsz:
		ev.Launch = trace.Launch{Function: h(i, 0), Stream: h(i, 1)}
	case trace.FuncMemcpyHtoD, trace.FuncMemcpyHtoDAsync, trace.FuncMemcpyDtoH, trace.FuncMemcpyDtoHAsync:
		ev.Copy = trace.Copy{Dir: info.Dir, Bytes: i%4096 + 1, Device: i*4096 + 4096, Host: h(i, 3)}
	case trace.FuncCtxSynchronize:
		ev.Sync = trace.Sync{Result: 0}
	case trace.FuncStreamSynchronize, trace.FuncStreamSynchronizePtsz:
		ev.Sync = trace.Sync{Handle: h(i, 1), Result: 400}
	case trace.FuncEventSynchronize:
		ev.Sync = trace.Sync{Handle: h(i, 4), Result: 400}
	case trace.FuncCtxSynchronizeV2:
		ev.Sync = trace.Sync{Handle: h(i, 5), Result: 201}
	case trace.FuncStreamWaitEvent, trace.FuncStreamWaitEventPtsz:
		ev.Sync = trace.Sync{Handle: h(i, 1), Other: h(i, 4), Result: 400}
	case trace.FuncEventRecord, trace.FuncEventRecordPtsz, trace.FuncEventRecordWithFlags, trace.FuncEventRecordWithFlagsPtsz:
		ev.Sync = trace.Sync{Handle: h(i, 4), Other: h(i, 1), Result: 400}
	default:
		switch info.Kind {
		case trace.KindLaunch:
			ev.Launch = trace.Launch{Function: h(i, 0), Stream: h(i, 1), Grid: grid, Block: block, SharedMem: shm}
		case trace.KindCopy:
			ev.Copy = trace.Copy{Dir: info.Dir, Bytes: i%4096 + 1, Device: h(i, 2), Host: h(i, 3)}
		}
	}
	if info.Kind == trace.KindCopy && info.Async {
		ev.Copy.Stream = h(i, 1)
	}
	return ev
}

// callChecker compares one process's call events with expectCall in order.
type callChecker struct {
	pid        uint32
	next       uint64
	mismatches int
	first      []string
	zeroDur    int
	launches   int
}

// checkCalls reads the events of p's driver calls until p exits and checks
// that exactly n arrived, each with the exerciser's arguments and every sync
// with a duration.
func checkCalls(t *testing.T, tr *Tracer, p *proc, n uint64, where string) {
	t.Helper()
	c := &callChecker{pid: p.pid}
	collect(t, tr, time.Minute, func(ev *trace.Event) bool {
		if ev.PID == p.pid && (ev.Kind == trace.KindLaunch || ev.Kind == trace.KindCopy || ev.Kind == trace.KindSync) {
			c.check(ev)
		}
		return ev.PID == p.pid && ev.Kind == trace.KindExit
	})
	p.wait(t)
	if c.next != n || c.mismatches != 0 || c.zeroDur != 0 {
		t.Errorf("%s: %d calls seen of %d, %d mismatched, %d syncs without duration\n%s",
			where, c.next, n, c.mismatches, c.zeroDur, strings.Join(c.first, "\n"))
	}
}

func (c *callChecker) check(ev *trace.Event) {
	got := *ev
	got.Time, got.TID, got.Cgroup = 0, 0, 0
	if got.Kind == trace.KindSync {
		if got.Sync.Duration == 0 {
			c.zeroDur++
		}
		got.Sync.Duration = 0
	}
	want := expectCall(c.next, c.pid)
	if got.Kind == trace.KindLaunch {
		c.launches++
	}
	if got != want || ev.TID != c.pid || ev.Time == 0 {
		c.mismatches++
		if len(c.first) < 5 {
			c.first = append(c.first, fmt.Sprintf("call %d:\n got  %+v\n want %+v", c.next, *ev, want))
		}
	}
	c.next++
}

// collect reads events until done returns true or the timeout passes,
// handing each to fn.
func collect(t testing.TB, tr *Tracer, timeout time.Duration, fn func(*trace.Event) (done bool)) {
	t.Helper()
	res := make(chan error, 1)
	go func() {
		var ev trace.Event
		for {
			if err := tr.Read(&ev); err != nil {
				res <- err
				return
			}
			if fn(&ev) {
				res <- nil
				return
			}
		}
	}()
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("read: %v", err)
		}
	case <-time.After(timeout):
		tr.Close()
		<-res
		t.Fatalf("events did not arrive within %v (stats %+v)", timeout, tr.Stats())
	}
}
