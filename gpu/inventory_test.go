//go:build cgo

package gpu_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpu-arbiter/arbiter/gpu"
	"github.com/gpu-arbiter/arbiter/gpu/nvmltest"
)

const gib = 1 << 30

func TestInventoryOfDGXServers(t *testing.T) {
	for _, tc := range []struct {
		server *server.Server
		name   string
		memory uint64
		driver string
	}{
		{dgxa100.New(), "Mock NVIDIA A100-SXM4-40GB", 40 * gib, "550.54.15 12.4"},
		{dgxh100.New(), "NVIDIA H100 80GB HBM3", 80 * gib, "550.54.15 12.4"},
		{dgxh200.New(), "NVIDIA H200 141GB HBM3e", 141 * gib, "550.54.15 12.4"},
		{dgxb200.New(), "NVIDIA B200 180GB HBM3e", 180 * gib, "560.28.03 12.6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv := open(t, nvmltest.HGX(tc.server))
			v, err := inv.Versions()
			if err != nil {
				t.Fatal(err)
			}
			driver, cuda, _ := strings.Cut(tc.driver, " ")
			if want := (gpu.Versions{Driver: driver, CUDADriver: cuda, NVML: "12." + driver}); !equalVersions(v, want) {
				t.Errorf("versions %+v, want %+v", v, want)
			}
			gpus, err := inv.GPUs()
			if err != nil {
				t.Fatal(err)
			}
			if len(gpus) != 8 {
				t.Fatalf("%d GPUs, want 8", len(gpus))
			}
			uuids := map[string]bool{}
			for i, g := range gpus {
				d := tc.server.Devices[i].(*server.Device)
				want := gpu.GPU{Index: i, UUID: d.UUID, Name: tc.name, MemoryTotal: tc.memory,
					PCIBusID: fmt.Sprintf("0000:%02x:00.0", i), NUMANode: i / 4, ComputeMode: gpu.ComputeDefault}
				if !equalGPU(g, want) {
					t.Errorf("GPU %d:\n got %+v\nwant %+v", i, g, want)
				}
				if !strings.HasPrefix(g.UUID, "GPU-") || uuids[g.UUID] {
					t.Errorf("GPU %d: UUID %q is not a distinct GPU UUID", i, g.UUID)
				}
				uuids[g.UUID] = true
			}
		})
	}
}

func TestNVLinkThroughNVSwitches(t *testing.T) {
	inv := open(t, nvmltest.HGX(dgxa100.New()))
	topo, err := inv.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Unsupported) != 0 {
		t.Errorf("unsupported: %v", topo.Unsupported)
	}
	if len(topo.GPUs) != 8 || len(topo.Pairs) != 28 {
		t.Fatalf("%d GPUs and %d pairs, want 8 and 28", len(topo.GPUs), len(topo.Pairs))
	}
	for _, g := range topo.GPUs {
		if len(g.NVLinks) != 12 {
			t.Errorf("GPU %d: %d NVLinks, want 12", g.GPU, len(g.NVLinks))
		}
		for _, l := range g.NVLinks {
			if l.RemoteGPU != -1 || l.RemoteBusID != fmt.Sprintf("0000:%02x:00.0", 0xc0+l.Link/2) {
				t.Errorf("GPU %d link %d: far end %q GPU %d, want NVSwitch %d", g.GPU, l.Link, l.RemoteBusID, l.RemoteGPU, l.Link/2)
			}
		}
		var want []int
		for p := range 8 {
			if p != g.GPU {
				want = append(want, p)
			}
		}
		if !slices.Equal(g.Peers, want) {
			t.Errorf("GPU %d peers %v, want %v", g.GPU, g.Peers, want)
		}
	}
	// As `nvidia-smi topo -m` shows a DGX A100: NV12 between every pair,
	// and the PCIe level underneath.
	levels := map[[2]int]gpu.Level{{0, 1}: gpu.LevelPXB, {0, 2}: gpu.LevelNODE, {0, 4}: gpu.LevelSYS, {6, 7}: gpu.LevelPXB, {3, 5}: gpu.LevelSYS}
	for _, p := range topo.Pairs {
		if p.NVLinks != 12 || p.String() != "NV12" {
			t.Errorf("pair %d-%d: %d NVLinks (%s), want NV12", p.A, p.B, p.NVLinks, p)
		}
		if want, ok := levels[[2]int{p.A, p.B}]; ok && p.Level != want {
			t.Errorf("pair %d-%d: level %s, want %s", p.A, p.B, p.Level, want)
		}
	}
}

func TestNVLinkBridgedPairs(t *testing.T) {
	// H100 NVL cards bridged two by two: four links GPU to GPU, no switch;
	// GPUs 4-7 have NVLink hardware with every link down.
	s := nvmltest.HGX(dgxh100.New())
	for _, dev := range s.Devices {
		d := dev.(*server.Device)
		peer := d.Index ^ 1
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= 18 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if link < 4 && d.Index < 4 {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{BusId: nvmltest.BusID(fmt.Sprintf("00000000:%02X:00.0", peer))}, nvml.SUCCESS
		}
		d.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			return nvml.TOPOLOGY_HOSTBRIDGE, nvml.SUCCESS
		}
	}
	topo, err := open(t, s).Topology()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range topo.GPUs {
		var want []int
		if g.GPU < 4 {
			want = []int{g.GPU ^ 1}
		}
		if !slices.Equal(g.Peers, want) {
			t.Errorf("GPU %d peers %v, want %v", g.GPU, g.Peers, want)
		}
	}
	for _, p := range topo.Pairs {
		want := "PHB"
		if p.A < 4 && p.B == p.A^1 {
			want = "NV4"
		}
		if p.String() != want {
			t.Errorf("pair %d-%d: %s, want %s", p.A, p.B, p, want)
		}
	}
	nodes := gpu.NodeGPUs(mustGPUs(t, open(t, s)), topo)
	if !slices.Equal(nodes[2].NVLinkPeers, []int{3}) || nodes[5].NVLinkPeers != nil || nodes[2].MemoryBytes != 80*gib || nodes[7].NUMANode != 1 {
		t.Errorf("node description %+v", nodes)
	}
}

func TestProcesses(t *testing.T) {
	s := nvmltest.HGX(dgxh100.New())
	since := time.UnixMicro(1_700_000_000_000_000)
	at := func(d time.Duration) uint64 { return uint64(since.Add(d).UnixMicro()) }
	d0, d3 := s.Devices[0].(*server.Device), s.Devices[3].(*server.Device)
	d0.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{
			{Pid: 4242, UsedGpuMemory: 30 * gib, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF},
			{Pid: 77, UsedGpuMemory: 2 * gib, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF},
		}, nvml.SUCCESS
	}
	d0.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 77, UsedGpuMemory: 2 * gib, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}}, nvml.SUCCESS
	}
	var asked []uint64
	d0.GetProcessUtilizationFunc = func(last uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		asked = append(asked, last)
		return []nvml.ProcessUtilizationSample{
			{Pid: 4242, TimeStamp: at(100 * time.Millisecond), SmUtil: 40, MemUtil: 10},
			{Pid: 4242, TimeStamp: at(300 * time.Millisecond), SmUtil: 95, MemUtil: 30, EncUtil: 1, DecUtil: 2},
			{Pid: 4242, TimeStamp: at(200 * time.Millisecond), SmUtil: 60},
			{Pid: 9999, TimeStamp: at(300 * time.Millisecond), SmUtil: 5}, // exited: not listed
		}, nvml.SUCCESS
	}
	// GPU 3 is in MIG mode; NVML cannot tell one process's memory.
	d3.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{
			{Pid: 500, UsedGpuMemory: 5 * gib, GpuInstanceId: 1, ComputeInstanceId: 0},
			{Pid: 501, UsedGpuMemory: ^uint64(0), GpuInstanceId: 2, ComputeInstanceId: 0},
		}, nvml.SUCCESS
	}
	d3.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	table, err := open(t, s).Processes(since)
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.Process{
		{PID: 77, GPU: 0, Compute: true, Graphics: true, MemoryBytes: 2 * gib, GPUInstance: -1, ComputeInstance: -1},
		{PID: 4242, GPU: 0, Compute: true, MemoryBytes: 30 * gib, GPUInstance: -1, ComputeInstance: -1,
			Utilization: &gpu.Utilization{At: since.Add(300 * time.Millisecond), SM: 95, Memory: 30, Encoder: 1, Decoder: 2}},
		{PID: 500, GPU: 3, Compute: true, MemoryBytes: 5 * gib, GPUInstance: 1, ComputeInstance: 0},
		{PID: 501, GPU: 3, Compute: true, GPUInstance: 2, ComputeInstance: 0},
	}
	if got := fmt.Sprintf("%+v", deref(table.Processes)); got != fmt.Sprintf("%+v", deref(want)) {
		t.Errorf("processes\n got %s\nwant %s", got, fmt.Sprintf("%+v", deref(want)))
	}
	if !slices.Equal(asked, []uint64{uint64(since.UnixMicro())}) {
		t.Errorf("utilization asked since %v, want %d", asked, since.UnixMicro())
	}
	wantUnsupported := []string{
		"GPU 3 utilization: nvmlDeviceGetProcessUtilization: ERROR_NOT_SUPPORTED",
		"GPU 3 memory of pid 501: nvmlDeviceGetComputeRunningProcesses: NVML gives it as not available",
	}
	if got := strs(table.Unsupported); !slices.Equal(got, wantUnsupported) {
		t.Errorf("unsupported\n got %q\nwant %q", got, wantUnsupported)
	}
}

func TestInitFailureCallsNothingElse(t *testing.T) {
	for _, tc := range []struct {
		ret  nvml.Return
		want string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1"},
		{nvml.ERROR_DRIVER_NOT_LOADED, "modprobe nvidia"},
		{nvml.ERROR_LIB_RM_VERSION_MISMATCH, "different driver versions"},
		{nvml.ERROR_NO_PERMISSION, "run arbiter as root"},
		{nvml.Return(12345), "nvidia-smi"},
	} {
		s := dgxa100.New()
		s.InitFunc = func() nvml.Return { return tc.ret }
		inv, err := gpu.New(s)
		if inv != nil || !errors.Is(err, gpu.ErrUnavailable) {
			t.Fatalf("New after Init %d: %v, %v; want ErrUnavailable", tc.ret, inv, err)
		}
		msg := err.Error()
		for _, want := range []string{"NVML is not available", "runs with the GPUs it learns from the driver trace", tc.want} {
			if !strings.Contains(msg, want) {
				t.Errorf("Init %d: %q lacks %q", tc.ret, msg, want)
			}
		}
		if n := nvmltest.Calls(s); n != 1 || len(s.InitCalls()) != 1 {
			t.Errorf("Init %d: %d calls reached NVML, want only Init", tc.ret, n)
		}
	}
}

func TestClosedInventoryCallsNothing(t *testing.T) {
	s := nvmltest.HGX(dgxa100.New())
	inv, err := gpu.New(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := inv.Close(); err != nil {
		t.Fatal(err)
	}
	before := nvmltest.Calls(s)
	if _, err := inv.GPUs(); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("GPUs after Close: %v, want ErrClosed", err)
	}
	if _, err := inv.Topology(); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("Topology after Close: %v, want ErrClosed", err)
	}
	if _, err := inv.Processes(time.Time{}); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("Processes after Close: %v, want ErrClosed", err)
	}
	if _, err := inv.Versions(); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("Versions after Close: %v, want ErrClosed", err)
	}
	if err := inv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if after := nvmltest.Calls(s); after != before || len(s.ShutdownCalls()) != 1 {
		t.Errorf("%d calls reached NVML after Close, %d Shutdowns; want none and 1", after-before, len(s.ShutdownCalls()))
	}
}

func TestNotSupportedFieldsAreRecorded(t *testing.T) {
	s := nvmltest.HGX(dgxa100.New())
	d2 := s.Devices[2].(*server.Device)
	d2.GetNumaNodeIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	d2.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	d2.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	s.Devices[5].(*server.Device).SetMigMode(nvml.DEVICE_MIG_ENABLE)
	inv := open(t, s)
	gpus := mustGPUs(t, inv)
	g := gpus[2]
	if g.NUMANode != -1 || g.UUID == "" || g.MemoryTotal != 40*gib {
		t.Errorf("GPU 2 %+v: want NUMA node -1 and the other fields filled", g)
	}
	want := []string{
		"GPU 2 numa_node: nvmlDeviceGetNumaNodeId: ERROR_NOT_SUPPORTED",
		"GPU 2 mig: nvmlDeviceGetMigMode: ERROR_NOT_SUPPORTED",
	}
	if got := strs(g.Unsupported); !slices.Equal(got, want) {
		t.Errorf("GPU 2 unsupported %q, want %q", got, want)
	}
	if !gpus[5].MIG || gpus[4].MIG || len(gpus[5].Unsupported) != 0 {
		t.Errorf("MIG: GPU 4 %v, GPU 5 %v (%v); want off, on", gpus[4].MIG, gpus[5].MIG, gpus[5].Unsupported)
	}
	topo, err := inv.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strs(topo.Unsupported), []string{"GPU 2 nvlink: nvmlDeviceGetNvLinkState: ERROR_NOT_SUPPORTED"}; !slices.Equal(got, want) {
		t.Errorf("topology unsupported %q, want %q", got, want)
	}
	if topo.GPUs[2].Peers != nil || slices.Contains(topo.GPUs[0].Peers, 2) || len(topo.GPUs[0].Peers) != 6 {
		t.Errorf("peers: GPU 2 %v, GPU 0 %v; want none, the six others", topo.GPUs[2].Peers, topo.GPUs[0].Peers)
	}
}

func TestFunctionsTheDriverLacksAreNeverCalled(t *testing.T) {
	s := nvmltest.HGX(dgxa100.New())
	lacks := map[string]bool{"nvmlDeviceGetNumaNodeId": true, "nvmlDeviceGetProcessUtilization": true, "nvmlSystemGetNVMLVersion": true}
	s.LookupSymbolFunc = func(name string) error {
		if lacks[name] {
			return fmt.Errorf("symbol %q not found", name)
		}
		return nil
	}
	for _, dev := range s.Devices {
		// go-nvml's real binding would end the process here; the mock panics.
		dev.(*server.Device).GetNumaNodeIdFunc = nil
		dev.(*server.Device).GetProcessUtilizationFunc = nil
	}
	s.SystemGetNVMLVersionFunc = nil
	s.Devices[1].(*server.Device).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: gib}}, nvml.SUCCESS
	}
	inv := open(t, s)
	v, err := inv.Versions()
	if err != nil || v.NVML != "" || v.Driver == "" || len(v.Unsupported) != 1 {
		t.Errorf("versions %+v, %v; want the driver and NVML's version unsupported", v, err)
	}
	gpus := mustGPUs(t, inv)
	if gpus[0].NUMANode != -1 || !strings.Contains(strs(gpus[0].Unsupported)[0], "does not export it") {
		t.Errorf("GPU 0 %+v: want NUMA node unsupported because the driver lacks the function", gpus[0])
	}
	table, err := inv.Processes(time.Time{})
	if err != nil || len(table.Processes) != 1 || table.Processes[0].Utilization != nil {
		t.Errorf("processes %+v, %v; want pid 10 without utilization", table, err)
	}
}

func TestRequiredFunctionMissing(t *testing.T) {
	s := nvmltest.HGX(dgxa100.New())
	s.LookupSymbolFunc = func(name string) error {
		if name == "nvmlDeviceGetComputeRunningProcesses" {
			return errors.New("not found")
		}
		return nil
	}
	_, err := gpu.New(s)
	if !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), "lacks nvmlDeviceGetComputeRunningProcesses") {
		t.Fatalf("New: %v; want ErrUnavailable naming the missing function", err)
	}
	if len(s.ShutdownCalls()) != 1 {
		t.Errorf("%d Shutdowns after a successful Init, want 1", len(s.ShutdownCalls()))
	}
}

func TestCallErrorsNameTheGPUAndCall(t *testing.T) {
	s := nvmltest.HGX(dgxa100.New())
	s.Devices[5].(*server.Device).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
	}
	s.Devices[6].(*server.Device).GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		return 0, nvml.ERROR_UNKNOWN
	}
	s.Devices[7].(*server.Device).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return nil, nvml.ERROR_NO_PERMISSION
	}
	inv := open(t, s)
	_, err := inv.GPUs()
	var ce *gpu.CallError
	if !errors.As(err, &ce) || ce.GPU != 5 || ce.Call != "nvmlDeviceGetMemoryInfo" || ce.Code != int(nvml.ERROR_GPU_IS_LOST) {
		t.Errorf("GPUs: %v (%+v); want a CallError for GPU 5's nvmlDeviceGetMemoryInfo", err, ce)
	} else if want := "GPU 5 nvmlDeviceGetMemoryInfo: ERROR_GPU_IS_LOST (the GPU fell off the bus"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("GPUs: %q, want it to start %q", err, want)
	}
	if _, err := inv.Topology(); err == nil || err.Error() != "GPU 6 nvmlDeviceGetTopologyCommonAncestor: ERROR_UNKNOWN" {
		t.Errorf("Topology: %v", err)
	}
	if _, err := inv.Processes(time.Time{}); err == nil || !strings.HasPrefix(err.Error(), "GPU 7 nvmlDeviceGetComputeRunningProcesses: ERROR_NO_PERMISSION (run arbiter as root") {
		t.Errorf("Processes: %v", err)
	}
}

func TestNewRejectsNil(t *testing.T) {
	if _, err := gpu.New(nil); err == nil || !strings.Contains(err.Error(), "nil nvml.Interface") {
		t.Errorf("New(nil): %v", err)
	}
}

// open returns the inventory of s, closed at the end of the test.
func open(t *testing.T, s *server.Server) *gpu.NVML {
	t.Helper()
	inv, err := gpu.New(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := inv.Close(); err != nil {
			t.Error(err)
		}
	})
	return inv
}

func mustGPUs(t *testing.T, inv gpu.Inventory) []gpu.GPU {
	t.Helper()
	gpus, err := inv.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	return gpus
}

func equalVersions(a, b gpu.Versions) bool {
	return a.Driver == b.Driver && a.CUDADriver == b.CUDADriver && a.NVML == b.NVML && len(a.Unsupported) == len(b.Unsupported)
}

func equalGPU(a, b gpu.GPU) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}

func strs(us []gpu.Unsupported) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.String()
	}
	return out
}

// deref renders processes with their utilization by value, for comparison.
func deref(ps []gpu.Process) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		u := p.Utilization
		p.Utilization = nil
		out[i] = fmt.Sprintf("%+v", p)
		if u != nil {
			out[i] += fmt.Sprintf(" util %+v", *u)
		}
	}
	return out
}
