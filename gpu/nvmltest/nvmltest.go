//go:build cgo

package nvmltest

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpu-arbiter/arbiter/gpu"
)

// Opener returns a gpu.Opener that opens the inventory of s with gpu.New,
// as gpu.Open opens the node's NVML; its options are ignored.
func Opener(s *server.Server) gpu.Opener {
	return func(*gpu.Options) (gpu.Inventory, error) {
		inv, err := gpu.New(s)
		if err != nil {
			// A nil *gpu.NVML in an Inventory would not be a nil Inventory.
			return nil, err
		}
		return inv, nil
	}
}

// HGX fills in what go-nvml's DGX mock servers leave nil, as an HGX board
// has it, and returns s: PCI bus ids in PciInfo, NUMA node index/4,
// default compute mode, 12 NVLinks per GPU, two to each of 6 NVSwitches
// (SwitchBus), GPUs paired behind PCIe switches (PXB), pairs of pairs
// within a NUMA node (NODE), the rest across sockets (SYS), and no
// processes.
func HGX(s *server.Server) *server.Server {
	for _, dev := range s.Devices {
		d := dev.(*server.Device)
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{BusId: BusID("0000" + d.PciBusID), PciDeviceId: d.Config.PciDeviceId}, nvml.SUCCESS
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
			return nvml.PciInfo{BusId: BusID(SwitchBus(link / 2))}, nvml.SUCCESS
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

// SwitchBus is the PCI bus id of NVSwitch k on the board HGX emulates.
func SwitchBus(k int) string { return fmt.Sprintf("0000:%02x:00.0", 0xc0+k) }

// BusID is a bus id as NVML's PciInfo holds it: upper case,
// NUL-terminated.
func BusID(s string) [32]int8 {
	var out [32]int8
	for i, c := range strings.ToUpper(s) {
		out[i] = int8(c)
	}
	return out
}

// Calls counts every call recorded by a mock server and its devices: the
// sum over all their moq XxxCalls() methods.
func Calls(s *server.Server) int {
	n := countCalls(s)
	for _, d := range s.Devices {
		n += countCalls(d)
	}
	return n
}

// countCalls sums the lengths of the call records of one moq mock.
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
