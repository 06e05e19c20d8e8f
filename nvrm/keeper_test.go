package nvrm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
)

// TestKeeperNeverLeavesSuspended: a keeper that dies with groups
// suspended has them resumed by the next keeper's start; one that exits
// cleanly resumes them at once. The lock keeps a second keeper out.
func TestKeeperNeverLeavesSuspended(t *testing.T) {
	testenv.Privileged(t)
	bin, ctl := buildStandin(t)
	fs := t.TempDir()
	if err := MountBPFFS(fs); err != nil {
		testenv.Skip(t, "%v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(fs, 0) })
	opts := &KeeperOptions{
		StateDir:   t.TempDir(),
		Trace:      TraceAlways,
		Tracer:     TracerOptions{ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY, PinPath: filepath.Join(fs, "nvrm")},
		Controller: ControllerOptions{Layout: mustLayout(t, "570.86.15"), ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY},
	}
	// An independent observer of the calls the keepers issue.
	obs, err := NewTracer(&TracerOptions{ControlRdev: standinRdev, AcceptErrno: unix.ENOTTY})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	self := uint32(os.Getpid())

	k1, err := OpenKeeper(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenKeeper(opts); !errors.Is(err, ErrKeeperRunning) {
		t.Fatalf("second keeper: %v, want ErrKeeperRunning", err)
	}
	s := startStandin(t, bin, ctl)
	readEvents(t, obs, 11, s.pid)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var seen []KeeperEvent
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := k1.Run(ctx, func(e KeeperEvent) { mu.Lock(); seen = append(seen, e); mu.Unlock() }); err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, func() bool { _, err := k1.Registry().Process(s.pid); return err == nil && groupsOf(k1, s.pid) == 3 })
	cancel()
	wg.Wait()

	if err := k1.Controller().Suspend(s.pid, 0); err != nil {
		t.Fatal(err)
	}
	readEvents(t, obs, 4, self) // SCHEDULE{0} and PREEMPT on two groups
	// The keeper dies: no Close, no resume.
	if err := k1.closeAll(); err != nil {
		t.Fatal(err)
	}

	// The stand-in sets its own timeslice while no keeper runs; the
	// pinned tracer keeps it for the next keeper.
	s.send(t, "timeslice 4096")
	readEvents(t, obs, 1, s.pid)
	opts2 := *opts
	opts2.Trace = TraceIfPinned
	opts2.Unpin = true
	k2, err := OpenKeeper(&opts2)
	if err != nil {
		t.Fatal(err)
	}
	if k2.ResumeErr != nil || !k2.Tracing() {
		t.Fatalf("second keeper: resume %v, tracing %v", k2.ResumeErr, k2.Tracing())
	}
	resumed := readEvents(t, obs, 2, self)
	for i, h := range []uint32{rmstandin.GroupGR, rmstandin.GroupCE} {
		if resumed[i].RM.Object != h || resumed[i].RM.Cmd != uint32(CtrlGPFIFOSchedule) || resumed[i].RM.Value != 1 {
			t.Errorf("resume %d: %+v", i, resumed[i].RM)
		}
	}
	g, err := k2.Registry().Groups(s.pid, 0)
	if err != nil || g[0].Timeslice != 4096 || g[0].TimesliceBy != "process" || g[0].Suspended {
		t.Fatalf("registry after restart: %+v, %v", g, err)
	}

	// A clean exit resumes at once.
	if err := k2.Controller().Suspend(s.pid, 1); err != nil {
		t.Fatal(err)
	}
	readEvents(t, obs, 2, self)
	if err := k2.Close(); err != nil {
		t.Fatal(err)
	}
	if ev := readEvents(t, obs, 1, self); ev[0].RM.Object != rmstandin.GroupGR1 || ev[0].RM.Value != 1 {
		t.Fatalf("clean exit: %+v", ev[0].RM)
	}
	st, err := ReadState(opts.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Suspended()) != 0 {
		t.Fatalf("state after clean exit: %+v", st.Suspended())
	}
	if _, err := os.Stat(filepath.Join(fs, "nvrm", "link_nvrm_enter")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pins left after Unpin: %v", err)
	}
}

func groupsOf(k *Keeper, pid uint32) int {
	g, _ := k.Registry().Groups(pid, -1)
	return len(g)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestKeeperLockAndReadState: without any tracer, a keeper holds the lock
// (a second one is refused, naming the holder), a reader sees its saved
// state, and the lock is free again after Close.
func TestKeeperLockAndReadState(t *testing.T) {
	dir := t.TempDir()
	k, err := OpenKeeper(&KeeperOptions{StateDir: dir, Trace: TraceNever})
	if err != nil {
		t.Fatal(err)
	}
	if k.Tracing() || k.Controller() != nil {
		t.Fatalf("tracing %v, controller %v", k.Tracing(), k.Controller())
	}
	if err := k.Run(context.Background(), nil); err == nil {
		t.Fatal("Run without a tracer succeeded")
	}
	self := uint32(os.Getpid())
	k.Registry().opts.StartTime = procStartTime
	applyAll(k.Registry(), cudaContext(self, 3, 0xC1D00001, 0))
	if err := k.Registry().Save(); err != nil {
		t.Fatal(err)
	}
	_, err = OpenKeeper(&KeeperOptions{StateDir: dir, Trace: TraceNever})
	if !errors.Is(err, ErrKeeperRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second keeper: %v", err)
	}
	r, err := ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if g, err := r.Groups(self, 0); err != nil || len(g) != 2 {
		t.Fatalf("read state: %+v, %v", g, err)
	}
	if err := r.Save(); err != nil { // read-only: a no-op
		t.Fatal(err)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if err := k.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	k2, err := OpenKeeper(&KeeperOptions{StateDir: dir, Trace: TraceNever})
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	defer k2.Close()
	if _, err := k2.Registry().Process(self); err != nil {
		t.Fatalf("state not kept across keepers: %v", err)
	}
}
