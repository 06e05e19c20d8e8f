package gpu

import (
	"errors"
	"fmt"
)

// Availability is whether NVML can be used on this node: what `arbiter
// doctor` shows for its NVML check.
type Availability struct {
	OK bool
	// Detail is the driver, CUDA version and GPU count when OK, and why
	// NVML cannot be used when not.
	Detail string
	// Fix says what to do when not OK; empty when OK.
	Fix string
}

// Check opens NVML as Open does, reads the versions and the GPU count, and
// closes it again.
func Check(opts *Options) Availability {
	inv, err := Open(opts)
	if err != nil {
		return unavailable(err)
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
	return Availability{OK: true, Detail: fmt.Sprintf("driver %s, CUDA %s, %d GPUs", v.Driver, v.CUDADriver, len(gpus))}
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
