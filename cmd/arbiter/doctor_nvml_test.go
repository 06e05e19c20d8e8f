//go:build cgo

package main

import (
	"bytes"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpu-arbiter/arbiter/gpu/nvmltest"
	"github.com/gpu-arbiter/arbiter/internal/preflight"
)

// doctorOver runs doctor in this process, as the CLI does, with its NVML
// check reading the mock server s, and returns the text and the JSON it
// prints. Whether the node is ready is the other tests' business.
func doctorOver(t *testing.T, s *server.Server) (string, string) {
	t.Helper()
	var out [2]bytes.Buffer
	for i, format := range []string{"text", "json"} {
		err := runDoctor(&doctorOptions{format: format, root: "/", openNVML: nvmltest.Opener(s)}, &out[i])
		if _, notReady := err.(*notReadyError); err != nil && !notReady {
			t.Fatalf("--format %s: %v", format, err)
		}
	}
	return out[0].String(), out[1].String()
}

// TestDoctorWithMockedNVML runs doctor with go-nvml's DGX H100 mock
// server as the node's NVML: the nvml check is OK with the mock's driver
// and CUDA versions and its eight GPUs by name, in both formats, and the
// JSON still fits the schema.
func TestDoctorWithMockedNVML(t *testing.T) {
	sch := doctorSchema(t)
	s := nvmltest.HGX(dgxh100.New())
	text, js := doctorOver(t, s)
	const want = "NVML works: driver 550.54.15, CUDA 12.4, 8 GPUs (8 × NVIDIA H100 80GB HBM3)"
	if st, rest := checkLine(t, text, "nvml"); st != "OK" || rest != want {
		t.Errorf("nvml: %s %s\nwant OK %s", st, rest, want)
	}
	doc := validDoctorJSON(t, sch, js)
	if c := docCheck(t, doc, "nvml"); c.Status != preflight.OK || c.Detail != want || c.Fix != "" || len(c.NeededBy) != 0 {
		t.Errorf("nvml: %+v", c)
	}
	if len(s.InitCalls()) != 2 || len(s.ShutdownCalls()) != 2 {
		t.Errorf("%d Inits and %d Shutdowns for two runs, want 2 and 2", len(s.InitCalls()), len(s.ShutdownCalls()))
	}
}

// TestDoctorWithNVMLInitFailing runs doctor with a mock NVML whose Init
// fails: the nvml check warns with the reason and what to do, the JSON
// fits the schema, and nothing but Init reaches NVML (go-nvml's real
// binding ends the process on any call after a failed Init).
func TestDoctorWithNVMLInitFailing(t *testing.T) {
	sch := doctorSchema(t)
	s := nvmltest.HGX(dgxh100.New())
	s.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	text, js := doctorOver(t, s)
	const detail = "NVML is not available: nvmlInit: ERROR_DRIVER_NOT_LOADED"
	const fix = "the NVIDIA kernel module is not loaded: load it (modprobe nvidia) and check dmesg; meanwhile arbiter runs with the GPUs it learns from the driver trace"
	if st, rest := checkLine(t, text, "nvml"); st != "WARN" || rest != detail+" | fix: "+fix {
		t.Errorf("nvml: %s %s\nwant WARN %s | fix: %s", st, rest, detail, fix)
	}
	doc := validDoctorJSON(t, sch, js)
	if c := docCheck(t, doc, "nvml"); c.Status != preflight.Warn || c.Detail != detail || c.Fix != fix {
		t.Errorf("nvml: %+v", c)
	}
	if n := nvmltest.Calls(s); n != 2 || len(s.InitCalls()) != 2 {
		t.Errorf("%d calls reached NVML in two runs, want only the two Inits", n)
	}
}
