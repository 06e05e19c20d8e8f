package main

import (
	"fmt"
	"testing"
)

// TestGPUIndexes: without NVML the node's GPUs are its device nodes' and
// the trace's, each once, sorted.
func TestGPUIndexes(t *testing.T) {
	n := &nodeInfo{devs: []int{0, 3}, seen: []int{5, 3}}
	if got := fmt.Sprint(n.gpuIndexes()); got != "[0 3 5]" {
		t.Errorf("gpuIndexes = %s, want [0 3 5]", got)
	}
}
