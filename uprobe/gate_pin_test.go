package uprobe

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/gpu-arbiter/arbiter/bpf"
)

// TestGateValuePrefix: this build's gate value starts with the prefix
// every format keeps, which decodeGateValue reads.
func TestGateValuePrefix(t *testing.T) {
	var e bpf.CudaGateEntry
	if unsafe.Offsetof(e.Start) != 0 || unsafe.Sizeof(e.Start) != 8 || unsafe.Offsetof(e.Stopped) != 8 || unsafe.Sizeof(e.Stopped) != 4 {
		t.Fatalf("gate_entry is {start @%d, stopped @%d}: the prefix every format keeps is {u64 start @0, u32 stopped @8}",
			unsafe.Offsetof(e.Start), unsafe.Offsetof(e.Stopped))
	}
	v := make([]byte, 24)
	binary.NativeEndian.PutUint64(v, 123*tickNs)
	binary.NativeEndian.PutUint32(v[8:], 1)
	if got := decodeGateValue(v); got.Start != 123*tickNs || got.Stopped != 1 {
		t.Fatalf("decode %x = %+v", v, got)
	}
	if got := decodeGateValue(v[:8]); got != (bpf.CudaGateEntry{}) {
		t.Fatalf("decode of a short value = %+v", got)
	}
}

// TestFindGates reads format versions from pin names and ignores other
// files.
func TestFindGates(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"launch_gate_v3", "launch_gate", "launch_gate_v2", "launch_gate_v1", "launch_gate_vx", "launch_gate_v02", "nvrm"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := FindGates(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []GatePin{{filepath.Join(dir, "launch_gate"), 1}, {filepath.Join(dir, "launch_gate_v2"), 2}, {filepath.Join(dir, "launch_gate_v3"), 3}}
	if len(got) != len(want) {
		t.Fatalf("FindGates = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("FindGates[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	if got, err := FindGates(filepath.Join(dir, "none")); err != nil || len(got) != 0 {
		t.Errorf("FindGates of a missing directory = %+v, %v", got, err)
	}
}

// TestGateOfAnotherFormat releases a gate pinned in a format this build
// does not pin (a newer one's: longer values), through the prefix every
// format keeps: the stopped process is continued and the pin removed. A
// map without that prefix is refused, saying why.
func TestGateOfAnotherFormat(t *testing.T) {
	fs := mountBPFFS(t)
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sleeper.Process.Signal(syscall.SIGCONT)
		_ = sleeper.Process.Kill()
		_ = sleeper.Wait()
	})
	pid := uint32(sleeper.Process.Pid)
	start, err := procStart(DefaultProcRoot, pid)
	if err != nil {
		t.Fatal(err)
	}
	// As the launch probe of that format left it: the process stopped
	// and its entry marked.
	if err := sleeper.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, true, "stopped")
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "launch_gate_v9", Type: ebpf.Hash, KeySize: 4, ValueSize: 24, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v := make([]byte, 24)
	binary.NativeEndian.PutUint64(v, start*tickNs)
	binary.NativeEndian.PutUint32(v[8:], 1)
	copy(v[12:], "newer fields")
	if err := m.Put(pid, v); err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(fs, "launch_gate_v9")
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}
	gates, err := FindGates(fs)
	if err != nil || len(gates) != 1 || gates[0] != (GatePin{pin, 9}) {
		t.Fatalf("FindGates = %+v, %v", gates, err)
	}
	if _, err := OpenGate(fs); !errors.Is(err, ErrNoGate) {
		t.Fatalf("OpenGate found a gate of this build's format: %v", err)
	}
	g, err := OpenGatePin(gates[0])
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	gated, err := g.Gated()
	if err != nil || len(gated) != 1 || gated[0] != (GatedProcess{PID: pid, Start: start, Stopped: true}) {
		t.Fatalf("Gated() = %+v, %v", gated, err)
	}
	rel, err := g.ReleaseAll()
	if err != nil || len(rel) != 1 || !rel[0].Continued {
		t.Fatalf("ReleaseAll = %+v, %v", rel, err)
	}
	waitState(t, pid, false, "released")
	if err := g.Unpin(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin left: %v", err)
	}

	// A map whose values are shorter than the shared prefix.
	short, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	pin = filepath.Join(fs, "launch_gate_v10")
	if err := short.Pin(pin); err != nil {
		t.Fatal(err)
	}
	_, err = OpenGatePin(GatePin{pin, 10})
	if err == nil || !strings.Contains(err.Error(), "format version 10") || !strings.Contains(err.Error(), "cannot release it") {
		t.Errorf("OpenGatePin of a map without the prefix: %v", err)
	}
}
