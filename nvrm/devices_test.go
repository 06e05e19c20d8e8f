package nvrm

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestGPUDevices: the driver's numbered character devices, not its
// control, UVM or capability nodes, nor a regular file named like one.
func TestGPUDevices(t *testing.T) {
	dev := t.TempDir()
	for _, name := range []string{"nvidia3", "nvidia0", "nvidiactl", "nvidia-uvm", "nvidia10"} {
		if err := unix.Mknod(filepath.Join(dev, name), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatalf("mknod %s (the test runs as root): %v", name, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dev, "nvidia7"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(GPUDevices(dev)); got != "[0 3 10]" {
		t.Errorf("GPUDevices = %s, want [0 3 10]", got)
	}
	if got := GPUDevices(filepath.Join(dev, "absent")); got != nil {
		t.Errorf("GPUDevices of a missing directory = %v", got)
	}
}
