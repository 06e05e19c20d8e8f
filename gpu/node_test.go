//go:build cgo

// Built with cgo only, so that TestBuildsWithoutCgo does not compile the
// policy package (and OPA) a second time without cgo.

package gpu_test

import (
	"fmt"
	"testing"

	"github.com/gpu-arbiter/arbiter/gpu"
	"github.com/gpu-arbiter/arbiter/policy"
)

// TestNodeGPUsConvertToPolicy keeps NodeGPU convertible to policy.GPU, the
// way the daemon fills the policy's node description.
func TestNodeGPUsConvertToPolicy(t *testing.T) {
	gpus := []gpu.GPU{
		{Index: 0, UUID: "GPU-a", Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30, MemoryUsed: 1 << 30, NUMANode: 0},
		{Index: 1, UUID: "GPU-b", Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30, NUMANode: -1},
	}
	topo := gpu.Topology{GPUs: []gpu.GPULinks{{GPU: 0, Peers: []int{1}}, {GPU: 1, Peers: []int{0}}}}
	var got []policy.GPU
	for _, g := range gpu.NodeGPUs(gpus, topo) {
		got = append(got, policy.GPU(g))
	}
	want := []policy.GPU{
		{Index: 0, UUID: "GPU-a", Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, NUMANode: 0, NVLinkPeers: []int{1}},
		{Index: 1, UUID: "GPU-b", Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, NUMANode: -1, NVLinkPeers: []int{0}},
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("node GPUs\n got %+v\nwant %+v", got, want)
	}
	topo.GPUs[0].Peers[0] = 7
	if got[0].NVLinkPeers[0] != 1 {
		t.Error("NodeGPUs shares its peers slice with the topology")
	}
}
