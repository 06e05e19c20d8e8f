package main

import (
	"os"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-arbiter/arbiter/gpu"
	"github.com/gpu-arbiter/arbiter/nvrm"
	"github.com/gpu-arbiter/arbiter/policy"
)

// nodeInfo describes the node to the policy and the API: its GPUs from
// NVML where it loads, else those the driver trace has seen processes use.
type nodeInfo struct {
	hostname string
	nvml     []policy.GPU // nil without NVML
	nvmlWhy  string       // why NVML is not used
	driver   string
	enf      *liveEnforcer
	mu       sync.Mutex
	seen     []int // GPU indexes the driver trace has shown, without NVML
	devs     []int // GPU indexes of the driver's device nodes, without NVML
}

// loadedDriver is the loaded NVIDIA driver's version from its own files,
// for a node without NVML; "" where no driver is loaded.
func loadedDriver() string {
	for _, p := range []string{nvrm.ModuleVersionPath, nvrm.ProcVersionPath} {
		if b, err := os.ReadFile(p); err == nil {
			if v, err := nvrm.ParseDriverVersion(string(b)); err == nil {
				return v.String()
			}
		}
	}
	return ""
}

// newNodeInfo reads the inventory once at start: GPUs do not come and go
// under a running driver.
func newNodeInfo(log zerolog.Logger, enf *liveEnforcer) *nodeInfo {
	n := &nodeInfo{enf: enf}
	n.hostname, _ = os.Hostname()
	inv, err := gpu.Open(nil)
	if err != nil {
		n.nvmlWhy = err.Error()
		n.driver = loadedDriver()
		n.devs = nvrm.GPUDevices("/dev")
		log.Warn().Err(err).Str("driver", n.driver).Ints("device_nodes", n.devs).
			Msg("NVML unavailable: running with the GPUs the driver's device nodes and trace show")
		return n
	}
	defer inv.Close()
	if v, err := inv.Versions(); err == nil {
		n.driver = v.Driver
	}
	gpus, err := inv.GPUs()
	if err != nil {
		n.nvmlWhy = err.Error()
		log.Warn().Err(err).Msg("NVML could not list the GPUs: running with the GPUs the driver trace shows")
		return n
	}
	topo, err := inv.Topology()
	if err != nil {
		log.Warn().Err(err).Msg("NVML topology unavailable: policies see no NVLink peers")
	}
	for _, g := range gpu.NodeGPUs(gpus, topo) {
		n.nvml = append(n.nvml, policy.GPU(g))
	}
	log.Info().Int("gpus", len(n.nvml)).Str("driver", n.driver).Msg("GPU inventory from NVML")
	return n
}

// policyNode is the node as a policy sees it, now.
func (n *nodeInfo) policyNode() policy.Node {
	nd := policy.Node{Hostname: n.hostname, Time: time.Now().UTC()}
	if n.nvml != nil {
		nd.GPUs = n.nvml
		return nd
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, i := range n.gpuIndexes() {
		nd.GPUs = append(nd.GPUs, policy.GPU{Index: i, NUMANode: -1})
	}
	return nd
}

// sawGPUs records GPUs the driver trace showed (without NVML).
func (n *nodeInfo) sawGPUs(gpus []int) {
	if n.nvml != nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, g := range gpus {
		if !slices.Contains(n.seen, g) {
			n.seen = append(n.seen, g)
			slices.Sort(n.seen)
		}
	}
}

// gpuIndexes are the GPUs known without NVML: the device nodes' and the
// trace's, sorted; n.mu held.
func (n *nodeInfo) gpuIndexes() []int {
	out := slices.Clone(n.devs)
	for _, g := range n.seen {
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	slices.Sort(out)
	return out
}
