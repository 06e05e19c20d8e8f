//go:build cgo

package gpu_test

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpu-arbiter/arbiter/gpu"
	"github.com/gpu-arbiter/arbiter/gpu/nvmltest"
)

// TestCheckOverMocks checks what doctor's NVML check says of go-nvml's
// mock servers: the driver, the CUDA version and the GPUs by model, and
// that the inventory is closed again.
func TestCheckOverMocks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		server *server.Server
		ok     bool
		detail string
	}{
		{"dgx-h100", dgxh100.New(), true, "driver 550.54.15, CUDA 12.4, 8 GPUs (8 × NVIDIA H100 80GB HBM3)"},
		{"dgx-b200", dgxb200.New(), true, "driver 560.28.03, CUDA 12.6, 8 GPUs (8 × NVIDIA B200 180GB HBM3e)"},
		{"mixed", dgxh100.NewWithGPUs(gpus.H100_SXM5_80GB, gpus.A100_SXM4_80GB, gpus.H100_SXM5_80GB), true,
			"driver 550.54.15, CUDA 12.4, 3 GPUs (2 × NVIDIA H100 80GB HBM3, 1 × NVIDIA A100-SXM4-80GB)"},
		{"one", dgxh100.NewWithGPUs(gpus.H200_SXM5_141GB), true, "driver 550.54.15, CUDA 12.4, 1 GPU (1 × NVIDIA H200 141GB HBM3e)"},
		{"none", dgxh100.NewWithGPUs(), false, "NVML works (driver 550.54.15, CUDA 12.4) but sees no GPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := nvmltest.HGX(tc.server)
			a := gpu.Check(nvmltest.Opener(s), nil)
			if a.OK != tc.ok || a.Detail != tc.detail || (a.Fix == "") != tc.ok {
				t.Errorf("Check: %+v\nwant OK %v, detail %q, a fix unless OK", a, tc.ok, tc.detail)
			}
			if !tc.ok && !strings.Contains(a.Fix, "nvidia-smi -L") {
				t.Errorf("fix %q does not say how to see the GPUs", a.Fix)
			}
			if len(s.InitCalls()) != 1 || len(s.ShutdownCalls()) != 1 {
				t.Errorf("%d Inits and %d Shutdowns, want 1 and 1", len(s.InitCalls()), len(s.ShutdownCalls()))
			}
		})
	}
}

// TestCheckAfterFailedInit checks that a failed Init is reported with
// what to do, and that nothing but Init reaches NVML.
func TestCheckAfterFailedInit(t *testing.T) {
	s := nvmltest.HGX(dgxh100.New())
	s.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	a := gpu.Check(nvmltest.Opener(s), nil)
	if a.OK || a.Detail != "NVML is not available: nvmlInit: ERROR_DRIVER_NOT_LOADED" ||
		!strings.Contains(a.Fix, "modprobe nvidia") || !strings.HasSuffix(a.Fix, "; meanwhile arbiter runs with the GPUs it learns from the driver trace") {
		t.Errorf("Check: %+v", a)
	}
	if n := nvmltest.Calls(s); n != 1 || len(s.InitCalls()) != 1 {
		t.Errorf("%d calls reached NVML, want only Init", n)
	}
}

// TestCheckNilInventory checks that an opener returning nothing is
// reported, not dereferenced.
func TestCheckNilInventory(t *testing.T) {
	a := gpu.Check(func(*gpu.Options) (gpu.Inventory, error) { return nil, nil }, nil)
	if a.OK || !strings.Contains(a.Detail, "neither an inventory nor an error") || a.Fix == "" {
		t.Errorf("Check: %+v", a)
	}
}
