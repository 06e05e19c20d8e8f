//go:build cgo

package preflight

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpu-arbiter/arbiter/gpu/nvmltest"
)

// TestNVMLCheckOverMocks runs the nvml check against go-nvml's DGX mock
// servers: OK, with the mock's driver and CUDA versions and its GPUs by
// model, and NVML shut down again.
func TestNVMLCheckOverMocks(t *testing.T) {
	for _, tc := range []struct {
		server *server.Server
		detail string
	}{
		{dgxh100.New(), "NVML works: driver 550.54.15, CUDA 12.4, 8 GPUs (8 × NVIDIA H100 80GB HBM3)"},
		{dgxh200.New(), "NVML works: driver 550.54.15, CUDA 12.4, 8 GPUs (8 × NVIDIA H200 141GB HBM3e)"},
	} {
		s := nvmltest.HGX(tc.server)
		r := checkNVML(&env{root: "/", openNVML: nvmltest.Opener(s)})
		if r.status != OK || r.detail != tc.detail || r.fix != "" {
			t.Errorf("%+v\nwant OK %q", r, tc.detail)
		}
		if len(s.ShutdownCalls()) != 1 {
			t.Errorf("%d Shutdowns, want 1", len(s.ShutdownCalls()))
		}
	}
}

// TestNVMLCheckInitFails runs the nvml check against a mock whose Init
// fails: a warning that says why and what to do, and no call after Init
// (go-nvml's real binding would end the process on one).
func TestNVMLCheckInitFails(t *testing.T) {
	for _, tc := range []struct {
		ret       nvml.Return
		detail    string
		fixPrefix string
	}{
		{nvml.ERROR_DRIVER_NOT_LOADED, "NVML is not available: nvmlInit: ERROR_DRIVER_NOT_LOADED", "the NVIDIA kernel module is not loaded: load it (modprobe nvidia)"},
		{nvml.ERROR_LIB_RM_VERSION_MISMATCH, "NVML is not available: nvmlInit: ERROR_LIB_RM_VERSION_MISMATCH", "libnvidia-ml and the loaded kernel module are different driver versions"},
		{nvml.ERROR_NO_PERMISSION, "NVML is not available: nvmlInit: ERROR_NO_PERMISSION", "run arbiter as root"},
	} {
		s := nvmltest.HGX(dgxh100.New())
		s.InitFunc = func() nvml.Return { return tc.ret }
		r := checkNVML(&env{root: "/", openNVML: nvmltest.Opener(s)})
		if r.status != Warn || r.detail != tc.detail || !strings.HasPrefix(r.fix, tc.fixPrefix) ||
			!strings.HasSuffix(r.fix, "; meanwhile arbiter runs with the GPUs it learns from the driver trace") {
			t.Errorf("Init %d: %+v\nwant WARN %q, fix %q...", tc.ret, r, tc.detail, tc.fixPrefix)
		}
		if n := nvmltest.Calls(s); n != 1 || len(s.InitCalls()) != 1 {
			t.Errorf("Init %d: %d calls reached NVML, want only Init", tc.ret, n)
		}
	}
}
