package gpu

import (
	"fmt"
	"time"
)

// Inventory is the node's GPU inventory. Every method reads NVML afresh;
// after Close every method returns ErrClosed and nothing reaches NVML.
// Implementations are safe for concurrent use.
type Inventory interface {
	// Versions returns the driver, CUDA driver and NVML versions.
	Versions() (Versions, error)
	// GPUs returns every GPU NVML sees, in NVML index order.
	GPUs() ([]GPU, error)
	// Topology returns the NVLinks of every GPU and the connection of
	// every pair of GPUs.
	Topology() (Topology, error)
	// Processes returns the processes running on every GPU, with the
	// utilization sampled after since (the zero time: every sample NVML
	// still holds).
	Processes(since time.Time) (ProcessTable, error)
	// Close shuts NVML down. It is idempotent.
	Close() error
}

// Options configure Open. A nil *Options means the defaults.
type Options struct {
	// LibraryPath is the NVML library to load. Empty means
	// libnvidia-ml.so.1, found through the dynamic loader's search path
	// as the driver installs it.
	LibraryPath string
}

// DefaultLibrary is the NVML library Open loads when Options name none.
const DefaultLibrary = "libnvidia-ml.so.1"

// Versions are the versions of the node's NVIDIA driver stack.
type Versions struct {
	Driver     string // kernel driver, e.g. "550.54.15"
	CUDADriver string // highest CUDA version the driver supports, e.g. "12.4"
	NVML       string // e.g. "12.550.54.15"
	// Unsupported lists the versions NVML could not give, and why.
	Unsupported []Unsupported
}

// GPU is one GPU as NVML describes it. A field NVML does not support on
// this GPU stays empty (NUMANode -1) and Unsupported says why.
type GPU struct {
	Index       int
	UUID        string // "GPU-…"
	Name        string // e.g. "NVIDIA H100 80GB HBM3"
	MemoryTotal uint64 // bytes
	MemoryUsed  uint64 // bytes
	PCIBusID    string // "0000:07:00.0", lower case, four-digit domain
	NUMANode    int    // the CPU NUMA node closest to the GPU; -1 when unknown
	ComputeMode ComputeMode
	MIG         bool // MIG mode is on now
	MIGPending  bool // MIG mode will be on after the next GPU reset
	Unsupported []Unsupported
}

// ComputeMode is the GPU's compute mode: who may create contexts on it.
type ComputeMode string

// The compute modes NVML reports.
const (
	ComputeDefault          ComputeMode = "default"
	ComputeExclusiveThread  ComputeMode = "exclusive-thread"
	ComputeProhibited       ComputeMode = "prohibited"
	ComputeExclusiveProcess ComputeMode = "exclusive-process"
)

// Topology is how the node's GPUs connect: NVLinks per GPU and the PCIe or
// system path of every pair, as `nvidia-smi topo -m` shows them.
type Topology struct {
	// GPUs lists each GPU's NVLinks, in GPU index order.
	GPUs []GPULinks
	// Pairs lists every pair of GPUs once, A < B, ordered by A then B.
	Pairs []Pair
	// Unsupported lists what NVML could not give, and why.
	Unsupported []Unsupported
}

// GPULinks are one GPU's active NVLinks and the GPUs it reaches over them.
type GPULinks struct {
	GPU     int
	NVLinks []NVLink
	// Peers are the GPUs reachable over NVLink, directly or through
	// NVSwitches, sorted.
	Peers []int
}

// NVLink is one active NVLink of a GPU.
type NVLink struct {
	Link        int    // the link number on this GPU
	RemoteBusID string // PCI bus id of the far end, normalized as GPU.PCIBusID
	// RemoteGPU is the index of the GPU at the far end, or -1 when the far
	// end is an NVSwitch or another device.
	RemoteGPU int
}

// Pair is the connection between two GPUs.
type Pair struct {
	A, B int
	// Level is the closest common ancestor of the two on the PCIe/system
	// path (LevelUnknown when NVML does not say).
	Level Level
	// NVLinks is the number of A's NVLinks that reach B, directly or
	// through NVSwitches both reach; 0 when they share none.
	NVLinks int
}

// String names the connection the way `nvidia-smi topo -m` does: NV# when
// the two share NVLinks, else the PCIe/system level.
func (p Pair) String() string {
	if p.NVLinks > 0 {
		return fmt.Sprintf("NV%d", p.NVLinks)
	}
	return p.Level.String()
}

// Peers returns the GPUs that gpu reaches over NVLink, or nil.
func (t Topology) Peers(gpu int) []int {
	for _, g := range t.GPUs {
		if g.GPU == gpu {
			return g.Peers
		}
	}
	return nil
}

// Level is the closest common ancestor of two GPUs on the PCIe/system
// path, nearest first.
type Level int

// The levels, nearest first, named as `nvidia-smi topo -m` names them.
const (
	LevelUnknown Level = iota
	LevelBoard         // both on one board (a multi-GPU card)
	LevelPIX           // at most one PCIe bridge between them
	LevelPXB           // several PCIe bridges, no host bridge
	LevelPHB           // through a PCIe host bridge
	LevelNODE          // across host bridges within one NUMA node
	LevelSYS           // across NUMA nodes (the SMP interconnect)
)

// String returns nvidia-smi's abbreviation for the level.
func (l Level) String() string {
	switch l {
	case LevelBoard:
		return "BOARD"
	case LevelPIX:
		return "PIX"
	case LevelPXB:
		return "PXB"
	case LevelPHB:
		return "PHB"
	case LevelNODE:
		return "NODE"
	case LevelSYS:
		return "SYS"
	}
	return "?"
}

// ProcessTable is what runs on the node's GPUs.
type ProcessTable struct {
	// Processes are ordered by GPU, then PID. A process using two GPUs
	// appears once per GPU.
	Processes []Process
	// Unsupported lists what NVML could not give, and why.
	Unsupported []Unsupported
}

// Process is one process on one GPU.
type Process struct {
	PID      int
	GPU      int
	Compute  bool // it has a compute (CUDA) context on the GPU
	Graphics bool // it has a graphics context on the GPU
	// MemoryBytes is the GPU memory the process uses; 0 with an
	// Unsupported entry when NVML cannot tell.
	MemoryBytes uint64
	// GPUInstance and ComputeInstance are the MIG instance the process
	// runs in, -1 when the GPU is not partitioned.
	GPUInstance, ComputeInstance int
	// Utilization is the newest sample after the time asked for, nil when
	// NVML has none.
	Utilization *Utilization
}

// Utilization is one NVML sample of a process's use of a GPU, in percent
// of the sampling period.
type Utilization struct {
	At      time.Time
	SM      uint32
	Memory  uint32
	Encoder uint32
	Decoder uint32
}

// Unsupported records a field NVML did not give: the field stays empty and
// this says why.
type Unsupported struct {
	GPU    int    // -1 for the system
	Field  string // e.g. "numa_node"
	Call   string // the NVML function, e.g. "nvmlDeviceGetNumaNodeId"
	Reason string
}

// String reads "GPU 2 numa_node: nvmlDeviceGetNumaNodeId: ERROR_NOT_SUPPORTED".
func (u Unsupported) String() string {
	return fmt.Sprintf("%s%s: %s: %s", where(u.GPU), u.Field, u.Call, u.Reason)
}

// NodeGPU is one GPU as the policy's node description holds it. Its fields
// match policy.GPU one for one, so the daemon converts with policy.GPU(g).
type NodeGPU struct {
	Index       int
	UUID        string
	Name        string
	MemoryBytes uint64
	NUMANode    int // -1 when unknown
	NVLinkPeers []int
}

// NodeGPUs turns an inventory into the policy's node description: each GPU
// with its total memory and its NVLink peers from topo.
func NodeGPUs(gpus []GPU, topo Topology) []NodeGPU {
	out := make([]NodeGPU, 0, len(gpus))
	for _, g := range gpus {
		var peers []int
		if p := topo.Peers(g.Index); len(p) > 0 {
			peers = append([]int(nil), p...)
		}
		out = append(out, NodeGPU{
			Index:       g.Index,
			UUID:        g.UUID,
			Name:        g.Name,
			MemoryBytes: g.MemoryTotal,
			NUMANode:    g.NUMANode,
			NVLinkPeers: peers,
		})
	}
	return out
}

// where prefixes a message with the GPU it is about.
func where(gpu int) string {
	if gpu < 0 {
		return ""
	}
	return fmt.Sprintf("GPU %d ", gpu)
}
