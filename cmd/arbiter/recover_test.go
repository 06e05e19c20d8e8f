package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/internal/cudastub"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// The launch gate is the engine's Gater.
var _ engine.Gater = (*uprobe.Gate)(nil)

// gateHolderVar makes the test binary, re-executed by
// TestRecoverReleasesGate, the daemon that gates a process and is killed.
const gateHolderVar = "ARBITER_TEST_GATE_HOLDER"

// recoverNode is a node where nothing ran: a private bpffs for the gate's
// pin and an empty state directory's parent.
type recoverNode struct {
	pinDir, stateDir string
}

func newRecoverNode(t *testing.T) *recoverNode {
	t.Helper()
	testenv.Privileged(t)
	dir := t.TempDir()
	fs := filepath.Join(dir, "bpf")
	if err := os.Mkdir(fs, 0o700); err != nil {
		t.Fatal(err)
	}
	// The tests run in a mount namespace of their own (TestMain).
	if err := unix.Mount("bpf", fs, "bpf", 0, "mode=0700"); err != nil {
		testenv.Skip(t, "mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(fs, 0) })
	// stateDir is the registry's directory: nvrm/ in the daemon's state
	// directory, dir.
	return &recoverNode{pinDir: filepath.Join(fs, "arbiter"), stateDir: filepath.Join(dir, "nvrm")}
}

// recover runs `arbiter recover` through main and returns its exit code
// and output.
func (n *recoverNode) recover(t *testing.T, args ...string) (int, string) {
	t.Helper()
	return runMain(t, append([]string{"recover", "--bpffs", n.pinDir, "--state-dir", filepath.Dir(n.stateDir)}, args...)...)
}

// TestRecoverNothingThere: a --state-dir that does not exist and a
// --bpffs not on a BPF filesystem, likely mistyped, are warned of, not
// taken for a node with nothing to recover; the daemon's bpffs directory
// not made yet is not (it is made at the first pin).
func TestRecoverNothingThere(t *testing.T) {
	n := newRecoverNode(t)
	missing := filepath.Join(t.TempDir(), "no-such-state")
	plain := t.TempDir()
	code, out := runMain(t, "recover", "--bpffs", plain, "--state-dir", missing)
	for _, want := range []string{
		"warning: --state-dir " + missing + ": no such file or directory: no daemon kept state there yet (if one ran, is this its --state-dir?)",
		"warning: --bpffs " + plain + ": not on a BPF filesystem (" + plain + " is not)",
		"nothing to recover",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("exit %d; the output does not say %q:\n%s", code, want, out)
		}
	}
	if code, out := n.recover(t); code != 0 || out != "nothing to recover\n" {
		t.Errorf("the daemon's paths, nothing pinned yet: exit %d, %q", code, out)
	}
}

// TestRecoverNothing checks recover on a node where nothing ever ran:
// exit 0 and "nothing to recover", in text and JSON, every time.
func TestRecoverNothing(t *testing.T) {
	n := newRecoverNode(t)
	for range 2 {
		code, out := n.recover(t)
		if code != 0 || out != "nothing to recover\n" {
			t.Errorf("exit %d, output:\n%s", code, out)
		}
	}
	code, out := n.recover(t, "--format", "json")
	var rep recoverReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("exit %d, %v:\n%s", code, err, out)
	}
	if !rep.NothingToRecover || rep.Gate.Found || len(rep.Gate.Released) != 0 || len(rep.Errors) != 0 {
		t.Errorf("report %+v", rep)
	}
	if _, err := os.Stat(n.stateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("recover created the state directory: %v", err)
	}
	if code, out := n.recover(t, "--format", "yaml"); code != 2 || !strings.Contains(out, `--format "yaml": want text or json`) {
		t.Errorf("bad format: exit %d, output:\n%s", code, out)
	}
}

// TestRecoverUnprivileged checks that recover without CAP_BPF refuses with
// exit 77 and says how to get it.
func TestRecoverUnprivileged(t *testing.T) {
	n := newRecoverNode(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testenv.Skip(t, "no setpriv: %v", err)
	}
	drop := "-bpf,-sys_admin,-sys_ptrace"
	cmd := exec.Command(setpriv, "--bounding-set="+drop, "--inh-caps="+drop, os.Args[0],
		"recover", "--bpffs", n.pinDir, "--state-dir", filepath.Dir(n.stateDir))
	cmd.Env = append(os.Environ(), "ARBITER_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 77 ||
		!strings.Contains(string(out), "needs CAP_BPF and CAP_SYS_PTRACE, which this process lacks: run it as root (sudo)") {
		t.Errorf("%v:\n%s", err, out)
	}
}

// TestRecoverReleasesGate gates a running workload from a daemon-like
// process, kills that process, and checks that the workload stays stopped
// until `arbiter recover` continues it, that recover says so and removes
// the pin, and that a second recover finds nothing.
func TestRecoverReleasesGate(t *testing.T) {
	if spec := os.Getenv(gateHolderVar); spec != "" {
		holdGate(t, spec)
		return
	}
	n := newRecoverNode(t)
	b := cudastub.ForTest(t)
	train := exec.Command(b.Train, "--kernel-us", "200", "--sync-every", "5", "--duration", "60")
	if err := train.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = train.Process.Signal(syscall.SIGCONT)
		_ = train.Process.Kill()
		_ = train.Wait()
	})
	pid := train.Process.Pid

	holder := exec.Command(os.Args[0], "-test.run=^TestRecoverReleasesGate$")
	holder.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%s:%s", gateHolderVar, pid, n.pinDir, b.Lib))
	holder.Stderr = os.Stderr
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "gated\n" {
		t.Fatalf("holder said %q: %v", line, err)
	}
	waitStopped(t, pid, true, "gated by the holder")
	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if !isStopped(t, pid) {
			t.Fatal("the workload ran again with no one to continue it")
		}
	}

	code, got := n.recover(t, "--format", "json")
	if code != 0 {
		t.Fatalf("recover: exit %d\n%s", code, got)
	}
	var rep recoverReport
	if err := json.Unmarshal([]byte(got), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, got)
	}
	if !rep.Gate.Found || !rep.Gate.Unpinned || rep.NothingToRecover || len(rep.Errors) != 0 ||
		len(rep.Gate.Released) != 1 || rep.Gate.Released[0].PID != uint32(pid) || !rep.Gate.Released[0].Stopped || !rep.Gate.Released[0].Continued {
		t.Errorf("report:\n%s", got)
	}
	waitStopped(t, pid, false, "after recover")
	if want := filepath.Join(n.pinDir, uprobe.StopsMapName); rep.Gate.Records != want {
		t.Errorf("report names the stop records' pin %q, want %q", rep.Gate.Records, want)
	}
	for _, name := range []string{uprobe.GateMapName, uprobe.StopsMapName} {
		if _, err := os.Stat(filepath.Join(n.pinDir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin %s left: %v", name, err)
		}
	}
	if code, got := n.recover(t); code != 0 || got != "nothing to recover\n" {
		t.Errorf("second recover: exit %d\n%s", code, got)
	}
}

// holdGate is the daemon of TestRecoverReleasesGate: it attaches the
// probes to the stub library in one process, gates it with the gate pinned
// in a directory, says "gated" and waits to be killed. spec is
// "PID:PINDIR:LIBRARY".
func holdGate(t *testing.T, spec string) {
	f := strings.SplitN(spec, ":", 3)
	pid, err := strconv.ParseUint(f[0], 10, 32)
	if err != nil || len(f) != 3 {
		t.Fatalf("%s=%q: want PID:PINDIR:LIBRARY", gateHolderVar, spec)
	}
	// A proc root listing only the workload: discovery attaches nothing
	// else on the machine.
	proc := t.TempDir()
	if err := os.Symlink(fmt.Sprintf("/proc/%d", pid), filepath.Join(proc, f[0])); err != nil {
		t.Fatal(err)
	}
	tr, err := uprobe.Open(&uprobe.Options{Libraries: []string{f[2]}, ProcRoot: proc, RescanInterval: -1,
		SearchDirs: []string{}, LdCache: "-", PIDs: []uint32{uint32(pid)}, GatePinDir: f[1]})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Gate().Gate(uint32(pid)); err != nil {
		t.Fatal(err)
	}
	fmt.Println("gated")
	time.Sleep(time.Hour) // killed by the test
}

// isStopped reports whether pid is in state T (stopped).
func isStopped(t *testing.T, pid int) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
}

// waitStopped waits up to 5 s for pid to be stopped, or running.
func waitStopped(t *testing.T, pid int, stopped bool, what string) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if isStopped(t, pid) == stopped {
			return
		}
	}
	t.Fatalf("%s: process %d stopped=%v after 5 s", what, pid, isStopped(t, pid))
}

// TestRecoverDetach: a daemon that stopped leaves its driver-call tracer
// pinned and the driver handles it kept; recover keeps both (a later
// daemon replays what the tracer recorded), and recover --detach, with
// nothing left to release, detaches the tracer and drops the handles,
// and says so; a second --detach finds nothing to detach.
func TestRecoverDetach(t *testing.T) {
	n := newRecoverNode(t)
	pin := filepath.Join(n.pinDir, "nvrm")
	state := filepath.Join(n.stateDir, "state.json")
	// The daemon's keeper, as arbiter run opens it, closed as it stops.
	k, err := nvrm.OpenKeeper(&nvrm.KeeperOptions{StateDir: n.stateDir, Trace: nvrm.TraceAlways, Tracer: nvrm.TracerOptions{PinPath: pin}})
	if err != nil {
		t.Fatalf("a tracer to leave pinned: %v", err)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool {
		_, err := os.Stat(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		return err == nil
	}
	if !exists(filepath.Join(pin, "link_nvrm_enter")) || !exists(state) {
		t.Fatalf("the stopped daemon left no tracer pinned at %s or no handles at %s", pin, state)
	}
	if code, out := n.recover(t); code != 0 || out != "nothing to recover\n" || !exists(filepath.Join(pin, "link_nvrm_enter")) || !exists(state) {
		t.Fatalf("recover without --detach: exit %d, %q; tracer pinned %v, handles %v (want both kept)",
			code, out, exists(pin), exists(state))
	}
	code, out := n.recover(t, "--detach", "--format", "json")
	var rep recoverReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("exit %d, %v:\n%s", code, err, out)
	}
	if rep.Tracer == nil || !rep.Tracer.Detached || !rep.Tracer.Dropped || rep.Tracer.Pin != pin || rep.Tracer.State != state || len(rep.Warnings) != 0 ||
		rep.NothingToRecover {
		t.Errorf("recover --detach: %s", out)
	}
	if exists(pin) || exists(state) {
		t.Errorf("after --detach: tracer pinned %v, handles %v; want neither", exists(pin), exists(state))
	}
	if code, out := n.recover(t, "--detach"); code != 0 || out != "nothing to recover\n" {
		t.Errorf("a second --detach: exit %d, %q", code, out)
	}
}
