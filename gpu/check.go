package gpu

import (
	"errors"
	"fmt"
	"strings"
)

// Availability is whether NVML can be used on this node: what `arbiter
// doctor` shows for its NVML check.
type Availability struct {
	OK bool
	// Detail is the driver, CUDA version and GPUs (count and names) when
	// OK, and why NVML cannot be used when not.
	Detail string
	// Fix says what to do when not OK; empty when OK.
	Fix string
}

// Opener opens a GPU inventory: Open, which loads the node's NVML, or in
// tests a function that passes one of go-nvml's mock servers to New.
type Opener func(*Options) (Inventory, error)

// Check opens the inventory with open (Open when nil) and opts, reads the
// versions and the GPUs, and closes it again. An inventory that sees no
// GPU is not OK: NVML works, but nothing it would describe is there.
func Check(open Opener, opts *Options) Availability {
	if open == nil {
		open = Open
	}
	inv, err := open(opts)
	if err != nil {
		return unavailable(err)
	}
	if inv == nil {
		return Availability{Detail: "the inventory opener returned neither an inventory nor an error", Fix: "report it: this is a bug in arbiter"}
	}
	v, err := inv.Versions()
	if err != nil {
		return unavailable(errors.Join(err, inv.Close()))
	}
	gpus, err := inv.GPUs()
	if err != nil {
		return unavailable(errors.Join(err, inv.Close()))
	}
	if err := inv.Close(); err != nil {
		return unavailable(err)
	}
	if len(gpus) == 0 {
		return Availability{Detail: fmt.Sprintf("NVML works (driver %s, CUDA %s) but sees no GPU", v.Driver, v.CUDADriver),
			Fix: "check that `nvidia-smi -L` lists the GPUs; in a container, expose them (NVIDIA_VISIBLE_DEVICES, or a GPU resource request)"}
	}
	return Availability{OK: true, Detail: fmt.Sprintf("driver %s, CUDA %s, %s", v.Driver, v.CUDADriver, describeGPUs(gpus))}
}

// describeGPUs counts the GPUs and names their models, in index order of
// first appearance: "8 GPUs (8 × NVIDIA H100 80GB HBM3)".
func describeGPUs(gpus []GPU) string {
	var names []string
	count := map[string]int{}
	for _, g := range gpus {
		name := g.Name
		if name == "" {
			name = "name unknown"
		}
		if count[name] == 0 {
			names = append(names, name)
		}
		count[name]++
	}
	models := make([]string, len(names))
	for i, name := range names {
		models[i] = fmt.Sprintf("%d × %s", count[name], name)
	}
	plural := "s"
	if len(gpus) == 1 {
		plural = ""
	}
	return fmt.Sprintf("%d GPU%s (%s)", len(gpus), plural, strings.Join(models, ", "))
}

// unavailable turns Open's or a call's error into an Availability.
func unavailable(err error) Availability {
	if u, ok := errors.AsType[*UnavailableError](err); ok {
		return Availability{Detail: fmt.Sprintf("%v: %s", ErrUnavailable, u.Reason), Fix: u.Fix + "; meanwhile " + fallback}
	}
	fix := "check that `nvidia-smi` works on this node"
	if c, ok := errors.AsType[*CallError](err); ok && c.Hint != "" {
		fix = c.Hint
	}
	return Availability{Detail: err.Error(), Fix: fix}
}
