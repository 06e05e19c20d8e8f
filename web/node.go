package web

import (
	"github.com/gpu-arbiter/arbiter/sched"
)

// Node describes the machine the daemon runs on, as /status and /gpus
// show it. The daemon fills it from NVML and its own readiness checks.
type Node struct {
	Hostname      string    `json:"hostname"`
	DriverVersion string    `json:"driver_version,omitempty"`
	GPUs          []NodeGPU `json:"gpus"`
	// Levels says, for each enforcement level, whether this node can
	// apply it and, when not, why.
	Levels []LevelSupport `json:"levels"`
}

// NodeGPU is one GPU of the node.
type NodeGPU struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
}

// LevelSupport says whether the node supports an enforcement level.
type LevelSupport struct {
	Level     sched.Level `json:"level"`
	Supported bool        `json:"supported"`
	Reason    string      `json:"reason,omitempty"`
}

// gpu returns the node's GPU with index i, if known.
func (n *Node) gpu(i int) (NodeGPU, bool) {
	for _, g := range n.GPUs {
		if g.Index == i {
			return g, true
		}
	}
	return NodeGPU{}, false
}
