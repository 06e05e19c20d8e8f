package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/gpu-arbiter/arbiter/procfs"
	"github.com/gpu-arbiter/arbiter/uprobe"
)

// TestRecoverOtherFormats: recover after a newer arbiter (a downgrade)
// names the state file it does not read, with the file's version and the
// versions it reads, and still releases the process stopped in a gate of
// the newer format, through the fields every format keeps; it exits 0,
// as nothing is left.
func TestRecoverOtherFormats(t *testing.T) {
	n := newRecoverNode(t)
	nvrmDir := n.stateDir
	if err := os.MkdirAll(nvrmDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nvrmDir, "state.json"), []byte(`{"version":7,"processes":{"a newer":"layout"}}`), 0o600); err != nil {
		t.Fatal(err)
	}

	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sleeper.Process.Signal(syscall.SIGCONT)
		_ = sleeper.Process.Kill()
		_ = sleeper.Wait()
	})
	pid := sleeper.Process.Pid
	start, err := procfs.At("/proc").StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := sleeper.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, pid, true, "stopped as a gate of format 2 would")
	// A gate of format version 2: longer values, the shared prefix first.
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 32, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v := make([]byte, 32)
	binary.NativeEndian.PutUint64(v, start*10_000_000)
	binary.NativeEndian.PutUint32(v[8:], 1)
	if err := m.Put(uint32(pid), v); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(n.pinDir, 0o700); err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(n.pinDir, uprobe.GateMapName+"_v2")
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}

	code, out := n.recover(t)
	for _, want := range []string{
		"warning: channels: nvrm: " + filepath.Join(nvrmDir, "state.json") + " has state format version 7, which this arbiter does not read (it reads versions 1 and 2",
		"warning: gate: " + pin + " has launch gate format version 2 (a newer arbiter's); this arbiter gates only with version 1",
		fmt.Sprintf("gate: process %d (start %d): continued (the gate had stopped it)\n", pid, start),
		"gate: removed " + pin + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("recover output lacks %q", want)
		}
	}
	if code != 0 || strings.Contains(out, "error:") || strings.Contains(out, "nothing to recover") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	waitStopped(t, pid, false, "after recover")
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Errorf("pin left: %v", err)
	}

	// The registry recover kept while it worked replaced the file it did
	// not read (the handles in it are forgotten, as the warning says): a
	// second run finds nothing at all.
	code, out = n.recover(t, "--format", "json")
	var rep recoverReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("exit %d, %v:\n%s", code, err, out)
	}
	if len(rep.OtherGates) != 0 || len(rep.Warnings) != 0 || !rep.NothingToRecover {
		t.Errorf("second run: %+v", rep)
	}
}
