//go:build cgo

package gpu_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/gpu-arbiter/arbiter/gpu"
)

func TestOpenWithoutTheLibrary(t *testing.T) {
	inv, err := gpu.Open(&gpu.Options{LibraryPath: "/nonexistent/libnvidia-ml.so.1"})
	if inv != nil || !errors.Is(err, gpu.ErrUnavailable) {
		t.Fatalf("Open: %v, %v; want ErrUnavailable", inv, err)
	}
	for _, want := range []string{"NVML is not available: /nonexistent/libnvidia-ml.so.1: cannot open shared object file",
		"arbiter runs with the GPUs it learns from the driver trace", "install the NVIDIA driver"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
}

func TestOpenALibraryThatIsNotNVML(t *testing.T) {
	// libc loads fine but has no nvmlInit_v2: go-nvml would end the
	// process calling it.
	_, err := gpu.Open(&gpu.Options{LibraryPath: "libc.so.6"})
	if !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), "libc.so.6 is not NVML") {
		t.Fatalf("Open: %v; want ErrUnavailable saying libc.so.6 is not NVML", err)
	}
}

// TestOpenTheNodesNVML loads the node's own libnvidia-ml.so.1: on a node
// without the NVIDIA driver (CI, the development machines) it must report
// NVML unavailable, not crash; on a GPU node it must list the GPUs.
func TestOpenTheNodesNVML(t *testing.T) {
	inv, err := gpu.Open(nil)
	if err != nil {
		if !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), "libnvidia-ml.so.1") && !strings.Contains(err.Error(), "nvmlInit") {
			t.Fatalf("Open: %v; want ErrUnavailable naming libnvidia-ml.so.1 or nvmlInit", err)
		}
		t.Logf("no NVML here: %v", err)
		a := gpu.Check(nil, nil)
		if a.OK || !strings.HasPrefix(a.Detail, "NVML is not available") || !strings.Contains(a.Fix, "driver trace") {
			t.Errorf("Check: %+v; want not OK with the reason and the fallback", a)
		}
		return
	}
	defer inv.Close()
	gpus, err := inv.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gpus {
		if !strings.HasPrefix(g.UUID, "GPU-") || g.MemoryTotal == 0 || g.PCIBusID == "" {
			t.Errorf("GPU %+v lacks its UUID, memory or bus id", g)
		}
	}
	if a := gpu.Check(nil, nil); !a.OK {
		t.Errorf("Check: %+v after Open succeeded", a)
	}
	t.Logf("NVML here: %d GPUs", len(gpus))
}

func TestCheckWithoutTheLibrary(t *testing.T) {
	a := gpu.Check(nil, &gpu.Options{LibraryPath: "/nonexistent/libnvidia-ml.so.1"})
	if a.OK || !strings.HasPrefix(a.Detail, "NVML is not available: /nonexistent/libnvidia-ml.so.1") ||
		!strings.Contains(a.Fix, "install the NVIDIA driver") || !strings.Contains(a.Fix, "driver trace") {
		t.Errorf("Check: %+v", a)
	}
}

// TestBuildsWithoutCgo runs this package's no-cgo test (Open reports NVML
// unavailable) with CGO_ENABLED=0, and builds the package for arm64
// without cgo, as the static builds do.
func TestBuildsWithoutCgo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package twice")
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		if goTool, err = exec.LookPath("go"); err != nil {
			t.Fatalf("no go tool to build with: %v", err)
		}
	}
	for _, args := range [][]string{
		{"test", "-count=1", "-run", "^TestOpenWithoutCgo$", "-v", "."},
		{"build", "."},
	} {
		cmd := exec.Command(goTool, args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if args[0] == "build" {
			cmd.Env = append(cmd.Env, "GOARCH=arm64")
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("CGO_ENABLED=0 go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if args[0] == "test" && !strings.Contains(string(out), "--- PASS: TestOpenWithoutCgo") {
			t.Fatalf("the no-cgo test did not run:\n%s", out)
		}
	}
}
