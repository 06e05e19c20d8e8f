//go:build cgo

package gpu

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML is the Inventory read through go-nvml. Every call holds its lock,
// and Close takes it exclusively, so nothing reaches NVML during or after
// Shutdown.
type NVML struct {
	mu     sync.RWMutex
	lib    nvml.Interface
	closed bool
	// devices are the GPU handles, by index, taken once at New: NVML's
	// handles stay valid for the whole session.
	devices []nvml.Device
	// missing are the optional functions this NVML does not export.
	missing map[string]bool
}

var _ Inventory = (*NVML)(nil)

// required are the NVML functions without which there is no inventory;
// every NVML since the R450 drivers exports them.
var required = []string{
	"nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion",
	"nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
	"nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo",
	"nvmlDeviceGetComputeRunningProcesses",
}

// optional are the NVML functions an older driver may lack; a missing one
// makes its fields unsupported and is never called.
var optional = []string{
	"nvmlSystemGetNVMLVersion", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetComputeMode",
	"nvmlDeviceGetMigMode", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo",
	"nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetGraphicsRunningProcesses",
	"nvmlDeviceGetProcessUtilization",
}

// Open loads the node's NVML library and returns its inventory. When the
// library is missing, is not NVML, or NVML fails to initialize, the error
// matches ErrUnavailable and says why, and nothing else reaches NVML.
func Open(opts *Options) (Inventory, error) {
	path := DefaultLibrary
	if opts != nil && opts.LibraryPath != "" {
		path = opts.LibraryPath
	}
	if err := exportsInit(path); err != nil {
		return nil, err
	}
	n, err := New(nvml.New(nvml.WithLibraryPath(path)))
	if err != nil {
		return nil, err
	}
	return n, nil
}

// New initializes lib (the real library from nvml.New, or one of go-nvml's
// mock servers) and returns its inventory. When Init fails, the error
// matches ErrUnavailable and lib is never called again.
func New(lib nvml.Interface) (*NVML, error) {
	if lib == nil {
		return nil, fmt.Errorf("gpu.New: nil nvml.Interface: pass nvml.New() or a go-nvml mock server")
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, initError(ret)
	}
	n := &NVML{lib: lib, missing: map[string]bool{}}
	if err := n.load(); err != nil {
		// Init succeeded, so Shutdown is safe; its result adds nothing.
		_ = lib.Shutdown()
		return nil, err
	}
	return n, nil
}

// load finds which functions this NVML exports and takes every GPU's handle.
func (n *NVML) load() error {
	ext := n.lib.Extensions()
	var lacking []string
	for _, name := range required {
		if ext.LookupSymbol(name) != nil {
			lacking = append(lacking, name)
		}
	}
	if len(lacking) > 0 {
		return &UnavailableError{
			Reason: "this NVML lacks " + strings.Join(lacking, ", "),
			Fix:    "install an NVIDIA driver of branch R450 or newer",
		}
	}
	for _, name := range optional {
		if ext.LookupSymbol(name) != nil {
			n.missing[name] = true
		}
	}
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return callError(-1, "nvmlDeviceGetCount", ret)
	}
	for i := range count {
		d, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return callError(i, "nvmlDeviceGetHandleByIndex", ret)
		}
		n.devices = append(n.devices, d)
	}
	return nil
}

// Versions implements Inventory.
func (n *NVML) Versions() (Versions, error) {
	unlock, err := n.enter()
	if err != nil {
		return Versions{}, err
	}
	defer unlock()
	var v Versions
	r := recorder{missing: n.missing, out: &v.Unsupported}
	s, ret := n.lib.SystemGetDriverVersion()
	if ok, err := r.field(-1, "driver", "nvmlSystemGetDriverVersion", ret); err != nil {
		return Versions{}, err
	} else if ok {
		v.Driver = s
	}
	cuda, ret := n.lib.SystemGetCudaDriverVersion()
	if ok, err := r.field(-1, "cuda_driver", "nvmlSystemGetCudaDriverVersion", ret); err != nil {
		return Versions{}, err
	} else if ok {
		v.CUDADriver = cudaVersion(cuda)
	}
	if r.has(-1, "nvml", "nvmlSystemGetNVMLVersion") {
		s, ret := n.lib.SystemGetNVMLVersion()
		if ok, err := r.field(-1, "nvml", "nvmlSystemGetNVMLVersion", ret); err != nil {
			return Versions{}, err
		} else if ok {
			v.NVML = s
		}
	}
	return v, nil
}

// GPUs implements Inventory.
func (n *NVML) GPUs() ([]GPU, error) {
	unlock, err := n.enter()
	if err != nil {
		return nil, err
	}
	defer unlock()
	out := make([]GPU, 0, len(n.devices))
	for i, d := range n.devices {
		g, err := n.gpu(i, d)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// Close implements Inventory: it shuts NVML down once; later calls, and
// every other method after it, reach nothing.
func (n *NVML) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	n.devices = nil
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return callError(-1, "nvmlShutdown", ret)
	}
	return nil
}

// enter takes the read lock for one method, or returns ErrClosed.
func (n *NVML) enter() (unlock func(), err error) {
	n.mu.RLock()
	if n.closed {
		n.mu.RUnlock()
		return nil, ErrClosed
	}
	return n.mu.RUnlock, nil
}

// gpu reads one GPU's fields.
func (n *NVML) gpu(i int, d nvml.Device) (GPU, error) {
	g := GPU{Index: i, NUMANode: -1}
	r := recorder{missing: n.missing, out: &g.Unsupported}
	uuid, ret := d.GetUUID()
	if ok, err := r.field(i, "uuid", "nvmlDeviceGetUUID", ret); err != nil {
		return GPU{}, err
	} else if ok {
		g.UUID = uuid
	}
	name, ret := d.GetName()
	if ok, err := r.field(i, "name", "nvmlDeviceGetName", ret); err != nil {
		return GPU{}, err
	} else if ok {
		g.Name = name
	}
	mem, ret := d.GetMemoryInfo()
	if ok, err := r.field(i, "memory", "nvmlDeviceGetMemoryInfo", ret); err != nil {
		return GPU{}, err
	} else if ok {
		g.MemoryTotal, g.MemoryUsed = mem.Total, mem.Used
	}
	pci, ret := d.GetPciInfo()
	if ok, err := r.field(i, "pci_bus_id", "nvmlDeviceGetPciInfo", ret); err != nil {
		return GPU{}, err
	} else if ok {
		g.PCIBusID = busID(pci)
	}
	if r.has(i, "numa_node", "nvmlDeviceGetNumaNodeId") {
		node, ret := d.GetNumaNodeId()
		if ok, err := r.field(i, "numa_node", "nvmlDeviceGetNumaNodeId", ret); err != nil {
			return GPU{}, err
		} else if ok {
			g.NUMANode = node
		}
	}
	if r.has(i, "compute_mode", "nvmlDeviceGetComputeMode") {
		mode, ret := d.GetComputeMode()
		if ok, err := r.field(i, "compute_mode", "nvmlDeviceGetComputeMode", ret); err != nil {
			return GPU{}, err
		} else if ok {
			g.ComputeMode = computeMode(mode)
		}
	}
	if r.has(i, "mig", "nvmlDeviceGetMigMode") {
		current, pending, ret := d.GetMigMode()
		if ok, err := r.field(i, "mig", "nvmlDeviceGetMigMode", ret); err != nil {
			return GPU{}, err
		} else if ok {
			g.MIG = current == nvml.DEVICE_MIG_ENABLE
			g.MIGPending = pending == nvml.DEVICE_MIG_ENABLE
		}
	}
	return g, nil
}

// recorder applies the rule for one per-field call: success fills the
// field, NOT_SUPPORTED (or a function this NVML lacks) leaves it empty and
// records why, anything else is an error naming the GPU and the call.
type recorder struct {
	missing map[string]bool
	out     *[]Unsupported
}

// has reports whether call may be made, recording the field as unsupported
// when this NVML does not export it.
func (r recorder) has(gpu int, field, call string) bool {
	if !r.missing[call] {
		return true
	}
	*r.out = append(*r.out, Unsupported{GPU: gpu, Field: field, Call: call,
		Reason: "this driver's NVML does not export it; a newer driver does"})
	return false
}

// field reports whether ret carries a value for field.
func (r recorder) field(gpu int, field, call string, ret nvml.Return) (bool, error) {
	switch ret {
	case nvml.SUCCESS:
		return true, nil
	case nvml.ERROR_NOT_SUPPORTED:
		*r.out = append(*r.out, Unsupported{GPU: gpu, Field: field, Call: call, Reason: returnName(ret)})
		return false, nil
	}
	return false, callError(gpu, call, ret)
}

// exportsInit loads path on its own, without go-nvml, to check that it
// exports nvmlInit_v2 before go-nvml calls it: go-nvml calls nvmlInit
// right after loading, and a library without it (a wrong file at that
// path) would end the process.
func exportsInit(path string) error {
	lib := dl.New(path, dl.RTLD_LAZY|dl.RTLD_LOCAL)
	if err := lib.Open(); err != nil {
		reason := err.Error()
		if path == DefaultLibrary {
			reason += " (no NVIDIA driver on this node, or its libraries are not on the dynamic loader's path)"
		}
		return &UnavailableError{Reason: reason, Fix: fixLoad}
	}
	defer lib.Close()
	if err := lib.Lookup("nvmlInit_v2"); err != nil {
		return &UnavailableError{
			Reason: fmt.Sprintf("%s is not NVML: %v", path, err),
			Fix:    "point the NVML library path at the driver's libnvidia-ml.so.1",
		}
	}
	return nil
}

// fixLoad is what to do when libnvidia-ml.so.1 cannot be loaded.
const fixLoad = "install the NVIDIA driver, or add the directory of its libnvidia-ml.so.1 to " +
	"/etc/ld.so.conf.d and run ldconfig; in a container, run with the NVIDIA container " +
	"runtime and NVIDIA_DRIVER_CAPABILITIES including utility"

// initError explains a failed nvmlInit.
func initError(ret nvml.Return) error {
	e := &UnavailableError{Reason: "nvmlInit: " + returnName(ret), Fix: returnHint(ret)}
	if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
		e.Fix = fixLoad
	}
	if e.Fix == "" {
		e.Fix = "check that `nvidia-smi` works on this node"
	}
	return e
}

// callError wraps a failed NVML call with the GPU and the call's name.
func callError(gpu int, call string, ret nvml.Return) error {
	return &CallError{GPU: gpu, Call: call, Code: int(ret), Name: returnName(ret), Hint: returnHint(ret)}
}

// busID renders NVML's PCI bus id ("00000000:07:00.0") as sysfs names the
// device ("0000:07:00.0"), so ids from different calls compare equal.
func busID(p nvml.PciInfo) string {
	var b strings.Builder
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return normalizeBusID(b.String())
}

// normalizeBusID lower-cases a PCI bus id and gives its domain four digits.
func normalizeBusID(s string) string {
	s = strings.ToLower(s)
	domain, rest, ok := strings.Cut(s, ":")
	if !ok {
		return s
	}
	d, err := strconv.ParseUint(domain, 16, 32)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%s", d, rest)
}

// cudaVersion renders NVML's CUDA version number (12040) as "12.4".
func cudaVersion(v int) string {
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// computeMode names NVML's compute mode.
func computeMode(m nvml.ComputeMode) ComputeMode {
	switch m {
	case nvml.COMPUTEMODE_DEFAULT:
		return ComputeDefault
	case nvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return ComputeExclusiveThread
	case nvml.COMPUTEMODE_PROHIBITED:
		return ComputeProhibited
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return ComputeExclusiveProcess
	}
	return ComputeMode(fmt.Sprintf("mode-%d", int(m)))
}

// microTime turns NVML's microsecond timestamps into a time.
func microTime(us uint64) time.Time {
	return time.UnixMicro(int64(us))
}
