package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/internal/rmstandin"
	"github.com/gpu-arbiter/arbiter/internal/testenv"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/trace"
)

// TestRecoverResumesChannels kills `arbiter channels suspend` while it
// holds a stand-in process's channel group suspended, and checks that
// `arbiter recover` resumes it (through the keeper that resumes what a
// previous one left) and says so, and that a second run finds nothing.
func TestRecoverResumesChannels(t *testing.T) {
	n := newRecoverNode(t)
	dir := t.TempDir()
	bin, err := rmstandin.Build(dir)
	if err != nil {
		testenv.Skip(t, "cannot build the stand-in: %v", err)
	}
	ctl, err := rmstandin.MakeControlFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	sp, pid := startStandinProcess(t, bin, ctl)
	// The handles a tracer would have saved.
	reg, err := nvrm.NewRegistry(&nvrm.RegistryOptions{StatePath: filepath.Join(n.stateDir, "state.json")})
	if err != nil {
		t.Fatal(err)
	}
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
	reg.Close()
	driver := []string{"--control", ctl, "--control-rdev", "1:7", "--accept-errno", "25", "--driver-version", "575.51.03"}

	suspend := exec.Command(os.Args[0], append([]string{"channels", "suspend", fmt.Sprint(pid), "--for", "1h", "--pin-path", "", "--state-dir", n.stateDir}, driver...)...)
	suspend.Env = append(os.Environ(), "ARBITER_TEST_MAIN=1")
	suspend.Stderr = os.Stderr
	out, err := suspend.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := suspend.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = suspend.Process.Kill(); _ = suspend.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.Contains(line, fmt.Sprintf("process %d suspended in", pid)) {
		t.Fatalf("channels suspend said %q: %v", line, err)
	}
	if err := suspend.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = suspend.Wait()
	left := func() int {
		t.Helper()
		reg, err := nvrm.ReadState(n.stateDir)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close()
		return len(reg.Suspended())
	}
	if k := left(); k != 1 {
		t.Fatalf("%d groups recorded suspended after the kill, want 1", k)
	}

	code, got := runMain(t, append([]string{"recover", "--bpffs", n.pinDir, "--state-dir", filepath.Dir(n.stateDir)}, driver...)...)
	if want := fmt.Sprintf("channels: process %d: resumed 1 channel group(s)\n", pid); code != 0 || got != want {
		t.Errorf("recover: exit %d, output:\n%s\nwant:\n%s", code, got, want)
	}
	if k := left(); k != 0 {
		t.Errorf("%d groups still recorded suspended", k)
	}
	if code, got := runMain(t, append([]string{"recover", "--bpffs", n.pinDir, "--state-dir", filepath.Dir(n.stateDir)}, driver...)...); code != 0 || got != "nothing to recover\n" {
		t.Errorf("second recover: exit %d\n%s", code, got)
	}
}

// TestRecoverRefusesWhileKept checks that recover touches nothing while an
// arbiter keeps the state directory, and says why.
func TestRecoverRefusesWhileKept(t *testing.T) {
	n := newRecoverNode(t)
	k, err := nvrm.OpenKeeper(&nvrm.KeeperOptions{StateDir: n.stateDir, Trace: nvrm.TraceNever})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	code, out := n.recover(t)
	if code != 1 || !strings.Contains(out, "kept by another running arbiter (pid "+fmt.Sprint(os.Getpid())) ||
		!strings.Contains(out, "stop the running one first") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
}
