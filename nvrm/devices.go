package nvrm

import (
	"os"
	"slices"
	"strconv"
	"strings"
)

// GPUDevices lists the GPU device nodes in dev (/dev outside tests) by
// their number: /dev/nvidia0, /dev/nvidia1, ... are the driver's device
// instances. Only character devices count, and not the control, UVM or
// capability nodes; nil where dev cannot be read.
func GPUDevices(dev string) []int {
	ents, err := os.ReadDir(dev)
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "nvidia")
		n, err := strconv.Atoi(rest)
		if !ok || err != nil || n < 0 || e.Type()&os.ModeCharDevice == 0 {
			continue
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
