//go:build cgo

package gpu_test

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// switchBus is the PCI bus id of NVSwitch k on the emulated HGX board.
func switchBus(k int) string { return fmt.Sprintf("0000:%02x:00.0", 0xc0+k) }

// hgx fills in what go-nvml's DGX mock servers leave nil, as an HGX board
// has it: PCI bus ids in PciInfo, NUMA node index/4, default compute mode,
// 12 NVLinks per GPU, two to each of 6 NVSwitches, GPUs paired behind PCIe
// switches (PXB), pairs of pairs within a NUMA node (NODE), the rest
// across sockets (SYS), and no processes.
func hgx(s *server.Server) *server.Server {
	for _, dev := range s.Devices {
		d := dev.(*server.Device)
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{BusId: cBusID("0000" + d.PciBusID), PciDeviceId: d.Config.PciDeviceId}, nvml.SUCCESS
		}
		d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return d.Index / 4, nvml.SUCCESS }
		d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return nvml.COMPUTEMODE_DEFAULT, nvml.SUCCESS }
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= 12 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{BusId: cBusID(switchBus(link / 2))}, nvml.SUCCESS
		}
		d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			o := other.(*server.Device)
			switch {
			case d.Index/2 == o.Index/2:
				return nvml.TOPOLOGY_MULTIPLE, nvml.SUCCESS
			case d.Index/4 == o.Index/4:
				return nvml.TOPOLOGY_NODE, nvml.SUCCESS
			}
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		d.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			return nil, nvml.ERROR_NOT_FOUND
		}
	}
	return s
}

// cBusID is a bus id as NVML's PciInfo holds it: eight-digit domain,
// upper case, NUL-terminated.
func cBusID(s string) [32]int8 {
	var out [32]int8
	for i, c := range strings.ToUpper(s) {
		out[i] = int8(c)
	}
	return out
}

// calls counts every call recorded by a mock server and its devices: the
// sum over all their moq XxxCalls() methods.
func calls(s *server.Server) int {
	n := countCalls(s)
	for _, d := range s.Devices {
		n += countCalls(d)
	}
	return n
}

func countCalls(mock any) int {
	v := reflect.ValueOf(mock)
	n := 0
	for i := range v.NumMethod() {
		m := v.Type().Method(i)
		if !strings.HasSuffix(m.Name, "Calls") || m.Type.NumIn() != 1 || m.Type.NumOut() != 1 {
			continue
		}
		if out := v.Method(i).Call(nil)[0]; out.Kind() == reflect.Slice {
			n += out.Len()
		}
	}
	return n
}
