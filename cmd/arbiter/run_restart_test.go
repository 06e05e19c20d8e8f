package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/procfs"
	"github.com/gpu-arbiter/arbiter/trace"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// observePolicy is the policy of the restarted daemons: it observes
// every process, so that what the restart released stays running and the
// test sees the release itself, not a new gate.
const observePolicy = `package arbiter

default_decision := {"class": "bystander", "preemption": {"mode": "observe"}, "reason": "observed after the restart"}

classify := default_decision
`

// releaseBudget is how long a restarted daemon may take, from its exec,
// to release what a killed one left.
const releaseBudget = time.Second

// TestDaemonRestartReleases kills a daemon (kill -9) while the stub
// training workload is gated and a stand-in CUDA process is suspended, and
// starts a new one, which releases both within a second: (a) with the
// state as the killed daemon left it; (b) with the state files rewritten
// in format version 1, as the previous release wrote them (the golden
// files of nvrm/testdata/state-v1); (c) with the state files and the
// pinned gate in a format newer than this build reads: it refuses them,
// naming each file, its version and the versions it reads, and releases
// everything all the same.
//
// The daemon cannot suspend the stand-in itself (the stand-in makes no
// CUDA calls for the engine to schedule), so `arbiter channels suspend`
// does, through the same registry and state files, and is killed too; the
// restarted daemon's driver flags point its channel control at the
// stand-in's control file, so its restart path is the real one. An
// independent tracer of the stand-in's control file sees the resume.
func TestDaemonRestartReleases(t *testing.T) {
	// The held workload lives through every round: no other test
	// binary's daemon may gate it between two.
	testenv.LockNodeDaemons(t)
	node := newRecoverNode(t)
	b := cudastub.ForTest(t)
	gating := policyDir(t, map[string]string{"p.rego": testPolicy})
	observing := policyDir(t, map[string]string{"p.rego": observePolicy})
	dir := t.TempDir()
	bin, err := rmstandin.Build(dir)
	if err != nil {
		testenv.Skip(t, "cannot build the stand-in: %v", err)
	}
	ctl, err := rmstandin.MakeControlFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	sp, standin := startStandinProcess(t, bin, ctl)
	standinStart, err := procfs.At("/proc").StartTime(int(standin))
	if err != nil {
		t.Fatal(err)
	}
	nvrmDir := node.stateDir
	recordStandin(t, nvrmDir, sp, standin)
	driver := []string{"--control-rdev", "1:7", "--accept-errno", "25", "--driver-version", "575.51.03"}
	obs := newResumeObserver(t, standin)
	held := startWorkload(t, "held", b.Train, "--kernel-us", "200", "--sync-every", "4", "--duration", "120")
	heldPID := held.Process.Pid

	rounds := []struct {
		name string
		// rewrite changes the state the killed daemon left, before the
		// restart; wantLog is what the restarted daemon must say.
		rewrite func(t *testing.T)
		wantLog []string
	}{
		{name: "same version"},
		{name: "previous format", rewrite: func(t *testing.T) {
			writeV1State(t, nvrmDir, map[string]int64{"pid": int64(standin), "start_time": int64(standinStart), "FD": int64(sp.fd)})
		}},
		{name: "newer format", rewrite: func(t *testing.T) {
			for _, name := range []string{"state.json", "suspended.json"} {
				setStateVersion(t, filepath.Join(nvrmDir, name), 3)
			}
			// The gate as a later format would pin it.
			if err := os.Rename(filepath.Join(node.pinDir, uprobe.GateMapName), filepath.Join(node.pinDir, uprobe.GateMapName+"_v2")); err != nil {
				t.Fatal(err)
			}
		}, wantLog: []string{
			filepath.Join(nvrmDir, "state.json") + " has state format version 3, which this arbiter does not read (it reads versions 1 and 2",
			filepath.Join(nvrmDir, "suspended.json") + " has state format version 3, which this arbiter does not read (it reads versions 1 and 2",
			"1 suspension record(s) were read as far as they decode, to be resumed",
			filepath.Join(node.pinDir, uprobe.GateMapName+"_v2") + " has launch gate format version 2 (a newer arbiter's); this arbiter gates only with version 1",
		}},
	}
	for _, r := range rounds {
		t.Run(r.name, func(t *testing.T) {
			// A daemon gates the workload and is killed.
			d := startDaemon(t, node, gating, driver...)
			d.waitProcess(heldPID, "held", "gated")
			waitStopped(t, heldPID, true, "gated")
			d.stop(syscall.SIGKILL)
			// The stand-in is suspended by a command that is killed too.
			suspendAndKill(t, nvrmDir, standin, ctl, driver)
			if n := recordedSuspended(t, nvrmDir); n != 1 || !isStopped(t, heldPID) {
				t.Fatalf("before the restart: %d groups recorded suspended, workload stopped %v; want 1, true", n, isStopped(t, heldPID))
			}
			if r.rewrite != nil {
				r.rewrite(t)
			}

			obs.reset()
			gateOpen := watchRunning(heldPID)
			start := time.Now()
			d = startDaemon(t, node, observing, driver...)
			ranAt, ok := gateOpen.wait(5 * time.Second)
			if !ok {
				t.Fatalf("the gated workload still stopped 5 s after the restart\n%s", d.output())
			}
			resumedAt, by, ok := obs.wait(5 * time.Second)
			if !ok || by != uint32(d.cmd.Process.Pid) {
				t.Fatalf("no resume of the stand-in's channel group by the restarted daemon (pid %d) within 5 s (seen from %d)\n%s", d.cmd.Process.Pid, by, d.output())
			}
			gateTook, resumeTook := ranAt.Sub(start), resumedAt.Sub(start)
			t.Logf("released after the restart: gated workload running in %v, stand-in resumed in %v", gateTook.Round(time.Millisecond), resumeTook.Round(time.Millisecond))
			if gateTook > releaseBudget || resumeTook > releaseBudget {
				t.Errorf("released in %v (gate) and %v (suspension), want both within %v", gateTook, resumeTook, releaseBudget)
			}
			out := d.output()
			for _, want := range r.wantLog {
				if !strings.Contains(out, want) {
					t.Errorf("the restarted daemon did not say %q:\n%s", want, out)
				}
			}
			if r.wantLog == nil && strings.Contains(out, "refused") {
				t.Errorf("the restarted daemon refused state it wrote itself:\n%s", out)
			}
			if n := recordedSuspended(t, nvrmDir); n != 0 {
				t.Errorf("%d groups still recorded suspended", n)
			}
			if err := d.stop(syscall.SIGTERM); err != nil {
				t.Errorf("clean stop: %v\n%s", err, d.output())
			}
			// What the restarted daemon saved is this build's format,
			// and only its own gate's pin is left (none after a clean
			// stop).
			for _, name := range []string{"state.json", "suspended.json"} {
				if v := stateVersion(t, filepath.Join(nvrmDir, name)); v != 2 {
					t.Errorf("%s saved in format version %d, want 2", name, v)
				}
			}
			if pins, err := uprobe.FindGates(node.pinDir); err != nil || len(pins) != 0 {
				t.Errorf("gates pinned after a clean stop: %+v, %v", pins, err)
			}
			if isStopped(t, heldPID) {
				t.Error("the workload is stopped after the clean stop")
			}
		})
	}
}

// recordStandin saves the stand-in's handles in the registry, as the
// daemon's driver tracer would have had it started before the stand-in.
func recordStandin(t *testing.T, nvrmDir string, sp *standinProcess, pid uint32) {
	t.Helper()
	reg, err := nvrm.NewRegistry(&nvrm.RegistryOptions{StatePath: filepath.Join(nvrmDir, "state.json")})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	for _, rm := range []trace.RM{
		{FD: sp.fd, Client: rmstandin.Client, Object: rmstandin.Client, Class: uint32(nvrm.ClassRootClient)},
		{FD: sp.fd, Client: rmstandin.Client, Parent: rmstandin.Client, Object: rmstandin.Device0, Class: uint32(nvrm.ClassDevice)},
		{FD: sp.fd, Client: rmstandin.Client, Parent: rmstandin.Device0, Object: rmstandin.GroupGR, Class: uint32(nvrm.ClassChannelGroup), EngineType: 1},
	} {
		reg.Apply(&trace.Event{Kind: trace.KindRMAlloc, PID: pid, RM: rm})
	}
	if err := reg.Save(); err != nil {
		t.Fatal(err)
	}
}

// suspendAndKill suspends the stand-in's channel groups with `arbiter
// channels suspend` and kills it with SIGKILL while it holds them.
func suspendAndKill(t *testing.T, nvrmDir string, pid uint32, ctl string, driver []string) {
	t.Helper()
	args := append([]string{"channels", "suspend", fmt.Sprint(pid), "--for", "1h", "--pin-path", "", "--state-dir", nvrmDir, "--control", ctl}, driver...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "ARBITER_TEST_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.Contains(line, fmt.Sprintf("process %d suspended in", pid)) {
		t.Fatalf("channels suspend said %q: %v\n%s", line, err, stderr.String())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// recordedSuspended counts the channel groups the state records as
// suspended.
func recordedSuspended(t *testing.T, nvrmDir string) int {
	t.Helper()
	reg, err := nvrm.ReadState(nvrmDir)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	return len(reg.Suspended())
}

// writeV1State replaces the state files by the golden files of format
// version 1, their sentinel values (pid 424242, start time 515151,
// descriptor 61; see nvrm/testdata/state-v1) replaced by the live
// process's.
func writeV1State(t *testing.T, nvrmDir string, values map[string]int64) {
	t.Helper()
	sentinel := map[string]int64{"pid": 424242, "start_time": 515151, "FD": 61}
	for _, name := range []string{"state.json", "suspended.json"} {
		b, err := os.ReadFile(filepath.Join("../../nvrm/testdata/state-v1", name))
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		replaced := 0
		var walk func(any)
		walk = func(x any) {
			switch x := x.(type) {
			case map[string]any:
				for k, e := range x {
					if n, ok := e.(json.Number); ok && n.String() == fmt.Sprint(sentinel[k]) {
						x[k] = values[k]
						replaced++
						continue
					}
					walk(e)
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			}
		}
		walk(v)
		if replaced == 0 {
			t.Fatalf("%s: no sentinel value replaced", name)
		}
		if stateVersionOf(t, v) != 1 {
			t.Fatalf("the golden %s is not of format version 1", name)
		}
		out, err := json.MarshalIndent(v, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(nvrmDir, name), out, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// setStateVersion rewrites a state file's format version, and adds a
// field this build does not know, as a newer format might.
func setStateVersion(t *testing.T, path string, v int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	m["version"] = v
	m["written_by"] = "a later arbiter"
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func stateVersion(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return stateVersionOf(t, v)
}

func stateVersionOf(t *testing.T, v any) int {
	t.Helper()
	m, _ := v.(map[string]any)
	switch n := m["version"].(type) {
	case float64:
		return int(n)
	case json.Number:
		i, _ := n.Int64()
		return int(i)
	}
	t.Fatalf("no version in %v", v)
	return 0
}

// running is when a watched process was first seen out of the stopped
// state.
type running struct {
	done chan struct{}
	at   time.Time
}

// watchRunning polls pid's state every millisecond until it is not
// stopped.
func watchRunning(pid int) *running {
	r := &running{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			i := bytes.LastIndexByte(b, ')')
			if err == nil && i >= 0 && i+2 < len(b) && b[i+2] != 'T' {
				r.at = time.Now()
				return
			}
		}
	}()
	return r
}

func (r *running) wait(d time.Duration) (time.Time, bool) {
	select {
	case <-r.done:
		return r.at, !r.at.IsZero()
	case <-time.After(d):
		return time.Time{}, false
	}
}

// resumeObserver traces the stand-in's control file, independently of
// any arbiter, and reports the first SCHEDULE{enable} of the stand-in's
// compute channel group issued by another process than the stand-in:
// the resume.
type resumeObserver struct {
	tr      *nvrm.Tracer
	standin uint32
	mu      sync.Mutex
	at      time.Time
	by      uint32
	seen    chan struct{}
}

func newResumeObserver(t *testing.T, standin uint32) *resumeObserver {
	t.Helper()
	tr, err := nvrm.NewTracer(&nvrm.TracerOptions{ControlRdev: nvrm.MkRdev(rmstandin.Major, rmstandin.Minor), AcceptErrno: unix.ENOTTY})
	if err != nil {
		t.Fatal(err)
	}
	o := &resumeObserver{tr: tr, standin: standin, seen: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go o.run(ctx, stopped)
	t.Cleanup(func() { cancel(); <-stopped; tr.Close() })
	return o
}

func (o *resumeObserver) run(ctx context.Context, stopped chan struct{}) {
	defer close(stopped)
	var ev trace.Event
	for ctx.Err() == nil {
		o.tr.SetDeadline(time.Now().Add(50 * time.Millisecond))
		err := o.tr.Read(&ev)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			continue
		}
		if ev.Kind != trace.KindRMControl || ev.PID == o.standin || ev.RM.Cmd != uint32(nvrm.CtrlGPFIFOSchedule) ||
			ev.RM.Client != rmstandin.Client || ev.RM.Object != rmstandin.GroupGR || ev.RM.Value != 1 {
			continue
		}
		o.mu.Lock()
		if o.at.IsZero() {
			o.at, o.by = time.Now(), ev.PID
			close(o.seen)
		}
		o.mu.Unlock()
	}
}

// reset forgets what was seen.
func (o *resumeObserver) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.at, o.by, o.seen = time.Time{}, 0, make(chan struct{})
}

// wait returns when and by which process the stand-in was resumed.
func (o *resumeObserver) wait(d time.Duration) (time.Time, uint32, bool) {
	o.mu.Lock()
	seen := o.seen
	o.mu.Unlock()
	select {
	case <-seen:
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.at, o.by, true
	case <-time.After(d):
		return time.Time{}, 0, false
	}
}
